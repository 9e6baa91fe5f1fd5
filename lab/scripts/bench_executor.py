"""Do two devices' worker threads really run at the same time? (GIL check)

    python lab/scripts/bench_executor.py

Run it on a new machine, or after a TVM or Python upgrade, before trusting multi-device CPU
plans: if the threads do not overlap there, placing on two devices cannot pay.

Builds two independent matmul chains, places them on one device and on two, and times
both. With the GIL released during TVM calls the two-device run takes about half.
"""
import time

import networkx as nx
import numpy as np
from tvm import relax

from tvm_pesto.api import analyze
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.rewrite import apply_plan
from tvm_pesto.candidates import placement_candidates
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.plan import Plan


def two_chains(n=256, depth=6):
    x = relax.Var("x", relax.TensorType((n, n), "float32"))
    y = relax.Var("y", relax.TensorType((n, n), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a, b = x, y
            for _ in range(depth):
                a = bb.emit(relax.op.matmul(a, x))
                b = bb.emit(relax.op.matmul(b, y))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    return bb.get()


def timed(pm, args, repeat=10):
    pm(*args)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        pm(*args)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main():
    mod = two_chains()
    an = analyze(mod)
    n = an.graph.num_nodes
    order = an.graph.topo_order()
    pos = [order.index(v) for v in range(n)]
    comps = sorted(nx.weakly_connected_components(an.graph.dag), key=min)
    assert len(comps) == 2, "the two chains should be independent"
    chain = [0 if v in comps[0] else 1 for v in range(n)]
    cluster = parse_cluster("cpu:2")
    units = list(placement_candidates(an.rg, an.groups))
    one = Plan.from_assignment([0] * n, pos, 2, units=units)
    two = Plan.from_assignment(chain, pos, 2, units=units)
    args = [np.random.rand(256, 256).astype("float32") / 256 for _ in range(2)]
    t1 = timed(PlacedModule(apply_plan(an.rg, one, cluster), cluster, one), args)
    t2 = timed(PlacedModule(apply_plan(an.rg, two, cluster), cluster, two), args)
    print(f"one device: {t1 * 1e3:.2f} ms, two devices (threads): {t2 * 1e3:.2f} ms, speedup {t1 / t2:.2f}x")


if __name__ == "__main__":
    main()
