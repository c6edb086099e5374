//! The payment channel of one lease: signed usage reports one way, signed cumulative receipts
//! the other.
//!
//! Protocol: every `usage_interval_s` the provider sends a [`UsageReport`] with cumulative
//! meters. The renter checks it ([`RenterChannel::on_usage`]) and answers with a
//! [`PaymentReceipt`] whose `total_paid` is what the tariff says is due for the reported wall
//! time plus the cost of the terms' `prepay_s` seconds, capped at the budget
//! ([`Tariff::receipt_total`]). With `prepay_s = 0` (the default) the renter pays in arrears: a
//! vanished provider costs it nothing beyond usage it was shown. With a prepay it has
//! pre-authorised exactly that much more ([`Tariff::prepaid_beyond`]), so the provider keeps
//! running while the renter is offline (an unattended lease).
//!
//! The provider runs at most `pay_ahead_s` seconds of usage on credit:
//! [`ProviderChannel::decide`] says stop as soon as what is due exceeds what is paid by more than
//! the cost of that window, or the renter has been silent past the grace period while no
//! prepaid time is left, or the budget is spent. So the provider's loss is bounded by one
//! window, and the renter's by its prepay plus what implausible reports can claim (wall time is
//! bounded by the renter's own clock, see [`check_usage`]).
//!
//! Final statement ([`owed`]): the last valid receipt's `total_paid`, but never more than the
//! amount due in the provider's last signed usage report: a prepaid receipt authorises up to its
//! total, the provider's own report says how much of it was used. In arrears the two are the
//! receipt's total (a receipt never pays more than a report claimed). Both ledgers book that.

use gridlease_protocol::{
    CloseReason, LeaseId, LeaseTerms, PaymentReceipt, PublicKey, Timestamp, UsageReport,
};

use crate::billing::Tariff;
use crate::money::{Money, MoneyError};

/// Extra wall time a report may claim beyond the renter's own elapsed clock, ms: covers clock
/// skew and the time between the provider's accept and the renter seeing it.
pub const WALL_CLOCK_TOLERANCE_MS: u64 = 2_000;

/// Why a receipt is refused by the provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// For another lease.
    #[error("receipt is for lease {got}, expected {expected}")]
    WrongLease {
        /// Expected.
        expected: LeaseId,
        /// Received.
        got: LeaseId,
    },
    /// Not signed by the lease's renter.
    #[error("receipt signed by {signer}, not by the renter")]
    WrongSigner {
        /// Signer.
        signer: PublicKey,
    },
    /// Sequence not above the last one: replayed or reordered.
    #[error("receipt seq {got} is not above the last accepted seq {last}")]
    StaleSeq {
        /// Last accepted seq.
        last: u64,
        /// Received seq.
        got: u64,
    },
    /// Amount not above the last one.
    #[error("receipt total {got} is not above the last accepted total {last}")]
    NotIncreasing {
        /// Last accepted total.
        last: Money,
        /// Received total.
        got: Money,
    },
    /// Amount beyond the agreed budget.
    #[error("receipt total {got} exceeds the budget cap {cap}")]
    OverBudget {
        /// Received total.
        got: Money,
        /// Budget.
        cap: Money,
    },
    /// The on-chain voucher is missing, unexpected or not the renter wallet's
    /// ([`crate::settlement::check_voucher`]).
    #[error(transparent)]
    Voucher(#[from] crate::settlement::VoucherError),
}

/// What the provider should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep running.
    Continue,
    /// Stop the container and close the lease for this reason.
    Stop(CloseReason),
}

/// The provider's side of the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderChannel {
    lease_id: LeaseId,
    renter: PublicKey,
    tariff: Tariff,
    pay_ahead_s: u32,
    grace_s: u32,
    /// [`ProviderChannel::exposure_bound`], computed when the tariff is set (it is asked at
    /// every report).
    bound: Result<Money, MoneyError>,
    last: Option<PaymentReceipt>,
    last_heard: Timestamp,
    /// The lease's on-chain settlement: every receipt's voucher is checked against it.
    settlement: Option<Box<gridlease_protocol::wallet::LeaseSettlement>>,
}

impl ProviderChannel {
    /// A channel for a lease whose container started at `started_at`.
    pub fn new(lease_id: LeaseId, terms: &LeaseTerms, started_at: Timestamp) -> Self {
        let tariff = Tariff::of(terms);
        Self {
            lease_id,
            renter: terms.renter,
            bound: tariff.window_cost(u64::from(terms.pay_ahead_s)),
            tariff,
            pay_ahead_s: terms.pay_ahead_s,
            grace_s: terms.grace_s,
            last: None,
            last_heard: started_at,
            settlement: terms.settlement.clone().map(Box::new),
        }
    }

    /// Restores a channel from its last accepted receipt (after a restart).
    pub fn restore(mut self, last: Option<PaymentReceipt>, last_heard: Timestamp) -> Self {
        self.last = last;
        self.last_heard = self.last_heard.max(last_heard);
        self
    }

    /// The tariff.
    pub fn tariff(&self) -> &Tariff {
        &self.tariff
    }

    /// Takes the lease's terms after an accepted amendment ([`crate::amend`]): from now on
    /// usage is billed, capped and stopped by the new duration and budget cap.
    pub fn amend(&mut self, amended: &LeaseTerms) {
        self.tariff = Tariff::of(amended);
        self.bound = self.tariff.window_cost(u64::from(self.pay_ahead_s));
    }

