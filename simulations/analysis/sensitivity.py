"""Sensitivity indices of a designed sweep, with SALib.

The design comes from `gridlease-sim design lhs|sobol|morris ... --out POINTS.csv`, which also
writes POINTS.problem.json (SALib's problem: the keys and their ranges, and the method). The
sweep is `gridlease-sim sweep SCENARIO --points POINTS.csv --out OUT` (sharded and merged like
any sweep). This script joins OUT/summary.csv back to the design by its `point` column, takes
each point's mean of METRIC over the replications, and prints SALib's indices:

- sobol: first-order (S1) and total-order (ST) Sobol indices with their 95 % confidence
  half-widths (`SALib.analyze.sobol`, `calc_second_order=False`, the design's Saltelli order);
- morris: mu*, its 95 % confidence half-width, and sigma (`SALib.analyze.morris`);
- lhs: first-order indices by RBD-FAST (`SALib.analyze.rbd_fast`), which takes any sample.

Usage:  python sensitivity.py POINTS.csv OUT_DIR [--metric NAME] [--json]

CI runs it on a small Sobol sweep (simulations/tests/py_analysis.rs); the pinned versions are
in requirements.txt beside this file.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from SALib.analyze import morris, rbd_fast, sobol


def load(points_file: Path, out_dir: Path, metric: str):
    problem_file = points_file.with_suffix(".problem.json")
    meta = json.loads(problem_file.read_text())
    problem = {k: meta[k] for k in ("num_vars", "names", "bounds")}
    design = pd.read_csv(points_file)
    if list(design.columns) != problem["names"]:
        sys.exit(f"{points_file}: columns {list(design.columns)} are not {problem['names']}")
    summary = pd.read_csv(out_dir / "summary.csv")
    rows = summary[summary["metric"] == metric]
    if rows.empty:
        names = sorted(summary["metric"].unique())
        sys.exit(f"no metric {metric!r} in {out_dir / 'summary.csv'}; there are: {', '.join(names)}")
    y = rows.set_index("point")["mean"].sort_index()
    if len(y) != len(design) or list(y.index) != list(range(len(design))):
        sys.exit(
            f"{out_dir / 'summary.csv'} has {len(y)} points of {metric}, the design {len(design)}: "
            "merge every shard first"
        )
    x = design.to_numpy(dtype=float)
    return meta, problem, x, y.to_numpy(dtype=float)


def analyse(meta, problem, x, y) -> pd.DataFrame:
    method = meta["method"]
    if method == "sobol":
        si = sobol.analyze(problem, y, calc_second_order=False, print_to_console=False, seed=1)
        cols = ["S1", "S1_conf", "ST", "ST_conf"]
    elif method == "morris":
        si = morris.analyze(problem, x, y, num_levels=meta["levels"], print_to_console=False, seed=1)
        cols = ["mu_star", "mu_star_conf", "sigma"]
    elif method == "lhs":
        si = rbd_fast.analyze(problem, x, y, print_to_console=False, seed=1)
        cols = ["S1", "S1_conf"]
    else:
        sys.exit(f"unknown design method {method!r}")
    return pd.DataFrame({c: np.asarray(si[c], dtype=float) for c in cols}, index=problem["names"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("points", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--metric", default="utilization")
    ap.add_argument("--json", action="store_true", help="print the indices as JSON")
    a = ap.parse_args()
    meta, problem, x, y = load(a.points, a.out, a.metric)
    table = analyse(meta, problem, x, y)
    if a.json:
        print(json.dumps({"method": meta["method"], "metric": a.metric, "points": len(y),
                          "indices": table.to_dict(orient="index")}))
        return
    print(f"{meta['method']} indices of {a.metric} over {len(y)} points "
          f"(mean over replications per point)")
    with pd.option_context("display.float_format", "{:.3f}".format):
        print(table.to_string())


if __name__ == "__main__":
    main()
