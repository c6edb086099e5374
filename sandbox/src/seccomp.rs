//! The tenant seccomp profile: the project's own, written here (not a copy of Docker's).
//!
//! Shape: every syscall is allowed except those a GPU job never needs and that widen the
//! kernel surface a tenant can reach: [`DENIED`] (each with its reason) answer `EPERM`;
//! `clone3` answers `ENOSYS` (so libc falls back to `clone`, whose flags a filter can see); and
//! `clone` with any namespace flag answers `EPERM`. Tenants also run with no capabilities and no-new-privileges, so
//! most of these would fail anyway; the filter is defence in depth, and it closes io_uring,
//! which Docker 20.10's own default profile leaves open.
//!
//! Trade-off, stated: an allow-by-default list does not refuse a syscall added to the kernel
//! after this list was written, where Docker's default (an allow-list) does; in exchange no
//! syscall a CUDA program uses is missing.
//!
//! Invariant: every tenant container carries [`security_opt`] in `HostConfig.SecurityOpt`, so
//! it runs under this profile, never under whatever default the provider's daemon has.
//!
//! Under gVisor (runsc with `--oci-seccomp`) the profile is applied by gVisor's Sentry to the
//! tenant's calls, without the `clone3` rule ([`profile_for`]): Debian's runsc (20221219)
//! ignores `errnoRet` and answers `EPERM`, on which libc does not fall back to `clone`, so no
//! thread could start (seen here). There `clone3` is answered by the Sentry, not the host
//! kernel, and namespaces it makes are the Sentry's own.

use serde_json::{Value, json};

/// `EPERM`.
const EPERM: u32 = 1;
/// `ENOSYS`.
const ENOSYS: u32 = 38;

/// Syscalls the profile refuses (`EPERM`), grouped, with the reason.
pub const DENIED: &[(&str, &[&str])] = &[
    (
        "io_uring: a large kernel interface with a record of local privilege escalations; GPU jobs use read/mmap/epoll",
        &["io_uring_setup", "io_uring_enter", "io_uring_register"],
    ),
    (
        "kernel keyrings: not namespaced; a tenant could read or fill the host's",
        &["add_key", "keyctl", "request_key"],
    ),
    (
        "loading kernel code or a new kernel",
        &[
            "init_module",
            "finit_module",
            "delete_module",
            "create_module",
            "kexec_load",
            "kexec_file_load",
        ],
    ),
    (
        "mounts, namespaces and root changes: a tenant keeps the filesystem and namespaces it was given",
        &[
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "chroot",
            "unshare",
            "setns",
            "open_tree",
            "move_mount",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
        ],
    ),
    (
        "eBPF and perf events: kernel programs and profiling of the host",
        &["bpf", "perf_event_open"],
    ),
    (
        "other processes' memory, and userfaultfd (a common exploit primitive)",
        &[
            "process_vm_readv",
            "process_vm_writev",
            "kcmp",
            "userfaultfd",
        ],
    ),
    (
        "host-wide clocks, swap, accounting, quotas, reboot",
        &[
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "stime",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "reboot",
        ],
    ),
    (
        "file handles that bypass path permissions",
        &["open_by_handle_at", "name_to_handle_at"],
    ),
    (
        "raw I/O ports and old x86 modes",
        &["ioperm", "iopl", "modify_ldt", "vm86", "vm86old"],
    ),
    (
        "obsolete interfaces with no use in a container",
        &[
            "uselib",
            "ustat",
            "sysfs",
            "_sysctl",
            "nfsservctl",
            "get_kernel_syms",
            "query_module",
            "lookup_dcookie",
        ],
    ),
];

/// `clone` flags that create namespaces (`CLONE_NEWNS`, `NEWCGROUP`, `NEWUTS`, `NEWIPC`,
/// `NEWUSER`, `NEWPID`, `NEWNET`): a `clone` with any of them is refused.
pub const CLONE_NAMESPACE_FLAGS: &[u64] = &[
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// The profile under runc, in the JSON form Docker's daemon reads (`defaultAction`,
/// `syscalls[]` with `names`, `action`, `errnoRet`, `args`).
pub fn profile() -> Value {
    profile_for(gridlease_protocol::Isolation::Runc)
}

/// The profile for a runtime: under gVisor without the `clone3` rule (see the module docs).
pub fn profile_for(isolation: gridlease_protocol::Isolation) -> Value {
    let denied: Vec<&str> = DENIED
        .iter()
        .flat_map(|(_, names)| names.iter().copied())
        .collect();
    let mut syscalls = vec![json!({
        "names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM
    })];
    if isolation == gridlease_protocol::Isolation::Runc {
        syscalls
            .push(json!({ "names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS }));
    }
    for flag in CLONE_NAMESPACE_FLAGS {
        syscalls.push(json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            // (flags & flag) == flag: Docker's MASKED_EQ takes the mask as `value` and the
            // expected result as `valueTwo`.
            "args": [{ "index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ" }],
        }));
    }
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": syscalls,
    })
}

