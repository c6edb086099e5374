//! The simulator's offer book of one GPU class: the open offers renters currently see, ordered
//! by (price, provider), each carrying the snapshot fields the searches filter on.
//!
//! It replaces a `BTreeSet<(price, provider)>` plus a lookup of every entry's snapshot: the
//! entries live in short sorted blocks (a two-level B+tree), and each block knows the longest
//! `until` among its entries, so a search for a long job skips whole blocks of offers that end
//! too soon (the cheapest offers are mostly home GPUs about to go offline). Iteration order and
//! results are exactly those of the sorted set.

/// One open offer as renters see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    /// Posted price, micro-units per GPU-hour.
    pub(super) price: u64,
    /// Provider index.
    pub(super) provider: u32,
    /// The identity the offer is published under.
    pub(super) identity: u32,
    /// Latest lease end the offer allows, sim ms.
    pub(super) until: u64,
    /// Free GPUs.
    pub(super) free: u16,
}

impl Entry {
    fn key(&self) -> u128 {
        key(self.price, self.provider)
    }
}

/// (price, provider) packed so that keys compare in one instruction pair.
fn key(price: u64, provider: u32) -> u128 {
    (u128::from(price) << 32) | u128::from(provider)
}

/// Blocks split when they grow past this many entries.
const MAX_BLOCK: usize = 32;
/// Blocks shorter than this merge with a neighbour when the two fit in one.
const MIN_BLOCK: usize = MAX_BLOCK / 4;

/// Open offers of one class, cheapest first: sorted blocks of entries, with each block's
/// first key and longest `until` kept in dense arrays (searching and skipping blocks must not
/// touch the entries).
#[derive(Debug, Default)]
pub(super) struct OfferBook {
    blocks: Vec<Vec<Entry>>,
    firsts: Vec<u128>,
    max_until: Vec<u64>,
}

fn max_until(entries: &[Entry]) -> u64 {
    entries.iter().map(|e| e.until).max().unwrap_or(0)
}

impl OfferBook {
    /// An empty book.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// The block that holds (or would hold) `key`: the last block whose first key is <= key.
    fn block_for(&self, key: u128) -> usize {
        self.firsts.partition_point(|&f| f <= key).saturating_sub(1)
    }

    /// Adds an entry (its key must not be present).
    pub(super) fn insert(&mut self, e: Entry) {
        if self.blocks.is_empty() {
            self.blocks.push(Vec::with_capacity(MAX_BLOCK + 1));
            self.firsts.push(e.key());
            self.max_until.push(0);
        }
        let bi = self.block_for(e.key());
        let b = &mut self.blocks[bi];
        let at = b.partition_point(|x| x.key() < e.key());
        b.insert(at, e);
        self.max_until[bi] = self.max_until[bi].max(e.until);
        if at == 0 {
            self.firsts[bi] = e.key();
        }
        if b.len() > MAX_BLOCK {
            let mut tail = Vec::with_capacity(MAX_BLOCK + 1);
            tail.extend_from_slice(&b[MAX_BLOCK / 2..]);
            b.truncate(MAX_BLOCK / 2);
            self.max_until[bi] = max_until(b);
            self.firsts.insert(bi + 1, tail[0].key());
            self.max_until.insert(bi + 1, max_until(&tail));
            self.blocks.insert(bi + 1, tail);
        }
    }

    /// Removes the entry with key (`price`, `provider`); false when there is none.
    pub(super) fn remove(&mut self, price: u64, provider: u32) -> bool {
        if self.blocks.is_empty() {
            return false;
        }
        let key = key(price, provider);
        let bi = self.block_for(key);
        let b = &mut self.blocks[bi];
        let Ok(at) = b.binary_search_by(|x| x.key().cmp(&key)) else {
            return false;
        };
        let e = b.remove(at);
        if b.is_empty() {
            self.blocks.remove(bi);
            self.firsts.remove(bi);
            self.max_until.remove(bi);
            return true;
        }
        if at == 0 {
            self.firsts[bi] = b[0].key();
        }
        if e.until == self.max_until[bi] {
            self.max_until[bi] = max_until(b);
        }
        if b.len() < MIN_BLOCK && self.blocks.len() > 1 {
            // Merge with a neighbour when both fit in one block, so that blocks stay full.
            let left = if bi + 1 < self.blocks.len() {
                bi
            } else {
                bi - 1
            };
            if self.blocks[left].len() + self.blocks[left + 1].len() <= MAX_BLOCK {
                let right = self.blocks.remove(left + 1);
                self.firsts.remove(left + 1);
                let right_until = self.max_until.remove(left + 1);
                self.blocks[left].extend_from_slice(&right);
                self.max_until[left] = self.max_until[left].max(right_until);
            }
        }
        true
    }

    /// All entries, cheapest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.blocks.iter().flatten()
    }

    /// Entries, cheapest first, skipping whole blocks in which no entry has an `until` of at
    /// least `min_until` (entries that pass are not filtered: callers still check each one).
    pub(super) fn iter_until(&self, min_until: u64) -> impl Iterator<Item = &Entry> {
        self.blocks
            .iter()
            .zip(&self.max_until)
            .filter(move |&(_, &u)| u >= min_until)
            .flat_map(|(b, _)| b.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn entry(price: u64, provider: u32, until: u64, free: u16) -> Entry {
        Entry {
            price,
            provider,
            identity: provider,
            until,
            free,
        }
    }

    #[test]
    fn matches_a_sorted_map_under_random_updates() {
        let mut book = OfferBook::new();
        let mut model: BTreeMap<(u64, u32), Entry> = BTreeMap::new();
        let mut current: Vec<Option<u64>> = vec![None; 300];
        let mut x: u64 = 99;
        for step in 0..40_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let p = ((x >> 33) % 300) as u32;
            let price = (x >> 20) % 50;
            let until = (x >> 8) % 1000;
            let free = ((x >> 4) % 4) as u16;
            if let Some(old) = current[p as usize].take() {
                assert!(book.remove(old, p));
                model.remove(&(old, p));
            }
            assert!(!book.remove(price, p) || model.contains_key(&(price, p)));
            if !(x >> 2).is_multiple_of(3) {
                let e = entry(price, p, until, free);
                book.insert(e);
                model.insert((price, p), e);
                current[p as usize] = Some(price);
            }
            if step.is_multiple_of(97) {
                let got: Vec<Entry> = book.iter().copied().collect();
                let want: Vec<Entry> = model.values().copied().collect();
                assert_eq!(got, want);
                let mf = ((x >> 40) % 4) as u16;
                let mu = (x >> 44) % 1000;
                let got: Vec<Entry> = book
                    .iter_until(mu)
                    .filter(|e| e.free >= mf && e.until >= mu)
                    .copied()
                    .collect();
                let want: Vec<Entry> = model
                    .values()
                    .filter(|e| e.free >= mf && e.until >= mu)
                    .copied()
                    .collect();
                assert_eq!(got, want);
            }
        }
    }
}
