//! `gridlease rent`: rent an offer, follow the container's output, print the bill, exit with
//! the container's exit code.
//!
//! Ctrl-C on a foreground `rent` works like `docker run`'s signal proxy: the first stops the
//! lease (the provider sends the container SIGTERM, SIGKILL after its grace) and keeps
//! following until the lease settles, then prints the bill; a second one detaches, saying how
//! to follow or stop the lease. Both exit with [`EXIT_INTERRUPTED`]; what happened is said on
//! stderr.

mod follow;

use follow::{await_prepaid, show_check, show_pull};
pub use follow::{follow_logs, wait_terminal};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gridlease_contracts::Money;
use gridlease_contracts::money::UNIT;
use tokio::signal::unix::{Signal, SignalKind};

use crate::api::client::{ApiClient, ClientError};
use crate::api::types::RentRequest;
use crate::lease::LeaseView;
use crate::output::{Printer, money, short};

/// Exit code of a foreground `rent` that Ctrl-C interrupted (128 + SIGINT, as shells report a
/// process that SIGINT ended).
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit status of a `rent` whose lease the provider accepted but could not start (the pull
/// failed or stalled, the container could not be created): the reason is printed.
pub const EXIT_START_FAILED: u8 = 5;
/// Exit status of a `rent` whose GPU check failed at the start: the lease was aborted before
/// billing; which part failed, by how much, is printed.
pub const EXIT_GPU_CHECK_FAILED: u8 = 7;

/// `rent --network`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Network {
    /// No network at all.
    None,
    /// The internet, not the provider's LAN, link-local addresses or host.
    Egress,
}

impl From<Network> for gridlease_protocol::NetworkPolicy {
    fn from(n: Network) -> Self {
        match n {
            Network::None => Self::None,
            Network::Egress => Self::Egress,
        }
    }
}

