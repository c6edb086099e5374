//! `gridlease volume create|ls|cp|extend|rm`: storage kept on a provider beyond any lease
//! (issue 47, `docs/volumes.md`). A volume is a volume lease: `create` agrees one with the
//! offer's provider, `extend` lengthens its keep period, `rm` ends it (the provider deletes
//! the volume), `cp` copies files in and out with no lease running, and `rent --volume
//! NAME:/data` mounts it into a lease on that provider.

use clap::{Args, Subcommand};
use gridlease_contracts::Money;
use serde::Serialize;

use crate::api::client::ApiClient;
use crate::api::types::{ExtendRequest, Extended, RentedView, StoppingView};
use crate::lease::LeaseView;
use crate::output::{Printer, money, short};

/// Arguments of `gridlease volume`.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: VolumeAction,
}

/// `gridlease volume` actions.
#[derive(Debug, Subcommand)]
pub enum VolumeAction {
    /// Make a volume on a provider: `volume create NAME --offer OFFER --size 50GiB --keep 7d`.
    ///
    /// Agrees a volume lease at the offer's price per GiB-hour, prepaid for the whole keep
    /// period by default (`--prepay` for a window: then this node must stay online).
    Create(CreateArgs),
    /// This node's volumes: name, provider, size, state, paid, and when each is deleted.
    Ls,
    /// Copy files into or out of a volume, no lease needed: `volume cp ./data NAME:/` or
    /// `volume cp NAME:/out ./out` (PATH from the volume's root).
    Cp(CpArgs),
    /// Keep a volume longer: `volume extend NAME --keep 3d` (the provider must accept).
    Extend(ExtendArgs),
    /// Remove a volume now: its lease is settled and the provider deletes it.
    Rm(RmArgs),
}

/// Arguments of `volume create`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["offer", "provider"])))]
pub struct CreateArgs {
    /// Its name (a-z, 0-9, `-`, `_`, `.`), used by `rent --volume NAME:/PATH`.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// An offer of the provider to keep it (id, prefix or handle from `gridlease search`).
    #[arg(long, value_name = "OFFER")]
    pub offer: Option<String>,
    /// The provider, by peer id or key (its current offer's volume price is taken).
    #[arg(long, value_name = "PEER")]
    pub provider: Option<String>,
    /// Size (`50GiB`, `500GB`; whole GiB, rounded up).
    #[arg(long, value_name = "SIZE", value_parser = parse_gib)]
    pub size: u32,
    /// Keep period (`7d`, `12h`): the volume is deleted at its end unless extended.
    #[arg(long, value_name = "DURATION", value_parser = parse_keep)]
    pub keep: u32,
    /// Pay per window instead of for the whole keep period at once (`2h`, `all`): this node
    /// must come back within each window, or the provider deletes the volume.
    #[arg(long, value_name = "DURATION|all", value_parser = super::rent::parse_prepay)]
    pub prepay: Option<u32>,
    /// Budget cap (default: the cost of the whole keep period).
    #[arg(long, value_name = "AMOUNT", value_parser = super::parse_amount)]
    pub max_total: Option<Money>,
}

/// Arguments of `volume cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, or `NAME:PATH`.
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Destination: `NAME:PATH`, or a local path.
    #[arg(value_name = "DST")]
    pub dst: String,
}

/// Arguments of `volume extend`.
#[derive(Debug, Args)]
pub struct ExtendArgs {
    /// The volume (name or lease id).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Time to add to its keep period (`3d`, `12h`).
    #[arg(long, value_name = "DURATION", value_parser = parse_keep)]
    pub keep: u32,
}

/// Arguments of `volume rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// The volume (name or lease id).
    #[arg(value_name = "NAME")]
    pub name: String,
}

