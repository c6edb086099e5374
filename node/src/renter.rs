//! The renter's side: the rent request ([`RentRequest`]) and turning it and an offer from the
//! book into proposed terms ([`terms_for`]). Nothing here depends on the lease service, which
//! takes the request ([`crate::lease::LeaseService::rent`]).

use std::collections::BTreeMap;

use gridlease_contracts::book::BookEntry;
use gridlease_contracts::{Money, MoneyError};
use gridlease_protocol::{LeaseTerms, NetworkId, NetworkPolicy, PublicKey, Timestamp};

/// The terms for `req` on the offer in `entry`: the offer's ask price and settings, the
/// network `req` asks for (the provider refuses one its offer does not allow), the
/// renter's grace (at least one usage interval) and `nonce`, and the budget cap asked for or,
/// by default, the cost of the whole duration (or of the minimum billed time, if longer).
/// Fails only when that cost overflows. No on-chain settlement: the lease service adds it
/// where both sides settle on the same chain ([`crate::lease::LeaseService::settlement_for`]).
pub fn terms_for(
    network: &NetworkId,
    entry: &BookEntry,
    renter: PublicKey,
    req: &RentRequest,
    grace_s: u32,
    nonce: u64,
    now: Timestamp,
) -> Result<LeaseTerms, MoneyError> {
    let o = &entry.offer;
    if let Some(v) = &req.volume {
        return volume_terms_for(network, entry, renter, req, v, grace_s, nonce, now);
    }
    let max_total = match req.max_total {
        Some(m) => m,
        None => gridlease_contracts::default_budget(
            req.duration_s,
            o.min_billed_s,
            req.gpus,
            Money::from_micros(o.price_per_gpu_hour),
        )?,
    };
    Ok(LeaseTerms {
        volume: None,
        mounts: req
            .mounts
            .iter()
            .map(|m| gridlease_protocol::VolumeMount {
                volume: m.volume,
                path: m.path.clone(),
            })
            .collect(),
        network: network.clone(),
        offer_id: entry.id,
        offer_seq: o.seq,
        provider: o.provider,
        renter,
        gpu_count: req.gpus,
        per_gpu: o.per_gpu,
        price_per_gpu_hour: o.price_per_gpu_hour,
        duration_s: req.duration_s,
        min_billed_s: o.min_billed_s,
        usage_interval_s: o.usage_interval_s,
        pay_ahead_s: o.pay_ahead_s,
        grace_s: grace_s.max(o.usage_interval_s),
        max_total: max_total.micros(),
        network_policy: req.network,
        image: req.image.clone(),
        command: req.command.clone(),
        env: req.env.clone(),
        nonce,
        created_at: now,
        output_retention_s: req.keep_outputs_s.min(o.sandbox.output_retention_s),
        upload_hold_s: req.upload_hold_s.min(o.sandbox.upload_hold_s),
        prepay_s: req.prepay_s,
        verify_window_s: if req.verify && o.proof.backend.is_some() {
            o.proof.window_s
        } else {
            0
        },
        settlement: None,
    })
}

/// The terms of a volume lease (issue 47) for `req` on the offer in `entry`: the offer's
/// volume price, `req.duration_s` as the keep period, no minimum billing, and by default a
/// budget of the whole keep period.
#[allow(clippy::too_many_arguments)]
fn volume_terms_for(
    network: &NetworkId,
    entry: &BookEntry,
    renter: PublicKey,
    req: &RentRequest,
    v: &VolumeRequest,
    grace_s: u32,
    nonce: u64,
    now: Timestamp,
) -> Result<LeaseTerms, MoneyError> {
    let o = &entry.offer;
    let price = o.sandbox.volumes.price_per_gib_hour;
    let max_total = match req.max_total {
        Some(m) => m,
        None => gridlease_contracts::volume::keep_cost(v.size_gib, req.duration_s, price)?,
    };
    Ok(LeaseTerms {
        volume: Some(gridlease_protocol::VolumeTerms {
            name: v.name.clone(),
            size_gib: v.size_gib,
            price_per_gib_hour: price,
            adopts: v.adopts,
        }),
        mounts: Vec::new(),
        network: network.clone(),
        offer_id: entry.id,
        offer_seq: o.seq,
        provider: o.provider,
        renter,
        gpu_count: 0,
        per_gpu: gridlease_protocol::ResourcesPerGpu::default(),
        price_per_gpu_hour: 0,
        duration_s: req.duration_s,
        min_billed_s: 0,
        usage_interval_s: o.usage_interval_s,
        pay_ahead_s: o.pay_ahead_s,
        grace_s: grace_s.max(o.usage_interval_s),
        max_total: max_total.micros(),
        network_policy: NetworkPolicy::None,
        image: String::new(),
        command: Vec::new(),
        env: BTreeMap::new(),
        nonce,
        created_at: now,
        output_retention_s: 0,
        upload_hold_s: 0,
        prepay_s: req.prepay_s,
        verify_window_s: 0,
        settlement: None,
    })
}

/// A volume to make (issue 47): `POST /v1/volumes` (and `POST /v1/leases/{id}/keep-disk`)
/// turn their body into a [`RentRequest`] with this set, the keep period as `duration_s`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRequest {
    /// The renter's name for it (1-64 of a-z, 0-9, `-`, `_`, `.`).
    pub name: String,
    /// Size, GiB.
    pub size_gib: u32,
    /// The renter's running lease on the same provider whose `/workspace` becomes the volume
    /// (`stop --keep-disk`); `None`: a new, empty one.
    pub adopts: Option<gridlease_protocol::LeaseId>,
}

