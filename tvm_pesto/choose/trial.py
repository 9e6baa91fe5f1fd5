"""The options of the final choice built, called and timed against each other in blocks
(:func:`choose`); see :mod:`tvm_pesto.choose` for the rules.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np

from ..backends import get_backend, list_backends
from ..errors import error_line
from .claim import FLOW_OPTIONS
from .decision import Decision, OptionResult, Runoff, Spell
from .options import Option, library_call

#: Rough seconds the timing of the options takes in all (blocks of every option, two rounds).
BUDGET_S = 2.0
#: Options measured within this fraction of the fastest are timed again, in a runoff (wide
#: enough for a library's threads caught in a slow spell of a shared machine).
RUNOFF = 0.15
#: Rough seconds the runoff takes in all (blocks of its options, :data:`RUNOFF_ROUNDS` rounds).
RUNOFF_BUDGET_S = 2.0
RUNOFF_ROUNDS = 4
#: Runoffs at most: another when one moved the fastest within :data:`RUNOFF` of an option it left out.
RUNOFF_PASSES = 3
#: A whole-model library option within this fraction of the fastest option is kept.
PREFER_LIBRARY = 0.03
#: An option whose quick calls take this many times the fastest option's, and over
#: :data:`RUNAWAY_MIN_S`, is not timed in blocks: that call is its time.
RUNAWAY = 10.0
RUNAWAY_MIN_S = 0.1
#: An option whose first call takes this many seconds and :data:`RUNAWAY` x the fastest first
#: call is measured by that call (set-up included; an untuned large model: a minute a call), as
#: is a library option's first call over :data:`RUNAWAY` x its prediction (:func:`_runaway_first`).
RUNAWAY_FIRST_S = 10.0
#: Each option is called up to QUICK_CALLS times (within QUICK_S) after its first call; one
#: DROP x the fastest such call, or not among the MAX_LIVE fastest, is closed at once.
QUICK_CALLS, QUICK_S, DROP, MAX_LIVE = 3, 0.2, 1.5, 3
#: Options kept built at once hold about LIVE_COPIES x the model's weights each (the library's
#: own copy and its prepacked or reordered one, the export it was built from), so fewer than
#: MAX_LIVE are kept where that would pass LIVE_BYTES: a ResNet-50 at 224x224 keeps two; a
#: ViT-B/16 or a BERT-base none, each option closed after its quick calls (which measure it,
#: as a dropped one) and the fastest built again.
LIVE_COPIES, LIVE_BYTES = 4, 1 << 30
#: A slow spell of the machine: the probe's two-thread call over its one-thread call above
#: SPELL_RATIO (about 0.55 while both cores run); the probe is asked again up to SPELL_PROBES
#: times, SPELL_PAUSE_S apart, and after the spell the options within SPELL_RANGE x the fastest
#: are timed again (:func:`_after_spell`).
SPELL_RATIO, SPELL_PROBES, SPELL_PAUSE_S, SPELL_RANGE = 0.7, 12, 0.5, 2.0
_sleep = time.sleep  # the pause between probes (tests make it instant)
#: A library option predicted this many times the best library option's prediction is not
#: built, nor one predicted PREDICTED_SLOW_MEASURED x the least quick call of an option built
#: before it (a measured time: the cost model's group predictions on a model it never saw are
#: within 1/3-3x, docs/cost_model.md; building an option of TVM's kernels takes 4-10 s).
PREDICTED_SLOW, PREDICTED_SLOW_MEASURED = 5.0, 3.0
#: An option whose first output differs from TVM's build of the model (REFERENCE) by over
#: this times the output's largest magnitude (at least 1) computes another model: it is left
#: out (a library's fused kernel can be wrong); :data:`REDUCED_TOL` for bfloat16 backends.
#: Where the reference was not built (predicted slow) and the options' outputs differ, it is
#: built for its output alone (:func:`_reference_once`).
NUMERICS_TOL, REDUCED_TOL, REFERENCE = 1e-3, 5e-2, "library:tvm"


def _close(placed, live=()) -> None:
    """Stop ``placed`` and drop its library units from their backends' keeping, so its weights
    can go; not those a ``live`` option also calls (a module of ``PlacementPass`` calls its
    units by their registered names)."""
    with contextlib.suppress(Exception):  # a worker still in a step ends after it; nothing else holds it
        placed.close(timeout=1.0)
    used = {g for p in live for g in (getattr(p, "units", None) or {})}
    for g, unit in (getattr(placed, "units", None) or {}).items():
        if g not in used:
            get_backend(unit.backend).release([g])


def _time(built: dict, inputs, budget_s: float, rounds: int, clock=time.perf_counter) -> dict:
    """:func:`~tvm_pesto.costs.measure.blocks.time_blocks` over the built options, ``budget_s`` in all."""
    # lazy: loads TVM, which importing this module does not
    from ..costs.measure.blocks import time_blocks

    if not built:
        return {}
    per_block = budget_s / (rounds * len(built))
    return time_blocks({n: (lambda p=p: p(*inputs)) for n, p in built.items()}, rounds=rounds,
                       warmup_s=per_block / 3, block_s=per_block * 2 / 3, min_calls=5, max_block_s=per_block, clock=clock)


@dataclass(frozen=True)
class _Seen:
    """What the options' first calls found, by option name (filled in by :func:`_first_calls`).

    Attributes
    ----------
    first_s : dict
        Seconds of the first call.
    call_s : dict
        Least seconds of the quick calls after it.
    outputs : dict
        The first call's output.
    errors : dict
        Why the option did not build or run.
    against : dict
        For an option not built for another's quick calls (:data:`PREDICTED_SLOW_MEASURED`), that one.
    """

    first_s: dict
    call_s: dict
    outputs: dict
    errors: dict
    against: dict = field(default_factory=dict)


def _first_calls(o: Option, flow: bool, build, inputs, clock, seen: _Seen, live):
    """Build option ``o``, make its first call and its quick calls (:func:`_quick`; none for a
    runaway first call, :func:`_runaway_first`); the
    built option, or None with its error noted in ``seen`` (``flow``: the flow's plan, whose
    failure raises; ``live``: the options built so far, :func:`_close`)."""
    first_s, call_s, outputs, errors = seen.first_s, seen.call_s, seen.outputs, seen.errors
    pm = None
    try:
        pm = build(o)
        t0 = clock()
        out = pm(*inputs)  # a library's first call sets it up (ONNX Runtime's: 100x a call)
        first_s[o.name] = clock() - t0
        if out is not None:
            outputs[o.name] = out
        if not _runaway_first(o, first_s):
            call_s[o.name] = _quick(pm, inputs, clock)
        return pm
    except Exception as e:  # noqa: BLE001 - an alternative that does not build or run is reported
        if flow:
            raise
        errors[o.name] = error_line(e)
        first_s.pop(o.name, None)
        if pm is not None:
            _close(pm, live)
        return None


def _runaway_first(o: Option, first_s: dict) -> bool:
    """Whether ``o``'s first call is its time (no quick calls): over :data:`RUNAWAY` x the fastest
    first call and :data:`RUNAWAY_FIRST_S`, or, for a library option, over :data:`RUNAWAY` x the
    fastest first call, :data:`RUNAWAY` x its own prediction and :data:`RUNAWAY_MIN_S` (a
    mispredicted option: ``library:torch+tvm`` on a ResNet-50 at 224x224, predicted 80 ms, took
    2.6 s a call; a quick call would have cost that again). The flow's plans always get quick
    calls: a plan of many units sets each up in its first call."""
    first, fastest = first_s[o.name], min(first_s.values())
    if first > max(RUNAWAY * fastest, RUNAWAY_FIRST_S):
        return True
    return (o.name not in FLOW_OPTIONS and first > max(RUNAWAY * fastest, RUNAWAY_MIN_S)
            and first > RUNAWAY * o.predicted_s)


def _add_blocks(timed: dict, again: dict) -> None:
    """Add the blocks of a later pass (``again``) to each option's, judged by the best of all."""
    for n, r in again.items():
        timed[n]["blocks_s"] += r["blocks_s"]
        timed[n]["calls"] += r["calls"]
        timed[n]["s"] = float(min(timed[n]["blocks_s"]))


