"""A persistent measurement log: JSON lines keyed by (structural key, backend, target).

A second run of the same subgraphs on the same target measures nothing. A corrupted line
(not JSON, or a record that lacks a field or has one of the wrong type) is skipped and
reported with its line number; it never stops the run. So is a last line cut short by a
crash (the next record starts on a new line). A record of another cache format
(``cache_version`` other than :data:`CACHE_VERSION`) is expired: ignored and reported the
same way, and its subgraph is measured again. Records for other targets are kept and used
only for their target. A record measured while the machine was busier than it is now
(:func:`taken_under_load`) is measured again. Several processes may append to
one file at once: each record is one atomic append (:func:`~tvm_pesto.costs.store.jsonl.append_record`).
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from ...errors import PestoError
from ...package_data import cache_root
from .jsonl import INCOMPLETE, append_record, read_records, skipped_note


#: Format of the records this version reads and writes. A record without ``cache_version``
#: is version 1 (the format of every record written so far).
CACHE_VERSION = 1

#: Fields every record needs.
REQUIRED_FIELDS = ("key", "backend", "target", "median_s")


#: A record measured while the 1-minute load average was at least this much above the load
#: now was taken with other work on the cores (one core's worth): it is measured again.
LOAD_MARGIN = 1.0


def taken_under_load(rec: dict, load_now: float | None = None) -> bool:
    """Whether ``rec`` was measured while this machine was busier than it is now by at least
    :data:`LOAD_MARGIN` (its recorded 1-minute load average against ``load_now``, default the
    current one). Records without a load (older ones, remote devices) are never.

    Examples
    --------
    >>> taken_under_load({"load": [3.2, 2.0, 1.0]}, load_now=1.1), taken_under_load({"load": [1.5, 1, 1]}, 1.1)
    (True, False)
    >>> taken_under_load({"median_s": 1e-3}, load_now=0.0)
    False
    """
    load = rec.get("load")
    if not load:
        return False
    if load_now is None:
        if not hasattr(os, "getloadavg"):
            return False
        load_now = os.getloadavg()[0]
    return float(load[0]) - float(load_now) >= LOAD_MARGIN


def record_problem(rec) -> str | None:
    """Why a parsed line cannot be used as a measurement record, or None when it can.

    Examples
    --------
    >>> record_problem({"key": "k", "backend": "tvm", "target": "t", "median_s": 1e-3}) is None
    True
    >>> record_problem({"key": "k", "backend": "tvm"})
    'lacks field(s) target, median_s'
    >>> record_problem({"key": "k", "backend": "tvm", "target": {"kind": "llvm"}, "median_s": 1e-3})
    "field 'target' is a dict, not a string"
    """
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    missing = [f for f in REQUIRED_FIELDS if f not in rec]
    if missing:
        return f"lacks field(s) {', '.join(missing)}"
    for f in REQUIRED_FIELDS[:3]:
        if not isinstance(rec[f], str):
            return f"field {f!r} is a {type(rec[f]).__name__}, not a string"
    try:
        float(rec["median_s"])
    except (TypeError, ValueError):
        return f"median_s is {rec['median_s']!r}, not a number"
    return None


def default_cache_path() -> Path:
    return cache_root() / "measurements.jsonl"


def target_key(target: dict) -> str:
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


def measure_target(device) -> str:
    """The cache's ``target`` field for measurements on ``device``: its target, plus the
    RPC key of a device measured remotely (:mod:`tvm_pesto.costs.measure.remote`), so that a
    remote device's records never stand in for a local one's, nor the other way round.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> dev = parse_cluster("cpu:1").devices[0]
    >>> measure_target(dev) == target_key(dev.target)
    True
    >>> from dataclasses import replace
    >>> measure_target(replace(dev, rpc_key="cpu2", rpc_tracker="127.0.0.1:9190")).endswith(',"rpc_key":"cpu2"}')
    True
    """
    if not getattr(device, "rpc_key", ""):
        return target_key(device.target)
    return target_key({**device.target, "rpc_key": device.rpc_key})


def measurement_record(key: str, backend: str, target: str, repeats, nodes, device) -> dict:
    """The cache record of one measurement: ``repeats`` (seconds) of the subgraph made of
    the graph ``nodes`` (their ``op``, ``flops``, ``bytes_read``/``bytes_written``), timed
    with ``backend`` on ``device`` under the cache ``target`` key (:func:`measure_target`), with
    the machine's load average (1, 5, 15 minutes) when it was taken: a record timed while
    other jobs ran is slower than the device, and later readers can tell (``None`` for a
    device timed over RPC: this machine's load says nothing of the remote one)."""
    reps = [float(x) for x in repeats]
    return {
        "key": key, "backend": backend, "target": target, "median_s": float(np.median(reps)), "repeats": reps,
        "op": "+".join(nd.op for nd in nodes), "flops": float(sum(nd.flops for nd in nodes)),
        "bytes": float(sum(nd.bytes_read + nd.bytes_written for nd in nodes)),
        "device": device.model or device.name, "time": time.time(),
        "load": [round(x, 2) for x in os.getloadavg()]
        if hasattr(os, "getloadavg") and not getattr(device, "remote", False) else None,
    }


def backend_stamp(name: str) -> str | None:
    """What decides a backend's time besides the subgraph and the device: for ``tvm-ms``
    the version of its tuning database (``measure_stamp``,
    :func:`tvm_pesto.backends.tvm_cpu.database_stamp`), for ``tvm`` the measuring method
    (:data:`tvm_pesto.backends.tvm_cpu.TIMING_STAMP`); None for the other backends."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends import get_backend

    try:
        stamp = getattr(get_backend(name), "measure_stamp", None)
    except PestoError:
        return None
    return stamp() if stamp is not None else None


def current_record(rec: dict | None, backend: str) -> dict | None:
    """``rec``, or None when it was measured under another :func:`backend_stamp` (a
    ``tvm-ms`` time from another tuning database is measured again)."""
    if rec is None:
        return None
    stamp = backend_stamp(backend)
    return rec if stamp is None or rec.get("backend_stamp") == stamp else None


class MeasureCache:
    """Measured seconds per (key, backend, target), loaded from and appended to a file.

    Each line: ``{"key", "backend", "target", "median_s", "repeats": [...], "op", "flops",
    "bytes", ...}``. Later lines win. :attr:`skipped` lists ``(line number, reason)`` for
    each line that could not be read, :attr:`expired` ``(line number, cache_version)`` for
    each record of another format; one warning names them and says what to do.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self.entries: dict[tuple[str, str, str], dict] = {}
        self.skipped: list[tuple[int, str]] = []
        self.expired: list[tuple[int, object]] = []
        #: lookups of records measured under more load than now (measured again)
        self.loaded_again = 0
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        for lineno, rec, why in read_records(self.path):
            why = why or record_problem(rec)
            if why is not None:
                self.skipped.append((lineno, why))
                continue
            if rec.get("cache_version", 1) != CACHE_VERSION:
                self.expired.append((lineno, rec["cache_version"]))
                continue
            self._index((rec["key"], rec["backend"], rec["target"]), rec)
        if self.skipped or self.expired:
            warnings.warn(self._report(), RuntimeWarning, stacklevel=3)

    def _report(self) -> str:
        """The warning for the lines :meth:`_load` could not use (corrupt ones named last)."""
        parts = []
        if self.expired:
            lines = ", ".join(str(n) for n, _ in self.expired[:10]) + (", ..." if len(self.expired) > 10 else "")
            versions = ", ".join(sorted({str(v) for _, v in self.expired}))
            parts.append(f"{len(self.expired)} expired record(s) of cache format version {versions} (line {lines}; "
                         f"this tvm-pesto reads version {CACHE_VERSION})")
        if self.skipped:
            reasons = sorted({why for _, why in self.skipped if why != INCOMPLETE})
            if reasons:
                parts.append(f"corrupted: {', '.join(reasons[:3])}{', ...' if len(reasons) > 3 else ''}")
            parts.append(skipped_note(self.skipped))
        return (f"measurement log {self.path}: lines it cannot use are ignored and their subgraphs measured again "
                f"(delete those lines, or the file, to stop this warning): {'; '.join(parts)}")

    def _index(self, k: tuple[str, str, str], rec: dict) -> None:
        """Remember one loaded record (subclasses may index it further)."""
        self.entries[k] = rec

    def get(self, key: str, backend: str, target: str) -> dict | None:
        """The record to use for this subgraph, or None: none kept, one of another backend
        stamp, or one measured under more load than now (:func:`taken_under_load`: its time
        includes other jobs' work; it is counted in :attr:`loaded_again` and measured again)."""
        rec = current_record(self.entries.get((key, backend, target)), backend)
        if rec is not None and taken_under_load(rec):
            self.loaded_again += 1
            return None
        return rec

    def put(self, rec: dict) -> None:
        """Remember ``rec`` and append it to the file as one atomic JSON line (with the
        backend's :func:`backend_stamp`, when it has one)."""
        stamp = backend_stamp(rec.get("backend", ""))
        if stamp is not None:
            rec["backend_stamp"] = stamp
        with self._lock:
            append_record(self.path, rec)
            self.entries[(rec["key"], rec["backend"], rec["target"])] = rec

    def __len__(self) -> int:
        return len(self.entries)
