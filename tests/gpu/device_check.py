#!/usr/bin/env python
"""Device check for the GPU backends: run on a machine with an NVIDIA GPU (under 8 minutes).

For every zoo model (small preset): compile it with TVM-CUDA (dlight schedules) and compare
with PyTorch; measure every TVM fusion group on TVM-CUDA; for every subgraph that cuBLAS,
cuDNN and TensorRT accept (TVM's registered patterns), build it with that backend, check it
against TVM-CUDA on the same inputs and measure it. Measurements are appended to
``cost_models/gpu-<gpu name>-measurements.jsonl`` in the MeasureCache line format, so the
cost model can train on them. A summary table is printed at the end.

``--dry-run`` (any machine): does everything that needs no GPU (TVM-CUDA compile + export,
nvcc check of the generated CUDA, cuBLAS/cuDNN plans, ONNX export + onnx.checker for
TensorRT) and says what it skipped and why.

Usage::

    python tests/gpu/device_check.py                # on the GPU machine
    python tests/gpu/device_check.py --dry-run      # here
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_pesto import zoo  # noqa: E402
from tvm_pesto.backends import get_backend  # noqa: E402
from tvm_pesto.backends.gpu import cublas, cudnn, patterns, tensorrt, tvm_cuda  # noqa: E402
from tvm_pesto.cluster import gpu_probe as probe  # noqa: E402
from tvm_pesto.builder.subgraph import group_function, structural_key  # noqa: E402
from tvm_pesto.costs.cache import MeasureCache, target_key  # noqa: E402
from tvm_pesto.graph.fusion import fusion_groups  # noqa: E402
from tvm_pesto.graph.relax_import import from_relax  # noqa: E402

LIBS = ("cublas", "cudnn", "tensorrt")


class Row:
    def __init__(self, model, backend):
        self.model, self.backend = model, backend
        self.subgraphs = self.built = self.measured = 0
        self.max_err = 0.0
        self.total_s = 0.0
        self.status = "ok"
        self.notes: list[str] = []

    def note(self, msg):
        if msg not in self.notes:
            self.notes.append(msg)


def rand_args(params, dev, rng):
    out = []
    for p in params:
        ty = p.ty
        if isinstance(ty, relax.TensorType):
            a = rng.standard_normal([int(s) for s in ty.shape.values]).astype(str(ty.dtype))
            out.append(tvm.runtime.tensor(a, device=dev))
        else:
            out.append(tuple(rand_args([relax.Var("f", f) for f in ty.fields], dev, rng)))
    return out


def time_callable(fn, dev, repeat, budget_s=0.5):
    fn()
    dev.sync()
    t = time.perf_counter()
    fn()
    dev.sync()
    one = max(time.perf_counter() - t, 1e-6)
    number = max(1, min(100, int(0.02 / one)))
    reps = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        dev.sync()
        reps.append((time.perf_counter() - t) / number)
        if sum(reps) * number > budget_s:
            break
    return reps


def record(cache, seg, nodes, rg, backend, tkey, reps, device_name):
    nds = [rg.graph.nodes[v] for v in nodes]
    cache.put({"key": structural_key(seg.func), "backend": backend, "target": tkey,
               "median_s": float(np.median(reps)), "repeats": [float(r) for r in reps],
               "op": "+".join(n.op for n in nds), "flops": float(sum(n.flops for n in nds)),
               "bytes": float(sum(n.bytes_read + n.bytes_written for n in nds)),
               "device": device_name, "time": time.time()})


def lib_subgraphs(rg, lib):
    if lib == "tensorrt":
        return [m.nodes for m in patterns.merged_regions(rg, lib)]
    return [m.nodes for m in patterns.match_nodes(rg, lib)]


def dry_lib(rg, lib, row, tmp):
    """What a library backend's build does before it needs a GPU."""
    for nodes in lib_subgraphs(rg, lib):
        row.subgraphs += 1
        seg = group_function(rg, nodes, lift_constants=False)
        try:
            if lib == "cublas":
                cublas.plan_gemm(seg.func)
            elif lib == "cudnn":
                cudnn.plan_conv(seg.func)
            else:
                tensorrt.export_subgraph(seg.func)
            row.built += 1
        except Exception as e:  # noqa: BLE001 - reported in the table
            row.note(f"{type(e).__name__}: {str(e).splitlines()[0][:80]}")