def _spell_ratio() -> float | None:
    """The machine's slow-spell probe (:func:`~tvm_pesto.costs.measure.blocks.slow_spell_ratio`)."""
    # lazy: the probe loads ONNX Runtime, which importing this module does not
    from ..costs.measure.blocks import slow_spell_ratio

    return slow_spell_ratio()


def _after_spell(timed: dict, built: dict, skip: set, inputs, clock) -> Spell | None:
    """Once the options are timed, whether the machine was in a slow spell (the probe's
    two-thread call over :data:`SPELL_RATIO` x its one-thread call: a library's threads then
    run up to twice as slow, and a one-thread option wins what it loses afterwards); if so,
    the probe is asked again, :data:`SPELL_PAUSE_S` apart, up to :data:`SPELL_PROBES` times,
    and once the spell is over every option within :data:`SPELL_RANGE` x the fastest (not
    ``skip``ped, still built) is timed again and judged by its best block over every pass.
    None when the probe saw no spell (or the process has one core); else the probe's ratios,
    whether the spell ended and what was timed again."""
    ratio = _spell_ratio()
    if ratio is None or ratio <= SPELL_RATIO:
        return None
    seen = [ratio]
    while len(seen) <= SPELL_PROBES and seen[-1] > SPELL_RATIO:
        _sleep(SPELL_PAUSE_S)
        seen.append(_spell_ratio() or 0.0)
    out = Spell([round(r, 3) for r in seen], ended=seen[-1] <= SPELL_RATIO)
    if out.ended:
        fastest = min(timed[n]["s"] for n in timed)
        again = [n for n in timed if n in built and n not in skip and timed[n]["s"] <= SPELL_RANGE * fastest]
        _add_blocks(timed, _time({n: built[n] for n in again}, inputs, RUNOFF_BUDGET_S, rounds=RUNOFF_ROUNDS,
                                 clock=clock))
        out.timed_again = again
    return out


