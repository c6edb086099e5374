//! The CLI against the control API: help and error texts, exit codes, `--dump-config`
//! precedence, the API socket's mode, and a real daemon answering `status`/`search`/`gpus`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli_support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use cli_support::{bin, cli, init, json, start_node, text, wait_for};

fn run(args: &[&str], home: &Path) -> Output {
    cli_support::cli(home, args)
}

#[test]
fn help_lists_every_command_and_global_flag() {
    let out = bin().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in [
        "init", "node", "status", "peers", "gpus", "bench", "search", "--home", "--json", "--quiet",
    ] {
        assert!(help.contains(word), "help lacks {word}:\n{help}");
    }
    let out = bin().args(["node", "--help"]).output().unwrap();
    let help = text(&out.stdout);
    for word in [
        "--dump-config",
        "--dev-gpus",
        "--metrics",
        "--log-format",
        "--relay-server",
    ] {
        assert!(help.contains(word), "node help lacks {word}:\n{help}");
    }
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = bin().args(["search", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("unexpected argument '--bogus'"), "{err}");
}

#[test]
fn commands_without_a_node_say_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let out = run(&["status"], &home);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("no node is running"), "{err}");
    assert!(err.contains("gridlease node --home"), "{err}");
}

#[test]
fn dump_config_follows_file_env_flag_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    std::fs::write(
        home.join("config.toml"),
        "announce_secs = 10\nmdns = false\nmetrics = \"127.0.0.1:9000\"\n",
    )
    .unwrap();
    let dump = |envs: &[(&str, &str)], flags: &[&str]| {
        let mut c = bin();
        c.args(["node", "--dump-config"])
            .args(flags)
            .arg("--home")
            .arg(&home);
        for (k, v) in envs {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let cfg: toml::Value = toml::from_str(&text(&out.stdout)).unwrap();
        cfg
    };
    let file_only = dump(&[], &[]);
    assert_eq!(file_only["announce_secs"].as_integer(), Some(10));
    assert_eq!(file_only["mdns"].as_bool(), Some(false));
    assert_eq!(file_only["log_format"].as_str(), Some("text"), "default");
    let env = dump(
        &[
            ("GRIDLEASE_ANNOUNCE_SECS", "20"),
            ("GRIDLEASE_LOG_FORMAT", "json"),
        ],
        &[],
    );
    assert_eq!(
        env["announce_secs"].as_integer(),
        Some(20),
        "env beats file"
    );
    assert_eq!(env["log_format"].as_str(), Some("json"));
    assert_eq!(env["metrics"].as_str(), Some("127.0.0.1:9000"), "file kept");
    let flags = dump(
        &[("GRIDLEASE_ANNOUNCE_SECS", "20")],
        &["--announce-secs", "30"],
    );
    assert_eq!(
        flags["announce_secs"].as_integer(),
        Some(30),
        "flag beats env"
    );

    std::fs::write(home.join("config.toml"), "annouce_secs = 5\n").unwrap();
    let out = run(&["node", "--dump-config"], &home);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("config.toml") && err.contains("annouce_secs"),
        "{err}"
    );
}