/// Arguments of `gridlease rent`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("duration").required(true).args(["hours", "minutes", "seconds"])))]
pub struct RentArgs {
    /// Offer handle (`PROVIDER/0`, as `gridlease search` shows it: the provider's offer as it
    /// is signed now) or offer id (or its first digits).
    #[arg(value_name = "OFFER")]
    pub offer: String,
    /// GPUs to lease.
    #[arg(long, default_value_t = 1)]
    pub gpus: u16,
    /// Lease duration in hours (decimals allowed, e.g. 0.5).
    #[arg(long, value_name = "H")]
    pub hours: Option<String>,
    /// Lease duration in minutes.
    #[arg(long, value_name = "M")]
    pub minutes: Option<u32>,
    /// Lease duration in seconds.
    #[arg(long, value_name = "S")]
    pub seconds: Option<u32>,
    /// Container image (used as is if present on the provider, else pulled).
    #[arg(long, value_name = "IMG")]
    pub image: String,
    /// Environment variable for the container (repeatable), as `exec -e`.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Most you will pay in total (default: the whole duration at the offer's price).
    #[arg(long, value_name = "AMOUNT", allow_hyphen_values = true, value_parser = super::parse_amount)]
    pub max_total: Option<Money>,
    /// Network for the container: `none` (default: no network at all) or `egress` (the
    /// internet, never the provider's LAN, link-local/metadata addresses or host; only
    /// offers showing `egress` accept it).
    #[arg(long, value_enum, value_name = "NET", default_value_t = Network::None)]
    pub network: Network,
    /// Print the lease id and return; follow later with `gridlease logs -f`.
    #[arg(long)]
    pub detach: bool,
    /// Pay this much use ahead (`2h`, `90m`, or `all` for the whole lease) so the lease keeps
    /// running while this node is offline (an unattended lease; pair with --detach). What you
    /// risk is exactly that prepay, shown before renting; what was not used is not owed (the
    /// lease settles at the provider's reported use) and this node checks every report when it
    /// is back. Default: pay as you go, and the provider stops the lease when this node is
    /// silent for the grace period.
    #[arg(long, value_name = "DURATION|all", value_parser = parse_prepay)]
    pub prepay: Option<u32>,
    /// Skip the GPU check at the lease's start. By default the renter's node checks, in the
    /// provider's unbilled verification window, that the leased GPUs compute what the offer
    /// advertises (seeded int8 GEMMs, committed before the rows to check are revealed; its VRAM
    /// filled and opened; timed): a failed check aborts the lease and nothing is charged
    /// (`docs/gpu.md`). Skipped, the lease's statement says no check was asked.
    #[arg(long)]
    pub no_verify: bool,
    /// Mount a volume of yours kept by this offer's provider (`NAME:/PATH`, repeatable; see
    /// `gridlease volume`); at `/workspace` it is the lease's workspace (resume on kept disk).
    #[arg(long = "volume", value_name = "NAME:/PATH", value_parser = parse_mount)]
    pub volumes: Vec<crate::renter::VolumeMountRequest>,
    /// Forward a local port to a port in the container while the lease runs (repeatable):
    /// `REMOTE` or `LOCAL:REMOTE`, listening on --bind (e.g. `--forward 8888` for Jupyter).
    #[arg(long, value_name = "[LOCAL:]REMOTE", conflicts_with = "detach")]
    pub forward: Vec<super::access::PortSpec>,
    /// Ask the provider to keep the finished lease's stopped container and `/workspace` this
    /// many minutes for downloads (`gridlease cp LEASE:/workspace/PATH DST`); at most what the
    /// offer keeps (`gridlease offer` shows it).
    #[arg(long, value_name = "MINUTES")]
    pub keep_outputs: Option<u32>,
    /// Upload SRC (a local file or directory) to DEST in `/workspace` (default: its name)
    /// before the command starts (repeatable): the provider holds the created container, not
    /// billed, until the uploads are done (at most what the offer holds: `gridlease offer`).
    #[arg(long, value_name = "SRC[:DEST]", conflicts_with = "detach")]
    pub upload: Vec<String>,
    /// Download PATH (in `/workspace`) to DEST (default: its name in the current directory)
    /// once the command has ended (repeatable); keeps the outputs for the download (10
    /// minutes, or --keep-outputs).
    #[arg(long, value_name = "PATH[:DEST]", conflicts_with = "detach")]
    pub download: Vec<String>,
    /// Local address the --forward ports listen on.
    #[arg(long, value_name = "ADDR", default_value_t = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))]
    pub bind: std::net::IpAddr,
    /// Command and arguments (after `--`); without them the image's own entrypoint runs.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// How long outputs are kept by default for `--download` (enough to download them right
/// after the command ends, and again if that was interrupted).
pub const DOWNLOAD_KEEP_S: u32 = 600;

/// The output retention to ask for: `--keep-outputs`, else [`DOWNLOAD_KEEP_S`] with
/// `--download` (capped at what the offer keeps, `most`), else none.
pub fn keep_outputs_s(a: &RentArgs, most: u32) -> anyhow::Result<u32> {
    match a.keep_outputs {
        Some(m) => {
            let asked = m.saturating_mul(60);
            if asked > most {
                anyhow::bail!(
                    "--keep-outputs {m}: this provider keeps a finished lease's outputs for at most {} minute(s)",
                    most / 60
                );
            }
            Ok(asked)
        }
        None if !a.download.is_empty() => {
            if most == 0 {
                anyhow::bail!(
                    "--download: this provider removes a lease's outputs when it ends; copy them out while it runs (gridlease cp LEASE:/workspace/PATH DST), or pick an offer that keeps them (gridlease offer OFFER shows it)"
                );
            }
            Ok(DOWNLOAD_KEEP_S.min(most))
        }
        None => Ok(0),
    }
}

/// `SRC[:DEST]` as (SRC, DEST), DEST defaulting to SRC's last name (trailing `/` ignored;
/// `None` when SRC has none, e.g. `..`).
fn copy_spec(spec: &str) -> (&str, Option<String>) {
    match spec.split_once(':') {
        Some((src, dst)) if !dst.is_empty() => (src, Some(dst.to_string())),
        _ => {
            let src = spec.trim_end_matches(':');
            let name = std::path::Path::new(src.trim_end_matches('/'))
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            (src, name)
        }
    }
}

/// `--download PATH[:DEST]`: the path in the container and the local destination.
pub fn download_spec(spec: &str) -> (String, std::path::PathBuf) {
    let (src, dest) = copy_spec(spec);
    (src.to_string(), dest.unwrap_or_else(|| ".".into()).into())
}

/// `--upload SRC[:DEST]`: the local source and the path in `/workspace` (default: the
/// source's name).
pub fn upload_spec(spec: &str) -> anyhow::Result<(std::path::PathBuf, String)> {
    let (src, dest) = copy_spec(spec);
    if src.is_empty() {
        anyhow::bail!("--upload {spec:?}: the source is empty");
    }
    let dest = dest.ok_or_else(|| {
        anyhow::anyhow!("--upload {spec:?}: name the destination, e.g. {src}:data")
    })?;
    Ok((src.into(), dest))
}

/// The upload hold to ask for: all the offer holds (`most`) with `--upload` (the renter ends
/// it as soon as the uploads are done), else none.
pub fn upload_hold_s(a: &RentArgs, most: u32) -> anyhow::Result<u32> {
    if a.upload.is_empty() {
        return Ok(0);
    }
    if most == 0 {
        anyhow::bail!(
            "--upload: this provider starts a lease's command at once; copy data in once it runs (gridlease cp SRC LEASE:/workspace/PATH), or pick an offer that holds containers for uploads (gridlease offer OFFER shows it)"
        );
    }
    Ok(most)
}

/// Duration in seconds from the duration flags.
pub fn duration_s(a: &RentArgs) -> anyhow::Result<u32> {
    let secs: u64 = if let Some(h) = &a.hours {
        let micros = h
            .parse::<Money>()
            .map_err(|_| anyhow::anyhow!("--hours {h:?} is not a number of hours"))?
            .micros();
        micros.saturating_mul(3600) / 1_000_000
    } else if let Some(m) = a.minutes {
        u64::from(m) * 60
    } else {
        u64::from(a.seconds.unwrap_or(0))
    };
    if secs == 0 {
        anyhow::bail!("the lease duration must be at least one second");
    }
    u32::try_from(secs).map_err(|_| anyhow::anyhow!("the lease duration is too long"))
}

/// `--volume NAME:/PATH`.
fn parse_mount(s: &str) -> Result<crate::renter::VolumeMountRequest, String> {
    let Some((volume, path)) = s.split_once(':') else {
        return Err(format!("{s:?}: write NAME:/PATH, e.g. data:/data"));
    };
    if volume.is_empty() {
        return Err(format!("{s:?}: no volume name before the ':'"));
    }
    if let Some(problem) = gridlease_protocol::mount_path_problem(path) {
        return Err(format!("{path:?}: {problem}"));
    }
    Ok(crate::renter::VolumeMountRequest {
        volume: volume.to_string(),
        path: path.to_string(),
    })
}

/// `--prepay`: `all` (the whole lease) or a duration (`2h`, `90m`, `45s`, `1h30m`), in seconds.
pub fn parse_prepay(s: &str) -> Result<u32, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(gridlease_protocol::PREPAY_ALL);
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e}: give a duration such as 2h, 90m or 1h30m, or `all`"))?;
    let secs = u32::try_from(d.as_secs())
        .ok()
        .filter(|s| *s < gridlease_protocol::PREPAY_ALL)
        .ok_or("too long: use `all` for the whole lease")?;
    if secs == 0 {
        return Err("at least one second (leave --prepay out to pay as you go)".into());
    }
    Ok(secs)
}

