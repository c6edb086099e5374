//! Proof of GPU (issue 44): the rules of the challenge a renter runs at the start of its own
//! lease. The wire messages are `gridlease_protocol::proof`; `docs/gpu.md` explains the design,
//! the parameters and the threat model.
//!
//! Pure functions: the seed and the reveal are parameters (the renter's node draws them), the
//! timing is the renter's measurement. [`openings`] says what the reveal opens, [`check`]
//! gives the verdict on a transcript, [`check_record`] re-checks a kept record with nothing
//! but the record and the two keys (what `gridlease verify` runs).

pub mod data;
pub mod merkle;
pub mod params;

use gridlease_protocol::proof::{
    ProofBackend, ProofChallenge, ProofCommit, ProofFailure, ProofIndex, ProofOpening, ProofRecord,
    ProofReport, ProofTiming, ProofVerdict, envelope_hash,
};
use gridlease_protocol::{Digest, NetworkId, PublicKey, Signed};

/// BLAKE3 of a reveal: what the challenge carries before the reveal is sent.
pub fn reveal_hash(reveal: &[u8; 32]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"gl-proof-v1/reveal");
    h.update(reveal);
    Digest(*h.finalize().as_bytes())
}

/// The indices a reveal opens for a challenge and a commitment (named by its hash): for each
/// GEMM in order, `open_rows` distinct rows in ascending order, then `open_pages` distinct
/// pages in ascending order. Neither side can steer them: the renter fixed the reveal (by
/// its hash) before it saw the commitment, and the provider committed before it saw the
/// reveal.
pub fn openings(c: &ProofChallenge, commit: &Digest, reveal: &[u8; 32]) -> Vec<ProofIndex> {
    let p = &c.params;
    let mut h = blake3::Hasher::new_keyed(&c.seed);
    h.update(b"gl-proof-v1/open");
    h.update(&commit.0);
    h.update(reveal);
    let mut xof = h.finalize_xof();
    let mut draw = |below: u64| -> u64 {
        // Rejection sampling: uniform below `below`.
        let zone = u64::MAX - u64::MAX % below;
        loop {
            let mut b = [0u8; 8];
            xof.fill(&mut b);
            let v = u64::from_le_bytes(b);
            if v < zone {
                return v % below;
            }
        }
    };
    let mut out = Vec::new();
    for gemm in 0..p.gemms {
        let rows = sample(&mut draw, u64::from(p.rows), u64::from(p.open_rows));
        out.extend(rows.into_iter().map(|r| ProofIndex::Row {
            gemm,
            row: r as u32,
        }));
    }
    let pages = p.vram_bytes / u64::from(p.page_bytes.max(1));
    let picked = sample(&mut draw, pages, u64::from(p.open_pages));
    out.extend(picked.into_iter().map(|page| ProofIndex::Page { page }));
    out
}

/// `k` distinct values below `n` (all of them when `k >= n`), ascending.
fn sample(draw: &mut impl FnMut(u64) -> u64, n: u64, k: u64) -> Vec<u64> {
    if k >= n {
        return (0..n).collect();
    }
    let mut picked = std::collections::BTreeSet::new();
    while (picked.len() as u64) < k {
        picked.insert(draw(n));
    }
    picked.into_iter().collect()
}

