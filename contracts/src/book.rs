//! The offer book: every live offer this node knows, one per provider.
//!
//! Rules (DESIGN.md section 4, `Offer::seq`):
//! - an offer is admitted only after [`crate::terms::validate_offer`] passed;
//! - a higher sequence from the same provider replaces the held offer;
//! - the same sequence with the same content is a *refresh* (providers re-announce because
//!   gossip has no replay); the same sequence with other content is *equivocation*;
//! - a lower sequence is a *replay*;
//! - expired offers are evicted ([`OfferBook::evict_expired`]) and never returned by a search;
//! - the book is bounded: when full, expired offers go first, then the offer that expires
//!   soonest, but only if the newcomer lives longer; otherwise the newcomer is refused.
//!
//! Pure: time is a parameter; results do not depend on hash-map iteration order (searches scan a
//! vector and sort with a total order, ties broken by offer id).

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

use gridlease_protocol::{
    Envelope, FrameView, MessageKind, NetworkId, Offer, OfferId, PROTOCOL_VERSION, PublicKey,
    SignatureBytes, Signed, Timestamp, WireMessage,
};
use hashbrown::HashTable;

use crate::query::{Field, Numbers, OfferSummary, ProviderNumbers, Query};

/// Default capacity of a book.
pub const DEFAULT_BOOK_CAPACITY: usize = 200_000;

/// How many replaced offer ids a book remembers (FIFO), see [`OfferBook::replacement`].
pub const REPLACED_CAPACITY: usize = 16_384;

/// What the book remembers of an offer that a newer one from the same provider replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Replaced {
    provider: PublicKey,
    price_per_gpu_hour: u64,
    models_lower: String,
}

/// A replaced offer's provider's current offer, and how the two compare.
#[derive(Clone, Debug)]
pub struct Replacement {
    /// The provider's current offer.
    pub current: BookEntry,
    /// The old offer's price per GPU-hour, micro-units.
    pub old_price_per_gpu_hour: u64,
    /// Same GPU models at the same or a lower price: the current offer is what a renter holding
    /// the old id asked for (providers re-sign before expiry, so ids age out). Otherwise the
    /// renter has to look again.
    pub equivalent: bool,
}

/// One live offer as a lookup or a search returns it. The book keeps only the envelope and
/// the scanned numbers of each offer; an entry, with the decoded offer and its summary, is
/// built for each offer returned (see [`OfferBook`]).
#[derive(Clone, Debug)]
pub struct BookEntry {
    /// The offer's id (content digest of its envelope).
    pub id: OfferId,
    /// The decoded offer.
    pub offer: Offer,
    /// The signed envelope, exactly as received: what is persisted and re-served.
    pub signed: Signed<Offer>,
    /// What queries look at.
    pub summary: OfferSummary,
    /// When this node first admitted this sequence.
    pub received_at: Timestamp,
}

/// A position in a search's order: the last offer of a page, as its sort rank
/// ([`crate::query::SortKey::rank`]) and id. The next page is what sorts after it
/// ([`OfferBook::search_page`]), so offers admitted or removed between pages neither shift nor
/// repeat the others (keyset pagination). A cursor means something only under the sort it was
/// made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The sort rank of the last offer returned.
    pub rank: u64,
    /// Its id (ties in rank are ordered by id).
    pub id: OfferId,
}

impl Cursor {
    /// Length of [`Cursor`]'s text: 16 hex digits of rank, 64 of id.
    pub const TEXT_LEN: usize = 80;
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}{}", self.rank, self.id)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;

    /// The text [`Cursor`]'s `Display` writes: 80 hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a page cursor (80 hex digits, as a search returned it)");
        if s.len() != Self::TEXT_LEN || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let rank = u64::from_str_radix(&s[..16], 16).map_err(|_| bad())?;
        let id = s[16..].to_ascii_lowercase().parse().map_err(|_| bad())?;
        Ok(Self { rank, id })
    }
}

/// One page of a search: the offers, and where the next page starts when more match.
#[derive(Clone, Debug)]
pub struct Page {
    /// The offers, in the query's order.
    pub entries: Vec<BookEntry>,
    /// The cursor after the last entry, when more offers match; `None` on the last page.
    pub next: Option<Cursor>,
}

/// What [`OfferBook::admit`] would do with an offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// First offer from this provider.
    New,
    /// A higher sequence than the held one.
    Newer {
        /// The held sequence.
        held_seq: u64,
    },
    /// The held offer again, byte for byte (a re-announcement).
    Refresh,
}

/// Why the book refuses an offer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BookError {
    /// A lower sequence than the held offer.
    #[error("replayed offer: sequence {got} from {provider}, {held} already held")]
    Replay {
        /// The provider.
        provider: PublicKey,
        /// Sequence received.
        got: u64,
        /// Sequence held.
        held: u64,
    },
    /// The same sequence with other content.
    #[error("equivocation: provider {provider} signed two different offers with sequence {seq}")]
    Equivocation {
        /// The provider.
        provider: PublicKey,
        /// The sequence.
        seq: u64,
    },
    /// The offer is already expired.
    #[error("offer expired at {expires_at}")]
    Expired {
        /// Its expiry.
        expires_at: Timestamp,
    },
    /// The book is full of offers that live longer.
    #[error("offer book full ({capacity} offers)")]
    Full {
        /// The capacity.
        capacity: usize,
    },
}

/// Interned lower-cased strings (model lists, regions), reference counted so the table never
/// outgrows the book.
#[derive(Clone, Debug, Default)]
struct Interner {
    strings: Vec<String>,
    refs: Vec<u32>,
    ids: HashMap<String, u32>,
    free: Vec<u32>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            self.refs[id as usize] += 1;
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.strings[id as usize] = s.to_string();
                self.refs[id as usize] = 1;
                id
            }
            None => {
                self.strings.push(s.to_string());
                self.refs.push(1);
                u32::try_from(self.strings.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.ids.insert(s.to_string(), id);
        id
    }

    fn get(&self, id: u32) -> &str {
        self.strings.get(id as usize).map_or("", String::as_str)
    }

    fn release(&mut self, id: u32) {
        let i = id as usize;
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            let s = std::mem::take(&mut self.strings[i]);
            self.ids.remove(&s);
            self.free.push(id);
        }
    }
}

/// The hot part of an entry, scanned by searches: plain integers and interned text ids.
#[derive(Clone, Copy, Debug)]
struct Slot {
    numbers: Numbers,
    expires_at: Timestamp,
    model: u32,
    region: u32,
    /// The GPU class (`gridlease_protocol::class`), interned: book sync by class.
    class: u32,
    id: OfferId,
    provider: PublicKey,
}

/// The cold part of an entry, read only for the offers returned: the envelope exactly as
/// received (what is persisted, re-served and decoded for a [`BookEntry`]), held in parts. The
/// signer is the slot's provider (an offer is admitted only from its provider), and the
/// network is an index into the book's few network ids, so neither is stored per offer; the
/// payload is a boxed slice (no spare capacity).
#[derive(Clone, Debug)]
struct Held {
    signature: SignatureBytes,
    payload: Box<[u8]>,
    seq: u64,
    received_at: Timestamp,
    network: u32,
    version: u16,
    kind: MessageKind,
}

/// Providers to slot indexes: a hash table of indexes, hashed and compared by the provider key
/// in the slot they point at, so the key is stored once (in the slot).
#[derive(Clone, Debug, Default)]
struct ProviderIndex {
    table: HashTable<u32>,
    hasher: RandomState,
}

impl ProviderIndex {
    fn get(&self, slots: &[Slot], provider: &PublicKey) -> Option<u32> {
        let hash = self.hasher.hash_one(provider);
        self.table
            .find(hash, |&i| slots[i as usize].provider == *provider)
            .copied()
    }

    /// Adds slot `i`, whose provider is not indexed yet.
    fn insert(&mut self, slots: &[Slot], i: u32) {
        let Self { table, hasher } = self;
        let hash = hasher.hash_one(slots[i as usize].provider);
        table.insert_unique(hash, i, |&j| hasher.hash_one(slots[j as usize].provider));
    }