/// The `HostConfig.SecurityOpt` entry that applies the profile: `seccomp=<JSON text>` (over
/// the API the daemon takes the profile's contents, not a path).
pub fn security_opt() -> String {
    security_opt_for(gridlease_protocol::Isolation::Runc)
}

/// [`security_opt`] for a runtime ([`profile_for`]).
pub fn security_opt_for(isolation: gridlease_protocol::Isolation) -> String {
    format!("seccomp={}", profile_for(isolation))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied_by(p: &Value, name: &str) -> bool {
        p["syscalls"].as_array().unwrap().iter().any(|r| {
            r["action"] == "SCMP_ACT_ERRNO"
                && r.get("args").is_none()
                && r["names"].as_array().unwrap().iter().any(|n| n == name)
        })
    }

    #[test]
    fn io_uring_and_the_dangerous_syscalls_are_refused_and_ordinary_ones_are_not() {
        let p = profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "keyctl",
            "bpf",
            "mount",
            "unshare",
            "setns",
            "kexec_load",
            "perf_event_open",
            "userfaultfd",
        ] {
            assert!(denied_by(&p, name), "{name} is not refused");
        }
        // What the loader, threads, memory, files, CUDA's driver ioctls and signals use.
        for name in [
            "read",
            "write",
            "openat",
            "mmap",
            "mprotect",
            "ioctl",
            "futex",
            "clone",
            "execve",
            "epoll_pwait",
            "rt_sigaction",
            "prlimit64",
            "memfd_create",
            "socket",
            "ptrace",
        ] {
            assert!(!denied_by(&p, name), "{name} is refused");
        }
        for (why, names) in DENIED {
            assert!(!why.is_empty() && !names.is_empty());
        }
    }

    #[test]
    fn clone_with_a_namespace_flag_is_refused_and_clone3_falls_back() {
        let p = profile();
        let rules = p["syscalls"].as_array().unwrap();
        let clone_rules: Vec<&Value> = rules.iter().filter(|r| r["names"][0] == "clone").collect();
        assert_eq!(clone_rules.len(), CLONE_NAMESPACE_FLAGS.len());
        for r in clone_rules {
            let a = &r["args"][0];
            assert_eq!(a["op"], "SCMP_CMP_MASKED_EQ");
            assert_eq!(a["value"], a["valueTwo"]);
            assert_eq!(a["value"].as_u64().unwrap().count_ones(), 1);
        }
        let clone3 = rules.iter().find(|r| r["names"][0] == "clone3").unwrap();
        assert_eq!(clone3["errnoRet"], ENOSYS);
    }

    #[test]
    fn the_security_opt_carries_the_whole_profile_inline() {
        let opt = security_opt();
        let json = opt.strip_prefix("seccomp=").unwrap();
        let v: Value = serde_json::from_str(json).unwrap();
        assert_eq!(v, profile());
    }

    #[test]
    fn under_gvisor_the_same_rules_apply_without_clone3() {
        use gridlease_protocol::Isolation;
        let (runc, gvisor) = (profile_for(Isolation::Runc), profile_for(Isolation::Gvisor));
        assert_eq!(runc, profile());
        let names = |p: &Value| -> Vec<String> {
            p["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["names"].as_array().unwrap().clone())
                .map(|n| n.as_str().unwrap().to_string())
                .collect()
        };
        assert!(names(&runc).contains(&"clone3".to_string()));
        assert!(!names(&gvisor).contains(&"clone3".to_string()));
        let mut rest = names(&runc);
        rest.retain(|n| n != "clone3");
        assert_eq!(rest, names(&gvisor), "every other rule is the same");
    }
}
