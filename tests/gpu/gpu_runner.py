#!/usr/bin/env python
"""Run the GPU check that ``tests/gpu/device_check.py --prepare DIR`` built, with TVM's runtime only.

``--prepare`` copies this file into the folder as ``run_gpu_check.py``. It needs only that
folder, Python and NumPy: on the lent GPU machine (Python 3.12, the CUDA driver, the pip wheels
of cuBLAS and cuDNN) there is no TVM, no tvm_pesto and no package registry.

GPU mode (the default):

1. puts the folder's runtime-only TVM (``runtime/tvm``: no ``libtvm_compiler.so``) and the
   unpacked tvm-ffi and cudnn-frontend wheels first on ``sys.path``, sets
   ``TVM_USE_RUNTIME_LIB=1`` and never imports ``tvm.relax`` (it registers compiler ops and
   fails in runtime-only mode). A CUDA module exported on a machine without a GPU holds CUDA
   source; TVM's loader asks ``tvm_callback_cuda_compile`` for the binary, and this runner
   answers with the sm_90 fatbins nvcc made at prepare time (``kernels/``), so no CUDA
   compiler is needed here;
2. per model: ``tvm.runtime.load_module`` + ``tvm.runtime.vm.VirtualMachine`` on
   ``tvm.cuda(0)``; runs ``main`` on the stored inputs against the PyTorch reference; times
   ``main`` and each distinct TVM fusion group ``g<i>`` (median of repeats);
3. replays each cuBLASLt GEMM plan (``cublas.GemmPlan``) and cuDNN convolution plan
   (``cudnn.ConvPlan``) on the stored inputs and weights against TVM's CPU result, and times
   them. The cuDNN graph is built by ``lib/pesto_cudnn_graph.py`` and cuBLASLt is loaded by
   ``lib/pesto_cublaslt.py``, both written at prepare time from the backends' own source;
   ``lib/gpu_probe.py`` is the project's probe module (what is missing and how to get it);
4. writes the JSON log after every row; exits 1 when any row is mismatch, build_failed,
   missing_library or crashed, 2 when it cannot start (no GPU, an incomplete folder).

``--cpu-twins`` (any machine, no GPU): loads each model's CPU twin (the same model exported for
``llvm``) through the same loader, runs it on ``tvm.cpu(0)`` against the reference, and checks
that each CUDA library parses up to its CUDA module (which needs the GPU machine to load).

Row statuses are :data:`STATUSES`; a part may be skipped only for a reason in
:data:`SKIP_REASONS`.

Usage::

    python DIR/run_gpu_check.py --out gpu-check.json          # on the GPU machine
    python DIR/run_gpu_check.py --cpu-twins --out twins.json  # anywhere
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import sys
import time
import traceback
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

BUNDLE_FORMAT = "tvm-pesto-gpu-check"
LOG_FORMAT = "tvm-pesto-gpu-check-log"
VERSION = 1
MANIFEST = "manifest.json"

#: Row and item statuses; the first failing ones make the exit status 1.
STATUSES = ("ok", "mismatch", "build_failed", "missing_library", "crashed", "skipped")
FAILING = frozenset({"mismatch", "build_failed", "missing_library", "crashed"})
_SEVERITY = {"skipped": 0, "ok": 1, "mismatch": 2, "missing_library": 3, "build_failed": 4, "crashed": 5}

#: The only reasons a part of the check may be skipped.
SKIP_REASONS = {
    "no-gpu": "no CUDA GPU on this machine (dry run, CI): loading, running and timing on the GPU "
              "happen on the lent GPU machine (--run)",
    "tensorrt-not-in-workplace": "TensorRT's libraries (GBs) exceed the 64 MiB a call to the lent GPU machine "
                                 "carries; TensorRT is checked build-side only (ONNX export, onnx.checker, "
                                 "ONNX Runtime against TVM)",
    "no-matches": "the model has no op this library is for (no matmul for cuBLAS, no conv2d for cuDNN)",
    "time-budget": "the run reached --budget-s before this part",
    "registry-unreachable": "pip could not download this wheel (no package registry) and it was not cached; "
                            "--allow-missing-wheels let --prepare go on without it",
}


class CheckFailure(Exception):
    """A failure with its row status (``build_failed``, ``missing_library``...)."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def _msg(e: BaseException, limit: int = 400) -> str:
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return f"{type(e).__name__}: {last}"[:limit]