/// The sentence shown before an unattended lease is rented: what the prepay risks at most.
fn prepay_note(
    prepay_s: u32,
    duration_s: u32,
    gpus: u16,
    price: Money,
    max_total: Option<Money>,
) -> anyhow::Result<String> {
    let budget = match max_total {
        Some(m) => m,
        None => gridlease_contracts::cost(u64::from(duration_s), gpus, price)?,
    };
    let whole = prepay_s >= duration_s;
    let ahead = if whole {
        budget
    } else {
        gridlease_contracts::cost(u64::from(prepay_s), gpus, price)?.min(budget)
    };
    let span = if whole {
        "the whole lease".to_string()
    } else {
        let d = std::time::Duration::from_secs(u64::from(prepay_s));
        format!("{} of use", humantime::format_duration(d))
    };
    Ok(format!(
        "prepaying {span}: up to {ahead} GLU is paid ahead of the provider's reports, so the \
         lease keeps running while this node is offline; what is not used is not owed"
    ))
}

/// Parses `K=V` pairs.
pub fn parse_env(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(anyhow::anyhow!("--env {p:?} is not KEY=VALUE")),
        })
        .collect()
}

/// `--upload`: copies each SRC into the held container's `/workspace` (the same copy as
/// `gridlease cp`: checksummed, resumable). The first failure ends it.
async fn upload_inputs(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    specs: &[String],
) -> anyhow::Result<()> {
    let view = api.lease(lease).await?;
    if view.is_terminal() {
        return Ok(());
    }
    if view.upload_until.is_none() {
        out.status(
            "warning: the provider started the command before the uploads (its hold ran out); uploading into the running container",
        );
    }
    for spec in specs {
        let (src, dest) = upload_spec(spec)?;
        let r = super::cp::upload(api, out, &src, lease, &dest)
            .await
            .with_context(|| format!("upload of {} failed", src.display()))?;
        out.line(&format!(
            "uploaded {} -> /workspace/{dest}: {} file(s), {:.1} MiB",
            src.display(),
            r.files,
            r.bytes as f64 / 1048576.0
        ));
    }
    Ok(())
}

