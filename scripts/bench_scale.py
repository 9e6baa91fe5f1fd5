"""Scale benchmark: coarsen + ILP + expand (and each registered heuristic) on DNN-like DAGs.

A thin wrapper over :mod:`tvm_pesto.bench.scale` (the generator is
:func:`tvm_pesto.bench.random_dag.dnn_like_problem`); ``tvm-pesto bench scale`` is the same
benchmark with markdown and plot output. Prints one line per (size, solver): wall seconds
and simulated makespan; ``--json`` writes the result.

Usage::

    python scripts/bench_scale.py --sizes 1000 10000 100000 --time-limit 2
"""
from __future__ import annotations

import argparse
import sys

from tvm_pesto.bench.random_dag import dnn_like_problem  # noqa: F401 - kept importable from here
from tvm_pesto.jsonio import write_json
from tvm_pesto.bench.scale import ALGORITHMS, run_scale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--time-limit", type=float, default=2.0, help="MIP solver seconds")
    ap.add_argument("--target", type=int, default=40)
    ap.add_argument("--solver", default="cbc")
    ap.add_argument("--no-heuristics", action="store_true", help="time only coarsen + ILP + expand")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    algorithms = ["ilp"] if args.no_heuristics else ["ilp"] + [a for a in ALGORITHMS if a != "ilp"]
    res = run_scale(args.sizes, algorithms, ilp_time_limit_s=args.time_limit, target=args.target,
                    solver=args.solver, progress=lambda m: print(m, flush=True))
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
