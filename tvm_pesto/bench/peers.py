"""``tvm-pesto bench peers``: tvm-pesto against what a user of each library runs today.

Per model, in one process, each variant is built once and then timed in blocks:

* ``ort``: ONNX Runtime on the model's own ONNX (:func:`tvm_pesto.zoo.export.to_onnx`),
  sequential, intra-op threads = the machine's cores;
* ``ort-parallel``: ONNX Runtime's parallel mode (inter-op threads = cores, intra-op 1);
* ``ort-1``: ONNX Runtime with one thread;
* ``torch``: PyTorch eager with cores threads;
* ``openvino``: OpenVINO's CPU plugin on the same ONNX file, cores threads, latency hint
  (when ``openvino`` is installed), in its default precision (bfloat16 on a CPU with bf16
  units; the variant's ``precision`` says which);
* ``openvino-f32``: the same with ``INFERENCE_PRECISION_HINT`` float32;
* ``torch-compile``: ``torch.compile`` with Inductor (when a C++ compiler is on the PATH),
  compiled in this process (no compile workers left running beside the timed blocks);
* ``pesto``: ``tvm_pesto.build(mod, "cpu:N")``, the default build, called on numpy arrays;
* ``pesto-1dev``: the same on ``cpu:1`` (one device of all cores);
* ``pesto-bf16``: the default build with the ``openvino-bf16`` backend named too, where this
  CPU has bfloat16 units: OpenVINO's default precision there (the ``openvino`` peer's
  ``precision`` says which it ran), which the default build does not choose for the user.

Every peer gets the machine's cores in the setting its library is usually run with. Each
variant runs in its own block (:func:`tvm_pesto.costs.measure.blocks.time_blocks`: a warm-up, then
calls for a fixed time, the median kept) and the order rotates over :data:`ROUNDS`
rounds; a variant's time is its best block median. A variant whose two best blocks differ by
more than :data:`~tvm_pesto.bench.report.AGREE` asks for another round, and every variant is
timed in it, so that each has had as many chances at a quick spell of the machine. Interleaving
single calls of two libraries would time one library's idle threads inside the other's call.

The ratio of a model is the best peer's seconds over ``pesto``'s (above 1: tvm-pesto is
faster). ``best_peer`` is the fastest peer that computes in float32, as the default build
does (every peer but an ``openvino`` call whose ``precision`` is not ``f32``);
``best_peer_all`` every peer. Outputs are compared with PyTorch eager (with ONNX Runtime's
where a model file has no PyTorch model). ``build_s`` and ``peak_rss_mb`` are the default
build's seconds and the process's largest resident memory while it built (sampled).

Examples
--------
Not run as a doctest: it builds and times every peer, which takes minutes.

>>> from tvm_pesto import zoo                                         # doctest: +SKIP
>>> from tvm_pesto.bench.peers import bench_peers                    # doctest: +SKIP
>>> m = zoo.load("mlp_mixer", "small")                               # doctest: +SKIP
>>> make = lambda: (m.torch_model, m.example_inputs, m.mod)          # doctest: +SKIP
>>> bench_peers([("mlp_mixer", make)])["geomean_vs_best_peer_all"]   # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

import tvm_pesto

from ..backends import backend_status
from ..cluster.device_thread import owns_every_core
from ..cluster.specs import cpu_cluster
from ..choose.options import whole_model_placement
from ..errors import error_line
from ..costs.measure.blocks import time_blocks
from ..costs.store.cache import MeasureCache
from ..run.libraries.loaders import onnx_session
from ..run.thread.executor import max_abs_err
from .peer_settings import ROUNDS, PeerSettings
from .sources import ModelSource, bench_source, run_isolated
from .report import AGREE, geomean, machine_info, noise_line, timing_noise

#: Blocks per variant, the order of the variants rotated between them.
#: Peers that compute in float32 whatever the CPU: ``worst_vs_best_peer`` is over these and
#: the ``openvino`` call where its precision is float32.
FLOAT32_PEERS = ("ort", "ort-parallel", "ort-1", "torch", "torch-compile", "openvino-f32")
#: Seconds between two samples of the build's resident memory.
RSS_SAMPLE_S = 0.05


@dataclass
class Variant:
    """One way to run the model: ``call()`` runs it once on the bound inputs."""

    name: str
    call: Callable | None
    build_s: float
    output: object = None
    error: str | None = None
    info: dict = field(default_factory=dict)


def _first(out) -> np.ndarray:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return np.asarray(out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray) else out)


def _built(name: str, make: Callable) -> Variant:
    """Run ``make() -> (call, info)`` and time it; a failure becomes the variant's error."""
    t = time.perf_counter()
    try:
        call, info = make()
        out = call()
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        return Variant(name, None, time.perf_counter() - t, error=error_line(e))
    return Variant(name, call, time.perf_counter() - t, output=_first(out), info=info)