    /// Validates a receipt from `signer` received at `now`. On success returns the amount newly
    /// paid (to book), and the receipt becomes the final statement so far.
    #[inline]
    pub fn accept_receipt(
        &mut self,
        signer: &PublicKey,
        receipt: &PaymentReceipt,
        now: Timestamp,
    ) -> Result<Money, ReceiptError> {
        if receipt.lease_id != self.lease_id {
            return Err(ReceiptError::WrongLease {
                expected: self.lease_id,
                got: receipt.lease_id,
            });
        }
        if signer != &self.renter {
            return Err(ReceiptError::WrongSigner { signer: *signer });
        }
        let got = Money::from_micros(receipt.total_paid);
        let (last_seq, last_total) = self.last.as_ref().map_or((0, Money::ZERO), |r| {
            (r.seq, Money::from_micros(r.total_paid))
        });
        if receipt.seq <= last_seq {
            return Err(ReceiptError::StaleSeq {
                last: last_seq,
                got: receipt.seq,
            });
        }
        if got <= last_total {
            return Err(ReceiptError::NotIncreasing {
                last: last_total,
                got,
            });
        }
        if got > self.tariff.max_total {
            return Err(ReceiptError::OverBudget {
                got,
                cap: self.tariff.max_total,
            });
        }
        crate::settlement::check_voucher(self.settlement.as_deref(), receipt)?;
        // Field by field, each scalar read on its own (`black_box` keeps the compiler from
        // merging the reads into 16-byte loads): a receipt built a moment ago (the simulator
        // hands it over at once) was stored one 8-byte field at a time, and a wider load
        // spanning two of those stores stalls on store forwarding (a quarter of the
        // simulator's per-report loop, `docs/benchmarks.md`).
        self.last = Some(PaymentReceipt {
            lease_id: receipt.lease_id,
            seq: std::hint::black_box(receipt.seq),
            total_paid: std::hint::black_box(receipt.total_paid),
            covers_wall_ms: std::hint::black_box(receipt.covers_wall_ms),
            usage_seq: std::hint::black_box(receipt.usage_seq),
            issued_at: std::hint::black_box(receipt.issued_at),
            voucher: receipt.voucher.clone(),
        });
        self.last_heard = self.last_heard.max(now);
        Ok(got.saturating_sub(last_total))
    }

    /// Notes that the renter was heard from (any valid message), resetting the grace timer.
    #[inline]
    pub fn heard_from_renter(&mut self, now: Timestamp) {
        self.last_heard = self.last_heard.max(now);
    }

    /// Total paid so far (the final statement if the lease ended now).
    #[inline]
    pub fn paid(&self) -> Money {
        self.last
            .as_ref()
            .map_or(Money::ZERO, |r| Money::from_micros(r.total_paid))
    }

    /// The last valid receipt.
    pub fn last_receipt(&self) -> Option<&PaymentReceipt> {
        self.last.as_ref()
    }

    /// Due for `wall_ms` of usage minus paid: what the provider stands to lose now.
    pub fn unpaid_exposure(&self, wall_ms: u64) -> Result<Money, MoneyError> {
        Ok(self.tariff.due(wall_ms)?.saturating_sub(self.paid()))
    }

    /// The most the provider can be owed before it must stop: the cost of one window.
    pub fn exposure_bound(&self) -> Result<Money, MoneyError> {
        self.bound.clone()
    }

    /// Whether the renter has paid for time not yet used (a prepaid, unattended lease): paid
    /// beyond what `wall_ms` of usage costs, or the whole budget.
    #[inline]
    pub fn prepaid_ahead(&self, wall_ms: u64) -> Result<bool, MoneyError> {
        let paid = self.paid();
        Ok(self.tariff.prepay_s > 0
            && (paid > self.tariff.due(wall_ms)? || paid >= self.tariff.max_total))
    }

    /// What the lease settles at if it ends now with `last_report` as the provider's last
    /// signed report ([`owed`]).
    pub fn settlement(&self, last_report: Option<&UsageReport>) -> Money {
        owed(self.paid(), last_report)
    }

    /// Stop or continue, given `wall_ms` of usage so far and the time now. A renter silent
    /// past the grace period stops the lease unless it prepaid the time now being used
    /// ([`Self::prepaid_ahead`]): then the lease runs on the renter's money until that is used
    /// up, and stops at once after (the renter is still silent).
    #[inline]
    pub fn decide(&self, wall_ms: u64, now: Timestamp) -> Result<Decision, MoneyError> {
        // Called at every report: the amount due is computed once.
        let due = self.tariff.due(wall_ms)?;
        if due >= self.tariff.max_total && wall_ms >= self.tariff.budget_exhausted_after_ms() {
            return Ok(Decision::Stop(CloseReason::BudgetExhausted));
        }
        if due.saturating_sub(self.paid()) > self.bound.clone()? {
            return Ok(Decision::Stop(CloseReason::PaymentLagging));
        }
        if now.ms_since(self.last_heard) > u64::from(self.grace_s) * 1000
            && !self.prepaid_ahead(wall_ms)?
        {
            return Ok(Decision::Stop(CloseReason::RenterUnreachable));
        }
        Ok(Decision::Continue)
    }
}

/// What a lease settles at: the last receipt's total `paid`, at most the amount due in the
/// provider's last signed usage report (what it claims was used; a prepaid receipt authorises
/// more than that). Without a report (a start that failed) the receipt stands.
pub fn owed(paid: Money, last_report: Option<&UsageReport>) -> Money {
    last_report.map_or(paid, |r| paid.min(Money::from_micros(r.amount_due)))
}

/// Why a renter refuses a usage report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// For another lease.
    #[error("usage report is for another lease")]
    WrongLease,
    /// Not signed by the provider.
    #[error("usage report signed by {signer}, not by the provider")]
    WrongSigner {
        /// Signer.
        signer: PublicKey,
    },
    /// Sequence not above the last.
    #[error("usage seq {got} is not above {last}")]
    StaleSeq {
        /// Last seq.
        last: u64,
        /// Received.
        got: u64,
    },
    /// A cumulative meter went backwards.
    #[error("cumulative meter `{meter}` went backwards")]
    MeterDecreased {
        /// Which meter.
        meter: &'static str,
    },
    /// More wall time than has elapsed (or than the lease allows).
    #[error("{claimed_ms} ms of wall time claimed, at most {allowed_ms} ms possible")]
    WallTimeInflated {
        /// Claimed.
        claimed_ms: u64,
        /// Possible.
        allowed_ms: u64,
    },
    /// More GPU time than wall time x GPUs.
    #[error("{claimed_ms} GPU-ms claimed, at most {allowed_ms} possible")]
    GpuTimeInflated {
        /// Claimed.
        claimed_ms: u64,
        /// Possible.
        allowed_ms: u64,
    },
    /// The provider's amount due differs from the tariff's.
    #[error("provider claims {claimed} due, the tariff says {expected}")]
    AmountMismatch {
        /// Claimed.
        claimed: Money,
        /// Computed.
        expected: Money,
    },
    /// Arithmetic overflow.
    #[error(transparent)]
    Money(#[from] MoneyError),
}

/// Checks a usage report against the previous one and the renter's own clock.
/// `elapsed_ms` is how long the lease has existed by the renter's clock (since it saw the
/// acceptance); a provider can never bill more wall time than that, plus a small tolerance,
/// and never more than the lease's duration (see [`Tariff::cap`]: no tolerance there).
pub fn check_usage(
    terms: &LeaseTerms,
    lease_id: LeaseId,
    prev: Option<&UsageReport>,
    report: &UsageReport,
    signer: &PublicKey,
    elapsed_ms: u64,
) -> Result<(), UsageError> {
    check_usage_in(
        terms,
        &Tariff::of(terms),
        lease_id,
        prev,
        report,
        signer,
        elapsed_ms,
    )
}

