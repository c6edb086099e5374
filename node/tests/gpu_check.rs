//! Proof of GPU end to end (issue 44): real nodes, real Docker, the probe image; providers
//! answer with the CPU reference (`--dev-gpus` providers have no GPU), honest or cheating
//! through the test-only hooks (`gridlease_sandbox::proof::Cheating`, `Faults::proof`,
//! compiled only with the `faults` feature).
//!
//! Each cheat: the lease is aborted before its command (never `running`, no usage report),
//! the renter's ledger shows 0, the kept transcript proves the failure (its statement
//! re-checks offline to the same failure) and the renter's record of the provider counts it.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod common;
mod lease_support;

use std::sync::Arc;

use gridlease_contracts::proof::params;
use gridlease_node::lease::provider::SharedProver;
use gridlease_node::lease::{LeaseServiceConfig, ProofCheat};
use gridlease_protocol::proof::{
    ProofBackend, ProofFailure, ProofPolicy, ProofReport, ProofVerdict,
};
use gridlease_protocol::statement::Statement;
use gridlease_protocol::{LeaseId, WireMessage};
use gridlease_sandbox::proof::faults::{Cheat, Cheating};
use gridlease_sandbox::proof::{CpuReference, Prover};
use lease_support::*;

const WINDOW_S: u32 = 30;

/// The honest CPU reference, measured here: the rate the offer claims (half of it, as a
/// daemon claims).
fn honest() -> (CpuReference, f64) {
    let p = CpuReference { threads: 2 };
    let rate = p.measure(&[]).unwrap() * 0.5;
    (p, rate)
}

/// A provider template and service settings whose offer has a verification window answered
/// by `prover` (claiming the honest rate), with `faults` at the commitment.
fn proving(
    gpus: u8,
    prover: Arc<dyn Prover>,
    rate: f64,
    cheat: Option<ProofCheat>,
) -> (
    gridlease_node::net::OfferTemplate,
    impl FnOnce(&mut LeaseServiceConfig),
) {
    let mut t = lease_template(gpus, 1, 30);
    t.proof = ProofPolicy {
        window_s: WINDOW_S,
        backend: Some(ProofBackend::CpuReference),
        claimed_mmacs: (rate / 1e6) as u64,
    };
    let tweak = move |svc: &mut LeaseServiceConfig| {
        svc.prover = Some(SharedProver {
            prover,
            macs_per_gpu: rate,
            vram_per_gpu: params::CPU_REFERENCE_FILL_CAP,
        });
        svc.faults.proof = cheat;
    };
    (t, tweak)
}

struct Market {
    sb: gridlease_sandbox::Sandbox,
    image: String,
    _dir: tempfile::TempDir,
    provider: Party,
    renter: Party,
    offer: gridlease_protocol::OfferId,
}

async fn market_with(
    test: &str,
    gpus: u8,
    prover: Arc<dyn Prover>,
    rate: f64,
    cheat: Option<ProofCheat>,
) -> Option<Market> {
    let sb = docker_or_skip(test).await?;
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (t, tweak) = proving(gpus, prover, rate, cheat);
    let provider = provider_with(dir.path(), &sb, t, 5, tweak).await;
    let (renter, offer) = renter_of(dir.path(), &provider, 5).await;
    Some(Market {
        sb,
        image,
        _dir: dir,
        provider,
        renter,
        offer,
    })
}

/// The lease's statement as the renter keeps it, its bytes, and its GPU check's report.
async fn statement(p: &Party, id: LeaseId) -> (Statement, Vec<u8>, ProofReport) {
    let s = p.leases.statement(id).await.unwrap();
    let bytes = s.to_bytes().unwrap();
    let record = s.proof.clone().expect("the statement keeps the GPU check");
    let report = ProofReport::decode_payload(&record.report.envelope().payload).unwrap();
    (s, bytes, report)
}

