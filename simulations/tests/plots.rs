//! Plots through the real binary: every plot file is written (PNG and SVG), has the expected
//! series (legend entries named by parameter values, one wait panel per sweep point), axis
//! labels with units (money in GLU), Okabe-Ito colours, wait bars spanning their bins' real
//! edges, and an x axis of replication indices for a single run.
//!
//! Needs a TrueType font (DejaVu Sans or Liberation Sans at the usual paths, or
//! `GRIDLEASE_SIM_FONT`): without one the binary skips plots and these tests fail.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::path::{Path, PathBuf};

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
}

fn sim(args: &[&str]) {
    let out = common::run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("plots skipped"),
        "no TrueType font found: install fonts-dejavu-core or set GRIDLEASE_SIM_FONT"
    );
}

/// The text elements of an SVG, in document order.
fn texts(svg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find("<text") {
        let after = &rest[start..];
        let open_end = after.find('>').unwrap();
        let close = after.find("</text>").unwrap();
        out.push(after[open_end + 1..close].trim().replace("&amp;", "&"));
        rest = &after[close..];
    }
    out
}

/// `(x, width)` of every `<rect>` filled with `fill`.
fn rects(svg: &str, fill: &str) -> Vec<(f64, f64)> {
    let attr = |tag: &str, name: &str| -> f64 {
        let key = format!(" {name}=\"");
        let i = tag.find(&key).unwrap() + key.len();
        tag[i..i + tag[i..].find('"').unwrap()].parse().unwrap()
    };
    svg.split("<rect")
        .skip(1)
        .map(|t| &t[..t.find("/>").unwrap()])
        .filter(|t| t.contains(&format!("fill=\"{fill}\"")))
        .map(|t| (attr(t, "x"), attr(t, "width")))
        .collect()
}

fn read(dir: &Path, stem: &str) -> (Vec<String>, String) {
    for ext in ["png", "svg"] {
        let f = dir.join(format!("{stem}.{ext}"));
        assert!(
            std::fs::metadata(&f).is_ok_and(|m| m.len() > 1000),
            "{} missing or empty",
            f.display()
        );
    }
    let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
    (texts(&svg), svg)
}

fn count(texts: &[String], exact: &str) -> usize {
    texts.iter().filter(|t| *t == exact).count()
}

fn has(texts: &[String], exact: &str) -> bool {
    texts.iter().any(|t| t == exact)
}

#[test]
fn sweep_plots_have_units_series_per_parameter_value_and_bands() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let attack = scenario("attack");
    sim(&[
        "-q",
        "sweep",
        attack.to_str().unwrap(),
        "--param",
        "renter_rate=0.5,1",
        "--param",
        "days=0.25",
        "--reps",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);

    // Price: one panel per (population, class), one series per sweep point in each, legend
    // entries named by the varying parameter; GLU on the y axis, hours on the x axis.
    let (t, svg) = read(&out, "price");
    println!("price texts: {t:?}");
    assert!(has(&t, "honest rtx4090") && has(&t, "attacker rtx4090"));
    assert_eq!(count(&t, "renter_rate=0.5"), 2);
    assert_eq!(count(&t, "renter_rate=1"), 2);
    assert!(
        !t.iter().any(|s| s.contains("point ")),
        "no 'point N' labels"
    );
    assert_eq!(count(&t, "price (GLU per GPU-hour)"), 2);
    assert_eq!(count(&t, "time since start (h)"), 2);
    assert!(t[0].contains("band: 95 % bootstrap interval"), "{}", t[0]);
    // Okabe-Ito blue and orange for the two points; bands are filled polygons.
    assert!(svg.contains("#0072B2") && svg.contains("#E69F00"));
    assert!(svg.contains("<polygon"), "no confidence band drawn");

    let (t, _) = read(&out, "utilization");
    assert!(has(&t, "honest providers") && has(&t, "attacker providers"));
    assert_eq!(count(&t, "renter_rate=0.5"), 2);
    assert_eq!(
        count(&t, "utilization (leased / online GPU-time, ratio)"),
        2
    );

    // Waits: one panel per sweep point, bars on a log axis in seconds.
    let (t, svg) = read(&out, "waits");
    let panels: Vec<&String> = t.iter().filter(|s| s.contains("matched jobs,")).collect();
    assert_eq!(panels.len(), 2, "{t:?}");
    assert!(panels[0].starts_with("renter_rate=0.5: ") && panels[1].starts_with("renter_rate=1: "));
    assert_eq!(count(&t, "share of matched jobs (%, log scale)"), 2);
    // The share with no wait is a grey bar of its own in each panel, and said in the caption.
    assert_eq!(rects(&svg, "#787878").len(), 2, "{svg}");
    assert_eq!(
        t.iter()
            .filter(|s| s.contains("with no wait (grey bar)"))
            .count(),
        2
    );
    assert_eq!(count(&t, "wait (s, log scale; last bar: over 28800 s)"), 2);
    // 16 bars per panel (the bins above 0 s), each starting where the previous ends (real,
    // adjacent edges), wider for (2, 5] s than for (1, 2] s (log-width of the real edges).
    for fill in ["#0072B2", "#E69F00"] {
        let bars = rects(&svg, fill);
        assert_eq!(bars.len(), 16, "{fill}: {bars:?}");
        for w in bars.windows(2) {
            assert!(
                (w[0].0 + w[0].1 - w[1].0).abs() <= 1.0,
                "gap between bars: {bars:?}"
            );
        }
        assert!(
            bars[2].1 > bars[1].1 + 4.0,
            "(2,5] not wider than (1,2]: {bars:?}"
        );
    }

    // Gini against the swept value (renter_rate is numeric).
    let (t, _) = read(&out, "revenue_gini");
    assert!(has(&t, "renter_rate (swept value)"), "{t:?}");
    assert!(has(&t, "Gini coefficient (ratio)"));
}

