"""MetaSchedule tuning databases: their files, the targets their records were tuned for, and
MetaSchedule's own reader.

A MetaSchedule work directory (``tvm.s_tir.meta_schedule.tune_tir`` / ``tune_relax``, or
``tvm-pesto tune``, :func:`tvm_pesto.costs.tune.tune.tune_model`) holds two JSON-lines files:

``database_workload.json``
    one line per tuned TIR function: ``[structural_hash, base64(IRModule JSON)]``;
``database_tuning_record.json``
    one line per measured schedule: ``[workload_index, [trace, run_secs, target, args_info]]``,
    where ``run_secs`` is a list of seconds and ``1e10`` marks a failed build or run.

The ``tvm-ms`` backend (:mod:`tvm_pesto.backends.tvm_cpu`) applies such a database only to a
device whose target its records were tuned for (:func:`check_database_target`); ``tvm-pesto
tune`` resumes one only for the same target.

Examples
--------
>>> from tvm_pesto.costs.predict.xgb import default_model_path
>>> database_targets(default_model_path().parent / "ms-small")   # a bundled database
[{'kind': 'llvm'}]
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from ..errors import CostError

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
#: MetaSchedule writes this many seconds for a schedule that failed to build or run.
FAILED_S = 1e9


#: Target fields that decide whether tuned schedules fit a device; compared where both the
#: record's target and the device's give them (``kind`` always).
TARGET_FIELDS = ("kind", "arch", "mcpu")


#: Records timed on a remote device (over TVM RPC, :mod:`tvm_pesto.costs.measure.remote`) are tuned
#: for the device's target tagged ``rpc:KEY`` (TVM keeps a target's ``tag`` in each record it
#: writes); :func:`target_summary` reads it back as ``rpc_key``, the field
#: :func:`tvm_pesto.costs.store.cache.measure_target` adds to a remote device's measurements.
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

    Lines that do not parse are left to the reader of the records to report
    (:func:`tvm_pesto_lab.tuning_rows.read_tuning_db`).
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
    for _, obj in read_json_lines(Path(path), []):
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
    >>> from tvm_pesto.costs.predict.xgb import default_model_path
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


def read_json_lines(path: Path, skipped: list) -> list[tuple[int, object]]:
    """``(line number, parsed JSON)`` of every non-blank line of a database file; a line that is
    not JSON is appended to ``skipped`` as ``(file, line number, reason)``."""
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


__all__ = ["FAILED_S", "RECORD_FILE", "RPC_TAG_PREFIX", "TARGET_FIELDS", "WORKLOAD_FILE", "check_database_target",
           "database_targets", "device_kind_of", "open_database", "read_json_lines", "rpc_target", "target_matches",
           "target_summary"]
