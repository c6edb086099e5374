//! Provider: what is known about the images renters ask for, before a lease is signed.
//!
//! The actor checks a request's reference against the offer's image rules (pure, in
//! `contracts`); for a reference that passes it asks the local daemon or the registry for the
//! image's facts (`sandbox::images`) in a bounded task, then decides with
//! `gridlease_contracts::image::admit`. Facts are cached for [`FACTS_TTL`] so identical
//! retries and repeat renters do not ask the registry again.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gridlease_contracts::image::{
    self, CacheLimits, CachedImage, ImageFacts, ImagePolicy, ImageRef,
};
use gridlease_protocol::{ImageRefusal, Offer};
use gridlease_sandbox::Sandbox;

/// How long facts about an image are reused.
pub const FACTS_TTL: Duration = Duration::from_secs(300);
/// Most images whose facts are cached.
pub const MAX_CACHED: usize = 256;
/// Most images being asked about at once; requests beyond are refused as unavailable.
pub const MAX_VETTING: usize = 16;

/// Cached facts by canonical reference (owned by the lease actor).
#[derive(Debug, Default)]
pub struct FactsCache {
    entries: HashMap<String, (Instant, ImageFacts)>,
}

impl FactsCache {
    /// Fresh facts for `canonical`, if cached.
    pub fn get(&self, canonical: &str) -> Option<&ImageFacts> {
        self.entries
            .get(canonical)
            .filter(|(at, _)| at.elapsed() < FACTS_TTL)
            .map(|(_, f)| f)
    }

    /// Remembers facts; the oldest entry makes room when full.
    pub fn put(&mut self, canonical: String, facts: ImageFacts) {
        if self.entries.len() >= MAX_CACHED && !self.entries.contains_key(&canonical) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.entries.insert(canonical, (Instant::now(), facts));
    }
}

/// The highest CUDA version the offer's drivers support, for a lease of `gpu_count` GPUs
/// (`None` for CPU-only leases or drivers that do not say).
pub fn host_cuda(offer: &Offer, gpu_count: u16) -> Option<String> {
    if gpu_count == 0 {
        return None;
    }
    offer
        .gpus
        .iter()
        .filter_map(|g| image::CudaVersion::parse(&g.spec.cuda_version))
        .min()
        .map(|v| v.to_string())
}

/// Registries spoken to over plain HTTP: the private (loopback, LAN) hosts the provider listed.
pub fn plain_http(policy: &ImagePolicy) -> Vec<String> {
    policy
        .registries
        .iter()
        .filter(|h| image::is_private_host(h))
        .cloned()
        .collect()
}

/// Asks the daemon (image present) or the registry about `image` (never the registry for
/// an image the policy lists as local).
pub async fn facts(
    sandbox: Option<Sandbox>,
    image: ImageRef,
    policy: &ImagePolicy,
) -> Result<ImageFacts, ImageRefusal> {
    let plain = plain_http(policy);
    let local = policy.lists_local(&image);
    gridlease_sandbox::images::image_facts(sandbox.as_ref(), &image, &plain, local).await
}

/// The canonical form of a lease's image reference (how the cache names it).
pub fn canonical(image: &str) -> String {
    ImageRef::parse(image).map_or_else(|_| image.to_string(), |r| r.canonical())
}

/// What the cache holds now: images, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheUsage {
    /// Pulled images kept.
    pub images: u64,
    /// Their unpacked size, bytes.
    pub bytes: u64,
}

/// Removes the least recently used pulled images beyond `limits`, never one in `in_use`
/// (canonical references of live leases) nor one the daemon says a container still uses.
/// Returns the references removed.
pub async fn evict(
    store: &crate::store::StoreHandle,
    sandbox: &Sandbox,
    limits: CacheLimits,
    in_use: &BTreeSet<String>,
) -> Vec<String> {
    let cached = match store.call(|s| s.pulled_images()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the image cache");
            return Vec::new();
        }
    };
    let cached: Vec<CachedImage> = cached
        .into_iter()
        .map(|(reference, at, bytes)| CachedImage {
            in_use: in_use.contains(&reference),
            reference,
            last_used: at.0,
            bytes,
        })
        .collect();
    let mut removed = Vec::new();
    for reference in image::evictions(&cached, limits) {
        match sandbox.remove_image(&reference).await {
            Ok(true) => {
                let r = reference.clone();
                if let Err(e) = store.call(move |s| s.forget_pulled_image(&r)).await {
                    tracing::warn!(error = %e, "cannot forget a removed image");
                }
                tracing::info!(image = %reference, "image removed from the cache");
                removed.push(reference);
            }
            Ok(false) => tracing::debug!(image = %reference, "cached image still in use; kept"),
            Err(e) => {
                tracing::warn!(error = %e, image = %reference, "cannot remove a cached image")
            }
        }
    }
    removed
}

/// The cache's size from the store.
pub async fn usage(store: &crate::store::StoreHandle) -> CacheUsage {
    match store.call(|s| s.pulled_images()).await {
        Ok(c) => CacheUsage {
            images: c.len() as u64,
            bytes: c.iter().map(|(_, _, b)| *b).fold(0, u64::saturating_add),
        },
        Err(_) => CacheUsage::default(),
    }
}