class Row:
    """One (model, backend) line of the check: its items, what was skipped and why, timings.

    The row's status is its worst item's (``crashed`` > ``build_failed`` > ``missing_library``
    > ``mismatch`` > ``ok``); ``skipped`` only when nothing was checked and a reason from
    :data:`SKIP_REASONS` says why. A row that recorded nothing at all is reported ``crashed``.
    """

    def __init__(self, model: str, backend: str):
        self.model, self.backend = model, backend
        self.status: str | None = None
        self.detail = ""
        self.items: list[dict] = []
        self.skipped: list[dict] = []
        self.timings: list[dict] = []
        self.subgraphs = 0
        self.max_err = 0.0

    def add(self, name: str, status: str, detail: str = "", **extra) -> None:
        if status not in STATUSES or status == "skipped":
            raise ValueError(f"item status {status!r} is not one of {STATUSES[:-1]} (use skip() for skipped parts)")
        self.items.append({"name": name, "status": status, "detail": detail, **extra})
        if "max_err" in extra and extra["max_err"] is not None and np.isfinite(extra["max_err"]):
            self.max_err = max(self.max_err, float(extra["max_err"]))
        if self.status is None or _SEVERITY[status] > _SEVERITY[self.status]:
            self.status = status
            self.detail = f"{name}: {detail}" if detail else name

    def skip(self, what: str, reason: str, detail: str = "") -> None:
        if reason not in SKIP_REASONS:
            raise ValueError(f"skip reason {reason!r} is not documented; use one of {sorted(SKIP_REASONS)}")
        self.skipped.append({"what": what, "reason": reason, "detail": detail})
        if self.status is None and not self.items:
            self.status = "skipped"
            self.detail = f"{reason}: {detail or SKIP_REASONS[reason]}"

    def fail_from(self, name: str, e: BaseException) -> None:
        """Record an exception: a :class:`CheckFailure` with its status, anything else as crashed."""
        if isinstance(e, CheckFailure):
            self.add(name, e.status, e.detail)
        else:
            tb = traceback.format_exc().strip().splitlines()[-6:]
            self.add(name, "crashed", _msg(e), traceback=tb)

    def to_dict(self) -> dict:
        status, detail = self.status, self.detail
        if status is None:
            status, detail = "crashed", "the check recorded nothing for this row (a bug in the check)"
        if status == "skipped" and self.items:
            status = "ok"
        if status == "ok":
            reasons = sorted({s["reason"] for s in self.skipped})
            detail = f"{len(self.items)} checks ok" + (f"; skipped: {', '.join(reasons)}" if reasons else "")
        return {"model": self.model, "backend": self.backend, "status": status, "detail": detail,
                "subgraphs": self.subgraphs, "max_err": self.max_err, "items": self.items,
                "skipped": self.skipped, "timings": self.timings}


def exit_code(rows: list[dict]) -> int:
    """0 when no row failed, else 1."""
    return 1 if any(r["status"] in FAILING for r in rows) else 0


def print_table(rows: list[dict], out=None) -> None:
    """The summary table of row dicts, then every skipped part and every failing item."""
    out = out or sys.stdout
    cols = ["model", "backend", "subgraphs", "checked", "max_err", "ms(median sum)", "status", "detail"]
    data = []
    for r in rows:
        checked = sum(1 for i in r["items"] if i["status"] == "ok")
        ms = sum(t["median_s"] for t in r["timings"]) * 1e3
        data.append([r["model"], r["backend"], str(r["subgraphs"]), f"{checked}/{len(r['items'])}",
                     f"{r['max_err']:.1e}", f"{ms:.3f}" if r["timings"] else "-", r["status"], r["detail"][:100]])
    widths = [max(len(c), *(len(d[i]) for d in data)) if data else len(c) for i, c in enumerate(cols)]
    print("\n== summary ==", file=out)
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)), file=out)
    for d in data:
        print("  ".join(v.ljust(w) for v, w in zip(d, widths)), file=out)
    skips = [(r, s) for r in rows for s in r["skipped"]]
    if skips:
        print("\nskipped:", file=out)
        for r, s in skips:
            print(f"  {r['model']}/{r['backend']}: {s['what']} [{s['reason']}] {s['detail']}"[:220], file=out)
    bad = [(r, i) for r in rows for i in r["items"] if i["status"] in FAILING]
    if bad:
        print("\nfailures:", file=out)
        for r, i in bad:
            print(f"  {r['model']}/{r['backend']}: {i['name']}: {i['status']}: {i['detail']}"[:400], file=out)


class Log:
    """The JSON log, rewritten after every row so a crash keeps what ran."""

    def __init__(self, path: Path, mode: str, manifest: dict | None, env: dict):
        self.path = Path(path)
        self.data = {"format": LOG_FORMAT, "version": VERSION, "mode": mode,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "prepared": {k: (manifest or {}).get(k) for k in ("created", "tvm_pesto", "git_commit", "arch",
                                                                       "target", "models_built")},
                     "environment": env, "skip_reasons": SKIP_REASONS, "rows": [], "kernels_served": []}

    def add(self, row: Row) -> dict:
        d = row.to_dict()
        self.data["rows"].append(d)
        self.write()
        return d

    def write(self, final: bool = False) -> None:
        rows = self.data["rows"]
        self.data["summary"] = {s: sum(1 for r in rows if r["status"] == s) for s in STATUSES}
        self.data["exit_code"] = exit_code(rows) if final else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=float))
        os.replace(tmp, self.path)


# -- the folder and the runtime ----------------------------------------------------------
def read_manifest(folder: Path) -> dict:
    """The folder's manifest, every listed file present with its size.

    Raises
    ------
    CheckFailure
        (build_failed) naming the missing or truncated file.
    """
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise CheckFailure("build_failed", f"{folder} has no {MANIFEST}: build it with "
                           "python tests/gpu/device_check.py --prepare DIR")
    man = json.loads(mpath.read_text())
    if man.get("format") != BUNDLE_FORMAT or int(man.get("version", -1)) != VERSION:
        raise CheckFailure("build_failed", f"{mpath} is not a version-{VERSION} {BUNDLE_FORMAT} manifest; prepare again")
    for rel, size in man.get("files", {}).items():
        p = folder / rel
        if not p.is_file():
            raise CheckFailure("build_failed", f"{rel} is missing from {folder}: carry the whole folder, or prepare again")
        if p.stat().st_size != size:
            raise CheckFailure("build_failed", f"{rel} in {folder} has {p.stat().st_size} bytes, the manifest says "
                               f"{size}: the copy is truncated or changed; carry it again")
    return man


