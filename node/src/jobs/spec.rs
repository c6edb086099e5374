//! The job spec (`gridlease job run SPEC`, issue 46): a YAML file in a documented subset that
//! SkyPilot users will recognise, parsed and checked here before anything is rented. Every
//! error names the field and, where the file has it, the line. `docs/job-spec.schema.json`
//! (for editors) is generated from these types (`cargo run -p gridlease-node --example
//! job_schema`) and a test holds the file to them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gridlease_contracts::Money;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most tasks in one job.
pub const MAX_TASKS: u32 = 100_000;
/// Most leases a job holds at once.
pub const MAX_CONCURRENCY: u32 = 64;
/// Most tasks one lease runs one after another.
pub const MAX_TASKS_PER_LEASE: u32 = 1000;
/// Where a lease that runs several tasks is handed each one, in `/workspace`.
pub const WORKER_DIR: &str = ".gridlease";
/// Most attempts after the first, per task.
pub const MAX_RETRIES: u32 = 100;
/// Shortest task timeout, seconds (a lease needs time to start).
pub const MIN_TIMEOUT_S: u32 = 10;
/// Longest task timeout, seconds (one week).
pub const MAX_TIMEOUT_S: u32 = 7 * 24 * 3600;
/// How long a job waits for an eligible offer by default, seconds.
pub const DEFAULT_OFFER_WAIT_S: u32 = 300;
/// Longest wait for an eligible offer, seconds (one week).
pub const MAX_OFFER_WAIT_S: u32 = 7 * 24 * 3600;
/// Shortest checkpoint interval, seconds.
pub const MIN_CHECKPOINT_EVERY_S: u32 = 2;
/// Most bytes of a spec file.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
/// Most bytes of a tasks file.
pub const MAX_TASKS_FILE_BYTES: u64 = 16 << 20;
/// Most bytes of one task's argument line.
pub const MAX_TASK_ARG_BYTES: usize = 4096;
/// The environment variables every task gets; a spec's `envs` may not set them.
pub const TASK_VARS: [&str; 3] = ["TASK_INDEX", "TASK_COUNT", "TASK_ARGS"];

/// A job spec as written. Unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "gridlease job spec",
    description = "A batch of tasks fanned over many providers: `gridlease job run SPEC` (docs/jobs.md)."
)]
pub struct JobSpec {
    /// The job's name: 1 to 64 letters, digits, `.`, `_` or `-`.
    pub name: String,
    /// What each task's lease needs; the cheapest eligible offers are used first.
    #[serde(default)]
    pub resources: Resources,
    /// Container image of every task.
    pub image: String,
    /// Environment variables of every task (`TASK_INDEX`, `TASK_COUNT` and `TASK_ARGS` are set
    /// by the runner).
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Files copied into each attempt's `/workspace` before its command starts: destination
    /// (`/workspace/...`, or relative to it) to local path (relative to the spec's directory).
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// Shell commands run before `run` in each attempt (`/bin/sh`, in `/workspace`).
    #[serde(default)]
    pub setup: Option<String>,
    /// The task's shell commands (`/bin/sh -e`, in `/workspace`), with `$TASK_INDEX`
    /// (0-based), `$TASK_COUNT` and `$TASK_ARGS` (the task's line of a tasks file) set.
    pub run: String,
    /// How many tasks: a count, or a file (relative to the spec's directory) with one argument
    /// line per task.
    pub tasks: Tasks,
    /// Paths in `/workspace` copied home into `OUT/<task>/` when a task succeeds.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// A directory the task writes its checkpoints to: copied home every `every` and at the
    /// task's end (only what changed), and into the next attempt before its command starts.
    #[serde(default)]
    pub checkpoint: Option<Checkpoint>,
    /// Retries: provider faults always retry elsewhere (up to `max`); a non-zero exit only
    /// when its code is listed.
    #[serde(default)]
    pub retries: Retries,
    /// Most tasks running at once (each on its own lease).
    #[serde(default = "one")]
    pub concurrency: u32,
    /// Most tasks one lease runs, one after another (default 1: a lease per task). Above 1, a
    /// lease whose task ended (succeeded, or exited non-zero) is handed the next task waiting:
    /// the lease's start, its inputs' upload and `setup` are paid once for all its tasks. Each
    /// task starts with the last one's `outputs` and `checkpoint` removed (what else a task
    /// leaves in `/workspace` the next one sees). The lease is rented for `tasks_per_lease`
    /// times `timeout` (at most the offer's longest lease); each task's `timeout` is kept by
    /// this node. The image needs `sleep`, `mv`, `rm` and `mkdir` (busybox or coreutils).
    #[serde(default = "one")]
    pub tasks_per_lease: u32,
    /// Longest one attempt of a task runs: `30m`, `2h`, or seconds. With a lease per task it
    /// is the lease's duration (offers whose shortest lease is longer are not used); with
    /// `tasks_per_lease` above 1 this node stops a task's lease when the task runs past it.
    pub timeout: Duration,
    /// The job's spending cap.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// How long the job waits for an eligible offer while none of its tasks is in flight
    /// before it ends, the tasks left failed (default `5m`; 1 s to 7 days). While its own
    /// tasks hold the offers it waits for them, however long they run.
    #[serde(default = "default_offer_wait")]
    pub offer_wait: Duration,
}