def _quick(placed, inputs, clock) -> float:
    """The least of :data:`QUICK_CALLS` calls (fewer past :data:`QUICK_S`): an option's speed
    before its blocks, past a library's first calls."""
    best, t_start = float("inf"), clock()
    for _ in range(QUICK_CALLS):
        t0 = clock()
        placed(*inputs)
        best = min(best, clock() - t0)
        if clock() - t_start > QUICK_S:
            break
    return best


def _predicted_runaway(option: Option, seen: _Seen, best_predicted: float) -> str | None:
    """Why ``option`` is not built or run at all (None: it is): see the module docstring."""
    if option.name in FLOW_OPTIONS:
        return None
    if option.predicted_s >= PREDICTED_SLOW * best_predicted > 0:
        return (f"not run: predicted {option.predicted_s:.3g} s a call, {option.predicted_s / best_predicted:.0f}x "
                f"the best library option's prediction ({best_predicted:.3g} s)")
    call_s = seen.call_s  # the flow's plan always has quick calls: every library option is weighed by them
    if call_s and option.predicted_s >= PREDICTED_SLOW_MEASURED * (least := min(call_s.values())) > 0:
        name = seen.against[option.name] = min(call_s, key=call_s.get)
        return (f"not run: predicted {option.predicted_s:.3g} s a call, {option.predicted_s / least:.1f}x what {name} "
                f"measured ({least:.3g} s)")
    return None


