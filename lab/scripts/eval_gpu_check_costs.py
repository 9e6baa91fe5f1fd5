#!/usr/bin/env python
"""How well the device check's GPU timings price whole models (``tvm_pesto.costs.predict.gpu_check``).

For each zoo model the shipped logs timed, on the GPU preset the logs were taken on (``h200``):
the model's ``main`` as the check measured it (TVM-CUDA, CUDA graphs), and the simulated
makespan of tvm-pesto's one-device plan priced three ways: with every log (the model's own
groups were timed: in-sample), with the logs less that model's rows (held out: a model the
check never saw), and with the roofline alone.

    python lab/scripts/eval_gpu_check_costs.py [--cluster h200] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np

from tvm_pesto import zoo
from tvm_pesto.api import cost_candidates, place_from_costs
from tvm_pesto.costs.predict.gpu_check import apply_check_logs, load_check_logs
from tvm_pesto.costs.predict.roofline import roofline_candidate_costs


def makespan(name: str, cluster: str, logs) -> float:
    """The simulated makespan of the one-device plan, the roofline column priced with ``logs``
    (``None``: the roofline alone)."""
    costed = cost_candidates(zoo.load(name, "small").mod, cluster, backends=["tvm"], costs="roofline")
    table = roofline_candidate_costs(costed.candidates, costed.cluster)
    if logs is not None:
        table = apply_check_logs(costed.candidates, costed.cluster, table, ["roofline"], logs=logs)[0]
    costed = cost_candidates(costed.analysis, cluster, backends=["tvm"], costs=table)
    return float(place_from_costs(costed, deterministic=True).sim.makespan)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", default="h200", help="the GPU preset the logs were taken on")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    every = load_check_logs()
    mains = {model: s for ct in every for model, s in ct.mains.items()}
    rows = []
    for name, main_s in mains.items():
        rows.append({"model": name, "measured_ms": main_s * 1e3,
                     "in_sample_ms": makespan(name, args.cluster, every) * 1e3,
                     "held_out_ms": makespan(name, args.cluster, load_check_logs(skip_models=(name,))) * 1e3,
                     "roofline_ms": makespan(name, args.cluster, None) * 1e3})
    print(f"{'model':14s} {'measured':>9s} {'in-sample':>15s} {'held-out':>15s} {'roofline':>15s}")
    for r in rows:
        m = r["measured_ms"]
        cells = "".join(f" {r[k]:8.3f} ({(r[k] / m - 1) * 100:+4.0f}%)" for k in ("in_sample_ms", "held_out_ms",
                                                                                 "roofline_ms"))
        print(f"{r['model']:14s} {m:9.3f}{cells}")
    mae = {k: float(np.mean([abs(r[k] / r["measured_ms"] - 1) for r in rows]))
           for k in ("in_sample_ms", "held_out_ms", "roofline_ms")}
    print("mean |error|: " + ", ".join(f"{k.removesuffix('_ms')} {v * 100:.0f} %" for k, v in mae.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"cluster": args.cluster, "rows": rows, "mean_abs_error": mae}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
