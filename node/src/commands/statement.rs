//! `gridlease statement LEASE --out FILE`: a lease's statement, every signed message that says
//! what is owed, in one file; `gridlease verify FILE`: checks one with no node and no network
//! (`gridlease_contracts::statement`; the format is in docs/billing.md).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use gridlease_contracts::money::UNIT;
use gridlease_contracts::statement::{Verdict, verify};
use gridlease_protocol::statement::{MAX_STATEMENT_BYTES, Statement};
use serde::Serialize;

use crate::api::client::ApiClient;
use crate::lease::wallet::{LaneView, SignedVoucher};
use crate::output::Printer;

/// Arguments of `gridlease statement`.
#[derive(Debug, Args)]
pub struct StatementArgs {
    /// Lease id (or its first digits).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Where to write the statement (refuses to overwrite an existing file).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Arguments of `gridlease verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A statement file written by `gridlease statement`.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// What a valid statement says, for people and for `--json`.
#[derive(Debug, Serialize)]
pub struct VerdictView {
    /// The file checked (or written).
    pub file: String,
    /// Always true: an invalid statement is an error.
    pub valid: bool,
    /// Lease id (hex).
    pub lease_id: String,
    /// The network it lives on.
    pub network: String,
    /// The provider's peer id.
    pub provider: String,
    /// The renter's peer id.
    pub renter: String,
    /// GPUs leased.
    pub gpus: u16,
    /// Price per GPU-hour, decimal.
    pub price_per_gpu_hour: String,
    /// Duration, seconds (amendments applied).
    pub duration_s: u32,
    /// Budget cap, decimal (amendments applied).
    pub max_total: String,
    /// Accepted amendments.
    pub amendments: usize,
    /// Whether the signed offer is included.
    pub offer_included: bool,
    /// Usage reports included.
    pub reports: usize,
    /// First and last report sequence numbers.
    pub report_seqs: Option<(u64, u64)>,
    /// Wall seconds of use the last report states.
    pub reported_wall_s: f64,
    /// The container's exit code, if the last report has one.
    pub exit_code: Option<i32>,
    /// What the renter signed to pay: owed by the renter to the provider, decimal.
    pub owed: String,
    /// What the last report says is due, decimal.
    pub reported_due: String,
    /// Reported but unpaid (no renter signature backs it), decimal.
    pub unpaid: String,
    /// The last receipt's sequence number.
    pub receipt_seq: Option<u64>,
    /// The GPU check at the start, re-checked: `passed`, `failed` or `none`.
    pub gpu_check: &'static str,
    /// The check in one sentence (what passed, or which part failed).
    pub gpu_check_summary: String,
    /// Seconds of unbilled verification the terms asked for (0: the renter skipped the check).
    pub verify_window_s: u32,
    /// The money unit.
    pub unit: &'static str,
    /// On-chain settlement (issue 50): the chain and the last receipt's voucher, checked.
    /// `None`: the lease settles in GLU only.
    pub settlement: Option<SettlementView>,
}

/// A statement's on-chain settlement: what the channel contract redeems.
#[derive(Debug, Serialize)]
pub struct SettlementView {
    /// Where the lease settles.
    #[serde(flatten)]
    pub lane: LaneView,
    /// The last receipt's voucher, its signature checked against the renter's wallet (none
    /// when nothing was paid).
    pub voucher: Option<SignedVoucher>,
    /// The chain's payment of it, as the provider's node recorded it (none: not redeemed, or
    /// the renter's statement). Not checked against the chain here.
    pub redemption: Option<RedeemedView>,
}

/// A statement's redemption.
#[derive(Debug, Serialize)]
pub struct RedeemedView {
    /// The transaction (`0x` and 64 hex digits; none: paid before, by one not seen).
    pub tx: Option<String>,
    /// Its block.
    pub block: u64,
    /// What the lane was paid in all (token units, decimal).
    pub paid: String,
    /// Whether that equals the voucher's claim (what the statement owes).
    pub equals_claim: bool,
}

impl SettlementView {
    fn of(v: &Verdict) -> Option<Self> {
        let s = v.terms.settlement.as_ref()?;
        let voucher = v
            .receipt
            .as_ref()
            .and_then(|r| SignedVoucher::of(s, &v.lease_id, r, v.last_report.as_ref()));
        let redemption = v.redemption.as_ref().map(|r| RedeemedView {
            tx: r.tx.map(|t| format!("0x{}", hex::encode(t))),
            block: r.block,
            paid: r.paid.to_string(),
            equals_claim: voucher
                .as_ref()
                .is_some_and(|vc| vc.claim == r.paid.to_string()),
        });
        Some(Self {
            lane: LaneView::of(s, &v.lease_id),
            voucher,
            redemption,
        })
    }