    /// Removes `provider`'s entry; returns its slot index.
    fn remove(&mut self, slots: &[Slot], provider: &PublicKey) -> Option<u32> {
        let hash = self.hasher.hash_one(provider);
        let entry = self
            .table
            .find_entry(hash, |&i| slots[i as usize].provider == *provider)
            .ok()?;
        Some(entry.remove().0)
    }

    /// Points the entry of the slot at `from` (still there) to `to`.
    fn repoint(&mut self, slots: &[Slot], from: u32, to: u32) {
        let hash = self.hasher.hash_one(slots[from as usize].provider);
        if let Some(i) = self.table.find_mut(hash, |&i| i == from) {
            *i = to;
        }
    }
}

/// The index of live offers.
///
/// Memory is the constraint (issue 19: 100,000 offers in a home node's budget), so each offer
/// is held once, compactly: a dense vector of [`Slot`]s (the 192 bytes a search scans, without
/// pointer chasing) and, at the same index, its signed envelope in parts ([`Held`]). The
/// indexes hold slot numbers, not keys: providers in a hash table of indexes
/// ([`ProviderIndex`]), ids in an ordered map (book sync and prefix lookups walk it in order),
/// expiry as (time, index). The decoded [`Offer`] is not
/// kept: it was a third of an offer's memory, and only the offers a lookup or search returns
/// need it, so [`BookEntry`]s are built (decoded again) for those. Indexes map providers and
/// ids to the index, and expiry to providers. Text conditions are evaluated once per distinct
/// interned string per search.
#[derive(Clone, Debug)]
pub struct OfferBook {
    capacity: usize,
    slots: Vec<Slot>,
    held: Vec<Held>,
    slot_of: ProviderIndex,
    by_id: BTreeMap<OfferId, u32>,
    by_expiry: BTreeSet<(Timestamp, u32)>,
    /// The network ids of the held envelopes (one in practice), indexed by [`Held::network`].
    networks: Vec<NetworkId>,
    text: Interner,
    /// Ids replaced by a newer offer of the same provider (bounded, FIFO).
    replaced: BTreeMap<OfferId, Replaced>,
    replaced_order: VecDeque<OfferId>,
    /// Providers' reputation, completed leases and passed GPU checks, as last set
    /// ([`OfferBook::set_reputation`]); applied to their offers' summaries.
    reputation: HashMap<PublicKey, ProviderNumbers>,
}

impl Default for OfferBook {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_BOOK_CAPACITY)
    }
}

