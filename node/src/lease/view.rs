//! Read models of the control API: [`LeaseView`] and [`Ledger`], amounts in micro-units. The
//! daemon serializes them and the CLI deserializes the same structs, so a field or state name
//! is written once (`docs/api.md` documents the JSON; its names are stable for scripts).

use std::collections::BTreeMap;

use gridlease_contracts::{Lease, LeaseState, Tariff};
use gridlease_protocol::{LeaseId, PaymentReceipt, PublicKey, Signed, Timestamp, UsageReport};
use serde::{Deserialize, Serialize};

use crate::store::lease::{LedgerRow, SessionRecord};
use crate::store::{Role, StoredLease};

/// Metered usage as last reported (cumulative meters, interval peaks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageView {
    /// Report sequence.
    pub seq: u64,
    /// Wall seconds the container has run (cumulative, whole seconds billed).
    pub wall_ms: u64,
    /// Mean GPU utilization over the last interval, per mille; `null` when the lease's GPUs
    /// are declared (`gpus_declared`: nothing measures them).
    pub gpu_util_permille: Option<u16>,
    /// Peak VRAM in the last interval, MiB; `null` when the GPUs are declared.
    pub vram_peak_mib: Option<u32>,
    /// CPU milliseconds, cumulative.
    pub cpu_ms: u64,
    /// Peak memory in the last interval, MiB.
    pub mem_peak_mib: u32,
    /// Bytes the container received over its network, cumulative (0 without network).
    #[serde(default)]
    pub net_rx_bytes: u64,
    /// Bytes the container sent over its network, cumulative.
    #[serde(default)]
    pub net_tx_bytes: u64,
}

impl From<&UsageReport> for UsageView {
    fn from(u: &UsageReport) -> Self {
        Self {
            seq: u.seq,
            wall_ms: u.wall_ms,
            gpu_util_permille: Some(u.gpu_util_permille),
            vram_peak_mib: Some(u.vram_peak_mib),
            cpu_ms: u.cpu_ms,
            mem_peak_mib: u.mem_peak_mib,
            net_rx_bytes: u.net_rx_bytes,
            net_tx_bytes: u.net_tx_bytes,
        }
    }
}

