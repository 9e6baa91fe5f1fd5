#!/usr/bin/env python
"""What a GPU user runs instead, timed beside tvm-pesto's GPU paths on the lent GPU machine.

Run there after ``device_check.py --prepare DIR`` (same folder, the checkout as working tree)::

    python3 tests/gpu/gpu_peers.py --folder DIR --out $OUT/gpu-peers.json

Two parts, each timed in blocks after a warm-up (synchronise, N calls, synchronise; the median
of the repeats' time per call, host work included, as a Python caller sees it):

``models``
    each prepared zoo model (size ``small``): TVM-CUDA's ``main`` through the VM, and the mixed
    module's (library units and TVM-CUDA kernels, ``prepare.prepare_mixed``), each checked
    on a second input against PyTorch too (a replayed CUDA graph must not answer the first), PyTorch eager
    on ``cuda``, ``torch.compile`` (Inductor, default mode) and ``torch.compile(mode=
    "reduce-overhead")`` (CUDA graphs), each output checked against the prepared PyTorch CPU
    reference. TF32 is off everywhere (the float32 numerics tvm-pesto's backends keep).
``streams`` (only when asked for)
    tvm-pesto's per-device streams on one GPU: a copy between two streams, and each model's
    ``main`` in a worker thread bound to a raw stream, on two inputs.
``graphs`` (only when asked for)
    each prepared cuBLASLt and cuDNN unit as the backends call it: a Python loop of calls, and 20
    calls captured in one CUDA graph and replayed (their cost inside a module with CUDA graphs).
``convs``
    each prepared cuDNN convolution through the call paths the cuDNN backend can take: as
    ``CudnnBackend.make_callable`` calls it (raw pointers, ``set_stream`` per call), raw pointers
    without ``set_stream``, the same plan with TF32 allowed, and
    ``torch.nn.functional.conv2d`` on the same shapes (cuDNN through ATen).

It needs the folder, NumPy and PyTorch; TVM is the folder's runtime-only copy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_runner as runner  # noqa: E402 - stdlib + NumPy: works where only TVM's runtime is


def per_call(fn, sync, repeat: int = 5, block_s: float = 0.05) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` blocks of about ``block_s`` each."""
    for _ in range(3):
        fn()
    sync()
    t = time.perf_counter()
    fn()
    sync()
    n = max(1, min(2000, int(block_s / max(time.perf_counter() - t, 1e-7))))
    reps = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        reps.append((time.perf_counter() - t) / n)
    return float(np.median(reps))


def max_err(got, want) -> float:
    return float(max(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))) for g, w in zip(got, want)))


def setup(folder: Path):
    """The runner's runtime set-up (wheels, runtime-only TVM, CUDA device, prebuilt kernels)."""
    man = runner.read_manifest(folder)
    ctx = runner.make_context(folder, man)
    row = runner.setup_runtime(ctx, man, runner._environment(), cpu_twins=False)
    if row.status in runner.FAILING:
        raise SystemExit(f"runtime set-up failed: {row.to_dict()['items']}")
    return ctx, man


def module_main(ctx, built: dict | None, args, want, rec: dict, tag: str):
    """Load a prepared module (``built``: its manifest entry), check and time its ``main`` into
    ``rec[tag + "_err" / "_ms"]``; the function, or None (``rec[tag]`` says why)."""
    try:
        if built is None:
            raise RuntimeError("not built at --prepare (see the manifest)")
        main = runner.load_vm(ctx.tvm, ctx.folder / built["file"], ctx.dev)["main"]
        rec[f"{tag}_err"] = max_err(runner.to_numpy(main(*args)), want)
        rec[f"{tag}_ms"] = per_call(lambda: main(*args), ctx.dev.sync) * 1e3
        return main
    except Exception as e:  # noqa: BLE001 - a module that fails is a finding
        rec[tag] = f"failed: {runner._msg(e)}"
        return None


