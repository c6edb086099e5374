//! What this node offers ([`ProvideSettings`]), as the operator asked for it and as kept in
//! `<home>/provide.json`, and the offer template it makes.

use std::path::PathBuf;

use gridlease_contracts::Money;
use gridlease_contracts::image::ImagePolicy;
use gridlease_protocol::{Digest, NetworkPolicy};

use crate::net::{NegotiationError, OfferTemplate};

/// What this node offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvideSettings {
    /// Price per GPU-hour.
    pub price_per_gpu_hour: Money,
    /// GPU UUIDs to offer; `None` offers all.
    pub gpus: Option<Vec<String>>,
    /// Longest lease, hours.
    pub max_hours: Option<u32>,
    /// Network access tenants may get.
    pub network_policy: NetworkPolicy,
    /// Which images tenants may run.
    pub images: ImagePolicy,
    /// The daily hours the GPUs are offered ([`super::owner`] withdraws them outside).
    pub hours: gridlease_contracts::schedule::Schedule,
    /// The time zone of `hours` (an IANA name); `None`: the machine's zone.
    pub tz: Option<String>,
    /// Whether a running lease may be stopped for the owner (`Offer::interruptible`).
    pub interruptible: bool,
    /// Offer at all.
    pub enabled: bool,
}

/// [`ProvideSettings`] as kept in `<home>/provide.json`, so a restarted daemon offers what the
/// operator last asked for (or nothing, after `provide --off`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct SavedProvide {
    price_micros_per_gpu_hour: u64,
    gpus: Option<Vec<String>>,
    max_hours: Option<u32>,
    network_policy: NetworkPolicy,
    #[serde(default)]
    images: ImagePolicy,
    /// [`ProvideSettings::hours`] as text (`always` when absent: files written before it).
    #[serde(default = "always")]
    hours: String,
    #[serde(default)]
    tz: Option<String>,
    #[serde(default)]
    interruptible: bool,
    enabled: bool,
}

fn always() -> String {
    "always".into()
}

impl ProvideSettings {
    /// Writes the settings to `path` atomically (temporary file, then rename).
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        let saved = SavedProvide {
            price_micros_per_gpu_hour: self.price_per_gpu_hour.micros(),
            gpus: self.gpus.clone(),
            max_hours: self.max_hours,
            network_policy: self.network_policy,
            images: self.images.clone(),
            hours: self.hours.to_string(),
            tz: self.tz.clone(),
            interruptible: self.interruptible,
            enabled: self.enabled,
        };
        let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }

    /// Reads settings saved by [`ProvideSettings::save`]; `Ok(None)` when there are none.
    pub fn load(path: &std::path::Path) -> std::io::Result<Option<Self>> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let s: SavedProvide = serde_json::from_slice(&bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let hours = s
            .hours
            .parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(Some(Self {
            price_per_gpu_hour: Money::from_micros(s.price_micros_per_gpu_hour),
            gpus: s.gpus,
            max_hours: s.max_hours,
            network_policy: s.network_policy,
            images: s.images,
            hours,
            tz: s.tz,
            interruptible: s.interruptible,
            enabled: s.enabled,
        }))
    }

    /// The offer template these settings ask for, from the node's GPUs (`base`); `None` when
    /// not providing.
    pub fn template(
        &self,
        base: Option<&OfferTemplate>,
    ) -> Result<Option<OfferTemplate>, ProvideError> {
        if !self.enabled {
            return Ok(None);
        }
        let mut t = base.cloned().ok_or(ProvideError::NoGpus)?;
        if let Some(wanted) = &self.gpus {
            // Driver GPUs by UUID; declared ones by the id `gridlease gpus` prints for them.
            let digests: Vec<Digest> = wanted
                .iter()
                .map(|u| gridlease_sandbox::gpu::uuid_digest(u))
                .collect();
            let declared: Vec<usize> = wanted
                .iter()
                .filter_map(|u| u.strip_prefix("declared-")?.parse().ok())
                .collect();
            let mut i = 0usize;
            t.gpus.retain(|g| {
                let keep = digests.contains(&g.spec.uuid_digest) || declared.contains(&i);
                i += 1;
                keep
            });
            if t.gpus.is_empty() {
                return Err(ProvideError::NoMatchingGpus);
            }
        }
        t.price_per_gpu_hour = self.price_per_gpu_hour.micros();
        if let Some(h) = self.max_hours {
            t.max_duration_s = h.saturating_mul(3600).max(t.min_duration_s);
        }
        t.sandbox.network = self.network_policy;
        t.sandbox.image_prefixes = self.images.prefixes.clone();
        t.images = self.images.clone();
        t.interruptible = self.interruptible;
        Ok(Some(t))
    }

    /// `<home>/provide.json`.
    pub fn path(home: &std::path::Path) -> PathBuf {
        home.join("provide.json")
    }
}

/// Why [`LeaseService::provide`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvideError {
    /// This node has no GPUs to offer.
    #[error("this node has no GPUs to offer (start it with --dev-gpus or on a machine with NVML)")]
    NoGpus,
    /// None of the named GPUs exists here.
    #[error("none of the named GPUs is on this node")]
    NoMatchingGpus,
    /// The schedule's time zone is not known here.
    #[error("{0}")]
    Hours(String),
    /// The network task has stopped.
    #[error(transparent)]
    Network(#[from] NegotiationError),
}