/// How a lease is billed, in words: `billed per second, at least 60 s`.
pub fn billing_text(min_billed_s: u32) -> String {
    if min_billed_s > 0 {
        format!("billed per second, at least {min_billed_s} s")
    } else {
        "billed per second".into()
    }
}

/// Whether a finished lease paid its minimum billed time rather than its run time: it ran less
/// than the minimum and paid more than those seconds cost.
pub fn minimum_applied(view: &LeaseView) -> bool {
    let wall_s = view.usage.as_ref().map_or(0, |u| u.wall_ms) / 1000;
    let paid = view.paid;
    let ran_cost = gridlease_contracts::cost(
        wall_s,
        view.gpus,
        Money::from_micros(view.price_per_gpu_hour),
    );
    wall_s < u64::from(view.min_billed_s) && ran_cost.is_ok_and(|c| paid > c.micros())
}

/// A close reason that needs saying in words, as a sentence.
pub fn reason_sentence(reason: Option<&str>) -> Option<&'static str> {
    match reason? {
        "owner_reclaimed" => Some(
            "the provider's owner took the GPU back (the offer is interruptible): the lease was stopped and billed to the second it stopped",
        ),
        _ => None,
    }
}

/// Prints the bill of a finished lease.
pub fn print_bill(out: &Printer, view: &LeaseView) {
    let wall_s = view.usage.as_ref().map_or(0, |u| u.wall_ms) / 1000;
    let minimum = if minimum_applied(view) {
        format!("; minimum billing of {} s applied", view.min_billed_s)
    } else {
        String::new()
    };
    out.line(&format!(
        "lease {} {}: ran {} s on {} GPU(s) at {} {UNIT}/GPU-hour; paid {} {UNIT}{}{}",
        short(&view.lease_id.to_string()),
        view.state.as_str(),
        wall_s,
        view.gpus,
        money(view.price_per_gpu_hour),
        money(view.paid),
        minimum,
        view.close_reason
            .as_ref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
    ));
    if let Some(f) = &view.failure {
        out.line(&format!("the provider could not start it: {}", f.message));
    }
    if let Some(s) = reason_sentence(view.close_reason.as_deref()) {
        out.line(s);
    }
}