def _python_tag() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _unpack(folder: Path, rel: str) -> Path:
    """A wheel unpacked under ``folder/.unpacked`` (once); returns the folder to put on sys.path."""
    whl = folder / rel
    dest = folder / ".unpacked" / whl.stem
    if not (dest / ".complete").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest)
        (dest / ".complete").write_text("")
    return dest


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def add_wheel(folder: Path, man: dict, name: str, module: str, env: dict, prefer_installed: bool) -> None:
    """Make ``module`` importable from the bundled wheel ``name`` (when it fits this Python),
    or from what is installed; records which in ``env``.

    Raises
    ------
    CheckFailure
        (missing_library) when neither is usable.
    """
    import importlib.util

    entry = man.get("wheels", {}).get(name, {})
    installed = importlib.util.find_spec(module) is not None
    want = entry.get("version")
    if installed and (prefer_installed or entry.get("python") not in (_python_tag(), "any") or not entry.get("file")):
        have = _dist_version(entry.get("dist", name))
        if want and have and have != want and name == "tvm-ffi":
            raise CheckFailure("missing_library", f"tvm-ffi {have} is installed but the bundled TVM was built against "
                               f"{want}; run with Python {entry.get('python')} (the bundled wheel) or install "
                               f"apache-tvm-ffi=={want}")
        env[name] = f"installed {have}"
        return
    if entry.get("file") and entry.get("python") in (_python_tag(), "any"):
        path = _unpack(folder, entry["file"])
        sys.path.insert(0, str(path))
        env[name] = f"bundled {entry['file']}"
        return
    why = entry.get("missing") or (f"the bundled wheel is for Python {entry.get('python')}, this is {_python_tag()}"
                                   if entry.get("file") else "no wheel in the folder")
    raise CheckFailure("missing_library", f"{name} is not importable here and cannot come from the folder ({why}); "
                       f"run --prepare where pip reaches PyPI, or pip install {entry.get('dist', name)}"
                       f"{'==' + want if want else ''}")


def import_runtime_tvm(folder: Path, env: dict):
    """``import tvm`` from ``folder/runtime`` in runtime-only mode; checks it is that copy.

    Raises
    ------
    CheckFailure
        (build_failed) when another TVM was imported, its compiler library was loaded, or
        ``tvm.relax`` got imported.
    """
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    sys.path.insert(0, str(folder / "runtime"))
    import tvm
    import tvm.runtime.vm  # noqa: F401 - not imported by ``import tvm`` in runtime-only mode

    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    here = Path(tvm.__file__).resolve()
    inside = folder.resolve() in here.parents
    env.update(tvm_file=str(here.relative_to(folder.resolve()) if inside else here),
               runtime_only=bool(getattr(tvm.base, "_RUNTIME_ONLY", False)),
               relax_imported="tvm.relax" in sys.modules, compiler_mapped="libtvm_compiler" in maps)
    bundled = (folder / "runtime").resolve()
    problems = []
    if bundled not in here.parents:
        problems.append(f"tvm was imported from {tvm.__file__}, not from {bundled}")
    if env["compiler_mapped"]:
        problems.append("libtvm_compiler.so is loaded")
    if env["relax_imported"]:
        problems.append("tvm.relax is imported")
    if not env["runtime_only"]:
        problems.append("TVM is not in runtime-only mode")
    if problems:
        raise CheckFailure("build_failed", "; ".join(problems))
    return tvm


def load_vm(tvm, path: Path, dev):
    """``tvm.runtime.load_module`` + ``tvm.runtime.vm.VirtualMachine`` on ``dev``."""
    lib = tvm.runtime.load_module(str(path))
    return tvm.runtime.vm.VirtualMachine(lib, dev)


def serve_prebuilt_kernels(folder: Path, man: dict, served: list) -> None:
    """Answer TVM's ``tvm_callback_cuda_compile`` with the fatbins nvcc made at prepare time
    (keyed by the SHA-256 of the CUDA source); other sources go to TVM's own callback."""
    import tvm_ffi

    table = man.get("kernels", {})
    original = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)

    def compile_cuda(code):
        key = hashlib.sha256(str(code).encode()).hexdigest()
        rel = table.get(key)
        if rel is not None:
            served.append({"source_sha256": key, "binary": rel, "how": "prebuilt"})
            return (folder / rel).read_bytes()
        if original is None:
            raise RuntimeError(f"no prebuilt kernel binary for CUDA source {key[:12]} and no CUDA compiler callback")
        served.append({"source_sha256": key, "how": "jit by TVM's callback (no prebuilt binary matched)"})
        return original(code)

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)


# -- values ------------------------------------------------------------------------------
def to_numpy(v) -> list:
    """A VM result (a tensor or a tuple of them, nested) as a flat list of arrays."""
    if hasattr(v, "numpy"):
        return [v.numpy()]
    out = []
    for x in v:
        out.extend(to_numpy(x))
    return out


