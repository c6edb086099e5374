//! Stopping a tenant container without its daemon: the last resort of the deadline watchdog
//! when Docker does not answer (a daemon blocked by a stuck stream, or just overloaded).
//!
//! A container runs in its own PID namespace; its first process (with `init`, Docker's
//! `docker-init`; under gVisor, the sandbox process) is that namespace's init, and when it
//! dies the kernel kills every other process in the namespace. So SIGKILL to that one process
//! ends the whole container, whatever Docker is doing. The process is found while Docker still
//! answers ([`Sandbox::init_process`]: `State.Pid` and the full container id) and named by a
//! pidfd when it is killed, after checking that it still sits in that container's cgroup: a
//! PID reused by another process since is never signalled.

use std::os::fd::OwnedFd;

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::runtime::{Sandbox, SandboxError, docker_err};

/// A container's init process on the host, as Docker reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitProcess {
    /// Its PID in the host's namespace.
    pub pid: i32,
    /// The container's full id (what its cgroup is named after).
    pub container_id: String,
}

/// What [`InitProcess::kill`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Killed {
    /// SIGKILL was sent to the container's init.
    Killed,
    /// The process is gone, or that PID is now another container's or the host's: nothing was
    /// sent.
    Gone,
}

impl InitProcess {
    /// Whether `cgroup` (the text of `/proc/PID/cgroup`) places the process in this
    /// container's cgroup (`/docker/<id>` with the cgroupfs driver, `docker-<id>.scope` with
    /// systemd's, v1 or v2).
    pub fn in_cgroup(&self, cgroup: &str) -> bool {
        self.container_id.len() >= 12
            && cgroup
                .lines()
                .filter_map(|l| l.splitn(3, ':').nth(2))
                .any(|path| path.contains(&self.container_id))
    }

    /// Sends SIGKILL to the container's init, if it is still that container's.
    pub fn kill(&self) -> std::io::Result<Killed> {
        let io = |e: Errno| std::io::Error::from_raw_os_error(e.raw_os_error());
        let Some(pid) = Pid::from_raw(self.pid) else {
            return Ok(Killed::Gone);
        };
        // The pidfd first: from here on it names this process, even if the PID is reused.
        let fd: OwnedFd = match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(Errno::SRCH) => return Ok(Killed::Gone),
            Err(e) => return Err(io(e)),
        };
        match std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)) {
            Ok(text) if self.in_cgroup(&text) => {}
            // Exited (or reused) meanwhile.
            Ok(_) => return Ok(Killed::Gone),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Killed::Gone),
            Err(e) => return Err(e),
        }
        match rustix::process::pidfd_send_signal(&fd, Signal::KILL) {
            Ok(()) => Ok(Killed::Killed),
            Err(Errno::SRCH) => Ok(Killed::Gone),
            Err(e) => Err(io(e)),
        }
    }
}

impl Sandbox {
    /// The init process of the running container `id` (`None`: it does not run).
    pub async fn init_process(&self, id: &str) -> Result<Option<InitProcess>, SandboxError> {
        let info = self
            .docker()
            .inspect_container(id, None)
            .await
            .map_err(docker_err("inspect_container", id))?;
        let pid = info
            .state
            .as_ref()
            .filter(|s| s.running == Some(true))
            .and_then(|s| s.pid)
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0);
        Ok(match (pid, info.id) {
            (Some(pid), Some(container_id)) => Some(InitProcess { pid, container_id }),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_must_name_the_container() {
        let p = InitProcess {
            pid: 1,
            container_id: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        };
        let v1 = "12:pids:/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n1:name=systemd:/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";
        let v2 = "0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n";
        assert!(p.in_cgroup(v1));
        assert!(p.in_cgroup(v2));
        assert!(!p.in_cgroup("0::/user.slice/session-1.scope\n"));
        assert!(!p.in_cgroup("12:pids:/docker/ffff\n"));
    }

    #[test]
    fn a_process_outside_the_containers_cgroup_is_never_signalled() {
        // This test process: alive, but not in any container's cgroup.
        let p = InitProcess {
            pid: i32::try_from(std::process::id()).unwrap(),
            container_id: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        };
        assert_eq!(p.kill().unwrap(), Killed::Gone);
        let gone = InitProcess { pid: i32::MAX, ..p };
        assert_eq!(gone.kill().unwrap(), Killed::Gone);
    }
}
