//! Connecting to the Docker daemon.

use bollard::Docker;

/// Connecting to Docker failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The daemon could not be reached or did not answer `/version`.
    #[error(
        "cannot reach the Docker daemon at {socket}: {source}. Is dockerd running \
         (`systemctl status docker` or `sudo dockerd`)? Can this user open the socket \
         (add it to the `docker` group, or check permissions on /var/run/docker.sock)? \
         DOCKER_HOST overrides the socket path"
    )]
    Unreachable {
        /// Where we tried.
        socket: String,
        /// What bollard said.
        #[source]
        source: bollard::errors::Error,
    },
}

/// Where bollard will connect: `DOCKER_HOST` or the default unix socket.
pub fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string())
}

/// Connects with local defaults and negotiates the API version (the engine here speaks 1.41;
/// bollard 0.21 defaults to 1.53 and every request would fail without negotiation).
pub async fn connect() -> Result<Docker, ConnectError> {
    let socket = docker_host();
    let docker =
        Docker::connect_with_local_defaults().map_err(|source| ConnectError::Unreachable {
            socket: socket.clone(),
            source,
        })?;
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|source| ConnectError::Unreachable {
            socket: socket.clone(),
            source,
        })?;
    let v = docker.client_version();
    tracing::debug!(
        socket = %socket,
        api_major = v.major_version,
        api_minor = v.minor_version,
        "connected to docker"
    );
    Ok(docker)
}

/// Connects to an explicit unix socket path (used to test the unreachable-daemon error).
pub async fn connect_unix(path: &str) -> Result<Docker, ConnectError> {
    let socket = format!("unix://{path}");
    let docker =
        Docker::connect_with_unix(path, 10, bollard::API_DEFAULT_VERSION).map_err(|source| {
            ConnectError::Unreachable {
                socket: socket.clone(),
                source,
            }
        })?;
    docker
        .negotiate_version()
        .await
        .map_err(|source| ConnectError::Unreachable { socket, source })
}
