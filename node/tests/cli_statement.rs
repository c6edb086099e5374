//! `gridlease statement` and `gridlease verify` on a real lease between two real nodes: both
//! sides write a statement that `verify` (no node, no network: run with a home that has none)
//! accepts and whose amount owed is what both ledgers booked; a flipped byte, a dropped usage
//! report and an altered amount are each refused with a message naming what is wrong. Needs
//! Docker: with `GRIDLEASE_REQUIRE_DOCKER=1` (set by `.ci/run`) it fails when unreachable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::path::Path;
use std::time::Duration;

use cli_support::{bin, json, lease_of, market, probe_image_or_skip, text, wait_for};
use gridlease_protocol::statement::Statement;

/// `gridlease verify FILE` with a home where no node runs: (exit code, stdout, stderr).
fn verify(file: &Path) -> (i32, String, String) {
    let nowhere = tempfile::tempdir().unwrap();
    let out = bin()
        .arg("--home")
        .arg(nowhere.path())
        .arg("verify")
        .arg(file)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `verify` refuses `bytes` (written to `name` under `dir`), naming `part`.
fn refused(dir: &Path, name: &str, bytes: &[u8], part: &str) {
    let f = dir.join(name);
    std::fs::write(&f, bytes).unwrap();
    let (code, _, err) = verify(&f);
    assert_eq!(code, 1, "{name}: {err}");
    assert!(err.contains(part), "{name}: {err:?} does not name {part:?}");
}

#[test]
fn statements_of_a_real_lease_verify_and_tampering_is_named() {
    let Some(image) = probe_image_or_skip("statement") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    // 25 s of use: usage reports at 10 s, 20 s and the final one.
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
            "25",
            "exit",
            "0",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(90), "the lease to settle", || {
        lease_of(&rh, &id)["state"] == "settled" && lease_of(&ph, &id)["state"] == "settled"
    });
    let settled = lease_of(&ph, &id)["settled_total"].as_u64().unwrap();
    assert_eq!(lease_of(&rh, &id)["settled_total"].as_u64(), Some(settled));
    assert!(settled > 0);

    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let mut statements = Vec::new();
    for (who, home) in [("provider", &ph), ("renter", &rh)] {
        let f = files.join(format!("{who}.statement"));
        let wrote = json(
            home,
            &["statement", &id[..12], "--out", f.to_str().unwrap()],
        );
        assert_eq!(wrote["lease_id"], id.as_str(), "{wrote}");
        // Never over an existing file.
        let again = bin()
            .arg("--home")
            .arg(home)
            .args(["statement", &id[..12], "--out", f.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!again.status.success(), "overwrote {}", f.display());

        let (code, out, err) = verify(&f);
        assert_eq!(code, 0, "{who}: {err}");
        assert!(out.contains("valid"), "{out}");
        let nowhere = tempfile::tempdir().unwrap();
        let v: serde_json::Value = serde_json::from_slice(
            &bin()
                .arg("--home")
                .arg(nowhere.path())
                .args(["--json", "verify", f.to_str().unwrap()])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert_eq!(v["valid"], true);
        assert_eq!(v["lease_id"], id.as_str());
        assert_eq!(v["offer_included"], true, "{who}: {v}");
        assert_eq!(v["exit_code"], 0, "{who}: {v}");
        // What is owed is what both ledgers booked.
        let owed: gridlease_contracts::money::Money = v["owed"].as_str().unwrap().parse().unwrap();
        assert_eq!(owed.micros(), settled, "{who}: {v}");
        statements.push((who, std::fs::read(&f).unwrap(), v));
    }
    // The provider keeps every report it signed, from the first.
    let (_, provider_bytes, pv) = &statements[0];
    let seqs = pv["report_seqs"].as_array().unwrap();
    assert_eq!(seqs[0], 1, "{pv}");
    assert!(seqs[1].as_u64().unwrap() >= 3, "{pv}");

    // Any flipped byte (a spread of them through the file: the contracts' unit test flips
    // every byte of a smaller one).
    let step = (provider_bytes.len() / 24).max(1);
    for i in (0..provider_bytes.len()).step_by(step) {
        let mut b = provider_bytes.clone();
        b[i] ^= 0x20;
        let f = files.join(format!("flip-{i}"));
        std::fs::write(&f, &b).unwrap();
        let (code, _, err) = verify(&f);
        assert_eq!(code, 1, "byte {i} flipped, still valid");
        assert!(err.contains("is not a valid statement"), "{err}");
    }

    let s = Statement::from_bytes(provider_bytes).unwrap();
    // A report dropped from the middle.
    let mut dropped = s.clone();
    dropped.usage.remove(1);
    refused(
        &files,
        "dropped",
        &dropped.to_bytes().unwrap(),
        "usage report 3: follows report 1",
    );
    // The report the receipt answers, dropped.
    let mut last = s.clone();
    last.usage.pop();
    refused(
        &files,
        "last-dropped",
        &last.to_bytes().unwrap(),
        "the receipt",
    );
    // An amount altered: the receipt's total, one micro-unit more, in the signed bytes.
    let mut altered = s.clone();
    let mut env = altered.receipt.take().unwrap().into_envelope();
    let net = gridlease_protocol::NetworkId::devnet();
    let mut r = gridlease_protocol::Signed::<gridlease_protocol::PaymentReceipt>::from_envelope(
        env.clone(),
    )
    .verify(&net)
    .unwrap()
    .message;
    r.total_paid += 1;
    env.payload = gridlease_protocol::WireMessage::encode_payload(&r).unwrap();
    altered.receipt = Some(gridlease_protocol::Signed::from_envelope(env));
    refused(
        &files,
        "altered",
        &altered.to_bytes().unwrap(),
        "the receipt: signature does not verify",
    );
    // Not a statement at all, and a missing file.
    refused(&files, "garbage", b"hello", "not a gridlease statement");
    let (code, _, err) = verify(&files.join("absent"));
    assert_eq!(code, 1);
    assert!(err.contains("cannot read"), "{err}");
    drop(m);
}