def _ort(path: str, inputs, cores: int, mode: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if mode == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads, so.intra_op_num_threads = cores, 1
    else:
        so.intra_op_num_threads = 1 if mode == "one" else cores
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    return (lambda: sess.run(None, feed)), {"threads": {"parallel": f"inter {cores} / intra 1", "one": 1}.get(mode, cores),
                                            "precision": "f32"}


def _openvino(path: str, inputs, cores: int, f32: bool = False):
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": cores, "PERFORMANCE_HINT": "LATENCY"}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    cm = ov.Core().compile_model(path, "CPU", config)
    req = cm.create_infer_request()
    feed = dict(enumerate(inputs))
    precision = cm.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    return (lambda: req.infer(feed)[0]), {"version": ov.__version__, "threads": cores, "precision": precision}


def _torch_eager(model, inputs, cores: int, compiled: bool = False):
    import torch

    args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs)
    if compiled:
        import torch._inductor.config as inductor_config

        # compile in this process: a pool of compile workers would still run beside the next
        # variants' timed blocks
        inductor_config.compile_threads = 1
    fn = torch.compile(model, backend="inductor") if compiled else model

    def call():
        torch.set_num_threads(cores)  # process-wide: other variants may have changed it
        with torch.no_grad():
            return fn(*args)

    return call, {"threads": cores, "precision": "f32"}


@contextlib.contextmanager
def peak_rss(box: dict):
    """Sample this process's resident memory until the block ends; ``box["peak_rss_mb"]``
    is the largest sample (and the first, taken on entry)."""
    # lazy: psutil is only needed while a build is watched
    import psutil

    proc, done = psutil.Process(), threading.Event()
    peak = [proc.memory_info().rss]

    def watch():
        while not done.wait(RSS_SAMPLE_S):
            peak[0] = max(peak[0], proc.memory_info().rss)

    th = threading.Thread(target=watch, name="peak-rss", daemon=True)
    th.start()
    try:
        yield box
    finally:
        done.set()
        th.join()
        box["peak_rss_mb"] = round(max(peak[0], proc.memory_info().rss) / 2**20, 1)


def _pesto(mod, inputs, cluster: str, build_options: dict):
    watched: dict = {}
    with peak_rss(watched):
        placed = tvm_pesto.build(mod, cluster, **build_options)
    summary = placed.placement.summary() if placed.placement is not None else {}
    # what the final choice measured of each option at build time, against the blocks later
    # (issue 53, item 5: the kept option's blocks within 3 % of its build-time measurement)
    measured = {o.name: o.measured_s for o in placed.decision.options} if placed.decision else {}
    info = {"cluster": cluster, "backend_mix": summary.get("backend_mix"),
            "chosen": placed.decision.chosen if placed.decision else None,
            "options_measured_s": measured,
            "devices_used": len(placed.devices_used), "decided_by": summary.get("decided_by"),
            "precision": "bf16" if "openvino-bf16" in str(build_options.get("backends", "")) else "f32", **watched}
    return (lambda: placed(*inputs)), info