#[test]
fn daemon_serves_status_search_and_gpus_on_a_private_socket() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let _node = start_node(
        &home,
        &[
            "--dev-gpus",
            "2x RTX 4090:24GiB:0.40",
            "--metrics",
            &metrics,
        ],
    );

    // Prometheus metrics are served.
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(body.contains("gridlease_own_offer_gpus 2"), "{body}");
    assert!(body.contains("gridlease_leases_active 0"), "{body}");
    // Offer gossip counters (a lone node has received none).
    assert!(
        body.contains("gridlease_gossip_offers_rejected_total 0"),
        "{body}"
    );
    assert!(
        body.contains("gridlease_offer_signatures_checked_total 0"),
        "{body}"
    );

    // The socket is private.
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let meta = std::fs::metadata(home.join("api.sock")).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Another user cannot use it (CI runs as root, which can switch to `nobody`).
    if unsafe_free_is_root() {
        use std::os::unix::process::CommandExt;
        let out = bin()
            .args(["status", "--home"])
            .arg(&home)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert!(!out.status.success(), "user nobody reached the API");
    } else {
        eprintln!("note: not root, cannot test access as another user");
    }

    let out = run(&["status", "--json"], &home);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(s["peer_id"].as_str().unwrap().starts_with("12D3"));
    // The wallet the node runs with is the home's key file's.
    let wallet = gridlease_protocol::wallet::WalletKey::load_file(&home.join("wallet.key"))
        .unwrap()
        .address();
    assert_eq!(s["wallet"], wallet.to_string());
    assert_eq!(s["network"], "devnet");
    assert_eq!(s["own_offer"]["gpus"], 2);
    assert_eq!(s["own_offer"]["price_per_gpu_hour"], "0.40");

    // Its own offer is in its own book.
    let out = run(&["search", "--json", "gpu~4090", "vram>=24"], &home);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["measured"], false, "declared GPUs are not measured");
    // No GPU check: the test daemons offer none, and no check of theirs passed.
    assert_eq!(rows[0]["verified"], 0);
    assert_eq!(rows[0]["gpu_check"], "none");
    assert_eq!(rows[0]["verify_window_s"], 0);
    assert_eq!(rows[0]["gpus"], 2);

    let out = run(&["search", "vram>>24"], &home);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("invalid query") && err.contains("^"), "{err}");

    let out = run(&["gpus", "--json"], &home);
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(g["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(g["gpus"][0]["source"], "declared");

    // A second daemon on the same home is refused.
    let out = bin()
        .args([
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--home",
        ])
        .arg(&home)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn bench_without_cuda_is_a_clear_error() {
    if gridlease_sandbox::bench::check_cuda().is_ok() {
        eprintln!("note: CUDA is present here; the no-CUDA path is not what runs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["bench"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("no GPU benchmark is possible"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn unsafe_free_is_root() -> bool {
    // Without libc: the owner of a file we just created is our effective uid.
    use std::os::unix::fs::MetadataExt;
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid() == 0
}

/// `provide` survives a restart: the price set with `provide` wins over the declared one, and
/// `provide --off` keeps the node from offering after a restart too.
#[test]
fn provide_settings_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let flags = ["--dev-gpus", "2x RTX 4090:24GiB:0.40"];
    let own_offer = |home: &Path| {
        let out = run(&["status", "--json"], home);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["own_offer"].clone()
    };

    let node = start_node(&home, &flags);
    let out = run(&["provide", "--price", "0.30"], &home);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(own_offer(&home)["price_per_gpu_hour"], "0.30");
    drop(node); // SIGKILL: nothing is flushed at exit

    let node = start_node(&home, &flags);
    assert_eq!(
        own_offer(&home)["price_per_gpu_hour"],
        "0.30",
        "the price set with `provide` is kept"
    );
    let out = run(&["provide", "--off"], &home);
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(node);

    let _node = start_node(&home, &flags);
    assert!(
        own_offer(&home).is_null(),
        "`provide --off` is kept: {}",
        own_offer(&home)
    );
}

#[test]
fn search_takes_a_descending_sort_refuses_bad_limits_and_booleans_and_lists_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let _node = start_node(&home, &["--dev-gpus", "RTX 4090:24GiB:0.40"]);
    // `--sort -field`, the form `--help` shows, works like `--sort=-field`.
    let a = cli(&home, &["--json", "search", "--sort", "-fp16_tflops"]);
    assert!(a.status.success(), "{}", text(&a.stderr));
    let b = cli(&home, &["--json", "search", "--sort=-fp16_tflops"]);
    assert_eq!(text(&a.stdout), text(&b.stdout));
    // Limits are validated.
    for bad in ["0", "10001", "-4"] {
        let out = cli(&home, &["search", "--limit", bad]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--limit {bad}: {}",
            text(&out.stderr)
        );
    }
    // A bad boolean is an error naming the accepted values and the fields, not an empty list.
    let out = cli(&home, &["search", "verified=maybe"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("true or false"), "{err}");
    assert!(
        err.contains("fp16_tflops") && !err.contains("docs/search.md"),
        "{err}"
    );
    let yes = cli(&home, &["--json", "search", "verified=no"]);
    assert!(yes.status.success(), "{}", text(&yes.stderr));
    // Reputation (issue 16): a provider no completion is known of has the prior, 0.5, and no
    // completed leases; `rep>=0.8` leaves it out, `sort:-rep` is a sort key.
    let rows: serde_json::Value = serde_json::from_slice(&yes.stdout).unwrap();
    assert_eq!(rows[0]["rep"], 0.5, "{rows}");
    assert_eq!(rows[0]["completed"], 0, "{rows}");
    let out = cli(&home, &["--json", "search", "rep>=0.8"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
    let out = cli(
        &home,
        &["--json", "search", "rep>=0.5", "completed>=0", "sort:-rep"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    let table = text(&cli(&home, &["search", "--wide"]).stdout);
    assert!(
        table.contains("rep (done)") && table.contains("0.50 (0)"),
        "{table}"
    );
    assert!(
        table.contains("checks") && table.contains("bench") && table.contains("declared"),
        "{table}"
    );
    // `verified` counts passed GPU checks: `verified>=1` leaves the daemon's offer out,
    // `verified=false` is `verified=0`; `sort:-verified` is a sort key.
    let out = cli(&home, &["--json", "search", "verified>=1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
    let out = cli(
        &home,
        &["--json", "search", "verified=false", "sort:-verified"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    // `search --help` lists every field with its type and an example.
    let help = text(&cli(&home, &["search", "--help"]).stdout);
    for (name, f) in gridlease_contracts::query::Field::ALL {
        let (kind, _, example) = f.describe();
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(name)
                && l.contains(kind)
                && l.contains(example)),
            "{name} missing from search --help:\n{help}"
        );
    }
}

/// `search --limit N` says when more offers match and prints the cursor of the next page;
/// `--after CURSOR` gives that page (the rest, in the same order); a cursor that is not one is
/// refused with a sentence.
#[test]
fn search_pages_follow_the_cursor_the_cli_prints() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    init(&a);
    let _na = start_node(&a, &["--dev-gpus", "RTX 4090:24GiB:0.40"]);
    let addr = json(&a, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    init(&b);
    init(&c);
    let _nb = start_node(
        &b,
        &["--dev-gpus", "RTX 3090:24GiB:0.30", "--bootstrap", &addr],
    );
    let _nc = start_node(
        &c,
        &["--dev-gpus", "RTX 4080:16GiB:0.35", "--bootstrap", &addr],
    );
    let price = |args: &[&str]| -> Vec<String> {
        let out = cli(Path::new(args[0]), &args[1..]);
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["price_per_gpu_hour"].as_str().unwrap().to_string())
            .collect()
    };
    let home = a.to_str().unwrap();
    wait_for(Duration::from_secs(30), "three offers in a's book", || {
        price(&[home, "--json", "search"]).len() == 3
    });
    let all = price(&[home, "--json", "search"]);
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..4 {
        let mut args = vec!["--json", "search", "--limit", "2"];
        if let Some(c) = &after {
            args.extend(["--after", c.as_str()]);
        }
        let out = cli(&a, &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        pages.extend(
            rows.as_array()
                .unwrap()
                .iter()
                .map(|r| r["price_per_gpu_hour"].as_str().unwrap().to_string()),
        );
        let err = text(&out.stderr);
        after = err.split("--after ").nth(1).map(|c| c.trim().to_string());
        match &after {
            Some(c) => assert!(err.contains("more offers match") && c.len() == 80, "{err}"),
            None => break,
        }
    }
    assert_eq!(pages, all, "the pages are the whole search, in order");
    let numbers: Vec<f64> = all.iter().map(|p| p.parse().unwrap()).collect();
    assert_eq!(numbers, [0.30, 0.35, 0.40], "cheapest first");
    let out = cli(&a, &["search", "--after", "not-a-cursor"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not a page cursor"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn provide_keeps_what_is_not_given_refuses_nonsense_and_takes_the_ids_gpus_prints() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let _node = start_node(&home, &["--dev-gpus", "2x RTX 4090:24GiB:0.40"]);
    let saved = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(home.join("provide.json")).unwrap()).unwrap()
    };
    let ok = |args: &[&str]| {
        let out = cli(&home, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    };
    ok(&[
        "provide",
        "--price",
        "0.50",
        "--max-hours",
        "6",
        "--network-policy",
        "egress",
    ]);
    ok(&["provide", "--price", "0.36"]);
    let s = saved();
    assert_eq!(s["price_micros_per_gpu_hour"], 360_000, "{s}");
    assert_eq!(s["max_hours"], 6, "a new price keeps max hours: {s}");
    assert_eq!(s["network_policy"], "Egress", "and the network policy: {s}");
    // Nonsense is refused with a clear message, and changes nothing.
    let out = cli(&home, &["provide", "--price", "0"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("above 0"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&home, &["provide", "--max-hours", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(saved()["price_micros_per_gpu_hour"], 360_000);
    // The ids `gridlease gpus` prints are accepted.
    let gpus = cli(&home, &["--json", "gpus"]);
    let listed: serde_json::Value = serde_json::from_slice(&gpus.stdout).unwrap();
    let first = listed["gpus"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(first, "declared-0");
    ok(&["provide", "--gpus", &first]);
    let st: serde_json::Value =
        serde_json::from_slice(&cli(&home, &["--json", "status"]).stdout).unwrap();
    assert_eq!(st["own_offer"]["gpus"], 1, "{st}");
    assert_eq!(st["own_offer"]["price_per_gpu_hour"], "0.36", "{st}");
}

/// A node that follows some GPU classes (`--follow`) holds only their offers: a search that
/// finds nothing names them, so an empty answer is not taken for an empty market.
#[test]
fn an_empty_search_on_a_node_following_some_classes_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let _node = start_node(
        &home,
        &["--follow", "RTX 3090", "--dev-gpus", "RTX 4090:24GiB:0.40"],
    );
    // Its own offer (rtx-4090, a class it therefore follows too) is listed, with no note.
    wait_for(Duration::from_secs(30), "the own offer in the book", || {
        let out = cli(&home, &["--json", "search"]);
        out.status.success() && text(&out.stdout).contains("RTX 4090")
    });
    let out = cli(&home, &["search"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stdout).contains("follows only"),
        "{}",
        text(&out.stdout)
    );
    // Nothing of another class: the note names the classes followed.
    let out = cli(&home, &["search", "gpu~a100"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("no offers match"), "{said}");
    assert!(
        said.contains("follows only the GPU classes rtx-3090,rtx-4090"),
        "{said}"
    );
    // `--json` stays the bare list.
    let out = cli(&home, &["--json", "search", "gpu~a100"]);
    assert_eq!(text(&out.stdout).trim(), "[]");
    // A search naming a model exactly has the node follow its class for a while (with no
    // peer to fetch from, it answers at once from the book).
    let out = cli(&home, &["search", "gpu=\"NVIDIA A100-SXM4-80GB\""]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("follows only the GPU classes rtx-3090,rtx-4090,a100-sxm4-80gb"),
        "{said}"
    );
}

/// Issue 42 item 9: the input checks say what is wrong, the same way everywhere.
/// - `rent -e K=V` is `--env`, as `exec -e` (it was a usage error);
/// - `--max-total -1` is "cannot be negative" (it was "unexpected argument");
/// - `provide --price 18446744073709` is "too large" (it was "not an amount above 0");
/// - `provide --price 10000000000` is published with a note (it was silent);
/// - an unknown sort key's hint names `rep`, and an unknown field lists the fields once;
/// - `gpu=4090` matching nothing suggests `gpu~4090`.
#[test]
fn input_checks_say_what_is_wrong_the_same_way_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let _node = start_node(&home, &["--dev-gpus", "RTX 4090:24GiB:0.40"]);
    let offer = json(&home, &["status"])["own_offer"]["id"]
        .as_str()
        .unwrap()
        .to_string();

    // `rent -e` parses (and gets as far as the own-offer refusal, exit 4), like `--env`.
    let out = cli(
        &home,
        &[
            "rent",
            &offer,
            "--seconds",
            "60",
            "--image",
            "x:1",
            "-e",
            "A=1",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("own offer"),
        "{}",
        text(&out.stderr)
    );

    for args in [
        &[
            "rent",
            &offer,
            "--seconds",
            "60",
            "--image",
            "x:1",
            "--max-total",
            "-1",
        ][..],
        &["extend", "abcd", "--seconds", "60", "--max-total", "-1"][..],
    ] {
        let out = cli(&home, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("cannot be negative"), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }

    let out = cli(&home, &["provide", "--price", "18446744073709"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("too large"), "{err}");
    assert!(!err.contains("not an amount above 0"), "{err}");
    let out = cli(&home, &["provide", "--price", "10000000000"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("check the decimal point"), "{err}");
    let out = cli(&home, &["provide", "--price", "0.40"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("decimal point"));

    let out = cli(&home, &["search", "--sort", "bogus"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("rep"), "the sort keys include rep: {err}");
    let out = cli(&home, &["search", "colour=red"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(
        err.matches("fp16_tflops").count(),
        1,
        "fields listed once: {err}"
    );

    let out = cli(&home, &["search", "gpu=4090"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(said.contains("no offers match"), "{said}");
    assert!(said.contains("gpu~4090"), "{said}");
}