fn one() -> u32 {
    1
}

fn default_offer_wait() -> Duration {
    Duration(DEFAULT_OFFER_WAIT_S)
}

/// What a task's lease needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// GPU model text, matched as the search's `gpu~TEXT` (case-insensitive substring), e.g.
    /// `4090` or `A100`.
    #[serde(default)]
    pub gpu: Option<String>,
    /// GPUs per task (default 1).
    #[serde(default)]
    pub gpus: Option<u16>,
    /// Least VRAM per GPU, GiB (`24` or `24GiB`).
    #[serde(default)]
    pub vram: Option<Gib>,
    /// Highest price per GPU-hour (decimal GLU).
    #[serde(default)]
    pub max_price: Option<Amount>,
    /// Least provider reputation, 0 to 1 (`docs/reputation.md`).
    #[serde(default)]
    pub min_reputation: Option<f64>,
    /// Only offers that grant the GPU check at the lease's start (proof of GPU,
    /// `docs/gpu.md`); the check runs and a failed one is a provider fault. Default false: the
    /// check still runs on offers that grant it.
    #[serde(default)]
    pub verified: bool,
    /// More search terms (`docs/search.md`), e.g. `region=eu cuda>=12.4`.
    #[serde(default)]
    pub query: Option<String>,
}

/// `tasks:` a count, or a file of argument lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tasks {
    /// This many tasks, `$TASK_ARGS` empty.
    Count(u32),
    /// One task per line of this file.
    File(String),
}

impl Serialize for Tasks {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Count(n) => s.serialize_u32(*n),
            Self::File(f) => s.serialize_str(f),
        }
    }
}

impl<'de> Deserialize<'de> for Tasks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => u32::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_TASKS).contains(n))
                .map(Self::Count)
                .ok_or_else(|| {
                    D::Error::custom(format!(
                        "{n} is not a number of tasks (1 to {MAX_TASKS}, or a file of argument lines)"
                    ))
                }),
            NumOrText::Float(f) => Err(D::Error::custom(format!(
                "{f} is not a number of tasks (a whole number, 1 to {MAX_TASKS})"
            ))),
            NumOrText::Text(t) if t.trim().is_empty() => {
                Err(D::Error::custom("an empty file name"))
            }
            NumOrText::Text(t) => Ok(Self::File(t)),
        }
    }
}

impl JsonSchema for Tasks {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Tasks".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A number of tasks, or a file with one argument line per task.",
            "oneOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_TASKS},
                {"type": "string", "minLength": 1}
            ]
        })
    }
}

/// A number, or text, as YAML gives scalars.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Int(i64),
    Float(f64),
    Text(String),
}

