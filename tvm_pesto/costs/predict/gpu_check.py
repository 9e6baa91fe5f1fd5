"""GPU timings from the device check, as the costs of the GPU they were taken on.

The device check (``tests/gpu/device_check.py``) times, on a lent GPU, every TVM-CUDA fusion
group and every cuBLASLt and cuDNN call of the zoo models it was prepared with, and logs them
as MeasureCache records (structural key of the weight-lifted subgraph, backend, CUDA target,
median seconds). The logs ship in ``cost_models/gpu-check-*.json``. For a GPU device of the
model a log was taken on (``Device.model`` in the log's GPU name, the same CUDA target), and
whose column is a roofline estimate, :func:`apply_check_logs` replaces the estimate of every
candidate the check timed by its measured time, gives a TVM candidate it did not time the
shares of its ops in timed groups, and scales the rest by the median measured / roofline ratio
of their backend's timings in the logs. A TVM-CUDA group's time loses
the launch it carries when timed alone (:attr:`CheckTimes.launch_s`), as TVM groups measured on
a CPU lose the VM's call overhead, so that a model's groups add up to its ``main``.

The check times a cuBLASLt or cuDNN call in a Python loop, which a module built with CUDA graphs
(``tvm_cuda.compile_cuda``'s default) does not pay: there the call is captured with the kernels
around it. ``cost_models/gpu-graphs-*.json`` (``tests/gpu/gpu_peers.py --parts graphs``) hold
the same units timed inside a captured CUDA graph; where a unit has one, it replaces the loop
timing, in the unit's cost and in its backend's ratio (on an H200, 2.9-29x less for cuDNN,
3.2-9.2x for cuBLASLt: ``docs/gpu.md``). TVM's ``RewriteCUDAGraph`` captures work on static
storage only: a library unit that reads an input of ``main`` or writes its result runs outside
the graph, a Python call each time, and keeps its loop timing (:func:`boundary_ops`).

Examples
--------
>>> from tvm_pesto.costs.predict.gpu_check import load_check_logs
>>> [log.gpu for log in load_check_logs()]
['NVIDIA H200']
"""
from __future__ import annotations

import functools
import json
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ...errors import CostError
from ...package_data import data_dirs
from ..store.cache import measure_target
from ..table import MIN_COST_S
from .roofline import LAUNCH_S, node_seconds

#: The shipped logs, in ``cost_models/``: the device check's, and the library units timed in
#: CUDA graphs.
LOG_GLOB = "gpu-check-*.json"
GRAPH_GLOB = "gpu-graphs-*.json"
#: The check's backend name -> the candidates' backends its timings stand for (a ``tvm``
#: candidate on a GPU compiles as the ``tvm-cuda`` group the check timed).
SERVES = {"tvm-cuda": ("tvm-cuda", "tvm"), "cublas": ("cublas",), "cudnn": ("cudnn",)}
#: Timed candidates of a backend needed before its ratio scales the others.
MIN_FOR_RATIO = 3


@dataclass
class CheckTimes:
    """The timings of one GPU model and CUDA target, from one or more check logs."""

    gpu: str
    target: str
    seconds: dict = field(default_factory=dict)  # (key, candidate backend) -> (check backend, median seconds)
    files: list = field(default_factory=list)
    records: list = field(default_factory=list)  # (check backend, seconds, op, FLOPs, bytes, key)
    gaps: list = field(default_factory=list)  # per model: (sum of its groups' times - main's) / kernels
    mains: dict = field(default_factory=dict)  # model -> its TVM-CUDA ``main``'s median seconds
    graph_timed: int = 0  # library timings replaced by their CUDA-graph timing
    loop: dict = field(default_factory=dict)  # (key, candidate backend) -> the loop timing a graph one replaced

    @property
    def launch_s(self) -> float:
        """What a TVM-CUDA group timed alone carries over its share of a whole model's ``main``
        (launch and synchronisation; inside ``main`` the kernels replay from a CUDA graph): the
        median over the logged models, 2.8-4.6 us on an H200."""
        return max(0.0, float(np.median(self.gaps))) if self.gaps else 0.0

    def seconds_of(self, backend: str, t: float) -> float:
        """A timing of the check's ``backend`` as the cost of one unit of a placed module."""
        return max(t - self.launch_s, MIN_COST_S) if backend == "tvm-cuda" else t

    def ratios(self, device) -> dict:
        """Candidate backend -> the median of measured / roofline over the timed subgraphs of
        the check backend that stands for it (at least :data:`MIN_FOR_RATIO` of them)."""
        by = defaultdict(list)
        for backend, t, op, flops, nbytes, _ in self.records:
            node = SimpleNamespace(op=op, flops=flops, bytes_read=nbytes, bytes_written=0)
            by[backend].append(self.seconds_of(backend, t) / node_seconds(node, device))
        return {cand: float(np.median(r)) for backend, r in by.items() if len(r) >= MIN_FOR_RATIO
                for cand in SERVES.get(backend, ())}

    def loop_factors(self) -> dict:
        """Candidate backend -> the median of loop / CUDA-graph timing of its units."""
        by = defaultdict(list)
        for (key, cand), t in self.loop.items():
            by[cand].append(t / self.seconds[(key, cand)][1])
        return {cand: float(np.median(r)) for cand, r in by.items()}

    def serves(self, device) -> bool:
        """Whether these timings are of ``device``'s GPU model and target."""
        model = str(getattr(device, "model", "") or "").lower()
        return (device.kind == "gpu" and bool(model) and model in self.gpu.lower().split()
                and measure_target(device) == self.target)


