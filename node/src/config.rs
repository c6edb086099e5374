//! Daemon configuration: documented defaults, then `<home>/config.toml`, then environment
//! variables, then command-line flags (each later source overrides the earlier ones).
//! Merged in one place ([`Config::resolve`]); `gridlease node --dump-config` prints the result.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::env_vars;

/// File name of the configuration inside the home.
pub const CONFIG_FILE: &str = "config.toml";

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (structured fields preserved).
    Json,
}

/// What `gridlease node` runs with. Every field has a documented default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses. Default: TCP and QUIC on all interfaces, port 4001.
    pub listen: Vec<String>,
    /// Peers to dial at start (multiaddrs with `/p2p/<id>`). Default: none.
    pub bootstrap: Vec<String>,
    /// Publicly reachable addresses of this node. Default: none.
    pub external_addrs: Vec<String>,
    /// Serve as relay, AutoNAT server and DHT server. Default: false.
    pub relay_server: bool,
    /// mDNS LAN discovery. Default: true.
    pub mdns: bool,
    /// Seconds between offer re-announcements. Default: 60.
    pub announce_secs: u64,
    /// Declared (unverified) GPUs to offer, e.g. `"RTX 4090:24GiB:0.40"`. Default: none.
    pub dev_gpus: Option<String>,
    /// Address for the Prometheus metrics endpoint, e.g. `127.0.0.1:9464`. Default: off.
    pub metrics: Option<String>,
    /// Log format. Default: text.
    pub log_format: LogFormat,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec![
                "/ip4/0.0.0.0/tcp/4001".to_string(),
                "/ip4/0.0.0.0/udp/4001/quic-v1".to_string(),
            ],
            bootstrap: Vec::new(),
            external_addrs: Vec::new(),
            relay_server: false,
            mdns: true,
            announce_secs: 60,
            dev_gpus: None,
            metrics: None,
            log_format: LogFormat::Text,
        }
    }
}

