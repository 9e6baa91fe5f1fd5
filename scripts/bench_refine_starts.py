"""Where the local search starts matters: refine one LayerGraph case from several start plans.

For each start (HEFT's plan, and HEFT with the critical path pinned in 1-4 runs, see
:func:`tvm_pesto.solve.refine.critical_path_splits`) prints the start's makespan and the
refined one, as ratios to the lower bound, with the search's own counters.

Usage::

    python scripts/bench_refine_starts.py throughput/inceptionv3_training --budget 15
"""
from __future__ import annotations

import argparse
import sys

from tvm_pesto.bench.placement import SETTINGS, layergraph_cases
from tvm_pesto.plan import simulate
from tvm_pesto.solve import lower_bound, solve
from tvm_pesto.solve.refine import critical_path_splits, refine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="<setting>/<graph>, e.g. throughput/inceptionv3_training")
    ap.add_argument("--budget", type=float, default=15.0, help="seconds of local search per start")
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--first-improvement", action="store_true",
                    help="descend by the first unit with an improving move instead of the best move")
    args = ap.parse_args(argv)
    setting, _, name = args.case.partition("/")
    if setting not in SETTINGS or not name:
        ap.error(f"case must be <setting>/<graph> with setting one of {', '.join(SETTINGS)}")
    (case,) = [c for c in layergraph_cases(settings=[setting], names=[name])]
    p = case.problem
    lb = lower_bound(p)["best"]
    starts = [("heft", solve(p, "heft"))]
    starts += [(s.info["seed"], s) for s in critical_path_splits(p, parts=tuple(args.parts))]
    print(f"{case.name}: {p.num_nodes} nodes, {p.num_devices} devices, bound {lb * 1e3:.3f} ms, "
          f"{args.budget:g} s per start, {'first' if args.first_improvement else 'best'}-improvement descent")
    for label, plan in starts:
        out = refine(p, plan, time_budget_s=args.budget, first_improvement=args.first_improvement)
        r = out.info["refine"]
        print(f"  {label:28s} start {simulate(p, plan).makespan / lb:.3f} -> {r['makespan_after_s'] / lb:.3f} "
              f"({r['moves']} moves, {r['kicks_kept']}/{r['kicks']} kicks kept, {r['simulations']} simulations, "
              f"{1e3 * r['seconds'] / r['simulations']:.3f} ms each, {r['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
