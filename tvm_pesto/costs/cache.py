"""A persistent measurement log: JSON lines keyed by (structural key, backend, target).

A second run of the same subgraphs on the same target measures nothing. A corrupted line
is skipped and reported with its line number; it never stops the run.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path


def default_cache_path() -> Path:
    root = os.environ.get("TVM_PESTO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tvm-pesto")
    return Path(root) / "measurements.jsonl"


def target_key(target: dict) -> str:
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


class MeasureCache:
    """Measured seconds per (key, backend, target), loaded from and appended to a file.

    Each line: ``{"key", "backend", "target", "median_s", "repeats": [...], "op", "flops",
    "bytes", ...}``. Later lines win.
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
        with open(self.path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                    k = (rec["key"], rec["backend"], rec["target"])
                    float(rec["median_s"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    self.skipped.append((lineno, str(e)))
                    continue
                self._index(k, rec)
        if self.skipped:
            lines = ", ".join(str(n) for n, _ in self.skipped[:10])
            warnings.warn(f"measurement log {self.path}: skipped {len(self.skipped)} corrupted line(s) "
                          f"(line {lines})", RuntimeWarning, stacklevel=3)

    def _index(self, k: tuple[str, str, str], rec: dict) -> None:
        """Remember one loaded record (subclasses may index it further)."""
        self.entries[k] = rec

    def get(self, key: str, backend: str, target: str) -> dict | None:
        return self.entries.get((key, backend, target))

    def put(self, rec: dict) -> None:
        with self._lock:
            self.entries[(rec["key"], rec["backend"], rec["target"])] = rec
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def __len__(self) -> int:
        return len(self.entries)
