"""MetaSchedule tuning databases read as cost-model training rows.

:func:`read_tuning_db` turns each workload of a database
(:mod:`tvm_pesto.backends.ms_database`) into one training row: the best (smallest mean)
valid time over its records, backend ``tvm-ms``, ``tuned = True``, and a description in the
profiler's schema, made from the PrimFunc (block names give the op kinds,
``estimate_tir_flops`` the FLOPs, ``args_info`` the shapes and bytes). A malformed or
truncated line is skipped and reported with its file and line number.

:func:`tune_in_process` runs a small tuning job with an in-process builder and runner
(no worker processes), which is what the test suite uses to make a database quickly.

Examples
--------
>>> from tvm_pesto.costs.predict.xgb import default_model_path
>>> rows, skipped = read_tuning_db(default_model_path().parent / "ms-small")   # a bundled database
>>> rows[0]["backend"], rows[0]["tuned"], skipped
('tvm-ms', True, [])
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np

from tvm_pesto.backends.ms_database import (FAILED_S, RECORD_FILE, WORKLOAD_FILE, device_kind_of, read_json_lines,
                                    target_summary)
from tvm_pesto.costs.predict.features import DESC_VERSION
from tvm_pesto.costs.tune.ms_logging import foreign_handlers_set_aside
from tvm_pesto.costs.tune.ms_measure import InProcessMeasurer, cpu_intrinsics_only
from tvm_pesto.costs.tune.tuning_db import device_for_target, read_device_file
from tvm_pesto.errors import CostError
from tvm_pesto.graph.opgraph import dtype_bytes

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
    for k, (lineno, obj) in enumerate(read_json_lines(wd / WORKLOAD_FILE, skipped)):
        try:
            if not (isinstance(obj, list) and len(obj) == 2):
                raise ValueError("expected [hash, base64 module]")
            workloads[k] = ms.database.Workload.from_json(obj)
            hashes[k] = str(obj[0])
        except Exception as e:  # noqa: BLE001 - any decoding failure skips the line
            skipped.append((str(wd / WORKLOAD_FILE), lineno, f"bad workload ({type(e).__name__}: {str(e)[:120]})"))
            workloads[k] = None
    best: dict[tuple, dict] = {}
    for lineno, obj in read_json_lines(wd / RECORD_FILE, skipped):
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


__all__ = ["describe_primfunc", "read_tuning_db", "tune_in_process"]