    fn sentence(&self) -> String {
        let paid = match &self.voucher {
            Some(v) => format!(
                "the last receipt's voucher signs {} token units, of which the provider claims {} (signature checked)",
                v.amount, v.claim
            ),
            None => "no voucher: nothing paid".into(),
        };
        let l = &self.lane;
        let redeemed = match &self.redemption {
            Some(r) => format!(
                "; redeemed by {} (block {}): the chain paid {} token units{} (per the provider's node; not checked against the chain here)",
                r.tx.as_deref().unwrap_or("an earlier transaction"),
                r.block,
                r.paid,
                if r.equals_claim {
                    ", the claim"
                } else {
                    ", NOT the claim"
                }
            ),
            None => String::new(),
        };
        format!(
            "settles on chain {} in token {} through {}: {paid}, from renter wallet {} to provider wallet {}, epoch {}{redeemed}",
            l.chain.chain_id,
            l.chain.token,
            l.chain.channel_contract,
            l.renter_wallet,
            l.provider_wallet,
            l.epoch
        )
    }
}

impl VerdictView {
    fn of(file: &Path, v: &Verdict) -> Self {
        let last = v.last_report.as_ref();
        Self {
            file: file.display().to_string(),
            valid: true,
            lease_id: v.lease_id.to_string(),
            network: v.network.as_str().to_string(),
            provider: v.terms.provider.to_string(),
            renter: v.terms.renter.to_string(),
            gpus: v.terms.gpu_count,
            price_per_gpu_hour: money_of(v.terms.price_per_gpu_hour),
            duration_s: v.terms.duration_s,
            max_total: money_of(v.terms.max_total),
            amendments: v.amendments,
            offer_included: v.offer_included,
            reports: v.reports,
            report_seqs: v.report_seqs,
            reported_wall_s: last.map_or(0.0, |r| r.wall_ms as f64 / 1000.0),
            exit_code: last.and_then(|r| r.exit_code),
            owed: v.owed.to_string(),
            reported_due: v.reported_due.to_string(),
            unpaid: v.unpaid.to_string(),
            receipt_seq: v.receipt.as_ref().map(|r| r.seq),
            gpu_check: match &v.gpu_check {
                Some(c) if c.passed() => "passed",
                Some(_) => "failed",
                None => "none",
            },
            gpu_check_summary: match (&v.gpu_check, v.terms.verify_window_s) {
                (Some(c), _) => gridlease_contracts::proof::explain(c, backend_of(v)),
                (None, 0) => {
                    "no GPU check: the renter skipped it (--no-verify) or the offer had none".into()
                }
                (None, _) => "no GPU check kept in this statement".into(),
            },
            verify_window_s: v.terms.verify_window_s,
            unit: UNIT,
            settlement: SettlementView::of(v),
        }
    }