def live_limit(weight_bytes: int) -> int:
    """Options kept built at once for a model of ``weight_bytes`` of weights (:data:`LIVE_BYTES`).

    Examples
    --------
    >>> live_limit(5 << 20), live_limit(100 << 20), live_limit(200 << 20), live_limit(350 << 20)
    (3, 2, 1, 0)
    """
    return max(0, min(MAX_LIVE, LIVE_BYTES // max(1, LIVE_COPIES * int(weight_bytes))))


def _threads(option: Option) -> int:
    """The threads an option's devices run (their cores)."""
    return sum(int(getattr(d, "cores", 0) or 0) for d in option.cluster.devices)


def _parallel_mode(option: Option) -> bool:
    """Whether a unit of ``option`` runs its library in a parallel execution mode (ONNX
    Runtime's ``onnxruntime-parallel``: an inter-op thread pool beside the library's default,
    sequential call)."""
    names = {u.backend for u in getattr(option.placement.plan, "units", None) or []}
    if option.name.startswith("library:"):
        names.add(option.name.split(":", 1)[1].split(" ", 1)[0].removesuffix("+tvm"))
    known = set(list_backends())  # tests' stand-ins name none
    return any(getattr(get_backend(n), "parallel", False) for n in names & known)


def _tie_break(opts: list[Option], timed: dict, ran: list[str], best: str) -> tuple[str, str | None]:
    """The option kept among the runoff's within :data:`PREFER_LIBRARY` of the fastest
    (``best``), a difference a shared machine does not tell apart: a whole-model library call
    before a plan of several units (the user's own call), then the fewest threads (a core left
    to the rest of the machine), then the library's sequential call before its parallel
    execution mode (its default call, with no inter-op pool to schedule), then the fastest.
    Returns it and why, where it is not ``best``."""
    by = {o.name: o for o in opts}
    near = [n for n in ran if timed[n]["s"] <= timed[best]["s"] * (1 + PREFER_LIBRARY)]
    rank = {n: (not library_call(by[n]), _threads(by[n]), _parallel_mode(by[n])) for n in dict.fromkeys([best, *near])}
    kept = min(rank, key=lambda n: (*rank[n], timed[n]["s"]))
    if kept == best:
        return best, None
    why = f"{kept} is within {PREFER_LIBRARY:.0%} of {best} ({timed[kept]['s'] / timed[best]['s'] - 1:+.1%}): "
    if not library_call(by[best]):
        return kept, why + "the library call is kept"
    if _threads(by[kept]) < _threads(by[best]):
        return kept, why + f"the call on fewer threads is kept ({_threads(by[kept])} against {_threads(by[best])})"
    return kept, why + "the sequential call is kept over the parallel execution mode"


def _weight_bytes(opts: list[Option]) -> int:
    """The model's weights in bytes (0 where the options carry no analysis: tests' stand-ins)."""
    analysis = getattr(opts[0].placement, "analysis", None) if opts else None
    return sum(n.param_bytes for n in analysis.op_graph.nodes) if analysis is not None else 0


@dataclass
class _Turn:
    """The options built and called in turn (:func:`choose`'s first half): each built, its
    first and quick calls made, and closed at once where it cannot win (:data:`DROP`,
    :func:`live_limit`); what it finds goes into ``seen``, ``built``, ``skipped`` and ``dropped``."""

    opts: list
    build: object
    inputs: list
    clock: object
    seen: _Seen
    built: dict
    skipped: dict
    dropped: set
    best_library: float
    keep: int
    progress: object = None

    def run(self, order: list[Option], flow_first: bool) -> None:
        """Build and call the options of ``order`` (the first the flow's plan where
        ``flow_first``: its failure raises); ``built`` is left in the options' order."""
        built, call_s = self.built, self.seen.call_s
        for k, o in enumerate(order):
            if self.progress:
                self.progress(k + 1, len(order))
            why = _predicted_runaway(o, self.seen, self.best_library)
            if why:
                self.skipped[o.name] = why
                continue
            pm = _first_calls(o, flow_first and k == 0, self.build, self.inputs, self.clock, self.seen, built.values())
            if pm is None:
                continue
            built[o.name], pm = pm, None  # held by ``built`` alone: one closed below frees its weights now,
            # not after the next option is built beside it
            live = sorted((n for n in built if n in call_s), key=call_s.get)
            for n in [n for n in live[self.keep:]] + [n for n in live[:self.keep] if call_s[n] > DROP * call_s[live[0]]]:
                self.dropped.add(n)  # not kept unless all faster ones fail: closed now, as a large model's options
                _close(built.pop(n), built.values())  # hold its weights each
        ordered = {o.name: built[o.name] for o in self.opts if o.name in built}  # reported in the options' order
        built.clear()
        built.update(ordered)

    def leave_out_wrong(self) -> set:
        """Leave out the options that compute another model (:func:`wrong_numerics`, their
        errors noted, closed); their names."""
        seen, built = self.seen, self.built
        wrong = wrong_numerics(self.opts, seen.outputs)
        for name, why in wrong.items():  # reported, never kept: not the model
            seen.errors[name] = why
            seen.first_s.pop(name, None), seen.call_s.pop(name, None), self.dropped.discard(name)
            seen.outputs.pop(name, None)
            _close(built.pop(name), built.values()) if name in built else None
        return set(wrong)


def choose(opts: list[Option], build, inputs, budget_s: float = BUDGET_S, progress=None,
           clock=time.perf_counter, probe_spell: bool = True):
    """Build every option, time them in blocks, return ``(placed, decision)`` for the fastest.

    ``build(option) -> PlacedModule``. Runaways (:data:`RUNAWAY`) are not run (``skipped``)
    or are measured by their first or quick calls (``timed_once``), as are options
    :data:`DROP` x the fastest quick calls or behind :data:`MAX_LIVE` faster ones (fewer for a
    model of large weights, :func:`live_limit`; closed as soon as they are); options within :data:`RUNOFF` of the fastest run off
    (``decision.runoff``, up to :data:`RUNOFF_PASSES` times). An option
    that fails to build or to run, or computes another model (:func:`wrong_numerics`), is
    reported with its error and left out; the flow's plan failing to build or run raises.
    ``clock`` gives the seconds each timing reads (a fake one in tests). With ``probe_spell``
    the machine is asked whether it is in a slow spell once the options are timed
    (:func:`_after_spell`; ``decision.spell``). The decision has no
    claim yet: :func:`~tvm_pesto.choose.claim.certify_kept` gives it.
    """
    built, errors, first_s, call_s, skipped, outputs, dropped = {}, {}, {}, {}, {}, {}, set()
    # a library option's prediction is its measured whole-model call, the flow's a simulation
    # (an ONNX file's MobileNetV3: predicted 0.017 ms, measured 0.103): libraries are weighed
    # against the best library option's prediction
    best_library = min([o.predicted_s for o in opts if o.name not in FLOW_OPTIONS and not o.name.endswith("+tvm")]
                       or [o.predicted_s for o in opts])
    seen = _Seen(first_s, call_s, outputs, errors)
    turn = _Turn(opts, build, inputs, clock, seen, built, skipped, dropped, best_library, live_limit(_weight_bytes(opts)),
                 progress)
    # the flow's plan, its one-device plan, then the libraries by prediction (the fastest measured early)
    turn.run(opts[:1] + sorted(opts[1:], key=lambda o: (o.name not in FLOW_OPTIONS, o.predicted_s)), flow_first=True)
    _reference_once(opts, build, inputs, seen, skipped, built.values())
    wrong = turn.leave_out_wrong()
    # an option left unbuilt for what a wrong one measured is weighed again without it
    again = [o for o in opts if o.name in skipped and seen.against.get(o.name) in wrong]
    if again:
        for o in again:
            del skipped[o.name]
        turn.run(again, flow_first=False)
        turn.leave_out_wrong()
    once = set(first_s) - set(call_s)
    slow = dropped | {n for n, t in call_s.items() if t > max(RUNAWAY * min(call_s.values()), RUNAWAY_MIN_S)}
    timed = _time({n: p for n, p in built.items() if n not in slow | once}, inputs, budget_s, rounds=2, clock=clock)
    timed.update({n: {"s": call_s[n], "blocks_s": [call_s[n]], "calls": 1} for n in slow})
    timed.update({n: {"s": first_s[n], "blocks_s": [first_s[n]], "calls": 1} for n in once})
    best, ran = min(timed, key=lambda n: timed[n]["s"]), []
    for _ in range(RUNOFF_PASSES):  # again while a runoff moved the best near an option not in it
        close = [n for n in timed if timed[n]["s"] <= timed[best]["s"] * (1 + RUNOFF) and n not in slow | once]
        if len(close) < 2 or set(close) <= set(ran):
            break
        _add_blocks(timed, _time({n: built[n] for n in close}, inputs, RUNOFF_BUDGET_S, rounds=RUNOFF_ROUNDS,
                                 clock=clock))
        ran += [n for n in close if n not in ran]
        best = min(timed, key=lambda n: timed[n]["s"])
    spell = _after_spell(timed, built, slow | once, inputs, clock) if probe_spell else None
    best = min(timed, key=lambda n: timed[n]["s"])
    runoff = None
    if ran:
        runoff = Runoff(ran, len(timed[best]["blocks_s"]))
        best, runoff.library_kept = _tie_break(opts, timed, ran, best)
    for n, p in built.items():
        if n != best:
            _close(p, [built[best]] if best in built else [])
    if best not in built:  # closed early (DROP) and fastest after all: an option found wrong, or slower in blocks
        built[best] = build(next(o for o in opts if o.name == best))
    results = []
    for o in opts:
        rec = OptionResult(o.name, o.cluster.name, o.predicted_s, devices=o.cluster.num_devices,
                           cores=[d.cores for d in o.cluster.devices], backend_mix=o.placement.backend_mix)
        if o.name in timed:
            rec.measured_s = timed[o.name]["s"]
            if o.name in slow | once:  # its quick calls (over DROP or RUNAWAY x the fastest), or its first
                rec.timed_once = "first call" if o.name in once else "quick calls"
        elif o.name in skipped:
            rec.skipped = skipped[o.name]
        else:
            rec.error = errors.get(o.name, "not built")
        results.append(rec)
    pred = {o.name: o.predicted_s for o in opts if o.name in ("plan", "one-device")}
    shape = opts[[o.name for o in opts].index(min(pred, key=pred.get))].cluster.name
    decision = Decision(measured=True, chosen=best, shape=shape, options=results, runoff=runoff, spell=spell)
    return built[best], decision


def _tolerance(o: Option, scale: float) -> float:
    """The largest difference ``o``'s output may have from the reference's."""
    return (REDUCED_TOL if any(b.endswith("-bf16") for b in o.placement.backend_mix) else NUMERICS_TOL) * scale


def _scale(out) -> float:
    """The output's largest magnitude, at least 1."""
    return max([1.0] + [float(np.abs(np.asarray(a, np.float64)).max()) for a in (out if isinstance(out, tuple) else (out,))
                        if np.size(a)])


def wrong_numerics(opts: list[Option], outputs: dict, reference: str = REFERENCE) -> dict:
    """Option name -> why it is left out, for each option whose first output is not within
    :data:`NUMERICS_TOL` (:data:`REDUCED_TOL` with a ``-bf16`` backend) of ``reference``'s
    (``library:tvm``: TVM's build of the model); nothing without that output."""
    # lazy: loads TVM, which importing this module does not
    from ..run.thread.executor import max_abs_err, to_numpy

    if reference not in outputs:
        return {}
    ref = to_numpy(outputs[reference])
    scale, out = _scale(ref), {}
    for o in opts:
        if o.name in outputs and o.name != reference:
            tol, err = _tolerance(o, scale), max_abs_err(to_numpy(outputs[o.name]), ref)
            if not err <= tol:  # NaN too
                out[o.name] = f"wrong numerics: max abs err {err:.3g} against TVM's build of the model (over {tol:.3g})"
    return out


def _libraries(o: Option) -> set:
    """The libraries ``o`` calls (``onnxruntime-parallel`` and ``openvino-bf16`` are their libraries')."""
    return {b.split("-")[0] for b in o.placement.backend_mix}


def outputs_agree(opts: list[Option], outputs: dict) -> bool:
    """Whether every option's first output is within tolerance (:func:`wrong_numerics`'s, the
    looser of the two options') of the first one's, and two of them share no library: then
    no option computes another model unless two libraries compute the same wrong one, and
    TVM's build need not be made to tell which. One output alone, or options that all call
    one library (the flow's plan and the one-device plan both OpenVINO's whole model), are
    not confirmed."""
    # lazy: loads TVM, which importing this module does not
    from ..run.thread.executor import max_abs_err, to_numpy

    have = [o for o in opts if o.name in outputs]
    if not any(_libraries(a).isdisjoint(_libraries(b)) for k, a in enumerate(have) for b in have[k + 1:]):
        return False
    first = to_numpy(outputs[have[0].name])
    scale = _scale(first)
    return all(max_abs_err(to_numpy(outputs[o.name]), first) <= max(_tolerance(o, scale), _tolerance(have[0], scale))
               for o in have[1:])


def _reference_once(opts: list[Option], build, inputs, seen: _Seen, skipped: dict, live) -> None:
    """Where TVM's build of the model (:data:`REFERENCE`) was not built for its prediction and
    the options' outputs are not confirmed (:func:`outputs_agree`), build it and call it once
    for its output alone, then close it; its entry says so."""
    ref = next((o for o in opts if o.name == REFERENCE), None)
    if (ref is None or not seen.outputs or REFERENCE in seen.outputs or REFERENCE in seen.errors
            or outputs_agree(opts, seen.outputs)):
        return
    why = "the options' outputs are not confirmed by two libraries"
    if ref.predicted_s > RUNAWAY_FIRST_S / RUNAWAY:
        skipped[REFERENCE] = skipped.get(REFERENCE, "not run") + (
            f"; {why}, but a call of it, predicted {ref.predicted_s:.3g} s, is not made to check them")
        return
    pm = None
    try:
        pm = build(ref)
        seen.outputs[REFERENCE] = pm(*inputs)
        skipped[REFERENCE] = skipped.get(REFERENCE, "not run") + f"; {why}: built and called once as the numerics reference"
    except Exception as e:  # noqa: BLE001 - no reference: the options are not checked, and the entry says why
        skipped[REFERENCE] = skipped.get(REFERENCE, "not run") + f"; the numerics reference failed: {error_line(e)}"
    finally:
        if pm is not None:
            _close(pm, live)


__all__ = ["BUDGET_S", "DROP", "SPELL_PAUSE_S", "SPELL_PROBES", "SPELL_RANGE", "SPELL_RATIO", "LIVE_BYTES", "LIVE_COPIES", "MAX_LIVE", "NUMERICS_TOL", "PREDICTED_SLOW", "PREDICTED_SLOW_MEASURED", "PREFER_LIBRARY", "QUICK_CALLS", "REFERENCE",
           "QUICK_S", "REDUCED_TOL", "RUNAWAY", "RUNAWAY_FIRST_S", "RUNAWAY_MIN_S", "RUNOFF", "RUNOFF_BUDGET_S",
           "RUNOFF_PASSES", "RUNOFF_ROUNDS", "choose", "live_limit", "outputs_agree", "wrong_numerics"]