/// A volume to mount, as a renter names it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct VolumeMountRequest {
    /// The volume's name, or its volume lease's id (or a unique prefix of it).
    pub volume: String,
    /// Where the container sees it (absolute, e.g. `/data`; `/workspace` replaces the lease's
    /// own workspace).
    pub path: String,
}

/// A volume to mount into the lease, as the lease service takes it: the volume lease's
/// whole id (the control API resolves names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The volume lease.
    pub volume: gridlease_protocol::LeaseId,
    /// Where the container sees it.
    pub path: String,
}

/// The offer's dialable addresses that parse.
pub fn offer_addrs(entry: &BookEntry) -> Vec<libp2p::Multiaddr> {
    entry
        .offer
        .addrs
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// What a renter asks for: the one rent request, built by the CLI and sent as the body of
/// `POST /v1/leases`. The node fills in the rest of the terms from the offer (`terms_for`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct RentRequest {
    /// Offer id (64 hex digits), or a unique prefix of it as `gridlease search` shows: the
    /// control API resolves a prefix; the lease service takes only the whole id.
    pub offer: String,
    /// GPUs wanted.
    pub gpus: u16,
    /// Seconds.
    pub duration_s: u32,
    /// Container image.
    pub image: String,
    /// Command and arguments; empty runs the image's own entrypoint/cmd.
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Budget cap (a decimal amount in JSON, e.g. `"1.5"`); default: the cost of the whole
    /// duration (or of the minimum billed time, if longer).
    #[serde(default, with = "decimal")]
    #[schema(value_type = Option<String>)]
    pub max_total: Option<Money>,
    /// Network for the container: `"none"` (default) or `"egress"` (internet, not the
    /// provider's LAN or host; the offer must allow it, or the provider refuses the lease).
    #[serde(default = "no_network", with = "network_text")]
    #[schema(value_type = String)]
    pub network: NetworkPolicy,
    /// Seconds the provider should keep the finished lease's container and `/workspace` for
    /// downloads (`gridlease cp`, `rent --download`); at most the offer's
    /// `output_retention_s`. 0 (default): removed when the lease ends.
    #[serde(default)]
    pub keep_outputs_s: u32,
    /// Seconds the provider should hold the created container before starting the command,
    /// for the renter's uploads into `/workspace` (`rent --upload`); at most the offer's
    /// `upload_hold_s`. The renter ends the hold sooner with `POST /v1/leases/{id}/begin`.
    /// 0 (default): started at once.
    #[serde(default)]
    pub upload_hold_s: u32,
    /// Seconds of use to pay ahead of the provider's reports, so the lease keeps running while
    /// this node is offline (an unattended lease; `rent --prepay`): each receipt pays what is
    /// due plus this much, capped at the budget. 0 (default): in arrears, and the provider
    /// stops the lease when this node is silent past the grace period. 4294967295 (`all`):
    /// the whole budget at the first report.
    #[serde(default)]
    pub prepay_s: u32,
    /// Run the GPU check at the start, in the provider's unbilled verification window
    /// (`docs/gpu.md`; default true; nothing to check with an offer that has no window).
    /// `false` (`rent --no-verify`): no check; the statement says none was asked.
    #[serde(default = "yes")]
    pub verify: bool,
    /// The renter's volumes on the offer's provider to mount (issue 47; `rent --volume
    /// NAME:/PATH`): each by name or volume lease id (or a unique prefix of one), and the path
    /// the container sees it at; `/workspace` puts it in place of the lease's own.
    #[serde(default)]
    pub volumes: Vec<VolumeMountRequest>,
    /// `volumes`, resolved by the control API to the volume leases' ids.
    #[serde(skip)]
    pub mounts: Vec<Mount>,
    /// Make a volume lease instead (set by `POST /v1/volumes`; `duration_s` is its keep
    /// period, and `gpus`, `image` and the container's settings are unused).
    #[serde(skip)]
    pub volume: Option<VolumeRequest>,
}

fn yes() -> bool {
    true
}

fn no_network() -> NetworkPolicy {
    NetworkPolicy::None
}

/// [`NetworkPolicy`] as the CLI and `provide` write it: `"none"` or `"egress"`.
mod network_text {
    use gridlease_protocol::NetworkPolicy;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(n: &NetworkPolicy, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match n {
            NetworkPolicy::None => "none",
            NetworkPolicy::Egress => "egress",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NetworkPolicy, D::Error> {
        match String::deserialize(d)?.as_str() {
            "none" => Ok(NetworkPolicy::None),
            "egress" => Ok(NetworkPolicy::Egress),
            other => Err(D::Error::custom(format!(
                "network {other:?} is not none or egress"
            ))),
        }
    }
}

/// `Option<Money>` as a decimal string (`"0.25"`), as people write amounts (also
/// [`crate::lease::ExtendRequest::max_total`]).
pub(crate) mod decimal {
    use gridlease_contracts::Money;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(crate) fn serialize<S: Serializer>(m: &Option<Money>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(m) => s.serialize_some(&m.to_string()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Money>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| {
                t.parse::<Money>()
                    .map_err(|e| D::Error::custom(format!("max_total {t:?}: {e}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rent_request_network_defaults_to_none_and_reads_lowercase_names() {
        let base = r#"{"offer":"x","gpus":1,"duration_s":60,"image":"i"}"#;
        let r: RentRequest = serde_json::from_str(base).unwrap();
        assert_eq!(r.network, NetworkPolicy::None);
        let with = |n: &str| base.replace('}', &format!(r#","network":"{n}"}}"#));
        let r: RentRequest = serde_json::from_str(&with("egress")).unwrap();
        assert_eq!(r.network, NetworkPolicy::Egress);
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["network"], "egress");
        let err = serde_json::from_str::<RentRequest>(&with("host")).unwrap_err();
        assert!(err.to_string().contains("not none or egress"), "{err}");
    }
}