/// [`check_usage`] with the terms' tariff already at hand (a channel keeps it: this runs at
/// every report).
#[inline]
fn check_usage_in(
    terms: &LeaseTerms,
    tariff: &Tariff,
    lease_id: LeaseId,
    prev: Option<&UsageReport>,
    report: &UsageReport,
    signer: &PublicKey,
    elapsed_ms: u64,
) -> Result<(), UsageError> {
    if report.lease_id != lease_id {
        return Err(UsageError::WrongLease);
    }
    if signer != &terms.provider {
        return Err(UsageError::WrongSigner { signer: *signer });
    }
    if let Some(p) = prev {
        if report.seq <= p.seq {
            return Err(UsageError::StaleSeq {
                last: p.seq,
                got: report.seq,
            });
        }
        if let Some(meter) = decreased_meter(p, report) {
            return Err(UsageError::MeterDecreased { meter });
        }
    } else if report.seq == 0 {
        return Err(UsageError::StaleSeq { last: 0, got: 0 });
    }
    let allowed_ms = elapsed_ms
        .saturating_add(WALL_CLOCK_TOLERANCE_MS)
        .min(tariff.max_wall_ms);
    if report.wall_ms > allowed_ms {
        return Err(UsageError::WallTimeInflated {
            claimed_ms: report.wall_ms,
            allowed_ms,
        });
    }
    let gpu_allowed = report.wall_ms.saturating_mul(u64::from(terms.gpu_count));
    if report.gpu_ms > gpu_allowed {
        return Err(UsageError::GpuTimeInflated {
            claimed_ms: report.gpu_ms,
            allowed_ms: gpu_allowed,
        });
    }
    let expected = tariff.due(report.wall_ms)?;
    let claimed = Money::from_micros(report.amount_due);
    // The final report (container exited) may apply the minimum billed duration (computed
    // only when that decides: this runs at every report).
    let ok = claimed == expected
        || (report.exit_code.is_some() && claimed == tariff.final_due(report.wall_ms)?);
    if !ok {
        return Err(UsageError::AmountMismatch { claimed, expected });
    }
    Ok(())
}

/// The first cumulative meter of `report` below its value in `prev`, in the order the report
/// lists them.
#[inline]
fn decreased_meter(prev: &UsageReport, report: &UsageReport) -> Option<&'static str> {
    if report.wall_ms < prev.wall_ms {
        Some("wall_ms")
    } else if report.gpu_ms < prev.gpu_ms {
        Some("gpu_ms")
    } else if report.cpu_ms < prev.cpu_ms {
        Some("cpu_ms")
    } else if report.energy_mj < prev.energy_mj {
        Some("energy_mj")
    } else if report.net_rx_bytes < prev.net_rx_bytes {
        Some("net_rx_bytes")
    } else if report.net_tx_bytes < prev.net_tx_bytes {
        Some("net_tx_bytes")
    } else if report.amount_due < prev.amount_due {
        Some("amount_due")
    } else {
        None
    }
}

/// The renter's side of the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenterChannel {
    lease_id: LeaseId,
    terms: LeaseTerms,
    /// The tariff of `terms` (asked at every report).
    tariff: Tariff,
    /// The terms before the last amendment: a report the provider signed before it accepted
    /// the amendment may arrive after the renter applied it (see [`RenterChannel::amend`]).
    before_amend: Option<LeaseTerms>,
    last_usage: Option<UsageReport>,
    last_receipt: Option<PaymentReceipt>,
}

impl RenterChannel {
    /// A channel for an accepted lease.
    pub fn new(lease_id: LeaseId, terms: LeaseTerms) -> Self {
        Self {
            lease_id,
            tariff: Tariff::of(&terms),
            terms,
            before_amend: None,
            last_usage: None,
            last_receipt: None,
        }
    }

    /// Takes the lease's terms after an accepted amendment ([`crate::amend`]): reports are
    /// checked against the new duration and paid up to the new cap. A report signed under the
    /// previous terms (in flight while the amendment was accepted) still passes if it is valid
    /// under them: its amount may be capped at the previous budget.
    pub fn amend(&mut self, amended: &LeaseTerms) {
        let before = std::mem::replace(&mut self.terms, amended.clone());
        self.tariff = Tariff::of(amended);
        self.before_amend = Some(before);
    }

    /// The terms the channel checks against (amended ones included).
    pub fn terms(&self) -> &LeaseTerms {
        &self.terms
    }

    /// Restores from persisted state after a restart.
    pub fn restore(
        mut self,
        last_usage: Option<UsageReport>,
        last_receipt: Option<PaymentReceipt>,
    ) -> Self {
        self.last_usage = last_usage;
        self.last_receipt = last_receipt;
        self
    }

    /// Total paid so far.
    #[inline]
    pub fn paid(&self) -> Money {
        self.last_receipt
            .as_ref()
            .map_or(Money::ZERO, |r| Money::from_micros(r.total_paid))
    }

    /// The last receipt signed.
    pub fn last_receipt(&self) -> Option<&PaymentReceipt> {
        self.last_receipt.as_ref()
    }

    /// The last usage report accepted.
    pub fn last_usage(&self) -> Option<&UsageReport> {
        self.last_usage.as_ref()
    }

    /// Handles a verified usage report from `signer`. Returns the receipt to sign and send
    /// (`None` if nothing new is due), or why the report is refused; a refused report books
    /// nothing and the renter should close the lease with
    /// [`CloseReason::ImplausibleUsage`].
    #[inline]
    pub fn on_usage(
        &mut self,
        report: &UsageReport,
        signer: &PublicKey,
        elapsed_ms: u64,
        now: Timestamp,
    ) -> Result<Option<PaymentReceipt>, UsageError> {
        self.observe(report, signer, elapsed_ms)?;
        let total = self
            .tariff
            .receipt_total(Money::from_micros(report.amount_due));
        // The report's own fields, not the copy `observe` just kept: reading a field of a
        // struct copied a moment ago stalls on store forwarding (the simulator's hot loop).
        Ok(self.pay(total, report.wall_ms, report.seq, now))
    }

