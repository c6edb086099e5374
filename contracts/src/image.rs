//! Which images a provider runs: the reference grammar, the provider's image policy and the
//! admission rule that combines them with what is known about the image (its sizes, whether it
//! came from a registry, its config's environment).
//!
//! Pure: the node asks the registry or the local daemon for [`ImageFacts`] and hands them in.
//! [`check_reference`] needs no facts and runs inside [`crate::terms::check_request`];
//! [`admit`] runs once the facts are known, before the provider signs anything.
//!
//! # Reference grammar
//! `[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`, as Docker's distribution reference: `PATH` is one or
//! more `/`-separated components of lower-case letters and digits joined by `.`, `_`, `__` or
//! dashes; the first component is a host when it contains `.` or `:` or is `localhost`; `TAG`
//! is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; the digest is sha256 with 64 lower-case hex digits.
//! No host means `docker.io`, a one-component path on `docker.io` means `library/PATH`, and no
//! tag and no digest means `:latest`; [`ImageRef::canonical`] spells all of that out, and every
//! comparison (allowed prefixes, listed local images) is between canonical forms.
//!
//! Refused outright: bare ids (`sha256:…`, or 12 to 64 hex digits with nothing else: Docker
//! would resolve them to whatever image the provider happens to hold), upper-case paths,
//! empty components, over-long names.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use gridlease_protocol::{ImageRefusal, ImageSize, MAX_IMAGE_LEN};

/// Docker Hub, the registry of references without a host.
pub const DOCKER_HUB: &str = "docker.io";

/// The registries a provider allows unless it says otherwise: the big public registries that
/// serve GPU images (Docker Hub, NVIDIA NGC, GitHub, Quay, Amazon ECR Public).
pub const DEFAULT_REGISTRIES: &[&str] = &[
    "docker.io",
    "nvcr.io",
    "ghcr.io",
    "quay.io",
    "public.ecr.aws",
];

/// Default cap on an image's compressed size (what a pull downloads): 20 GiB, above the
/// largest common CUDA + PyTorch images.
pub const DEFAULT_MAX_COMPRESSED_BYTES: u64 = 20 << 30;
/// Default cap on an image's unpacked size on the provider's disk: 60 GiB.
pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 60 << 30;

/// A parsed image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host, with port if any (`docker.io` when the reference names none).
    pub registry: String,
    /// Repository path (`library/ubuntu` for `ubuntu` on Docker Hub).
    pub path: String,
    /// Tag (`latest` when neither tag nor digest is given).
    pub tag: Option<String>,
    /// `sha256:<hex>` digest, if pinned.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses `s` with the grammar in the module docs.
    pub fn parse(s: &str) -> Result<Self, ImageRefusal> {
        let bad = |detail: &str| ImageRefusal::BadReference {
            detail: detail.to_string(),
        };
        if s.is_empty() {
            return Err(bad("empty image reference"));
        }
        if s.len() > MAX_IMAGE_LEN {
            return Err(bad("image reference longer than 256 bytes"));
        }
        if looks_like_id(s) {
            return Err(ImageRefusal::BareId);
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("a digest must be sha256:<64 hex digits>"))?;
                if hex.len() != 64
                    || !hex
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                {
                    return Err(bad("a digest must be sha256:<64 lower-case hex digits>"));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        // A tag is after the last ':' that follows the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(i) if last_slash.is_none_or(|j| i > j) => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag
            && !valid_tag(t)
        {
            return Err(bad(
                "a tag is 1-128 of [A-Za-z0-9_.-], not starting with . or -",
            ));
        }
        let mut parts: Vec<&str> = name.split('/').collect();
        let registry = if parts.len() > 1
            && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
        {
            let host = parts.remove(0);
            if !valid_host(host) {
                return Err(bad("the registry host is not a valid host[:port]"));
            }
            host.to_string()
        } else {
            DOCKER_HUB.to_string()
        };
        if parts.iter().any(|c| !valid_component(c)) {
            return Err(bad(
                "repository path components are lower-case letters and digits, separated by . _ __ or -",
            ));
        }
        if registry == DOCKER_HUB && parts.len() == 1 {
            parts.insert(0, "library");
        }
        let path = parts.join("/");
        if path.len() > 255 {
            return Err(bad("repository name longer than 255 bytes"));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(Self {
            registry,
            path,
            tag,
            digest,
        })
    }

    /// `registry/path[:tag][@digest]`, every default spelled out.
    pub fn canonical(&self) -> String {
        let mut s = format!("{}/{}", self.registry, self.path);
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push('@');
            s.push_str(d);
        }
        s
    }

    /// `registry/path`, without tag or digest.
    pub fn repository(&self) -> String {
        format!("{}/{}", self.registry, self.path)
    }
}

