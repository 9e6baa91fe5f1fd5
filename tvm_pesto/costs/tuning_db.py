"""Read MetaSchedule tuning databases as cost-model training data.

A MetaSchedule work directory (``tvm.s_tir.meta_schedule.tune_tir`` / ``tune_relax``)
holds two JSON-lines files:

``database_workload.json``
    one line per tuned TIR function: ``[structural_hash, base64(IRModule JSON)]``;
``database_tuning_record.json``
    one line per measured schedule: ``[workload_index, [trace, run_secs, target, args_info]]``,
    where ``run_secs`` is a list of seconds and ``1e10`` marks a failed build or run.

:func:`read_tuning_db` turns each workload into one training row: the best (smallest
mean) valid time over its records, backend ``tvm-ms``, ``tuned = True``, and a
description in the profiler's schema, made from the PrimFunc (block names give the op
kinds, ``estimate_tir_flops`` the FLOPs, ``args_info`` the shapes and bytes). A
malformed or truncated line is skipped and reported with its file and line number.

:func:`tune_in_process` runs a small tuning job with an in-process builder and runner
(no worker processes), which is what the test suite uses to make a database quickly.

Examples
--------
>>> from tvm_pesto.costs.tuning_db import read_tuning_db
>>> from tvm_pesto.costs.xgb import default_model_path
>>> rows, skipped = read_tuning_db(default_model_path().parent / "ms-small")   # a bundled database
>>> rows[0]["backend"], rows[0]["tuned"], skipped
('tvm-ms', True, [])
"""
from __future__ import annotations

import functools
import json
import os
import re
import warnings
from pathlib import Path

import numpy as np

from ..errors import CostError
from .features import DESC_VERSION, device_key

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
#: The device a database was tuned on (:func:`write_device_file`): its records' timings are
#: that device's, whatever machine reads them.
DEVICE_FILE = "tvm_pesto_device.json"
#: MetaSchedule writes this many seconds for a schedule that failed to build or run.
FAILED_S = 1e9

# block-name keyword -> Relax op name (first match wins)
_BLOCK_OPS = [
    ("conv2d", "relax.nn.conv2d"), ("conv", "relax.nn.conv2d"), ("NT_matmul", "relax.matmul"),
    ("matmul", "relax.matmul"), ("dense", "relax.matmul"), ("softmax", "relax.nn.softmax"),
    ("layer_norm", "relax.nn.layer_norm"), ("batch_norm", "relax.nn.batch_norm"), ("max_pool", "relax.nn.max_pool2d"),
    ("pool_max", "relax.nn.max_pool2d"), ("avg_pool", "relax.nn.avg_pool2d"), ("pool_sum", "relax.nn.avg_pool2d"),
    ("adaptive", "relax.nn.adaptive_avg_pool2d"), ("T_add", "relax.add"), ("T_multiply", "relax.multiply"),
    ("T_subtract", "relax.subtract"), ("T_divide", "relax.divide"), ("T_relu", "relax.nn.relu"),
    ("T_transpose", "relax.permute_dims"), ("T_reshape", "relax.reshape"), ("T_concat", "relax.concat"),
    ("T_strided_slice", "relax.strided_slice"), ("T_take", "relax.take"), ("T_tanh", "relax.tanh"),
    ("T_sigmoid", "relax.sigmoid"), ("T_exp", "relax.exp"), ("red", "relax.sum"), ("T_sum", "relax.sum"),
    ("T_mean", "relax.mean"), ("compute", "relax.nn.relu"),
]
_SKIP_BLOCKS = {"root", "pad_temp", "data_pad", "PadInput", "T_pad"}


def _block_op(name: str) -> str | None:
    if name in _SKIP_BLOCKS or name.startswith("pad"):
        return None
    for kw, op in _BLOCK_OPS:
        if kw in name:
            return op
    return f"tir.{name}"