#[test]
fn single_run_plots_have_a_replication_axis_and_one_series_per_quantity() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let baseline = scenario("baseline");
    sim(&[
        "-q",
        "run",
        baseline.to_str().unwrap(),
        "--reps",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (t, _) = read(&out, "price");
    // Two classes, no attackers: one series per class, named by class only.
    assert!(has(&t, "rtx4090") && has(&t, "a100"), "{t:?}");
    assert!(
        !t.iter()
            .any(|s| s.starts_with("honest") || s.starts_with("attacker"))
    );
    assert!(has(&t, "price (GLU per GPU-hour)"));
    let (t, _) = read(&out, "utilization");
    assert_eq!(count(&t, "all providers"), 1);
    let (t, _) = read(&out, "waits");
    assert_eq!(t.iter().filter(|s| s.contains("matched jobs,")).count(), 1);
    // Gini: the run's mean over its replications at x = 1 (the replication index is not an
    // axis: its order means nothing), and no other tick.
    let (t, _) = read(&out, "revenue_gini");
    assert!(has(&t, "the run (mean over replications)"), "{t:?}");
    assert!(has(&t, "mean over replications"));
    assert!(!has(&t, "replication (index)"), "{t:?}");
    assert!(has(&t, "1"), "tick 1 missing: {t:?}");
    for tick in ["0", "2", "-1"] {
        assert!(!has(&t, tick), "tick {tick}: {t:?}");
    }
}

/// With network reputation the `reputation` plot has its three panels, a series per sweep
/// point and its axis labels; a study without it draws no such plot.
#[test]
fn reputation_plot_has_scores_and_share_per_sweep_point() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let sybil = scenario("sybil");
    sim(&[
        "-q",
        "sweep",
        sybil.to_str().unwrap(),
        "--param",
        "reputation.mode=local,network",
        "--param",
        "days=0.25",
        "--reps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (t, _) = read(&out, "reputation");
    for caption in [
        "honest providers: mean network score",
        "attacker providers: mean network score",
        "attacker providers: share of leases started",
    ] {
        assert!(has(&t, caption), "{caption}: {t:?}");
    }
    assert!(has(&t, "score or share (ratio)"));
    assert!(has(&t, "time since start (h)"));
    // One legend entry per sweep point in each of the three panels.
    assert_eq!(count(&t, "reputation.mode=local"), 3, "{t:?}");
    assert_eq!(count(&t, "reputation.mode=network"), 3, "{t:?}");
    let plain = tmp.path().join("p");
    let attack = scenario("attack");
    sim(&[
        "-q",
        "run",
        attack.to_str().unwrap(),
        "--reps",
        "1",
        "--out",
        plain.to_str().unwrap(),
    ]);
    assert!(!plain.join("reputation.svg").exists());
}