def compare(row: Row, name: str, got: list, want: list, tol: float) -> bool:
    """Max abs error of ``got`` vs ``want`` (scaled tolerance ``tol * max(1, max|want|)``) as an item."""
    if len(got) != len(want):
        row.add(name, "mismatch", f"{len(got)} outputs, the reference has {len(want)}")
        return False
    err, scale = 0.0, 1.0
    for g, w in zip(got, want):
        if tuple(g.shape) != tuple(w.shape):
            row.add(name, "mismatch", f"output shape {tuple(g.shape)}, the reference's is {tuple(w.shape)}")
            return False
        d = np.abs(g.astype(np.float64) - w.astype(np.float64))
        err = max(err, float(d.max()) if d.size else 0.0)
        scale = max(scale, float(np.abs(w).max()) if w.size else 0.0)
    ok = bool(np.isfinite(err)) and err <= tol * scale
    row.add(name, "ok" if ok else "mismatch", "" if ok else f"max abs error {err:.3e} > {tol} x {scale:.3g}",
            max_err=err, tol=tol * scale)
    return ok


def make_args(tvm, spec: list, data, dev, rng):
    """Call arguments from a parameter spec: ``{"shape", "dtype", "fill"}`` or ``{"tuple": [...]}``."""
    out = []
    for p in spec:
        if "tuple" in p:
            out.append(tuple(make_args(tvm, p["tuple"], data, dev, rng)))
            continue
        fill = p.get("fill", "normal")
        if fill.startswith("data:"):
            a = data[fill[5:]]
        elif fill == "zeros":
            a = np.zeros(p["shape"], p["dtype"])
        else:
            a = rng.standard_normal(p["shape"]).astype(p["dtype"])
        out.append(tvm.runtime.tensor(np.asarray(a, order="C"), device=dev))  # keeps 0-d arrays 0-d
    return out


def time_call(fn, dev, repeat: int, budget_s: float = 0.5) -> list[float]:
    """Seconds per call of ``fn`` (synchronised), one entry per repeat."""
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


#: How a timing was taken: TVM's C++ ``time_evaluator`` loop (TVM modules), or a Python loop of
#: asynchronous library calls then one synchronise (cuBLASLt, cuDNN: includes the few
#: microseconds of the Python/ctypes call, so tiny subgraphs read slower than they run).
TIMERS = {"tvm": "time_evaluator", "library": "python-loop"}


def timing_record(meta: dict, backend: str, reps: list, ctx: SimpleNamespace, timer: str) -> dict:
    """A MeasureCache record (``tvm_pesto.costs.store.cache``) of one measured subgraph."""
    return {"key": meta["key"], "backend": backend, "target": ctx.target, "median_s": float(np.median(reps)),
            "repeats": [float(r) for r in reps], "op": meta["op"], "flops": meta["flops"], "bytes": meta["bytes"],
            "device": ctx.device_name, "time": time.time(), "cache_version": ctx.cache_version,
            "name": meta.get("name", ""), "count": meta.get("count", 1), "timer": timer}


# -- per model: TVM modules ------------------------------------------------------------------
def run_model_tvm(ctx, name: str, entry: dict, which: str, backend: str = "", tol: str = "model") -> Row:
    """Load ``entry[which]`` (``"cuda"`` on ``tvm.cuda(0)``, ``"cpu_twin"`` on ``tvm.cpu(0)``: the
    same IRModule built for llvm), run ``main`` against the PyTorch reference, time ``main``
    and every distinct fusion group ``g<i>``; ``backend`` names the row (default by ``which``),
    ``tol`` the tolerance ``main`` is held to."""
    tvm, dev = ctx.tvm, ctx.dev
    row = Row(name, backend or ("tvm-cuda" if which == "cuda" else "cpu-twin"))
    what = "CUDA module" if which == "cuda" else "CPU twin (runtime-only)"
    if entry.get(which) is None:
        row.add(f"build {what}", entry.get(f"{which}_status", "build_failed"),
                f"at --prepare: {entry.get(f'{which}_error', '')}")
        return row
    row.subgraphs = 1 + len(entry["groups"])
    n_served = len(ctx.served)
    try:
        vm = load_vm(tvm, ctx.folder / entry[which]["file"], dev)
    except Exception as e:  # noqa: BLE001 - TVM's loader error, reported
        row.add(f"load {what}", "build_failed", _msg(e))
        return row
    how = sorted({k["how"] for k in ctx.served[n_served:]})
    row.add(f"load {what}", "ok", ", ".join(how))
    data = np.load(ctx.folder / entry["data"])
    args = [tvm.runtime.tensor(data[f"in{i}"], device=dev) for i in range(entry["n_inputs"])]
    try:
        got = to_numpy(vm["main"](*args))
        dev.sync()
    except Exception as e:  # noqa: BLE001
        row.fail_from("run main", e)
        return row
    compare(row, "main vs PyTorch", got, [data[f"ref{i}"] for i in range(entry["n_outputs"])], ctx.tol[tol])
    te = vm.time_evaluator("main", dev, number=1, repeat=ctx.repeat, min_repeat_ms=ctx.min_repeat_ms)(*args)
    row.add("time main", "ok", f"median {np.median(te.results) * 1e3:.4f} ms",
            median_s=float(np.median(te.results)), repeats=[float(x) for x in te.results])
    rng = np.random.default_rng(0)
    for k, g in enumerate(entry["groups"]):
        if time.time() > ctx.deadline:
            row.skip(f"timing of {len(entry['groups']) - k} fusion groups", "time-budget")
            break
        try:
            gargs = make_args(tvm, g["params"], data, dev, rng)
            te = vm.time_evaluator(g["name"], dev, number=1, repeat=ctx.repeat, min_repeat_ms=ctx.min_repeat_ms)(*gargs)
            row.timings.append(timing_record(g, row.backend, list(te.results), ctx, TIMERS["tvm"]))
        except Exception as e:  # noqa: BLE001
            row.fail_from(f"time group {g['name']}", e)
            break
    else:
        row.add("time fusion groups", "ok", f"{len(entry['groups'])} distinct groups")
    return row