def describe_primfunc(func, args_info) -> dict:
    """A profiler-style description of a tuned PrimFunc.

    ``args_info`` is the record's list of ``["TENSOR", dtype, shape]``; by the
    destination-passing convention the last argument is the output.
    """
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    from ..graph.opgraph import dtype_bytes

    script = func.script()
    blocks = [b for b in re.findall(r'T\.sblock\("([^"]+)"\)', script)]
    ops = [op for op in (_block_op(b) for b in blocks) if op is not None] or ["tir.unknown"]
    tensors = [(str(a[1]), [int(x) for x in a[2]]) for a in args_info if isinstance(a, (list, tuple)) and a
               and a[0] == "TENSOR"]
    if not tensors:
        raise CostError("tuning record has no tensor arguments")
    ins, out = tensors[:-1], tensors[-1]

    def nbytes(t):
        return int(np.prod(t[1], dtype=np.int64)) * dtype_bytes(t[0]) if t[1] else dtype_bytes(t[0])

    try:
        flops = float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - estimator gaps: fall back to zero
        flops = 0.0
    anchors = [o for o in ops if o in ("relax.nn.conv2d", "relax.matmul")]
    dom = anchors[0] if anchors else ops[0]
    attrs: dict = {}
    if dom == "relax.nn.conv2d" and len(ins) >= 2 and len(ins[0][1]) == 4 and len(ins[1][1]) == 4:
        cin, cin_g = ins[0][1][1], ins[1][1][1]
        attrs["groups"] = max(1, cin // max(cin_g, 1))
        if len(out[1]) == 4 and out[1][2]:
            attrs["strides"] = [max(1, round(ins[0][1][2] / out[1][2]))] * 2
    return {
        "v": DESC_VERSION, "ops": ops,
        "dominant": {"op": dom, "attrs": attrs, "inputs": [t[1] for t in ins][:6], "outputs": [out[1]]},
        "out_shapes": [out[1]], "dtype": out[0], "flops": flops,
        "bytes_read": int(sum(nbytes(t) for t in ins)), "bytes_written": int(nbytes(out)),
        "param_bytes": 0, "member_bytes": int(sum(nbytes(t) for t in tensors)),
    }


def device_for_target(target: dict, device: dict | None = None) -> dict:
    """Device descriptor for a record's target: ``device`` if given, else this machine's
    CPU (for ``llvm``) or the GPU preset with the target's ``arch`` (for ``cuda``)."""
    if device is not None:
        return dict(device)
    kind = str(target.get("kind", "llvm"))
    if kind == "llvm":
        from ..cluster.host import cpu_identity
        from ..cluster.specs import cpu_info

        _, per_core, mem = cpu_info()
        cores = int(target.get("num-cores", 1) or 1)
        out = {"kind": "cpu", "model": "host-cpu", "peak_flops": per_core * cores, "mem_bandwidth": 8e9 * cores,
               "memory_bytes": mem, "cores": cores}
        kind = cpu_identity()["kind"]
        return {**out, "cpu_kind": kind} if kind else out
    if kind == "cuda":
        from ..cluster.specs import GPU_MODELS

        arch = str(target.get("arch", ""))
        for name, (peak, bw, mem, sms, a) in GPU_MODELS.items():
            if a == arch:
                return {"kind": "gpu", "model": name, "peak_flops": peak, "mem_bandwidth": bw, "memory_bytes": mem,
                        "cores": sms}
    raise CostError(f"no device description for target {target}; pass one as read_tuning_db(..., device=...) "
                    "(see tvm_pesto.costs.features.device_descriptor)")


#: Target fields that decide whether tuned schedules fit a device; compared where both the
#: record's target and the device's give them (``kind`` always).
TARGET_FIELDS = ("kind", "arch", "mcpu")


#: Records timed on a remote device (over TVM RPC, :mod:`tvm_pesto.costs.remote`) are tuned
#: for the device's target tagged ``rpc:KEY`` (TVM keeps a target's ``tag`` in each record it
#: writes); :func:`target_summary` reads it back as ``rpc_key``, the field
#: :func:`tvm_pesto.costs.cache.device_key` adds to a remote device's measurements.
RPC_TAG_PREFIX = "rpc:"


def rpc_target(target: dict, rpc_key: str = "") -> dict:
    """The target a database of the device whose RPC key is ``rpc_key`` is tuned for and
    checked against: ``target`` tagged ``rpc:KEY``, or ``target`` itself for a local device.

    Examples
    --------
    >>> rpc_target({"kind": "llvm", "num-cores": 1}, "cpu2")
    {'kind': 'llvm', 'num-cores': 1, 'tag': 'rpc:cpu2'}
    >>> rpc_target({"kind": "llvm"})
    {'kind': 'llvm'}
    """
    return {**target, "tag": RPC_TAG_PREFIX + str(rpc_key)} if rpc_key else dict(target)


def target_summary(target: dict) -> dict:
    """The :data:`TARGET_FIELDS` of a target JSON dict (``kind`` defaults to ``llvm``), and
    the ``rpc_key`` of a target tagged by :func:`rpc_target` (or of a summary).

    Examples
    --------
    >>> target_summary({"kind": "llvm", "num-cores": 2, "tag": "rpc:cpu2"})
    {'kind': 'llvm', 'rpc_key': 'cpu2'}
    >>> target_summary(target_summary({"kind": "llvm", "tag": "rpc:cpu2"}))
    {'kind': 'llvm', 'rpc_key': 'cpu2'}
    """
    out = {k: str(target[k]) for k in TARGET_FIELDS if target.get(k)}
    out.setdefault("kind", "llvm")
    tag = str(target.get("tag") or "")
    key = str(target.get("rpc_key") or (tag[len(RPC_TAG_PREFIX):] if tag.startswith(RPC_TAG_PREFIX) else ""))
    if key:
        out["rpc_key"] = key
    return out


def target_matches(record_target: dict, target: dict) -> bool:
    """Whether schedules tuned for ``record_target`` fit a device whose target is ``target``
    (the :data:`TARGET_FIELDS` both give agree, and both are local or both remote with the
    same RPC key: a remote device's records never stand in for a local one's).

    Examples
    --------
    >>> target_matches({"kind": "llvm", "num-cores": 4}, {"kind": "llvm", "num-cores": 1})
    True
    >>> target_matches({"kind": "cuda", "arch": "sm_90"}, {"kind": "cuda", "arch": "sm_80"})
    False
    >>> target_matches(rpc_target({"kind": "llvm"}, "cpu2"), {"kind": "llvm"})
    False
    """
    a, b = target_summary(record_target), target_summary(target)
    return a.get("rpc_key") == b.get("rpc_key") and all(a[k] == b[k] for k in a.keys() & b.keys())


def device_kind_of(target: dict) -> str:
    """``cpu`` for an ``llvm`` target, ``gpu`` for any other (cuda, rocm, vulkan, ...)."""
    return "cpu" if target_summary(target)["kind"] in ("llvm", "c") else "gpu"


def database_targets(work_dir) -> list[dict]:
    """The distinct targets (:func:`target_summary`) of a MetaSchedule database's records.

    Lines that do not parse are left to :func:`read_tuning_db` to report.
    """
    path = Path(work_dir) / RECORD_FILE
    if not path.is_file():
        return []
    st = path.stat()
    return [dict(t) for t in _record_targets(str(path.resolve()), st.st_mtime_ns, st.st_size)]


@functools.lru_cache(maxsize=8)
def _record_targets(path: str, mtime_ns: int, size: int) -> tuple:
    """:func:`database_targets` of one version of a record file (each build asks again)."""
    seen: dict[str, dict] = {}
    for _, obj in _read_lines(Path(path), []):
        try:
            t = obj[1][2]
        except (TypeError, IndexError, KeyError):
            continue
        if isinstance(t, dict):
            summary = target_summary(t)
            seen.setdefault(json.dumps(summary, sort_keys=True), summary)
    return tuple(seen[k] for k in sorted(seen))


def check_database_target(work_dir, target: dict) -> None:
    """Raise :class:`CostError` when a record of the database was tuned for another target
    than ``target`` (MetaSchedule applies a workload's best record whatever its target, so
    such a database must not be used for this device).

    Examples
    --------
    >>> from tvm_pesto.costs.xgb import default_model_path
    >>> work_dir = default_model_path().parent / "ms-small"   # a bundled database, tuned for llvm
    >>> check_database_target(work_dir, {"kind": "llvm", "num-cores": 2})
    >>> check_database_target(work_dir, {"kind": "cuda", "arch": "sm_80"})
    Traceback (most recent call last):
    ...
    tvm_pesto.errors.CostError: MetaSchedule database '.../ms-small' holds records tuned for {"kind": "llvm"}, ...
    """
    others = [t for t in database_targets(work_dir) if not target_matches(t, target)]
    if others:
        shown = ", ".join(json.dumps(t, sort_keys=True) for t in others[:3])
        mine = target_summary(target)
        keys = sorted({str(t["rpc_key"]) for t in others if "rpc_key" in t} - {mine.get("rpc_key")})
        rpc = (f" (records with an rpc_key were timed over TVM RPC on the servers of key {', '.join(keys)}; they "
               "apply to that remote device only, given as --rpc-tracker HOST:PORT --rpc-key KEY)" if keys else "")
        raise CostError(f"MetaSchedule database {os.fspath(work_dir)!r} holds records tuned for {shown}, not for "
                        f"this device's target {json.dumps(mine, sort_keys=True)}{rpc}; its schedules "
                        "do not fit here: tune a database for this target (tune_tir/tune_relax) and point "
                        "TVM_PESTO_MS_DB at it, or keep one target per database")


def open_database(work_dir):
    """MetaSchedule's own reader (``JSONDatabase``) over a work directory, created empty
    when its files are missing.

    Raises
    ------
    CostError
        When MetaSchedule cannot read it (it refuses a whole file for one bad line).
    """
    from tvm.s_tir import meta_schedule as ms

    try:
        return ms.database.JSONDatabase(work_dir=os.fspath(work_dir), allow_missing=True, module_equality="structural")
    except Exception as e:  # noqa: BLE001 - any parse error of MetaSchedule's reader
        text = str(e).strip()
        why = f"{type(e).__name__}: {text.splitlines()[-1][:300]}" if text else type(e).__name__
        raise CostError(f"MetaSchedule cannot read the database in {os.fspath(work_dir)!r} ({why}); "
                        "tvm-pesto cost-model train --tuning-db DIR names its malformed lines: remove them, or "
                        "tune into a new work directory") from e


def _read_lines(path: Path, skipped: list) -> list[tuple[int, object]]:
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            s = line.strip()
            if not s:
                continue
            try:
                out.append((lineno, json.loads(s)))
            except json.JSONDecodeError as e:
                skipped.append((str(path), lineno, f"not JSON ({e.msg})"))
    return out


def write_device_file(work_dir, device: dict) -> str:
    """Record in ``work_dir`` the descriptor of the device its database is tuned on
    (:data:`DEVICE_FILE`; :func:`tvm_pesto.costs.features.device_descriptor`).

    Raises
    ------
    CostError
        When the folder already records another device (another CPU kind or core count):
        one database's timings come from one device.
    """
    from ..jsonio import write_json

    old = read_device_file(work_dir)
    if old is not None and device_key(old) != device_key(device):
        raise CostError(f"{work_dir} holds schedules timed on {device_key(old)}, not on {device_key(device)}; "
                        "tune this device into another --work-dir")
    return write_json(str(Path(work_dir) / DEVICE_FILE), dict(device))


def read_device_file(work_dir) -> dict | None:
    """The device descriptor :func:`write_device_file` recorded in ``work_dir``, or None.

    Raises
    ------
    CostError
        When the file is there but is not a descriptor.
    """
    p = Path(work_dir) / DEVICE_FILE
    if not p.is_file():
        return None
    try:
        dev = json.loads(p.read_text())
        if not isinstance(dev, dict):
            raise TypeError("not a JSON object")
        device_key(dev)
        float(dev["peak_flops"]), float(dev["mem_bandwidth"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CostError(f"{p} is not a device descriptor ({type(e).__name__}: {e}); it needs kind, model, cores, "
                        "peak_flops and mem_bandwidth; delete it to read the database as this machine's") from None
    return dev


def read_tuning_db(work_dir, model: str | None = None, device: dict | None = None):
    """Training rows from a MetaSchedule work directory, and the lines it skipped.

    Parameters
    ----------
    work_dir : path-like
        Folder holding ``database_workload.json`` and ``database_tuning_record.json``.
    model : str, optional
        Name for the held-out split (default ``tuning-db:<folder name>``).
    device : dict, optional
        Device descriptor (see :func:`tvm_pesto.costs.features.device_descriptor`); by
        default the one the folder records (:data:`DEVICE_FILE`, written by ``tvm-pesto
        tune``), else derived from each record's target and this machine's CPU.

    Returns
    -------
    rows : list of dict
        ``desc``, ``device``, ``backend`` (``tvm-ms``), ``tuned`` (True), ``time_s`` (best
        mean), ``model``, ``key``, ``repeats`` and ``n_records``.
    skipped : list of (file, line number, reason)

    Raises
    ------
    CostError
        When the folder lacks one of the two files.
    """
    wd = Path(work_dir)
    missing = [f for f in (WORKLOAD_FILE, RECORD_FILE) if not (wd / f).is_file()]
    if missing:
        raise CostError(f"{wd} is not a MetaSchedule database: it lacks {', '.join(missing)} "
                        "(point --tuning-db at the work_dir given to tune_tir/tune_relax)")
    from tvm.s_tir import meta_schedule as ms

    model = model or f"tuning-db:{wd.resolve().name}"
    device = device if device is not None else read_device_file(wd)
    skipped: list = []
    workloads: dict[int, object] = {}
    hashes: dict[int, str] = {}
    for k, (lineno, obj) in enumerate(_read_lines(wd / WORKLOAD_FILE, skipped)):
        try:
            if not (isinstance(obj, list) and len(obj) == 2):
                raise ValueError("expected [hash, base64 module]")
            workloads[k] = ms.database.Workload.from_json(obj)
            hashes[k] = str(obj[0])
        except Exception as e:  # noqa: BLE001 - any decoding failure skips the line
            skipped.append((str(wd / WORKLOAD_FILE), lineno, f"bad workload ({type(e).__name__}: {str(e)[:120]})"))
            workloads[k] = None
    best: dict[tuple, dict] = {}
    for lineno, obj in _read_lines(wd / RECORD_FILE, skipped):
        try:
            if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[1], list) and len(obj[1]) >= 4):
                raise ValueError("expected [workload_index, [trace, run_secs, target, args_info]]")
            widx = int(obj[0])
            _, run_secs, target, args_info = obj[1][:4]
            if widx not in workloads:
                raise ValueError(f"workload index {widx} is not in {WORKLOAD_FILE}")
            if workloads[widx] is None:
                raise ValueError(f"its workload (index {widx}) was skipped")
            secs = [float(s) for s in (run_secs or [])]
            if not isinstance(target, dict):
                raise ValueError("target is not a JSON object")
            if device is not None and device.get("kind") and device_kind_of(target) != device["kind"]:
                raise ValueError(f"tuned for target {json.dumps(target_summary(target), sort_keys=True)}, not for "
                                 f"the given {device['kind']} device; read a database tuned for that device, or "
                                 "pass no device (each record's target then names its device)")
        except (ValueError, TypeError) as e:
            skipped.append((str(wd / RECORD_FILE), lineno, str(e)))
            continue
        valid = [s for s in secs if 0 < s < FAILED_S]
        if not valid or len(valid) < len(secs):
            continue  # a failed build/run (1e10): not an error in the file, just no time
        tkey = json.dumps({k: target[k] for k in sorted(target) if k in ("kind", "num-cores", "arch", "mcpu", "tag")},
                          sort_keys=True)  # a remote device's records (tag rpc:KEY) make their own rows
        k = (widx, tkey)
        mean = float(np.mean(valid))
        if k not in best or mean < best[k]["time_s"]:
            best[k] = {"time_s": mean, "repeats": valid, "target": target, "args_info": args_info, "lineno": lineno,
                       "n_records": best.get(k, {}).get("n_records", 0) + 1}
        else:
            best[k]["n_records"] += 1
    rows = []
    for (widx, tkey), b in sorted(best.items()):
        try:
            desc = describe_primfunc(workloads[widx].mod["main"], b["args_info"])
            dev = device_for_target(b["target"], device)
        except Exception as e:  # noqa: BLE001
            skipped.append((str(wd / RECORD_FILE), b["lineno"], f"cannot describe workload {widx}: {e}"))
            continue
        rows.append({"desc": desc, "device": dev, "backend": "tvm-ms", "tuned": True, "time_s": b["time_s"],
                     "model": model, "key": f"ms:{hashes[widx]}", "repeats": b["repeats"],
                     "n_records": b["n_records"], "source": str(wd)})
    if skipped:
        head = "; ".join(f"{os.path.basename(f)} line {n}: {why}" for f, n, why in skipped[:5])
        warnings.warn(f"tuning database {wd}: skipped {len(skipped)} line(s): {head}", RuntimeWarning, stacklevel=2)
    return rows, skipped


def tune_in_process(mod, target: dict, work_dir, max_trials: int = 8, num_trials_per_iter: int = 4,
                    seed: int = 0):
    """A short MetaSchedule run of TIR functions with an in-process builder and runner
    (:class:`tvm_pesto.costs.ms_measure.InProcessMeasurer`); returns the database. Whole models
    are tuned with :func:`tvm_pesto.costs.tune.tune_model`.

    Parameters
    ----------
    mod : tvm.IRModule
        TIR functions to tune (e.g. a legalised and fused Relax module's PrimFuncs).
    target : dict
        A target JSON dict, e.g. ``{"kind": "llvm", "num-cores": 1}``.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> a = te.placeholder((16, 16), name="a")
    >>> b = te.compute((16, 16), lambda i, j: te.max(a[i, j], 0.0), name="b")
    >>> tir_mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    >>> import contextlib, io, tempfile
    >>> work_dir = tempfile.mkdtemp()
    >>> with contextlib.redirect_stdout(io.StringIO()):   # MetaSchedule logs its progress to stdout
    ...     db = tune_in_process(tir_mod, {"kind": "llvm", "num-cores": 1}, work_dir, max_trials=4)
    >>> rows, skipped = read_tuning_db(work_dir)
    >>> len(rows), rows[0]["backend"], skipped
    (1, 'tvm-ms', [])
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from .ms_logging import foreign_handlers_set_aside
    from .ms_measure import InProcessMeasurer, cpu_intrinsics_only

    os.makedirs(work_dir, exist_ok=True)
    measurer = InProcessMeasurer()
    try:
        # tune_tir configures MetaSchedule's loggers, which the caller's handlers on them would make fail
        with cpu_intrinsics_only(str(target.get("kind", "llvm")) == "llvm"), foreign_handlers_set_aside():
            return ms.tir_integration.tune_tir(
                mod, tvm.target.Target(target), str(work_dir), max_trials_global=max_trials,
                num_trials_per_iter=num_trials_per_iter, builder=measurer.builder, runner=measurer.runner,
                cost_model="random", strategy=ms.search_strategy.ReplayTrace(), task_scheduler="round-robin",
                num_tuning_cores=1, seed=seed)
    finally:
        measurer.close()


__all__ = ["DEVICE_FILE", "FAILED_S", "RECORD_FILE", "RPC_TAG_PREFIX", "TARGET_FIELDS", "WORKLOAD_FILE",
           "check_database_target", "database_targets", "describe_primfunc", "device_for_target", "device_kind_of",
           "open_database", "read_device_file", "read_tuning_db", "rpc_target", "target_matches", "target_summary",
           "tune_in_process", "write_device_file"]