/// Rents, then follows unless detached.
pub async fn run(api: &ApiClient, out: &Printer, args: &RentArgs) -> anyhow::Result<u8> {
    for spec in &args.upload {
        let (src, _) = upload_spec(spec)?;
        if !src.exists() {
            anyhow::bail!("--upload {spec:?}: {} does not exist", src.display());
        }
    }
    let offer: Option<crate::api::types::OfferDetail> = if args.keep_outputs.is_some()
        || !args.download.is_empty()
        || !args.upload.is_empty()
        || args.prepay.is_some()
    {
        Some(
            api.get(&format!(
                "/v1/offers/{}",
                super::search::urlencode(&args.offer)
            ))
            .await?,
        )
    } else {
        None
    };
    let (keep_outputs_s, upload_hold_s) = match &offer {
        Some(o) => (
            keep_outputs_s(args, o.output_retention_s)?,
            upload_hold_s(args, o.upload_hold_s)?,
        ),
        None => (0, 0),
    };
    let body = RentRequest {
        volumes: args.volumes.clone(),
        mounts: Vec::new(),
        volume: None,
        offer: args.offer.clone(),
        gpus: args.gpus,
        duration_s: duration_s(args)?,
        image: args.image.clone(),
        command: args.command.clone(),
        env: parse_env(&args.env)?,
        max_total: args.max_total,
        network: args.network.into(),
        keep_outputs_s,
        upload_hold_s,
        prepay_s: args.prepay.unwrap_or(0),
        verify: !args.no_verify,
    };
    if let (Some(prepay_s), Some(o)) = (args.prepay, &offer) {
        let price = o
            .price_per_gpu_hour
            .parse::<Money>()
            .map_err(|e| anyhow::anyhow!("the offer's price {:?}: {e}", o.price_per_gpu_hour))?;
        out.note(&prepay_note(
            prepay_s,
            body.duration_s,
            body.gpus,
            price,
            body.max_total,
        )?);
    }
    if args.detach {
        let rented = api.rent(&body).await?;
        if let Some(note) = &rented.note {
            out.note(note);
        }
        if body.prepay_s > 0
            && let Some(code) = await_prepaid(api, out, &rented.lease_id).await?
        {
            return Ok(code);
        }
        out.emit(&rented, |p| p.line(&rented.lease_id));
        return Ok(0);
    }
    let mut fg = Foreground {
        api,
        out,
        ctrl_c: Interrupts::install()?,
        lease: None,
        stopping: false,
        stop_taken: false,
    };
    match foreground(&mut fg, &body, args).await {
        Ok(code) => Ok(code),
        Err(Leave::Error(e)) => Err(e),
        Err(Leave::Detach) => {
            fg.detached();
            Ok(EXIT_INTERRUPTED)
        }
    }
}

