"""Time several ways of running one model against each other, in blocks.

Each callable runs in a block of its own: a warm-up, then calls for at least ``block_s``
seconds and ``min_calls`` calls, of which the median is kept. The order of the callables
rotates from round to round, and each one's time is its best block median. Calls of two
libraries interleaved one by one would time one library's idle threads (ONNX Runtime's,
OpenMP's, OpenVINO's) inside the other's call; a block lets them settle first.

On a machine whose speed comes and goes (a neighbour on a shared core: two-thread library
calls on a 2-vCPU VM can take twice as long for seconds at a time), one best block is a
matter of luck. With ``agree``, a time stands only when a second block reproduces it: while
a callable's two best blocks differ by more than ``agree``, every callable gets another
block, up to ``max_rounds``, and each says whether it was ``confirmed``. A best block that no
other reproduces after them is not the callable's time: its time is then the least block that
another one reproduces (:func:`reproduced_best`).

Examples
--------
>>> from tvm_pesto.costs.measure.blocks import time_blocks
>>> r = time_blocks({"a": lambda: None, "b": lambda: None}, rounds=2, warmup_s=0.0, block_s=0.001, min_calls=3)
>>> sorted(r), len(r["a"]["blocks_s"]), r["a"]["calls"] >= 6
(['a', 'b'], 2, True)
"""
from __future__ import annotations

import os
import time

import numpy as np

from ...run.libraries.loaders import onnx_session


def _block(f, warmup_s: float, block_s: float, min_calls: int, max_block_s: float | None,
           clock=time.perf_counter) -> tuple[float, int]:
    """One block of ``f``: the warm-up, then the median seconds of its timed calls and their number."""
    t0 = clock()
    f()
    while clock() - t0 < warmup_s:
        f()
    times: list[float] = []
    t0 = clock()
    while True:
        t = clock()
        f()
        times.append(clock() - t)
        spent = clock() - t0
        if (len(times) >= min_calls and spent >= block_s) or (
                max_block_s is not None and spent >= max_block_s and len(times) >= 3):
            return float(np.median(times)), len(times)


def best_two_spread(blocks_s) -> float | None:
    """How far the second-best block is above the best, as a fraction (None under two blocks).

    Examples
    --------
    >>> round(best_two_spread([1.0, 1.5, 1.02]), 3), best_two_spread([1.0])
    (0.02, None)
    """
    b = sorted(blocks_s)
    return b[1] / b[0] - 1.0 if len(b) >= 2 and b[0] > 0 else None


def reproduced_best(blocks_s, agree: float) -> float:
    """The least block median that another block reproduces within ``agree`` (the next one up
    within that fraction of it); the median of them all where no two blocks agree.

    Examples
    --------
    One block 25 % under every other is a quick spell, not the callable's speed:

    >>> reproduced_best([4.3, 3.3, 4.2, 4.7, 5.1], agree=0.03)
    4.2
    >>> reproduced_best([1.0, 1.2, 1.5], agree=0.03)
    1.2
    """
    b = sorted(blocks_s)
    return next((x for x, y in zip(b, b[1:]) if y <= x * (1.0 + agree)), float(np.median(b)))