/// A duration: `90s`, `30m`, `1h30m`, or a number of seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Duration(pub u32);

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let secs = match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => u32::try_from(n).map_err(|_| {
                D::Error::custom(format!("{n} is not a duration (seconds, 0 or more)"))
            })?,
            NumOrText::Float(f) => {
                return Err(D::Error::custom(format!(
                    "{f} is not a duration: whole seconds, or e.g. 90s, 30m, 1h30m"
                )));
            }
            NumOrText::Text(t) => {
                let d = humantime::parse_duration(t.trim()).map_err(|e| {
                    D::Error::custom(format!(
                        "{t:?} is not a duration ({e}): write e.g. 90s, 30m or 1h30m"
                    ))
                })?;
                u32::try_from(d.as_secs())
                    .map_err(|_| D::Error::custom(format!("{t:?} is too long")))?
            }
        };
        Ok(Self(secs))
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: seconds, or text such as 90s, 30m, 1h30m.",
            "oneOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^\\s*[0-9]+\\s*[a-z]+"}
            ]
        })
    }
}

/// An amount of GLU: `0.45` or `"0.45"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Amount(pub Money);

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let text = match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => n.to_string(),
            NumOrText::Float(f) => f.to_string(),
            NumOrText::Text(t) => t,
        };
        if text.trim_start().starts_with('-') {
            return Err(D::Error::custom(format!(
                "{text} is negative: an amount is 0 or more"
            )));
        }
        text.trim()
            .parse::<Money>()
            .map(Self)
            .map_err(|e| D::Error::custom(format!("{text:?} is not an amount: {e}")))
    }
}

impl JsonSchema for Amount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Amount".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "An amount of GLU, decimal (at most 6 decimals), e.g. 0.45.",
            "oneOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,6})?$"}
            ]
        })
    }
}

/// GiB: `24`, or `24GiB`/`24G`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gib(pub u32);

impl Serialize for Gib {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl<'de> Deserialize<'de> for Gib {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let bad = |t: &dyn std::fmt::Display| {
            D::Error::custom(format!("{t} is not a size in GiB: write e.g. 24 or 24GiB"))
        };
        match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => u32::try_from(n).map(Self).map_err(|_| bad(&n)),
            NumOrText::Float(f) => Err(bad(&f)),
            NumOrText::Text(t) => {
                let digits = t
                    .trim()
                    .trim_end_matches(|c: char| c.is_ascii_alphabetic())
                    .trim();
                let unit = t.trim()[digits.len()..].trim().to_ascii_lowercase();
                if !matches!(unit.as_str(), "" | "g" | "gb" | "gib") {
                    return Err(bad(&t));
                }
                digits.parse::<u32>().map(Self).map_err(|_| bad(&t))
            }
        }
    }
}

impl JsonSchema for Gib {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Gib".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "GiB: a whole number, optionally with the unit GiB.",
            "oneOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^\\s*[0-9]+\\s*([Gg]([Ii]?[Bb])?)?\\s*$"}
            ]
        })
    }
}

/// `checkpoint:`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// The directory in `/workspace` the task writes its checkpoints to.
    pub path: String,
    /// How often it is copied home while the task runs: `60s`, `5m`, or seconds.
    pub every: Duration,
}

/// `retries:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retries {
    /// Most attempts after the first, per task (default 3).
    #[serde(default = "three")]
    pub max: u32,
    /// Exit codes that are retried (like a provider fault, but on any provider); other
    /// non-zero exits fail the task at once.
    #[serde(default)]
    pub on_exit_codes: Vec<i32>,
}

fn three() -> u32 {
    3
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            max: three(),
            on_exit_codes: Vec::new(),
        }
    }
}

/// `budget:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// The most the whole job may spend, GLU: every lease's possible spend (what it may still
    /// be charged plus what it was) counts before it is rented.
    pub max_total: Amount,
}

/// A spec that cannot run: which field, on which line, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{field}: {message}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct SpecError {
    /// The field, dotted (`resources.gpus`, `outputs[1]`); empty for the whole file.
    pub field: String,
    /// 1-based line of the file, when known.
    pub line: Option<usize>,
    /// Why, in words.
    pub message: String,
}