def load_check_logs(paths=None, skip_models=(), graph_paths=None) -> list[CheckTimes]:
    """The check logs (default: the shipped ones, :func:`shipped_check_logs`), grouped by GPU
    and target, without the rows of ``skip_models`` (to score a model the logs never saw); each
    library timing replaced by the same unit's CUDA-graph timing in ``graph_paths`` where there
    is one (default: the shipped ``gpu-graphs-*.json`` with the shipped check logs, none with
    ``paths``).

    Raises
    ------
    CostError
        For a file that is not a device-check log.
    """
    if paths is None and not skip_models and graph_paths is None:
        return shipped_check_logs()
    groups: dict = {}
    for path in map(Path, shipped_log_paths() if paths is None else paths):
        try:
            log = json.loads(path.read_text())
            rows = log["rows"]
            gpu = log["environment"]["device"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CostError(f"{path} is not a device-check log (python tests/gpu/device_check.py --run DIR "
                            f"writes them): {e}") from e
        for row in (r for r in rows if r.get("model") not in skip_models):
            _add_gap(groups, gpu, row)
            for rec in row.get("timings", []):
                ct = groups.setdefault((gpu, rec["target"]), CheckTimes(gpu, rec["target"]))
                if path.name not in ct.files:
                    ct.files.append(path.name)
                ct.records.append((rec["backend"], float(rec["median_s"]), rec["op"], float(rec["flops"]),
                                   float(rec["bytes"]), rec["key"]))
                for backend in SERVES.get(rec["backend"], ()):
                    ct.seconds[(rec["key"], backend)] = (rec["backend"], float(rec["median_s"]))
    if graph_paths is None:
        graph_paths = shipped_graph_paths() if paths is None else []
    graphs = _graph_seconds(graph_paths, skip_models)
    for ct in groups.values():
        _use_graph_times(ct, graphs)
    return list(groups.values())


def _graph_seconds(paths, skip_models=()) -> dict:
    """(GPU, target, key, library) -> seconds per call in a captured CUDA graph, from
    ``gpu_peers.py --parts graphs`` logs.

    Raises
    ------
    CostError
        For a file that is not such a log.
    """
    out = {}
    for path in map(Path, paths):
        try:
            log = json.loads(path.read_text())
            gpu, target = log["device"], log["target"]
            units = [(g["model"], g["key"], g["lib"], float(g["graph_us"]) * 1e-6) for g in log["graphs"]
                     if "graph_us" in g]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CostError(f"{path} is not a log of library units timed in CUDA graphs (python3 "
                            f"tests/gpu/gpu_peers.py --parts graphs writes them): {e}") from e
        for model, key, lib, t in units:
            if model not in skip_models:
                out[(gpu, target, key, lib)] = t
    return out


def _use_graph_times(ct: CheckTimes, graphs: dict) -> None:
    """Library timings of ``ct`` replaced by their CUDA-graph timings where ``graphs`` has one."""
    for i, (backend, t, op, flops, nbytes, key) in enumerate(ct.records):
        g = graphs.get((ct.gpu, ct.target, key, backend))
        if g is not None:
            ct.records[i] = (backend, g, op, flops, nbytes, key)
            ct.graph_timed += 1
            for cand in SERVES.get(backend, ()):
                ct.seconds[(key, cand)] = (backend, g)
                ct.loop[(key, cand)] = t


def shipped_log_paths(glob: str = LOG_GLOB) -> list[Path]:
    """The shipped check logs (``cost_models/gpu-check-*.json``; ``glob``: other shipped logs),
    each name once."""
    paths, seen = [], set()
    for d in data_dirs("cost_models"):
        for p in sorted(d.glob(glob)) if d.is_dir() else []:
            if p.name not in seen:
                seen.add(p.name)
                paths.append(p)
    return paths


def shipped_graph_paths() -> list[Path]:
    """The shipped logs of library units timed in CUDA graphs (``cost_models/gpu-graphs-*.json``)."""
    return shipped_log_paths(GRAPH_GLOB)


def shipped_check_logs() -> list[CheckTimes]:
    """:func:`load_check_logs` of the shipped logs, read once per process (again when a file
    changes)."""
    stamp = tuple((str(p), p.stat().st_mtime) for p in shipped_log_paths())
    return _load_cached(stamp, tuple((str(p), p.stat().st_mtime) for p in shipped_graph_paths()))


@functools.lru_cache(maxsize=4)
def _load_cached(stamped: tuple, graphs: tuple) -> list[CheckTimes]:
    return load_check_logs([p for p, _ in stamped], graph_paths=[p for p, _ in graphs])


def _add_gap(groups: dict, gpu: str, row: dict) -> None:
    """The per-group gap of one model's TVM-CUDA row: its groups' times (each as often as it
    occurs) against its ``main``'s."""
    main = [it.get("median_s") for it in row.get("items", []) if it.get("name") == "time main"]
    timings = row.get("timings", [])
    if row.get("backend") != "tvm-cuda" or not main or main[0] is None or not timings:
        return
    kernels = sum(int(t.get("count", 1)) for t in timings)
    total = sum(float(t["median_s"]) * int(t.get("count", 1)) for t in timings)
    ct = groups.setdefault((gpu, timings[0]["target"]), CheckTimes(gpu, timings[0]["target"]))
    ct.gaps.append((total - float(main[0])) / kernels)
    ct.mains[row.get("model", "")] = float(main[0])


def apply_check_logs(cs, cluster, table: np.ndarray, columns: list[str], logs=None):
    """Measured GPU times into the roofline columns of ``table`` (a copy).

    Returns
    -------
    (table, columns, applied)
        ``applied``: device index -> ``{"timed": candidates given their measured time,
        "ratio": {backend: factor the others were scaled by}, "files": the logs}``, and
        ``"unpriced"``: backend -> candidates made infeasible (:func:`_unpriced`).
    """
    logs = shipped_check_logs() if logs is None else logs
    out, cols, applied = table.copy(), list(columns), {}
    keys = edge = None
    for j, dev in enumerate(cluster.devices):
        ct = next((c for c in logs if c.serves(dev)), None)
        if ct is not None and cols[j].startswith("roofline"):
            keys = keys if keys is not None else _keys(cs)
            edge = edge if edge is not None else boundary_ops(cs.rg)
            out[:, j], applied[j] = _column(cs, dev, out[:, j], ct, keys, edge)
            cols[j] = "gpu-check+" + cols[j]
        unpriced = _unpriced(cs, dev, ct, out[:, j])
        if unpriced:
            applied.setdefault(j, {})["unpriced"] = unpriced
    return out, cols, applied


def _unpriced(cs, dev, ct, col: np.ndarray) -> dict:
    """On a GPU that is not on this machine, the candidates of a backend that cannot load here
    and that ``ct`` (that GPU's logs, or None) never timed become infeasible in ``col`` (in
    place): its column would be a bare roofline guess with no per-call cost (TensorRT's
    whole-model region of vgg11 at 0.006 ms against TVM's measured 0.22 ms) and would decide the
    plan. Returns backend -> candidates left out; warns once per backend and GPU."""
    if dev.kind != "gpu" or dev.present:
        return {}
    timed = {cand for (_, cand) in ct.seconds} if ct is not None else set()
    out: dict = {}
    for name in sorted({c.backend for c in cs} - timed):
        if _loads_here(name, dev.kind):
            continue
        idx = [i for i, c in enumerate(cs) if c.backend == name]
        col[idx] = np.inf
        out[name] = len(idx)
        if (name, dev.model) not in _WARNED:
            _WARNED.add((name, dev.model))
            warnings.warn(f"backend {name!r} has no timings on {dev.model or dev.name} (the device check never ran it "
                          f"there), so its {len(idx)} candidates are left out of the plan for {dev.name}; run the device "
                          "check with it on that GPU (docs/gpu.md)", RuntimeWarning, stacklevel=4)
    return out


#: (backend, GPU model) pairs already warned about.
_WARNED: set = set()


def _loads_here(name: str, kind: str) -> bool:
    """Whether backend ``name`` loads on this machine; True for one that does not run on ``kind``
    devices at all (its column is infinite already, and nothing is to be said)."""
    # lazy: the backends registry imports the backends' modules; the costs package is imported
    # by the runtime side without them
    from ...backends import get_backend

    bk = get_backend(name)
    return kind not in bk.device_kinds or bool(bk.available()[0])


def _column(cs, dev, col: np.ndarray, ct: CheckTimes, keys: list[str], edge: set):
    """One device's column: timed candidates get their time; TVM candidates the check did not
    time get the shares of their ops in timed groups (a group's time split over its ops by
    their roofline estimates), roofline times their backend's ratio for ops in none; library
    candidates roofline times their backend's ratio. A library candidate holding an op of
    ``edge`` (:func:`boundary_ops`) costs its loop timing, or its ratio times the backend's loop
    / graph factor."""
    col = col.copy()
    base = col.copy()
    timed, op_s = [], {}
    loop_factor = ct.loop_factors()
    for i, c in enumerate(cs):
        hit = ct.seconds.get((keys[i], c.backend))
        if hit is None or not np.isfinite(col[i]):
            continue
        t = ct.seconds_of(*hit)
        if edge.intersection(c.nodes) and (keys[i], c.backend) in ct.loop:
            t = ct.loop[(keys[i], c.backend)]  # outside the captured graph: a Python call each time
        if c.backend in SERVES["tvm-cuda"]:
            op_s.update(_op_shares(cs.rg.graph, c.nodes, t, dev))
        col[i] = t
        timed.append(i)
    factor = ct.ratios(dev)
    done = set(timed)
    for i, c in enumerate(cs):
        if i in done or not np.isfinite(col[i]):
            continue
        scale = factor.get(c.backend, 1.0)
        if c.backend in SERVES["tvm-cuda"] and any(n in op_s for n in c.nodes):
            rest = [n for n in c.nodes if n not in op_s]
            col[i] = sum(op_s[n] for n in c.nodes if n in op_s) + (
                _op_seconds(cs.rg.graph, rest, dev).sum() * scale if rest else 0.0)
        else:
            col[i] = base[i] * scale
            if edge.intersection(c.nodes):
                col[i] *= loop_factor.get(c.backend, 1.0)
    return col, {"timed": len(timed), "ratio": factor, "ops_from_groups": len(op_s), "files": list(ct.files)}


def boundary_ops(rg) -> set:
    """The ops of ``rg`` that read an input of ``main`` or produce its result: in a module built
    with CUDA graphs they run outside the captured graph (``RewriteCUDAGraph`` captures work
    on static storage; inputs and the result are not)."""
    # lazy: Relax's analysis loads TVM's compiler; this module is imported with the costs
    # package, which the runtime side imports without it
    from tvm import relax

    ins = set(rg.inputs)
    outs = set(relax.analysis.free_vars(rg.output)) if rg.output is not None else set()
    for b in rg.bindings:  # a result read through an alias (a tuple item) is its producer's
        if b.var in outs and not isinstance(b.value, relax.Call):
            outs |= set(relax.analysis.free_vars(b.value))
    return {v for v, k in enumerate(rg.node_binding)
            if rg.bindings[k].var in outs or ins.intersection(relax.analysis.free_vars(rg.bindings[k].value))}


def _op_seconds(graph, nodes, dev) -> np.ndarray:
    """Each op's roofline estimate on ``dev``, without the launch."""
    return np.array([node_seconds(graph.nodes[n], dev) - LAUNCH_S["gpu"] for n in nodes])


def _op_shares(graph, nodes, seconds: float, dev) -> dict:
    """``seconds`` split over ``nodes`` by their roofline estimates (evenly when all are ~0)."""
    w = np.maximum(_op_seconds(graph, nodes, dev), 0.0)
    w = w / w.sum() if w.sum() > 0 else np.full(len(nodes), 1.0 / len(nodes))
    return {n: float(seconds * x) for n, x in zip(nodes, w)}


def _keys(cs) -> list[str]:
    # lazy: the candidates stage loads TVM's Relax compiler; this module is imported with the
    # costs package, which the runtime side imports without it
    from ...candidates import candidate_key

    return [candidate_key(cs.rg, c.nodes) for c in cs]


__all__ = ["CheckTimes", "apply_check_logs", "boundary_ops", "load_check_logs", "shipped_check_logs",
           "shipped_graph_paths", "shipped_log_paths"]