fn looks_like_id(s: &str) -> bool {
    if let Some(hex) = s.strip_prefix("sha256:") {
        return !hex.contains('/');
    }
    (12..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    // Separators: '.', '_', '__', or any run of '-'.
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

fn alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn valid_host(h: &str) -> bool {
    let (name, port) = match h.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (h, None),
    };
    if let Some(p) = port
        && (p.is_empty()
            || p.len() > 5
            || !p.bytes().all(|b| b.is_ascii_digit())
            || p.parse::<u16>().is_err())
    {
        return false;
    }
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

/// True for registry hosts inside the provider's own networks: `localhost` and other local
/// names (`.local`, `.localhost`, `.internal`, `.lan`, `.home.arpa`, single labels), and IP
/// literals that are loopback, private (RFC 1918), shared (CGNAT, 100.64.0.0/10), link-local
/// (incl. 169.254.169.254), unspecified or IPv6 unique-local. A hostname that *resolves* to such
/// an address is not caught here (the daemon resolves it): see `docs/security-model.md`.
pub fn is_private_host(registry: &str) -> bool {
    let name = registry.rsplit_once(':').map_or(registry, |(n, _)| n);
    let lower = name.to_ascii_lowercase();
    if let Ok(ip) = lower.parse::<IpAddr>() {
        return private_ip(ip);
    }
    lower == "localhost"
        || !lower.contains('.')
        || [
            ".local",
            ".localhost",
            ".internal",
            ".lan",
            ".home.arpa",
            ".localdomain",
        ]
        .iter()
        .any(|s| lower.ends_with(s))
}

fn private_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(private_v4)
                || v6 == Ipv6Addr::UNSPECIFIED
        }
    }
}

fn private_v4(v4: Ipv4Addr) -> bool {
    let o = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_broadcast()
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
        || o[0] == 0
}

/// The provider's image rules.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ImagePolicy {
    /// Registry hosts (with port, if not the default) images may come from. A private host
    /// ([`is_private_host`]) is allowed only when listed here exactly.
    pub registries: Vec<String>,
    /// If not empty, an image's canonical reference must start with one of these (e.g.
    /// `docker.io/pytorch/`); each is compared as written, so list canonical prefixes.
    pub prefixes: Vec<String>,
    /// Local images (never pulled from a registry) the provider allows, as references.
    pub local_images: Vec<String>,
    /// Largest compressed size (sum of layer sizes in the registry manifest), bytes.
    pub max_compressed_bytes: u64,
    /// Largest unpacked size on the provider's disk, bytes.
    pub max_unpacked_bytes: u64,
}

impl Default for ImagePolicy {
    fn default() -> Self {
        Self {
            registries: DEFAULT_REGISTRIES.iter().map(|s| s.to_string()).collect(),
            prefixes: Vec::new(),
            local_images: Vec::new(),
            max_compressed_bytes: DEFAULT_MAX_COMPRESSED_BYTES,
            max_unpacked_bytes: DEFAULT_MAX_UNPACKED_BYTES,
        }
    }
}