def model_part(ctx, man: dict, budget_s: float) -> list[dict]:
    import torch

    sys.path.insert(0, str(HERE.parents[1]))
    from tvm_pesto.zoo import MODELS

    tvm, dev = ctx.tvm, ctx.dev
    out, deadline = [], time.time() + budget_s
    for name, entry in man["models"].items():
        rec = {"model": name}
        data = np.load(ctx.folder / entry["data"])
        want = [data[f"ref{i}"] for i in range(entry["n_outputs"])]
        args = [tvm.runtime.tensor(data[f"in{i}"], device=dev) for i in range(entry["n_inputs"])]
        mains = {"tvm_cuda": module_main(ctx, entry.get("cuda"), args, want, rec, "tvm_cuda")}
        mixed = entry.get("mixed") or {}
        if mixed.get("externs"):
            try:
                runner.register_units(ctx, mixed, emulated=False)
                mains["mixed"] = module_main(ctx, mixed.get("cuda"), args, want, rec, "mixed")
            except Exception as e:  # noqa: BLE001
                rec["mixed"] = f"failed: {runner._msg(e)}"
        model, inputs = MODELS[name]("small")
        model = model.eval().cuda()
        xs = [torch.from_numpy(np.asarray(a)).cuda() for a in inputs]
        if any(m is not None for m in mains.values()):  # a second input: a replayed CUDA graph must not answer the first
            other = [np.roll(np.asarray(a), 1) if np.issubdtype(np.asarray(a).dtype, np.integer)
                     else (np.asarray(a) * 0.5 + 0.25).astype(np.asarray(a).dtype) for a in inputs]
            with torch.no_grad():
                ref2 = model(*[torch.from_numpy(a).cuda() for a in other])
            ref2 = [r.cpu().numpy() for r in (ref2 if isinstance(ref2, (tuple, list)) else [ref2])]
            for tag, main in mains.items():
                if main is not None:
                    got2 = runner.to_numpy(main(*[tvm.runtime.tensor(a, device=dev) for a in other]))
                    rec[f"{tag}_second_input_err"] = max_err(got2, ref2)
        peers = [("torch_eager", lambda m: m), ("torch_compile", lambda m: torch.compile(m)),
                 ("torch_compile_reduce_overhead", lambda m: torch.compile(m, mode="reduce-overhead"))]
        for label, make in peers:
            if time.time() > deadline:
                rec[label] = "skipped: time budget"
                continue
            try:
                t = time.perf_counter()
                fn = make(model)
                with torch.no_grad():
                    got = fn(*xs)
                    torch.cuda.synchronize()
                    rec[f"{label}_first_call_s"] = time.perf_counter() - t
                    got = got if isinstance(got, (tuple, list)) else [got]
                    rec[f"{label}_err"] = max_err([g.float().cpu().numpy() for g in got], want)
                    rec[f"{label}_ms"] = per_call(lambda: fn(*xs), torch.cuda.synchronize) * 1e3
            except Exception as e:  # noqa: BLE001 - a peer that fails is a finding, not a stop
                rec[label] = f"failed: {runner._msg(e)}"
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


def conv_part(ctx, man: dict) -> list[dict]:
    rows = []
    for name, entry in man["models"].items():
        info = entry["libraries"].get("cudnn") or {}
        if not info.get("subgraphs"):
            continue
        data = np.load(ctx.folder / info["data"])
        rng = np.random.default_rng(0)
        for sub in info["subgraphs"]:
            rec = {"model": name, "sub": sub["name"], "key": sub.get("key"), "flops": sub.get("flops")}
            try:
                conv_paths(ctx, sub, data, rng, rec)
            except Exception as e:  # noqa: BLE001 - one failing path is a finding; the others still run
                rec["failed"] = runner._msg(e)
            print(json.dumps(rec), flush=True)
            rows.append(rec)
    return rows


