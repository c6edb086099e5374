//! `gridlease-sim sweep --slurm`: the sweep as a Slurm array job, one task per shard, each
//! running this binary's own `sweep --shard i/n` into `OUT/shard-i`; `merge` (by hand, or at
//! once with `--wait`) collects them into one output, byte-identical to the sweep run here.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::Printer;

/// The `--slurm` options of `sweep`.
#[derive(Args, Debug)]
pub(crate) struct SlurmArgs {
    /// Submit the sweep to Slurm as an array job (one task per shard, each writing
    /// `OUT/shard-i`) instead of running it here; needs `sbatch` on PATH.
    #[arg(long)]
    pub(crate) slurm: bool,
    /// With `--slurm`: the number of shards (array tasks); at most the study's runs.
    #[arg(long, requires = "slurm", default_value_t = 4)]
    pub(crate) shards: u64,
    /// With `--slurm`: the partition (`sbatch --partition`).
    #[arg(long, requires = "slurm")]
    pub(crate) partition: Option<String>,
    /// With `--slurm`: each task's time limit, in Slurm's format (`sbatch --time`, e.g.
    /// `01:00:00`).
    #[arg(long, requires = "slurm")]
    pub(crate) time: Option<String>,
    /// With `--slurm`: wait for the job to end, then merge its shards into `OUT/merged`.
    #[arg(long, requires = "slurm")]
    pub(crate) wait: bool,
}

/// What a shard task runs: this binary's `sweep` with the study's own arguments.
pub(crate) struct Study<'a> {
    pub(crate) scenario: &'a Path,
    pub(crate) params: &'a [String],
    pub(crate) points: Option<&'a Path>,
    pub(crate) reps: u64,
    pub(crate) seed: u64,
    pub(crate) threads: Option<usize>,
    pub(crate) parquet: bool,
    pub(crate) plots: bool,
    pub(crate) out: &'a Path,
    /// The study's runs (points x replications).
    pub(crate) runs: u64,
}

/// `arg` quoted for a POSIX shell.
fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("the absolute path of {}", p.display()))
}

/// The job script.
fn script(s: &Study<'_>, a: &SlurmArgs, bin: &Path, out: &Path) -> Result<String> {
    let n = a.shards;
    let mut lines = vec![
        "#!/bin/sh".to_string(),
        "#SBATCH --job-name=gridlease-sim".into(),
        format!("#SBATCH --array=0-{}", n - 1),
        format!(
            "#SBATCH --output={}",
            out.join("slurm").join("task-%a.log").display()
        ),
    ];
    if let Some(p) = &a.partition {
        lines.push(format!("#SBATCH --partition={p}"));
    }
    if let Some(t) = &a.time {
        lines.push(format!("#SBATCH --time={t}"));
    }
    let mut cmd = vec![
        quote(&bin.display().to_string()),
        "-q".into(),
        "sweep".into(),
        quote(&absolute(s.scenario)?.display().to_string()),
    ];
    for p in s.params {
        cmd.push("--param".into());
        cmd.push(quote(p));
    }
    if let Some(points) = s.points {
        cmd.push("--points".into());
        cmd.push(quote(&absolute(points)?.display().to_string()));
    }
    cmd.extend([
        "--reps".into(),
        s.reps.to_string(),
        "--seed".into(),
        s.seed.to_string(),
        "--no-plots".into(),
    ]);
    if let Some(t) = s.threads {
        cmd.extend(["--threads".into(), t.to_string()]);
    }
    if s.parquet {
        cmd.push("--parquet".into());
    }
    cmd.extend([
        "--shard".into(),
        format!("\"$SLURM_ARRAY_TASK_ID\"/{n}"),
        "--out".into(),
        format!(
            "{}/shard-\"$SLURM_ARRAY_TASK_ID\"",
            quote(&out.display().to_string())
        ),
    ]);
    lines.push(format!("exec {}", cmd.join(" ")));
    Ok(lines.join("\n") + "\n")
}