/// A checked job: the spec with its relative paths resolved and its tasks listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The spec as written.
    pub spec: JobSpec,
    /// Each task's `$TASK_ARGS` (empty for a counted job).
    pub task_args: Vec<String>,
    /// Inputs: local path (absolute) to the destination relative to `/workspace`.
    pub inputs: Vec<(PathBuf, String)>,
    /// Outputs, relative to `/workspace`.
    pub outputs: Vec<String>,
    /// The checkpoint directory, relative to `/workspace`.
    pub checkpoint: Option<String>,
}

impl Job {
    /// GPUs per task.
    pub fn gpus(&self) -> u16 {
        self.spec.resources.gpus.unwrap_or(1)
    }

    /// Whether a lease runs several tasks one after another.
    pub fn shares_leases(&self) -> bool {
        self.spec.tasks_per_lease > 1
    }

    /// Whether a task's container is held for uploads before its command: the inputs, and with
    /// a lease per task the checkpoint (a shared lease is handed each task's).
    pub fn uploads_first(&self) -> bool {
        !self.inputs.is_empty() || (self.checkpoint.is_some() && !self.shares_leases())
    }

    /// Whether outputs are copied from a finished lease (a shared lease's are copied while it
    /// runs, after each task).
    pub fn copies_after_lease(&self) -> bool {
        !self.shares_leases() && (!self.outputs.is_empty() || self.checkpoint.is_some())
    }

    /// Why an offer with `terms` cannot run this job's tasks (besides the search's
    /// conditions), in words; `None` when it can.
    pub fn unfit(&self, terms: &OfferTerms) -> Option<String> {
        let timeout = self.spec.timeout.0;
        if terms.max_duration_s < timeout {
            return Some(format!(
                "take no lease as long as the timeout ({timeout} s; longest {} s)",
                terms.max_duration_s
            ));
        }
        if !self.shares_leases() && terms.min_duration_s > timeout {
            return Some(format!(
                "take no lease as short as the timeout ({timeout} s; shortest {} s: a longer \
                 timeout, or tasks_per_lease above 1, can use them)",
                terms.min_duration_s
            ));
        }
        if self.uploads_first() && terms.upload_hold_s == 0 {
            return Some("hold no container for the uploads before the command".into());
        }
        if self.copies_after_lease() && terms.output_retention_s == 0 {
            return Some("keep no outputs after a lease".into());
        }
        if self.spec.resources.verified && terms.verify_window_s == 0 {
            return Some("grant no GPU check (resources.verified)".into());
        }
        None
    }

    /// Tasks in the job.
    pub fn task_count(&self) -> u32 {
        self.task_args.len() as u32
    }

    /// The search query of eligible offers, cheapest first.
    pub fn query(&self) -> String {
        let r = &self.spec.resources;
        let mut q = vec![format!("free>={}", self.gpus())];
        if let Some(g) = &r.gpu {
            q.push(format!("gpu~{}", quote(g)));
        }
        if let Some(v) = r.vram {
            q.push(format!("vram>={}", v.0));
        }
        if let Some(p) = r.max_price {
            q.push(format!("price<={}", p.0));
        }
        if let Some(m) = r.min_reputation {
            q.push(format!("rep>={m}"));
        }
        if let Some(extra) = &r.query {
            q.push(extra.trim().to_string());
        }
        q.push("sort:price".into());
        q.join(" ")
    }
}

/// What an offer says that decides whether it can run a job's tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OfferTerms {
    /// Shortest lease, seconds.
    pub min_duration_s: u32,
    /// Longest lease, seconds.
    pub max_duration_s: u32,
    /// Seconds a created container is held for uploads (0: none).
    pub upload_hold_s: u32,
    /// Seconds a finished lease's outputs are kept (0: none).
    pub output_retention_s: u32,
    /// Seconds of the unbilled GPU-check window (0: no check).
    pub verify_window_s: u32,
}

/// A search value, quoted when it has spaces.
fn quote(v: &str) -> String {
    if v.contains(char::is_whitespace) {
        format!("\"{v}\"")
    } else {
        v.to_string()
    }
}