def check_cuda_library(ctx, row: Row, entry: dict) -> None:
    """Without a GPU: the CUDA library must parse up to its CUDA module (whose loader is
    registered by libtvm_runtime_cuda.so, which needs libcuda.so.1)."""
    if entry.get("cuda") is None:
        row.add("build CUDA module", entry.get("cuda_status", "build_failed"), f"at --prepare: {entry.get('cuda_error')}")
        return
    try:
        load_vm(ctx.tvm, ctx.folder / entry["cuda"]["file"], ctx.tvm.cpu(0))
        row.add("parse CUDA library", "ok", "loaded (this machine has TVM's CUDA runtime)")
    except Exception as e:  # noqa: BLE001
        if "load_from_bytes.cuda" not in str(e):
            row.add("parse CUDA library", "build_failed", _msg(e))
            return
        row.add("parse CUDA library", "ok", "a TVM library whose CUDA module needs TVM's CUDA runtime")
        row.skip("load, run and time the CUDA module", "no-gpu", "ffi.Module.load_from_bytes.cuda is registered "
                 "by libtvm_runtime_cuda.so, which needs libcuda.so.1")


def run_model_twin(ctx, name: str, entry: dict) -> Row:
    row = run_model_tvm(ctx, name, entry, "cpu_twin")
    check_cuda_library(ctx, row, entry)
    return row


# -- per model: library plans --------------------------------------------------------------
def _const(tvm, op, data, prefix, dev):
    """A plan operand stored as a constant, uploaded to ``dev`` (None for a parameter)."""
    if op is None or "const" not in op:
        return None
    return tvm.runtime.tensor(np.asarray(data[f"{prefix}_{op['const']}"], order="C"), device=dev)


def _value(op, const, inputs):
    """An operand's value in a call: its uploaded constant, or the call's input it names."""
    if const is not None or op is None:
        return const
    v = inputs[op["param"]]
    return v if op.get("item") is None else v[op["item"]]


def _ptr(t) -> int:
    return int(t.data_ptr())


def _stream_getter(tvm):
    """A function returning the calling thread's current CUDA stream (as the backends ask TVM)."""
    get = tvm.get_global_func("runtime.get_cuda_stream", allow_missing=True)

    def stream() -> int:
        v = get() if get is not None else 0
        v = getattr(v, "value", v)
        return int(v or 0)

    return stream


def gemm_unit(ctx, plan: dict, data, prefix: str, n_in: int):
    """The cuBLASLt call of a GemmPlan as ``CublasBackend.make_callable`` makes it: ``call(*inputs,
    out)``, constants uploaded once, on TVM's current stream."""
    import pesto_cublaslt as cl

    tvm, dev = ctx.tvm, ctx.dev
    try:
        lt = cl._Lt.get()
    except Exception as e:  # noqa: BLE001 - gpu_probe's message names the wheel
        raise CheckFailure("missing_library", _msg(e)) from e
    handle = lt.handle(0)
    consts = {k: _const(tvm, plan[k], data, prefix, dev) for k in ("a", "b", "bias")}
    dt = cl._CUDA_DTYPE[plan["dtype"]]
    desc = ctypes.c_void_p()
    lt.check(lt.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), cl.COMPUTE_TYPE, 0), "matmul desc")
    for attr, val in ((cl._DESC_TRANSA, cl._OP[plan["transa"]]), (cl._DESC_TRANSB, cl._OP[plan["transb"]]),
                      (cl._DESC_EPILOGUE, cl.EPILOGUES[plan["epilogue"]])):
        v = ctypes.c_int32(val)
        lt.check(lt.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "desc attribute")

    def set_bias(bias):
        p = ctypes.c_void_p(_ptr(bias))
        lt.check(lt.lib.cublasLtMatmulDescSetAttribute(desc, cl._DESC_BIAS_POINTER, ctypes.byref(p), 8), "bias pointer")

    if consts["bias"] is not None:
        set_bias(consts["bias"])
    a_rows, a_cols = (plan["m"], plan["k"]) if plan["transa"] == "N" else (plan["k"], plan["m"])
    la = lt.layout(dt, a_rows, a_cols, plan["lda"], plan["batch"], plan["stride_a"])
    lb = lt.layout(dt, plan["k"], plan["n"], plan["ldb"], plan["batch"], plan["stride_b"])
    lc = lt.layout(dt, plan["m"], plan["n"], plan["ldc"], plan["batch"], plan["stride_c"])
    ws_bytes = cl.WORKSPACE_BYTES
    workspace = tvm.runtime.empty((ws_bytes,), "uint8", dev)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    stream = _stream_getter(tvm)
    keep = (desc, la, lb, lc, workspace, consts)

    def call(*args):
        inputs, out = args[:n_in], args[n_in]
        a, b = _value(plan["a"], consts["a"], inputs), _value(plan["b"], consts["b"], inputs)
        if plan["bias"] is not None and consts["bias"] is None:
            set_bias(_value(plan["bias"], None, inputs))
        lt.check(lt.lib.cublasLtMatmul(handle, desc, ctypes.byref(alpha), _ptr(a), la, _ptr(b), lb, ctypes.byref(beta),
                                       _ptr(out), lc, _ptr(out), lc, None, _ptr(workspace), ws_bytes,
                                       ctypes.c_void_p(stream())), "cublasLtMatmul")
        _ = keep

    return call