/// A transcript as the renter holds it after the openings (or after whichever step the
/// provider failed to answer).
pub struct Transcript<'a> {
    /// The challenge (the renter's own: it knows it).
    pub challenge: &'a ProofChallenge,
    /// Hash of the signed challenge.
    pub challenge_hash: Digest,
    /// The provider's commitment, verified as signed by the provider, and its hash.
    pub commit: Option<(&'a ProofCommit, Digest)>,
    /// The reveal.
    pub reveal: &'a [u8; 32],
    /// The provider's openings, verified as signed by the provider, and their hash.
    pub opening: Option<(&'a ProofOpening, Digest)>,
    /// The renter's measurements.
    pub timing: ProofTiming,
}

/// The verdict on a transcript: the first part that fails, in this order: the commitment
/// answers this challenge (lease, challenge hash, backend, one root per GEMM), the fill is as
/// large as asked, the openings answer this commitment and open exactly [`openings`], every
/// path leads to its root, every opened row is the true row, every opened page the true page,
/// and the commitment came within the limit. The expensive part (regenerating `B` and
/// computing the opened rows) runs only when everything before it held.
pub fn check(t: &Transcript<'_>) -> ProofVerdict {
    match check_inner(t) {
        Ok(()) => ProofVerdict::Passed,
        Err(f) => ProofVerdict::Failed(f),
    }
}

fn check_inner(t: &Transcript<'_>) -> Result<(), ProofFailure> {
    let c = t.challenge;
    let p = &c.params;
    let Some((commit, commit_hash)) = t.commit else {
        return Err(ProofFailure::NoAnswer {
            step: "commitment".into(),
        });
    };
    let bad_commit = |detail: String| Err(ProofFailure::BadCommit { detail });
    if commit.lease_id != c.lease_id {
        return bad_commit("it names another lease".into());
    }
    if commit.challenge != t.challenge_hash {
        return bad_commit("it answers another challenge (a replayed commitment)".into());
    }
    if commit.backend != c.backend {
        return bad_commit(format!(
            "computed by {}, the offer advertises {}",
            commit.backend, c.backend
        ));
    }
    if commit.gemm_roots.len() != p.gemms as usize {
        return bad_commit(format!(
            "{} GEMM roots for {} GEMMs",
            commit.gemm_roots.len(),
            p.gemms
        ));
    }
    if commit.vram_bytes < p.vram_bytes {
        return Err(ProofFailure::VramShort {
            filled: commit.vram_bytes,
            required: p.vram_bytes,
        });
    }
    let Some((opening, _)) = t.opening else {
        return Err(ProofFailure::NoAnswer {
            step: "openings".into(),
        });
    };
    let bad_opening = |detail: String| Err(ProofFailure::BadOpening { detail });
    if opening.lease_id != c.lease_id || opening.commit != commit_hash {
        return bad_opening("they open another commitment".into());
    }
    let want = openings(c, &commit_hash, t.reveal);
    if opening.leaves.len() != want.len()
        || opening.leaves.iter().zip(&want).any(|(l, w)| l.index != *w)
    {
        return bad_opening(format!(
            "{} leaves, not the {} the reveal picks",
            opening.leaves.len(),
            want.len()
        ));
    }
    // Every path first (cheap): a leaf must be in the committed tree.
    let pages = p.vram_bytes / u64::from(p.page_bytes);
    let (mut bad_paths, mut first_bad) = (0u32, None);
    for l in &opening.leaves {
        let (root, index, size) = match l.index {
            ProofIndex::Row { gemm, row } => (
                commit.gemm_roots[gemm as usize],
                u64::from(row),
                u64::from(p.rows),
            ),
            ProofIndex::Page { page } => (commit.vram_root, page, pages),
        };
        if !merkle::verify(&l.leaf, index, size, &l.path, &root) {
            bad_paths += 1;
            first_bad.get_or_insert(l.index);
        }
    }
    if let Some(first) = first_bad {
        return Err(ProofFailure::BadPaths {
            bad: bad_paths,
            first,
        });
    }
    // The opened rows against the renter's own product.
    let b = data::b_matrix(&c.seed, p.n);
    let (mut wrong, mut opened, mut first) = (0u32, 0u32, None);
    let (mut wrong_pages, mut pages_opened, mut first_page) = (0u32, 0u32, None);
    for l in &opening.leaves {
        match l.index {
            ProofIndex::Row { gemm, row } => {
                opened += 1;
                if data::true_row_leaf(&c.seed, p.n, &b, gemm, row) != l.leaf {
                    wrong += 1;
                    first.get_or_insert(l.index);
                }
            }
            ProofIndex::Page { page } => {
                pages_opened += 1;
                if data::true_page_leaf(&c.seed, p.page_bytes, page) != l.leaf {
                    wrong_pages += 1;
                    first_page.get_or_insert(l.index);
                }
            }
        }
    }
    if let Some(first) = first {
        return Err(ProofFailure::WrongRows {
            wrong,
            opened,
            first,
        });
    }
    if let Some(first) = first_page {
        return Err(ProofFailure::WrongPages {
            wrong: wrong_pages,
            opened: pages_opened,
            first,
        });
    }
    let took_ms = t.timing.commit_ms.saturating_sub(t.timing.rtt_ms);
    if took_ms > p.limit_ms {
        return Err(ProofFailure::TooSlow {
            took_ms,
            limit_ms: p.limit_ms,
        });
    }
    Ok(())
}

/// One sentence for a person: which part failed, by how much (the caller adds what was
/// charged).
pub fn explain(v: &ProofVerdict, backend: ProofBackend) -> String {
    let f = match v {
        ProofVerdict::Passed => return format!("GPU check passed ({})", backend.label()),
        ProofVerdict::Failed(f) => f,
    };
    let index = |i: &ProofIndex| match i {
        ProofIndex::Row { gemm, row } => format!("row {row} of GEMM {gemm}"),
        ProofIndex::Page { page } => format!("VRAM page {page}"),
    };
    match f {
        ProofFailure::NoAnswer { step } => {
            format!("GPU check failed: the provider did not answer with its {step} in time")
        }
        ProofFailure::BadCommit { detail } => {
            format!(
                "GPU check failed: the provider's commitment is not for this challenge: {detail}"
            )
        }
        ProofFailure::BadOpening { detail } => {
            format!("GPU check failed: the provider's openings are not the ones asked: {detail}")
        }
        ProofFailure::WrongRows {
            wrong,
            opened,
            first,
        } => format!(
            "GPU check failed: {wrong} of {opened} opened GEMM rows are wrong (first: {}): the provider did not compute the product it committed to",
            index(first)
        ),
        ProofFailure::BadPaths { bad, first } => format!(
            "GPU check failed: {bad} opened leaves are not in the committed Merkle tree (first: {})",
            index(first)
        ),
        ProofFailure::WrongPages {
            wrong,
            opened,
            first,
        } => format!(
            "GPU check failed: {wrong} of {opened} opened VRAM pages are wrong (first: {}): the provider did not hold the fill it committed to",
            index(first)
        ),
        ProofFailure::VramShort { filled, required } => format!(
            "GPU check failed: the provider filled {:.2} GiB of VRAM, the advertised GPUs must hold {:.2} GiB",
            *filled as f64 / f64::from(1u32 << 30),
            *required as f64 / f64::from(1u32 << 30)
        ),
        ProofFailure::TooSlow { took_ms, limit_ms } => format!(
            "GPU check failed: the GEMMs took {:.2} s, {:.1}x the {:.2} s the advertised GPUs allow",
            *took_ms as f64 / 1000.0,
            *took_ms as f64 / (*limit_ms).max(1) as f64,
            *limit_ms as f64 / 1000.0
        ),
    }
}

/// Why a kept record does not hold.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// A signature is bad, or a message is signed by the wrong side.
    #[error("the GPU check's {what} is not validly signed by the {who}")]
    Signature {
        /// Which message.
        what: &'static str,
        /// Who should have signed it.
        who: &'static str,
    },
    /// The report names other messages than the record holds, or another lease.
    #[error("the GPU check's report does not name the messages kept with it: {0}")]
    Mismatch(&'static str),
    /// Re-checking the messages gives another verdict than the report states.
    #[error("the GPU check's report says {stated:?}; its messages give {found:?}")]
    Verdict {
        /// What the report states.
        stated: ProofVerdict,
        /// What the rules give.
        found: ProofVerdict,
    },
    /// The challenge's sizes are outside what any check uses.
    #[error("the GPU check's challenge has sizes no check uses: {0}")]
    Sizes(String),
    /// A pass without the provider's co-signature.
    #[error("the GPU check passed but the provider's co-signature is missing or wrong")]
    Ack,
}

/// Re-checks a kept record with nothing but the record, the network and the lease's two
/// keys: every signature, every hash the report names, the verdict recomputed from the
/// messages (with the renter's timing: the one part that is the renter's word), and a pass
/// co-signed by the provider. Returns the verdict.
pub fn check_record(
    r: &ProofRecord,
    net: &NetworkId,
    renter: &PublicKey,
    provider: &PublicKey,
) -> Result<ProofVerdict, RecordError> {
    let found = recheck(r, net, renter, provider)?;
    if found.passed() {
        let report = envelope_hash(&r.report);
        let lease = r.report.verify(net).map(|v| v.message.lease_id).ok();
        let ack = r.ack.as_ref().and_then(|a| a.verify(net).ok());
        let ok = ack.is_some_and(|a| {
            a.signer == *provider && Some(a.message.lease_id) == lease && a.message.report == report
        });
        if !ok {
            return Err(RecordError::Ack);
        }
    }
    Ok(found)
}

/// [`check_record`] without the provider's co-signature: what the provider runs on a report
/// before it co-signs it.
pub fn recheck(
    r: &ProofRecord,
    net: &NetworkId,
    renter: &PublicKey,
    provider: &PublicKey,
) -> Result<ProofVerdict, RecordError> {
    let signed_by = |ok: bool, what, who| {
        if ok {
            Ok(())
        } else {
            Err(RecordError::Signature { what, who })
        }
    };
    let challenge = r.challenge.verify(net).ok();
    signed_by(
        challenge.as_ref().is_some_and(|v| v.signer == *renter),
        "challenge",
        "renter",
    )?;
    let challenge = challenge
        .map(|v| v.message)
        .ok_or(RecordError::Mismatch("challenge"))?;
    // Its sizes within what any check opens, before anything is derived from them (a record
    // is anyone's input: `gridlease verify`).
    if let Err(e) = params::admit(&challenge.params, f64::MAX, u32::MAX, u64::MAX) {
        return Err(RecordError::Sizes(e.to_string()));
    }
    let report = r.report.verify(net).ok();
    signed_by(
        report.as_ref().is_some_and(|v| v.signer == *renter),
        "report",
        "renter",
    )?;
    let report: ProofReport = report
        .map(|v| v.message)
        .ok_or(RecordError::Mismatch("report"))?;
    let commit = match &r.commit {
        Some(s) => {
            let v = s.verify(net).ok();
            signed_by(
                v.as_ref().is_some_and(|v| v.signer == *provider),
                "commitment",
                "provider",
            )?;
            v.map(|v| (v.message, envelope_hash(s)))
        }
        None => None,
    };
    let opening = match &r.opening {
        Some(s) => {
            let v = s.verify(net).ok();
            signed_by(
                v.as_ref().is_some_and(|v| v.signer == *provider),
                "openings",
                "provider",
            )?;
            v.map(|v| (v.message, envelope_hash(s)))
        }
        None => None,
    };
    let challenge_hash = envelope_hash(&r.challenge);
    if report.lease_id != challenge.lease_id || report.challenge != challenge_hash {
        return Err(RecordError::Mismatch("challenge"));
    }
    if report.commit != commit.as_ref().map(|c| c.1) {
        return Err(RecordError::Mismatch("commitment"));
    }
    if report.opening != opening.as_ref().map(|o| o.1) {
        return Err(RecordError::Mismatch("openings"));
    }
    let t = Transcript {
        challenge: &challenge,
        challenge_hash,
        commit: commit.as_ref().map(|(c, h)| (c, *h)),
        reveal: &report.reveal,
        opening: opening.as_ref().map(|(o, h)| (o, *h)),
        timing: report.timing,
    };
    let found = check(&t);
    if found != report.verdict {
        return Err(RecordError::Verdict {
            stated: report.verdict,
            found,
        });
    }
    Ok(found)
}

/// Signs nothing, decides nothing: the leaf and path the prover opens for `index` from its
/// trees (`gemm_trees` in GEMM order, then the fill's tree). `None` for an index outside them.
pub fn open_leaf(
    gemm_trees: &[merkle::Tree],
    vram_tree: &merkle::Tree,
    index: ProofIndex,
) -> Option<gridlease_protocol::proof::ProofLeaf> {
    let (tree, i) = match index {
        ProofIndex::Row { gemm, row } => (gemm_trees.get(gemm as usize)?, u64::from(row)),
        ProofIndex::Page { page } => (vram_tree, page),
    };
    Some(gridlease_protocol::proof::ProofLeaf {
        index,
        leaf: tree.leaf(i)?,
        path: tree.path(i),
    })
}

/// The signed-challenge hash a commitment must name.
pub fn challenge_hash(c: &Signed<ProofChallenge>) -> Digest {
    envelope_hash(c)
}

#[cfg(test)]
mod tests;