impl OfferBook {
    /// An empty book holding at most `capacity` offers (at least 1, at most `u32::MAX`).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity: capacity.clamp(1, u32::MAX as usize),
            slots: Vec::new(),
            held: Vec::new(),
            slot_of: ProviderIndex::default(),
            by_id: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            networks: Vec::new(),
            text: Interner::default(),
            replaced: BTreeMap::new(),
            replaced_order: VecDeque::new(),
            reputation: HashMap::new(),
        }
    }

    /// Sets every provider's numbers (reputation per mille, completed leases, passed GPU
    /// checks) at once (the node recomputes them from completion records); the summaries of
    /// the offers held follow, and so do those admitted later. A provider not in `scores` gets
    /// [`ProviderNumbers::PRIOR`].
    pub fn set_reputation(&mut self, scores: HashMap<PublicKey, ProviderNumbers>) {
        self.reputation = scores;
        for slot in &mut self.slots {
            slot.numbers.provider = self
                .reputation
                .get(&slot.provider)
                .copied()
                .unwrap_or(ProviderNumbers::PRIOR);
        }
    }

    /// Offers held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when no offer is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The offer held at index `i`, decoded. `None` only if its payload no longer decodes,
    /// which cannot happen: it decoded when it was admitted, and the bytes are not changed.
    fn entry(&self, i: usize) -> Option<BookEntry> {
        let (slot, held) = (self.slots.get(i)?, self.held.get(i)?);
        let offer = Offer::decode_payload(&held.payload).ok()?;
        Some(BookEntry {
            id: slot.id,
            offer,
            signed: self.signed(i)?,
            summary: OfferSummary {
                numbers: slot.numbers,
                models_lower: self.text.get(slot.model).to_string(),
                region_lower: self.text.get(slot.region).to_string(),
            },
            received_at: held.received_at,
        })
    }

    /// The envelope of the offer at index `i`, put together from its parts: byte for byte
    /// the one admitted.
    fn signed(&self, i: usize) -> Option<Signed<Offer>> {
        let (slot, held) = (self.slots.get(i)?, self.held.get(i)?);
        Some(Signed::from_envelope(Envelope {
            version: held.version,
            kind: held.kind,
            network: self.networks.get(held.network as usize)?.clone(),
            signer: slot.provider,
            signature: held.signature,
            payload: held.payload.to_vec(),
        }))
    }

    fn index_of(&self, provider: &PublicKey) -> Option<usize> {
        self.slot_of.get(&self.slots, provider).map(|i| i as usize)
    }

    /// The index of `network` in [`OfferBook::networks`], added when new.
    fn network_index(&mut self, network: &NetworkId) -> u32 {
        let i = match self.networks.iter().position(|n| n == network) {
            Some(i) => i,
            None => {
                self.networks.push(network.clone());
                self.networks.len() - 1
            }
        };
        u32::try_from(i).unwrap_or(u32::MAX)
    }

    fn index_of_id(&self, id: &OfferId) -> Option<usize> {
        self.by_id.get(id).map(|&i| i as usize)
    }

    /// The offer held for `provider`.
    pub fn by_provider(&self, provider: &PublicKey) -> Option<BookEntry> {
        self.entry(self.index_of(provider)?)
    }

    /// The offer with this id, if it is still the provider's current one.
    pub fn get(&self, id: &OfferId) -> Option<BookEntry> {
        self.entry(self.index_of_id(id)?)
    }

    /// True when the offer with this id is its provider's current one here.
    pub fn contains(&self, id: &OfferId) -> bool {
        self.by_id.contains_key(id)
    }

    /// The id of the held offer that `frame` is a copy of, when that offer is still live at
    /// `now`: a received frame with the held offer's signer, signature bytes and payload is
    /// the held offer itself, which was verified and validated when it was admitted (see
    /// `gridlease_protocol::Signed::is_frame`), so a re-announcement is recognised with one
    /// lookup and a comparison: no hashing, no signature check, no cache of verified messages.
    pub fn holds_frame(&self, frame: &FrameView<'_>, now: Timestamp) -> Option<OfferId> {
        let i = self.index_of(&frame.signer)?;
        let (slot, held) = (&self.slots[i], &self.held[i]);
        // The signer matched through the index; the version and kind are the ones a frame
        // view accepts (`Signed::view_frame`).
        let same = held.signature == frame.signature
            && held.kind == Offer::KIND
            && held.version == PROTOCOL_VERSION
            && self
                .networks
                .get(held.network as usize)
                .is_some_and(|n| n.as_str() == frame.network())
            && *held.payload == *frame.payload;
        (slot.expires_at > now && same).then_some(slot.id)
    }

    /// The signed envelope of the offer with this id, as received (for re-serving it; no
    /// decoding).
    pub fn envelope(&self, id: &OfferId) -> Option<Signed<Offer>> {
        self.signed(self.index_of_id(id)?)
    }

    /// Every held offer, decoded, in no particular order.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = BookEntry> + '_ {
        (0..self.slots.len()).filter_map(|i| self.entry(i))
    }

    /// What admitting an offer with this id would do, without changing the book.
    pub fn check(
        &self,
        offer: &Offer,
        id: &OfferId,
        now: Timestamp,
    ) -> Result<Admission, BookError> {
        if offer.expires_at <= now {
            return Err(BookError::Expired {
                expires_at: offer.expires_at,
            });
        }
        let Some(i) = self.index_of(&offer.provider) else {
            return Ok(Admission::New);
        };
        let held_seq = self.held[i].seq;
        match offer.seq {
            seq if seq > held_seq => Ok(Admission::Newer { held_seq }),
            seq if seq < held_seq => Err(BookError::Replay {
                provider: offer.provider,
                got: seq,
                held: held_seq,
            }),
            _ if self.slots[i].id == *id => Ok(Admission::Refresh),
            _ => Err(BookError::Equivocation {
                provider: offer.provider,
                seq: offer.seq,
            }),
        }
    }

    /// Admits an offer that passed [`crate::terms::validate_offer`]. `id` must be the envelope's
    /// content digest and `offer` its decoded payload. A refresh changes nothing.
    pub fn admit(
        &mut self,
        signed: Signed<Offer>,
        offer: Offer,
        id: OfferId,
        now: Timestamp,
    ) -> Result<Admission, BookError> {
        let admission = self.check(&offer, &id, now)?;
        if admission == Admission::Refresh {
            return Ok(admission);
        }
        if admission == Admission::New && self.slots.len() >= self.capacity {
            self.evict_expired(now);
            if self.slots.len() >= self.capacity {
                let soonest = self.by_expiry.first().copied();
                match soonest {
                    Some((exp, i)) if exp < offer.expires_at => {
                        let provider = self.slots[i as usize].provider;
                        self.remove(&provider);
                    }
                    _ => {
                        return Err(BookError::Full {
                            capacity: self.capacity,
                        });
                    }
                }
            }
        }
        if let Some(i) = self.index_of(&offer.provider) {
            let old = self.slots[i];
            self.remember_replaced(&old);
            self.remove(&offer.provider);
        }
        let provider = offer.provider;
        // `validate_offer` refused any other signer; the envelope is kept without its signer,
        // which is put back from the provider.
        debug_assert_eq!(signed.signer(), provider, "admitted from its provider only");
        let mut summary = OfferSummary::of(&offer);
        if let Some(&numbers) = self.reputation.get(&provider) {
            summary.numbers.provider = numbers;
        }
        // At most `capacity` <= u32::MAX entries (`with_capacity`), so the index fits.
        let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let envelope = signed.into_envelope();
        let network = self.network_index(&envelope.network);
        self.slots.push(Slot {
            numbers: summary.numbers,
            expires_at: offer.expires_at,
            model: self.text.intern(&summary.models_lower),
            region: self.text.intern(&summary.region_lower),
            class: self
                .text
                .intern(&gridlease_protocol::class::offer_class(&offer)),
            id,
            provider,
        });
        self.held.push(Held {
            signature: envelope.signature,
            payload: envelope.payload.into_boxed_slice(),
            seq: offer.seq,
            received_at: now,
            network,
            version: envelope.version,
            kind: envelope.kind,
        });
        self.slot_of.insert(&self.slots, i);
        self.by_id.insert(id, i);
        self.by_expiry.insert((offer.expires_at, i));
        Ok(admission)
    }

    fn remember_replaced(&mut self, old: &Slot) {
        let r = Replaced {
            provider: old.provider,
            price_per_gpu_hour: old.numbers.price,
            models_lower: self.text.get(old.model).to_string(),
        };
        if self.replaced.insert(old.id, r).is_none() {
            self.replaced_order.push_back(old.id);
            if self.replaced_order.len() > REPLACED_CAPACITY
                && let Some(gone) = self.replaced_order.pop_front()
            {
                self.replaced.remove(&gone);
            }
        }
    }

    /// For an id that a newer offer of the same provider replaced, the provider's current offer
    /// and how it compares. `None` for ids never seen, forgotten, or whose provider has no
    /// current offer (expired, evicted).
    pub fn replacement(&self, old: &OfferId) -> Option<Replacement> {
        let r = self.replaced.get(old)?;
        let current = self.by_provider(&r.provider)?;
        let same_gpus = current.summary.models_lower == r.models_lower;
        let equivalent = same_gpus && current.offer.price_per_gpu_hour <= r.price_per_gpu_hour;
        Some(Replacement {
            current,
            old_price_per_gpu_hour: r.price_per_gpu_hour,
            equivalent,
        })
    }

    /// Remembered replaced ids whose hex form starts with `prefix`, at most `limit`.
    pub fn replaced_with_prefix(&self, prefix: &str, limit: usize) -> Vec<OfferId> {
        ids_with_prefix(&self.replaced, prefix, limit)
    }

    /// Ids of held offers live at `now`, in id order, after `after` (from the first with
    /// `None`), at most `limit`: a page of what this book holds, for book sync. Returns whether
    /// more follow.
    pub fn ids_after(
        &self,
        after: Option<&OfferId>,
        limit: usize,
        now: Timestamp,
    ) -> (Vec<OfferId>, bool) {
        self.ids_after_where(after, None, limit, now, |_| true)
    }

    /// The interned ids of `classes` held (`None`: every class, no filter). A class no
    /// offer held is of is left out, so `Some(empty)` matches nothing.
    fn class_filter(&self, classes: Option<&[String]>) -> Option<Vec<u32>> {
        classes.map(|cs| {
            cs.iter()
                .filter_map(|c| self.text.ids.get(c.as_str()).copied())
                .collect()
        })
    }

    /// The digest of each id bucket (an id's first byte; `gridlease_protocol::sync::id_digest`
    /// XORed over the bucket) of the live offers held at `now`, of the GPU classes `classes`
    /// (`None`: all): what two books compare before listing ids (book sync's anti-entropy).
    /// One pass over the offers held.
    pub fn bucket_digests(&self, classes: Option<&[String]>, now: Timestamp) -> Vec<u64> {
        let filter = self.class_filter(classes);
        let mut digests = vec![0u64; gridlease_protocol::sync::BUCKETS];
        for s in &self.slots {
            if s.expires_at > now && filter.as_ref().is_none_or(|f| f.contains(&s.class)) {
                digests[usize::from(s.id.0.0[0])] ^= gridlease_protocol::sync::id_digest(&s.id);
            }
        }
        digests
    }

    /// [`OfferBook::ids_after`] restricted to one id bucket (ids whose first byte is
    /// `bucket`) and to the GPU classes `classes` (`None`: all).
    pub fn bucket_ids_after(
        &self,
        classes: Option<&[String]>,
        bucket: u8,
        after: Option<&OfferId>,
        limit: usize,
        now: Timestamp,
    ) -> (Vec<OfferId>, bool) {
        let filter = self.class_filter(classes);
        let mut first = [0u8; 32];
        first[0] = bucket;
        let start = OfferId(gridlease_protocol::Digest(first));
        // From the bucket's first id (or after `after`, when that is in the bucket or later).
        let after = after.copied().filter(|a| *a >= start);
        let end = bucket.checked_add(1).map(|b| {
            let mut next = [0u8; 32];
            next[0] = b;
            OfferId(gridlease_protocol::Digest(next))
        });
        if let (Some(a), Some(e)) = (&after, &end)
            && a >= e
        {
            // Past the bucket (`BTreeMap::range` would panic on a reversed range).
            return (Vec::new(), false);
        }
        let lower = match &after {
            Some(a) => std::ops::Bound::Excluded(*a),
            None => std::ops::Bound::Included(start),
        };
        self.ids_in_range(lower, end, limit, now, |s| {
            filter.as_ref().is_none_or(|f| f.contains(&s.class))
        })
    }

    /// [`OfferBook::ids_after`] restricted to offers of the GPU classes `classes`
    /// (`gridlease_protocol::class`): a page for a node that follows only those.
    pub fn class_ids_after(
        &self,
        classes: &[String],
        after: Option<&OfferId>,
        limit: usize,
        now: Timestamp,
    ) -> (Vec<OfferId>, bool) {
        // Classes compared once per interned string, not once per offer.
        let wanted = self.class_filter(Some(classes)).unwrap_or_default();
        if wanted.is_empty() {
            return (Vec::new(), false);
        }
        self.ids_after_where(after, None, limit, now, |s| wanted.contains(&s.class))
    }

    fn ids_after_where(
        &self,
        after: Option<&OfferId>,
        end: Option<OfferId>,
        limit: usize,
        now: Timestamp,
        keep: impl Fn(&Slot) -> bool,
    ) -> (Vec<OfferId>, bool) {
        let lower = match after {
            Some(a) => std::ops::Bound::Excluded(*a),
            None => std::ops::Bound::Unbounded,
        };
        self.ids_in_range(lower, end, limit, now, keep)
    }

    /// Live ids held from `lower` to before `end` (`None`: the last), in order, at most
    /// `limit` of those `keep` takes; and whether more follow.
    fn ids_in_range(
        &self,
        lower: std::ops::Bound<OfferId>,
        end: Option<OfferId>,
        limit: usize,
        now: Timestamp,
        keep: impl Fn(&Slot) -> bool,
    ) -> (Vec<OfferId>, bool) {
        use std::ops::Bound;
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let mut live = self
            .by_id
            .range((lower, upper))
            .filter(|&(_, &i)| {
                self.slots
                    .get(i as usize)
                    .is_some_and(|s| s.expires_at > now && keep(s))
            })
            .map(|(id, _)| *id);
        let page: Vec<OfferId> = live.by_ref().take(limit).collect();
        let more = live.next().is_some();
        (page, more)
    }

    /// The GPU class of the offer held under `id` (`gridlease_protocol::class`).
    pub fn class_of(&self, id: &OfferId) -> Option<&str> {
        let slot = self.slots.get(self.index_of_id(id)?)?;
        Some(self.text.get(slot.class))
    }

    /// Held offer ids whose hex form starts with `prefix` (lowercase), at most `limit`: a range
    /// query, not a scan.
    pub fn ids_with_prefix(&self, prefix: &str, limit: usize) -> Vec<OfferId> {
        ids_with_prefix(&self.by_id, prefix, limit)
    }

    /// Ids of the current offers of the providers whose key, in hex, starts with `prefix`
    /// (hex, any case), at most `limit`: what an offer handle (`<provider key hex>/0`, see
    /// [`offer_handle`]) names, whichever signature of the offer is current. A scan of the
    /// providers (a few milliseconds for 100,000): handles are resolved once per `rent`.
    pub fn ids_of_providers_with_prefix(&self, prefix: &str, limit: usize) -> Vec<OfferId> {
        let Some(nibbles) = prefix
            .chars()
            .map(|c| c.to_digit(16).and_then(|d| u8::try_from(d).ok()))
            .collect::<Option<Vec<u8>>>()
            .filter(|n| n.len() <= 64)
        else {
            return Vec::new();
        };
        let starts = |key: &[u8; 32]| {
            nibbles.iter().enumerate().all(|(i, n)| {
                let b = key[i / 2];
                let got = if i % 2 == 0 { b >> 4 } else { b & 0x0f };
                got == *n
            })
        };
        self.slots
            .iter()
            .filter(|s| starts(&s.provider.0))
            .map(|s| s.id)
            .take(limit)
            .collect()
    }

    /// Removes the offer of `provider`; returns whether one was held. The last entry moves
    /// into the freed index (the vectors stay dense), and its indexes follow.
    pub fn remove(&mut self, provider: &PublicKey) -> bool {
        let Some(at) = self.slot_of.remove(&self.slots, provider) else {
            return false;
        };
        let i = at as usize;
        // At most `capacity` <= u32::MAX entries (`with_capacity`), so the index fits.
        let last = u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX);
        let gone = self.slots[i];
        self.by_id.remove(&gone.id);
        self.by_expiry.remove(&(gone.expires_at, at));
        if at != last {
            // The last entry moves to `i`: its indexes follow, looked up while it is still
            // in place.
            let moved = self.slots[last as usize];
            self.slot_of.repoint(&self.slots, last, at);
            self.by_id.insert(moved.id, at);
            self.by_expiry.remove(&(moved.expires_at, last));
            self.by_expiry.insert((moved.expires_at, at));
        }
        self.slots.swap_remove(i);
        self.held.swap_remove(i);
        self.text.release(gone.model);
        self.text.release(gone.region);
        self.text.release(gone.class);
        true
    }

    /// Drops every offer of the GPU class `class` (`gridlease_protocol::class`); returns how
    /// many (a node that stops following a class).
    pub fn remove_class(&mut self, class: &str) -> usize {
        let gone: Vec<PublicKey> = self
            .slots
            .iter()
            .filter(|s| self.text.get(s.class) == class)
            .map(|s| s.provider)
            .collect();
        for p in &gone {
            self.remove(p);
        }
        gone.len()
    }

    /// Drops every offer expired at `now`; returns how many.
    pub fn evict_expired(&mut self, now: Timestamp) -> usize {
        let mut n = 0;
        while let Some(&(exp, i)) = self.by_expiry.first() {
            if exp > now {
                break;
            }
            let provider = self.slots[i as usize].provider;
            self.remove(&provider);
            n += 1;
        }
        n
    }

    /// The live offers matching `query` at `now`, in the query's order (ties by offer id), at
    /// most `limit` of them.
    pub fn search(&self, query: &Query, now: Timestamp, limit: usize) -> Vec<BookEntry> {
        self.search_page(query, now, limit, None).entries
    }

    /// A page of [`OfferBook::search`]: the first `limit` matching offers that sort after
    /// `after` (from the first with `None`), and the cursor of the next page when more match.
    pub fn search_page(
        &self,
        query: &Query,
        now: Timestamp,
        limit: usize,
        after: Option<&Cursor>,
    ) -> Page {
        if limit == 0 {
            return Page {
                entries: Vec::new(),
                next: None,
            };
        }
        let sort = query.sort;
        let after = after.map(|c| (c.rank, c.id));
        // Numeric and boolean conditions first: they are a few integer compares.
        let numeric: Vec<_> = query.conditions.iter().filter(|c| !c.is_text()).collect();
        let text: Vec<_> = query.conditions.iter().filter(|c| c.is_text()).collect();
        // Per distinct string and field: 0 = not evaluated, 1 = matches, 2 = does not.
        let table = if text.is_empty() {
            0
        } else {
            self.text.strings.len()
        };
        let mut memo = [vec![0u8; table], vec![0u8; table]];
        let mut text_ok = |id: u32, field: Field| -> bool {
            let m = &mut memo[usize::from(field == Field::Region)];
            let i = id as usize;
            if m[i] == 0 {
                let s = &self.text.strings[i];
                let ok = text
                    .iter()
                    .filter(|c| c.field == field)
                    .all(|c| c.matches_text(s));
                m[i] = if ok { 1 } else { 2 };
            }
            m[i] == 1
        };
        let has_gpu_text = text.iter().any(|c| c.field == Field::Gpu);
        let has_region_text = text.iter().any(|c| c.field == Field::Region);
        // The best `limit` hits so far, in a max-heap by (sort rank, first 8 bytes of the id
        // big-endian, the id): a hit that sorts before the worst kept one replaces it. Memory
        // is bounded by the limit, not by how many offers match (a wide query over 100,000
        // offers matched 75,000, whose vector the allocator kept per search thread), and the
        // whole id is compared only when rank and prefix tie.
        let mut best: BinaryHeap<(u64, u64, OfferId, u32)> =
            BinaryHeap::with_capacity(limit.min(1024) + 1);
        let mut matched = 0usize;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.expires_at <= now {
                continue;
            }
            if !numeric
                .iter()
                .all(|c| c.matches_numbers(&slot.numbers).unwrap_or(false))
            {
                continue;
            }
            if has_gpu_text && !text_ok(slot.model, Field::Gpu) {
                continue;
            }
            if has_region_text && !text_ok(slot.region, Field::Region) {
                continue;
            }
            let rank = sort.rank(&slot.numbers);
            if let Some(after) = after
                && (rank, slot.id) <= after
            {
                continue;
            }
            matched += 1;
            let prefix = id_prefix(&slot.id);
            if best.len() == limit {
                match best.peek() {
                    Some(worst) if (rank, prefix, slot.id) < (worst.0, worst.1, worst.2) => {
                        best.pop();
                    }
                    _ => continue,
                }
            }
            // At most `capacity` <= u32::MAX entries (`with_capacity`), so the index fits.
            best.push((rank, prefix, slot.id, u32::try_from(i).unwrap_or(u32::MAX)));
        }
        let hits = best.into_sorted_vec();
        let next = hits
            .last()
            .filter(|_| matched > limit)
            .map(|&(rank, _, id, _)| Cursor { rank, id });
        Page {
            entries: hits
                .iter()
                .filter_map(|&(_, _, _, i)| self.entry(i as usize))
                .collect(),
            next,
        }
    }
}