def plan_namespace(plan: dict) -> SimpleNamespace:
    """A ConvPlan as the manifest stores it (lists), with the attributes ``build_cudnn_graph`` reads."""
    return SimpleNamespace(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in plan.items()})


def conv_unit(ctx, plan: dict, data, prefix: str, n_in: int):
    """The cuDNN graph of a ConvPlan (built by the backend's ``build_cudnn_graph``), executed
    as ``CudnnBackend.make_callable`` executes it: ``call(*inputs, out)`` with raw device
    pointers, constants uploaded once, on TVM's current stream."""
    tvm, dev = ctx.tvm, ctx.dev
    if ctx.cudnn is None:
        ok, why = ctx.probe.combine(ctx.probe.library("cudnn"), ctx.probe.python_package("cudnn"))
        if not ok:
            raise CheckFailure("missing_library", why)
        try:
            import cudnn
        except Exception as e:  # noqa: BLE001
            raise CheckFailure("missing_library", f"import cudnn (cudnn-frontend) failed: {_msg(e)}") from e
        dev.sync()
        ctx.cudnn, ctx.cudnn_handle = cudnn, cudnn.create_handle()
    from pesto_cudnn_graph import ALLOW_TF32, build_cudnn_graph

    try:
        graph, tensors, ws = build_cudnn_graph(plan_namespace(plan), ctx.cudnn_handle, ALLOW_TF32)
    except Exception as e:  # noqa: BLE001 - cuDNN refused the graph
        raise CheckFailure("build_failed", f"cuDNN graph: {_msg(e)}") from e
    workspace = tvm.runtime.empty((max(1, ws),), "uint8", dev)
    names = (("X", "x"), ("W", "w"), ("B", "bias"))
    consts = {t: _const(tvm, plan[k], data, prefix, dev) for t, k in names}
    fixed = {tensors[t]: _ptr(c) for t, c in consts.items() if c is not None}
    operands = [(tensors[t], plan[k]) for t, k in names if plan[k] is not None and consts[t] is None]
    ws_ptr = _ptr(workspace)
    stream = _stream_getter(tvm)
    cudnn, handle = ctx.cudnn, ctx.cudnn_handle
    keep = (consts, workspace)

    def call(*args):
        inputs, out = args[:n_in], args[n_in]
        pack = dict(fixed)
        pack[tensors["Y"]] = _ptr(out)
        for t, op in operands:
            pack[t] = _ptr(_value(op, None, inputs))
        cudnn.set_stream(handle=handle, stream=stream())
        graph.execute(pack, ws_ptr, handle=handle)
        _ = keep

    return call


def _out_shape(lib: str, plan: dict) -> tuple:
    return tuple(plan["out_shape"] if lib == "cublas" else plan["y_shape"])


def library_call(ctx, lib: str, plan: dict, args, data, prefix):
    """One library unit on fixed ``args``: (run, its output tensor)."""
    call = LIBRARY_UNITS[lib](ctx, plan, data, prefix, len(args))
    out = ctx.tvm.runtime.empty(_out_shape(lib, plan), plan["dtype"], ctx.dev)
    return (lambda: call(*args, out)), out


LIBRARY_UNITS = {"cublas": gemm_unit, "cudnn": conv_unit}


def run_library_gpu(ctx, name: str, lib: str, entry: dict) -> Row:
    row = Row(name, lib)
    info = entry["libraries"].get(lib)
    if info is None:
        row.add("plans", "build_failed", "the manifest has no entry for this library: prepare again")
        return row
    if lib == "tensorrt":
        row.subgraphs = info.get("regions", 0)
        row.skip("engine build and run", "tensorrt-not-in-workplace", f"{row.subgraphs} ONNX regions checked at --prepare")
        return row
    if info.get("skip"):
        row.skip("everything", info["skip"]["reason"], info["skip"]["detail"])
        return row
    if info.get("coverage_error"):
        row.add("coverage", "build_failed", f"at --prepare: {info['coverage_error']}")
    data = np.load(ctx.folder / info["data"]) if info.get("data") else {}
    row.subgraphs = len(info["subgraphs"])
    rng = np.random.default_rng(0)
    for k, sub in enumerate(info["subgraphs"]):
        label = f"{sub['name']} {sub['pattern']}"
        if sub.get("plan") is None:
            row.add(label, sub.get("status", "build_failed"), f"at --prepare: {sub.get('error', '')}")
            continue
        if time.time() > ctx.deadline:
            row.skip(f"{len(info['subgraphs']) - k} subgraphs", "time-budget")
            break
        try:
            args = make_args(ctx.tvm, sub["params"], data, ctx.dev, rng)
            ctx.notes = []
            run, out = library_call(ctx, lib, sub["plan"], args, data, sub["name"])
            for note in ctx.notes:
                row.add(f"{label}: call", "crashed", note)
            run()
            ctx.dev.sync()
        except Exception as e:  # noqa: BLE001
            row.fail_from(label, e)
            if isinstance(e, CheckFailure) and e.status == "missing_library":
                break
            continue
        if compare(row, label, [out.numpy()], [data[f"{sub['name']}_ref0"]], ctx.tol["library"]):
            try:
                row.timings.append(timing_record(sub, lib, time_call(run, ctx.dev, ctx.repeat), ctx, TIMERS["library"]))
            except Exception as e:  # noqa: BLE001
                row.fail_from(f"time {label}", e)
    return row