def peer_variants(model, inputs, mod, cores: int, workdir: str, torch_compile: bool = True,
                  build_options: dict | None = None, onnx_path: str | None = None,
                  extra_builds: bool = True) -> list[Variant]:
    """Build every variant of one model (see the module docstring); failures are recorded.

    ``model`` is the PyTorch model (None for a model file without one: its PyTorch peers
    say so); ``onnx_path`` the model's own ONNX file (default: ``model`` exported to one);
    ``extra_builds``: ``pesto-1dev`` and ``pesto-bf16`` beside the default build.
    """
    # tvm-pesto first: its build times its options (the final choice), which the threads and
    # compile workers a PyTorch or torch.compile peer leaves behind would disturb
    opts = dict(build_options or {})
    out: list[Variant] = [_built("pesto", lambda: _pesto(mod, inputs, f"cpu:{cores}", opts))]
    if cores > 1 and extra_builds:
        out.append(_built("pesto-1dev", lambda: _pesto(mod, inputs, "cpu:1", opts)))
    bf16 = _with_bf16(opts) if extra_builds else None
    if bf16 is not None:
        out.append(_built("pesto-bf16", lambda: _pesto(mod, inputs, f"cpu:{cores}", bf16)))
    path, export_s, why = _own_onnx(model, inputs, workdir, onnx_path)
    for name, mode in (("ort", "seq"), ("ort-parallel", "parallel"), ("ort-1", "one")):
        v = _built(name, lambda m=mode: _ort(path, inputs, cores, m)) if path else Variant(name, None, 0.0, error=why)
        v.build_s += export_s
        out.append(v)
    no_torch = "no PyTorch model (the model is an ONNX file)" if model is None else None
    out.append(_built("torch", lambda: _torch_eager(model, inputs, cores)) if model is not None
               else Variant("torch", None, 0.0, error=no_torch))
    for name, f32 in (("openvino", False), ("openvino-f32", True)):
        if not path:
            out.append(Variant(name, None, 0.0, error=why))
        elif _importable("openvino"):
            out.append(_built(name, lambda f=f32: _openvino(path, inputs, cores, f)))
        else:
            out.append(Variant(name, None, 0.0, error="not installed (pip install openvino)"))
    if not torch_compile or model is None:
        out.append(Variant("torch-compile", None, 0.0, error=no_torch or "not asked for (--no-torch-compile)"))
    elif shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++"):
        out.append(_built("torch-compile", lambda: _torch_eager(model, inputs, cores, compiled=True)))
    else:
        out.append(Variant("torch-compile", None, 0.0, error="no C++ compiler on the PATH (Inductor needs one)"))
    return out


def _own_onnx(model, inputs, workdir: str, onnx_path: str | None) -> tuple[str | None, float, str | None]:
    """``(path, seconds, why not)``: the model's own ONNX file, exported from ``model`` when
    none is given; no path and the reason when it cannot be made."""
    if onnx_path is not None:
        return onnx_path, 0.0, None
    if model is None:
        return None, 0.0, "no ONNX file and no PyTorch model to export one from"
    # lazy: loads PyTorch, which importing this module does not
    from ..zoo.export import to_onnx

    t = time.perf_counter()
    try:
        return to_onnx(model, inputs, os.path.join(workdir, "model.onnx")), time.perf_counter() - t, None
    except Exception as e:  # noqa: BLE001 - no ONNX file: the ONNX peers say why
        return None, 0.0, error_line(e)


