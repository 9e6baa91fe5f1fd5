"""A mixed plan's units in the model's run against the same units timed in a loop.

Places a corpus model (``tvm_pesto.zoo.corpus``) on a cluster, builds the flow's plan, and
prints: the plan's simulated and measured seconds per call; per library, the seconds its
units take inside the model's runs (each call timed) against the seconds the simulator gave
them; and, for the ONNX Runtime units, the sum of their calls timed alone in a loop (what a
candidate's measurement does) and after streaming a 64 MiB buffer before each call (their
weights and inputs out of the caches), and what the device's cold-call grid adds to their loop
(:func:`tvm_pesto.costs.in_run.cold_extra_s`); with the weights each library's units hold.

Usage (a corpus model needs timm and torchvision)::

    python lab/scripts/cold_units.py inception_v3 --size small --cluster cpu:1 --costs measured --loop-costs
"""
from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np


def _timed_runners(acc: dict, on: list):
    """Make ONNX Runtime's unit runners time each call while ``on[0]``."""
    import tvm_pesto.backends.onnxruntime as ort_backend
    from tvm_pesto.run.libraries.loaders import onnx_runner

    def make(*a, **k):
        run = onnx_runner(*a, **k)

        def timed(*args):
            if not on[0]:
                return run(*args)
            t = time.perf_counter()
            run(*args)
            acc["onnxruntime"] += time.perf_counter() - t

        timed.direct = run.direct
        return timed

    ort_backend.onnx_runner = make


def _unit_args(func):
    import tvm
    from tvm import relax

    ret = func.body.ty
    outs = ret.fields if isinstance(ret, relax.TupleType) else [ret]
    rng = np.random.default_rng(0)
    ins = [rng.random(tuple(int(x) for x in p.ty.shape)).astype(str(p.ty.dtype)) for p in func.params]
    return [tvm.runtime.tensor(a) for a in ins] + [tvm.runtime.tensor(np.zeros(tuple(int(x) for x in o.shape),
                                                                                  str(o.dtype))) for o in outs]


def _loop_and_cold(units, calls: int = 15) -> tuple[float, float]:
    """Summed median seconds of each unit's call in a loop, and after streaming 64 MiB."""
    flush = np.ones(64 << 20, dtype=np.uint8)
    loop = cold = 0.0
    for unit in units:
        args = _unit_args(unit.func)
        for _ in range(5):
            unit.fn(*args)
        hot, after = [], []
        for _ in range(calls):
            t = time.perf_counter()
            unit.fn(*args)
            hot.append(time.perf_counter() - t)
        for _ in range(calls):
            flush[::64] += 1
            t = time.perf_counter()
            unit.fn(*args)
            after.append(time.perf_counter() - t)
        loop, cold = loop + float(np.median(hot)), cold + float(np.median(after))
    return loop, cold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--size", default="small")
    ap.add_argument("--cluster", default="cpu:1")
    ap.add_argument("--costs", default="measured")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--loop-costs", action="store_true",
                    help="place on the candidates' loop seconds, without the cold-call grid (a mixed plan to compare)")
    args = ap.parse_args()
    from tvm_pesto.zoo import corpus

    corpus.import_torchvision()
    import torch

    import tvm_pesto
    from tvm_pesto.cluster.cold import cold_figures
    from tvm_pesto.costs.in_run import cold_extra_s
    from tvm_pesto.frontend import from_torch

    if args.loop_costs:
        import tvm_pesto.costs as costs

        costs.weights_from_memory = lambda ct, cs, cluster: ct
    acc, on = collections.defaultdict(float), [False]
    _timed_runners(acc, on)
    model, inputs = corpus.load(args.model, args.size)
    mod = from_torch(model, [torch.from_numpy(np.asarray(a)) for a in inputs])
    pl = tvm_pesto.place(mod, args.cluster, costs=args.costs)
    placed = tvm_pesto.build(mod, args.cluster, plan=pl.plan)
    for _ in range(20):
        placed(*inputs)
    on[0] = True
    t = time.perf_counter()
    for _ in range(args.runs):
        placed(*inputs)
    wall = (time.perf_counter() - t) / args.runs
    on[0] = False
    nodes = pl.analysis.op_graph.nodes
    sim, weights, count = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
    for k, unit in enumerate(pl.plan.units):
        sim[unit.backend] += pl.sim.finish[k] - pl.sim.start[k]
        weights[unit.backend] += sum(nodes[v].param_bytes for v in unit.nodes)
        count[unit.backend] += 1
    print(f"{args.model} {args.size} on {args.cluster}, costs {args.costs}: {len(pl.plan.units)} units, "
          f"simulated {pl.sim.makespan * 1e3:.2f} ms, measured {wall * 1e3:.2f} ms a call "
          f"(load {os.getloadavg()[0]:.2f}); model weights {sum(n.param_bytes for n in nodes) / 1e6:.1f} MB")
    for b in sorted(sim):
        print(f"  {b:14s} {count[b]:4d} units, {weights[b] / 1e6:6.1f} MB of weights, simulated {sim[b] * 1e3:6.2f} ms"
              + (f", in the run {acc[b] / args.runs * 1e3:6.2f} ms" if b in acc else ""))
    ort = [k for k, u in enumerate(pl.plan.units) if u.backend == "onnxruntime"]
    mem = np.array([n.memory_bytes for n in nodes], dtype=float)
    passed = [mem.sum() - sum(mem[v] for v in pl.plan.units[k].nodes) for k in ort]
    w = [sum(nodes[v].param_bytes for v in pl.plan.units[k].nodes) for k in ort]
    figs = cold_figures(pl.joint.cluster)
    extra = sum(float(cold_extra_s(figs[pl.plan.assignment[k]], [p], [x])[0]) for k, p, x in zip(ort, passed, w))
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a unit's measurement
    loop, cold = _loop_and_cold([u for u in placed.units.values() if u.backend == "onnxruntime"])
    print(f"  onnxruntime units alone: {loop * 1e3:.2f} ms in a loop, {cold * 1e3:.2f} ms after streaming 64 MiB; "
          f"the cold-call grid ({figs[0].source}) adds {extra * 1e3:.2f} ms to the loop in the model's run")


if __name__ == "__main__":
    main()