# -- per model: the mixed module -------------------------------------------------------------
def _np(v):
    return v.numpy() if hasattr(v, "numpy") else tuple(_np(x) for x in v)


def emulated_unit(ctx, lib: str, plan: dict, data, prefix: str, n_in: int):
    """A library unit computed in NumPy by the backends' own emulators (``lib/pesto_emulate.py``),
    which stand in for cuBLASLt and cuDNN in the CPU twin of the mixed module."""
    import pesto_emulate as em

    def operand(op):
        if op is None:
            return None
        if "const" in op:
            return em.Operand(const=np.asarray(data[f"{prefix}_{op['const']}"]))
        return em.Operand(index=op["param"], item=op.get("item"))

    ns = SimpleNamespace(**{k: operand(v) if k in ("a", "b", "bias", "x", "w") else
                            (tuple(v) if isinstance(v, list) else v) for k, v in plan.items()})
    emulate = em.emulate_gemm if lib == "cublas" else em.emulate_conv

    def call(*args):
        args[n_in].copyfrom(np.ascontiguousarray(emulate(ns, [_np(a) for a in args[:n_in]])))

    return call


def register_units(ctx, info: dict, emulated: bool) -> None:
    """Register each extern the mixed module calls under its name: the library call on the GPU,
    the NumPy emulation for the CPU twin."""
    import tvm_ffi

    data = np.load(ctx.folder / info["data"])
    for gname, ext in info["externs"].items():
        args = (ctx, ext["plan"], data, ext["prefix"], ext["n_in"])
        call = emulated_unit(ctx, ext["lib"], *args[1:]) if emulated else LIBRARY_UNITS[ext["lib"]](*args)
        tvm_ffi.register_global_func(gname, call, override=True)


def run_mixed(ctx, name: str, entry: dict, which: str) -> Row:
    """The module whose cuBLAS / cuDNN matches are extern calls (``prepare.prepare_mixed``): its
    units registered, ``main`` against the PyTorch reference (the library tolerance: cuBLASLt's
    GELU is the tanh form) and timed; the CPU twin (row ``mixed-cpu-twin``) calls the NumPy
    emulations instead."""
    info, backend = entry.get("mixed"), "mixed" if which == "cuda" else "mixed-cpu-twin"
    if not info or info.get("skip"):
        row = Row(name, backend)
        row.skip("everything", "no-matches", (info or {}).get("skip", {}).get("detail", "no library match"))
        return row
    if len(info["externs"]) < info["units"]:
        row = Row(name, backend)
        row.add("plan the library units", "build_failed", f"at --prepare: {info['units'] - len(info['externs'])} of "
                f"{info['units']} library units have no plan (the prepare row 'mixed' says why)")
        return row
    try:
        register_units(ctx, info, emulated=which == "cpu_twin")
    except Exception as e:  # noqa: BLE001 - a unit that cannot be made fails the row
        row = Row(name, backend)
        row.fail_from("register the library units", e)
        return row
    model = {**info, "data": entry["data"], "groups": [], "n_inputs": entry["n_inputs"],
             "n_outputs": entry["n_outputs"]}
    row = run_model_tvm(ctx, name, model, which, backend=backend, tol="library")
    row.subgraphs = len(info["externs"])
    if which == "cpu_twin":
        check_cuda_library(ctx, row, info)
    return row


# -- driver ----------------------------------------------------------------------------------
def _environment() -> dict:
    return {"python": platform.python_version(), "machine": platform.machine(), "host": platform.node()}


def setup_runtime(ctx, man: dict, env: dict, cpu_twins: bool) -> Row:
    """Wheels, runtime-only TVM and (GPU mode) the CUDA driver, runtime and device into ``ctx``;
    the ``runtime`` row. Raises :class:`NoGPU` when GPU mode finds no GPU."""
    folder, probe = ctx.folder, ctx.probe
    rt = Row("*", "runtime")
    try:
        add_wheel(folder, man, "typing-extensions", "typing_extensions", env, prefer_installed=True)
        add_wheel(folder, man, "tvm-ffi", "tvm_ffi", env, prefer_installed=False)
        if not cpu_twins:
            drv, why = probe.find_library("cuda")
            if drv is None:
                raise NoGPU(why)
            cudart, why = probe.find_library("cudart")  # loaded globally: libtvm_runtime_cuda.so links it
            if cudart is None:
                raise CheckFailure("missing_library", f"TVM's CUDA runtime links libcudart.so.13: {why}")
            try:
                add_wheel(folder, man, "cudnn-frontend", "cudnn", env, prefer_installed=True)
            except CheckFailure as e:
                env["cudnn-frontend"] = f"missing: {e.detail}"  # the cuDNN rows say missing_library
        ctx.tvm = import_runtime_tvm(folder, env)
        rt.add("runtime-only TVM", "ok", env["tvm_file"])
        if cpu_twins:
            ctx.dev = ctx.tvm.cpu(0)
            import pesto_cublaslt  # noqa: F401 - the GPU run's library-call modules import runtime-only
            import pesto_cudnn_graph  # noqa: F401

            rt.add("library-call modules", "ok", "lib/pesto_cublaslt.py and lib/pesto_cudnn_graph.py import")
            return rt
        ctx.dev = cuda_device(ctx.tvm, folder)
        ctx.device_name = str(ctx.dev.device_name)
        env.update(device=ctx.device_name, compute_version=str(ctx.dev.compute_version),
                   probes={k: list(v) for k, v in probe.report().items()})
        arch = "sm_" + str(ctx.dev.compute_version).replace(".", "")
        if arch != man["arch"]:
            raise CheckFailure("build_failed", f"the folder was built for {man['arch']}, this GPU is {arch}: "
                               f"prepare again with --arch {arch}")
        serve_prebuilt_kernels(folder, man, ctx.served)
        rt.add("CUDA device", "ok", f"{ctx.device_name} (compute {ctx.dev.compute_version})")
    except NoGPU:
        raise
    except Exception as e:  # noqa: BLE001 - reported as the runtime row
        rt.fail_from("runtime", e)
    return rt