/// Parses and checks `text` (a spec file in `dir`): the spec, its tasks file read, its input
/// paths checked. Nothing is rented before this passes.
pub fn load(text: &str, dir: &Path) -> Result<Job, SpecError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(SpecError {
            field: String::new(),
            line: None,
            message: format!("the spec is larger than {} KiB", MAX_SPEC_BYTES / 1024),
        });
    }
    let spec = parse(text)?;
    check(&spec, dir).map_err(|(field, message)| SpecError {
        line: line_of(text, &field),
        field,
        message,
    })
}

/// Parses `text` into a [`JobSpec`] (shape only).
pub fn parse(text: &str) -> Result<JobSpec, SpecError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, JobSpec>(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let line = inner.location().map(|l| l.line());
        // The library's text ends with " at line L column C"; the line is ours to say.
        let mut message = inner.to_string();
        if let Some(i) = message.rfind(" at line ") {
            message.truncate(i);
        }
        let field = if field == "." { String::new() } else { field };
        // The library names the path itself (`resources: unknown field ...`); ours is enough.
        if let Some((head, rest)) = message.split_once(": ")
            && !head.is_empty()
            && !head.contains(' ')
            && field.starts_with(head)
        {
            message = rest.to_string();
        }
        // The library places an unknown key (or broken syntax) exactly; a bad value of a known
        // field it places at its mapping, so the field's own line is better there.
        let line = if message.starts_with("unknown field") {
            line.or_else(|| line_of(text, &field))
        } else {
            line_of(text, &field).or(line)
        };
        SpecError {
            field,
            line,
            message,
        }
    })
}