def _with_bf16(build_options: dict) -> dict | None:
    """The build options with ``openvino-bf16`` named beside their backends (``all`` stands for
    every backend but the named-only ones, :func:`~tvm_pesto.candidates.flow.backend_names`),
    or None where that backend is not available (a CPU without bfloat16 units)."""
    if not backend_status(["openvino-bf16"])["openvino-bf16"][0]:
        return None
    backends = build_options.get("backends", "all")
    named = backends.split(",") if isinstance(backends, str) else list(backends)
    return {**build_options, "backends": [n.strip() for n in named if n.strip() != "openvino-bf16"] + ["openvino-bf16"]}


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def bench_model(name: str, model, inputs, mod, settings: PeerSettings, onnx_path: str | None = None) -> dict:
    """Every variant of one model, built and timed as ``settings`` say (its ``cores`` given);
    the ratios to the best peers.

    Returns
    -------
    dict
        ``variants.<name>``; ``best_peer`` and ``ratio_vs_best_peer`` (float32 peers),
        ``best_peer_all`` and ``ratio_vs_best_peer_all``; ``best_peer_bf16`` and
        ``ratio_vs_best_peer_bf16`` (``pesto-bf16`` against a peer that ran bfloat16);
        ``held``: the default build's time in the blocks over what its final choice measured
        of the kept option at build time; ``build_s``, ``peak_rss_mb`` and
        ``max_abs_err`` of the default build (``output_scale``: the reference's largest
        magnitude); ``error``: None, or why the default build
        has no time; ``noise``.
    """
    with tempfile.TemporaryDirectory(prefix="pesto-peers-") as tmp:
        options = dict(settings.build_options or {})
        if settings.cold_cache and "cache" not in options:  # a user's first build of this model
            options["cache"] = MeasureCache(os.path.join(tmp, "measurements.jsonl"))
        variants = peer_variants(model, inputs, mod, settings.cores, tmp, settings.torch_compile,
                                 options, onnx_path, settings.extra_builds)
        ok = {v.name: v.call for v in variants if v.call is not None}
        timed = time_blocks(ok, rounds=settings.rounds, agree=AGREE)
    by_name = {v.name: v for v in variants}
    refs = [n for n in ("torch", "ort") if by_name[n].error is None]
    ref = by_name[refs[0]].output if refs else None
    res: dict = {"variants": {}, "reference": refs[0] if refs else None,
                 # errors read against it: a random-weight network's outputs can reach 1e7
                 "output_scale": float(np.max(np.abs(ref.astype(np.float64)))) if ref is not None and ref.size else None}
    for v in variants:
        rec = {"build_s": round(v.build_s, 3), **v.info}
        if v.error:
            rec["error"] = v.error
        else:
            rec.update(seconds=timed[v.name]["s"], blocks_s=timed[v.name]["blocks_s"],
                       max_abs_err=max_abs_err(v.output.astype(np.float64), ref) if ref is not None else None)
        res["variants"][v.name] = rec
    secs = {n: r["seconds"] for n, r in res["variants"].items() if "seconds" in r}
    pesto = secs.get("pesto")
    f32 = [n for n in secs if n in FLOAT32_PEERS or (n == "openvino" and res["variants"][n].get("precision") == "f32")]
    bf16 = [n for n in secs if n == "openvino" and res["variants"][n].get("precision") == "bf16"]
    for key, pool, ours in (("best_peer", f32, pesto), ("best_peer_all", [n for n in secs if not n.startswith("pesto")],
                                                        pesto), ("best_peer_bf16", bf16, secs.get("pesto-bf16"))):
        have = {n: secs[n] for n in pool if n in secs}
        best = min(have, key=have.get) if have else None
        res[key] = best
        res[f"ratio_vs_{key}"] = (have[best] / ours) if best and ours else None
    res["noise"] = timing_noise({n: t["blocks_s"] for n, t in timed.items()})
    built = res["variants"].get("pesto", {})
    at_build = (built.get("options_measured_s") or {}).get(built.get("chosen"))
    res.update(max_abs_err=built.get("max_abs_err"), build_s=built.get("build_s"), peak_rss_mb=built.get("peak_rss_mb"),
               error=built.get("error"), held=built["seconds"] / at_build if at_build and "seconds" in built else None)
    return res


def one_unit_overhead(mod, inputs, cores: int, rounds: int = ROUNDS) -> dict:
    """What tvm-pesto's call adds to the library's: the whole model as one ONNX Runtime unit
    on one device of ``cores`` cores, called on numpy arrays, against that unit's own
    session (the same ONNX and options) called with ``session.run``.

    Returns
    -------
    dict
        ``library_s``, ``pesto_s``, ``overhead_s`` (their difference); ``error`` instead when
        ONNX Runtime cannot run every op of the model.
    """
    # lazy: loads TVM's compiler, which importing this module does not
    from ..api import build_placement, place
    from ..backends.onnx_export.export import relax_to_onnx

    wide = cpu_cluster(1)
    lp = whole_model_placement(place(mod, wide, costs="roofline"), "onnxruntime", wide)
    if lp is None:
        return {"error": "ONNX Runtime cannot run every op of the model"}
    placed = build_placement(lp, wide)
    cores = wide.devices[0].cores
    sess = onnx_session(relax_to_onnx(mod["main"]).SerializeToString(), cores, spin=owns_every_core(cores) and cores > 1)
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    timed = time_blocks({"library": lambda: sess.run(None, feed), "pesto": lambda: placed(*inputs)}, rounds=rounds)
    placed.close()
    lib, ours = timed["library"]["s"], timed["pesto"]["s"]
    return {"library_s": lib, "pesto_s": ours, "overhead_s": ours - lib}