impl ImagePolicy {
    /// Whether `r` is one of the listed local images (compared canonically).
    pub fn lists_local(&self, r: &ImageRef) -> bool {
        let c = r.canonical();
        self.local_images
            .iter()
            .filter_map(|l| ImageRef::parse(l).ok())
            .any(|l| l.canonical() == c)
    }
}

/// Whether the provider's own policy is usable: registries are hosts, local images are valid
/// references, prefixes fit an offer (at most 16, each at most 256 bytes), caps above zero.
pub fn check_policy(p: &ImagePolicy) -> Result<(), String> {
    use gridlease_protocol::{MAX_OFFER_LOCAL_IMAGES, MAX_OFFER_REGISTRIES, MAX_REGISTRY_LEN};
    // The offer carries the policy (renters check names against it before asking).
    if p.registries.len() > MAX_OFFER_REGISTRIES {
        return Err(format!("at most {MAX_OFFER_REGISTRIES} registries"));
    }
    for h in &p.registries {
        if !valid_host(h) || h.len() > MAX_REGISTRY_LEN {
            return Err(format!(
                "registry {h:?} is not a host[:port] of at most {MAX_REGISTRY_LEN} bytes"
            ));
        }
    }
    if p.local_images.len() > MAX_OFFER_LOCAL_IMAGES {
        return Err(format!("at most {MAX_OFFER_LOCAL_IMAGES} local images"));
    }
    for l in &p.local_images {
        // At most MAX_IMAGE_LEN bytes, as every reference.
        ImageRef::parse(l).map_err(|r| format!("local image {l:?}: {}", refusal_text(&r)))?;
    }
    if p.prefixes.len() > gridlease_protocol::MAX_IMAGE_PREFIXES {
        return Err(format!(
            "at most {} image prefixes",
            gridlease_protocol::MAX_IMAGE_PREFIXES
        ));
    }
    if let Some(x) = p
        .prefixes
        .iter()
        .find(|x| x.is_empty() || x.len() > MAX_IMAGE_LEN)
    {
        return Err(format!(
            "image prefix {x:?} must be 1 to {MAX_IMAGE_LEN} bytes"
        ));
    }
    if p.max_compressed_bytes == 0 || p.max_unpacked_bytes == 0 {
        return Err("image size caps must be above zero".into());
    }
    Ok(())
}

/// What images an offer's policy runs, in words: pulled from its registries (within its
/// prefixes, if any) and its local images.
pub fn policy_text(registries: &[String], prefixes: &[String], local: &[String]) -> String {
    let pulled = match (registries.is_empty(), prefixes.is_empty()) {
        (true, _) => "no pulled images".to_string(),
        (false, true) => format!("any image from {}", registries.join(", ")),
        (false, false) => format!(
            "images from {} starting with {}",
            registries.join(", "),
            prefixes.join(", ")
        ),
    };
    if local.is_empty() {
        pulled
    } else {
        format!(
            "{pulled}; its local images (never pulled): {}",
            local.join(", ")
        )
    }
}

/// Checks a reference against the policy without any facts: grammar, bare ids, registry and
/// prefix lists. A listed local image passes (its registry is never contacted).
pub fn check_reference(policy: &ImagePolicy, image: &str) -> Result<ImageRef, ImageRefusal> {
    let r = ImageRef::parse(image)?;
    if policy.lists_local(&r) {
        return Ok(r);
    }
    let listed = policy
        .registries
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&r.registry));
    if !listed {
        return Err(if is_private_host(&r.registry) {
            ImageRefusal::PrivateRegistry {
                registry: r.registry.clone(),
            }
        } else {
            ImageRefusal::RegistryNotAllowed {
                registry: r.registry.clone(),
            }
        });
    }
    let canonical = r.canonical();
    if !policy.prefixes.is_empty()
        && !policy
            .prefixes
            .iter()
            .any(|p| canonical.starts_with(p.as_str()))
    {
        return Err(ImageRefusal::NotListed);
    }
    Ok(r)
}

