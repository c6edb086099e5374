//! Tests of the configuration: defaults, file, environment and flags merged by key.
use super::*;
use clap::Parser;

/// `gridlease node`'s settings as clap parses them (flags only: environment variables are
/// covered through the binary in `tests/cli_api.rs`).
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    s: Overrides,
}

fn flags(args: &[&str]) -> Overrides {
    Cli::try_parse_from(std::iter::once("node").chain(args.iter().copied()))
        .unwrap()
        .s
}

#[test]
fn defaults_are_documented_values() {
    let c = Config::resolve(None, &Overrides::default()).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.announce_secs, 60);
    assert!(c.mdns);
}

#[test]
fn precedence_is_defaults_file_flags() {
    let file = "announce_secs = 10\nmdns = false\nmetrics = \"127.0.0.1:9000\"\n";
    let c = Config::resolve(Some(("f", file)), &Overrides::default()).unwrap();
    assert_eq!(c.announce_secs, 10, "file beats default");
    assert!(!c.mdns);
    assert_eq!(c.listen, Config::default().listen, "default kept");
    let c = Config::resolve(
        Some(("f", file)),
        &flags(&[
            "--announce-secs",
            "30",
            "--mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/1,/ip4/127.0.0.1/tcp/2",
        ]),
    )
    .unwrap();
    assert_eq!(c.announce_secs, 30, "flag beats file");
    assert!(c.mdns, "--mdns alone means true");
    assert_eq!(c.listen.len(), 2, "comma-separated lists");
    assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:9000"), "file kept");
    let c = Config::resolve(None, &flags(&["--no-mdns", "--relay-server"])).unwrap();
    assert!(!c.mdns && c.relay_server);
}

#[test]
fn unknown_keys_and_bad_values_are_clear_errors() {
    let err = Config::resolve(
        Some(("cfg.toml", "annouce_secs = 5\n")),
        &Overrides::default(),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cfg.toml") && msg.contains("annouce_secs"),
        "{msg}"
    );
    let err = Cli::try_parse_from(["node", "--mdns=maybe"]).err().unwrap();
    assert!(err.to_string().contains("maybe"), "{err}");
    let err = Cli::try_parse_from(["node", "--listen", "not-an-addr"])
        .err()
        .unwrap();
    assert!(err.to_string().contains("not-an-addr"), "{err}");
    let err = Config::resolve(None, &flags(&["--announce-secs", "0"])).unwrap_err();
    assert!(err.to_string().contains("announce_secs"), "{err}");
}

#[test]
fn followed_classes_are_written_as_the_protocol_writes_them() {
    let c = Config::resolve(
        Some(("f", "follow = [\"a100-sxm4-80gb\"]\n")),
        &flags(&[
            "--follow",
            "NVIDIA GeForce RTX 4090,rtx-4090",
            "--follow",
            "RTX 3090",
        ]),
    )
    .unwrap();
    assert_eq!(
        c.follow,
        ["rtx-4090", "rtx-3090"],
        "flags replace the file; once each"
    );
    let c = Config::resolve(
        Some(("f", "follow = [\"A100 SXM4 80GB\"]\n")),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.follow, ["a100-sxm4-80gb"]);
    let err = Config::resolve(None, &flags(&["--follow", "!!"])).unwrap_err();
    assert!(err.to_string().contains("names no GPU class"), "{err}");
    let many: Vec<String> = (0..17).map(|i| format!("c{i}")).collect();
    let err = Config::resolve(None, &flags(&["--follow", &many.join(",")])).unwrap_err();
    assert!(err.to_string().contains("at most 16"), "{err}");
}

#[test]
fn host_reserve_and_per_gpu_settings_come_from_file_and_flags() {
    let file = "reserve_ram_mib = 4096\nper_gpu_ram_mib = 128\n";
    let c = Config::resolve(
        Some(("f", file)),
        &flags(&[
            "--reserve-cpu-millicores",
            "500",
            "--per-gpu-ram-mib",
            "256",
        ]),
    )
    .unwrap();
    assert_eq!(c.reserve_ram_mib, Some(4096));
    assert_eq!(c.reserve_cpu_millicores, Some(500));
    assert_eq!(c.per_gpu_ram_mib, Some(256), "flag beats file");
    assert_eq!(c.reserve_disk_gib, None, "default: derived from the host");
    let r = c.host_reserve();
    assert_eq!(
        (r.ram_mib, r.cpu_millicores, r.disk_gib),
        (Some(4096), Some(500), Some(10 + 2)),
        "the disk reserve holds the lease logs' budget (2 GiB) too"
    );
    assert_eq!(c.per_gpu_limit().ram_mib, Some(256));
    let c = Config::resolve(
        None,
        &flags(&["--reserve-disk-gib", "20", "--lease-logs-gib", "5"]),
    )
    .unwrap();
    assert_eq!(c.host_reserve().disk_gib, Some(25));
    assert_eq!(c.log_retention().max_bytes, 5 << 30);
    let err = Config::resolve(None, &flags(&["--lease-log-days", "4000"])).unwrap_err();
    assert!(err.to_string().contains("lease_log_days"), "{err}");
}

#[test]
fn dump_round_trips() {
    let c = Config {
        dev_gpus: Some("RTX 4090:24GiB:0.40".into()),
        reserve_ram_mib: Some(1024),
        per_gpu_cpu_millicores: Some(250),
        ..Config::default()
    };
    let again = Config::resolve(Some(("x", &c.to_toml())), &Overrides::default()).unwrap();
    assert_eq!(again, c);
}

#[test]
fn the_packaged_config_is_every_default_commented() {
    let shipped = include_str!("../../../packaging/deb/config.toml");
    assert_eq!(
        shipped,
        Config::commented_defaults(),
        "regenerate: cargo run -p gridlease-node --example default_config > packaging/deb/config.toml"
    );
    // Read as it ships, it is the defaults.
    let c = Config::resolve(Some(("shipped", shipped)), &Overrides::default()).unwrap();
    assert_eq!(c, Config::resolve(None, &Overrides::default()).unwrap());
    // Uncommented (the header is everything before the first blank line), it is the same
    // configuration.
    let (_, body) = shipped.split_once("\n\n").unwrap();
    let open: String = body
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or(l)))
        .collect();
    let c2 = Config::resolve(Some(("open", &open)), &Overrides::default()).unwrap();
    assert_eq!(c2, c);
}

#[test]
fn a_chain_rpc_needs_a_chain_and_an_http_url() {
    let chain = "chain_id = 5\ntoken = \"0x1111111111111111111111111111111111111111\"\nchannel_contract = \"0x2222222222222222222222222222222222222222\"\n";
    let c = Config::resolve(
        Some(("f", chain)),
        &flags(&["--chain-rpc", "https://rpc.example/v3/KEY"]),
    )
    .unwrap();
    assert_eq!(c.chain_rpc.as_deref(), Some("https://rpc.example/v3/KEY"));
    assert_eq!(c.redeem_interval_secs, 60);
    let err = Config::resolve(None, &flags(&["--chain-rpc", "http://127.0.0.1:8545"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("chain_rpc") && err.contains("chain_id"),
        "{err}"
    );
    let err = Config::resolve(Some(("f", chain)), &flags(&["--chain-rpc", "ws://x:1"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("http:// or https://"), "{err}");
    let err = Config::resolve(None, &flags(&["--redeem-interval-secs", "0"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("redeem_interval_secs"), "{err}");
}