    /// Checks a report like [`Self::on_usage`] and records it as the last one shown, but pays
    /// nothing: how a renter that was away catches up on reports of a lease the provider has
    /// already closed (paying more then would only make the two statements differ; the
    /// settlement is [`Self::settlement`]).
    #[inline]
    pub fn observe(
        &mut self,
        report: &UsageReport,
        signer: &PublicKey,
        elapsed_ms: u64,
    ) -> Result<(), UsageError> {
        let check = |terms: &LeaseTerms, tariff: &Tariff| {
            check_usage_in(
                terms,
                tariff,
                self.lease_id,
                self.last_usage.as_ref(),
                report,
                signer,
                elapsed_ms,
            )
        };
        match (check(&self.terms, &self.tariff), &self.before_amend) {
            (Ok(()), _) => {}
            (Err(e @ UsageError::AmountMismatch { .. }), Some(before)) => {
                check(before, &Tariff::of(before)).map_err(|_| e)?;
            }
            (Err(e), _) => return Err(e),
        }
        self.last_usage = Some(report.clone());
        Ok(())
    }

    /// What the lease settles at now ([`owed`]): the last receipt, at most what the last
    /// accepted report says is due.
    pub fn settlement(&self) -> Money {
        owed(self.paid(), self.last_usage.as_ref())
    }

    /// Books and returns the next receipt, paying `due` (capped at the budget) in total, if
    /// that is more than paid so far; `None` otherwise.
    #[inline]
    fn pay(
        &mut self,
        due: Money,
        covers_wall_ms: u64,
        usage_seq: u64,
        now: Timestamp,
    ) -> Option<PaymentReceipt> {
        let due = due.min(Money::from_micros(self.terms.max_total));
        if due <= self.paid() {
            return None;
        }
        let receipt = PaymentReceipt {
            lease_id: self.lease_id,
            seq: self.last_receipt.as_ref().map_or(1, |r| r.seq + 1),
            total_paid: due.micros(),
            covers_wall_ms,
            usage_seq,
            issued_at: now,
            voucher: None,
        };
        self.last_receipt = Some(receipt.clone());
        Some(receipt)
    }

    /// The receipt the renter owes for a start that failed with `kind` (see
    /// [`crate::billing::start_failure_is_billed`]): the failed-start fee, once; `None` when
    /// the failure is the provider's or the fee is already paid. Like [`RenterChannel::on_usage`]
    /// the channel books it: persist it before sending it, or restore a clone on failure.
    pub fn on_start_failure(
        &mut self,
        kind: gridlease_protocol::StartFailureKind,
        now: Timestamp,
    ) -> Result<Option<PaymentReceipt>, MoneyError> {
        if !crate::billing::start_failure_is_billed(kind) {
            return Ok(None);
        }
        let usage_seq = self.last_usage.as_ref().map_or(0, |u| u.seq);
        Ok(self.pay(self.tariff.failed_start_fee()?, 0, usage_seq, now))
    }

    /// The receipt that pays ahead what the terms' prepay window is worth (`prepay_s`), when the
    /// provider says the lease's command started: the renter may go offline from then on (the
    /// provider runs a prepaid lease on through the renter's silence). `None` without a prepay
    /// window or when already paid. Like [`RenterChannel::on_usage`] the channel books it:
    /// persist it before sending it, or restore a clone on failure.
    pub fn on_started(&mut self, now: Timestamp) -> Option<PaymentReceipt> {
        let usage_seq = self.last_usage.as_ref().map_or(0, |u| u.seq);
        let shown = self.last_usage.as_ref().map_or(0, |u| u.amount_due);
        let wall_ms = self.last_usage.as_ref().map_or(0, |u| u.wall_ms);
        let total = self.tariff.receipt_total(Money::from_micros(shown));
        self.pay(total, wall_ms, usage_seq, now)
    }

    /// The receipt the renter owes when it stops a lease whose container the provider held for
    /// its uploads (`upload_hold_s`) before the command started: the minimum billed duration
    /// ([`Tariff::failed_start_fee`]), once. A held container kept a GPU from everyone else;
    /// without a price, holding and stopping again and again would cost a provider its GPU
    /// for nothing. Like [`RenterChannel::on_usage`] the channel books it: persist it before
    /// sending it, or restore a clone on failure.
    pub fn on_hold_abandoned(
        &mut self,
        now: Timestamp,
    ) -> Result<Option<PaymentReceipt>, MoneyError> {
        let usage_seq = self.last_usage.as_ref().map_or(0, |u| u.seq);
        Ok(self.pay(self.tariff.failed_start_fee()?, 0, usage_seq, now))
    }

