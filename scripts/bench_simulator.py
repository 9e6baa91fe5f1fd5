"""Time the C++ simulator (and list scheduler) on a large random DAG.

Usage::

    python scripts/bench_simulator.py                 # 100k nodes, 200k edges, 8 devices
    python scripts/bench_simulator.py --nodes 10000 --reference   # also time the Python spec

Prints seconds per call (best of ``--repeat``). Not a test: numbers depend on the machine.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tvm_pesto import _core
from tvm_pesto.plan.reference import simulate_reference


def random_instance(n: int, m: int, d: int, seed: int = 0):
    """A random DAG (edges go from a lower to a higher id, so ids are a topological order),
    a random assignment and per-device orders by id."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n, size=m)
    b = rng.integers(0, n, size=m)
    keep = a != b
    src = np.minimum(a, b)[keep].astype(np.int32)
    dst = np.maximum(a, b)[keep].astype(np.int32)
    ebytes = rng.uniform(0, 1e6, size=len(src))
    assignment = rng.integers(0, d, size=n).astype(np.int32)
    order = [np.flatnonzero(assignment == k).astype(np.int32) for k in range(d)]
    cost = rng.uniform(1e-6, 1e-3, size=n)
    latency = np.full((d, d), 5e-6)
    inv_bw = np.full((d, d), 1 / 25e9)
    mem = rng.uniform(0, 1e6, size=n)
    return n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, d


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=200_000)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reference", action="store_true", help="also time the Python reference")
    args = ap.parse_args()
    inst = random_instance(args.nodes, args.edges, args.devices)
    n, src, dst, ebytes, assignment, order, cost, latency, inv_bw, mem, d = inst
    print(f"graph: {n} nodes, {len(src)} edges, {d} devices")
    start, finish, busy, peak, tx = _core.simulate(*inst)
    print(f"makespan {finish.max():.4f} s, {len(tx)} transfers")
    t = best_of(lambda: _core.simulate(*inst), args.repeat)
    print(f"_core.simulate: {t:.4f} s")
    costs = np.repeat(cost[:, None], d, axis=1)
    priority = np.arange(n, dtype=np.float64)
    t = best_of(lambda: _core.list_schedule(n, src, dst, ebytes, costs, latency, inv_bw, priority,
                                            assignment, d), args.repeat)
    print(f"_core.list_schedule: {t:.4f} s")
    if args.reference:
        t0 = time.perf_counter()
        want = simulate_reference(*inst)
        t = time.perf_counter() - t0
        same = all(np.array_equal(x, y) for x, y in zip(want, (start, finish, busy, peak, tx)))
        print(f"simulate_reference: {t:.4f} s (results identical: {same})")


if __name__ == "__main__":
    main()