def conv_paths(ctx, sub: dict, data, rng, rec: dict) -> None:
    """Time one cuDNN convolution through each call path into ``rec``."""
    import torch
    import torch.nn.functional as F
    from pesto_cudnn_graph import build_cudnn_graph

    tvm, dev = ctx.tvm, ctx.dev
    plan = sub["plan"]
    args = runner.make_args(tvm, sub["params"], data, dev, rng)
    run, out = runner.library_call(ctx, "cudnn", plan, args, data, sub["name"])  # as CudnnBackend calls it
    run()
    dev.sync()
    ref = data[f"{sub['name']}_ref0"]
    rec["backend_path_err"] = max_err([out.numpy()], [ref])
    rec["backend_path_us"] = per_call(run, dev.sync) * 1e6
    ns = runner.plan_namespace(plan)
    ops = {"Y": out}
    for tname, key in (("X", "x"), ("W", "w"), ("B", "bias")):
        op = runner._value(plan[key], runner._const(tvm, plan[key], data, sub["name"], dev), args)
        if op is not None:
            ops[tname] = op
    cudnn, handle, stream = ctx.cudnn, ctx.cudnn_handle, runner._stream_getter(tvm)()
    for tf32 in (False, True):
        graph, tensors, ws = build_cudnn_graph(ns, handle, tf32)
        work = tvm.runtime.empty((max(1, ws),), "uint8", dev)
        ptrs = {tensors[k]: runner._ptr(v) for k, v in ops.items()}
        wptr = runner._ptr(work)

        def raw(graph=graph, ptrs=ptrs, wptr=wptr, stream_each=True):
            if stream_each:
                cudnn.set_stream(handle=handle, stream=stream)
            graph.execute(ptrs, wptr, handle=handle)

        raw()
        dev.sync()
        tag = "tf32" if tf32 else "raw_pointers"
        rec[f"{tag}_err"] = max_err([out.numpy()], [ref])
        rec[f"{tag}_us"] = per_call(raw, dev.sync) * 1e6
        if not tf32:
            rec["raw_no_set_stream_us"] = per_call(lambda: raw(stream_each=False), dev.sync) * 1e6
    rec.update(torch_conv(torch, F, ns, ops, ref, torch.cuda.synchronize))


def stream_part(ctx, man: dict) -> list[dict]:
    """tvm-pesto's per-device streams (``tvm_pesto.run.thread.streams``) on one GPU: a copy between two
    streams of it, and each prepared model's ``main`` (CUDA graphs) in a worker thread bound to a
    raw stream, as the executor runs a device: the first input against the prepared reference,
    a second against the same call made before on the default stream."""
    import threading

    sys.path.insert(0, str(HERE.parents[1]))
    from tvm_pesto.run.thread import streams

    tvm, dev = ctx.tvm, ctx.dev
    rows = []
    s = streams.StreamSet([dev, dev])
    try:
        x = tvm.runtime.tensor(np.arange(1 << 20, dtype="float32"), device=dev)
        y = s.copy(x, 0, 1)
        s.synchronize()
        same = bool(np.array_equal(y.numpy(), x.numpy()))
        rows.append({"part": "copy between two streams of one GPU", "equal": same})
        for name, entry in man["models"].items():
            rec = {"part": "main on a bound stream", "model": name}
            try:
                data = np.load(ctx.folder / entry["data"])
                want = [data[f"ref{i}"] for i in range(entry["n_outputs"])]
                main = runner.load_vm(tvm, ctx.folder / entry["cuda"]["file"], dev)["main"]
                args = [tvm.runtime.tensor(data[f"in{i}"], device=dev) for i in range(entry["n_inputs"])]
                other = [tvm.runtime.tensor((data[f"in{i}"] * 0.5).astype(data[f"in{i}"].dtype)
                                            if data[f"in{i}"].dtype.kind == "f" else np.roll(data[f"in{i}"], 1),
                                            device=dev) for i in range(entry["n_inputs"])]
                on_default = runner.to_numpy(main(*other))
                dev.sync()
                got = {}

                def work():
                    s.bind(1)
                    for label, xs in (("first", args), ("second", other)):
                        out = main(*xs)
                        s.synchronize(1)  # a result on a raw stream is read after that stream, as the executor does
                        got[label] = runner.to_numpy(out)
                    got["per_call_ms"] = per_call(lambda: main(*args), lambda: s.synchronize(1)) * 1e3
                    s.synchronize(1)

                t = threading.Thread(target=work)
                t.start()
                t.join()
                rec["err_first"] = max_err(got["first"], want)
                rec["err_second_vs_default_stream"] = max_err(got["second"], on_default)
                rec["per_call_ms"] = got["per_call_ms"]
            except Exception as e:  # noqa: BLE001 - a failure is the finding
                rec["failed"] = runner._msg(e)
            print(json.dumps(rec), flush=True)
            rows.append(rec)
    finally:
        s.close()
    return rows


