"""How fast TVM's untuned CPU kernels are, and why: the two effects the cost model's
``strided_reduction`` and ``TRANSCENDENTAL`` features describe
(:mod:`tvm_pesto.costs.predict.features`).

Run it on a new kind of CPU, or after a TVM upgrade, to check that the two features still
describe what the kernels do there.

Each case is one Relax op compiled with TVM's default CPU pipeline (no schedule: the loops
of the compute definition, reduction innermost) and timed with ``time_evaluator`` on one
core (median of 5 repeats of 20 calls):

* 1x1 convolutions whose reduction walks more or fewer input channels at a stride of H*W
  floats (all in one L1 set when H*W*4 is a multiple of 4 KiB);
* element-wise ops over the same tensor with and without a transcendental function.

Usage::

    TVM_NUM_THREADS=1 python -m tvm_pesto_lab.unscheduled_kernels
    TVM_NUM_THREADS=1 python -m tvm_pesto_lab.unscheduled_kernels --json out.json
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import tvm
from tvm import relax

from tvm_pesto.costs.predict.caches import strided_reduction
from tvm_pesto.jsonio import write_json

CONVS = [  # (C_in, H, W, C_out)
    (8, 32, 32, 32), (16, 32, 32, 32), (32, 32, 32, 16), (32, 32, 33, 16), (32, 8, 8, 128), (64, 16, 16, 32),
]
ELEMENTWISE = ["relu", "sigmoid", "silu", "gelu", "tanh", "exp"]


def _time(bb_func, args) -> float:
    tgt = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    ex = tvm.compile(bb_func, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    vals = [tvm.runtime.tensor(a, dev) for a in args]
    return float(vm.time_evaluator("main", dev, number=20, repeat=5)(*vals).median)


def _module(shapes, build):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    return bb.get()


def conv_case(cin, h, w, cout, rng) -> dict:
    mod = _module([(1, cin, h, w), (cout, cin, 1, 1)], lambda x, k: relax.op.nn.conv2d(x, k))
    t = _time(mod, [rng.standard_normal((1, cin, h, w)).astype("float32"),
                    rng.standard_normal((cout, cin, 1, 1)).astype("float32")])
    stride, lines, l1, _ = strided_reduction("conv2d", [[1, cin, h, w], [cout, cin, 1, 1]], {}, 4)
    flops = 2.0 * cout * cin * h * w
    return {"case": f"conv1x1 {cin}x{h}x{w} -> {cout}", "us": t * 1e6, "gflops": flops / t / 1e9,
            "stride_bytes": stride, "lines": lines, "lines_per_l1_set": l1}


def elementwise_case(name, shape, rng) -> dict:
    ops = {"relu": relax.op.nn.relu, "sigmoid": relax.op.sigmoid, "silu": relax.op.nn.silu,
           "gelu": relax.op.nn.gelu, "tanh": relax.op.tanh, "exp": relax.op.exp}
    mod = _module([shape], ops[name])
    t = _time(mod, [rng.standard_normal(shape).astype("float32")])
    n = int(np.prod(shape))
    return {"case": f"{name} {'x'.join(map(str, shape))}", "us": t * 1e6, "ns_per_element": t / n * 1e9}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    load0 = os.getloadavg()[0]
    res = {"convs": [], "elementwise": []}
    print(f"{'case':32s} {'us':>8s} {'GFLOP/s':>8s} {'stride':>7s} {'lines':>6s} {'per L1 set':>10s}")
    for c in CONVS:
        r = conv_case(*c, rng)
        res["convs"].append(r)
        print(f"{r['case']:32s} {r['us']:8.1f} {r['gflops']:8.2f} {r['stride_bytes']:7.0f} {r['lines']:6.0f} "
              f"{r['lines_per_l1_set']:10.1f}")
    print(f"\n{'case':32s} {'us':>8s} {'ns/elem':>8s}")
    for name in ELEMENTWISE:
        r = elementwise_case(name, (1, 16, 16, 16), rng)
        res["elementwise"].append(r)
        print(f"{r['case']:32s} {r['us']:8.2f} {r['ns_per_element']:8.2f}")
    res["load_avg_1m"] = [load0, os.getloadavg()[0]]
    print(f"\nload average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