def time_blocks(calls: dict, rounds: int = 3, warmup_s: float = 0.2, block_s: float = 0.3, min_calls: int = 20,
                max_block_s: float | None = None, agree: float | None = None, max_rounds: int | None = None,
                clock=time.perf_counter) -> dict:
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
    agree : float, optional
        After ``rounds``, while some callable's two best blocks differ by more than this
        fraction, another round times every callable (rotated), up to ``max_rounds`` blocks
        each (default ``3 * rounds``). Every callable, not the unsteady ones only: a best block
        is the least of a callable's blocks, and one timed in more blocks has more chances at
        a quick spell of a machine whose speed comes and goes, so it would be judged faster
        than the rest for that alone.

    Returns
    -------
    dict
        name -> ``{"s": best block median, "blocks_s": each block's median, "calls": calls
        timed, "spread": the second-best block over the best, minus 1}``, and with ``agree``
        ``"confirmed"``: whether the best block was reproduced within ``agree`` (if not, ``"s"``
        is :func:`reproduced_best`).

    Examples
    --------
    A callable that is slow in its first block only is timed again until its best is
    reproduced, and the steady one beside it in as many blocks:

    >>> import time
    >>> n = {"calls": 0}
    >>> def f():
    ...     n["calls"] += 1
    ...     time.sleep(0.004 if n["calls"] <= 4 else 0.001)
    >>> r = time_blocks({"f": f, "g": lambda: None}, rounds=1, warmup_s=0.0, block_s=0.0, min_calls=3,
    ...                 agree=0.5, max_rounds=4)
    >>> r["f"]["confirmed"], 2 <= len(r["f"]["blocks_s"]) == len(r["g"]["blocks_s"]) <= 4
    (True, True)
    """
    names = list(calls)
    out = {n: {"blocks_s": [], "calls": 0} for n in names}

    def run(order):
        for n in order:
            s, k = _block(calls[n], warmup_s, block_s, min_calls, max_block_s, clock)
            out[n]["blocks_s"].append(s)
            out[n]["calls"] += k

    for r in range(rounds):
        k = r % max(len(names), 1)
        run(names[k:] + names[:k])
    if agree is not None:
        limit = max_rounds if max_rounds is not None else 3 * rounds
        for r in range(rounds, limit):
            if all(_agrees(out[n]["blocks_s"], agree) for n in names):
                break
            k = r % len(names)
            run(names[k:] + names[:k])
    for rec in out.values():
        rec["s"] = min(rec["blocks_s"]) if rec["blocks_s"] else float("nan")
        rec["spread"] = best_two_spread(rec["blocks_s"])
        if agree is not None:
            rec["confirmed"] = _agrees(rec["blocks_s"], agree)
            if not rec["confirmed"] and len(rec["blocks_s"]) >= 2:
                rec["s"] = reproduced_best(rec["blocks_s"], agree)
    return out


def _agrees(blocks_s, agree: float) -> bool:
    spread = best_two_spread(blocks_s)
    return spread is not None and spread <= agree


#: The probe's chain: this many MatMul + Relu of [PROBE_ROWS, PROBE_WIDTH] by [PROBE_WIDTH, PROBE_WIDTH].
PROBE_OPS, PROBE_ROWS, PROBE_WIDTH = 8, 64, 256
_PROBES: list = []  # the probe's two sessions (two threads, one thread), made on first use


def _probe_sessions():
    """ONNX Runtime sessions of one fixed chain of matrix products, made as tvm-pesto makes its
    units' sessions (:func:`~tvm_pesto.run.libraries.loaders.onnx_session`): two threads and one."""
    if not _PROBES:
        # lazy: ONNX and ONNX Runtime load only where a probe is asked for
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        rng, nodes, weights, x = np.random.default_rng(0), [], [], "x"
        for i in range(PROBE_OPS):
            w = (rng.standard_normal((PROBE_WIDTH, PROBE_WIDTH)) * 0.05).astype("float32")
            weights.append(numpy_helper.from_array(w, f"w{i}"))
            nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
            x = f"r{i}"
        shape = [PROBE_ROWS, PROBE_WIDTH]
        graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
        onnx.checker.check_model(model)
        _PROBES.extend(onnx_session(model, cores, spin=True) for cores in (2, 1))  # as the units' sessions run
    return _PROBES


def slow_spell_ratio(seconds: float = 0.1) -> float | None:
    """How much a second thread helps right now: the best call of a fixed chain of matrix
    products on two threads over its best on one, each timed for ``seconds``. About 0.55 while
    the machine's two cores both run; near 0.8 or over in a slow spell (a shared machine whose
    second core comes and goes for seconds at a time, where a library's threads wait on each
    other); None on a process with one core.

    Examples
    --------
    >>> r = slow_spell_ratio(0.02)
    >>> r is None or 0.2 < r < 3.0
    True
    """
    if len(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)) < 2:
        return None
    x = {"x": np.random.default_rng(1).random((PROBE_ROWS, PROBE_WIDTH), dtype=np.float32)}
    best = []
    for sess in _probe_sessions():
        b, t0 = float("inf"), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            sess.run(None, x)
            b = min(b, time.perf_counter() - t)
        best.append(b)
    return best[0] / best[1]


__all__ = ["PROBE_OPS", "PROBE_ROWS", "PROBE_WIDTH", "best_two_spread", "reproduced_best", "slow_spell_ratio",
           "time_blocks"]