/// Writes the job script to `OUT/slurm/job.sh` and submits it; with `--wait`, waits and merges
/// the shards into `OUT/merged`.
pub(crate) fn submit(s: &Study<'_>, a: &SlurmArgs, p: &Printer) -> Result<()> {
    if a.shards == 0 || a.shards > s.runs {
        bail!(
            "--shards {}: need 1..={} (the study's runs: points x replications)",
            a.shards,
            s.runs
        );
    }
    for (name, v) in [("--partition", &a.partition), ("--time", &a.time)] {
        if let Some(v) = v
            && (v.is_empty()
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_:.,".contains(c)))
        {
            bail!("{name} {v:?}: only letters, digits and - _ : . , are passed to sbatch");
        }
    }
    let sbatch = which("sbatch").context(
        "--slurm: no `sbatch` on PATH (install Slurm's client, e.g. Debian's slurm-client, on \
         the machine that submits)",
    )?;
    let bin = std::env::current_exe().context("the path of this gridlease-sim")?;
    let out = absolute(s.out)?;
    let dir = out.join("slurm");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let job = dir.join("job.sh");
    std::fs::write(&job, script(s, a, &bin, &out)?)
        .with_context(|| format!("write {}", job.display()))?;
    let mut cmd = Command::new(&sbatch);
    cmd.arg("--parsable");
    if a.wait {
        cmd.arg("--wait");
    }
    let res = cmd.arg(&job).output().context("run sbatch")?;
    let stdout = String::from_utf8_lossy(&res.stdout);
    let id = stdout
        .lines()
        .next()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if !res.status.success() {
        bail!(
            "sbatch {} exited with {}{}: {}",
            job.display(),
            res.status,
            if id.is_empty() {
                String::new()
            } else {
                format!(" (job {id}; its tasks' logs are in {})", dir.display())
            },
            String::from_utf8_lossy(&res.stderr).trim()
        );
    }
    let shards: Vec<PathBuf> = (0..a.shards)
        .map(|i| out.join(format!("shard-{i}")))
        .collect();
    let merge_cmd = format!(
        "gridlease-sim merge --out {} {}",
        out.join("merged").display(),
        shards
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    if !a.wait {
        p.result(
            &format!(
                "submitted Slurm job {id}: {} tasks writing {}/shard-0..{}; when it has ended: {merge_cmd}",
                a.shards,
                out.display(),
                a.shards - 1
            ),
            &serde_json::json!({ "job": id, "tasks": a.shards, "script": job, "merge": merge_cmd }),
        );
        return Ok(());
    }
    p.result(
        &format!("Slurm job {id} ended: {} tasks", a.shards),
        &serde_json::json!({ "job": id, "tasks": a.shards, "script": job }),
    );
    super::merge::merge(
        &shards,
        &out.join("merged"),
        super::merge::Options {
            plots: s.plots,
            parquet: s.parquet,
            allow_partial: false,
        },
        p,
    )
}

/// The first `name` on PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_quotes_every_argument_and_shards_by_the_array_index() {
        let params = ["renter_rate=0.5,1.0".to_string(), "k='a b'".to_string()];
        let s = Study {
            scenario: Path::new("/s/base.toml"),
            params: &params,
            points: None,
            reps: 3,
            seed: 7,
            threads: Some(1),
            parquet: false,
            plots: true,
            out: Path::new("/o"),
            runs: 12,
        };
        let a = SlurmArgs {
            slurm: true,
            shards: 4,
            partition: Some("gpu".into()),
            time: None,
            wait: false,
        };
        let text = script(&s, &a, Path::new("/bin/gridlease-sim"), Path::new("/o")).unwrap();
        assert!(text.contains("#SBATCH --array=0-3\n"), "{text}");
        assert!(text.contains("#SBATCH --partition=gpu\n"));
        assert!(!text.contains("--time"));
        assert!(
            text.contains("--param 'renter_rate=0.5,1.0' --param 'k='\\''a b'\\'''"),
            "{text}"
        );
        assert!(
            text.contains("--reps 3 --seed 7 --no-plots --threads 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "--shard \"$SLURM_ARRAY_TASK_ID\"/4 --out '/o'/shard-\"$SLURM_ARRAY_TASK_ID\""
            ),
            "{text}"
        );
    }
}