    /// What the renter has paid beyond the usage it has been shown: at most the prepay's cost
    /// ([`Tariff::prepaid_beyond`]); zero in arrears.
    pub fn prepaid_exposure(&self, shown_wall_ms: u64) -> Result<Money, MoneyError> {
        Ok(self.paid().saturating_sub(self.tariff.due(shown_wall_ms)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::{Digest, NodeKey, OfferId};
    use proptest::prelude::*;

    struct Fx {
        provider: PublicKey,
        renter: PublicKey,
        terms: LeaseTerms,
        id: LeaseId,
    }

    /// 3.60 per GPU-hour = 1000 micro-units per GPU-second; 1 GPU; window 60 s; interval 10 s.
    fn fx() -> Fx {
        let p = NodeKey::from_secret([1; 32]).public();
        let r = NodeKey::from_secret([2; 32]).public();
        let offer = fixtures::offer(p, 1, 1, 3_600_000);
        let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r, 1, 600);
        let id = terms.lease_id().unwrap();
        Fx {
            provider: p,
            renter: r,
            terms,
            id,
        }
    }

    #[test]
    fn a_start_failed_on_the_image_costs_the_minimum_once_and_the_providers_own_nothing() {
        use gridlease_protocol::StartFailureKind as K;
        let f = fx();
        // fixtures: min_billed_s 60 at 1000 micro-units per second.
        let fee = Tariff::of(&f.terms).failed_start_fee().unwrap();
        assert_eq!(fee, Money::from_micros(60_000));
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        for kind in [K::NoSandbox, K::Create, K::Start, K::Internal] {
            assert_eq!(renter.on_start_failure(kind, T0).unwrap(), None, "{kind:?}");
        }
        let r = renter
            .on_start_failure(K::PullStalled, T0)
            .unwrap()
            .expect("a fee");
        assert_eq!((r.seq, r.total_paid, r.covers_wall_ms), (1, 60_000, 0));
        assert_eq!(renter.paid(), fee);
        assert_eq!(
            renter.on_start_failure(K::ImagePull, T0).unwrap(),
            None,
            "paid once"
        );
        // The provider books it like any receipt.
        let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
        assert_eq!(provider.accept_receipt(&f.renter, &r, T0).unwrap(), fee);
        assert_eq!(provider.paid(), fee);
        // Within the budget cap.
        let mut capped = f.terms.clone();
        capped.max_total = 1_000;
        let mut renter = RenterChannel::new(f.id, capped);
        let r = renter
            .on_start_failure(K::ImageRefused, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, 1_000);
    }

    #[test]
    fn a_prepaid_lease_is_paid_ahead_when_it_starts_and_a_provider_runs_it_through_silence() {
        let f = fx();
        let mut terms = f.terms.clone();
        terms.prepay_s = 120;
        let id = terms.lease_id().unwrap();
        let mut renter = RenterChannel::new(id, terms.clone());
        let r = renter.on_started(T0).expect("paid ahead");
        // fixtures: 1000 micro-units a second.
        assert_eq!((r.seq, r.total_paid), (1, 120_000));
        assert_eq!(renter.on_started(T0), None, "once");
        let mut provider = ProviderChannel::new(id, &terms, T0);
        provider.accept_receipt(&f.renter, &r, T0).unwrap();
        // Silent for longer than the grace, 60 s of use shown: prepaid, so it runs on.
        let later = T0.plus_secs(u64::from(terms.grace_s) + 30);
        assert_eq!(provider.decide(60_000, later).unwrap(), Decision::Continue);
        // Without a prepay window nothing is paid at the start.
        let mut plain = RenterChannel::new(f.id, f.terms.clone());
        assert_eq!(plain.on_started(T0), None);
    }

    #[test]
    fn an_abandoned_upload_hold_costs_the_minimum_once() {
        let f = fx();
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let r = renter.on_hold_abandoned(T0).unwrap().expect("a fee");
        assert_eq!((r.seq, r.total_paid, r.covers_wall_ms), (1, 60_000, 0));
        assert_eq!(renter.on_hold_abandoned(T0).unwrap(), None, "paid once");
        let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
        assert_eq!(
            provider.accept_receipt(&f.renter, &r, T0).unwrap(),
            Money::from_micros(60_000)
        );
        assert_eq!(renter.settlement(), provider.paid());
    }

    fn report(f: &Fx, seq: u64, wall_ms: u64) -> UsageReport {
        let mut u = fixtures::usage(f.id, seq, wall_ms, 1);
        u.amount_due = Tariff::of(&f.terms).due(wall_ms).unwrap().micros();
        u
    }

    #[test]
    fn receipts_flow_and_final_statement_is_the_last_receipt() {
        let f = fx();
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
        let mut booked = Money::ZERO;
        for seq in 1..=5u64 {
            let wall = seq * 10_000;
            let r = renter
                .on_usage(&report(&f, seq, wall), &f.provider, wall, T0.plus_ms(wall))
                .unwrap()
                .unwrap();
            booked = booked
                .checked_add(
                    provider
                        .accept_receipt(&f.renter, &r, T0.plus_ms(wall))
                        .unwrap(),
                )
                .unwrap();
        }
        assert_eq!(provider.paid(), Money::from_micros(50_000));
        assert_eq!(renter.paid(), provider.paid());
        assert_eq!(booked, provider.paid());
    }

    #[test]
    fn replayed_or_decreasing_receipts_are_rejected() {
        let f = fx();
        let mut p = ProviderChannel::new(f.id, &f.terms, T0);
        let r1 = fixtures::receipt(f.id, 1, 10_000, 10_000);
        let r2 = fixtures::receipt(f.id, 2, 20_000, 20_000);
        p.accept_receipt(&f.renter, &r1, T0).unwrap();
        p.accept_receipt(&f.renter, &r2, T0).unwrap();
        assert!(matches!(
            p.accept_receipt(&f.renter, &r2, T0),
            Err(ReceiptError::StaleSeq { .. })
        ));
        assert!(matches!(
            p.accept_receipt(&f.renter, &r1, T0),
            Err(ReceiptError::StaleSeq { .. })
        ));
        let lower = fixtures::receipt(f.id, 3, 15_000, 30_000);
        assert!(matches!(
            p.accept_receipt(&f.renter, &lower, T0),
            Err(ReceiptError::NotIncreasing { .. })
        ));
        let other = fixtures::receipt(LeaseId(Digest([0; 32])), 3, 30_000, 30_000);
        assert!(matches!(
            p.accept_receipt(&f.renter, &other, T0),
            Err(ReceiptError::WrongLease { .. })
        ));
        let forged = fixtures::receipt(f.id, 3, 30_000, 30_000);
        assert!(matches!(
            p.accept_receipt(&f.provider, &forged, T0),
            Err(ReceiptError::WrongSigner { .. })
        ));
        let greedy = fixtures::receipt(f.id, 3, f.terms.max_total + 1, 30_000);
        assert!(matches!(
            p.accept_receipt(&f.renter, &greedy, T0),
            Err(ReceiptError::OverBudget { .. })
        ));
        // Nothing of the rejected receipts was booked.
        assert_eq!(p.paid(), Money::from_micros(20_000));
    }

    #[test]
    fn provider_stops_when_receipts_lag_beyond_the_window() {
        let f = fx();
        let mut p = ProviderChannel::new(f.id, &f.terms, T0);
        // Window 60 s = 60_000 micro-units. Paid for 10 s.
        p.accept_receipt(
            &f.renter,
            &fixtures::receipt(f.id, 1, 10_000, 10_000),
            T0.plus_secs(10),
        )
        .unwrap();
        assert_eq!(
            p.decide(70_000, T0.plus_secs(11)).unwrap(),
            Decision::Continue
        );
        assert_eq!(
            p.decide(70_999, T0.plus_secs(11)).unwrap(),
            Decision::Continue
        );
        assert_eq!(
            p.decide(71_000, T0.plus_secs(11)).unwrap(),
            Decision::Stop(CloseReason::PaymentLagging)
        );
        assert!(p.unpaid_exposure(70_999).unwrap() <= p.exposure_bound().unwrap());
    }

    #[test]
    fn silent_renter_is_cut_off_after_grace() {
        let f = fx();
        let p = ProviderChannel::new(f.id, &f.terms, T0);
        let grace = u64::from(f.terms.grace_s);
        assert_eq!(
            p.decide(0, T0.plus_secs(grace)).unwrap(),
            Decision::Continue
        );
        assert_eq!(
            p.decide(0, T0.plus_secs(grace + 1)).unwrap(),
            Decision::Stop(CloseReason::RenterUnreachable)
        );
    }

    #[test]
    fn budget_exhaustion_stops_the_lease() {
        let mut f = fx();
        f.terms.max_total = 30_000; // 30 s of use
        let p = ProviderChannel::new(f.id, &f.terms, T0);
        assert_eq!(p.decide(29_999, T0).unwrap(), Decision::Continue);
        assert_eq!(
            p.decide(30_000, T0).unwrap(),
            Decision::Stop(CloseReason::BudgetExhausted)
        );
    }

    #[test]
    fn inflated_usage_is_refused_and_nothing_is_paid() {
        let f = fx();
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        renter
            .on_usage(&report(&f, 1, 10_000), &f.provider, 10_000, T0)
            .unwrap();
        // Claims 60 s after 20 s.
        let inflated = report(&f, 2, 60_000);
        assert!(matches!(
            renter.on_usage(&inflated, &f.provider, 20_000, T0),
            Err(UsageError::WallTimeInflated { .. })
        ));
        let mut gpu = report(&f, 2, 20_000);
        gpu.gpu_ms = 40_000;
        assert!(matches!(
            renter.on_usage(&gpu, &f.provider, 20_000, T0),
            Err(UsageError::GpuTimeInflated { .. })
        ));
        let mut amount = report(&f, 2, 20_000);
        amount.amount_due += 1;
        assert!(matches!(
            renter.on_usage(&amount, &f.provider, 20_000, T0),
            Err(UsageError::AmountMismatch { .. })
        ));
        let mut back = report(&f, 2, 20_000);
        back.cpu_ms = 0;
        assert!(matches!(
            renter.on_usage(&back, &f.provider, 20_000, T0),
            Err(UsageError::MeterDecreased { meter: "cpu_ms" })
        ));
        assert!(matches!(
            renter.on_usage(&report(&f, 1, 10_000), &f.provider, 20_000, T0),
            Err(UsageError::StaleSeq { .. })
        ));
        assert!(matches!(
            renter.on_usage(&report(&f, 2, 20_000), &f.renter, 20_000, T0),
            Err(UsageError::WrongSigner { .. })
        ));
        assert_eq!(renter.paid(), Money::from_micros(10_000));
    }

    /// Each cumulative meter that goes back is refused and named; with several, the first in
    /// the report's order.
    #[test]
    fn every_meter_that_goes_back_is_named() {
        let f = fx();
        let mut first = report(&f, 1, 10_000);
        (first.cpu_ms, first.energy_mj) = (5, 5);
        (first.net_rx_bytes, first.net_tx_bytes) = (5, 5);
        type Setter = (&'static str, fn(&mut UsageReport));
        let setters: [Setter; 7] = [
            ("wall_ms", |r| r.wall_ms = 9_000),
            ("gpu_ms", |r| r.gpu_ms = 0),
            ("cpu_ms", |r| r.cpu_ms = 4),
            ("energy_mj", |r| r.energy_mj = 4),
            ("net_rx_bytes", |r| r.net_rx_bytes = 4),
            ("net_tx_bytes", |r| r.net_tx_bytes = 4),
            ("amount_due", |r| r.amount_due = 0),
        ];
        for (i, (name, set)) in setters.iter().enumerate() {
            let mut next = first.clone();
            (next.seq, next.cpu_ms, next.energy_mj) = (2, 5, 5);
            (next.net_rx_bytes, next.net_tx_bytes) = (5, 5);
            set(&mut next);
            // Every later meter goes back too: the first is named.
            for (_, later) in &setters[i + 1..] {
                later(&mut next);
            }
            assert_eq!(
                check_usage(&f.terms, f.id, Some(&first), &next, &f.provider, 20_000),
                Err(UsageError::MeterDecreased { meter: name }),
                "{name}"
            );
        }
        let mut same = first.clone();
        same.seq = 2;
        assert_eq!(
            check_usage(&f.terms, f.id, Some(&first), &same, &f.provider, 20_000),
            Ok(())
        );
    }

    #[test]
    fn no_report_may_claim_more_than_the_duration() {
        let f = fx();
        let duration_ms = u64::from(f.terms.duration_s) * 1000;
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        // The renter's clock is well past the deadline; the claim is 1 ms beyond the lease.
        let mut over = report(&f, 1, duration_ms + 1);
        over.exit_code = Some(137);
        over.amount_due = Tariff::of(&f.terms)
            .final_due(duration_ms)
            .unwrap()
            .micros();
        assert!(matches!(
            renter.on_usage(&over, &f.provider, duration_ms + 60_000, T0),
            Err(UsageError::WallTimeInflated { .. })
        ));
        // The same usage capped by the provider is the whole lease, paid exactly.
        let mut capped = report(&f, 1, duration_ms);
        capped.exit_code = Some(137);
        capped.amount_due = Tariff::of(&f.terms)
            .final_due(duration_ms)
            .unwrap()
            .micros();
        let r = renter
            .on_usage(&capped, &f.provider, duration_ms + 60_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(
            r.total_paid,
            crate::billing::cost(
                u64::from(f.terms.duration_s),
                f.terms.gpu_count,
                Money::from_micros(f.terms.price_per_gpu_hour)
            )
            .unwrap()
            .micros()
            .min(f.terms.max_total)
        );
    }

    #[test]
    fn an_amended_lease_is_billed_and_checked_to_its_new_duration_and_cap() {
        let mut f = fx();
        f.terms.max_total = 600_000;
        // 600 s lease, cap 600 s of cost; extended to 900 s with the cap raised to match.
        let old_ms = u64::from(f.terms.duration_s) * 1000;
        let mut amended = f.terms.clone();
        amended.duration_s = 900;
        amended.max_total = 900_000;
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
        // Before the amendment a report past the old duration is refused and the old tariff caps.
        let mut past = report(&f, 1, old_ms + 10_000);
        past.amount_due = 610_000;
        assert!(matches!(
            renter
                .clone()
                .on_usage(&past, &f.provider, old_ms + 10_000, T0),
            Err(UsageError::WallTimeInflated { .. })
        ));
        assert_eq!(
            provider.tariff().due(old_ms + 10_000).unwrap().micros(),
            600_000
        );
        renter.amend(&amended);
        provider.amend(&amended);
        assert_eq!(
            provider.tariff().due(old_ms + 10_000).unwrap().micros(),
            610_000
        );
        let r = renter
            .on_usage(&past, &f.provider, old_ms + 10_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, 610_000);
        provider.accept_receipt(&f.renter, &r, T0).unwrap();
        assert_eq!(
            provider.decide(old_ms + 10_000, T0).unwrap(),
            Decision::Continue,
            "the old cap no longer stops it"
        );
        // The final report is capped at the new duration, exactly.
        let mut last = report(&f, 2, 900_000);
        last.exit_code = Some(137);
        last.amount_due = Tariff::of(&amended).final_due(900_000).unwrap().micros();
        let r = renter
            .on_usage(&last, &f.provider, 960_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, 900_000);
        let mut over = report(&f, 3, 900_001);
        over.amount_due = 900_000;
        assert!(renter.on_usage(&over, &f.provider, 960_000, T0).is_err());
    }

    #[test]
    fn a_report_capped_by_the_previous_budget_still_passes_after_an_amendment() {
        let mut f = fx();
        f.terms.max_total = 30_000; // a tight cap: 30 s of use
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        // The provider signed this at 40 s under the old cap, then accepted the amendment.
        let mut capped = report(&f, 1, 40_000);
        capped.amount_due = Tariff::of(&f.terms).due(40_000).unwrap().micros();
        assert_eq!(capped.amount_due, 30_000);
        let mut amended = f.terms.clone();
        amended.duration_s = 900;
        amended.max_total = 330_000;
        renter.amend(&amended);
        let r = renter
            .on_usage(&capped, &f.provider, 40_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, 30_000);
        // The next one is billed under the new cap.
        let next = report(&f, 2, 50_000);
        let mut next = next;
        next.amount_due = Tariff::of(&amended).due(50_000).unwrap().micros();
        assert_eq!(
            renter
                .on_usage(&next, &f.provider, 50_000, T0)
                .unwrap()
                .unwrap()
                .total_paid,
            50_000
        );
        // But an amount valid under neither is refused.
        let mut wrong = report(&f, 3, 60_000);
        wrong.amount_due = 65_000;
        assert!(matches!(
            renter.on_usage(&wrong, &f.provider, 60_000, T0),
            Err(UsageError::AmountMismatch { .. })
        ));
    }

    #[test]
    fn final_report_may_apply_minimum_billing() {
        let f = fx();
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let mut last = report(&f, 1, 5_000);
        last.exit_code = Some(0);
        last.amount_due = Tariff::of(&f.terms).final_due(5_000).unwrap().micros();
        let r = renter
            .on_usage(&last, &f.provider, 5_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, 60_000);
    }

    proptest! {
        /// Whatever receipts a renter (honest, buggy or hostile) sends, the provider only ever
        /// accepts strictly increasing (seq, total) pairs; every replay of an accepted receipt and
        /// every older receipt is rejected, and the booked sum equals the final statement.
        #[test]
        fn replayed_or_older_receipts_are_always_rejected(
            raw in proptest::collection::vec((0u64..20, 0u64..200_000), 1..60),
        ) {
            let f = fx();
            let mut p = ProviderChannel::new(f.id, &f.terms, T0);
            let mut accepted: Vec<PaymentReceipt> = Vec::new();
            let mut booked = Money::ZERO;
            for (seq, total) in raw {
                let r = fixtures::receipt(f.id, seq, total, 0);
                let before = p.last_receipt().cloned();
                match p.accept_receipt(&f.renter, &r, T0) {
                    Ok(delta) => {
                        if let Some(b) = &before {
                            prop_assert!(r.seq > b.seq && r.total_paid > b.total_paid);
                        }
                        booked = booked.checked_add(delta).unwrap();
                        accepted.push(r);
                    }
                    Err(_) => prop_assert_eq!(p.last_receipt().cloned(), before),
                }
            }
            for old in &accepted {
                prop_assert!(p.accept_receipt(&f.renter, old, T0).is_err());
            }
            prop_assert_eq!(booked, p.paid());
        }
    }

    proptest! {
        /// However usage grows and whenever receipts arrive, a provider that follows `decide`
        /// never has more than one window of cost (plus one second) unpaid.
        #[test]
        fn provider_exposure_is_bounded_by_one_window(
            paid_upto in proptest::collection::vec(0u64..600_000, 1..20),
            step_ms in 100u64..5_000,
        ) {
            let f = fx();
            let mut p = ProviderChannel::new(f.id, &f.terms, T0);
            let mut seq = 0;
            let mut wall = 0u64;
            let mut paid_marks = paid_upto.clone();
            paid_marks.sort_unstable();
            loop {
                if p.decide(wall, T0).unwrap() != Decision::Continue {
                    break;
                }
                prop_assert!(p.unpaid_exposure(wall).unwrap() <= p.exposure_bound().unwrap());
                if let Some(&m) = paid_marks.first()
                    && m <= wall
                {
                    paid_marks.remove(0);
                    let due = p.tariff().due(m).unwrap();
                    if due > p.paid() {
                        seq += 1;
                        p.accept_receipt(&f.renter, &fixtures::receipt(f.id, seq, due.micros(), m), T0).unwrap();
                    }
                }
                wall += step_ms;
                if wall > 600_000 { break; }
            }
            let window = p.exposure_bound().unwrap();
            let one_step = p.tariff().window_cost(step_ms / 1000 + 1).unwrap();
            prop_assert!(p.unpaid_exposure(wall).unwrap() <= window.checked_add(one_step).unwrap());
        }
    }

    /// One step of an interleaving: time passes, the provider reports, the report and the
    /// receipt may each be lost, the renter may be away.
    #[derive(Debug, Clone)]
    struct Step {
        dt_ms: u64,
        report_lost: bool,
        receipt_lost: bool,
        renter_away: bool,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            (100u64..15_000, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
                |(dt_ms, report_lost, receipt_lost, renter_away)| Step {
                    dt_ms,
                    report_lost,
                    receipt_lost,
                    renter_away,
                },
            ),
            1..80,
        )
    }

    proptest! {
        /// For any prepay, any interleaving of reports, receipts, losses and silence: the
        /// renter never pays more than the usage it was shown plus what it pre-authorised; the
        /// provider, following `decide`, never runs with more than one window unpaid; the
        /// settlement is at most what was paid and at most what the provider's last report
        /// claims.
        #[test]
        fn both_sides_exposure_is_bounded_for_any_prepay_and_interleaving(
            prepay_s in prop_oneof![Just(0u32), 1u32..700, Just(gridlease_protocol::PREPAY_ALL)],
            plan in steps(),
        ) {
            let mut f = fx();
            f.terms.prepay_s = prepay_s;
            let tariff = Tariff::of(&f.terms);
            let mut renter = RenterChannel::new(f.id, f.terms.clone());
            let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
            let (mut now, mut wall, mut seq) = (T0, 0u64, 0u64);
            let mut last_report = None;
            for st in plan {
                now = now.plus_ms(st.dt_ms);
                wall = (wall + st.dt_ms).min(tariff.max_wall_ms);
                match provider.decide(wall, now).unwrap() {
                    Decision::Stop(_) => break,
                    Decision::Continue => {}
                }
                prop_assert!(provider.unpaid_exposure(wall).unwrap() <= provider.exposure_bound().unwrap());
                seq += 1;
                let u = report(&f, seq, wall);
                last_report = Some(u.clone());
                if st.report_lost || st.renter_away {
                    continue;
                }
                let elapsed = now.ms_since(T0);
                if let Some(r) = renter.on_usage(&u, &f.provider, elapsed, now).unwrap() {
                    // Renter: paid at most the shown usage plus the prepay.
                    let shown = tariff.due(wall).unwrap();
                    prop_assert!(renter.paid() <= tariff.receipt_total(shown));
                    prop_assert!(renter.prepaid_exposure(wall).unwrap() <= tariff.prepaid_beyond(shown));
                    if !st.receipt_lost {
                        provider.accept_receipt(&f.renter, &r, now).unwrap();
                    }
                } else {
                    provider.heard_from_renter(now);
                }
            }
            let settled = provider.settlement(last_report.as_ref());
            prop_assert!(settled <= provider.paid());
            if let Some(u) = &last_report {
                prop_assert!(settled.micros() <= u.amount_due);
            }
            prop_assert!(renter.settlement() <= renter.paid());
        }

        /// A renter that prepaid the whole lease and then went silent for good: the provider
        /// never stops it for the silence; it runs to its duration (or budget).
        #[test]
        fn a_lease_prepaid_in_full_survives_any_renter_silence(
            first_ms in 1_000u64..20_000,
            step_ms in 500u64..30_000,
        ) {
            let mut f = fx();
            f.terms.prepay_s = gridlease_protocol::PREPAY_ALL;
            let mut renter = RenterChannel::new(f.id, f.terms.clone());
            let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
            let r = renter
                .on_usage(&report(&f, 1, first_ms), &f.provider, first_ms, T0.plus_ms(first_ms))
                .unwrap()
                .unwrap();
            prop_assert_eq!(r.total_paid, f.terms.max_total);
            provider.accept_receipt(&f.renter, &r, T0.plus_ms(first_ms)).unwrap();
            let end = Tariff::of(&f.terms).max_wall_ms;
            let mut wall = first_ms;
            while wall < end {
                let d = provider.decide(wall, T0.plus_ms(wall)).unwrap();
                prop_assert!(
                    d != Decision::Stop(CloseReason::RenterUnreachable),
                    "stopped for silence at {} ms", wall
                );
                wall += step_ms;
            }
        }

        /// A renter that prepaid `prepay_s` and went silent: the provider keeps running while
        /// prepaid time is left and stops for the silence once it is used up (the grace has long
        /// passed), never later than one usage step after.
        #[test]
        fn a_partial_prepay_runs_out_then_the_silence_stops_the_lease(
            prepay_s in 60u32..400,
            step_ms in 500u64..5_000,
        ) {
            let mut f = fx();
            f.terms.prepay_s = prepay_s;
            let tariff = Tariff::of(&f.terms);
            let mut renter = RenterChannel::new(f.id, f.terms.clone());
            let mut provider = ProviderChannel::new(f.id, &f.terms, T0);
            let first = 10_000;
            let r = renter
                .on_usage(&report(&f, 1, first), &f.provider, first, T0.plus_ms(first))
                .unwrap()
                .unwrap();
            provider.accept_receipt(&f.renter, &r, T0.plus_ms(first)).unwrap();
            // Paid through first + prepay_s seconds of use.
            let covered_ms = first + u64::from(prepay_s) * 1000;
            let mut wall = first;
            let stopped_at = loop {
                match provider.decide(wall, T0.plus_ms(wall)).unwrap() {
                    Decision::Continue => {}
                    Decision::Stop(reason) => break (wall, reason),
                }
                wall += step_ms;
                prop_assert!(wall < tariff.max_wall_ms + 10 * step_ms, "never stopped");
            };
            let grace_ms = u64::from(f.terms.grace_s) * 1000;
            prop_assert_eq!(stopped_at.1, CloseReason::RenterUnreachable);
            prop_assert!(covered_ms > first + grace_ms);
            prop_assert!(stopped_at.0 >= covered_ms, "stopped at {} ms, covered {}", stopped_at.0, covered_ms);
            prop_assert!(stopped_at.0 < covered_ms + step_ms + 1000, "stopped at {} ms, covered {}", stopped_at.0, covered_ms);
        }
    }

    #[test]
    fn a_prepaid_receipt_settles_at_the_providers_last_report() {
        let mut f = fx();
        f.terms.prepay_s = 120;
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let u = report(&f, 1, 10_000);
        let r = renter
            .on_usage(&u, &f.provider, 10_000, T0.plus_secs(10))
            .unwrap()
            .unwrap();
        // 10 s used + 120 s ahead at 1000 micro-units a second.
        assert_eq!(r.total_paid, 130_000);
        assert_eq!(
            renter.prepaid_exposure(10_000).unwrap(),
            Money::from_micros(120_000)
        );
        assert_eq!(renter.settlement(), Money::from_micros(10_000));
        let mut p = ProviderChannel::new(f.id, &f.terms, T0);
        p.accept_receipt(&f.renter, &r, T0.plus_secs(10)).unwrap();
        let later = report(&f, 2, 50_000);
        assert_eq!(p.settlement(Some(&later)), Money::from_micros(50_000));
        assert_eq!(p.settlement(None), Money::from_micros(130_000));
        // In arrears the receipt is what is owed.
        let f = fx();
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let r = renter
            .on_usage(&report(&f, 1, 10_000), &f.provider, 10_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, 10_000);
        assert_eq!(renter.settlement(), Money::from_micros(10_000));
        // The whole budget at once with PREPAY_ALL.
        let mut f = fx();
        f.terms.prepay_s = gridlease_protocol::PREPAY_ALL;
        let mut renter = RenterChannel::new(f.id, f.terms.clone());
        let r = renter
            .on_usage(&report(&f, 1, 10_000), &f.provider, 10_000, T0)
            .unwrap()
            .unwrap();
        assert_eq!(r.total_paid, f.terms.max_total);
    }
}
