//! Heap bytes per offer held in an [`OfferBook`] (issue 19: a node holding 100k offers within
//! 150 MiB of RSS). A counting global allocator measures the live heap; the offers are those
//! the daemon benchmarks store (`node/examples/bench_support`: one provider each, 1-4 GPUs).
//!
//! `cargo bench -p gridlease-contracts --bench book_memory` (`GRIDLEASE_BENCH_OFFERS`, default
//! 100,000)
//!
//! Prints the live heap per offer of: the signed envelopes alone, the decoded offers alone, and
//! the book holding them (envelopes included).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs,
    unsafe_code
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use gridlease_contracts::book::OfferBook;
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{NetworkId, NodeKey, Offer, OfferId, Signed};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn offers(n: usize) -> Vec<(OfferId, Signed<Offer>, Offer)> {
    let net = NetworkId::devnet();
    (0..n)
        .map(|i| {
            let mut secret = [0u8; 32];
            secret[8..16].copy_from_slice(&(i as u64 + 1).to_be_bytes());
            let key = NodeKey::from_secret(secret);
            let offer = fixtures::offer(key.public(), 1, 1 + (i % 4) as u8, 350_000);
            let signed = Signed::sign(&key, &net, &offer).unwrap();
            let id = OfferId(signed.envelope().content_digest());
            (id, signed, offer)
        })
        .collect()
}

fn main() {
    let n: usize = std::env::var("GRIDLEASE_BENCH_OFFERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let per = |bytes: isize| bytes as f64 / n as f64;

    let start = live();
    let generated = offers(n);

    let before = live();
    let decoded: Vec<Offer> = generated.iter().map(|(_, _, o)| o.clone()).collect();
    let offer_bytes = live() - before;
    drop(decoded);

    let before = live();
    let signed: Vec<Signed<Offer>> = generated.iter().map(|(_, s, _)| s.clone()).collect();
    let envelope_bytes = live() - before;
    drop(signed);

    let mut book = OfferBook::with_capacity(n);
    let t = std::time::Instant::now();
    for (id, s, o) in generated {
        book.admit(s, o, id, T0).unwrap();
    }
    let admit_time = t.elapsed();
    let book_bytes = live() - start;
    println!("{n} offers, live heap per offer:");
    println!("  signed envelope alone {:>7.0} B", per(envelope_bytes));
    println!("  decoded Offer alone   {:>7.0} B", per(offer_bytes));
    println!(
        "  the book holding them {:>7.0} B  ({:.1} MiB in all)",
        per(book_bytes),
        book_bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "  admitting them took   {:>7.0} ns per offer",
        admit_time.as_nanos() as f64 / n as f64
    );
    assert_eq!(book.len(), n);
}
