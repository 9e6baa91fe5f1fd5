"""Build the folder the GPU check carries to the lent GPU machine (``device_check.py --prepare``).

The lent GPU machine has no TVM (its compiler library alone is 253 MB), no package registry,
and takes at most 64 MiB per call, working tree included. So everything is built here, with
TVM's compiler and nvcc, and only loaded and run there by the runner (``gpu_runner.py``,
copied in as ``run_gpu_check.py``). The folder::

    manifest.json             what is where, every file's size, the checks done here (rows)
    run_gpu_check.py          the runner: stdlib + NumPy + the folder
    runtime/tvm/              TVM's package without libtvm_compiler.so, 3rdparty/ and its build-only
                              folders (about 13 MiB; tvm_pesto.run.bundle.runtime_pkg)
    wheels/                   tvm-ffi and cudnn-frontend for CPython 3.12, typing_extensions (which
                              tvm-ffi imports); cached downloads
    lib/                      gpu_probe.py (the project's probes), pesto_cublaslt.py,
                              pesto_cudnn_graph.py and pesto_emulate.py (written from the
                              backends' source)
    models/<m>.cuda.so        main + each distinct TVM fusion group, CUDA (sm_90), exported
    models/<m>.cpu.so         the same module for llvm: the CPU twin, run runtime-only here
    models/<m>.mixed.*.so     the mixed module (``--mix``): library units as extern calls, the rest
                              TVM-CUDA; CUDA and CPU twin (``prepare_mixed``)
    kernels/<sha>.fatbin      nvcc's sm_90 binary of each CUDA source (the runner serves them)
    data/<m>.npz              inputs and PyTorch reference outputs
    data/<m>.<lib>.npz        each library subgraph's inputs, weights and TVM CPU reference
    data/<m>.mixed.npz        the mixed module's units: their constants (plans in the manifest)

Checked here, as rows (see ``gpu_runner.Row``): TVM-CUDA compile, export and nvcc; the CPU
twin build; pattern coverage; every cuBLAS GEMM plan and cuDNN convolution plan emulated in
NumPy against TVM's CPU result; every TensorRT region exported to ONNX, passed through
``onnx.checker`` and run in ONNX Runtime against TVM; the wheels; what a device call carries
(:func:`device_call_bytes`: the working tree and the folder) against ``--max-mib``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

import gpu_runner as runner
from gpu_runner import Row
import tvm_pesto
from tvm_pesto import __version__, zoo
from tvm_pesto.backends.gpu import cublas, cudnn, patterns, tensorrt, tvm_cuda
from tvm_pesto.backends.onnx_export.export import flatten_args
from tvm_pesto.builder.lower import lower_units
from tvm_pesto.builder.placed import compile_for
from tvm_pesto.candidates import Candidate, candidate_function, candidate_key
from tvm_pesto.cluster import gpu_probe, parse_cluster
from tvm_pesto.costs.store.cache import CACHE_VERSION, target_key
from tvm_pesto.graph.fusion import fusion_groups
from tvm_pesto.graph.relax_import import from_relax
from tvm_pesto.graph.subgraph import structural_key
from tvm_pesto.run.bundle.runtime_pkg import copy_runtime_package, tree_bytes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MIB = 1 << 20

#: The lent GPU machine's Python (the wheels' tag).
GPU_PYTHON = "3.12"
#: cudnn-frontend for the cuDNN backend (the ``gpu`` extra asks for >= 1.10; pinned so the cache hits).
CUDNN_FRONTEND = ("nvidia-cudnn-frontend", "1.32.0")
#: Models prepared by default: an MLP-Mixer (cuBLAS GEMMs with GELU epilogues, a cuDNN patch
#: convolution) and two CNNs (cuDNN), with their mixed modules (61.0 MiB with this working tree);
#: others with ``--models``, at most about 16 MiB of models per call (:data:`FOLDER_MIB`).
DEFAULT_MODELS = ("mlp_mixer", "vgg11", "resnet50")
#: What one device call carries at most (the device tool's limit): the working tree plus the
#: carried folder.
CALL_LIMIT_MIB = 64.0
#: What the check lets a device call carry: the limit less room for what a session adds to
#: the working tree.
MAX_MIB = 62.0
#: The folder's parts in MiB, as ``--prepare`` wrote them (TVM 0.27.0.post1, tvm-ffi 0.1.14.post1,
#: cudnn-frontend 1.32.0): the runtime-only TVM package, the wheels, the runner with ``lib/`` and
#: the manifest, and each model's modules (TVM-CUDA and the mixed module of ``--mix plan``, with
#: their CPU twins), kernels and data. ``tests/test_device_call_size.py`` checks the working tree
#: against them.
FOLDER_MIB = {"runtime": 13.1, "wheels": 14.23, "runner": 0.24, "mlp_mixer": 3.33, "bert": 4.07, "vgg11": 4.76,
              "resnet50": 8.95, "mobilenet_v2": 13.93, "gpt2": 4.34, "inception_v3": 16.52}
#: Max abs error / max(1, max |reference|): the model against PyTorch, a library call against
#: TVM's CPU result (TF32-free float32, cuBLASLt's tanh GELU), a plan's NumPy emulation
#: against TVM (erf vs tanh GELU: plan_gelu), ONNX Runtime against TVM.
TOLERANCES = {"model": 1e-3, "library": 5e-3, "plan": 1e-4, "plan_gelu": 2e-3, "onnx": 1e-3}
#: The op each library exists for: a model with that op and no match is a coverage failure.
LIBRARY_OPS = {"cublas": "relax.matmul", "cudnn": "relax.nn.conv2d"}
CPU_TARGET = {"kind": "llvm", "num-cores": 1}
_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
              "manylinux2014_x86_64")


class PrepareError(Exception):
    """The folder cannot be prepared (a non-empty folder that is not a prepared one)."""


class WheelUnavailable(Exception):
    """A wheel is neither cached nor downloadable."""


def _msg(e: BaseException) -> str:
    return runner._msg(e)


# -- wheels ----------------------------------------------------------------------------------
def default_wheel_cache() -> Path:
    """``$TVM_PESTO_WHEELS``, else ``$XDG_CACHE_HOME/tvm-pesto/wheels`` (``~/.cache``)."""
    if os.environ.get("TVM_PESTO_WHEELS"):
        return Path(os.environ["TVM_PESTO_WHEELS"])
    return Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))) / "tvm-pesto" / "wheels"


def fetch_wheel(dist: str, version: str, cache: Path, python: str = GPU_PYTHON, pure: bool = False) -> Path:
    """The CPython ``python`` wheel of ``dist==version`` (``pure``: its ``py3-none-any`` wheel):
    from ``cache``, else ``pip download`` into it.

    Raises
    ------
    WheelUnavailable
        With pip's last error line when the registry cannot be reached or has no such wheel.
    """
    stem = f"{dist.replace('-', '_').lower()}-{version}-" + ("py3-" if pure else f"cp{python.replace('.', '')}-")
    cache = Path(cache)

    def cached():
        return sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(stem))

    if cached():
        return cached()[-1]
    if _UNREACHABLE:
        raise WheelUnavailable(f"{dist}=={version} is not cached in {cache} and {_UNREACHABLE[0]}")
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", "--disable-pip-version-check", "-q", "--timeout", "15", "--retries", "1",
           "-d", str(cache)]
    for p in _PLATFORMS:
        cmd += ["--platform", p]
    try:
        r = subprocess.run(cmd + [f"{dist}=={version}"], capture_output=True, text=True, timeout=300)
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] if r.returncode else []
    except (OSError, subprocess.TimeoutExpired) as e:
        tail = [str(e)]
    if not cached():
        why = f"pip download {dist}=={version} for CPython {python} failed{': ' + tail[0] if tail else ''}"
        if any(w in (tail[0] if tail else "").lower() for w in ("connection", "network", "resolve", "timed out",
                                                                   "timeout", "unreachable")):
            _UNREACHABLE.append(f"the registry looked unreachable ({why})")  # do not wait on it again
        raise WheelUnavailable(f"{why} (cache {cache})")
    return cached()[-1]


#: Set after a download failed for want of a network, so the next wheels fail at once.
_UNREACHABLE: list = []


# -- values ----------------------------------------------------------------------------------
def _param_spec(ty, fill_of) -> dict:
    if isinstance(ty, relax.TupleType):
        return {"tuple": [_param_spec(f, fill_of) for f in ty.fields]}
    shape, dtype = [int(s) for s in ty.shape.values], str(ty.dtype)
    return {"shape": shape, "dtype": dtype, "fill": fill_of(shape, dtype)}


def _np_args(params, rng) -> list:
    out = []
    for p in params:
        ty = p.ty
        if isinstance(ty, relax.TensorType):
            out.append(rng.standard_normal([int(s) for s in ty.shape.values]).astype(str(ty.dtype)))
        else:
            out.append(tuple(_np_args([relax.Var("f", f) for f in ty.fields], rng)))
    return out


def _tvm(a):
    return tuple(_tvm(x) for x in a) if isinstance(a, tuple) else tvm.runtime.tensor(a)


def _store_args(args, prefix: str, store: dict) -> list:
    """Put nested numpy args into ``store``; their parameter spec (``fill: data:<key>``)."""
    spec = []
    for i, a in enumerate(args):
        key = f"{prefix}_p{i}"
        if isinstance(a, tuple):
            spec.append({"tuple": _store_args(list(a), key, store)})
        else:
            store[key] = a
            spec.append({"shape": list(a.shape), "dtype": str(a.dtype), "fill": f"data:{key}"})
    return spec


def _measure_fields(rg, nodes, key: str) -> dict:
    """The MeasureCache fields of a subgraph (``tvm_pesto.costs.store.cache``)."""
    nds = [rg.graph.nodes[v] for v in nodes]
    return {"key": key, "op": "+".join(n.op for n in nds), "flops": float(sum(n.flops for n in nds)),
            "bytes": float(sum(n.bytes_read + n.bytes_written for n in nds))}


def _cpu_vm(funcs: dict, what: str):
    mod = tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in funcs.items()})
    return relax.VirtualMachine(compile_for(mod, CPU_TARGET, what), tvm.cpu())


def _plan_dict(plan, prefix: str, store: dict) -> dict:
    """A GemmPlan / ConvPlan as plain data; constant operands go to ``store``."""
    out = {}
    for f in dataclasses.fields(plan):
        v = getattr(plan, f.name)
        if isinstance(v, cublas.Operand):
            if v.const is not None:
                store[f"{prefix}_c_{f.name}"] = np.asarray(v.const, order="C")
                out[f.name] = {"const": f"c_{f.name}"}
            else:
                out[f.name] = {"param": int(v.index), "item": None if v.item is None else int(v.item)}
        elif isinstance(v, (tuple, list)):
            out[f.name] = [int(x) for x in v]
        elif isinstance(v, (bool, np.bool_)):
            out[f.name] = bool(v)
        elif isinstance(v, (int, np.integer)):
            out[f.name] = int(v)
        else:
            out[f.name] = v
    return out


# -- rows --------------------------------------------------------------------------------------
def _fill(shape, dtype: str) -> str:
    """How the runner fills a parameter it has no data for: random floats, zero integers
    (a random index would read out of bounds)."""
    return "normal" if dtype.startswith(("float", "bfloat")) else "zeros"


def build_modules(mod, stem: str, what: str, folder: Path, target, man: dict, entry: dict, nvcc: bool,
                  row: Row) -> None:
    """``mod`` compiled for CUDA (``models/<stem>.cuda.so``, its nvcc fatbins under ``kernels/``)
    and for the CPU (the twin, ``models/<stem>.cpu.so``); ``entry["cuda"]`` and
    ``entry["cpu_twin"]`` say where (None and an ``*_error`` on failure), and ``row`` gets a
    check per step."""
    entry["cuda"] = None
    try:
        ex = tvm_cuda.compile_cuda(mod, target, what=what)
        so = tvm_cuda.export_cuda(ex, folder / "models" / f"{stem}.cuda.so")
        row.add(f"CUDA compile + export {target.export().get('arch')}", "ok", f"{so.stat().st_size / MIB:.2f} MiB")
        sources = tvm_cuda.cuda_sources(ex)
        kernels = []
        if not nvcc:
            raise runner.CheckFailure("build_failed", "nvcc is not on PATH: without the prebuilt kernels the GPU machine "
                                      "would need a CUDA compiler; install the CUDA toolkit here")
        from tvm.support import nvcc as tvm_nvcc  # lazy: needs the CUDA toolkit, only when nvcc is present

        for src in sources:
            sha = hashlib.sha256(str(src).encode()).hexdigest()
            rel = f"kernels/{sha[:16]}.fatbin"
            if sha not in man["kernels"]:
                with target:
                    binary = tvm_nvcc.compile_cuda(str(src), target_format="fatbin", compiler="nvcc")
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_bytes(bytes(binary))
                man["kernels"][sha] = rel
            kernels.append(sha)
        row.add("nvcc fatbin", "ok", f"{len(kernels)} CUDA module(s), {sum(len(str(s)) for s in sources) / 1e3:.0f} kB "
                "of source")
        entry["cuda"] = {"file": f"models/{stem}.cuda.so", "kernels": kernels}
    except Exception as e:  # noqa: BLE001 - reported in the row and the manifest
        entry["cuda_status"] = e.status if isinstance(e, runner.CheckFailure) else "build_failed"
        entry["cuda_error"] = e.detail if isinstance(e, runner.CheckFailure) else _msg(e)
        row.add("CUDA build", entry["cuda_status"], entry["cuda_error"])
    entry["cpu_twin"] = None
    try:
        twin = compile_for(mod, CPU_TARGET, f"the CPU twin of {what}")
        rel = f"models/{stem}.cpu.so"
        twin.export_library(str(folder / rel))
        entry["cpu_twin"] = {"file": rel}
        row.add("CPU twin build + export", "ok")
    except Exception as e:  # noqa: BLE001
        entry["cpu_twin_error"] = _msg(e)
        row.add("CPU twin build", "build_failed", entry["cpu_twin_error"])


def prepare_tvm(rg, zm, name: str, folder: Path, target, man: dict, entry: dict, nvcc: bool, store: dict) -> Row:
    """TVM-CUDA module (main + distinct fusion groups), its fatbins, and the CPU twin; integer
    constants the groups take as parameters go to ``store`` (the model's npz)."""
    row = Row(name, "tvm-cuda")
    funcs, seen = {}, {}
    for g in fusion_groups(rg.graph):
        seg = candidate_function(rg, g, lift_constants=True)
        key = structural_key(seg.func)
        if key in seen:
            seen[key]["count"] += 1
            continue
        gname = f"g{len(funcs)}"
        n_free = len(seg.inputs)
        params = []
        for j, p in enumerate(seg.func.params):
            if j >= n_free and isinstance(p.ty, relax.TensorType) and _fill(None, str(p.ty.dtype)) == "zeros":
                store[f"{gname}_p{j}"] = seg.lifted_constants[j - n_free].value.numpy()  # e.g. take() indices
                params.append({"shape": [int(s) for s in p.ty.shape.values], "dtype": str(p.ty.dtype),
                               "fill": f"data:{gname}_p{j}"})
            else:
                params.append(_param_spec(p.ty, _fill))
        meta = {"name": gname, "params": params, "count": 1, **_measure_fields(rg, g, key)}
        seen[key] = meta
        funcs[gname] = seg.func.with_attr("global_symbol", gname)
    entry["groups"] = list(seen.values())
    row.subgraphs = 1 + len(funcs)
    mod = tvm.IRModule({**{gv.name_hint: zm.mod[gv] for gv in zm.mod.get_global_vars()}, **funcs})
    build_modules(mod, name, f"{name} (main + {len(funcs)} fusion groups)", folder, target, man, entry, nvcc, row)
    row.skip("load, run and time on the GPU", "no-gpu", "runs with --run on the GPU machine")
    return row


PLANNERS = {"cublas": lambda f: cublas.plan_gemm(f), "cudnn": lambda f: cudnn.plan_conv(f)}
EMULATORS = {"cublas": lambda p, a: cublas.emulate_gemm(p, a), "cudnn": lambda p, a: cudnn.emulate_conv(p, a)}


#: The mixed module's cover: ``plan`` what tvm-pesto plans for the ``h200`` preset with TVM,
#: cuBLAS and cuDNN as candidates (costs from the shipped H200 logs); ``library`` every cuBLAS
#: and cuDNN match (Collage's all-library cover).
MIX_COVERS = ("plan", "library")
#: The preset the mixed module is planned and lowered for.
MIX_CLUSTER = "h200"


def library_units(rg) -> list:
    """Every cuBLAS and cuDNN match as a unit of that library (the first of overlapping ones),
    every other op a ``tvm`` unit of its own."""
    units, taken = [], set()
    for lib in ("cublas", "cudnn"):
        for m in patterns.match_nodes(rg, lib):
            if not taken & set(m.nodes):
                units.append(Candidate(lib, tuple(sorted(m.nodes)), m.pattern))
                taken |= set(m.nodes)
    return units + [Candidate("tvm", (v,)) for v in range(rg.graph.num_nodes) if v not in taken]


def mixed_cover(zm, rg, cover: str) -> tuple:
    """(graph, units, device of each unit) of the mixed module: tvm-pesto's plan for
    :data:`MIX_CLUSTER` (``cover="plan"``), or :func:`library_units`."""
    cluster = parse_cluster(MIX_CLUSTER)
    if cover == "library":
        units = library_units(rg)
        return rg, units, [cluster.devices[0]] * len(units)
    pl = tvm_pesto.place(zm.mod, cluster, backends="tvm,cublas,cudnn")
    return pl.analysis.rg, list(pl.plan.units), [cluster.devices[d] for d in pl.plan.assignment]


def prepare_mixed(zm, rg, name: str, folder: Path, target, man: dict, entry: dict, nvcc: bool,
                  cover: str = "plan") -> Row:
    """``main`` with cuBLAS / cuDNN units as their library's extern calls and the rest TVM-CUDA
    kernels (:func:`mixed_cover`), lowered by the builder for the ``h200`` device without
    building the units here (``lower_units(build=False)``); each extern's plan and constants
    (``data/<m>.mixed.npz``) let the runner register it under the name the module calls."""
    row = Row(name, "mixed")
    info = {"cover": cover, "externs": {}}
    entry["mixed"] = info
    rg, units, devices = mixed_cover(zm, rg, cover)
    lib_units = [k for k, u in enumerate(units) if u.backend != "tvm"]
    if not lib_units:
        info["skip"] = {"reason": "no-matches", "detail": f"the {cover} cover of {name} has no cuBLAS or cuDNN unit"}
        row.skip("everything", "no-matches", info["skip"]["detail"])
        return row
    low = lower_units(rg, units, devices, build=False)
    info["units"] = len(low.externs)
    store = {}
    for j, (gname, k) in enumerate(sorted(low.externs.items(), key=lambda kv: kv[1])):
        lib, func = units[k].backend, candidate_function(rg, units[k].nodes, lift_constants=False).func
        try:
            plan = PLANNERS[lib](func)
        except Exception as e:  # noqa: BLE001 - a unit the cover chose that its library cannot run
            row.add(f"x{j} {lib} {units[k].pattern}: plan", "build_failed", _msg(e))
            continue
        d = _plan_dict(plan, f"x{j}", store)
        if lib == "cudnn":
            y = plan.y_dims if plan.layout == "NCHW" else (plan.y_dims[0], plan.y_dims[2], plan.y_dims[3],
                                                             plan.y_dims[1])
            d["y_shape"] = [int(v) for v in y]
        info["externs"][gname] = {"lib": lib, "pattern": units[k].pattern, "prefix": f"x{j}",
                                  "n_in": len(func.params), "plan": d}
    counts = {lib: sum(1 for e in info["externs"].values() if e["lib"] == lib) for lib in ("cublas", "cudnn")}
    info["data"] = f"data/{name}.mixed.npz"
    np.savez(folder / info["data"], **store)
    row.subgraphs = len(info["externs"])
    row.add(f"lower the {cover} cover", "ok", f"{counts['cublas']} cuBLASLt + {counts['cudnn']} cuDNN extern "
            f"calls, the other {sum(len(u.nodes) for u in units if u.backend == 'tvm')} ops on TVM-CUDA")
    build_modules(low.mod, f"{name}.mixed", f"{name} with library calls", folder, target, man, info, nvcc, row)
    row.skip("load, run and time on the GPU", "no-gpu", "runs with --run on the GPU machine")
    return row


def prepare_library(rg, name: str, lib: str, folder: Path, entry: dict) -> Row:
    """Every distinct ``lib`` subgraph: its plan, the plan emulated against TVM's CPU result,
    its inputs, weights and reference in ``data/<model>.<lib>.npz``."""
    row = Row(name, lib)
    info = {"subgraphs": []}
    entry["libraries"][lib] = info
    matches = patterns.match_nodes(rg, lib)
    op = LIBRARY_OPS[lib]
    with_op = [v for v, nd in enumerate(rg.graph.nodes) if nd.op == op]
    covered = {v for m in matches for v in m.nodes}
    if not matches:
        if with_op:
            info["coverage_error"] = f"no {lib} pattern matched any of the {len(with_op)} {op} nodes"
            row.add("coverage", "build_failed", info["coverage_error"])
        else:
            info["skip"] = {"reason": "no-matches", "detail": f"{name} has no {op}"}
            row.skip("everything", "no-matches", info["skip"]["detail"])
        return row
    row.add("coverage", "ok", f"{len(matches)} matches cover {len(covered & set(with_op))} of {len(with_op)} {op} nodes")
    seen, subs = {}, []
    for m in matches:
        key = candidate_key(rg, m.nodes)
        if key in seen:
            seen[key]["count"] += 1
            continue
        sub = {"name": f"s{len(subs)}", "pattern": m.pattern, "count": 1, **_measure_fields(rg, m.nodes, key)}
        seen[key] = sub
        subs.append(sub)
        sub["_func"] = candidate_function(rg, m.nodes, lift_constants=False).func
        try:
            sub["_plan"] = PLANNERS[lib](sub["_func"])
        except Exception as e:  # noqa: BLE001 - the backend's plan builder failed
            sub.update(plan=None, status="build_failed", error=_msg(e))
            row.add(f"{sub['name']} {m.pattern}: plan", "build_failed", sub["error"])
    row.subgraphs = len(subs)
    planned = [s for s in subs if "_plan" in s]
    store = {}
    if planned:
        try:
            vm = _cpu_vm({s["name"]: s["_func"] for s in planned}, f"the {lib} subgraphs of {name}")
        except Exception as e:  # noqa: BLE001
            vm = None
            for s in planned:
                s.update(plan=None, status="build_failed", error=f"TVM CPU reference: {_msg(e)}")
            row.add("TVM CPU reference", "build_failed", _msg(e))
        rng = np.random.default_rng(0)
        for s in planned if vm is not None else []:
            label = f"{s['name']} {s['pattern']}"
            plan = s["_plan"]
            args = _np_args(s["_func"].params, rng)
            refs = runner.to_numpy(vm[s["name"]](*[_tvm(a) for a in args]))
            if len(refs) != 1:
                s.update(plan=None, status="build_failed", error=f"{len(refs)} outputs; the {lib} backend writes one")
                row.add(label, "build_failed", s["error"])
                continue
            if lib == "cudnn":
                y = refs[0].shape
                want = tuple(y) if plan.layout == "NCHW" else (y[0], y[3], y[1], y[2])
                if tuple(plan.y_dims) != want:
                    s.update(plan=None, status="mismatch", error=f"plan y_dims {plan.y_dims}, TVM's output {y}")
                    row.add(label, "mismatch", s["error"])
                    continue
            tol = TOLERANCES["plan_gelu" if str(getattr(plan, "epilogue", "")).startswith("gelu") else "plan"]
            try:
                got = EMULATORS[lib](plan, args)
            except Exception as e:  # noqa: BLE001
                s.update(plan=None, status="build_failed", error=f"emulating the plan: {_msg(e)}")
                row.add(label, "build_failed", s["error"])
                continue
            if not runner.compare(row, f"{label}: plan (NumPy) vs TVM CPU", [np.asarray(got)], refs, tol):
                s.update(plan=None, status="mismatch", error=row.items[-1]["detail"])
                continue
            s["plan"] = _plan_dict(plan, s["name"], store)
            if lib == "cudnn":
                s["plan"]["y_shape"] = list(refs[0].shape)
            s["params"] = _store_args(args, s["name"], store)
            store[f"{s['name']}_ref0"] = refs[0]
    for s in subs:
        s.pop("_func", None)
        s.pop("_plan", None)
    info["subgraphs"] = subs
    if store:
        info["data"] = f"data/{name}.{lib}.npz"
        np.savez(folder / info["data"], **store)
    row.skip({"cublas": "cuBLASLt calls", "cudnn": "cuDNN graph builds and runs"}[lib], "no-gpu",
             "run with --run on the GPU machine")
    return row


def prepare_tensorrt(rg, name: str, entry: dict) -> Row:
    """TensorRT's build side: each merged region exported to ONNX, onnx.checker, ONNX Runtime
    against TVM's CPU result (engines need TensorRT, which cannot travel)."""
    import onnxruntime as ort

    row = Row(name, "tensorrt")
    regions = patterns.merged_regions(rg, "tensorrt")
    entry["libraries"]["tensorrt"] = {"regions": len(regions)}
    row.subgraphs = len(regions)
    exported = []
    for k, r in enumerate(regions):
        seg = candidate_function(rg, r.nodes, lift_constants=False)
        try:
            exported.append((f"r{k}", seg.func, tensorrt.export_subgraph(seg.func)))
        except Exception as e:  # noqa: BLE001
            row.add(f"r{k}: ONNX export + onnx.checker", "build_failed", _msg(e))
    if exported:
        vm = _cpu_vm({n: f for n, f, _ in exported}, f"the TensorRT regions of {name}")
        rng = np.random.default_rng(0)
        for n, func, model in exported:
            args = _np_args(func.params, rng)
            refs = runner.to_numpy(vm[n](*[_tvm(a) for a in args]))
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            got = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), flatten_args(args))})
            runner.compare(row, f"{n}: ONNX ({len(model.graph.node)} nodes) in ONNX Runtime vs TVM CPU", got, refs,
                           TOLERANCES["onnx"])
    if not regions:
        row.skip("everything", "no-matches", f"no TensorRT region in {name}")
    row.skip("engine build and run", "tensorrt-not-in-workplace")
    return row


