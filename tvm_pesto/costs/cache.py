"""A persistent measurement log: JSON lines keyed by (structural key, backend, target).

A second run of the same subgraphs on the same target measures nothing. A corrupted line
is skipped and reported with its line number; it never stops the run. So is a last line cut
short by a crash (the next record starts on a new line). Several processes may append to
one file at once: each record is one atomic append (:func:`~tvm_pesto.costs.jsonl.append_record`).
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path

from .jsonl import append_record, read_records, skipped_note


def default_cache_path() -> Path:
    root = os.environ.get("TVM_PESTO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tvm-pesto")
    return Path(root) / "measurements.jsonl"


def target_key(target: dict) -> str:
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


class MeasureCache:
    """Measured seconds per (key, backend, target), loaded from and appended to a file.

    Each line: ``{"key", "backend", "target", "median_s", "repeats": [...], "op", "flops",
    "bytes", ...}``. Later lines win. :attr:`skipped` lists ``(line number, reason)`` for
    each line that could not be read (a warning names them).
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self.entries: dict[tuple[str, str, str], dict] = {}
        self.skipped: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        for lineno, rec, why in read_records(self.path):
            if why is not None:
                self.skipped.append((lineno, why))
                continue
            try:
                k = (rec["key"], rec["backend"], rec["target"])
                hash(k)
                float(rec["median_s"])
            except (KeyError, TypeError, ValueError) as e:
                self.skipped.append((lineno, f"{type(e).__name__}: {e}"))
                continue
            self._index(k, rec)
        if self.skipped:
            warnings.warn(f"measurement log {self.path}: {skipped_note(self.skipped)}", RuntimeWarning, stacklevel=3)

    def _index(self, k: tuple[str, str, str], rec: dict) -> None:
        """Remember one loaded record (subclasses may index it further)."""
        self.entries[k] = rec

    def get(self, key: str, backend: str, target: str) -> dict | None:
        return self.entries.get((key, backend, target))

    def put(self, rec: dict) -> None:
        """Remember ``rec`` and append it to the file as one atomic JSON line."""
        with self._lock:
            append_record(self.path, rec)
            self.entries[(rec["key"], rec["backend"], rec["target"])] = rec

    def __len__(self) -> int:
        return len(self.entries)