/// A lease as the control API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseView {
    /// The lease id (64 hex digits in JSON).
    #[serde(serialize_with = "ser_display", deserialize_with = "de_from_str")]
    #[schema(value_type = String)]
    pub lease_id: LeaseId,
    /// This node's side: `renter` or `provider`.
    pub role: Role,
    /// Lease state: `proposed`, `accepted`, `starting`, `running`, `closing`, `settled`,
    /// `rejected` or `failed`.
    pub state: LeaseState,
    /// The other party's peer id.
    pub counterparty: String,
    /// GPUs leased.
    pub gpus: u16,
    /// Price per GPU-hour, micro-units.
    pub price_per_gpu_hour: u64,
    /// Duration, seconds: the requested one, or the last extension's (`extensions`).
    pub duration_s: u32,
    /// Budget cap, micro-units: the requested one, or the last extension's.
    #[serde(default)]
    pub max_total: u64,
    /// Extensions accepted (`gridlease extend`), 0 for none.
    #[serde(default)]
    pub extensions: u64,
    /// Minimum billed seconds (from the offer): a lease that ends earlier pays for this long.
    #[serde(default)]
    pub min_billed_s: u32,
    /// Seconds of use the renter pays ahead (`rent --prepay`; 4294967295: the whole lease):
    /// the lease runs on while the renter is offline. 0: pay as you go.
    #[serde(default)]
    pub prepay_s: u32,
    /// Image.
    pub image: String,
    /// The lease's disk (its `/workspace`), bytes.
    #[serde(default)]
    pub disk_bytes: u64,
    /// When the container started (unix ms).
    pub started_at: Option<u64>,
    /// When the lease closed (unix ms).
    pub closed_at: Option<u64>,
    /// The last usage report.
    pub usage: Option<UsageView>,
    /// The offer the lease was made from declared its GPUs (`--dev-gpus`): no driver
    /// measures them, so `usage`'s GPU values are `null`.
    #[serde(default)]
    pub gpus_declared: bool,
    /// Paid, micro-units: the settled total once settled; before, what the signed receipts
    /// cover of the cost so far (the smaller of `authorised` and `cost_so_far`).
    pub paid: u64,
    /// Authorised, micro-units: the last signed receipt's total. A prepaid lease authorises
    /// ahead of its use (`prepay_s`); only what the provider's reports make due is paid.
    #[serde(default)]
    pub authorised: u64,
    /// Cost so far: the last report's amount due, micro-units.
    pub cost_so_far: u64,
    /// Seconds left until the lease's deadline, while it runs.
    pub time_left_s: Option<u64>,
    /// The container's exit code.
    pub exit_code: Option<i32>,
    /// Why it closed (`renter_stop`, `expired`, ...: the store's names for a
    /// [`CloseReason`](gridlease_protocol::CloseReason)).
    pub close_reason: Option<String>,
    /// The final statement once settled, micro-units.
    pub settled_total: Option<u64>,
    /// Why the start failed (`close_reason` is `start_failed`): its kind and a sentence.
    #[serde(default)]
    pub failure: Option<FailureView>,
    /// Renter, before the container runs: the provider's image pull so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullView>,
    /// A finished lease whose terms keep its outputs (`output_retention_s`): the provider keeps
    /// the stopped container and `/workspace` for downloads until then (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_until: Option<u64>,
    /// Before the command starts: the created container is held for the renter's uploads
    /// (`rent --upload`, the terms' `upload_hold_s`) until the renter begins it or this time
    /// (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_until: Option<u64>,
    /// The renter's GPU check at the start (issue 44): running, passed or failed, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_check: Option<super::check_view::GpuCheckView>,
    /// A volume lease (issue 47): the volume it keeps (`disk_bytes` is its size,
    /// `duration_s` its keep period, `time_left_s` the time until it is deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeView>,
    /// The renter's volumes mounted into this lease's container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountView>,
}

/// The volume a volume lease keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VolumeView {
    /// The renter's name for it.
    pub name: String,
    /// Size, GiB.
    pub size_gib: u32,
    /// Price per GiB-hour, micro-units.
    pub price_per_gib_hour: u64,
    /// The lease (64 hex digits) whose `/workspace` it was made of (`stop --keep-disk`).
    pub from_lease: Option<String>,
}

/// A volume mounted into a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MountView {
    /// The volume lease (64 hex digits).
    #[serde(serialize_with = "ser_display", deserialize_with = "de_from_str")]
    #[schema(value_type = String)]
    pub volume: LeaseId,
    /// Where the container sees it.
    pub path: String,
}

impl LeaseView {
    /// The lease whose workspace image is this lease's `/workspace`: a volume mounted there,
    /// else the lease's own.
    pub fn workspace_lease(&self) -> LeaseId {
        self.mounts
            .iter()
            .find(|m| m.path == gridlease_sandbox::spec::WORKSPACE_PATH)
            .map_or(self.lease_id, |m| m.volume)
    }
}

/// An image pull in progress, as the provider reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PullView {
    /// Bytes of the image's layers pulled so far.
    pub pulled_bytes: u64,
    /// Bytes of the layers known so far.
    pub total_bytes: u64,
}

/// A start failure, as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FailureView {
    /// `no_sandbox`, `image_pull`, `pull_stalled`, `pull_timeout`, `image_refused`,
    /// `create`, `start` or `internal`.
    pub kind: String,
    /// What the provider saw, in words.
    pub message: String,
}

impl FailureView {
    /// The view of a failure.
    pub fn of(f: &gridlease_protocol::StartFailure) -> Self {
        use gridlease_protocol::StartFailureKind as K;
        let kind = match f.kind {
            K::NoSandbox => "no_sandbox",
            K::ImagePull => "image_pull",
            K::PullStalled => "pull_stalled",
            K::PullTimeout => "pull_timeout",
            K::ImageRefused => "image_refused",
            K::Create => "create",
            K::Start => "start",
            K::Internal => "internal",
        };
        Self {
            kind: kind.to_string(),
            message: f.message.clone(),
        }
    }
}