# -- the folder --------------------------------------------------------------------------------
def _clear(folder: Path) -> None:
    if folder.exists() and any(folder.iterdir()):
        mpath = folder / runner.MANIFEST
        try:
            ours = json.loads(mpath.read_text()).get("format") == runner.BUNDLE_FORMAT
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise PrepareError(f"{folder} is not empty and holds no prepared GPU check; give a new or empty folder")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)


def write_lib(lib: Path) -> None:
    """``lib/``: the project's probes, and the backends' library-call code the runner reuses."""
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy2(gpu_probe.__file__, lib / "gpu_probe.py")
    head = '"""Written by tests/gpu/prepare.py from {src}; do not edit."""\nfrom __future__ import annotations\n\n'
    (lib / "pesto_cudnn_graph.py").write_text(
        head.format(src="tvm_pesto.backends.gpu.cudnn.build_cudnn_graph and CudnnBackend.allow_tf32")
        + f"class BuildError(RuntimeError):\n    pass\n\n\nALLOW_TF32 = {cudnn.CudnnBackend.allow_tf32!r}\n\n\n"
        + inspect.getsource(cudnn.build_cudnn_graph))
    names = ("_OP", "_CUDA_DTYPE", "_COMPUTE_32F", "_COMPUTE_32F_FAST_TF32", "_DESC_TRANSA", "_DESC_TRANSB",
             "_DESC_EPILOGUE", "_DESC_BIAS_POINTER", "_LAYOUT_BATCH_COUNT", "_LAYOUT_STRIDED_BATCH_OFFSET", "EPILOGUES")
    consts = "".join(f"{n} = {getattr(cublas, n)!r}\n" for n in names)
    bk = cublas.CublasBackend
    consts += (f"COMPUTE_TYPE = {cublas._COMPUTE_32F_FAST_TF32 if bk.allow_tf32 else cublas._COMPUTE_32F!r}\n"
               f"WORKSPACE_BYTES = {bk.workspace_bytes!r}\n")
    (lib / "pesto_cublaslt.py").write_text(
        head.format(src="tvm_pesto.backends.gpu.cublas (enums, CublasBackend settings, _Lt)")
        + "import ctypes\nimport threading\n\nimport tvm\n\nimport gpu_probe as probe\n\n\n"
        + "class BuildError(RuntimeError):\n    pass\n\n\n" + consts + "\n\n" + inspect.getsource(cublas._Lt))
    (lib / "pesto_emulate.py").write_text(
        head.format(src="tvm_pesto.backends.gpu.cublas (Operand, emulate_gemm) and cudnn (emulate_conv)")
        + "import math\nfrom dataclasses import dataclass\n\nimport numpy as np\n\n\n"
        + "\n\n".join(inspect.getsource(f) for f in (cublas.Operand, cublas._col_major, cublas.emulate_gemm,
                                                    cudnn.emulate_conv)))