/// A size in whole GiB (rounded up).
fn parse_gib(s: &str) -> Result<u32, String> {
    let b = s
        .trim()
        .parse::<bytesize::ByteSize>()
        .map_err(|_| format!("{s:?} is not a size: write e.g. 50GiB or 500GB"))?
        .as_u64();
    let gib = b.div_ceil(1 << 30);
    match u32::try_from(gib) {
        Ok(g) if (1..=gridlease_protocol::MAX_VOLUME_GIB).contains(&g) => Ok(g),
        _ => Err(format!(
            "{s}: a volume is 1 GiB to {} GiB",
            gridlease_protocol::MAX_VOLUME_GIB
        )),
    }
}

/// A keep period in seconds.
pub(super) fn parse_keep(s: &str) -> Result<u32, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e}: give a duration such as 7d, 12h or 90m"))?;
    match u32::try_from(d.as_secs()) {
        Ok(0) => Err("at least one second".into()),
        Ok(secs) => Ok(secs),
        Err(_) => Err("too long".into()),
    }
}

/// What prepaying a whole keep period risks, said when a volume is made that way.
pub(super) const PREPAY_NOTE: &str = "note: prepaid in full, your receipts authorise the whole keep period at once: a provider that deletes the volume early could claim what they authorise (docs/billing.md); --prepay 1h pays an hour at a time instead, and needs this node online";

/// Body of `POST /v1/volumes`.
#[derive(Debug, Serialize)]
struct CreateBody<'a> {
    name: &'a str,
    size_gib: u32,
    keep_s: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    offer: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<&'a str>,
    prepay_s: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_total: Option<String>,
}

/// The volume a name or id names, among this node's (renting) volumes.
async fn find(api: &ApiClient, name: &str) -> anyhow::Result<LeaseView> {
    let all: Vec<LeaseView> = api.get("/v1/volumes").await?;
    let live = |v: &&LeaseView| !v.state.is_terminal() && v.role == crate::store::Role::Renter;
    let hits: Vec<&LeaseView> = all
        .iter()
        .filter(live)
        .filter(|v| {
            v.volume.as_ref().is_some_and(|x| x.name == name)
                || (name.len() >= 4 && v.lease_id.to_string().starts_with(name))
        })
        .collect();
    match hits.as_slice() {
        [one] => Ok((*one).clone()),
        [] => anyhow::bail!("no live volume {name:?} on this node (`gridlease volume ls`)"),
        _ => anyhow::bail!("{name:?} names {} volumes: give its lease id", hits.len()),
    }
}

/// `NAME:PATH` as `cp` takes it (`LEASE:/workspace/PATH`: a volume's root is where a lease's
/// workspace root is), or the local path unchanged.
async fn cp_location(api: &ApiClient, loc: &str) -> anyhow::Result<(String, bool)> {
    let Some((name, path)) = loc.split_once(':') else {
        return Ok((loc.to_string(), false));
    };
    if name.is_empty() || name.contains('/') {
        return Ok((loc.to_string(), false));
    }
    let v = find(api, name).await?;
    let path = path.trim_start_matches('/');
    Ok((format!("{}:/workspace/{path}", v.lease_id), true))
}

