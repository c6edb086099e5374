"""Example analysis of a gridlease-sim output directory (pandas + matplotlib).

Reads what `gridlease-sim run ... --out DIR` writes -- runs.csv, summary.csv, buckets.csv,
providers.csv and, when the run had `--trace`, trace.csv (see docs/simulations.md, Outputs) --
prints two tables and writes one figure:

- per population (honest / attacker providers): leases, failed leases, revenue and renter
  surplus, summed over replications; the renter-side cost of attacks when the run has the
  no-show / false-class columns;
- a few run metrics across replications: mean, median and 95 % percentile-bootstrap interval
  (which stays within a metric's bounds), as summary.csv gives them;
- a figure (PNG): utilization over time by population (mean over replications), and, with a
  trace, the distribution of lease lengths by how leases ended.

Usage:  python example.py OUT_DIR [--plot FILE] [--parquet]   (default FILE: OUT_DIR/analysis.png)

With --parquet it reads the Parquet copies of the tables (`gridlease-sim ... --parquet`) through
pyarrow instead of the CSV files: the same numbers, typed columns.

CI runs it on a small output (simulations/tests/py_analysis.rs); the pinned versions are in
requirements.txt beside this file.
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

POPULATIONS = ("honest", "attacker")
# Okabe-Ito colour-blind-safe palette (the simulator's plots use it too).
COLOURS = {"honest": "#0072B2", "attacker": "#D55E00"}


def population_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Leases, failures and money per provider population, summed over replications."""
    rows = []
    for pop in POPULATIONS:
        rows.append(
            {
                "population": pop,
                "leases": int(runs[f"{pop}_leases"].sum()),
                "failed_leases": int(runs[f"{pop}_failed_leases"].sum()),
                "gpu_hours": runs[f"{pop}_gpu_hours"].sum(),
                "revenue_glu": runs[f"{pop}_revenue"].sum(),
                "renter_surplus_glu": runs[f"{pop}_renter_surplus"].sum(),
            }
        )
    return pd.DataFrame(rows).set_index("population")


def attack_costs(runs: pd.DataFrame) -> pd.Series | None:
    """Renters' losses to no-show and false-class providers, when the run reports them."""
    cols = ["no_shows", "no_show_lost_s", "false_class_detected", "false_class_undetected",
            "false_class_shortfall"]
    if not set(cols) <= set(runs.columns):
        return None
    return runs[cols].sum()


def summary_table(summary: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    s = summary[summary["metric"].isin(metrics)]
    return s.set_index("metric")[["n", "mean", "median", "boot95_low", "boot95_high"]].reindex(
        metrics
    )


def plot(out: Path, buckets: pd.DataFrame, trace: pd.DataFrame | None) -> None:
    panels = 2 if trace is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    ax = axes[0][0]
    per_bucket = buckets.groupby("t_start_h")[[f"{p}_utilization" for p in POPULATIONS]].mean()
    for pop in POPULATIONS:
        ax.plot(per_bucket.index, per_bucket[f"{pop}_utilization"], label=pop,
                color=COLOURS[pop])
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("utilization (leased / online GPU-time)")
    ax.set_ylim(0, 1.05)
    ax.set_title("utilization by provider population")
    ax.legend(title="providers")
    if trace is not None:
        ax = axes[0][1]
        starts = trace[trace["kind"] == "lease_start"].set_index(["replication", "lease"])["t_s"]
        ends = trace[trace["kind"] == "lease_end"].set_index(["replication", "lease"])
        length_min = ((ends["t_s"] - starts.reindex(ends.index)) / 60.0).dropna()
        # Shared bin edges, so that every close reason's bars have the same width.
        edges = np.linspace(0.0, max(float(length_min.max()), 1.0), 31)
        for reason, lengths in length_min.groupby(ends["reason"]):
            ax.hist(lengths, bins=edges, alpha=0.6, label=f"{reason} ({len(lengths)})")
        ax.set_xlabel("lease length (min)")
        ax.set_ylabel("leases")
        ax.set_yscale("log")
        ax.set_title("lease lengths by close reason (trace)")
        ax.legend(title="close reason")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path, help="a gridlease-sim run's --out directory")
    ap.add_argument("--plot", type=Path, help="figure to write (default OUT_DIR/analysis.png)")
    ap.add_argument("--parquet", action="store_true",
                    help="read the tables' Parquet copies (pyarrow) instead of the CSV files")
    a = ap.parse_args()
    d = a.out_dir

    def table(name: str) -> Path:
        return d / (f"{name}.parquet" if a.parquet else f"{name}.csv")

    def read(path: Path) -> pd.DataFrame:
        return pd.read_parquet(path, engine="pyarrow") if a.parquet else pd.read_csv(path)

    runs = read(table("runs"))
    summary = read(table("summary"))
    buckets = read(table("buckets"))
    providers = read(table("providers"))
    trace_path = table("trace")
    trace = read(trace_path) if trace_path.exists() else None
    print(f"read {'Parquet (pyarrow)' if a.parquet else 'CSV'} tables from {d}")

    pd.set_option("display.width", 120)
    print(f"{len(runs)} replication(s), {len(providers) // max(len(runs), 1)} providers each")
    print("\n# per provider population (sums over replications)")
    print(population_table(runs).to_string(float_format=lambda x: f"{x:.2f}"))
    costs = attack_costs(runs)
    if costs is not None:
        print("\n# renters' cost of no-show and false-class providers (sums)")
        print(costs.to_string())
    print("\n# across replications (mean, median, 95 % bootstrap interval)")
    metrics = ["jobs", "leases", "utilization", "mean_wait_s", "abandonment_rate"]
    print(summary_table(summary, metrics).to_string(float_format=lambda x: f"{x:.4f}"))
    if trace is not None:
        print("\n# trace events by kind")
        print(trace["kind"].value_counts().sort_index().to_string())
    target = a.plot or d / "analysis.png"
    plot(target, buckets, trace)
    print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