/// Negotiates, follows the output, waits for the settlement, prints the bill; Ctrl-C on the
/// way is handled by [`Foreground::drive`].
async fn foreground(
    fg: &mut Foreground<'_>,
    body: &RentRequest,
    args: &RentArgs,
) -> Result<u8, Leave> {
    let (api, out) = (fg.api, fg.out);
    let rented = fg.drive(api.rent(body)).await??;
    if let Some(note) = &rented.note {
        out.note(note);
    }
    out.line(&format!(
        "lease {} accepted; following its output ({})",
        rented.lease_id,
        billing_text(rented.min_billed_s)
    ));
    fg.accepted(&rented.lease_id).await?;
    // Listening from now on; connections reach the container once it runs (before, the
    // provider refuses them: not running yet).
    let mut forwards = Vec::new();
    for spec in &args.forward {
        let f = super::access::start_forward(api, &rented.lease_id, args.bind, *spec).await?;
        out.note(&format!(
            "forwarding {} -> port {} of the container while the lease runs",
            f.local, f.remote
        ));
        forwards.push(f);
    }
    let uploads = !args.upload.is_empty();
    fg.drive(show_pull(api, out, &rented.lease_id, uploads))
        .await??;
    if let Some(code) = fg.drive(show_check(api, out, &rented.lease_id)).await?? {
        return Ok(code);
    }
    if uploads {
        match fg
            .drive(upload_inputs(api, out, &rented.lease_id, &args.upload))
            .await?
        {
            Ok(()) if !fg.stopping => {
                api.begin(&rented.lease_id).await.with_context(|| {
                    format!(
                        "uploads done, but the provider could not be told to start; it starts the command when its hold runs out ({})",
                        command_line(api, &format!("logs -f {}", rented.lease_id))
                    )
                })?;
                out.note("uploads done; the command starts now");
            }
            Ok(()) => {}
            // Ctrl-C stopped the lease meanwhile: its end and bill follow.
            Err(e) if fg.stopping => tracing::debug!(error = %e, "upload ended by the stop"),
            Err(e) => {
                let stopped = api.stop(&rented.lease_id).await.is_ok();
                return Err(Leave::Error(e.context(if stopped {
                    "the lease was stopped before its command ran"
                } else {
                    "the lease could not be stopped; stop it with `gridlease stop`"
                })));
            }
        }
    }
    let exit = fg
        .drive(follow_logs(api, out, &rented.lease_id, 0, true))
        .await??;
    let view = fg
        .drive(wait_terminal(
            api,
            &rented.lease_id,
            Duration::from_secs(60),
        ))
        .await??;
    drop(forwards);
    out.emit(&view, |p| print_bill(p, &view));
    if fg.stopping {
        if view.outputs_until.is_some() {
            out.note(&format!(
                "outputs kept for {} minute(s): gridlease cp {}:/workspace/PATH DST",
                view.outputs_until
                    .unwrap_or(0)
                    .saturating_sub(crate::clock::now().0)
                    / 60_000,
                short(&view.lease_id.to_string())
            ));
        }
        return Ok(EXIT_INTERRUPTED);
    }
    let code = exit_status(&view, exit);
    if view.failure.is_some() {
        return Ok(code);
    }
    let downloaded = fg
        .drive(download_outputs(api, out, &view, &args.download))
        .await??;
    if !downloaded && code == 0 {
        return Ok(1);
    }
    Ok(code)
}

/// The exit status of a command that followed a finished lease (`rent`, `logs -f`): the
/// container's exit code (`exit`, from the end of its output, or else the view's), 5 when the
/// provider could not start it ([`EXIT_START_FAILED`]), 1 when it ended without one.
pub fn exit_status(view: &LeaseView, exit: Option<i32>) -> u8 {
    if view.failure.is_some() {
        return EXIT_START_FAILED;
    }
    exit.or(view.exit_code)
        .map_or(1, |c| u8::try_from(c.clamp(0, 255)).unwrap_or(1))
}

/// `--download`: copies each PATH out of the finished lease's kept `/workspace` (the same
/// copy as `gridlease cp`: checksummed, resumable). False if any failed (each one is said).
async fn download_outputs(
    api: &ApiClient,
    out: &Printer,
    view: &LeaseView,
    specs: &[String],
) -> anyhow::Result<bool> {
    if specs.is_empty() {
        return Ok(true);
    }
    let lease = view.lease_id.to_string();
    if view.outputs_until.is_none() {
        out.status(&format!(
            "error: nothing to download: the provider did not keep lease {}'s outputs (it did not run)",
            short(&lease)
        ));
        return Ok(false);
    }
    let mut ok = true;
    for spec in specs {
        let (src, dst) = download_spec(spec);
        match super::cp::download(api, out, &lease, &src, &dst, None).await {
            Ok(r) => out.line(&format!(
                "downloaded {src} -> {}: {} file(s), {:.1} MiB{}",
                dst.display(),
                r.files,
                r.bytes as f64 / 1048576.0,
                if r.left_out.is_empty() {
                    String::new()
                } else {
                    format!("; {} entries left out (named above)", r.left_out.len())
                }
            )),
            Err(e) => {
                ok = false;
                out.status(&format!(
                    "error: download of {src} failed: {e:#}; retry with gridlease cp {}:{src} {} (outputs kept for a while)",
                    short(&lease),
                    dst.display()
                ));
            }
        }
    }
    Ok(ok)
}