def gpu_lib(rg, lib, row, dev, spec, cache, tkey, args_rng, repeat, device_name, deadline):
    bk = get_backend(lib)
    ok, why = bk.available()
    if not ok:
        row.status = "skipped"
        row.note(why)
        return
    segs = []
    for nodes in lib_subgraphs(rg, lib):
        segs.append((nodes, group_function(rg, nodes, lift_constants=False)))
    row.subgraphs = len(segs)
    if not segs:
        return
    funcs = {f"s{i}": s.func.with_attr("global_symbol", f"s{i}") for i, (_, s) in enumerate(segs)}
    ex = tvm_cuda.compile_cuda(tvm.IRModule(funcs), spec, what=f"{lib} reference subgraphs")
    vm = relax.VirtualMachine(ex, dev)
    for i, (nodes, seg) in enumerate(segs):
        if time.time() > deadline:
            row.note("time budget reached")
            break
        args = rand_args(seg.func.params, dev, args_rng)
        ref = vm[f"s{i}"](*args)
        refs = list(ref) if not isinstance(ref, tvm.runtime.Tensor) else [ref]
        try:
            fn = bk.make_callable(seg.func, spec)
        except Exception as e:  # noqa: BLE001
            row.note(f"build: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        outs = [tvm.runtime.empty(tuple(r.shape), str(r.dtype), dev) for r in refs]
        fn(*args, *outs)
        dev.sync()
        row.built += 1
        err = max(float(np.abs(o.numpy() - r.numpy()).max()) for o, r in zip(outs, refs))
        row.max_err = max(row.max_err, err)
        if err > 5e-3 * max(1.0, max(float(np.abs(r.numpy()).max()) for r in refs)):
            row.status = "MISMATCH"
        reps = time_callable(lambda: fn(*args, *outs), dev, repeat)
        row.total_s += float(np.median(reps))
        row.measured += 1
        seg_l = group_function(rg, nodes, lift_constants=True)
        record(cache, seg_l, nodes, rg, lib, tkey, reps, device_name)


def run_model(name, args, rows, cache, dev, spec, tkey, device_name, deadline):
    rng = np.random.default_rng(0)
    m = zoo.load(name, "small")
    rg = from_relax(m.mod)
    tmp = Path(tempfile.mkdtemp(prefix="pesto-devcheck-"))
    row = Row(name, "tvm-cuda")
    rows.append(row)
    t = time.time()
    ex = tvm_cuda.compile_cuda(m.mod, spec, what=name)
    tvm_cuda.export_cuda(ex, tmp / f"{name}.so")
    row.note(f"compile {time.time() - t:.1f}s")
    groups = fusion_groups(rg.graph)
    row.subgraphs = len(groups)
    if args.dry_run:
        if not args.no_nvcc and probe.nvcc_archs():
            arch = spec.export().get("arch")
            try:
                tvm_cuda.nvcc_check(tvm_cuda.cuda_sources(ex)[0], arch, tmp)
                row.note(f"nvcc {arch} ok")
            except Exception as e:  # noqa: BLE001
                row.status = "nvcc-failed"
                row.note(str(e).splitlines()[0][:100])
        row.built = 1
        row.status = "skipped" if row.status == "ok" else row.status
        row.note(f"run: {probe.tvm_cuda_runtime()[1][:70]}")
        for lib in LIBS:
            r = Row(name, lib)
            rows.append(r)
            dry_lib(rg, lib, r, tmp)
            r.status = "skipped"
            r.note(get_backend(lib).available()[1][:120])
        return
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(a, device=dev) for a in m.example_inputs])
    out = out.numpy() if isinstance(out, tvm.runtime.Tensor) else out[0].numpy()
    ref = zoo.torch_reference(m)
    ref = ref[0] if isinstance(ref, tuple) else ref
    row.max_err = float(np.abs(out - ref).max())
    if row.max_err > 1e-3 * max(1.0, float(np.abs(ref).max())):
        row.status = "MISMATCH"
    # per-group TVM-CUDA measurements
    segs = [group_function(rg, g, lift_constants=True) for g in groups]
    funcs = {f"g{i}": s.func.with_attr("global_symbol", f"g{i}") for i, s in enumerate(segs)}
    gex = tvm_cuda.compile_cuda(tvm.IRModule(funcs), spec, what=f"{name} groups")
    gvm = relax.VirtualMachine(gex, dev)
    for i, (g, s) in enumerate(zip(groups, segs)):
        if time.time() > deadline:
            row.note("time budget reached")
            break
        a = rand_args(s.func.params, dev, rng)
        te = gvm.time_evaluator(f"g{i}", dev, number=10, repeat=args.repeat)(*a)
        reps = [float(x) for x in te.results]
        row.total_s += float(np.median(reps))
        row.measured += 1
        record(cache, s, g, rg, "tvm-cuda", tkey, reps, device_name)
    row.built = len(groups)
    for lib in LIBS:
        r = Row(name, lib)
        rows.append(r)
        try:
            gpu_lib(rg, lib, r, dev, spec, cache, tkey, rng, args.repeat, device_name, deadline)
        except Exception as e:  # noqa: BLE001 - one failing backend must not stop the check
            r.status = "error"
            r.note(f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")


def print_table(rows, skipped_reasons):
    cols = ["model", "backend", "subgraphs", "built", "measured", "max_err", "sum_median_ms", "status", "notes"]
    data = [[r.model, r.backend, str(r.subgraphs), str(r.built), str(r.measured), f"{r.max_err:.2e}",
             f"{r.total_s * 1e3:.3f}", r.status, "; ".join(r.notes)[:110]] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) if data else len(c) for i, c in enumerate(cols)]
    print("\n== summary ==")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for d in data:
        print("  ".join(v.ljust(w) for v, w in zip(d, widths)))
    if skipped_reasons:
        print("\nskipped (needs a GPU):")
        for k, v in skipped_reasons.items():
            print(f"  {k}: {v}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--dry-run", action="store_true", help="no GPU: do the build paths only")
    ap.add_argument("--models", default=",".join(zoo.list_models()), help="comma-separated zoo models")
    ap.add_argument("--out", default=None, help="measurement log (default cost_models/gpu-<gpu>-measurements.jsonl)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop measuring after this many seconds")
    ap.add_argument("--no-nvcc", action="store_true", help="dry run: skip the nvcc compile of generated CUDA")
    args = ap.parse_args(argv)
    t0 = time.time()
    deadline = t0 + args.budget_s
    print("GPU stack:")
    report = probe.report()
    for k, (ok, why) in report.items():
        print(f"  {k:18s} {'ok' if ok else 'missing'}  {why}")
    gpu_ok, why = probe.tvm_cuda_runtime()
    skipped = {}
    if not gpu_ok and not args.dry_run:
        print(f"\nno usable GPU ({why}); run with --dry-run on this machine")
        return 2
    if gpu_ok and not args.dry_run:
        tvm_cuda.use_available_jit()
        dev = tvm.cuda(0)
        device_name = str(dev.device_name)
        spec = tvm_cuda.cuda_target("sm_" + str(dev.compute_version).replace(".", ""))
    else:
        dev, device_name = None, "dry-run"
        spec = tvm_cuda.cuda_target("sm_90")
        skipped = {"numerics vs TVM-CUDA and timing": why or "--dry-run",
                   "library builds (cuBLASLt calls, cuDNN graphs, TensorRT engines)": "need a GPU"}
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    out = Path(args.out) if args.out else ROOT / "cost_models" / f"gpu-{slug}-measurements.jsonl"
    cache = MeasureCache(out) if not args.dry_run else None
    tkey = target_key({"kind": "cuda", "arch": spec.export().get("arch")})
    rows: list[Row] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if time.time() > deadline:
            print(f"time budget reached; skipping {name}")
            continue
        print(f"-- {name} ({time.time() - t0:.0f}s)", flush=True)
        try:
            run_model(name, args, rows, cache, dev, spec, tkey, device_name, deadline)
        except Exception as e:  # noqa: BLE001
            r = Row(name, "tvm-cuda")
            r.status = "error"
            r.note(f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
            rows.append(r)
    print_table(rows, skipped)
    if cache is not None:
        print(f"\n{sum(r.measured for r in rows)} measurements appended to {out}")
    else:
        print("\ndry run: no measurements written")
    print(f"total {time.time() - t0:.1f}s")
    bad = [r for r in rows if r.status in ("MISMATCH", "error", "nvcc-failed")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
