"""Timing against reference kernels: a function's time as its ratio to a fixed kernel timed
in alternating bursts next to it, scaled by that kernel's mean time in this process.

Why: a CPU shared with other jobs changes speed under the timer, in levels that can last from
a fraction of a second to seconds (``python -m tvm_pesto_lab.timing_noise states`` shows them
on a machine). A function timed back to back (``repeat`` x ``min_repeat_ms``) lands in one of
them, so the same fused groups timed in separate passes differ per group. Timed in bursts of
about a millisecond alternating with a reference kernel, the function and the reference share
the state and their ratio does not; the mean of the reference's bursts (over the batch and
every earlier batch of the process on that device, so over many states) turns the ratio back
into seconds of the machine's typical state (``python -m tvm_pesto_lab.timing_noise groups``
compares both ways; docs/cost_model.md, "What is predicted"). What it cannot remove: phases of
minutes in which some kernels slow down and the references do not.

The references are ``exp`` loops and square matmuls of :data:`REFERENCES` elements,
compiled into the measured module by the caller (:func:`reference_functions`); each
function is paired with the reference nearest to it in time, and every timing adds one burst
of the next reference in turn, so each reference's bursts span the whole batch. The first
timer of a device in a process samples the references alone for :data:`WARM_S` first.

Examples
--------
>>> from tvm_pesto.costs.measure.interleave import reference_names
>>> reference_names()[:2]
['pesto_ref_exp_256', 'pesto_ref_exp_4096']
"""
from __future__ import annotations

import collections
import math
import time

import numpy as np
import tvm
from tvm import relax

#: Reference kernels: ``exp`` over these many float32 elements and square matmuls of these
#: many elements (8x8 to 128x128), spanning about three orders of magnitude of time, so a
#: function is paired with a reference of about its own length.
REFERENCES = {"exp": (256, 4096, 65536, 262144), "matmul": (64, 576, 4096, 16384)}
REF_PREFIX = "pesto_ref_"
#: (device key, reference name) -> seconds per call of its bursts in this process (the last
#: :data:`HISTORY_LEN`).
_HISTORY: dict = {}
HISTORY_LEN = 20000
_WARMED: set = set()  # device keys whose first timer sampled the references alone
#: Seconds the first timer of a device in a process spends timing the references alone.
WARM_S = 1.5
#: Shortest burst: short against a speed state, so a function's burst and its reference's share one.
MIN_BURST_S = 1e-3