/// `gridlease verify FILE` on `bytes`: exit code and stdout.
fn verify_cli(bytes: &[u8]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("lease.statement");
    std::fs::write(&f, bytes).unwrap();
    let out = cli_support::bin()
        .arg("--home")
        .arg(dir.path().join("nowhere"))
        .args(["--json", "verify", f.to_str().unwrap()])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        cli_support::text(&out.stdout),
        cli_support::text(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_honest_provider_passes_billing_starts_after_the_pass_and_the_statement_proves_it() {
    let (p, rate) = honest();
    let Some(m) = market_with("gpu_check_honest", 1, Arc::new(p), rate, None).await else {
        return;
    };
    let id = m
        .renter
        .leases
        .rent(probe_rent(
            m.offer,
            &m.image,
            30,
            &["sentinel", "UP", "sleep", "2", "exit", "0"],
        ))
        .await
        .unwrap();
    let done = closed(&m.renter.leases, id, 90).await;
    let check = done.gpu_check.clone().expect("the view shows the check");
    assert_eq!(check.state, "passed", "{check:?}");
    assert_eq!(check.backend, "cpu-reference: not a GPU", "{check:?}");
    assert!(check.cosigned, "{check:?}");
    assert_eq!(
        done.close_reason.as_deref(),
        Some("container_exited"),
        "{done:?}"
    );
    assert!(done.paid > 0, "the lease ran and was paid: {done:?}");
    let (s, bytes, report) = statement(&m.renter, id).await;
    assert_eq!(report.verdict, ProofVerdict::Passed);
    // The first billed second comes after the pass: the lease clock starts with the command,
    // which starts after the renter decided (both clocks are this machine's).
    let started = done.started_at.expect("it ran");
    assert!(
        started >= report.decided_at.0,
        "started at {started}, the check decided at {}",
        report.decided_at.0
    );
    let v = gridlease_contracts::statement::verify(&s).unwrap();
    assert_eq!(v.gpu_check, Some(ProofVerdict::Passed));
    // `gridlease verify` accepts it, offline...
    let (code, out, err) = verify_cli(&bytes);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["gpu_check"], "passed", "{json}");
    // ...and refuses it with one changed byte in the transcript (a byte of the kept record,
    // flipped in the file as an attacker would).
    let record = s.proof.as_ref().unwrap().to_bytes().unwrap();
    let at = find(&bytes, &record).expect("the record's bytes are in the file");
    for offset in [record.len() / 5, record.len() / 2, record.len() - 70] {
        let mut changed = bytes.clone();
        changed[at + offset] ^= 0x01;
        let (code, _, err) = verify_cli(&changed);
        assert_ne!(
            code,
            0,
            "a statement with byte {} of its GPU check changed was accepted",
            at + offset
        );
        assert!(!err.is_empty());
    }
    // The provider's statement carries the same co-signed check.
    let (_, _, provider_report) = statement(&m.provider, id).await;
    assert_eq!(provider_report, report);
    assert_eq!(
        m.renter
            .leases
            .gpu_checks(m.provider.node.key_public)
            .await
            .unwrap()
            .passed,
        1
    );
    drop(m.sb);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Rents, expects the check to fail with `want`, and checks what every cheat must show.
async fn cheated(m: &Market, want: impl Fn(&ProofFailure) -> bool, what: &str) -> LeaseId {
    let id = m
        .renter
        .leases
        .rent(probe_rent(
            m.offer,
            &m.image,
            30,
            &["sentinel", "RAN", "exit", "0"],
        ))
        .await
        .unwrap();
    let done = closed(&m.renter.leases, id, 90).await;
    eprintln!("{what}: {:?}", done.gpu_check);
    // Aborted before billing: never started, closed for the check, nothing paid.
    assert_eq!(
        done.close_reason.as_deref(),
        Some("gpu_check_failed"),
        "{what}: {done:?}"
    );
    assert_eq!(done.started_at, None, "{what}: the command ran");
    assert_eq!(done.paid, 0, "{what}: {done:?}");
    assert_eq!(done.settled_total, Some(0), "{what}: {done:?}");
    let check = done.gpu_check.clone().expect("the view shows the check");
    assert_eq!(check.state, "failed", "{what}: {check:?}");
    assert!(
        check.summary.starts_with("GPU check failed"),
        "{what}: {check:?}"
    );
    // The renter's ledger shows 0 for it.
    let ledger = m.renter.leases.ledger().await.unwrap();
    let row = ledger.leases.iter().find(|l| l.lease_id == id);
    assert!(row.is_none_or(|r| r.total == 0), "{what}: {row:?}");
    // The transcript proves it: the statement re-checks offline to the same failure.
    let (s, bytes, report) = statement(&m.renter, id).await;
    let ProofVerdict::Failed(f) = &report.verdict else {
        panic!("{what}: the report says {:?}", report.verdict)
    };
    assert!(want(f), "{what}: failed as {f:?}");
    let v = gridlease_contracts::statement::verify(&s).unwrap();
    assert_eq!(v.gpu_check, Some(report.verdict.clone()), "{what}");
    let (code, out, err) = verify_cli(&bytes);
    assert_eq!(code, 0, "{what}: {err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["gpu_check"], "failed", "{what}: {json}");
    assert!(
        json["gpu_check_summary"]
            .as_str()
            .unwrap()
            .starts_with("GPU check failed"),
        "{what}: {json}"
    );
    // The container never ran its command: no output.
    assert_eq!(s.usage.len(), 0, "{what}: usage was reported");
    // The renter's record of the provider counts the failed check...
    let counts = m
        .renter
        .leases
        .gpu_checks(m.provider.node.key_public)
        .await
        .unwrap();
    assert!(counts.failed >= 1, "{what}: {counts:?}");
    // ...and so does the co-signed completion reputation is computed from: provider-failed,
    // with a failed check.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let record = loop {
        let found = m
            .renter
            .leases
            .completions(64)
            .await
            .into_iter()
            .find(|(c, _)| c.lease_id == id);
        if let Some((c, _)) = found {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: no co-signed completion"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        record.outcome,
        gridlease_protocol::completion::CompletionOutcome::ProviderFailed,
        "{what}: {record:?}"
    );
    assert_eq!(
        record.gpu_check,
        gridlease_protocol::completion::GpuCheck::Failed,
        "{what}: {record:?}"
    );
    id
}

async fn cheat_case(test: &str, cheat: Cheat, want: impl Fn(&ProofFailure) -> bool) {
    let (p, rate) = honest();
    let prover = Arc::new(Cheating { inner: p, cheat });
    let Some(m) = market_with(test, 1, prover, rate, None).await else {
        return;
    };
    cheated(&m, want, test).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_output_is_caught_before_billing() {
    cheat_case(
        "gpu_check_random",
        Cheat::RandomOutput,
        |f| matches!(f, ProofFailure::WrongRows { wrong, opened, .. } if wrong == opened),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ninety_percent_of_the_rows_is_caught_before_billing() {
    cheat_case(
        "gpu_check_partial",
        Cheat::PartialRows { permille: 900 },
        |f| matches!(f, ProofFailure::WrongRows { .. }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b_replaced_by_zeros_in_one_gemm_is_caught_before_billing() {
    cheat_case("gpu_check_zero_b", Cheat::ZeroB { gemm: 3 }, |f| {
        matches!(
            f,
            ProofFailure::WrongRows {
                first: gridlease_protocol::proof::ProofIndex::Row { gemm: 3, .. },
                ..
            }
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn less_vram_than_advertised_is_caught_before_billing() {
    cheat_case("gpu_check_vram", Cheat::FakeFill { permille: 500 }, |f| {
        matches!(
            f,
            ProofFailure::WrongPages { .. } | ProofFailure::VramShort { .. }
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_three_times_slower_than_the_offer_allows_is_caught_before_billing() {
    let (p, rate) = honest();
    let Some(m) = market_with(
        "gpu_check_slow",
        1,
        Arc::new(p),
        rate,
        Some(ProofCheat::Slow(3)),
    )
    .await
    else {
        return;
    };
    cheated(
        &m,
        |f| matches!(f, ProofFailure::TooSlow { took_ms, limit_ms } if took_ms > limit_ms),
        "3x slower",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_old_commitment_is_caught_before_billing() {
    let (p, rate) = honest();
    let Some(m) = market_with(
        "gpu_check_replay",
        2,
        Arc::new(p),
        rate,
        Some(ProofCheat::Replay),
    )
    .await
    else {
        return;
    };
    // The first check is answered honestly (and kept by the cheat)...
    let first = m
        .renter
        .leases
        .rent(probe_rent(m.offer, &m.image, 30, &["exit", "0"]))
        .await
        .unwrap();
    let done = closed(&m.renter.leases, first, 90).await;
    assert_eq!(done.gpu_check.map(|c| c.state).as_deref(), Some("passed"));
    // ...the next one gets that old commitment again.
    cheated(
        &m,
        // An old commitment names the lease and the challenge it answered: another lease's.
        |f| matches!(f, ProofFailure::BadCommit { detail } if detail.contains("another")),
        "replay",
    )
    .await;
}

/// The daemons and the CLI, as a renter uses them: `rent` says the check passed before the
/// output; `verify-gpu` re-checks the running lease; `rent --no-verify` runs no check and its
/// statement says so.
#[test]
fn the_cli_checks_by_default_rechecks_on_demand_and_skips_with_no_verify() {
    use cli_support::*;
    let Some(image) = probe_image_or_skip("gpu_check_cli") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = market_env(
        dir.path(),
        &[],
        None,
        ["", ""],
        &[("GRIDLEASE_VERIFY_WINDOW_SECS", "30")],
    );
    let rh = dir.path().join("renter");
    // A foreground rent: the check, then the output.
    let out = cli(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--image",
            &image,
            "--",
            "sentinel",
            "RAN",
            "exit",
            "0",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let all = format!("{stdout}\n{stderr}");
    assert!(
        all.contains("GPU check passed (cpu-reference: not a GPU)"),
        "{all}"
    );
    assert!(stdout.contains("SENTINEL RAN"), "{all}");

    // A running lease, checked again on demand.
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--detach",
            "--image",
            &image,
            "--",
            "sleep",
            "30",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(std::time::Duration::from_secs(60), "running", || {
        lease_of(&rh, &id)["state"] == "running"
    });
    // `top` labels the check's backend.
    let top = cli(&rh, &["top", &id[..12], "--once"]);
    assert!(
        text(&top.stdout).contains("GPU check passed (cpu-reference: not a GPU)"),
        "{}{}",
        text(&top.stdout),
        text(&top.stderr)
    );
    let again = cli(&rh, &["verify-gpu", &id[..12]]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).contains("GPU check passed"),
        "{}",
        text(&again.stdout)
    );
    let stop = cli(&rh, &["stop", &id[..12]]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));

    // --no-verify: no check; the statement says none was asked. (The stopped lease frees
    // the GPU once it settles and the provider re-signs its offer: retried until then.)
    wait_for(
        std::time::Duration::from_secs(60),
        "the stopped lease settled",
        || lease_of(&rh, &id)["state"] == "settled",
    );
    let mut out = None;
    wait_for(
        std::time::Duration::from_secs(60),
        "a --no-verify rent",
        || {
            let o = cli(
                &rh,
                &[
                    "--json",
                    "rent",
                    &m.offer,
                    "--seconds",
                    "60",
                    "--no-verify",
                    "--image",
                    &image,
                    "--",
                    "exit",
                    "0",
                ],
            );
            let refused = o.status.code() == Some(4);
            out = Some(o);
            !refused
        },
    );
    let out = out.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let leases = json(&rh, &["leases", "--all"]);
    let skipped = leases
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["gpu_check"].is_null() && l["state"] == "settled")
        .expect("a settled lease without a check")["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    let f = dir.path().join("skipped.statement");
    let w = cli(
        &rh,
        &["statement", &skipped[..12], "--out", f.to_str().unwrap()],
    );
    assert!(w.status.success(), "{}", text(&w.stderr));
    let v = json(&rh, &["verify", f.to_str().unwrap()]);
    assert_eq!(v["gpu_check"], "none", "{v}");
    assert_eq!(v["verify_window_s"], 0, "{v}");
    drop(m);
}