/// Where the facts about an image come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageSource {
    /// Present in the local daemon and pulled from a registry before (it has a repo digest).
    Pulled,
    /// Present in the local daemon and never pulled (built, imported or tagged locally).
    LocalOnly,
    /// Not present locally; the registry's manifest and config were read.
    Registry,
}

/// What the node learned about an image before signing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFacts {
    /// Where the facts come from.
    pub source: ImageSource,
    /// Sum of the layers' compressed sizes, when read from a registry manifest.
    pub compressed_bytes: Option<u64>,
    /// Unpacked size, when the image is present locally.
    pub unpacked_bytes: Option<u64>,
    /// The image config's environment (`NAME=value`).
    pub env: Vec<String>,
}

/// Whether the provider runs this image: `image` passed [`check_reference`]; `facts` are what
/// the registry or the daemon said; `host_cuda` is the highest CUDA version the driver of the
/// leased GPUs supports (`None` for CPU-only leases or unknown drivers: no CUDA check).
pub fn admit(
    policy: &ImagePolicy,
    image: &ImageRef,
    facts: &ImageFacts,
    host_cuda: Option<&str>,
) -> Result<(), ImageRefusal> {
    if facts.source == ImageSource::LocalOnly && !policy.lists_local(image) {
        return Err(ImageRefusal::LocalOnly);
    }
    if let Some(bytes) = facts.compressed_bytes
        && bytes > policy.max_compressed_bytes
    {
        return Err(ImageRefusal::TooLarge {
            size: ImageSize::Compressed,
            bytes,
            max: policy.max_compressed_bytes,
        });
    }
    if let Some(bytes) = facts.unpacked_bytes
        && bytes > policy.max_unpacked_bytes
    {
        return Err(ImageRefusal::TooLarge {
            size: ImageSize::Unpacked,
            bytes,
            max: policy.max_unpacked_bytes,
        });
    }
    for kv in &facts.env {
        let name = kv
            .split('=')
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        if name == "LD_PRELOAD" || name == "LD_AUDIT" {
            return Err(ImageRefusal::Preload);
        }
    }
    if let Some(host) = host_cuda.and_then(CudaVersion::parse)
        && let Some(needs) = cuda_requirement(&facts.env)
        && needs > host
    {
        return Err(ImageRefusal::CudaTooNew {
            needs: needs.to_string(),
            host: host.to_string(),
        });
    }
    Ok(())
}

/// An image this provider pulled for a lease and keeps in its cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedImage {
    /// The reference it was pulled as.
    pub reference: String,
    /// When a lease last started with it (unix ms).
    pub last_used: u64,
    /// Its unpacked size, bytes.
    pub bytes: u64,
    /// A live lease uses it now (never evicted).
    pub in_use: bool,
}

/// The provider's bounds on its cache of pulled images.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheLimits {
    /// Most images kept.
    pub max_images: u32,
    /// Most bytes kept (unpacked).
    pub max_bytes: u64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            max_images: 8,
            max_bytes: 100 << 30,
        }
    }
}

/// Which cached images to remove so the rest fit `limits`: least recently used first, never
/// one in use (so the cache may stay over its bounds while leases use its images).
pub fn evictions(cached: &[CachedImage], limits: CacheLimits) -> Vec<String> {
    let mut by_recent: Vec<&CachedImage> = cached.iter().collect();
    by_recent.sort_by(|a, b| {
        b.last_used
            .cmp(&a.last_used)
            .then(a.reference.cmp(&b.reference))
    });
    let (mut kept, mut bytes) = (0u32, 0u64);
    let mut out = Vec::new();
    // In-use images count first: they stay whatever happens.
    for c in by_recent.iter().filter(|c| c.in_use) {
        kept += 1;
        bytes = bytes.saturating_add(c.bytes);
    }
    for c in by_recent.iter().filter(|c| !c.in_use) {
        if kept < limits.max_images && bytes.saturating_add(c.bytes) <= limits.max_bytes {
            kept += 1;
            bytes = bytes.saturating_add(c.bytes);
        } else {
            out.push(c.reference.clone());
        }
    }
    out
}