fn ser_display<S: serde::Serializer>(v: &LeaseId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// The inverse of [`ser_display`]: a lease id from its hex text.
fn de_from_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<LeaseId, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

impl LeaseView {
    /// Nothing more will happen to the lease ([`LeaseState::is_terminal`]).
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }

    /// With the image pull (if any, and only before the container runs) shown.
    pub fn with_pull(mut self, p: Option<(u64, u64)>) -> Self {
        let before_start = matches!(self.state, LeaseState::Accepted | LeaseState::Starting);
        self.pull = p.filter(|_| before_start).map(|(pulled, total)| PullView {
            pulled_bytes: pulled,
            total_bytes: total,
        });
        self
    }

    /// With the upload hold (if any, and only before the container runs) shown.
    pub fn with_hold(mut self, until: Option<Timestamp>) -> Self {
        let before_start = matches!(self.state, LeaseState::Accepted | LeaseState::Starting);
        self.upload_until = until.filter(|_| before_start).map(|t| t.0);
        self
    }

    /// With the GPU check (if any) shown.
    pub fn with_check(mut self, c: Option<super::check_view::GpuCheckView>) -> Self {
        self.gpu_check = c;
        self
    }

    /// With the start failure (if any) shown.
    pub fn with_failure(mut self, f: Option<&gridlease_protocol::StartFailure>) -> Self {
        self.failure = f.map(FailureView::of);
        self
    }

    /// Recomputes the time left at `now` (a published view is read later than it was made).
    pub fn at(mut self, now: Timestamp) -> Self {
        self.time_left_s = time_left_s(self.state, self.started_at, self.duration_s, now);
        self
    }
}

/// Seconds until the deadline of a running lease.
fn time_left_s(
    state: LeaseState,
    started_at: Option<u64>,
    duration_s: u32,
    now: Timestamp,
) -> Option<u64> {
    match (state, started_at) {
        (LeaseState::Running, Some(s)) => {
            Some(Timestamp(s).plus_secs(u64::from(duration_s)).ms_since(now) / 1000)
        }
        _ => None,
    }
}

/// What a session knows of its lease besides the lease itself: its view's inputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Known<'a> {
    /// This node's side.
    pub role: Role,
    /// The other party.
    pub counterparty: &'a PublicKey,
    /// The last usage report.
    pub usage: Option<&'a UsageReport>,
    /// The last receipt's total, micro-units.
    pub authorised: u64,
    /// The container's exit code.
    pub exit_code: Option<i32>,
    /// The lease's offer declared its GPUs.
    pub gpus_declared: bool,
}

