"""Time several ways of running one model against each other, in blocks.

Each callable runs in a block of its own: a warm-up, then calls for at least ``block_s``
seconds and ``min_calls`` calls, of which the median is kept. The order of the callables
rotates from round to round, and each one's time is its best block median. Calls of two
libraries interleaved one by one would time one library's idle threads (ONNX Runtime's,
OpenMP's, OpenVINO's) inside the other's call; a block lets them settle first.

Examples
--------
>>> from tvm_pesto.run.blocks import time_blocks
>>> r = time_blocks({"a": lambda: None, "b": lambda: None}, rounds=2, warmup_s=0.0, block_s=0.001, min_calls=3)
>>> sorted(r), len(r["a"]["blocks_s"]), r["a"]["calls"] >= 6
(['a', 'b'], 2, True)
"""
from __future__ import annotations

import time

import numpy as np


def time_blocks(calls: dict, rounds: int = 3, warmup_s: float = 0.2, block_s: float = 0.3, min_calls: int = 20,
                max_block_s: float | None = None) -> dict:
    """Seconds per call of each zero-argument callable, timed in rotating blocks.

    Parameters
    ----------
    calls : dict
        name -> callable.
    rounds : int
        Blocks per callable; round ``r`` starts at the ``r``-th callable.
    warmup_s : float
        Seconds of calls before each block (at least one call).
    block_s, min_calls : float, int
        A block lasts at least ``block_s`` seconds and ``min_calls`` calls ...
    max_block_s : float, optional
        ... unless it has lasted ``max_block_s`` seconds and made three calls (a slow model).

    Returns
    -------
    dict
        name -> ``{"s": best block median, "blocks_s": each block's median, "calls": calls timed}``.
    """
    names = list(calls)
    out = {n: {"blocks_s": [], "calls": 0} for n in names}
    for r in range(rounds):
        k = r % max(len(names), 1)
        for n in names[k:] + names[:k]:
            f = calls[n]
            t0 = time.perf_counter()
            f()
            while time.perf_counter() - t0 < warmup_s:
                f()
            times: list[float] = []
            t0 = time.perf_counter()
            while True:
                t = time.perf_counter()
                f()
                times.append(time.perf_counter() - t)
                spent = time.perf_counter() - t0
                if (len(times) >= min_calls and spent >= block_s) or (
                        max_block_s is not None and spent >= max_block_s and len(times) >= 3):
                    break
            out[n]["blocks_s"].append(float(np.median(times)))
            out[n]["calls"] += len(times)
    for rec in out.values():
        rec["s"] = min(rec["blocks_s"]) if rec["blocks_s"] else float("nan")
    return out


__all__ = ["time_blocks"]