def _bench_one(model, inputs, mod, onnx_path, *, settings: PeerSettings) -> dict:
    """:func:`bench_model` of one loaded model, and its :func:`one_unit_overhead`."""
    row = bench_model("", model, inputs, mod, settings, onnx_path)
    if settings.overhead and mod is not None:
        try:
            row["overhead"] = one_unit_overhead(mod, inputs, settings.cores, settings.rounds)
        except Exception as e:  # noqa: BLE001 - reported beside the model, the benchmark goes on
            row["overhead"] = {"error": error_line(e)}
    return row


def bench_peers(models, settings: PeerSettings = PeerSettings(), progress=None, model_timeout_s: float | None = None,
                checkpoint=None, earlier: dict | None = None) -> dict:
    """Run :func:`bench_model` for ``models``; add the geomeans and the worst ratio.

    ``models`` holds :class:`~tvm_pesto.bench.sources.ModelSource` records, or ``(name,
    make)`` pairs with ``make() -> (torch_model, inputs, mod)``. With ``model_timeout_s``,
    each source is benched in a process of its own (:func:`~tvm_pesto.bench.sources.run_isolated`)
    that may run that long. A model that fails to load or build is a row with its ``error``.
    ``checkpoint(result)`` is called after each model with the result so far (a long run
    that is stopped keeps what it measured; ``earlier``, the ``models`` of such a run, are kept
    as they are and count in the figures). ``settings``: how each model is built and timed.

    Returns
    -------
    dict
        ``models.<name>`` (:func:`bench_model`), ``geomean_vs_best_peer``,
        ``worst_vs_best_peer``, ``geomean_vs_best_peer_all``, ``worst_vs_best_peer_all``,
        ``max_abs_err``, ``max_rel_err`` (each model's ``max_abs_err`` over its
        ``output_scale``, at least 1: float32 rounding grows with the outputs, and a random
        network's reach 40 or more), ``build_s_median``, ``build_s_max``, ``peak_rss_mb_max``,
        ``held_median`` and ``held_worst`` (the rows' ``held``, the farthest from 1),
        ``failed`` (names of the models without a time), ``overhead_median_s``
        (:func:`one_unit_overhead`, median over the models; with ``overhead``), ``noise``
        (:func:`~tvm_pesto.bench.report.timing_noise` over every model's variants),
        ``cores``, ``machine`` and ``load_average`` before and after.
    """
    machine = machine_info()
    cores = int(settings.cores or machine["nproc"])
    res: dict = {"cores": cores, "machine": machine, "models": dict(earlier or {})}
    bench = functools.partial(_bench_one, settings=replace(settings, cores=cores))
    for item in models:
        source = item if isinstance(item, ModelSource) else None
        name = source.label if source else item[0]
        if progress:
            progress(name)
        if source is not None and model_timeout_s:
            row = run_isolated(source, bench, model_timeout_s)
        else:
            row = bench_source(source.load if source else _made(item[1]), bench)
        res["models"][name] = row
        if checkpoint:
            checkpoint({**res, **summarize(res["models"])})
    res.update(summarize(res["models"]))
    res["load_average_after"] = machine_info()["load_average"]
    return res


def _made(make):
    """``make() -> (model, inputs, mod)`` as a source's loader (no ONNX file of its own)."""
    return lambda: (*make(), None)