/// A CUDA version, major.minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    /// Major.
    pub major: u16,
    /// Minor.
    pub minor: u16,
}

impl CudaVersion {
    /// Parses `12`, `12.4` or `12.4.1` (the patch is ignored: drivers support whole minors).
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.trim().split('.');
        let major = it.next()?.parse().ok()?;
        let minor = match it.next() {
            Some(m) => m.parse().ok()?,
            None => 0,
        };
        Some(Self { major, minor })
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The CUDA version an image needs, from its config's environment: NVIDIA's
/// `NVIDIA_REQUIRE_CUDA` (`cuda>=12.8 brand=…`; the container toolkit enforces the same) or,
/// failing that, `CUDA_VERSION` (set by every `nvidia/cuda` base image).
pub fn cuda_requirement(env: &[String]) -> Option<CudaVersion> {
    let get = |name: &str| {
        env.iter().find_map(|kv| {
            kv.split_once('=')
                .filter(|(k, _)| *k == name)
                .map(|(_, v)| v)
        })
    };
    if let Some(req) = get("NVIDIA_REQUIRE_CUDA") {
        let v = req
            .split_whitespace()
            .find_map(|w| w.strip_prefix("cuda>="))
            .and_then(CudaVersion::parse);
        if v.is_some() {
            return v;
        }
    }
    get("CUDA_VERSION").and_then(CudaVersion::parse)
}

/// One sentence for a refusal, for the renter.
pub fn refusal_text(r: &ImageRefusal) -> String {
    fn gib(b: u64) -> String {
        format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
    }
    match r {
        ImageRefusal::BadReference { detail } => format!("bad image reference: {detail}"),
        ImageRefusal::BareId => {
            "a bare image id names whatever the provider happens to hold; name a repository and a tag or digest".into()
        }
        ImageRefusal::RegistryNotAllowed { registry } => {
            format!("the provider does not pull from registry {registry}")
        }
        ImageRefusal::PrivateRegistry { registry } => format!(
            "registry {registry} is a loopback, private or local-network host, which the provider does not allow"
        ),
        ImageRefusal::NotListed => "the image is outside the repositories the provider allows".into(),
        ImageRefusal::LocalOnly => {
            "the image exists only on the provider's machine and is not one it offers".into()
        }
        ImageRefusal::TooLarge { size, bytes, max } => format!(
            "the image is {} {}, over the provider's cap of {}",
            gib(*bytes),
            match size {
                ImageSize::Compressed => "compressed",
                ImageSize::Unpacked => "unpacked",
            },
            gib(*max)
        ),
        ImageRefusal::Preload => "the image's config sets LD_PRELOAD or LD_AUDIT".into(),
        ImageRefusal::CudaTooNew { needs, host } => {
            format!("image needs CUDA {needs}, host driver supports {host}")
        }
        ImageRefusal::Unavailable { detail } => format!("image not available: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        ImageRef::parse(s).unwrap().canonical()
    }

    #[test]
    fn defaults_are_spelled_out() {
        assert_eq!(canon("ubuntu"), "docker.io/library/ubuntu:latest");
        assert_eq!(
            canon("pytorch/pytorch:2.5.1-cuda12.4"),
            "docker.io/pytorch/pytorch:2.5.1-cuda12.4"
        );
        assert_eq!(
            canon("nvcr.io/nvidia/pytorch:24.10-py3"),
            "nvcr.io/nvidia/pytorch:24.10-py3"
        );
        assert_eq!(canon("127.0.0.1:5000/probe:v1"), "127.0.0.1:5000/probe:v1");
        assert_eq!(canon("localhost/x"), "localhost/x:latest");
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            canon(&format!("ubuntu@{d}")),
            format!("docker.io/library/ubuntu@{d}")
        );
        assert_eq!(
            canon(&format!("ubuntu:22.04@{d}")),
            format!("docker.io/library/ubuntu:22.04@{d}")
        );
    }

    #[test]
    fn bad_references_are_refused() {
        for s in [
            "",
            "Ubuntu",
            "ubuntu:",
            "ubuntu:-x",
            "a//b",
            "/ubuntu",
            "ubuntu/",
            "a..b/c",
            "ubuntu@sha256:abc",
            "ubuntu@md5:0123",
            "host:99999/x",
            "ubu ntu",
            "x;rm -rf",
        ] {
            assert!(
                matches!(ImageRef::parse(s), Err(ImageRefusal::BadReference { .. })),
                "{s:?} accepted"
            );
        }
        assert!(ImageRef::parse(&"a".repeat(300)).is_err());
    }

    #[test]
    fn bare_ids_are_refused() {
        for s in [
            format!("sha256:{}", "0".repeat(64)),
            "0123456789ab".to_string(),
            "f".repeat(64),
        ] {
            assert_eq!(ImageRef::parse(&s), Err(ImageRefusal::BareId), "{s}");
        }
        // Short hex-looking names are names.
        assert!(ImageRef::parse("abc123").is_ok());
    }

    #[test]
    fn private_hosts() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "10.1.2.3",
            "192.168.1.10:443",
            "172.16.0.1",
            "100.64.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "nas.local",
            "registry.internal",
            "printer.lan",
            "box.home.arpa",
            "myregistry:5000",
        ] {
            assert!(is_private_host(h), "{h}");
        }
        for h in [
            "docker.io",
            "nvcr.io",
            "8.8.8.8",
            "registry.example.com:5000",
            "100.128.0.1",
        ] {
            assert!(!is_private_host(h), "{h}");
        }
    }

    #[test]
    fn registries_prefixes_and_private_hosts() {
        let p = ImagePolicy::default();
        assert!(check_reference(&p, "pytorch/pytorch:latest").is_ok());
        assert_eq!(
            check_reference(&p, "evil.example.com/x:1"),
            Err(ImageRefusal::RegistryNotAllowed {
                registry: "evil.example.com".into()
            })
        );
        assert_eq!(
            check_reference(&p, "192.168.1.1:5000/x:1"),
            Err(ImageRefusal::PrivateRegistry {
                registry: "192.168.1.1:5000".into()
            })
        );
        assert_eq!(
            check_reference(&p, "169.254.169.254/latest:meta"),
            Err(ImageRefusal::PrivateRegistry {
                registry: "169.254.169.254".into()
            })
        );
        // Listing a private host exactly allows it.
        let mut q = ImagePolicy::default();
        q.registries.push("127.0.0.1:5000".into());
        assert!(check_reference(&q, "127.0.0.1:5000/probe:v1").is_ok());
        assert!(check_reference(&q, "127.0.0.1:5001/probe:v1").is_err());
        // Prefixes compare canonical forms.
        q.prefixes = vec!["docker.io/pytorch/".into()];
        assert!(check_reference(&q, "pytorch/pytorch").is_ok());
        assert_eq!(check_reference(&q, "ubuntu"), Err(ImageRefusal::NotListed));
        // A listed local image passes whatever the lists say.
        q.local_images = vec!["gridlease-probe:0.1.0".into()];
        assert!(check_reference(&q, "docker.io/library/gridlease-probe:0.1.0").is_ok());
    }

    fn facts(source: ImageSource) -> ImageFacts {
        ImageFacts {
            source,
            compressed_bytes: None,
            unpacked_bytes: None,
            env: Vec::new(),
        }
    }

    #[test]
    fn admission() {
        let mut p = ImagePolicy::default();
        let r = ImageRef::parse("gridlease-probe:1").unwrap();
        assert_eq!(
            admit(&p, &r, &facts(ImageSource::LocalOnly), None),
            Err(ImageRefusal::LocalOnly)
        );
        p.local_images.push("gridlease-probe:1".into());
        assert_eq!(admit(&p, &r, &facts(ImageSource::LocalOnly), None), Ok(()));

        p.max_compressed_bytes = 100;
        let mut f = facts(ImageSource::Registry);
        f.compressed_bytes = Some(101);
        assert_eq!(
            admit(&p, &r, &f, None),
            Err(ImageRefusal::TooLarge {
                size: ImageSize::Compressed,
                bytes: 101,
                max: 100
            })
        );
        f.compressed_bytes = Some(100);
        assert_eq!(admit(&p, &r, &f, None), Ok(()));
        f.env = vec!["ld_preload=/x.so".into()];
        assert_eq!(admit(&p, &r, &f, None), Err(ImageRefusal::Preload));
    }

    #[test]
    fn cuda_compatibility() {
        let p = ImagePolicy::default();
        let r = ImageRef::parse("nvidia/cuda:12.8.0-base").unwrap();
        let mut f = facts(ImageSource::Registry);
        f.env = vec![
            "PATH=/usr/bin".into(),
            "NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471".into(),
            "CUDA_VERSION=12.8.0".into(),
        ];
        assert_eq!(
            admit(&p, &r, &f, Some("12.4")),
            Err(ImageRefusal::CudaTooNew {
                needs: "12.8".into(),
                host: "12.4".into()
            })
        );
        assert_eq!(admit(&p, &r, &f, Some("12.8")), Ok(()));
        assert_eq!(admit(&p, &r, &f, Some("13.0")), Ok(()));
        assert_eq!(admit(&p, &r, &f, None), Ok(()));
        // CUDA_VERSION alone.
        f.env = vec!["CUDA_VERSION=11.8.0".into()];
        assert_eq!(cuda_requirement(&f.env), CudaVersion::parse("11.8"));
        assert!(admit(&p, &r, &f, Some("11.7")).is_err());
        // No CUDA in the image: nothing to check.
        assert_eq!(cuda_requirement(&["HOME=/".into()]), None);
    }

    #[test]
    fn eviction_is_least_recently_used_and_spares_images_in_use() {
        let c = |r: &str, t: u64, b: u64, u: bool| CachedImage {
            reference: r.into(),
            last_used: t,
            bytes: b,
            in_use: u,
        };
        let cached = [
            c("a", 1, 10, false),
            c("b", 2, 10, false),
            c("c", 3, 10, false),
            c("d", 4, 10, true),
        ];
        let two = CacheLimits {
            max_images: 2,
            max_bytes: u64::MAX,
        };
        assert_eq!(
            evictions(&cached, two),
            vec!["b".to_string(), "a".to_string()]
        );
        let bytes = CacheLimits {
            max_images: 10,
            max_bytes: 25,
        };
        assert_eq!(
            evictions(&cached, bytes),
            vec!["b".to_string(), "a".to_string()]
        );
        // In use: kept even past the bounds.
        let none = CacheLimits {
            max_images: 0,
            max_bytes: 0,
        };
        assert_eq!(evictions(&cached, none).len(), 3);
        assert!(evictions(&[], two).is_empty());
    }

    #[test]
    fn refusal_sentences_name_what_matters() {
        let t = refusal_text(&ImageRefusal::CudaTooNew {
            needs: "12.8".into(),
            host: "12.4".into(),
        });
        assert_eq!(t, "image needs CUDA 12.8, host driver supports 12.4");
        let t = refusal_text(&ImageRefusal::TooLarge {
            size: ImageSize::Compressed,
            bytes: 3 << 30,
            max: 2 << 30,
        });
        assert!(
            t.contains("3.0 GiB compressed") && t.contains("2.0 GiB"),
            "{t}"
        );
    }
}