/// The semantic checks: `Err((field, why))`.
fn check(spec: &JobSpec, dir: &Path) -> Result<Job, (String, String)> {
    let f = |field: &str, m: String| (field.to_string(), m);
    let name_ok = |s: &str| {
        (1..=64).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if !name_ok(&spec.name) {
        return Err(f(
            "name",
            format!("{:?}: 1 to 64 letters, digits, `.`, `_` or `-`", spec.name),
        ));
    }
    if spec.image.trim().is_empty() {
        return Err(f("image", "an image is needed".into()));
    }
    if spec.run.trim().is_empty() {
        return Err(f("run", "the task's commands are empty".into()));
    }
    let r = &spec.resources;
    if let Some(g) = r.gpus
        && !(1..=64).contains(&g)
    {
        return Err(f("resources.gpus", format!("{g}: 1 to 64 GPUs per task")));
    }
    if let Some(m) = r.min_reputation
        && !(0.0..=1.0).contains(&m)
    {
        return Err(f(
            "resources.min_reputation",
            format!("{m}: a reputation is 0 to 1"),
        ));
    }
    if let Some(g) = &r.gpu
        && (g.trim().is_empty() || g.contains('"'))
    {
        return Err(f("resources.gpu", format!("{g:?} is not a GPU model")));
    }
    if let Some(q) = &r.query {
        gridlease_contracts::query::Query::parse(q)
            .map_err(|e| f("resources.query", e.to_string()))?;
    }
    for k in spec.envs.keys() {
        let ok = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(f(
                &format!("envs.{k}"),
                format!("{k:?} is not a variable name"),
            ));
        }
        if TASK_VARS.contains(&k.as_str()) {
            return Err(f(
                &format!("envs.{k}"),
                format!("{k} is set by the runner for each task"),
            ));
        }
    }
    let mut inputs = Vec::new();
    for (dest, local) in &spec.inputs {
        let field = format!("inputs.{dest}");
        let rel =
            gridlease_protocol::transfer::workspace_relative(dest).map_err(|e| f(&field, e))?;
        if rel.is_empty() {
            return Err(f(
                &field,
                "name a path inside /workspace, not /workspace itself".into(),
            ));
        }
        let path = dir.join(local);
        if let Err(e) = std::fs::symlink_metadata(&path) {
            return Err(f(
                &field,
                format!("the local path {} cannot be read: {e}", path.display()),
            ));
        }
        let path = std::path::absolute(&path).map_err(|e| f(&field, e.to_string()))?;
        inputs.push((path, rel));
    }
    let ws = |field: &str, p: &str| {
        let rel = gridlease_protocol::transfer::workspace_relative(p).map_err(|e| f(field, e))?;
        if rel.is_empty() {
            return Err(f(
                field,
                "name a path inside /workspace, not /workspace itself".into(),
            ));
        }
        Ok(rel)
    };
    let outputs = spec
        .outputs
        .iter()
        .enumerate()
        .map(|(i, p)| ws(&format!("outputs[{i}]"), p))
        .collect::<Result<Vec<_>, _>>()?;
    let checkpoint = match &spec.checkpoint {
        Some(c) => {
            if c.every.0 < MIN_CHECKPOINT_EVERY_S {
                return Err(f(
                    "checkpoint.every",
                    format!("{} s: at least {MIN_CHECKPOINT_EVERY_S} s", c.every.0),
                ));
            }
            Some(ws("checkpoint.path", &c.path)?)
        }
        None => None,
    };
    if spec.retries.max > MAX_RETRIES {
        return Err(f(
            "retries.max",
            format!("{}: at most {MAX_RETRIES}", spec.retries.max),
        ));
    }
    if let Some(c) = spec
        .retries
        .on_exit_codes
        .iter()
        .find(|c| !(1..=255).contains(*c))
    {
        return Err(f(
            "retries.on_exit_codes",
            format!("{c}: an exit code to retry is 1 to 255"),
        ));
    }
    if !(1..=MAX_CONCURRENCY).contains(&spec.concurrency) {
        return Err(f(
            "concurrency",
            format!("{}: 1 to {MAX_CONCURRENCY}", spec.concurrency),
        ));
    }
    if !(1..=MAX_TASKS_PER_LEASE).contains(&spec.tasks_per_lease) {
        return Err(f(
            "tasks_per_lease",
            format!("{}: 1 to {MAX_TASKS_PER_LEASE}", spec.tasks_per_lease),
        ));
    }
    if spec.tasks_per_lease > 1 {
        check_shared_workspace(&inputs, &outputs, checkpoint.as_deref())
            .map_err(|(field, m)| f(&field, m))?;
    }
    if !(MIN_TIMEOUT_S..=MAX_TIMEOUT_S).contains(&spec.timeout.0) {
        return Err(f(
            "timeout",
            format!(
                "{} s: {MIN_TIMEOUT_S} s to {} days",
                spec.timeout.0,
                MAX_TIMEOUT_S / 86_400
            ),
        ));
    }
    if !(1..=MAX_OFFER_WAIT_S).contains(&spec.offer_wait.0) {
        return Err(f(
            "offer_wait",
            format!(
                "{} s: 1 s to {} days",
                spec.offer_wait.0,
                MAX_OFFER_WAIT_S / 86_400
            ),
        ));
    }
    if let Some(b) = &spec.budget
        && b.max_total.0 == Money::ZERO
    {
        return Err(f("budget.max_total", "a budget of 0 runs nothing".into()));
    }
    let task_args = match &spec.tasks {
        Tasks::Count(n) => vec![String::new(); *n as usize],
        Tasks::File(file) => read_tasks(&dir.join(file)).map_err(|m| f("tasks", m))?,
    };
    let job = Job {
        spec: spec.clone(),
        task_args,
        inputs,
        outputs,
        checkpoint,
    };
    // The search the runner will make must parse (a reputation with more decimals than the
    // language takes, say).
    gridlease_contracts::query::Query::parse(&job.query()).map_err(|e| {
        f(
            "resources",
            format!("the offer search {:?}: {e}", job.query()),
        )
    })?;
    Ok(job)
}

