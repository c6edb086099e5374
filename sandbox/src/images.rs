//! What is known about an image before a lease is signed: from the local daemon when the
//! image is present (unpacked size, whether it ever came from a registry, its config), else
//! from the registry (the manifest's layer sizes and the image config), read with
//! `oci-client` (Docker Hub token auth, manifest lists resolved to this platform).
//!
//! The rules that use these facts are pure and live in `gridlease_contracts::image`.

use std::time::Duration;

use gridlease_contracts::image::{ImageFacts, ImageRef, ImageSource};
use gridlease_protocol::ImageRefusal;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;

use crate::runtime::Sandbox;

/// How long asking a registry may take before the image counts as unavailable.
pub const REGISTRY_TIMEOUT: Duration = Duration::from_secs(20);

fn unavailable(detail: impl Into<String>) -> ImageRefusal {
    let mut detail: String = detail.into();
    if detail.len() > gridlease_protocol::MAX_DETAIL_LEN {
        let mut end = gridlease_protocol::MAX_DETAIL_LEN;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
    }
    ImageRefusal::Unavailable { detail }
}

/// Facts about `image` from the local daemon, or `Ok(None)` when it is not present there.
pub async fn local_facts(
    sb: &Sandbox,
    image: &ImageRef,
) -> Result<Option<ImageFacts>, ImageRefusal> {
    let canonical = image.canonical();
    match sb.docker().inspect_image(&canonical).await {
        Ok(i) => {
            // Pulled from *this* repository: a repo digest names it. An image built, imported
            // or re-tagged locally under a registry's name has none for that repository.
            let repo = image.repository();
            let pulled = i.repo_digests.iter().flatten().any(|d| {
                d.split_once('@')
                    .and_then(|(name, _)| ImageRef::parse(name).ok())
                    .is_some_and(|r| r.repository() == repo)
            });
            Ok(Some(ImageFacts {
                source: if pulled {
                    ImageSource::Pulled
                } else {
                    ImageSource::LocalOnly
                },
                compressed_bytes: None,
                unpacked_bytes: i.size.and_then(|s| u64::try_from(s).ok()),
                env: i.config.and_then(|c| c.env).unwrap_or_default(),
            }))
        }
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(None),
        Err(e) => Err(unavailable(format!(
            "the provider's Docker daemon failed: {e}"
        ))),
    }
}

/// Facts about `image` from its registry: layer sizes from the manifest (for this platform),
/// the environment from the image config. `plain_http` lists registry hosts spoken to over
/// HTTP (loopback test registries the provider listed).
pub async fn registry_facts(
    image: &ImageRef,
    plain_http: &[String],
) -> Result<ImageFacts, ImageRefusal> {
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(plain_http.to_vec()),
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(REGISTRY_TIMEOUT),
        ..Default::default()
    });
    let reference: oci_client::Reference = image
        .canonical()
        .parse()
        .map_err(|e| unavailable(format!("{e}")))?;
    let asked = client.pull_manifest_and_config(&reference, &RegistryAuth::Anonymous);
    let (manifest, _digest, config) = tokio::time::timeout(REGISTRY_TIMEOUT, asked)
        .await
        .map_err(|_| {
            unavailable(format!(
                "registry {} did not answer within {} s",
                image.registry,
                REGISTRY_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| unavailable(registry_failure(image, &e)))?;
    let compressed = manifest
        .layers
        .iter()
        .chain(std::iter::once(&manifest.config))
        .map(|l| u64::try_from(l.size).unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    Ok(ImageFacts {
        source: ImageSource::Registry,
        compressed_bytes: Some(compressed),
        unpacked_bytes: None,
        env: config_env(&config),
    })
}

/// Why a registry gave no manifest, in words: the image is not there, or the provider could
/// not reach the registry at all (no internet, DNS, TLS), or what the registry said.
fn registry_failure(image: &ImageRef, e: &oci_client::errors::OciDistributionError) -> String {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
    let (registry, name) = (&image.registry, image.canonical());
    match e {
        E::ImageManifestNotFoundError(_) => format!("registry {registry} has no image {name}"),
        E::RegistryError { envelope, .. }
            if envelope
                .errors
                .iter()
                .any(|x| matches!(x.code, C::ManifestUnknown | C::NameUnknown)) =>
        {
            format!("registry {registry} has no image {name}")
        }
        // Docker Hub answers an anonymous request for a repository that does not exist (or is
        // private) with 401.
        E::UnauthorizedError { .. } => format!(
            "registry {registry} has no public image {name} (it asked for credentials, and the provider pulls anonymously)"
        ),
        E::RequestError(err) => {
            format!("the provider cannot reach registry {registry} to fetch {name}: {err}")
        }
        other => format!("registry {registry}: {other}"),
    }
}

/// The `config.Env` of an image config document (OCI and Docker v2 agree on it).
pub fn config_env(config_json: &str) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        config: Option<Inner>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        #[serde(rename = "Env", default)]
        env: Option<Vec<String>>,
    }
    serde_json::from_str::<Doc>(config_json)
        .ok()
        .and_then(|d| d.config)
        .and_then(|c| c.env)
        .unwrap_or_default()
}

/// Local facts if the daemon has the image, else the registry's. A `listed_local` image (one
/// the provider offers from its own machine) is never looked up in a registry: it is there or
/// it is unavailable (and without a daemon nothing is known about it, nor can it run).
pub async fn image_facts(
    sb: Option<&Sandbox>,
    image: &ImageRef,
    plain_http: &[String],
    listed_local: bool,
) -> Result<ImageFacts, ImageRefusal> {
    if let Some(sb) = sb
        && let Some(f) = local_facts(sb, image).await?
    {
        return Ok(f);
    }
    if listed_local {
        return match sb {
            Some(_) => Err(unavailable(format!(
                "{} is listed by the provider but not on its machine",
                image.canonical()
            ))),
            None => Ok(ImageFacts {
                source: ImageSource::LocalOnly,
                compressed_bytes: None,
                unpacked_bytes: None,
                env: Vec::new(),
            }),
        };
    }
    registry_facts(image, plain_http).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_env_reads_oci_and_docker_configs() {
        let doc = r#"{"architecture":"amd64","config":{"Env":["PATH=/bin","CUDA_VERSION=12.8.0"],"Cmd":["sh"]},"rootfs":{}}"#;
        assert_eq!(config_env(doc), vec!["PATH=/bin", "CUDA_VERSION=12.8.0"]);
        assert!(config_env("{}").is_empty());
        assert!(config_env("not json").is_empty());
    }
}