def _carried_files(root: Path) -> list[Path] | None:
    """The working tree's files that a device call sends: tracked and untracked-not-ignored
    (``git ls-files``, read-only), and the checkout's ``shared/`` folder, ignored or not;
    None outside a git checkout."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    files = {root / rel for rel in r.stdout.decode(errors="replace").split("\0") if rel}
    if (root / "shared").is_dir():
        files |= {p for p in (root / "shared").rglob("*") if p.is_file() or p.is_symlink()}
    return sorted(p for p in files if p.is_file() or p.is_symlink())


def device_call_bytes(root: Path = ROOT, folder: Path | None = None, folder_bytes: int | None = None) -> dict:
    """What one device call carries: the working tree and the carried folder, in bytes.

    The working tree is what the device tool sends on every call (tracked and
    untracked-not-ignored files, and ``shared/``); files of ``folder`` among them count once, as
    the folder's. A symbolic link counts as a link.

    Parameters
    ----------
    root : Path
        The git checkout the call is made from.
    folder : Path, optional
        The prepared folder (carried with ``carry``); its files are summed.
    folder_bytes : int, optional
        The folder's size instead, e.g. an estimate (:data:`FOLDER_MIB`).

    Returns
    -------
    dict
        ``tree``, ``folder`` and ``total`` bytes (``tree`` and ``total`` None outside a git
        checkout), and ``largest``: the tree's five largest files as (path, bytes).
    """
    ex = Path(folder).resolve() if folder is not None else None
    if folder_bytes is None:
        folder_bytes = tree_bytes(folder) if folder is not None else 0
    files = _carried_files(Path(root))
    if files is None:
        return {"tree": None, "folder": folder_bytes, "total": None, "largest": []}
    sizes = {}
    for p in files:
        if ex is not None and (ex == p.resolve() or ex in p.resolve().parents):
            continue
        sizes[str(p.relative_to(root))] = p.lstat().st_size
    tree = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    return {"tree": tree, "folder": folder_bytes, "total": tree + folder_bytes, "largest": largest}


def call_size_check(size: dict, max_mib: float = MAX_MIB, folder_parts: str = "") -> tuple[str, str]:
    """The row status (``ok`` or ``build_failed``) and detail for a :func:`device_call_bytes`
    result against ``max_mib`` (at most :data:`CALL_LIMIT_MIB`); ``folder_parts`` follows the
    folder's size in the detail."""
    limit = min(max_mib, CALL_LIMIT_MIB)
    folder = f"folder {size['folder'] / MIB:.1f} MiB{folder_parts}"
    if size["total"] is None:
        ok = size["folder"] <= limit * MIB
        return ("ok" if ok else "build_failed"), (f"{folder} {'<=' if ok else '>'} {limit:g} MiB; not a git checkout: "
                                                  "the working tree's size is unknown")
    what = f"working tree {size['tree'] / MIB:.1f} MiB + {folder} = {size['total'] / MIB:.1f} MiB"
    if size["total"] <= limit * MIB:
        return "ok", f"{what} <= {limit:g} MiB"
    largest = ", ".join(f"{p} {n / MIB:.1f}" for p, n in size["largest"])
    return "build_failed", (f"{what} > {limit:g} MiB (a device call carries at most {CALL_LIMIT_MIB:g}): prepare fewer "
                            f"models (--models) or shrink the working tree (largest: {largest} MiB)")


