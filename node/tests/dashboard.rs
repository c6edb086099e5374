//! `gridlease dashboard` (issue 18) in a real browser: two real nodes, a real lease of the probe
//! image whose provider's declared GPU is sampled from a scripted curves file (labelled on the
//! page as not a real GPU), the provider's `gridlease dashboard`, and Debian's headless Chromium
//! driven over WebDriver (chromedriver, `fantoccini`).
//!
//! The page, opened with the printed URL (token in the fragment), shows the GPUs, the offer,
//! the running lease and its cost, and updates them after the next usage report; a price set in
//! its settings reaches the node's offer. Without the token the server answers 401 (and another
//! `Host` 421), and the page opened with a wrong token says "wrong or missing token". A
//! screenshot is saved to `target/test-artifacts/dashboard.png`.
//!
//! Needs Docker (`GRIDLEASE_REQUIRE_DOCKER=1` makes its absence a failure) and chromium +
//! chromedriver (`GRIDLEASE_REQUIRE_BROWSER=1`, set by `.ci/run`, makes their absence a
//! failure; otherwise the test skips with a note).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{Daemon, bin, json, lease_of, market_with, probe_image_or_skip, wait_for};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// Utilisation alternates 17 / 83 %, with its VRAM, power, temperature and clock.
const CURVES: &str = r#"[{"util_percent":[17,83],"vram_used_mib":[1111,2222],
    "power_w":[150,250],"temp_c":[41,62],"sm_clock_mhz":[1500,2100]}]"#;