/// The first 8 bytes of an id as a big-endian number: ordered as the ids are (ties aside).
fn id_prefix(id: &OfferId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0.0[..8]);
    u64::from_be_bytes(b)
}

/// The keys of `map` whose lowercase hex form starts with `prefix`, at most `limit`. Ids order
/// as their bytes, and so as their hex, so the matches are one range.
/// The stable handle of `provider`'s offer: its key in hex and the offer's slot (`/0`: a
/// provider offers one offer now). Unlike the offer id, it stays the same when the provider
/// re-signs the offer (a lease taking or freeing a GPU, an expiry) and across restarts; the
/// signed id remains the evidence of the exact terms.
pub fn offer_handle(provider: &PublicKey) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(66);
    for b in provider.0 {
        let _ = write!(s, "{b:02x}");
    }
    s.push_str("/0");
    s
}

fn ids_with_prefix<V>(map: &BTreeMap<OfferId, V>, prefix: &str, limit: usize) -> Vec<OfferId> {
    if prefix.len() > 64 {
        return Vec::new();
    }
    let (Ok(lo), Ok(hi)) = (
        format!("{prefix:0<64}").parse::<OfferId>(),
        format!("{prefix:f<64}").parse::<OfferId>(),
    ) else {
        return Vec::new();
    };
    map.range(lo..=hi).map(|(id, _)| *id).take(limit).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::{NetworkId, NodeKey};

    fn signed(key: &NodeKey, seq: u64, price: u64, ttl_s: u64) -> (Signed<Offer>, Offer, OfferId) {
        let mut offer = fixtures::offer(key.public(), seq, 1, price);
        offer.expires_at = T0.plus_secs(ttl_s);
        let s = Signed::sign(key, &NetworkId::devnet(), &offer).unwrap();
        let id = OfferId(s.envelope().content_digest());
        (s, offer, id)
    }

    fn admit(
        book: &mut OfferBook,
        key: &NodeKey,
        seq: u64,
        price: u64,
    ) -> Result<Admission, BookError> {
        let (s, o, id) = signed(key, seq, price, 300);
        book.admit(s, o, id, T0)
    }

    #[test]
    fn a_handle_names_the_providers_current_offer_through_re_signs() {
        let (a, b) = (NodeKey::from_secret([1; 32]), NodeKey::from_secret([2; 32]));
        let mut book = OfferBook::default();
        admit(&mut book, &a, 1, 100).unwrap();
        admit(&mut book, &b, 1, 100).unwrap();
        let handle = offer_handle(&a.public());
        assert_eq!(handle.len(), 66);
        assert!(handle.ends_with("/0"));
        let hex = handle.trim_end_matches("/0");
        for prefix in [hex, &hex[..12], &hex[..12].to_ascii_uppercase()] {
            let ids = book.ids_of_providers_with_prefix(prefix, 2);
            assert_eq!(ids.len(), 1, "{prefix}");
            assert_eq!(book.get(&ids[0]).unwrap().offer.provider, a.public());
        }
        // Re-signed: a new id, the same handle, which now names the new offer.
        let (s2, o2, id2) = signed(&a, 2, 100, 300);
        book.admit(s2, o2, id2, T0).unwrap();
        assert_eq!(book.ids_of_providers_with_prefix(&hex[..12], 2), vec![id2]);
        // The empty prefix matches both; not hex, or too long, nothing.
        assert_eq!(book.ids_of_providers_with_prefix("", 5).len(), 2);
        assert!(book.ids_of_providers_with_prefix("xyz", 5).is_empty());
        assert!(
            book.ids_of_providers_with_prefix(&"0".repeat(65), 5)
                .is_empty()
        );
    }

    #[test]
    fn a_copy_of_the_held_offer_is_recognised_and_nothing_else_is() {
        let net = NetworkId::devnet();
        let k = NodeKey::from_secret([1; 32]);
        let mut book = OfferBook::default();
        let (s1, o1, id1) = signed(&k, 1, 100, 300);
        let b1 = s1.to_bytes().unwrap();
        let v1 = Signed::<Offer>::view_frame(&b1, &net).unwrap();
        assert_eq!(book.holds_frame(&v1, T0), None, "not held yet");
        book.admit(s1, o1, id1, T0).unwrap();
        assert_eq!(book.holds_frame(&v1, T0), Some(id1));
        assert_eq!(book.holds_frame(&v1, T0.plus_secs(300)), None, "expired");
        // The provider's next offer is not the held one; once it replaces it, the first is
        // not recognised any more.
        let (s2, o2, id2) = signed(&k, 2, 100, 300);
        let b2 = s2.to_bytes().unwrap();
        let v2 = Signed::<Offer>::view_frame(&b2, &net).unwrap();
        assert_eq!(book.holds_frame(&v2, T0), None);
        book.admit(s2, o2, id2, T0).unwrap();
        assert_eq!(book.holds_frame(&v2, T0), Some(id2));
        assert_eq!(book.holds_frame(&v1, T0), None);
        // Another provider's copy of nothing held.
        let (so, _, _) = signed(&NodeKey::from_secret([2; 32]), 2, 100, 300);
        let bo = so.to_bytes().unwrap();
        assert_eq!(
            book.holds_frame(&Signed::<Offer>::view_frame(&bo, &net).unwrap(), T0),
            None
        );
    }

    #[test]
    fn a_replaced_id_leads_to_the_providers_current_offer() {
        let k = NodeKey::from_secret([1; 32]);
        let other = NodeKey::from_secret([2; 32]);
        let mut book = OfferBook::default();
        let (s1, o1, id1) = signed(&k, 1, 100, 300);
        book.admit(s1, o1, id1, T0).unwrap();
        assert!(book.replacement(&id1).is_none(), "current, not replaced");
        // Re-signed at the same price: equivalent.
        let (s2, o2, id2) = signed(&k, 2, 100, 300);
        book.admit(s2, o2, id2, T0).unwrap();
        assert!(book.get(&id1).is_none());
        let r = book.replacement(&id1).unwrap();
        assert!(r.equivalent && r.current.id == id2);
        // Then at a higher price: an id from either earlier search now says "changed".
        let (s3, o3, id3) = signed(&k, 3, 150, 300);
        book.admit(s3, o3, id3, T0).unwrap();
        for old in [id1, id2] {
            let r = book.replacement(&old).unwrap();
            assert!(!r.equivalent && r.current.id == id3 && r.old_price_per_gpu_hour == 100);
        }
        // A lower price again is equivalent for the 150 one.
        let (s4, o4, id4) = signed(&k, 4, 120, 300);
        book.admit(s4, o4, id4, T0).unwrap();
        let r = book.replacement(&id3).unwrap();
        assert!(r.equivalent && r.current.id == id4);
        let prefix = &id1.to_string()[..10];
        assert_eq!(book.replaced_with_prefix(prefix, 2), vec![id1]);
        assert!(
            book.ids_with_prefix(prefix, 2).is_empty(),
            "not held any more"
        );
        let odd = &id4.to_string()[..7];
        assert_eq!(book.ids_with_prefix(odd, 2), vec![id4]);
        assert!(book.ids_with_prefix("zz", 2).is_empty());
        // Another provider's offer never stands in; a provider without an offer has no successor.
        let (so, oo, ido) = signed(&other, 1, 50, 300);
        book.admit(so, oo, ido, T0).unwrap();
        assert_eq!(book.replacement(&id1).unwrap().current.id, id4);
        book.remove(&k.public());
        assert!(book.replacement(&id1).is_none());
    }

    /// Removals move the last entry into the freed place; every index must follow it: each
    /// held offer is found by id, by provider and through `ids_after`, with its own envelope,
    /// and nothing removed is found.
    #[test]
    fn indexes_follow_entries_through_removals_and_replacements() {
        let mut book = OfferBook::default();
        let keys: Vec<NodeKey> = (1..=60u8).map(|i| NodeKey::from_secret([i; 32])).collect();
        let mut current = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            let (s, o, id) = signed(k, 1, 1000 + i as u64, 300);
            book.admit(s, o, id, T0).unwrap();
            current.insert(k.public(), id);
        }
        for (i, k) in keys.iter().enumerate() {
            match i % 3 {
                0 => {
                    assert!(book.remove(&k.public()));
                    assert!(!book.remove(&k.public()), "already gone");
                    current.remove(&k.public());
                }
                1 => {
                    let (s, o, id) = signed(k, 2, 5000 + i as u64, 300);
                    book.admit(s, o, id, T0).unwrap();
                    current.insert(k.public(), id);
                }
                _ => {}
            }
        }
        assert_eq!(book.len(), current.len());
        for (provider, id) in &current {
            let e = book.get(id).unwrap();
            assert_eq!((e.id, e.offer.provider), (*id, *provider));
            assert_eq!(book.by_provider(provider).unwrap().id, *id);
            assert_eq!(
                OfferId(book.envelope(id).unwrap().envelope().content_digest()),
                *id
            );
            assert_eq!(e.summary.numbers.price, e.offer.price_per_gpu_hour);
            assert_eq!(e.summary.models_lower, "nvidia geforce rtx 4090");
        }
        let (mut ids, more) = book.ids_after(None, 1000, T0);
        assert!(!more);
        let mut want: Vec<OfferId> = current.values().copied().collect();
        ids.sort();
        want.sort();
        assert_eq!(ids, want);
        assert_eq!(book.entries().count(), current.len());
        for k in keys.iter().step_by(3) {
            assert!(book.by_provider(&k.public()).is_none());
        }
    }

    #[test]
    fn a_class_page_lists_only_that_class_and_the_class_is_released_with_the_offer() {
        let net = NetworkId::devnet();
        let mut book = OfferBook::default();
        let mut want = std::collections::BTreeMap::<&str, Vec<OfferId>>::new();
        for (n, model) in ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]
            .iter()
            .cycle()
            .take(10)
            .enumerate()
        {
            let k = NodeKey::from_secret([u8::try_from(n).unwrap() + 1; 32]);
            let mut offer = fixtures::offer(k.public(), 1, 2, 100);
            for g in &mut offer.gpus {
                g.spec.model = (*model).to_string();
            }
            let s = Signed::sign(&k, &net, &offer).unwrap();
            let id = OfferId(s.envelope().content_digest());
            book.admit(s, offer, id, T0).unwrap();
            let class = if n % 2 == 0 {
                "rtx-4090"
            } else {
                "a100-sxm4-80gb"
            };
            assert_eq!(book.class_of(&id), Some(class));
            want.entry(class).or_default().push(id);
        }
        for (class, mut ids) in want.clone() {
            ids.sort();
            let (page, more) = book.class_ids_after(&[class.to_string()], None, 1000, T0);
            assert_eq!((page, more), (ids.clone(), false), "{class}");
            // Paged: two at a time, each page after the last id of the one before.
            let (first, more) = book.class_ids_after(&[class.to_string()], None, 2, T0);
            assert_eq!((first.as_slice(), more), (&ids[..2], true));
            let (second, _) = book.class_ids_after(&[class.to_string()], first.last(), 2, T0);
            assert_eq!(second.as_slice(), &ids[2..4]);
        }
        let both = ["rtx-4090".to_string(), "a100-sxm4-80gb".to_string()];
        assert_eq!(book.class_ids_after(&both, None, 1000, T0).0.len(), 10);
        let none = ["rtx-3090".to_string()];
        assert_eq!(book.class_ids_after(&none, None, 1000, T0), (vec![], false));
        // Expired offers are not listed.
        assert_eq!(
            book.class_ids_after(&both, None, 1000, T0.plus_secs(300)),
            (vec![], false)
        );
        // Removing every offer of a class releases its interned name.
        let mut whole = book.clone();
        for n in (1..10).step_by(2) {
            let k = NodeKey::from_secret([u8::try_from(n).unwrap() + 1; 32]);
            assert!(book.remove(&k.public()));
        }
        assert!(!book.text.ids.contains_key("a100-sxm4-80gb"));
        assert!(book.text.ids.contains_key("rtx-4090"));
        // So does dropping the class at once, and the other class stays whole.
        assert_eq!(whole.remove_class("a100-sxm4-80gb"), 5);
        assert_eq!(whole.remove_class("a100-sxm4-80gb"), 0);
        assert!(!whole.text.ids.contains_key("a100-sxm4-80gb"));
        assert_eq!(whole.len(), 5);
        assert_eq!(
            whole.class_ids_after(&both, None, 1000, T0).0,
            want["rtx-4090"]
                .iter()
                .copied()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn bucket_digests_and_pages_cover_exactly_the_live_ids_of_each_bucket() {
        let net = NetworkId::devnet();
        let mut book = OfferBook::default();
        let mut ids = Vec::new();
        for n in 0..600u32 {
            let mut secret = [9u8; 32];
            secret[..4].copy_from_slice(&n.to_be_bytes());
            let k = NodeKey::from_secret(secret);
            let mut offer = fixtures::offer(k.public(), 1, 1, 100);
            if n % 3 == 0 {
                offer.gpus[0].spec.model = "NVIDIA A100-SXM4-80GB".to_string();
            }
            let s = Signed::sign(&k, &net, &offer).unwrap();
            let id = OfferId(s.envelope().content_digest());
            book.admit(s, offer, id, T0).unwrap();
            ids.push((id, n % 3 == 0));
        }
        let digest_of = |keep: &dyn Fn(bool) -> bool| {
            let mut d = vec![0u64; gridlease_protocol::sync::BUCKETS];
            for (id, a100) in &ids {
                if keep(*a100) {
                    d[usize::from(id.0.0[0])] ^= gridlease_protocol::sync::id_digest(id);
                }
            }
            d
        };
        assert_eq!(book.bucket_digests(None, T0), digest_of(&|_| true));
        let a100 = ["a100-sxm4-80gb".to_string()];
        assert_eq!(book.bucket_digests(Some(&a100), T0), digest_of(&|a| a));
        assert_eq!(
            book.bucket_digests(Some(&["rtx-3090".to_string()]), T0),
            vec![0; 256]
        );
        assert_eq!(
            book.bucket_digests(None, T0.plus_secs(300)),
            vec![0; 256],
            "expired"
        );
        // Every bucket paged two ids at a time gives exactly its ids, in order.
        let mut all = Vec::new();
        for b in 0..=255u8 {
            let mut after = None;
            loop {
                let (page, more) = book.bucket_ids_after(None, b, after.as_ref(), 2, T0);
                assert!(page.iter().all(|id| id.0.0[0] == b));
                all.extend(page.iter().copied());
                after = page.last().copied();
                if !more {
                    break;
                }
            }
        }
        let mut want: Vec<OfferId> = ids.iter().map(|(id, _)| *id).collect();
        want.sort();
        assert_eq!(all, want);
        // Class-restricted, and a cursor outside the bucket (before it, after it).
        let (page, _) = book.bucket_ids_after(Some(&a100), 7, None, 1000, T0);
        let want7: Vec<OfferId> = want
            .iter()
            .copied()
            .filter(|id| id.0.0[0] == 7 && ids.iter().any(|(i, a)| i == id && *a))
            .collect();
        assert_eq!(page, want7);
        let low = OfferId(gridlease_protocol::Digest([0; 32]));
        let high = OfferId(gridlease_protocol::Digest([255; 32]));
        let in7 = want.iter().filter(|id| id.0.0[0] == 7).count();
        assert_eq!(
            book.bucket_ids_after(None, 7, Some(&low), 1000, T0).0.len(),
            in7
        );
        assert_eq!(
            book.bucket_ids_after(None, 7, Some(&high), 1000, T0),
            (vec![], false)
        );
        assert_eq!(
            book.bucket_ids_after(None, 255, Some(&high), 1000, T0),
            (vec![], false)
        );
    }

    /// Every index points at the slot that holds its key, each slot is indexed once in each,
    /// and each envelope put together from its parts is the offer's own (its digest is the id,
    /// its signer the provider).
    fn assert_indexes_agree(book: &OfferBook) {
        let n = book.slots.len();
        assert_eq!(book.held.len(), n);
        assert_eq!(book.slot_of.table.len(), n);
        assert_eq!(book.by_id.len(), n);
        assert_eq!(book.by_expiry.len(), n);
        for (i, slot) in book.slots.iter().enumerate() {
            let at = u32::try_from(i).unwrap();
            assert_eq!(book.slot_of.get(&book.slots, &slot.provider), Some(at));
            assert_eq!(book.by_id.get(&slot.id), Some(&at));
            assert!(book.by_expiry.contains(&(slot.expires_at, at)));
            let signed = book.signed(i).unwrap();
            assert_eq!(signed.signer(), slot.provider);
            assert_eq!(OfferId(signed.envelope().content_digest()), slot.id);
            assert!(signed.verify(&NetworkId::devnet()).is_ok());
        }
    }

    /// Admissions (new, newer, refused when full, evicting the soonest), removals and expiry in
    /// a random order, in a small book: after each, the indexes agree with the slots and each
    /// provider's current offer is the one found.
    #[test]
    fn random_operations_keep_the_indexes_in_step() {
        let keys: Vec<NodeKey> = (1..=24u8).map(|i| NodeKey::from_secret([i; 32])).collect();
        let mut book = OfferBook::with_capacity(10);
        let mut seq = vec![0u64; keys.len()];
        let mut now = T0;
        let mut x: u64 = 99;
        for step in 0..3000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = (x >> 33) as usize % keys.len();
            match (x >> 60) % 8 {
                0 => {
                    let was = book.by_provider(&keys[k].public()).is_some();
                    assert_eq!(book.remove(&keys[k].public()), was);
                    assert!(book.by_provider(&keys[k].public()).is_none());
                }
                1 => {
                    now = now.plus_secs((x >> 20) % 7);
                    book.evict_expired(now);
                    assert!(book.by_expiry.first().is_none_or(|&(exp, _)| exp > now));
                }
                _ => {
                    seq[k] += 1;
                    let mut offer = fixtures::offer(keys[k].public(), seq[k], 1, step);
                    offer.expires_at = now.plus_secs(1 + (x >> 10) % 40);
                    let s = Signed::sign(&keys[k], &NetworkId::devnet(), &offer).unwrap();
                    let id = OfferId(s.envelope().content_digest());
                    match book.admit(s, offer, id, now) {
                        Ok(_) => {
                            assert_eq!(book.by_provider(&keys[k].public()).unwrap().id, id);
                            assert!(book.len() <= 10);
                        }
                        Err(BookError::Full { .. }) => assert_eq!(book.len(), 10),
                        Err(e) => panic!("step {step}: {e}"),
                    }
                }
            }
            assert_indexes_agree(&book);
        }
    }

    #[test]
    fn replaced_ids_are_bounded() {
        let k = NodeKey::from_secret([1; 32]);
        let mut book = OfferBook::default();
        let mut first = None;
        for seq in 1..=(REPLACED_CAPACITY as u64 + 2) {
            let (s, o, id) = signed(&k, seq, 100, 300);
            first.get_or_insert(id);
            book.admit(s, o, id, T0).unwrap();
        }
        assert_eq!(book.replaced.len(), REPLACED_CAPACITY);
        assert!(
            book.replacement(&first.unwrap()).is_none(),
            "oldest forgotten"
        );
    }

    #[test]
    fn newer_replaces_older_and_replays_are_refused() {
        let k = NodeKey::from_secret([1; 32]);
        let mut book = OfferBook::default();
        assert_eq!(admit(&mut book, &k, 5, 100), Ok(Admission::New));
        assert_eq!(admit(&mut book, &k, 5, 100), Ok(Admission::Refresh));
        assert!(matches!(
            admit(&mut book, &k, 5, 101),
            Err(BookError::Equivocation { seq: 5, .. })
        ));
        assert!(matches!(
            admit(&mut book, &k, 4, 100),
            Err(BookError::Replay {
                got: 4,
                held: 5,
                ..
            })
        ));
        assert_eq!(
            admit(&mut book, &k, 6, 90),
            Ok(Admission::Newer { held_seq: 5 })
        );
        assert_eq!(book.len(), 1);
        assert_eq!(book.by_provider(&k.public()).unwrap().offer.seq, 6);
        // The old id no longer resolves.
        let (_, _, old_id) = signed(&k, 5, 100, 300);
        assert!(book.get(&old_id).is_none());
    }

    #[test]
    fn expired_offers_are_evicted_and_never_found() {
        let mut book = OfferBook::default();
        let a = NodeKey::from_secret([1; 32]);
        let b = NodeKey::from_secret([2; 32]);
        let (s, o, id) = signed(&a, 1, 100, 10);
        book.admit(s, o, id, T0).unwrap();
        let (s, o, id) = signed(&b, 1, 200, 100);
        book.admit(s, o, id, T0).unwrap();
        let q = Query::default();
        assert_eq!(book.search(&q, T0.plus_secs(20), 10).len(), 1);
        assert_eq!(book.evict_expired(T0.plus_secs(20)), 1);
        assert_eq!(book.len(), 1);
        let (s, o, id) = signed(&a, 2, 100, 10);
        assert!(matches!(
            book.admit(s, o, id, T0.plus_secs(20)),
            Err(BookError::Expired { .. })
        ));
    }

    #[test]
    fn bounded_book_evicts_the_soonest_expiring() {
        let mut book = OfferBook::with_capacity(2);
        let keys: Vec<NodeKey> = (1..=3).map(|i| NodeKey::from_secret([i; 32])).collect();
        let (s, o, id) = signed(&keys[0], 1, 100, 50);
        book.admit(s, o, id, T0).unwrap();
        let (s, o, id) = signed(&keys[1], 1, 100, 100);
        book.admit(s, o, id, T0).unwrap();
        // A shorter-lived newcomer is refused.
        let (s, o, id) = signed(&keys[2], 1, 100, 40);
        assert!(matches!(
            book.admit(s, o, id, T0),
            Err(BookError::Full { .. })
        ));
        // A longer-lived one replaces the soonest-expiring.
        let (s, o, id) = signed(&keys[2], 1, 100, 200);
        book.admit(s, o, id, T0).unwrap();
        assert_eq!(book.len(), 2);
        assert!(book.by_provider(&keys[0].public()).is_none());
    }

    #[test]
    fn search_equals_a_naive_filter() {
        let mut book = OfferBook::default();
        let mut x: u64 = 7;
        for i in 1..=200u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut secret = [0u8; 32];
            secret[..4].copy_from_slice(&i.to_le_bytes());
            let k = NodeKey::from_secret(secret);
            let mut offer = fixtures::offer(
                k.public(),
                1,
                1 + (x >> 60) as u8 % 4,
                100_000 + (x >> 40) % 500_000,
            );
            offer.expires_at = T0.plus_secs(10 + (x >> 20) % 100);
            offer.region = ["eu-west", "us-east", "ap"][(x >> 10) as usize % 3].into();
            if x.is_multiple_of(2) {
                offer.gpus[0].spec.model = "NVIDIA GeForce RTX 3090".into();
            }
            let s = Signed::sign(&k, &NetworkId::devnet(), &offer).unwrap();
            let id = OfferId(s.envelope().content_digest());
            book.admit(s, offer, id, T0).unwrap();
            if i.is_multiple_of(7) {
                book.remove(&k.public());
            }
        }
        let now = T0.plus_secs(50);
        for q in [
            "",
            "gpu~4090",
            "gpu~3090 region=us-east price<=0.4",
            "region~eu gpus>=2 sort:-price",
            "gpu!=x region!=ap",
            "price>0.2 price<0.5 sort:price_per_tflop",
        ] {
            let query = Query::parse(q).unwrap();
            let fast: Vec<OfferId> = book
                .search(&query, now, usize::MAX)
                .iter()
                .map(|e| e.id)
                .collect();
            let mut naive: Vec<BookEntry> = book
                .entries()
                .filter(|e| e.offer.expires_at > now && query.matches(&e.summary))
                .collect();
            naive.sort_by(|a, b| {
                query
                    .sort
                    .compare(&a.summary.numbers, &b.summary.numbers)
                    .then_with(|| a.id.cmp(&b.id))
            });
            let naive: Vec<OfferId> = naive.iter().map(|e| e.id).collect();
            assert_eq!(fast, naive, "{q}");
        }
    }

    /// Pages of a search, cursor to cursor, are the whole search in order, for every sort in
    /// both directions (ties in price included); an offer admitted between pages that sorts
    /// before the cursor is not repeated and one that sorts after it comes; the last page
    /// has no cursor.
    #[test]
    fn pages_follow_cursors_through_the_whole_search() {
        let mut book = OfferBook::default();
        let key = |i: u32| {
            let mut secret = [0u8; 32];
            secret[..4].copy_from_slice(&i.to_le_bytes());
            NodeKey::from_secret(secret)
        };
        for i in 1..=57u32 {
            // Prices repeat (ties broken by id), creation times differ.
            let k = key(i);
            let mut offer = fixtures::offer(
                k.public(),
                1,
                1 + (i % 3) as u8,
                10_000 * u64::from(i % 5 + 1),
            );
            offer.expires_at = T0.plus_secs(600);
            offer.created_at = T0.plus_secs(u64::from(i));
            let s = Signed::sign(&k, &NetworkId::devnet(), &offer).unwrap();
            let id = OfferId(s.envelope().content_digest());
            book.admit(s, offer, id, T0).unwrap();
        }
        for q in [
            "",
            "sort:-price",
            "sort:age",
            "sort:-age",
            "sort:vram",
            "gpus>=2 sort:-rep",
        ] {
            let query = Query::parse(q).unwrap();
            let all: Vec<OfferId> = book
                .search(&query, T0, usize::MAX)
                .iter()
                .map(|e| e.id)
                .collect();
            for limit in [1, 7, 56, 57, 100] {
                let mut got = Vec::new();
                let mut after = None;
                loop {
                    let page = book.search_page(&query, T0, limit, after.as_ref());
                    assert!(page.entries.len() <= limit);
                    got.extend(page.entries.iter().map(|e| e.id));
                    match page.next {
                        Some(c) => {
                            assert_eq!(page.entries.len(), limit, "{q} {limit}");
                            let text = c.to_string();
                            assert_eq!(text.len(), Cursor::TEXT_LEN);
                            assert_eq!(text.parse::<Cursor>().unwrap(), c);
                            after = Some(c);
                        }
                        None => break,
                    }
                }
                assert_eq!(got, all, "{q} limit {limit}");
            }
        }
        // Changes between pages: cheapest first, page of 10.
        let query = Query::parse("").unwrap();
        let first = book.search_page(&query, T0, 10, None);
        let first_ids: Vec<OfferId> = first.entries.iter().map(|e| e.id).collect();
        let cursor = first.next.unwrap();
        for (i, price) in [(1000u32, 1u64), (1001, 60_000)] {
            let k = key(i);
            let mut offer = fixtures::offer(k.public(), 1, 1, price);
            offer.expires_at = T0.plus_secs(600);
            let s = Signed::sign(&k, &NetworkId::devnet(), &offer).unwrap();
            let id = OfferId(s.envelope().content_digest());
            book.admit(s, offer, id, T0).unwrap();
        }
        let mut rest = Vec::new();
        let mut after = Some(cursor);
        while let Some(c) = after {
            let page = book.search_page(&query, T0, 10, Some(&c));
            rest.extend(page.entries.iter().map(|e| e.offer.price_per_gpu_hour));
            assert!(page.entries.iter().all(|e| !first_ids.contains(&e.id)));
            after = page.next;
        }
        assert!(
            !rest.contains(&1),
            "the cheaper newcomer sorts before the cursor"
        );
        assert_eq!(
            rest.last(),
            Some(&60_000),
            "the dearest newcomer comes last"
        );
        assert_eq!(rest.len(), 57 - 10 + 1);
        for bad in ["", "00", &"g".repeat(80), &"0".repeat(79)] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reputation_filters_and_sorts_and_follows_new_offers() {
        let mut book = OfferBook::default();
        let keys: Vec<NodeKey> = (1..=4u8).map(|i| NodeKey::from_secret([i; 32])).collect();
        for (i, k) in keys.iter().enumerate() {
            admit(&mut book, k, 1, 10_000 * (i as u64 + 1)).unwrap();
        }
        let ids = |q: &str, book: &OfferBook| -> Vec<u64> {
            book.search(&Query::parse(q).unwrap(), T0, 100)
                .iter()
                .map(|e| e.offer.price_per_gpu_hour)
                .collect()
        };
        // Nothing known: everyone has the prior.
        assert_eq!(ids("rep>=0.5", &book).len(), 4);
        assert!(ids("rep>0.5", &book).is_empty());
        assert_eq!(ids("verified=0", &book).len(), 4);
        let mut scores = HashMap::new();
        let numbers = |rep_permille, completed, verified| ProviderNumbers {
            rep_permille,
            completed,
            verified,
        };
        scores.insert(keys[0].public(), numbers(950, 40, 2));
        scores.insert(keys[2].public(), numbers(810, 12, 7));
        scores.insert(keys[3].public(), numbers(200, 3, 0));
        book.set_reputation(scores);
        assert_eq!(ids("rep>=0.8", &book), vec![10_000, 30_000]);
        assert_eq!(ids("completed>=10", &book), vec![10_000, 30_000]);
        assert_eq!(ids("rep>=0.9 completed>=10", &book), vec![10_000]);
        assert_eq!(
            ids("sort:-rep", &book),
            vec![10_000, 30_000, 20_000, 40_000]
        );
        assert_eq!(ids("verified>=3", &book), vec![30_000]);
        assert_eq!(ids("verified=true", &book), vec![10_000, 30_000]);
        assert_eq!(ids("verified=false", &book), vec![20_000, 40_000]);
        // 20_000 and 40_000 tie (nothing verified): by offer id.
        let tied = {
            let mut t: Vec<(OfferId, u64)> = book
                .search(&Query::parse("verified=0").unwrap(), T0, 100)
                .iter()
                .map(|e| (e.id, e.offer.price_per_gpu_hour))
                .collect();
            t.sort();
            t.into_iter().map(|(_, p)| p)
        };
        assert_eq!(
            ids("sort:-verified", &book),
            [30_000, 10_000].into_iter().chain(tied).collect::<Vec<_>>()
        );
        // A provider's next offer keeps its reputation.
        admit(&mut book, &keys[3], 2, 5_000).unwrap();
        assert_eq!(ids("rep<0.3", &book), vec![5_000]);
        assert_eq!(
            book.by_provider(&keys[3].public())
                .unwrap()
                .summary
                .numbers
                .provider,
            numbers(200, 3, 0)
        );
        // Forgotten providers go back to the prior.
        book.set_reputation(HashMap::new());
        assert_eq!(ids("rep=0.5 completed=0 verified=0", &book).len(), 4);
    }

    #[test]
    fn search_sorts_and_limits() {
        let mut book = OfferBook::default();
        for i in 1..=20u8 {
            let k = NodeKey::from_secret([i; 32]);
            admit(&mut book, &k, 1, u64::from(i) * 10_000).unwrap();
        }
        let q = Query::parse("price<=0.1").unwrap();
        let hits = book.search(&q, T0, 3);
        let prices: Vec<u64> = hits.iter().map(|e| e.offer.price_per_gpu_hour).collect();
        assert_eq!(prices, vec![10_000, 20_000, 30_000]);
        let q = Query::parse("price<=0.1 sort:-price").unwrap();
        let hits = book.search(&q, T0, 100);
        assert_eq!(hits.len(), 10);
        assert_eq!(hits[0].offer.price_per_gpu_hour, 100_000);
        assert!(book.search(&q, T0, 0).is_empty());
    }
}