/// Builds a view from a lease and what the session knows.
pub(crate) fn make(lease: &Lease, k: Known<'_>, now: Timestamp) -> LeaseView {
    let Known {
        role,
        counterparty,
        usage,
        authorised,
        exit_code,
        gpus_declared,
    } = k;
    let t = &lease.terms;
    let cost_so_far = usage.map_or(0, |u| u.amount_due);
    let time_left_s = time_left_s(
        lease.state,
        lease.started_at.map(|t| t.0),
        t.duration_s,
        now,
    );
    LeaseView {
        lease_id: lease.id,
        role,
        state: lease.state,
        counterparty: counterparty
            .peer_id()
            .map(|p| p.to_string())
            .unwrap_or_else(|_| counterparty.to_string()),
        gpus: t.gpu_count,
        price_per_gpu_hour: t.price_per_gpu_hour,
        duration_s: t.duration_s,
        max_total: t.max_total,
        extensions: lease.extensions,
        min_billed_s: t.min_billed_s,
        prepay_s: t.prepay_s,
        image: t.image.clone(),
        disk_bytes: t.workspace_bytes(),
        started_at: lease.started_at.map(|t| t.0),
        closed_at: lease.closed_at.map(|t| t.0),
        usage: usage.map(|u| {
            let mut v = UsageView::from(u);
            if gpus_declared {
                v.gpu_util_permille = None;
                v.vram_peak_mib = None;
            }
            v
        }),
        gpus_declared,
        paid: lease
            .settled_total
            .map_or(authorised.min(cost_so_far), |m| m.micros()),
        authorised,
        cost_so_far,
        time_left_s,
        exit_code,
        close_reason: lease
            .close_reason
            .map(|r| crate::store::lease::reason_str(r).to_string()),
        settled_total: lease.settled_total.map(|m| m.micros()),
        failure: None,
        pull: None,
        outputs_until: outputs_until(lease),
        upload_until: None,
        gpu_check: None,
        volume: t.volume.as_ref().map(|v| VolumeView {
            name: v.name.clone(),
            size_gib: v.size_gib,
            price_per_gib_hour: v.price_per_gib_hour,
            from_lease: v.adopts.map(|l| l.to_string()),
        }),
        mounts: t
            .mounts
            .iter()
            .map(|m| MountView {
                volume: m.volume,
                path: m.path.clone(),
            })
            .collect(),
    }
}

/// Until when a finished lease's outputs are kept: its close plus the terms' retention, if it
/// asked for one and its container ran.
pub(crate) fn outputs_until(lease: &Lease) -> Option<u64> {
    let retention = u64::from(lease.terms.output_retention_s);
    let closed = lease.closed_at?;
    (retention > 0
        && lease.started_at.is_some()
        && lease.close_reason != Some(gridlease_protocol::CloseReason::StartFailed))
    .then(|| closed.plus_secs(retention).0)
}

/// Decodes a stored usage report / receipt payload (they were verified before being stored).
pub(crate) fn decode_usage(bytes: &[u8]) -> Option<(Signed<UsageReport>, UsageReport)> {
    let s = Signed::<UsageReport>::from_bytes(bytes).ok()?;
    let m = gridlease_protocol::WireMessage::decode_payload(&s.envelope().payload).ok()?;
    Some((s, m))
}

/// See [`decode_usage`].
pub(crate) fn decode_receipt(bytes: &[u8]) -> Option<(Signed<PaymentReceipt>, PaymentReceipt)> {
    let s = Signed::<PaymentReceipt>::from_bytes(bytes).ok()?;
    let m = gridlease_protocol::WireMessage::decode_payload(&s.envelope().payload).ok()?;
    Some((s, m))
}

/// Restores the lease's session fields from the store into `l`.
pub(crate) fn restore_lease(l: &mut Lease, rec: &SessionRecord) {
    l.started_at = rec.fields.started_at;
    l.closed_at = rec.fields.closed_at;
    l.close_reason = rec.fields.close_reason;
    l.settled_total = rec
        .fields
        .settled_total
        .map(gridlease_contracts::Money::from_micros);
}

/// The view of a stored lease without a live session.
pub(crate) fn from_store(l: &StoredLease, rec: &SessionRecord, now: Timestamp) -> LeaseView {
    let mut lease = l.lease.clone();
    restore_lease(&mut lease, rec);
    let usage = rec.last_usage.as_ref().and_then(|(_, b)| decode_usage(b));
    let authorised = rec
        .last_receipt
        .as_ref()
        .and_then(|(_, b)| decode_receipt(b))
        .map_or(0, |(_, r)| r.total_paid);
    make(
        &lease,
        Known {
            role: l.role,
            counterparty: &super::session::counterparty(l),
            usage: usage.as_ref().map(|(_, u)| u),
            authorised,
            exit_code: rec.fields.exit_code,
            gpus_declared: rec.gpus_declared,
        },
        now,
    )
    .with_failure(rec.fields.failure.as_ref())
    .with_check(
        rec.proof
            .as_ref()
            .and_then(super::check_view::GpuCheckView::of),
    )
}