/// Why a foreground `rent` ends before the bill.
enum Leave {
    /// A second Ctrl-C: leave the lease to itself.
    Detach,
    /// A failure, reported as usual.
    Error(anyhow::Error),
}

impl From<anyhow::Error> for Leave {
    fn from(e: anyhow::Error) -> Self {
        Self::Error(e)
    }
}

impl From<ClientError> for Leave {
    fn from(e: ClientError) -> Self {
        Self::Error(e.into())
    }
}

/// SIGINT as a stream, installed once for the whole command: while it exists Ctrl-C no longer
/// ends the process, and a second Ctrl-C that comes while the first is being handled is kept
/// rather than lost (a fresh `tokio::signal::ctrl_c()` per wait would miss one that arrives
/// between two waits). The CLI talks to the node over a Unix socket, so it is Unix-only anyway.
struct Interrupts(Signal);

impl Interrupts {
    fn install() -> anyhow::Result<Self> {
        let sigint =
            tokio::signal::unix::signal(SignalKind::interrupt()).context("cannot handle Ctrl-C")?;
        Ok(Self(sigint))
    }

    /// Runs `fut` to its end, or until Ctrl-C (`None`; a pinned `fut` can be resumed).
    async fn unless<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            Some(()) = self.0.recv() => None,
            r = fut => Some(r),
        }
    }
}

/// A foreground `rent`: the lease once accepted, and what Ctrl-C has done so far.
struct Foreground<'a> {
    api: &'a ApiClient,
    out: &'a Printer,
    ctrl_c: Interrupts,
    /// The lease id, once the provider accepted.
    lease: Option<String>,
    /// The first Ctrl-C came: the lease is being stopped (or will be, once accepted).
    stopping: bool,
    /// The node answered the stop request.
    stop_taken: bool,
}

impl Foreground<'_> {
    /// Runs `fut` to its end; a first Ctrl-C on the way stops the lease and lets `fut` go on, a
    /// second one leaves ([`Leave::Detach`]).
    async fn drive<F: Future>(&mut self, fut: F) -> Result<F::Output, Leave> {
        tokio::pin!(fut);
        loop {
            if let Some(r) = self.ctrl_c.unless(fut.as_mut()).await {
                return Ok(r);
            }
            if self.stopping {
                return Err(Leave::Detach);
            }
            self.stopping = true;
            match self.lease.clone() {
                Some(id) => self.stop(&id).await?,
                None => self.out.status(
                    "Ctrl-C: the lease will be stopped as soon as the provider accepts it \
                     (Ctrl-C again to leave it)",
                ),
            }
        }
    }

    /// The provider accepted: a Ctrl-C during the negotiation stops the lease now.
    async fn accepted(&mut self, id: &str) -> Result<(), Leave> {
        self.lease = Some(id.to_string());
        if self.stopping {
            self.stop(id).await?;
        }
        Ok(())
    }

    /// Asks the node to stop the lease (a second Ctrl-C while it answers detaches).
    async fn stop(&mut self, id: &str) -> Result<(), Leave> {
        self.out.status(&format!(
            "Ctrl-C: stopping lease {id}… (Ctrl-C again to detach)"
        ));
        let api = self.api;
        match self.ctrl_c.unless(api.stop(id)).await {
            None => Err(Leave::Detach),
            Some(r) => {
                r.with_context(|| format!("cannot stop lease {id}"))?;
                self.stop_taken = true;
                Ok(())
            }
        }
    }

    /// Says what a second Ctrl-C left behind, and how to go on.
    fn detached(&self) {
        let again = |args: &str| command_line(self.api, args);
        let text = match &self.lease {
            Some(id) => format!(
                "Ctrl-C again: detached; lease {id} {}\n  follow it: {}\n  stop it:   {}",
                if self.stop_taken {
                    "goes on stopping on its own"
                } else {
                    "may still run (the node had not answered the stop yet)"
                },
                again(&format!("logs -f {id}")),
                again(&format!("stop {id}")),
            ),
            None => format!(
                "Ctrl-C again: left before the provider answered; if it accepts, {} shows the \
                 lease and {} ends it",
                again("leases"),
                again("stop LEASE"),
            ),
        };
        self.out.status(&text);
    }
}