/// `name` on the PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, or `None` (skip) when missing and not required.
fn browser_or_skip() -> Option<(PathBuf, PathBuf)> {
    let found = which("chromium").zip(which("chromedriver"));
    if found.is_none() {
        assert!(
            std::env::var("GRIDLEASE_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "GRIDLEASE_REQUIRE_BROWSER=1 but chromium or chromedriver is not installed \
             (apt-get install chromium chromium-driver)"
        );
        eprintln!("dashboard: SKIPPED, chromium or chromedriver is not installed");
    }
    found
}

/// A process in its own process group, killed with its group when dropped (chromedriver and
/// the browsers it starts).
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One raw HTTP/1.1 request to the dashboard: `(status, body)`.
fn raw(port: u16, path: &str, host: &str, token: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The text of the element `css`, or "" while it is not there.
async fn text_of(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Polls the text of `css` until `ok` holds, failing after `limit` with what it last was.
async fn wait_text(c: &Client, css: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let t = text_of(c, css).await;
        if ok(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on {css}; it shows: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many days of the chart have a bar of `class` (`earned` or `spent`) taller than 0.
async fn bars(c: &Client, class: &str) -> u64 {
    let script = format!(
        "return [...document.querySelectorAll('#chart rect.{class}')]\
         .filter(r => Number(r.getAttribute('height')) > 0).length;"
    );
    c.execute(&script, vec![]).await.unwrap().as_u64().unwrap()
}

fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running `gridlease dashboard` (killed when dropped) and what it printed.
struct Dashboard {
    _process: Daemon,
    /// The printed URL, token included.
    url: String,
    /// The URL without the fragment.
    base: String,
    token: String,
    port: u16,
}

impl Dashboard {
    fn start(home: &Path) -> Self {
        let mut process = Daemon(
            bin()
                .arg("--home")
                .arg(home)
                .args(["dashboard", "--port", "0"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        let mut first = String::new();
        std::io::BufReader::new(process.0.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {first:?}"))
            .to_string();
        let (base, token) = url.split_once("#token=").unwrap();
        let port: u16 = base
            .trim_start_matches("http://127.0.0.1:")
            .trim_end_matches('/')
            .parse()
            .unwrap_or_else(|_| panic!("not a loopback URL: {url}"));
        assert_eq!(token.len(), 64, "{url}");
        Self {
            base: base.to_string(),
            token: token.to_string(),
            port,
            url,
            _process: process,
        }
    }
}

/// Headless Chromium driven over WebDriver: chromedriver (its process group killed when
/// dropped, the browser with it), the runtime the session lives on, the session.
struct Browser {
    client: Client,
    rt: tokio::runtime::Runtime,
    _driver: Group,
}

impl Browser {
    fn start(chromium: &Path, chromedriver: &Path, profile: &Path) -> Self {
        let wd_port = free_port();
        let driver = Group({
            use std::os::unix::process::CommandExt as _;
            Command::new(chromedriver)
                .arg(format!("--port={wd_port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap()
        });
        wait_for(Duration::from_secs(20), "chromedriver", || {
            std::net::TcpStream::connect(("127.0.0.1", wd_port)).is_ok()
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1440,1300", "--no-first-run",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let client = rt.block_on(async {
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{wd_port}"))
                .await
                .expect("a WebDriver session with headless chromium")
        });
        Self {
            client,
            rt,
            _driver: driver,
        }
    }
}

/// Rents 120 s of `offer` running `sleep 100` in `image` from the renter home `rh`, detached,
/// and waits until the lease runs; its id.
fn rent_running(rh: &Path, offer: &str, image: &str) -> String {
    let rented = json(
        rh,
        &[
            "rent",
            offer,
            "--seconds",
            "120",
            "--detach",
            "--image",
            image,
            "--",
            "sleep",
            "100",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(rh, &id)["state"] == "running"
    });
    id
}

#[test]
fn dashboard_shows_gpus_lease_and_cost_live_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let Some(image) = probe_image_or_skip("dashboard") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let curves = dir.path().join("curves.json");
    std::fs::write(&curves, CURVES).unwrap();
    let m = market_with(
        dir.path(),
        &[
            "--dev-gpu-samples",
            curves.to_str().unwrap(),
            // The curve is the tenant's load: only a process would mean the owner.
            "--owner-util-percent",
            "0",
            // A usage report (and a new cost) every 2 s.
            "--usage-interval-secs",
            "2",
        ],
        Some(&dir.path().join("provider.log")),
    );
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let id = rent_running(&rh, &m.offer, &image);

    // The provider's dashboard; it prints the URL with the token.
    let dash = Dashboard::start(&ph);
    let (url, base, token, port) = (&dash.url, &dash.base, dash.token.as_str(), dash.port);
    let token_file = std::fs::read_to_string(ph.join("dashboard.token")).unwrap();
    assert_eq!(token_file.trim(), token);

    // The server: the API needs the token; the node answers through it; another Host is refused.
    let host = format!("127.0.0.1:{port}");
    let (st, body) = raw(port, "/v1/status", &host, None);
    assert_eq!(st, 401, "{body}");
    let p: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        p["type"], "urn:gridlease:problem:dashboard-unauthorized",
        "{p}"
    );
    assert_eq!(raw(port, "/v1/status", &host, Some(&"f".repeat(64))).0, 401);
    let (st, body) = raw(port, "/v1/status", &host, Some(token));
    assert_eq!(st, 200, "{body}");
    let direct = json(&ph, &["status"]);
    let through: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(through["peer_id"], direct["peer_id"], "the same API");
    assert_eq!(
        raw(port, "/", &format!("rebound.example:{port}"), None).0,
        421
    );
    assert_eq!(
        raw(port, "/", &host, None).0,
        200,
        "the page needs no token"
    );

    // Headless Chromium over WebDriver.
    let browser = Browser::start(
        &chromium,
        &chromedriver,
        &dir.path().join("chromium-profile"),
    );
    let shot = artifacts().join("dashboard.png");
    browser.rt.block_on(async {
        let c = &browser.client;
        let limit = Duration::from_secs(30);
        c.goto(url).await.unwrap();

        // The token left the address bar (kept for the tab only).
        let now = c.current_url().await.unwrap();
        assert!(!now.as_str().contains(token), "{now}");

        // GPUs, the offer, the running lease with its cost.
        let gpus = wait_text(c, "#gpus", limit, |t| t.contains("RTX 4090")).await;
        assert!(
            gpus.contains("24576 MiB") && gpus.contains("declared"),
            "{gpus}"
        );
        let offer = wait_text(c, "#offer", limit, |t| t.contains("GPU(s) at")).await;
        assert!(offer.contains("3.6"), "{offer}");
        let row = format!("#leases tr[data-lease='{id}']");
        let lease = wait_text(c, &row, limit, |t| t.contains("running")).await;
        assert!(
            lease.contains(&id[..12]) && lease.contains("provider"),
            "{lease}"
        );
        let cost_css = format!("{row} td.cost");
        let usage_css = format!("{row} td.usage");
        let cost0 = wait_text(c, &cost_css, limit, |t| {
            t.ends_with(" GLU") && t != "0.000000 GLU"
        })
        .await;
        let usage0 = text_of(c, &usage_css).await;
        assert!(usage0.starts_with("report #"), "{usage0}");

        // Live GPU state from the scripted probe, labelled, with units, never 0 for unknown.
        let live = wait_text(c, "#live", limit, |t| t.contains("SCRIPTED")).await;
        assert!(live.contains("24576 MiB"), "{live}");
        assert!(live.contains("83 %") || live.contains("17 %"), "{live}");
        let util0 = if live.contains("83 %") {
            "83 %"
        } else {
            "17 %"
        };
        let other = if util0 == "83 %" { "17 %" } else { "83 %" };
        wait_text(c, "#live", limit, |t| t.contains(other)).await;

        // After the next usage report the cost and the usage change, without a reload.
        let cost1 = wait_text(c, &cost_css, limit, |t| t != cost0 && t.ends_with(" GLU")).await;
        let usage1 = wait_text(c, &usage_css, limit, |t| t != usage0).await;
        let micros = |t: &str| -> u64 {
            let n: f64 = t.trim_end_matches(" GLU").parse().unwrap();
            (n * 1e6).round() as u64
        };
        assert!(micros(&cost1) > micros(&cost0), "{cost0} -> {cost1}");
        assert!(usage1.starts_with("report #"), "{usage1}");
        // And it is what the node says (the API's cost at least what the page last showed).
        assert!(lease_of(&ph, &id)["cost_so_far"].as_u64().unwrap() >= micros(&cost1));

        // The chart has the earnings of today (the running lease's receipts).
        let totals = wait_text(c, "#totals", limit, |t| {
            t.contains("total earned") && !t.contains("total earned 0.000000")
        })
        .await;
        assert!(totals.contains("ledger balanced"), "{totals}");
        assert_eq!(
            bars(c, "earned").await,
            1,
            "today's earnings drawn: {totals}"
        );
        assert_eq!(bars(c, "spent").await, 0, "the provider spent nothing");

        // Settings: a new price through PUT /v1/provide, the same route as `gridlease provide`.
        let price = c.find(Locator::Id("set-price")).await.unwrap();
        price.clear().await.unwrap();
        price.send_keys("4.25").await.unwrap();
        c.find(Locator::Id("set-save"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let done = wait_text(c, "#settings-result", limit, |t| !t.is_empty()).await;
        assert!(done.contains("at 4.25"), "{done}");
        wait_text(c, "#offer", limit, |t| t.contains("4.25")).await;
        let status = json(&ph, &["status"]);
        assert_eq!(
            status["own_offer"]["price_per_gpu_hour"], "4.25",
            "{status}"
        );

        // The offered hours, the same route as `gridlease provide --hours`; the page shows them.
        let set_hours = async |hours: &str| {
            let avail = c.find(Locator::Id("set-avail")).await.unwrap();
            avail.clear().await.unwrap();
            avail.send_keys(hours).await.unwrap();
            c.find(Locator::Id("set-save"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        };
        set_hours("22:00-08:00").await;
        wait_text(c, "#offer", limit, |t| t.contains("hours 22:00-08:00")).await;
        let status = json(&ph, &["status"]);
        assert_eq!(status["schedule"]["hours"], "22:00-08:00", "{status}");
        set_hours("always").await;
        wait_text(c, "#offer", limit, |t| {
            t.contains("hours: always") || t.contains("hours always")
        })
        .await;

        // Nothing on the page was blocked by its Content-Security-Policy.
        let blocked = c
            .execute("return window.cspViolations;", vec![])
            .await
            .unwrap();
        assert_eq!(blocked, json!([]), "CSP violations");

        let png = c.screenshot().await.unwrap();
        std::fs::write(&shot, &png).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");

        // A wrong token: the page says so and shows nothing of the node.
        c.goto("about:blank").await.unwrap();
        c.goto(&format!("{base}#token={}", "0".repeat(64)))
            .await
            .unwrap();
        let err = wait_text(c, "#auth-error", limit, |t| !t.is_empty()).await;
        assert!(err.contains("wrong or missing token"), "{err}");
        assert!(!text_of(c, "#gpus").await.contains("RTX 4090"));
        let shot_bad = artifacts().join("dashboard-wrong-token.png");
        std::fs::write(&shot_bad, c.screenshot().await.unwrap()).unwrap();
    });
    eprintln!("dashboard: screenshot at {}", shot.display());
    let stop = bin().arg("--home").arg(&rh).args(["stop", &id]).output();
    assert!(stop.unwrap().status.success());
    drop(dash);
    drop(browser);
    drop(m);
}

#[test]
fn dashboard_shows_na_for_declared_gpus_and_stops_offering() {
    let Some((chromium, chromedriver)) = browser_or_skip() else {
        return;
    };
    let Some(image) = probe_image_or_skip("dashboard_declared") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Declared GPUs, nothing samples them: every GPU value is unknown.
    let m = market_with(
        dir.path(),
        &["--usage-interval-secs", "2", "--volume-price", "0.01"],
        None,
    );
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let id = rent_running(&rh, &m.offer, &image);
    // A volume the provider keeps for the renter: both pages list it.
    let made = cli_support::cli(
        &rh,
        &[
            "--json", "volume", "create", "notes", "--offer", &m.offer, "--size", "1GiB", "--keep",
            "10m",
        ],
    );
    assert!(made.status.success(), "{}", cli_support::text(&made.stderr));
    let vid = serde_json::from_slice::<Value>(&made.stdout).unwrap()["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The renter's dashboard: the lease it rents, the provider's GPUs as n/a, its spending.
    let renter = Dashboard::start(&rh);
    let provider = Dashboard::start(&ph);
    let browser = Browser::start(
        &chromium,
        &chromedriver,
        &dir.path().join("chromium-profile"),
    );
    browser.rt.block_on(async {
        let c = &browser.client;
        let limit = Duration::from_secs(30);
        c.goto(&renter.url).await.unwrap();
        let row = format!("#leases tr[data-lease='{id}']");
        let lease = wait_text(c, &row, limit, |t| t.contains("running")).await;
        assert!(lease.contains("renter"), "{lease}");
        // The usage report's GPU figures cannot tell unmeasured from 0: not shown there.
        assert!(!lease.contains('%'), "{lease}");
        // Its volume, in the volumes' table (not among the leases).
        let vrow = format!("#volumes tr[data-volume='{vid}']");
        let vol = wait_text(c, &vrow, limit, |t| t.contains("running")).await;
        assert!(
            vol.contains("notes") && vol.contains("rented") && vol.contains("1 GiB"),
            "{vol}"
        );
        assert!(
            c.find(Locator::Css(&format!("#leases tr[data-lease='{vid}']")))
                .await
                .is_err(),
            "a volume is not listed as a lease"
        );
        // The container's own numbers are measured; every GPU value is n/a, none is 0.
        let live = wait_text(c, "#live", limit, |t| t.contains("cores")).await;
        assert!(live.contains("declared: not measured"), "{live}");
        assert_eq!(live.matches("n/a").count(), 6, "{live}");
        assert!(
            !live.contains(" 0 %") && !live.contains("\n0 MiB") && !live.contains(" 0 W"),
            "{live}"
        );
        // The renter's node rents and provides nothing: its own GPUs section says so.
        let gpus = wait_text(c, "#gpus", limit, |t| !t.is_empty()).await;
        assert!(!gpus.contains("RTX 4090"), "{gpus}");
        let totals = wait_text(c, "#totals", limit, |t| {
            t.contains("total spent") && !t.contains("total spent 0.000000")
        })
        .await;
        assert!(totals.contains("total earned 0.000000 GLU"), "{totals}");
        assert_eq!(
            bars(c, "spent").await,
            1,
            "today's spending drawn: {totals}"
        );
        assert_eq!(bars(c, "earned").await, 0, "the renter earned nothing");
        // No GPUs, nothing to offer: no settings.
        let settings = c.find(Locator::Id("settings-section")).await.unwrap();
        assert!(!settings.is_displayed().await.unwrap());
        std::fs::write(
            artifacts().join("dashboard-renter.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();

        // The provider's dashboard lists the volume it keeps: whose, how large, when it goes.
        c.goto(&provider.url).await.unwrap();
        let kept = wait_text(c, &vrow, limit, |t| t.contains("running")).await;
        assert!(
            kept.contains("kept here") && kept.contains("1 GiB"),
            "{kept}"
        );
        assert!(kept.contains(&vid[..12]) && kept.contains("min"), "{kept}");
        let renter_peer = json(&rh, &["status"])["peer_id"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(kept.contains(&renter_peer[..12]), "{kept}");
        // "stop offering" withdraws the offer (PUT /v1/provide).
        wait_text(c, "#offer", limit, |t| t.contains("GPU(s) at")).await;
        c.find(Locator::Id("set-off"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let done = wait_text(c, "#settings-result", limit, |t| !t.is_empty()).await;
        assert_eq!(done, "not offering anything");
        wait_text(c, "#offer", limit, |t| t.contains("not offering")).await;
    });
    assert!(json(&ph, &["status"])["own_offer"].is_null());
    assert!(cli_support::cli(&rh, &["stop", &id]).status.success());
    wait_for(Duration::from_secs(60), "the lease to settle", || {
        lease_of(&rh, &id)["state"] == "settled"
    });

    // The provider's node stops: its page says the node does not answer.
    let mut m = m;
    m.provider.0.kill().unwrap();
    m.provider.0.wait().unwrap();
    browser.rt.block_on(async {
        let c = &browser.client;
        let banner = wait_text(c, "#api-error", Duration::from_secs(30), |t| !t.is_empty()).await;
        assert!(banner.contains("no node is running"), "{banner}");
    });
    drop((renter, provider, browser));
    drop(m);
}