/// One lease's statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseStatement {
    /// The lease (64 hex digits in JSON).
    #[serde(serialize_with = "ser_display", deserialize_with = "de_from_str")]
    #[schema(value_type = String)]
    pub lease_id: LeaseId,
    /// `renter` (spent) or `provider` (earned).
    pub role: Role,
    /// The other party's peer id.
    pub counterparty: String,
    /// Booked total, micro-units (equals the last valid receipt).
    pub total: u64,
    /// Ledger rows booked for it.
    pub entries: usize,
}

/// Totals with one counterparty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CounterpartyTotals {
    /// Earned from it as a provider, micro-units.
    pub earned: u64,
    /// Spent with it as a renter, micro-units.
    pub spent: u64,
}

/// The node's ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Ledger {
    /// Per lease.
    pub leases: Vec<LeaseStatement>,
    /// Per counterparty peer id.
    pub counterparties: BTreeMap<String, CounterpartyTotals>,
    /// Total earned, micro-units.
    pub total_earned: u64,
    /// Total spent, micro-units.
    pub total_spent: u64,
    /// Debits equal credits over all rows (double entry holds).
    pub balanced: bool,
}

fn peer_text(k: &PublicKey) -> String {
    k.peer_id()
        .map(|p| p.to_string())
        .unwrap_or_else(|_| k.to_string())
}

/// Builds the ledger from its rows.
pub(crate) fn ledger(rows: &[LedgerRow], leases: &[StoredLease]) -> Ledger {
    use crate::store::lease::{ACCOUNT_LEASE_REVENUE, ACCOUNT_LEASE_SPEND};
    let mut out = Ledger::default();
    let mut per: BTreeMap<LeaseId, LeaseStatement> = BTreeMap::new();
    let (mut debits, mut credits) = (0u128, 0u128);
    for r in rows {
        debits += u128::from(r.debit);
        credits += u128::from(r.credit);
        // Spend is debited, revenue credited; the opposite entry is a reversal (a prepaid
        // receipt's unused part, booked back at settlement).
        let (role, amount) = match r.account.as_str() {
            ACCOUNT_LEASE_SPEND => (Role::Renter, i128::from(r.debit) - i128::from(r.credit)),
            ACCOUNT_LEASE_REVENUE => (Role::Provider, i128::from(r.credit) - i128::from(r.debit)),
            _ => continue,
        };
        let add =
            |total: u64| u64::try_from((i128::from(total) + amount).max(0)).unwrap_or(u64::MAX);
        let st = per.entry(r.lease_id).or_insert_with(|| LeaseStatement {
            lease_id: r.lease_id,
            role,
            counterparty: peer_text(&r.counterparty),
            total: 0,
            entries: 0,
        });
        st.total = add(st.total);
        st.entries += 1;
        let c = out
            .counterparties
            .entry(peer_text(&r.counterparty))
            .or_default();
        if role == Role::Renter {
            c.spent = add(c.spent);
            out.total_spent = add(out.total_spent);
        } else {
            c.earned = add(c.earned);
            out.total_earned = add(out.total_earned);
        }
    }
    // Keep the store's lease order (oldest first).
    for l in leases {
        if let Some(st) = per.remove(&l.lease.id) {
            out.leases.push(st);
        }
    }
    out.leases.extend(per.into_values());
    out.balanced = debits == credits;
    out
}

/// Due at settlement for `wall_ms` under `terms` (used in views and tests).
pub fn final_due(terms: &gridlease_protocol::LeaseTerms, wall_ms: u64) -> Option<u64> {
    Tariff::of(terms)
        .final_due(wall_ms)
        .ok()
        .map(|m| m.micros())
}