/// `gridlease ARGS` as the user would type it for this client's home (`--home` only when it
/// is not the default one).
fn command_line(api: &ApiClient, args: &str) -> String {
    let home = api.home();
    if home == crate::home::default_home() {
        return format!("gridlease {args}");
    }
    let text = home.display().to_string();
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-~+=,:@".contains(&b));
    if plain {
        format!("gridlease --home {text} {args}")
    } else {
        format!("gridlease --home '{}' {args}", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn prepay_is_a_duration_or_all_and_its_risk_is_said_in_glu() {
        assert_eq!(parse_prepay("all"), Ok(gridlease_protocol::PREPAY_ALL));
        assert_eq!(parse_prepay("2h"), Ok(7200));
        assert_eq!(parse_prepay("1h30m"), Ok(5400));
        assert!(
            parse_prepay("0s")
                .unwrap_err()
                .contains("at least one second")
        );
        assert!(parse_prepay("soon").unwrap_err().contains("2h, 90m"));
        let price = Money::from_micros(3_600_000); // 3.60 GLU per GPU-hour
        // 10 minutes of a 1 h lease on 2 GPUs: 1.2 GLU at risk.
        let note = prepay_note(600, 3600, 2, price, None).unwrap();
        assert!(
            note.starts_with("prepaying 10m of use: up to 1.20 GLU"),
            "{note}"
        );
        // All: the budget, capped by --max-total.
        let note = prepay_note(gridlease_protocol::PREPAY_ALL, 3600, 1, price, None).unwrap();
        assert!(
            note.starts_with("prepaying the whole lease: up to 3.60 GLU"),
            "{note}"
        );
        let cap = Some(Money::from_micros(500_000));
        let note = prepay_note(7200, 3600, 1, price, cap).unwrap();
        assert!(note.contains("up to 0.50 GLU"), "{note}");
    }

    #[test]
    fn copy_specs_default_to_the_sources_last_name() {
        assert_eq!(download_spec("out/sub/"), ("out/sub/".into(), "sub".into()));
        assert_eq!(download_spec("out:got"), ("out".into(), "got".into()));
        assert_eq!(download_spec(".."), ("..".into(), ".".into()));
        assert_eq!(
            upload_spec("./data").unwrap(),
            ("./data".into(), "data".to_string())
        );
        assert_eq!(
            upload_spec("a/b:c/d").unwrap(),
            ("a/b".into(), "c/d".to_string())
        );
        assert!(upload_spec("..").is_err(), "no name to default to");
        assert!(upload_spec(":x").is_err(), "no source");
    }

    #[test]
    fn hints_name_the_home_when_it_is_not_the_default() {
        let default = ApiClient::new(&crate::home::default_home());
        assert_eq!(command_line(&default, "stop X"), "gridlease stop X");
        let plain = ApiClient::new(Path::new("/srv/grid-1/home"));
        assert_eq!(
            command_line(&plain, "logs -f X"),
            "gridlease --home /srv/grid-1/home logs -f X"
        );
        let odd = ApiClient::new(Path::new("/tmp/it's here"));
        assert_eq!(
            command_line(&odd, "stop X"),
            r"gridlease --home '/tmp/it'\''s here' stop X"
        );
    }
}
