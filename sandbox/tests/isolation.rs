//! The node's start-up check of its runtime (`sandbox::isolation::check_runtime`), against the
//! real daemon: gVisor passes and its tenants see gVisor's kernel; a runtime the daemon lacks
//! and a "gVisor" that is really runc are refused with what to do.

// Helpers outside #[test] fns: a panic is a test failure with a clear location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use gridlease_protocol::Isolation;
use gridlease_sandbox::isolation::{RuntimeError, check_runtime};

#[tokio::test]
async fn gvisor_passes_the_check_and_its_tenants_do_not_see_the_host_kernel() {
    let test = "isolation_gvisor";
    let Some(rt) = common::gvisor_or_skip(test).await else {
        return;
    };
    let sb = common::sandbox_or_skip(test).await.unwrap();
    let seen = check_runtime(&sb, Isolation::Gvisor, Some(rt))
        .await
        .unwrap();
    eprintln!("{seen:?}");
    assert_eq!(seen.runtime.as_deref(), Some(rt));
    assert!(!seen.host_kernel.is_empty());
    assert_ne!(seen.tenant_kernel, seen.host_kernel, "{seen:?}");
    // The arguments the project documents are the ones the daemon runs it with.
    for arg in ["--network=host", "--oci-seccomp"] {
        assert!(
            seen.args.iter().any(|a| a == arg),
            "{arg} missing: {seen:?}"
        );
    }
    // runc, for comparison, shows the host's own kernel to its tenants.
    let runc = check_runtime(&sb, Isolation::Runc, None).await.unwrap();
    assert_eq!(runc.tenant_kernel, runc.host_kernel, "{runc:?}");
}

#[tokio::test]
async fn a_missing_runtime_and_a_gvisor_that_is_really_runc_are_refused() {
    let test = "isolation_refused";
    let Some(sb) = common::sandbox_or_skip(test).await else {
        return;
    };
    let name = common::unique("gridlease-no-such-runtime");
    let err = check_runtime(&sb, Isolation::Gvisor, Some(&name))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RuntimeError::NotRegistered { .. }), "{text}");
    assert!(
        text.contains(&name) && text.contains("runc") && text.contains("daemon.json"),
        "the error names the runtime, what the daemon has and how to register it: {text}"
    );
    // The daemon's default runtime (runc) claimed as gVisor: its tenants see the host kernel.
    let err = check_runtime(&sb, Isolation::Gvisor, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::NotGvisor { .. }),
        "runc passed as gVisor: {err}"
    );
    assert!(err.to_string().contains("host's kernel"), "{err}");
}

/// `gridlease doctor`'s GPU container, on this machine without GPUs or the NVIDIA toolkit:
/// asking Docker for GPUs the way a lease does is refused, and the refusal names why (what a
/// provider with GPUs but no working toolkit sees); the probe's device listing itself runs.
#[tokio::test]
async fn the_gpu_container_check_names_a_daemon_that_cannot_give_gpus() {
    let test = "isolation_gpu_container";
    let Some(sb) = common::sandbox_or_skip(test).await else {
        return;
    };
    if gridlease_sandbox::gpu::NvmlProbe::new().is_ok() {
        eprintln!("{test}: this machine has an NVIDIA driver; the no-toolkit case is not this one");
        return;
    }
    let err = gridlease_sandbox::isolation::check_gpu_container(
        &sb,
        &["GPU-00000000-0000-0000-0000-000000000000".to_string()],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("nvidia"), "{err}");
    // No GPU asked for: the container runs and lists no NVIDIA device.
    let none = gridlease_sandbox::isolation::check_gpu_container(&sb, &[])
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
}
