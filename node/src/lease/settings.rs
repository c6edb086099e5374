//! What this node offers ([`ProvideSettings`]), as the operator asked for it and as kept in
//! `<home>/provide.json`, and the offer template it makes.

use std::path::PathBuf;

use gridlease_contracts::Money;
use gridlease_contracts::image::ImagePolicy;
use gridlease_protocol::{Digest, NetworkPolicy};

use crate::net::{NegotiationError, OfferTemplate};

/// What this node offers, typed (the daemon's form of `api::types::ProvideOptions`). Kept as
/// JSON in `<home>/provide.json` ([`ProvideSettings::save`]), so a restarted daemon offers what
/// the operator last asked for (or nothing, after `provide --off`); the price is kept in micro
/// units and the hours as text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProvideSettings {
    /// Price per GPU-hour.
    #[serde(rename = "price_micros_per_gpu_hour", with = "micros")]
    pub price_per_gpu_hour: Money,
    /// GPU UUIDs to offer; `None` offers all.
    pub gpus: Option<Vec<String>>,
    /// Longest lease, hours.
    pub max_hours: Option<u32>,
    /// Network access tenants may get.
    pub network_policy: NetworkPolicy,
    /// Which images tenants may run.
    #[serde(default)]
    pub images: ImagePolicy,
    /// The daily hours the GPUs are offered ([`super::owner`] withdraws them outside); kept
    /// as text, `always` when absent (files written before it).
    #[serde(default, with = "schedule_text")]
    pub hours: gridlease_contracts::schedule::Schedule,
    /// The time zone of `hours` (an IANA name); `None`: the machine's zone.
    #[serde(default)]
    pub tz: Option<String>,
    /// Whether a running lease may be stopped for the owner (`Offer::interruptible`).
    #[serde(default)]
    pub interruptible: bool,
    /// Offer at all.
    pub enabled: bool,
}

/// [`Money`] in `provide.json`: its micro units.
mod micros {
    use gridlease_contracts::Money;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the micro units.
    pub(super) fn serialize<S: Serializer>(m: &Money, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(m.micros())
    }

    /// Reads the micro units.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Money, D::Error> {
        u64::deserialize(d).map(Money::from_micros)
    }
}

/// A [`Schedule`](gridlease_contracts::schedule::Schedule) in `provide.json`: its text
/// (`always`, or `HH:MM-HH:MM` windows).
mod schedule_text {
    use gridlease_contracts::schedule::Schedule;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the text.
    pub(super) fn serialize<S: Serializer>(h: &Schedule, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(h)
    }

    /// Parses the text.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Schedule, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl ProvideSettings {
    /// Writes the settings to `path` atomically (temporary file, then rename).
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
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
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A `provide.json` as the daemon has written it (every key, in this order), and one from
    /// before images, hours, tz and interruptible were kept.
    const TODAY: &str = r#"{
  "price_micros_per_gpu_hour": 360000,
  "gpus": [
    "declared-0"
  ],
  "max_hours": 24,
  "network_policy": "Egress",
  "images": {
    "registries": [
      "docker.io",
      "localhost:5000"
    ],
    "prefixes": [
      "docker.io/pytorch/"
    ],
    "local_images": [
      "trainer:v1"
    ],
    "max_compressed_bytes": 1073741824,
    "max_unpacked_bytes": 2147483648
  },
  "hours": "22:00-08:00,12:00-13:00",
  "tz": "Europe/Berlin",
  "interruptible": true,
  "enabled": true
}"#;
    const OLDEST: &str = r#"{"price_micros_per_gpu_hour":400000,"gpus":null,"max_hours":null,"network_policy":"None","enabled":false}"#;

    fn today() -> ProvideSettings {
        ProvideSettings {
            price_per_gpu_hour: Money::from_micros(360_000),
            gpus: Some(vec!["declared-0".into()]),
            max_hours: Some(24),
            network_policy: NetworkPolicy::Egress,
            images: ImagePolicy {
                registries: vec!["docker.io".into(), "localhost:5000".into()],
                prefixes: vec!["docker.io/pytorch/".into()],
                local_images: vec!["trainer:v1".into()],
                max_compressed_bytes: 1 << 30,
                max_unpacked_bytes: 2 << 30,
            },
            hours: "22:00-08:00,12:00-13:00".parse().unwrap(),
            tz: Some("Europe/Berlin".into()),
            interruptible: true,
            enabled: true,
        }
    }

    /// Files in today's format (and older ones) still load, and saving writes the same text.
    #[test]
    fn provide_json_keeps_its_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = ProvideSettings::path(dir.path());
        assert_eq!(ProvideSettings::load(&path).unwrap(), None);
        std::fs::write(&path, TODAY).unwrap();
        assert_eq!(ProvideSettings::load(&path).unwrap(), Some(today()));
        today().save(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), TODAY);
        std::fs::write(&path, OLDEST).unwrap();
        let old = ProvideSettings::load(&path).unwrap().unwrap();
        assert_eq!(
            old,
            ProvideSettings {
                price_per_gpu_hour: Money::from_micros(400_000),
                gpus: None,
                max_hours: None,
                network_policy: NetworkPolicy::None,
                images: ImagePolicy::default(),
                hours: gridlease_contracts::schedule::Schedule::always(),
                tz: None,
                interruptible: false,
                enabled: false,
            }
        );
        std::fs::write(&path, TODAY.replace("22:00-08:00", "25:00-08:00")).unwrap();
        let bad = ProvideSettings::load(&path).unwrap_err();
        assert_eq!(bad.kind(), std::io::ErrorKind::InvalidData);
    }
}