def _ref_func(name: str, n: int, kind: str) -> relax.Function:
    x = relax.Var("x", relax.TensorType((n,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function(name, [x]):
        with bb.dataflow():
            if kind == "exp":
                y = bb.emit_output(relax.op.exp(x))
            else:
                side = math.isqrt(n)
                a = bb.emit(relax.op.reshape(x, (side, side)))
                y = bb.emit_output(relax.op.matmul(a, a))
        bb.emit_func_output(y)
    return bb.get()[name].with_attr("global_symbol", name)


def _elements(name: str) -> int:
    return int(name.rsplit("_", 1)[1])


def reference_names() -> list:
    """Names of the reference kernels (``pesto_ref_<kind>_<elements>``)."""
    return [f"{REF_PREFIX}{kind}_{n}" for kind, sizes in REFERENCES.items() for n in sizes]


def reference_functions() -> dict:
    """``name -> relax.Function`` of the reference kernels, to add to the measured module."""
    return {name: _ref_func(name, _elements(name), name[len(REF_PREFIX):].split("_")[0])
            for name in reference_names()}


def trimmed_mean(values, cut: float = 0.05) -> float:
    """Mean of ``values`` without the lowest and highest ``cut`` share (stray bursts).

    >>> trimmed_mean([1.0] * 18 + [0.0, 100.0])
    1.0
    """
    v = np.sort(np.asarray(values, dtype=float))
    k = int(len(v) * cut)
    return float(np.mean(v[k:len(v) - k] if len(v) > 2 * k else v))


def burst_seconds(min_repeat_ms: float) -> float:
    """Length of one burst for a caller's ``min_repeat_ms`` (a fifth of it, at least
    :data:`MIN_BURST_S`): the same measuring time as before in ``repeat`` pairs."""
    return max(float(min_repeat_ms) / 5e3, MIN_BURST_S)


class ReferenceTimer:
    """Times functions of one VM in bursts alternating with the nearest reference kernel.

    Parameters
    ----------
    vm : relax.VirtualMachine
        Built from a module holding :func:`reference_functions`.
    dev : tvm.runtime.Device
    rounds : int
        Bursts of the function per measurement (each between two reference bursts).
    burst_s : float
        Seconds one burst lasts at least.
    key : str, optional
        The device's cache key: timers of one process with the same key share each
        reference's bursts, so all their results are in the same units.

    Examples
    --------
    >>> import numpy as np
    >>> x = relax.Var("x", relax.TensorType((4096,), "float32"))
    >>> bb = relax.BlockBuilder()
    >>> with bb.function("g0", [x]):      # the function timed
    ...     _ = bb.emit_func_output(bb.emit(relax.op.tanh(x)))
    >>> funcs = dict(reference_functions(), g0=bb.get()["g0"].with_attr("global_symbol", "g0"))
    >>> tgt = tvm.target.Target({"kind": "llvm"})
    >>> ex = tvm.compile(tvm.IRModule(funcs), target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    >>> dev = tvm.cpu()
    >>> vm = relax.VirtualMachine(ex, dev)
    >>> args = [tvm.runtime.tensor(np.ones(4096, "float32"), device=dev)]
    >>> _ = vm["g0"](*args)   # warmed up
    >>> timer = ReferenceTimer(vm, dev, rounds=5)
    >>> i = timer.time("g0", args)
    >>> seconds = timer.results()[i]      # seconds per call, one per round
    >>> len(seconds), min(seconds) > 0
    (5, True)
    """

    def __init__(self, vm, dev, rounds: int = 5, burst_s: float = MIN_BURST_S, key: str | None = None):
        self.vm, self.dev, self.key = vm, dev, key
        self.rounds, self.burst_s = max(int(rounds), 1), max(float(burst_s), 1e-5)
        rng = np.random.default_rng(0)
        self._refs: dict = {}  # name -> (args, evaluator, seconds per call estimated)
        self._samples: dict = {}  # name -> seconds per call of every burst
        for name in reference_names():
            args = [tvm.runtime.tensor(rng.uniform(-1, 1, _elements(name)).astype("float32"), device=dev)]
            vm[name](*args)
            est = self._estimate(name, args)
            self._refs[name] = (args, self._evaluator(name, est), est)
            self._samples[name] = [float(self._refs[name][1](*args).results[0])]
        self._timed: list = []  # (reference name, ratios)
        self._norm: dict | None = None  # reference seconds the results use, fixed by results()
        if key is not None and key not in _WARMED:
            self._sample_references()
            _WARMED.add(key)

    def _sample_references(self) -> None:
        """The first timer of a device in this process times the references in turn for
        :data:`WARM_S`: a state can last seconds, and the first batch (often under a second)
        would otherwise take its units from whatever state it fell in."""
        names, t0, i = list(self._refs), time.perf_counter(), 0
        while time.perf_counter() - t0 < WARM_S:
            args, fun, _ = self._refs[names[i % len(names)]]
            self._samples[names[i % len(names)]].append(float(fun(*args).results[0]))
            i += 1

    def _estimate(self, fname, args) -> float:
        f = self.vm.time_evaluator(fname, self.dev, number=1, repeat=1, min_repeat_ms=max(1, round(self.burst_s * 1e3)))
        return max(float(f(*args).results[0]), 1e-9)

    def _evaluator(self, fname, est: float):
        number = max(1, math.ceil(self.burst_s / est))
        return self.vm.time_evaluator(fname, self.dev, number=number, repeat=1)

    def nearest_reference(self, seconds: float) -> str:
        """The reference whose call time is nearest ``seconds`` (in ratio)."""
        return min(self._refs, key=lambda r: abs(math.log(self._refs[r][2] / max(seconds, 1e-12))))

    def time(self, fname: str, args) -> int:
        """Time ``fname`` (already warmed up) and return its index in :meth:`results`."""
        est = self._estimate(fname, args)
        ref = self.nearest_reference(est)
        rargs, rfun, _ = self._refs[ref]
        ffun = self._evaluator(fname, est)
        rs = [float(rfun(*rargs).results[0])]
        ratios = []
        for _ in range(self.rounds):
            t = float(ffun(*args).results[0])
            rs.append(float(rfun(*rargs).results[0]))
            ratios.append(t / (0.5 * (rs[-2] + rs[-1])))
        self._samples[ref].extend(rs)
        # one burst of the next reference in turn: every reference's samples span the batch,
        # so its median is not that of the state its own functions happened to run in
        spare = list(self._refs)[len(self._timed) % len(self._refs)]
        sargs, sfun, _ = self._refs[spare]
        self._samples[spare].append(float(sfun(*sargs).results[0]))
        self._timed.append((ref, ratios))
        return len(self._timed) - 1

    def reference_seconds(self) -> dict:
        """``reference name -> seconds per call``: the :func:`trimmed_mean` of its bursts in
        this batch and, for a timer with a ``key``, in every earlier batch of this process on
        that device (a batch of a second or two may sit in one state: the median of the batch
        alone moved the same groups' sums by 10-25 % between passes). A mean, not a median:
        with two states near half and half, a median jumps from one to the other."""
        out = {}
        for r, s in self._samples.items():
            hist = list(_HISTORY.get((self.key, r), ())) if self.key is not None else []
            if s or hist:
                out[r] = trimmed_mean(hist + s)
        return out

    def _remember(self) -> None:
        if self.key is None:
            return
        for r, s in self._samples.items():
            _HISTORY.setdefault((self.key, r), collections.deque(maxlen=HISTORY_LEN)).extend(s)

    def results(self) -> list:
        """Per timed function (in order): its seconds per call, one value per round (the
        ratio to its reference times :meth:`reference_seconds`). The first call fixes the
        units and adds the batch's bursts to the process's history, so time every function
        of the batch before it."""
        if self._norm is None:  # once: the batch's bursts then join the process's history
            self._norm = self.reference_seconds()
            self._remember()
        return [[r * self._norm[ref] for r in ratios] for ref, ratios in self._timed]

    def describe(self, i: int) -> dict:
        """What a cache record of timed function ``i`` notes about how it was timed."""
        ref, ratios = self._timed[i]
        if self._norm is None:
            self.results()
        return {"method": "interleaved", "reference": ref, "reference_s": self._norm[ref],
                "ratios": [float(r) for r in ratios]}


__all__ = ["MIN_BURST_S", "REFERENCES", "REF_PREFIX", "ReferenceTimer", "burst_seconds", "reference_functions",
           "reference_names", "trimmed_mean"]