/// With several tasks to a lease, each task's outputs and checkpoint are removed before it
/// starts: none may be, hold or sit inside an input (nor the runner's own directory).
fn check_shared_workspace(
    inputs: &[(PathBuf, String)],
    outputs: &[String],
    checkpoint: Option<&str>,
) -> Result<(), (String, String)> {
    let within = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
    let overlap = |a: &str, b: &str| within(a, b) || within(b, a);
    let cleared = outputs
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("outputs[{i}]"), p.as_str()))
        .chain(checkpoint.map(|c| ("checkpoint.path".to_string(), c)));
    for (field, p) in cleared {
        if overlap(p, WORKER_DIR) {
            return Err((
                field,
                format!("{p}: /workspace/{WORKER_DIR} is the runner's"),
            ));
        }
        if let Some((_, dest)) = inputs.iter().find(|(_, d)| overlap(p, d)) {
            return Err((
                field,
                format!(
                    "{p} overlaps the input /workspace/{dest}: with tasks_per_lease above 1 it is \
                     removed before each task"
                ),
            ));
        }
    }
    if let Some((_, dest)) = inputs.iter().find(|(_, d)| overlap(d, WORKER_DIR)) {
        return Err((
            format!("inputs./workspace/{dest}"),
            format!("/workspace/{WORKER_DIR} is the runner's"),
        ));
    }
    Ok(())
}

/// The argument lines of a tasks file.
fn read_tasks(path: &Path) -> Result<Vec<String>, String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("the tasks file {} cannot be read: {e}", path.display()))?;
    if meta.len() > MAX_TASKS_FILE_BYTES {
        return Err(format!(
            "the tasks file {} is larger than {} MiB",
            path.display(),
            MAX_TASKS_FILE_BYTES >> 20
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("the tasks file {} cannot be read: {e}", path.display()))?;
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return Err(format!("the tasks file {} has no lines", path.display()));
    }
    if lines.len() > MAX_TASKS as usize {
        return Err(format!(
            "the tasks file {} has {} lines: at most {MAX_TASKS} tasks",
            path.display(),
            lines.len()
        ));
    }
    if let Some(i) = lines.iter().position(|l| l.len() > MAX_TASK_ARG_BYTES) {
        return Err(format!(
            "line {} of the tasks file {} is longer than {MAX_TASK_ARG_BYTES} bytes",
            i + 1,
            path.display()
        ));
    }
    Ok(lines)
}

/// The line (1-based) of `field` (dotted, as [`SpecError::field`]) in a block-style YAML
/// file: each part's key found below the previous one's, at a deeper indent.
pub fn line_of(text: &str, field: &str) -> Option<usize> {
    if field.is_empty() {
        return None;
    }
    let mut from = 0usize;
    let mut indent: Option<usize> = None;
    let mut found = None;
    for part in field.split('.') {
        let key = part.split('[').next().unwrap_or(part);
        let mut hit = None;
        for (i, line) in text.lines().enumerate().skip(from) {
            let body = line.trim_start();
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            let ind = line.len() - body.len();
            if let Some(parent) = indent
                && ind <= parent
                && i > from
            {
                break;
            }
            let body = body.trim_start_matches("- ");
            let k = body
                .split(':')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches(['"', '\'']);
            if k == key && body.contains(':') {
                hit = Some((i, ind));
                break;
            }
        }
        let (mut i, ind) = hit?;
        // `key[n]`: the n-th `- ` item below the key.
        if let Some(n) = part
            .split_once('[')
            .and_then(|(_, r)| r.trim_end_matches(']').parse::<usize>().ok())
        {
            let items = text
                .lines()
                .enumerate()
                .skip(i + 1)
                .take_while(|(_, l)| {
                    let b = l.trim_start();
                    b.is_empty()
                        || b.starts_with('#')
                        || l.len() - b.len() > ind
                        || b.starts_with("- ")
                })
                .filter(|(_, l)| l.trim_start().starts_with("- "))
                .map(|(j, _)| j);
            if let Some(j) = items.into_iter().nth(n) {
                i = j;
            }
        }
        found = Some(i + 1);
        from = i + 1;
        indent = Some(ind);
    }
    found
}

/// The JSON Schema of a spec (draft 2020-12), for editors: `docs/job-spec.schema.json`.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(JobSpec);
    serde_json::to_value(schema).unwrap_or_default()
}

#[cfg(test)]
mod tests;