def summarize(rows: dict) -> dict:
    """The run's figures from its rows (``models``): see :func:`bench_peers`."""
    out: dict = {}
    ms = rows.values()
    for key in ("best_peer", "best_peer_all"):
        rs = [m[f"ratio_vs_{key}"] for m in ms if m.get(f"ratio_vs_{key}")]
        out[f"geomean_vs_{key}"] = geomean(rs)
        out[f"worst_vs_{key}"] = min(rs) if rs else None
    over = [m["overhead"]["overhead_s"] for m in ms if "overhead_s" in m.get("overhead", {})]
    out["overhead_median_s"] = float(np.median(over)) if over else None
    errs = [m["max_abs_err"] for m in ms if m.get("max_abs_err") is not None]
    out["max_abs_err"] = max(errs) if errs else None
    rel = [m["max_abs_err"] / max(1.0, m.get("output_scale") or 0.0) for m in ms if m.get("max_abs_err") is not None]
    out["max_rel_err"] = max(rel) if rel else None
    builds = [m["build_s"] for m in ms if m.get("build_s") is not None and not m.get("error")]
    out["build_s_median"] = float(np.median(builds)) if builds else None
    out["build_s_max"] = max(builds) if builds else None
    rss = [m["peak_rss_mb"] for m in ms if m.get("peak_rss_mb") is not None]
    out["peak_rss_mb_max"] = max(rss) if rss else None
    held = [m["held"] for m in ms if m.get("held")]
    out["held_median"] = float(np.median(held)) if held else None
    out["held_worst"] = max(held, key=lambda h: abs(np.log(h))) if held else None
    out["failed"] = sorted(n for n, m in rows.items() if m.get("error"))
    out["noise"] = timing_noise({f"{n}/{k}": v["blocks_s"] for n, m in rows.items()
                                 for k, v in m["variants"].items() if "blocks_s" in v})
    return out


def markdown(res: dict) -> str:
    """The result as a markdown table: ms per call of each variant, the best peers, the ratio."""
    names = ["ort", "ort-parallel", "ort-1", "torch", "openvino", "torch-compile", "pesto", "pesto-1dev"]
    if any("pesto-bf16" in r["variants"] for r in res["models"].values()):
        names.append("pesto-bf16")
    names.insert(names.index("openvino") + 1, "openvino-f32")
    head = ("| model | " + " | ".join(names) + " | best float32 peer | ratio | best peer (all) | ratio | max err "
            "| build s | build MB |")
    lines = [head, "|" + "---|" * (len(names) + 8)]
    for m, r in res["models"].items():
        cells = [f"{r['variants'][n]['seconds'] * 1e3:.3f}" if "seconds" in r["variants"].get(n, {}) else "—"
                 for n in names]
        for key in ("best_peer", "best_peer_all"):
            ratio = r.get(f"ratio_vs_{key}")
            cells += [str(r.get(key) or "—"), f"{ratio:.2f}" if ratio else "—"]
        err = r.get("max_abs_err")
        cells.append(f"{err:.1e}" if err is not None else "—")
        cells += [f"{r['build_s']:.0f}" if r.get("build_s") is not None else "—",
                  f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") is not None else "—"]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    g, w = res.get("geomean_vs_best_peer"), res.get("worst_vs_best_peer")
    ga = res.get("geomean_vs_best_peer_all")
    lines.append("")
    if res.get("overhead_median_s") is not None:
        lines.append(f"per-call overhead of a one-unit plan over ONNX Runtime alone: "
                     f"{res['overhead_median_s'] * 1e6:.1f} us (median over the models)")
    lines.append(f"geomean vs best float32 peer: {g:.3f}, worst {w:.3f}; geomean vs best peer (all): {ga:.3f}"
                 if g and w and ga else "no ratio")
    if res.get("build_s_median") is not None:
        lines.append(f"build: median {res['build_s_median']:.1f} s, max {res['build_s_max']:.1f} s; "
                     f"peak resident memory of a build: {res['peak_rss_mb_max']:.0f} MB")
    if res.get("max_rel_err") is not None:
        lines.append(f"largest error against the reference: {res['max_abs_err']:.1e}; over the output's largest "
                     f"magnitude (at least 1): {res['max_rel_err']:.1e}")
    if res.get("held_median") is not None:
        lines.append(f"the kept option in the blocks over its build-time measurement: median {res['held_median']:.3f}, "
                     f"farthest {res['held_worst']:.3f}")
    for m in res.get("failed", []):
        lines.append(f"{m}: {res['models'][m]['error']}")
    if res.get("noise"):
        lines.append(noise_line(res["noise"]))
    return "\n".join(lines) + "\n"


__all__ = ["FLOAT32_PEERS", "Variant", "bench_model", "bench_peers", "markdown", "one_unit_overhead",
           "peer_variants"]