def graph_part(ctx, man: dict, calls: int = 20) -> list[dict]:
    """Each prepared cuBLASLt and cuDNN unit as the backends call it, timed two ways: a Python
    loop of calls (what the check logs), and ``calls`` calls captured in one CUDA graph and
    replayed (what a unit costs inside a module built with CUDA graphs, where the mixed module's
    library calls run). TVM's current stream is bound to the capture stream while capturing."""
    import torch

    tvm, dev = ctx.tvm, ctx.dev
    rows = []
    for name, entry in man["models"].items():
        for lib in ("cublas", "cudnn"):
            info = entry["libraries"].get(lib) or {}
            data = np.load(ctx.folder / info["data"]) if info.get("data") else None
            rng = np.random.default_rng(0)
            for sub in info.get("subgraphs", []):
                if sub.get("plan") is None:
                    continue
                rec = {"model": name, "lib": lib, "name": sub["name"], "key": sub["key"], "pattern": sub["pattern"],
                       "flops": sub["flops"]}
                try:
                    args = runner.make_args(tvm, sub["params"], data, dev, rng)
                    run, out = runner.library_call(ctx, lib, sub["plan"], args, data, sub["name"])
                    run()
                    dev.sync()
                    ref = data[f"{sub['name']}_ref0"]
                    rec["loop_us"] = per_call(run, dev.sync) * 1e6
                    g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
                    torch.cuda.synchronize()
                    with torch.cuda.graph(g, stream=side):
                        dev.set_raw_stream(side.cuda_stream)
                        for _ in range(calls):
                            run()
                    dev.set_raw_stream(0)
                    out.copyfrom(np.zeros(tuple(out.shape), str(out.dtype)))
                    g.replay()
                    torch.cuda.synchronize()
                    rec["graph_err"] = max_err([out.numpy()], [ref])
                    rec["graph_us"] = per_call(g.replay, torch.cuda.synchronize) / calls * 1e6
                except Exception as e:  # noqa: BLE001 - a unit that cannot be captured is a finding
                    rec["failed"] = runner._msg(e)
                    dev.set_raw_stream(0)
                print(json.dumps(rec), flush=True)
                rows.append(rec)
    return rows


def torch_conv(torch, F, ns, ops: dict, ref, sync) -> dict:
    """``F.conv2d`` (+ bias, + ReLU) of the plan ``ns`` on the tensors ``ops`` (where they are),
    NCHW; its error against ``ref`` and its time per call."""
    def t(v):
        return torch.from_dlpack(v)

    x, w = t(ops["X"]).clone(), t(ops["W"]).clone()
    if ns.layout == "NHWC":
        x, w = x.permute(0, 3, 1, 2).contiguous(), w.permute(0, 3, 1, 2).contiguous()
    b = t(ops["B"]).reshape(-1).clone() if "B" in ops else None
    (pt, pl), (pb, pr) = ns.pre_padding, ns.post_padding
    if (pt, pl) != (pb, pr):
        return {"torch_conv_us": "skipped: asymmetric padding"}
    k, cg = w.shape[0], w.shape[1]

    def call():
        y = F.conv2d(x, w, b, stride=tuple(ns.stride), padding=(pt, pl), dilation=tuple(ns.dilation),
                     groups=x.shape[1] // cg)
        return torch.relu(y) if ns.relu else y

    y = call()
    if ns.layout == "NHWC":
        y = y.permute(0, 2, 3, 1)
    return {"torch_conv_err": max_err([y.cpu().numpy()], [ref]), "torch_conv_us": per_call(call, sync) * 1e6,
            "out_channels": int(k)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", required=True, help="the folder device_check.py --prepare built")
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--parts", default="convs,models", help="comma-separated: convs, graphs, models, streams")
    ap.add_argument("--budget-s", type=float, default=240.0, help="models: start no peer after this many seconds")
    args = ap.parse_args(argv)
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    ctx, man = setup(Path(args.folder).resolve())
    res = {"device": ctx.device_name, "target": man["target"], "torch": torch.__version__,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "timer": "Python loop: sync, N calls, sync; median of 5 blocks of ~50 ms after 3 warm-up calls"}
    parts = args.parts.split(",")
    if "streams" in parts:
        res["streams"] = stream_part(ctx, man)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if "convs" in parts:
        res["convs"] = conv_part(ctx, man)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if "graphs" in parts:
        res["graphs"] = graph_part(ctx, man)
        Path(args.out).write_text(json.dumps(res, indent=1))
    if "models" in parts:
        res["models"] = model_part(ctx, man, args.budget_s)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