class NoGPU(Exception):
    """GPU mode on a machine without a usable GPU (exit status 2: nothing was checked)."""


def cuda_device(tvm, folder: Path):
    """``tvm.cuda(0)``, after making sure TVM's CUDA runtime (libtvm_runtime_cuda.so) is loaded."""
    import tvm_ffi

    if tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is None:
        lib = folder / "runtime" / "tvm" / "lib" / "libtvm_runtime_cuda.so"
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise CheckFailure("missing_library", f"TVM's CUDA runtime {lib.name} did not load: {e}") from e
        if tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is None:
            raise CheckFailure("missing_library", f"{lib.name} loaded but registered no CUDA device API")
    dev = tvm.cuda(0)
    if not dev.exist:
        raise NoGPU("TVM's CUDA runtime is loaded but tvm.cuda(0) does not exist")
    return dev


def model_steps(cpu_twins: bool) -> list:
    """(backend, step(ctx, model name, manifest entry) -> Row) for each row of a model."""
    if cpu_twins:
        return [("cpu-twin", run_model_twin), ("mixed-cpu-twin", lambda c, n, e: run_mixed(c, n, e, "cpu_twin"))]
    steps = [("tvm-cuda", lambda c, n, e: run_model_tvm(c, n, e, "cuda"))]
    steps += [(lib, lambda c, n, e, lib=lib: run_library_gpu(c, n, lib, e)) for lib in ("cublas", "cudnn", "tensorrt")]
    return steps + [("mixed", lambda c, n, e: run_mixed(c, n, e, "cuda"))]


def make_context(folder: Path, man: dict, repeat: int = 5, min_repeat_ms: int = 10, deadline: float = float("inf"),
                 served: list | None = None) -> SimpleNamespace:
    """What the steps share: the folder, its probes (``lib/``), tolerances and timing settings;
    :func:`setup_runtime` adds TVM and the device."""
    sys.path.insert(0, str(folder / "lib"))
    import gpu_probe as probe

    return SimpleNamespace(folder=folder, probe=probe, tol=man["tolerances"], repeat=repeat, min_repeat_ms=min_repeat_ms,
                           deadline=deadline, served=[] if served is None else served, cudnn=None, notes=[],
                           cudnn_handle=None, target=man["target"], cache_version=man["cache_version"],
                           device_name="cpu")


def run(folder: Path, out: Path, cpu_twins: bool, models: list | None, repeat: int, min_repeat_ms: int,
        budget_s: float) -> int:
    """The whole check; the exit status (0 ok, 1 a failing row, 2 cannot start)."""
    env = _environment()
    try:
        man = read_manifest(folder)
    except CheckFailure as e:
        print(f"cannot run: {e.detail}", file=sys.stderr)
        return 2
    log = Log(out, "cpu-twins" if cpu_twins else "gpu", man, env)
    ctx = make_context(folder, man, repeat, min_repeat_ms, time.time() + budget_s, log.data["kernels_served"])
    try:
        rt = setup_runtime(ctx, man, env, cpu_twins)
    except NoGPU as e:
        print(f"no usable GPU here ({e}); run with --cpu-twins, or on the GPU machine", file=sys.stderr)
        return 2
    rows = [log.add(rt)]
    if rt.status not in FAILING:
        for name in [m for m in man["models"] if not models or m in models]:
            print(f"-- {name}", flush=True)
            for backend, step in model_steps(cpu_twins):
                try:
                    row = step(ctx, name, man["models"][name])
                except Exception as e:  # noqa: BLE001 - one crashing step must not stop the others
                    row = Row(name, backend)
                    row.fail_from(backend, e)
                rows.append(log.add(row))
    log.write(final=True)
    print_table(rows)
    print(f"\nlog: {out}")
    return exit_code(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run a prepared tvm-pesto GPU check with TVM's runtime only.")
    ap.add_argument("--folder", default=str(Path(__file__).resolve().parent),
                    help="the prepared folder (default: this script's folder)")
    ap.add_argument("--out", default=None, help="JSON log (default: <folder>/logs/<mode>.json)")
    ap.add_argument("--cpu-twins", action="store_true", help="no GPU: load and run the CPU twins runtime-only")
    ap.add_argument("--models", default="", help="comma-separated subset of the prepared models")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--min-repeat-ms", type=int, default=10, help="TVM time_evaluator: at least this long per repeat")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop timing after this many seconds")
    args = ap.parse_args(argv)
    folder = Path(args.folder).resolve()
    out = Path(args.out) if args.out else folder / "logs" / ("cpu-twins.json" if args.cpu_twins else "gpu-check.json")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    return run(folder, out, args.cpu_twins, models, args.repeat, args.min_repeat_ms, args.budget_s)


if __name__ == "__main__":
    sys.exit(main())
