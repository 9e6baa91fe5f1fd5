"""Cost-model training data: rows read from profiler logs and MetaSchedule databases.

A row is ``{desc, device, backend, tuned, time_s, model, key, ...}``: a subgraph's
description (:func:`tvm_pesto.costs.features.describe_group`), the device it was measured
on, the backend and the measured seconds. Rows come from the JSON-lines logs the profiler
writes (:mod:`tvm_pesto_lab.profile`, plain or gzip-compressed) and from MetaSchedule work
directories (:func:`tvm_pesto_lab.tuning_rows.read_tuning_db`); repeated profiling passes of
one subgraph are merged into one row (:func:`merge_runs`). :func:`tvm_pesto_lab.fit.train`
fits a model on them.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tvm_pesto.backends.ms_database import RECORD_FILE, WORKLOAD_FILE
from tvm_pesto.costs.predict.features import device_key, feature_matrix
from tvm_pesto.costs.store.jsonl import log_file, open_log
from tvm_pesto.costs.measure.timing import OVERHEAD_KEY
from tvm_pesto.errors import CostError
from tvm_pesto.zoo import SIZES
from .tuning_rows import read_tuning_db


@dataclass
class Dataset:
    """Rows read from logs, and what was skipped while reading them."""

    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # (file, line number, reason) for malformed lines
    no_desc: int = 0  # well-formed records without a feature description (not profiler records)
    infeasible: int = 0  # records of candidates a backend could not build (median_s < 0)
    overheads: dict = field(default_factory=dict)  # device key -> [VM call overhead seconds]
    sources: list = field(default_factory=list)


def model_size(name: str) -> str:
    """The size a row's model was profiled at: the profiler names a model profiled at a size
    other than ``small`` ``NAME:SIZE`` (``gpt2:full``); every other name is of size ``small``.

    Examples
    --------
    >>> model_size("gpt2:full"), model_size("gpt2"), model_size("tuning-db:ms-small")
    ('full', 'small', 'small')
    """
    base, _, size = name.rpartition(":")
    return size if base and size in SIZES else "small"


def base_model(name: str) -> str:
    """A row's model name without its size (:func:`model_size`).

    Examples
    --------
    >>> base_model("gpt2:full"), base_model("gpt2"), base_model("tuning-db:ms-small")
    ('gpt2', 'gpt2', 'tuning-db:ms-small')
    """
    size = model_size(name)
    return name[: -len(size) - 1] if name.endswith(":" + size) else name


def _is_tuning_db(p: Path) -> bool:
    return p.is_dir() and (p / WORKLOAD_FILE).is_file() and (p / RECORD_FILE).is_file()


def read_log(path, ds: Dataset | None = None) -> Dataset:
    """Add the rows of one JSON-lines profiler log to ``ds`` (plain or gzip-compressed: ``path``
    may name ``NAME.jsonl`` stored as ``NAME.jsonl.gz``, :func:`tvm_pesto.costs.jsonl.log_file`).

    A line that is not JSON, or lacks ``key``/``backend``/``target``/``median_s``, is skipped
    and recorded in ``ds.skipped`` with its line number (a warning lists them).

    Examples
    --------
    >>> import os, tempfile
    >>> from tvm_pesto.costs.predict.xgb import default_model_path
    >>> with open_log(default_model_path().parent / "profile-cpu.jsonl") as f:   # the bundled training log
    ...     record = next(line for line in f if '"desc"' in line)
    >>> log = os.path.join(tempfile.mkdtemp(), "log.jsonl")
    >>> with open(log, "w") as out:
    ...     _ = out.write(record + '{"key": "k"}\\n')
    >>> import warnings
    >>> with warnings.catch_warnings(record=True):   # it warns about the skipped line
    ...     ds = read_log(log)
    >>> len(ds.rows), [(line, why) for _, line, why in ds.skipped]
    (1, [(2, "KeyError: 'backend'")])
    """
    ds = ds if ds is not None else Dataset()
    p = log_file(path)
    if not p.is_file():
        raise CostError(f"log {p} does not exist; give JSON-lines files written by `tvm-pesto profile` "
                        "or MetaSchedule work directories")
    ds.sources.append(str(p))
    before = len(ds.skipped)
    with open_log(p) as f:
        for lineno, line in enumerate(f, 1):
            s = line.strip()
            if not s:
                continue
            try:
                rec = json.loads(s)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
                key, backend = str(rec["key"]), str(rec["backend"])
                t = float(rec["median_s"])
                str(rec["target"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                ds.skipped.append((str(p), lineno, f"{type(e).__name__}: {str(e)[:100]}"))
                continue
            dev = rec.get("device_desc")
            if key == OVERHEAD_KEY:
                if dev is not None and t > 0:
                    ds.overheads.setdefault(device_key(dev), []).append(t)
                continue
            if t < 0:
                ds.infeasible += 1
                continue
            desc = rec.get("desc")
            if desc is None or dev is None:
                ds.no_desc += 1
                continue
            try:
                row = {"desc": desc, "device": dev, "backend": backend,
                       "tuned": float(rec.get("tuned", backend == "tvm-ms")), "time_s": max(t, 1e-9),
                       "model": str(rec.get("model", "")), "key": key, "repeats": rec.get("repeats") or [],
                       "load": rec.get("load"), "nodes": rec.get("nodes"), "run": str(rec.get("run", "")),
                       "logged_runs": rec.get("runs")}
                feature_matrix([row])  # validates the description
            except Exception as e:  # noqa: BLE001 - a description we cannot read is a malformed line
                ds.skipped.append((str(p), lineno, f"bad description ({type(e).__name__}: {str(e)[:80]})"))
                continue
            ds.rows.append(row)
    new = ds.skipped[before:]
    if new:
        head = ", ".join(str(n) for _, n, _ in new[:10])
        warnings.warn(f"log {p}: skipped {len(new)} malformed line(s) (line {head}{', ...' if len(new) > 10 else ''})",
                      RuntimeWarning, stacklevel=2)
    return ds


def load_dataset(paths, tuning_dbs=()) -> Dataset:
    """Rows from logs and MetaSchedule work directories (a directory in ``paths`` counts as one).

    Examples
    --------
    >>> import itertools, os, tempfile
    >>> from tvm_pesto.costs.predict.xgb import default_model_path
    >>> head = os.path.join(tempfile.mkdtemp(), "head.jsonl")   # the bundled training log's first lines
    >>> with open_log(default_model_path().parent / "profile-cpu.jsonl") as f, open(head, "w") as out:
    ...     out.writelines(itertools.islice(f, 200))
    >>> ds = load_dataset([head])
    >>> len(ds.rows) > 0, ds.skipped
    (True, [])
    """
    ds = Dataset()
    for p in list(paths) + list(tuning_dbs):
        pp = Path(p)
        if _is_tuning_db(pp):
            rows, skipped = read_tuning_db(pp)
            ds.rows.extend(rows)
            ds.skipped.extend(skipped)
            ds.sources.append(str(pp))
        elif pp.is_dir():
            raise CostError(f"{pp} is a folder but not a MetaSchedule database (no database_workload.json and "
                            "database_tuning_record.json)")
        else:
            read_log(pp, ds)
    ds.rows = merge_runs(ds.rows)
    return ds


def merge_runs(rows, reduce: str = "min") -> list:
    """One row per (key, backend, device, model): repeated profiling passes (``run``) of the
    same subgraph are merged, ``time_s`` becoming the smallest (``reduce="min"``) or the
    median of the passes' medians and ``runs`` listing them (a later record of the same
    pass replaces an earlier one). Interference on a shared machine only adds time, so
    the fastest pass is the most reproducible label (see docs/cost_model.md)."""
    groups: dict = {}
    for r in rows:
        k = (r["key"], r["backend"], device_key(r["device"]), r["model"])
        groups.setdefault(k, {})[r.get("run", "")] = r
    out = []
    for per_run in groups.values():
        rs = list(per_run.values())
        row = dict(rs[-1])
        if len(rs) == 1 and rs[0].get("logged_runs"):  # a merged log (merge_logs) already holds the passes
            row["runs"] = [float(x) for x in rs[0]["logged_runs"]]
        else:
            row["runs"] = [x["time_s"] for x in rs]
            row["time_s"] = float(np.min(row["runs"]) if reduce == "min" else np.median(row["runs"]))
        row.pop("logged_runs", None)
        out.append(row)
    return out


__all__ = ["Dataset", "base_model", "load_dataset", "merge_runs", "model_size", "read_log"]