def _git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def prepare(folder, models=DEFAULT_MODELS, arch: str = "sm_90", wheel_cache=None, allow_missing_wheels: bool = False,
            max_mib: float = MAX_MIB, say=print, mix: str = "plan") -> tuple[dict, list[dict]]:
    """Build the folder; returns (manifest, row dicts). See the module docstring.

    Raises
    ------
    PrepareError
        When ``folder`` is a non-empty folder that is not a prepared GPU check.
    """
    t0 = time.time()
    if mix not in MIX_COVERS:
        raise PrepareError(f"unknown mixed-module cover {mix!r}: use one of {', '.join(MIX_COVERS)}")
    folder = Path(folder).resolve()
    _clear(folder)
    for sub in ("models", "data", "wheels"):
        (folder / sub).mkdir()
    target = tvm_cuda.cuda_target(arch)
    man = {"format": runner.BUNDLE_FORMAT, "version": runner.VERSION,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tvm_pesto": __version__,
           "git_commit": _git_commit(), "arch": arch, "target": target_key({"kind": "cuda", "arch": arch}),
           "cache_version": CACHE_VERSION, "tolerances": TOLERANCES, "python": GPU_PYTHON,
           "skip_reasons": runner.SKIP_REASONS, "models": {}, "kernels": {}, "wheels": {}}
    bundle = Row("*", "bundle")
    rows = [bundle]
    pkg = copy_runtime_package(folder / "runtime")
    bundle.add("runtime-only TVM package", "ok", f"{tree_bytes(pkg) / MIB:.1f} MiB, no libtvm_compiler.so")
    shutil.copy2(HERE / "gpu_runner.py", folder / "run_gpu_check.py")
    write_lib(folder / "lib")
    cache = Path(wheel_cache) if wheel_cache else default_wheel_cache()
    wheels = (("tvm-ffi", "apache-tvm-ffi", metadata.version("apache-tvm-ffi"), False),
              ("typing-extensions", "typing_extensions", metadata.version("typing_extensions"), True),
              ("cudnn-frontend", *CUDNN_FRONTEND, False))
    for name, dist, version, pure in wheels:
        entry = {"dist": dist, "version": version, "python": "any" if pure else GPU_PYTHON}
        try:
            whl = fetch_wheel(dist, version, cache, pure=pure)
            shutil.copy2(whl, folder / "wheels" / whl.name)
            entry["file"] = f"wheels/{whl.name}"
            bundle.add(f"wheel {name}", "ok", f"{whl.name} ({whl.stat().st_size / MIB:.1f} MiB)")
        except WheelUnavailable as e:
            entry["missing"] = str(e)
            if allow_missing_wheels:
                bundle.skip(f"wheel {name}", "registry-unreachable", str(e))
            else:
                bundle.add(f"wheel {name}", "missing_library", f"{e}; run where pip reaches PyPI, put the wheel in "
                           f"{cache}, or pass --allow-missing-wheels")
        man["wheels"][name] = entry
    nvcc = bool(gpu_probe.nvcc_archs()) and arch in gpu_probe.nvcc_archs()
    for name in models:
        say(f"-- {name} ({time.time() - t0:.0f}s)")
        entry = {"data": f"data/{name}.npz", "libraries": {}}
        try:
            zm = zoo.load(name, "small")
            rg = from_relax(zm.mod)
            ref = zoo.torch_reference(zm)
            refs = list(ref) if isinstance(ref, tuple) else [ref]
            entry.update(n_inputs=len(zm.example_inputs), n_outputs=len(refs))
            store = {**{f"in{i}": a for i, a in enumerate(zm.example_inputs)}, **{f"ref{i}": r for i, r in enumerate(refs)}}
        except Exception as e:  # noqa: BLE001
            r = Row(name, "tvm-cuda")
            r.fail_from("load the zoo model", e)
            rows.append(r)
            entry.update(cuda=None, cpu_twin=None, cuda_error=_msg(e), cpu_twin_error=_msg(e), groups=[],
                         n_inputs=0, n_outputs=0)
            man["models"][name] = entry
            continue
        steps = [("tvm-cuda", lambda: prepare_tvm(rg, zm, name, folder, target, man, entry, nvcc, store))]
        steps += [(lib, lambda lib=lib: prepare_library(rg, name, lib, folder, entry)) for lib in ("cublas", "cudnn")]
        steps += [("tensorrt", lambda: prepare_tensorrt(rg, name, entry))]
        steps += [("mixed", lambda: prepare_mixed(zm, rg, name, folder, target, man, entry, nvcc, mix))]
        for backend, step in steps:
            try:
                rows.append(step())
            except Exception as e:  # noqa: BLE001 - one failing backend must not stop the others
                r = Row(name, backend)
                r.fail_from(f"prepare {backend}", e)
                rows.append(r)
                entry["libraries"].setdefault(backend, {"subgraphs": [], "coverage_error": _msg(e)})
        np.savez(folder / entry["data"], **store)
        man["models"][name] = entry
    man["models_built"] = list(man["models"])
    _finish(folder, man, rows, bundle, max_mib)
    say(f"prepared {folder} in {time.time() - t0:.0f}s")
    return man, [r.to_dict() for r in rows]


def _finish(folder: Path, man: dict, rows: list, bundle: Row, max_mib: float) -> None:
    """File list and sizes into the manifest; the size checks into the bundle row."""
    mpath = folder / runner.MANIFEST

    def write():
        man["files"] = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
                        if p.is_file() and p != mpath}
        man["prepare_rows"] = [r.to_dict() for r in rows]
        mpath.write_text(json.dumps(man, indent=1))

    write()
    size = device_call_bytes(ROOT, folder)
    parts = {}
    for rel, nbytes in man["files"].items():
        top = rel.split("/")[0]
        parts[top] = parts.get(top, 0) + nbytes
    biggest = ", ".join(f"{k} {v / MIB:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:5])
    man["size_bytes"] = size["folder"]
    man["call_bytes"] = {k: size[k] for k in ("tree", "folder", "total")}
    bundle.add("device call size", *call_size_check(size, max_mib, f" ({biggest} MiB)"))
    write()
