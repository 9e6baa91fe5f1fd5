"""Placed single-device run vs plain ``tvm.compile`` of the same module (speed ratio).

    python lab/scripts/bench_single_device.py [--models inception_v3,resnet50,bert] [--size small] [--repeat 30]

Run it on a new machine, or after a change to the builder or the executor, to see what
placing costs when the plan is a single device.

Prints a markdown table; ratio = plain / placed (>= 0.97 is the target: placing on one
device must cost at most 3%). Runs are interleaved so drift hits both sides alike.
"""
import argparse
import time

import numpy as np
import tvm
from tvm import relax

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.cluster import parse_cluster


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="inception_v3,resnet50,bert")
    ap.add_argument("--size", default="small")
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    print("| model | plain tvm.compile (ms) | placed on cpu:1 (ms) | plain / placed |")
    print("|---|---|---|---|")
    for name in a.models.split(","):
        zm = zoo.load(name, a.size)
        cluster = parse_cluster("cpu:1")
        placed = tvm_pesto.build(zm.mod, cluster, costs="roofline")
        tgt = tvm.target.Target(cluster.devices[0].target)
        ex = tvm.compile(zm.mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
        vm = relax.VirtualMachine(ex, tvm.cpu(0))
        args = [tvm.runtime.tensor(x) for x in zm.example_inputs]
        for _ in range(3):
            vm["main"](*args)
            placed(*args)
        tp, tq = [], []
        for _ in range(a.repeat):
            t = time.perf_counter()
            vm["main"](*args)
            tp.append(time.perf_counter() - t)
            t = time.perf_counter()
            placed(*args)
            tq.append(time.perf_counter() - t)
        p, q = np.median(tp), np.median(tq)
        print(f"| {name} | {p * 1e3:.3f} | {q * 1e3:.3f} | {p / q:.3f} |")
        placed.close()


if __name__ == "__main__":
    main()