/// Runs `gridlease volume ...`.
pub async fn run(api: &ApiClient, out: &Printer, args: &VolumeArgs) -> anyhow::Result<u8> {
    match &args.action {
        VolumeAction::Create(a) => {
            let body = CreateBody {
                name: &a.name,
                size_gib: a.size,
                keep_s: a.keep,
                offer: a.offer.as_deref(),
                provider: a.provider.as_deref(),
                prepay_s: a.prepay.unwrap_or(gridlease_protocol::PREPAY_ALL),
                max_total: a.max_total.map(|m| m.to_string()),
            };
            let made: RentedView = api.post("/v1/volumes", &body).await?;
            let v: LeaseView = api.lease(&made.lease_id).await?;
            out.emit(&v, |p| {
                p.line(&format!(
                    "volume {} ({} GiB) agreed with {} for {}: lease {}, budget {}{}",
                    a.name,
                    a.size,
                    short(&v.counterparty),
                    humantime::format_duration(std::time::Duration::from_secs(u64::from(a.keep))),
                    short(&made.lease_id),
                    money(v.max_total),
                    if v.prepay_s == gridlease_protocol::PREPAY_ALL {
                        ", prepaid in full"
                    } else {
                        ""
                    }
                ));
                if v.prepay_s == gridlease_protocol::PREPAY_ALL {
                    p.line(PREPAY_NOTE);
                }
                p.line(&format!(
                    "mount it: gridlease rent {} --volume {}:/data ...",
                    a.offer.as_deref().unwrap_or("OFFER"),
                    a.name
                ));
            });
            Ok(0)
        }
        VolumeAction::Ls => {
            let all: Vec<LeaseView> = api.get("/v1/volumes").await?;
            out.emit(&all, |p| {
                if all.is_empty() {
                    p.line("no volumes");
                    return;
                }
                let rows = all
                    .iter()
                    .map(|v| {
                        let vol = v.volume.as_ref();
                        vec![
                            vol.map_or_else(String::new, |x| x.name.clone()),
                            short(&v.lease_id.to_string()),
                            format!("{:?}", v.role).to_lowercase(),
                            short(&v.counterparty),
                            vol.map_or_else(String::new, |x| format!("{} GiB", x.size_gib)),
                            v.state.as_str().to_string(),
                            money(v.cost_so_far),
                            money(v.authorised),
                            match (v.state.is_terminal(), v.time_left_s) {
                                (true, _) => "deleted".to_string(),
                                (false, Some(s)) => format!(
                                    "in {}",
                                    humantime::format_duration(std::time::Duration::from_secs(s))
                                ),
                                (false, None) => "-".to_string(),
                            },
                        ]
                    })
                    .collect();
                p.table(
                    &[
                        "name", "lease", "role", "peer", "size", "state", "cost", "paid", "deleted",
                    ],
                    rows,
                    &[3, 2, 7],
                    false,
                );
            });
            Ok(0)
        }
        VolumeAction::Cp(a) => {
            let (src, src_vol) = cp_location(api, &a.src).await?;
            let (dst, dst_vol) = cp_location(api, &a.dst).await?;
            if src_vol == dst_vol {
                anyhow::bail!(
                    "name one side as a volume (NAME:PATH) and the other as a local path"
                );
            }
            let cp = super::cp::CpArgs {
                src,
                dst,
                max_size: None,
            };
            super::cp::run(api, out, &cp).await
        }
        VolumeAction::Extend(a) => {
            let v = find(api, &a.name).await?;
            let body = ExtendRequest {
                minutes: None,
                seconds: Some(a.keep),
                max_total: None,
            };
            let x: Extended = api.extend(&v.lease_id.to_string(), &body).await?;
            out.emit(&x, |p| {
                p.line(&format!(
                    "volume {} kept until {} (in {}), budget cap {}",
                    a.name,
                    super::extend::deadline_text(x.deadline_ms),
                    humantime::format_duration(std::time::Duration::from_secs(x.time_left_s)),
                    money(x.max_total),
                ));
            });
            Ok(0)
        }
        VolumeAction::Rm(a) => {
            let stopping: StoppingView = api.delete(&format!("/v1/volumes/{}", a.name)).await?;
            out.emit(&stopping, |p| {
                p.line(&format!(
                    "volume {} removed (lease {} ends and settles; the provider deletes it)",
                    a.name,
                    short(&stopping.lease_id)
                ));
            });
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_keep_periods_read_as_people_write_them() {
        assert_eq!(parse_gib("50GiB"), Ok(50));
        assert_eq!(parse_gib("1GB"), Ok(1));
        assert_eq!(parse_gib("1.5GiB"), Ok(2));
        assert!(parse_gib("0").is_err());
        assert!(parse_gib("100TiB").is_err());
        assert!(parse_gib("lots").is_err());
        assert_eq!(parse_keep("7d"), Ok(7 * 86_400));
        assert_eq!(parse_keep("90m"), Ok(5_400));
        assert!(parse_keep("0s").is_err());
        assert!(parse_keep("soon").is_err());
    }
}