/// Values given on the command line; `None` / empty means "not given".
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--listen` (repeatable).
    pub listen: Vec<String>,
    /// `--bootstrap` (repeatable).
    pub bootstrap: Vec<String>,
    /// `--external-addr` (repeatable).
    pub external_addrs: Vec<String>,
    /// `--relay-server`.
    pub relay_server: Option<bool>,
    /// `--no-mdns`.
    pub mdns: Option<bool>,
    /// `--announce-secs`.
    pub announce_secs: Option<u64>,
    /// `--dev-gpus`.
    pub dev_gpus: Option<String>,
    /// `--metrics`.
    pub metrics: Option<String>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown keys included).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// An environment variable has an invalid value.
    #[error("environment variable {name}={value:?}: {problem}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A value that is not valid wherever it came from.
    #[error("{field}: {problem}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

fn parse_bool(name: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::Env {
            name,
            value: value.to_string(),
            problem: "expected true or false",
        }),
    }
}

fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Config {
    /// Merges defaults, the file text (if any), the environment (looked up through `env`) and
    /// the flags, then validates. `file_name` only labels errors.
    pub fn resolve(
        file: Option<(&str, &str)>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut c = match file {
            Some((name, text)) => {
                toml::from_str::<Config>(text).map_err(|e| ConfigError::Parse {
                    path: name.to_string(),
                    message: e.to_string().trim_end().to_string(),
                })?
            }
            None => Config::default(),
        };
        if let Some(v) = env(env_vars::GRIDLEASE_LISTEN) {
            c.listen = list(&v);
        }
        if let Some(v) = env(env_vars::GRIDLEASE_BOOTSTRAP) {
            c.bootstrap = list(&v);
        }
        if let Some(v) = env(env_vars::GRIDLEASE_EXTERNAL_ADDRS) {
            c.external_addrs = list(&v);
        }
        if let Some(v) = env(env_vars::GRIDLEASE_RELAY_SERVER) {
            c.relay_server = parse_bool(env_vars::GRIDLEASE_RELAY_SERVER, &v)?;
        }
        if let Some(v) = env(env_vars::GRIDLEASE_MDNS) {
            c.mdns = parse_bool(env_vars::GRIDLEASE_MDNS, &v)?;
        }
        if let Some(v) = env(env_vars::GRIDLEASE_ANNOUNCE_SECS) {
            c.announce_secs = v.trim().parse().map_err(|_| ConfigError::Env {
                name: env_vars::GRIDLEASE_ANNOUNCE_SECS,
                value: v.clone(),
                problem: "expected a whole number of seconds",
            })?;
        }
        if let Some(v) = env(env_vars::GRIDLEASE_DEV_GPUS) {
            c.dev_gpus = Some(v);
        }
        if let Some(v) = env(env_vars::GRIDLEASE_METRICS) {
            c.metrics = Some(v);
        }
        if let Some(v) = env(env_vars::GRIDLEASE_LOG_FORMAT) {
            c.log_format = match v.trim() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                _ => {
                    return Err(ConfigError::Env {
                        name: env_vars::GRIDLEASE_LOG_FORMAT,
                        value: v,
                        problem: "expected text or json",
                    });
                }
            };
        }
        if !flags.listen.is_empty() {
            c.listen = flags.listen.clone();
        }
        if !flags.bootstrap.is_empty() {
            c.bootstrap = flags.bootstrap.clone();
        }
        if !flags.external_addrs.is_empty() {
            c.external_addrs = flags.external_addrs.clone();
        }
        if let Some(v) = flags.relay_server {
            c.relay_server = v;
        }
        if let Some(v) = flags.mdns {
            c.mdns = v;
        }
        if let Some(v) = flags.announce_secs {
            c.announce_secs = v;
        }
        if let Some(v) = &flags.dev_gpus {
            c.dev_gpus = Some(v.clone());
        }
        if let Some(v) = &flags.metrics {
            c.metrics = Some(v.clone());
        }
        if let Some(v) = flags.log_format {
            c.log_format = v;
        }
        c.validate()?;
        Ok(c)
    }

    /// Reads `<home>/config.toml` if present, the process environment and `flags`.
    pub fn load(home: &Path, flags: &Overrides) -> Result<Self, ConfigError> {
        let path = home.join(CONFIG_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        let name = path.display().to_string();
        Self::resolve(
            text.as_deref().map(|t| (name.as_str(), t)),
            &|k| std::env::var(k).ok(),
            flags,
        )
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (field, addrs) in [
            ("listen", &self.listen),
            ("bootstrap", &self.bootstrap),
            ("external_addrs", &self.external_addrs),
        ] {
            for a in addrs {
                a.parse::<libp2p::Multiaddr>()
                    .map_err(|e| ConfigError::Invalid {
                        field,
                        problem: format!("{a:?} is not a multiaddr ({e})"),
                    })?;
            }
        }
        if self.listen.is_empty() {
            return Err(ConfigError::Invalid {
                field: "listen",
                problem: "at least one listen address is needed".into(),
            });
        }
        if self.announce_secs == 0 || self.announce_secs > 3600 {
            return Err(ConfigError::Invalid {
                field: "announce_secs",
                problem: format!("{} is not in 1..=3600", self.announce_secs),
            });
        }
        if let Some(m) = &self.metrics {
            m.parse::<std::net::SocketAddr>()
                .map_err(|_| ConfigError::Invalid {
                    field: "metrics",
                    problem: format!("{m:?} is not an IP:port address"),
                })?;
        }
        Ok(())
    }

    /// The configuration as TOML (what `--dump-config` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env(map: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = map
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn defaults_are_documented_values() {
        let c = Config::resolve(None, &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.announce_secs, 60);
        assert!(c.mdns);
    }

    #[test]
    fn precedence_is_defaults_file_env_flags() {
        let file = "announce_secs = 10\nmdns = false\nmetrics = \"127.0.0.1:9000\"\n";
        let e = env(&[
            ("GRIDLEASE_ANNOUNCE_SECS", "20"),
            ("GRIDLEASE_MDNS", "true"),
        ]);
        let c = Config::resolve(Some(("f", file)), &e, &Overrides::default()).unwrap();
        assert_eq!(c.announce_secs, 20, "env beats file");
        assert!(c.mdns, "env beats file");
        assert_eq!(
            c.metrics.as_deref(),
            Some("127.0.0.1:9000"),
            "file beats default"
        );
        let flags = Overrides {
            announce_secs: Some(30),
            ..Overrides::default()
        };
        let c = Config::resolve(Some(("f", file)), &e, &flags).unwrap();
        assert_eq!(c.announce_secs, 30, "flag beats env");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_clear_errors() {
        let err = Config::resolve(
            Some(("cfg.toml", "annouce_secs = 5\n")),
            &env(&[]),
            &Overrides::default(),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("cfg.toml") && msg.contains("annouce_secs"),
            "{msg}"
        );
        let err = Config::resolve(
            None,
            &env(&[("GRIDLEASE_MDNS", "maybe")]),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("GRIDLEASE_MDNS"), "{err}");
        let flags = Overrides {
            listen: vec!["not-an-addr".into()],
            ..Overrides::default()
        };
        let err = Config::resolve(None, &env(&[]), &flags).unwrap_err();
        assert!(err.to_string().contains("not-an-addr"), "{err}");
    }

    #[test]
    fn dump_round_trips() {
        let c = Config {
            dev_gpus: Some("RTX 4090:24GiB:0.40".into()),
            ..Config::default()
        };
        let again =
            Config::resolve(Some(("x", &c.to_toml())), &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(again, c);
    }
}