    fn print(&self, p: &Printer, heading: &str) {
        p.line(heading);
        p.line(&format!(
            "lease {} on {}: {} GPU(s) at {} {UNIT}/GPU-hour for at most {} s (cap {} {UNIT}, {} amendment(s))",
            self.lease_id,
            self.network,
            self.gpus,
            self.price_per_gpu_hour,
            self.duration_s,
            self.max_total,
            self.amendments
        ));
        p.line(&format!("provider {}", self.provider));
        p.line(&format!("renter   {}", self.renter));
        let reports = match self.report_seqs {
            Some((a, b)) => format!("{} usage report(s), {a}-{b}", self.reports),
            None => "no usage reports".to_string(),
        };
        p.line(&format!(
            "{reports}; {:.0} s of use reported{}; offer {}",
            self.reported_wall_s,
            self.exit_code
                .map_or(String::new(), |c| format!(", exit code {c}")),
            if self.offer_included {
                "included"
            } else {
                "not included"
            }
        ));
        p.line(&format!(
            "owed {} {UNIT} (the renter's receipt {}); reported due {} {UNIT}, unpaid {} {UNIT}",
            self.owed,
            self.receipt_seq
                .map_or("-: nothing paid".to_string(), |s| s.to_string()),
            self.reported_due,
            self.unpaid
        ));
        p.line(&self.gpu_check_summary);
        p.line(&self.settlement.as_ref().map_or_else(
            || "settles in GLU only (no chain in the terms)".to_string(),
            SettlementView::sentence,
        ));
    }
}

/// The backend a verdict's check ran on, from the terms' offer when kept (for the sentence).
fn backend_of(v: &Verdict) -> gridlease_protocol::proof::ProofBackend {
    v.gpu_backend
        .unwrap_or(gridlease_protocol::proof::ProofBackend::Cuda)
}

fn money_of(micros: u64) -> String {
    gridlease_contracts::money::Money::from_micros(micros).to_string()
}

/// Fetches a lease's statement from the node, checks it, writes it.
pub async fn run_statement(
    api: &ApiClient,
    out: &Printer,
    args: &StatementArgs,
) -> anyhow::Result<u8> {
    let bytes = api.statement(&args.lease).await?;
    let statement = Statement::from_bytes(&bytes).context("the node answered no statement")?;
    // What this node signed or accepted is valid by construction; checked anyway, so that a
    // statement handed to a third party is one `verify` accepts.
    let verdict = verify(&statement).context("the node's own statement does not verify")?;
    write_new(&args.out, &bytes)?;
    let view = VerdictView::of(&args.out, &verdict);
    out.emit(&view, |p| {
        view.print(
            p,
            &format!(
                "wrote {} ({} bytes); check it with `gridlease verify {}`",
                args.out.display(),
                bytes.len(),
                args.out.display()
            ),
        )
    });
    Ok(0)
}

/// Checks a statement file: no node, no network.
pub fn run_verify(out: &Printer, args: &VerifyArgs) -> anyhow::Result<u8> {
    let bytes = read_capped(&args.file)?;
    let statement = Statement::from_bytes(&bytes)
        .with_context(|| format!("{} is not a valid statement", args.file.display()))?;
    let verdict = verify(&statement)
        .with_context(|| format!("{} is not a valid statement", args.file.display()))?;
    let view = VerdictView::of(&args.file, &verdict);
    out.emit(&view, |p| {
        view.print(
            p,
            &format!(
                "{}: valid (every signature and the arithmetic check)",
                args.file.display()
            ),
        )
    });
    Ok(0)
}

/// The file's bytes, refusing one larger than a statement can be before reading it.
fn read_capped(path: &Path) -> anyhow::Result<Vec<u8>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if len > MAX_STATEMENT_BYTES as u64 {
        anyhow::bail!(
            "{} is {len} bytes: not a statement (at most {MAX_STATEMENT_BYTES})",
            path.display()
        );
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, MAX_STATEMENT_BYTES as u64 + 1),
        &mut bytes,
    )
    .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(bytes)
}

/// Writes `bytes` to a new file `path` (never over an existing one), synced.
fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}