/// Unix ms of a timestamp (for display).
pub fn ms(t: Timestamp) -> u64 {
    t.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures;
    use gridlease_protocol::{Digest, NodeKey, OfferId};

    #[test]
    fn view_serializes_with_text_ids_and_micro_units() {
        let p = NodeKey::from_secret([1; 32]).public();
        let r = NodeKey::from_secret([2; 32]).public();
        let offer = fixtures::offer(p, 1, 1, 3_600_000);
        let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r, 1, 600);
        let id = terms.lease_id().unwrap();
        let lease = Lease::propose(id, terms);
        let known = Known {
            role: Role::Renter,
            counterparty: &p,
            usage: None,
            authorised: 42,
            exit_code: Some(0),
            gpus_declared: false,
        };
        let v = make(&lease, known, fixtures::T0);
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["lease_id"], id.to_string());
        assert_eq!(j["role"], "renter");
        assert_eq!(j["state"], "proposed");
        assert_eq!(j["counterparty"], p.peer_id().unwrap().to_string());
        // Authorised ahead of any report: nothing is due, so nothing is paid yet.
        assert_eq!(j["authorised"], 42);
        assert_eq!(j["paid"], 0);
        assert_eq!(j["exit_code"], 0);
        assert!(!v.is_terminal());
    }

    fn settled_view() -> (LeaseView, PublicKey) {
        use gridlease_contracts::{Actor, LeaseEvent, Money};
        use gridlease_protocol::CloseReason;
        use gridlease_protocol::fixtures::T0;
        let p = NodeKey::from_secret([1; 32]).public();
        let r = NodeKey::from_secret([2; 32]).public();
        let offer = fixtures::offer(p, 1, 1, 3_600_000);
        let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r, 1, 600);
        let id = terms.lease_id().unwrap();
        let mut lease = Lease::propose(id, terms);
        lease
            .apply(LeaseEvent::Accept, Actor::Provider, T0)
            .unwrap();
        lease
            .apply(LeaseEvent::BeginStart, Actor::Provider, T0.plus_ms(5))
            .unwrap();
        lease
            .apply(LeaseEvent::Started, Actor::Provider, T0.plus_secs(1))
            .unwrap();
        lease
            .apply(
                LeaseEvent::Close(CloseReason::RenterStop),
                Actor::Renter,
                T0.plus_secs(61),
            )
            .unwrap();
        lease
            .apply(
                LeaseEvent::Settle {
                    total: Money::from_micros(60_000),
                },
                Actor::Renter,
                T0.plus_secs(62),
            )
            .unwrap();
        let mut usage = fixtures::usage(id, 6, 60_000, 1);
        usage.amount_due = 60_000;
        let known = Known {
            role: Role::Provider,
            counterparty: &r,
            usage: Some(&usage),
            authorised: 60_000,
            exit_code: Some(137),
            gpus_declared: false,
        };
        (make(&lease, known, T0), r)
    }

    /// A prepaid lease authorises its whole budget but pays what was due; a pay-as-you-go one
    /// pays what its receipts cover; settled, the settlement is what was paid. Declared GPUs'
    /// usage is unknown (null), never 0.
    #[test]
    fn paid_is_what_was_due_authorised_is_what_was_signed_and_declared_gpus_are_null() {
        let p = NodeKey::from_secret([1; 32]).public();
        let r = NodeKey::from_secret([2; 32]).public();
        let offer = fixtures::offer(p, 1, 1, 3_600_000);
        let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r, 1, 600);
        let id = terms.lease_id().unwrap();
        let lease = Lease::propose(id, terms);
        let mut usage = fixtures::usage(id, 2, 20_000, 1);
        usage.amount_due = 11_111;
        let known = |authorised, gpus_declared| Known {
            role: Role::Renter,
            counterparty: &p,
            usage: Some(&usage),
            authorised,
            exit_code: None,
            gpus_declared,
        };
        let prepaid = make(&lease, known(20_000, true), fixtures::T0);
        assert_eq!((prepaid.paid, prepaid.authorised), (11_111, 20_000));
        let u = prepaid.usage.as_ref().unwrap();
        assert_eq!((u.gpu_util_permille, u.vram_peak_mib), (None, None));
        let j = serde_json::to_value(&prepaid).unwrap();
        assert!(j["usage"]["gpu_util_permille"].is_null(), "{j}");
        assert_eq!(j["gpus_declared"], true);
        let lagging = make(&lease, known(10_000, false), fixtures::T0);
        assert_eq!((lagging.paid, lagging.authorised), (10_000, 10_000));
        let u = lagging.usage.as_ref().unwrap();
        assert_eq!(u.gpu_util_permille, Some(usage.gpu_util_permille));
        let (settled, _) = settled_view();
        assert_eq!(
            (settled.paid, settled.settled_total),
            (60_000, Some(60_000))
        );
    }

    /// The JSON scripts read (`leases --json`, `GET /v1/leases`), byte for byte.
    #[test]
    fn view_json_is_stable() {
        let (v, r) = settled_view();
        let text = serde_json::to_string(&v).unwrap();
        let expected = format!(
            concat!(
                r#"{{"lease_id":"{id}","role":"provider","state":"settled","#,
                r#""counterparty":"{peer}","gpus":1,"price_per_gpu_hour":3600000,"#,
                r#""duration_s":600,"max_total":10000000,"extensions":0,"min_billed_s":60,"prepay_s":0,"#,
                r#""image":"{image}","disk_bytes":107374182400,"started_at":{started},"#,
                r#""closed_at":{closed},"usage":{{"seq":6,"wall_ms":60000,"#,
                r#""gpu_util_permille":970,"vram_peak_mib":20000,"cpu_ms":30000,"#,
                r#""mem_peak_mib":1024,"net_rx_bytes":0,"net_tx_bytes":0}},"gpus_declared":false,"#,
                r#""paid":60000,"authorised":60000,"cost_so_far":60000,"#,
                r#""time_left_s":null,"exit_code":137,"close_reason":"renter_stop","#,
                r#""settled_total":60000,"failure":null}}"#
            ),
            id = v.lease_id,
            peer = r.peer_id().unwrap(),
            image = v.image,
            started = fixtures::T0.plus_secs(1).0,
            closed = fixtures::T0.plus_secs(61).0,
        );
        assert_eq!(text, expected);
        assert!(v.is_terminal());
        // The CLI reads the same struct back.
        let back: LeaseView = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
        let bad = text.replace(&v.lease_id.to_string(), "abc");
        assert!(serde_json::from_str::<LeaseView>(&bad).is_err());
    }

    #[test]
    fn states_serialize_as_their_names() {
        for s in [
            LeaseState::Proposed,
            LeaseState::Closing,
            LeaseState::Failed,
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<LeaseState>(&json).unwrap(), s);
        }
        assert_eq!(serde_json::to_string(&Role::Renter).unwrap(), "\"renter\"");
    }

    /// The JSON of `ledger --json` / `GET /v1/ledger`, byte for byte.
    #[test]
    fn ledger_json_is_stable() {
        use crate::store::lease::{ACCOUNT_LEASE_SPEND, ACCOUNT_PAYABLE};
        let (v, r) = settled_view();
        let row = |account: &str, debit, credit| LedgerRow {
            lease_id: v.lease_id,
            counterparty: r,
            account: account.to_string(),
            debit,
            credit,
            receipt_seq: Some(1),
            at: fixtures::T0,
        };
        let rows = [
            row(ACCOUNT_LEASE_SPEND, 500, 0),
            row(ACCOUNT_PAYABLE, 0, 500),
        ];
        let l = ledger(&rows, &[]);
        let text = serde_json::to_string(&l).unwrap();
        let peer = r.peer_id().unwrap();
        let expected = format!(
            concat!(
                r#"{{"leases":[{{"lease_id":"{id}","role":"renter","counterparty":"{peer}","#,
                r#""total":500,"entries":1}}],"counterparties":{{"{peer}":{{"earned":0,"#,
                r#""spent":500}}}},"total_earned":0,"total_spent":500,"balanced":true}}"#
            ),
            id = v.lease_id,
            peer = peer,
        );
        assert_eq!(text, expected);
        assert_eq!(serde_json::from_str::<Ledger>(&text).unwrap(), l);
    }
}
