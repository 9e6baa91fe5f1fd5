"""``tvm-pesto bench backends``: single backends vs Collage-DP vs the joint solve vs ``build``, measured.

For every zoo model (or the models named: zoo names or model files), through the one flow
(:mod:`tvm_pesto.api`: candidates -> measured costs -> :func:`~tvm_pesto.api.place_from_costs`,
the split decision off -> builder -> executor): each backend alone on one CPU device (its
whole-model call, as its users run it; where it has none, its cheapest cover with TVM for the
ops it lacks), Collage's cover alone on one device (the backend-mix effect), the joint solve
(backend + device + order, ``ilp``) on one and on two CPU devices, and ``pesto``: what
:func:`tvm_pesto.build` returns on ``cpu:2`` with measured costs (the default solver and the
final measured choice of :mod:`tvm_pesto.choose`), the model a user gets. All variants are
built in this process and timed in blocks (:func:`tvm_pesto.costs.measure.blocks.time_blocks`: a
warm-up, then calls for a fixed time, the median kept; the order rotates every round; a
variant's time is its best block median): single calls of two libraries interleaved would
time one library's idle threads inside the other's call. Every variant is called on numpy
arrays, as a user calls a model, and its output compared with the TVM-only single-device build.
Beside the timings, :func:`ceilings` says how much any plan of these candidates could gain on
the measured costs: the mix with every library call's fixed cost free, the joint solve with
free communication between the devices.

Examples
--------
Not run as a doctest: it builds and times every variant, which takes minutes.

>>> from tvm_pesto.bench.backends import bench_backends          # doctest: +SKIP
>>> res = bench_backends(["mlp_mixer"], size="small")             # doctest: +SKIP
>>> res["geomean_speedup_vs_best_single"]                          # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
import os
import time

import numpy as np

from ..cluster.contention import measure_contention
from ..cluster.ideal import free_communication
from ..cluster.linkbench import measure_links as _measure
from ..costs import candidate_costs
from ..errors import PestoError
from ..costs.measure.blocks import time_blocks
from ..solve.joint.ceiling import alone, mix_ceiling
from .report import AGREE, geomean, machine_info, timing_noise

#: Blocks per variant, the order of the variants rotated between them.
ROUNDS = 3


def quiet_openmp() -> None:
    """Ask the thread pools of PyTorch (OpenMP) and TVM to sleep instead of spinning when idle.

    Only effective before torch is first imported and before TVM first runs a parallel
    kernel in a thread; spinning workers of one variant would take cores from the variant
    timed next and from the other device.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")


def _reference(zm) -> np.ndarray:
    """Output of the plain TVM build of the whole module on one CPU device."""
    import tvm
    from tvm import relax

    tgt = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(zm.mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    vm = relax.VirtualMachine(ex, tvm.cpu(0))
    out = vm["main"](*[tvm.runtime.tensor(a) for a in zm.example_inputs])
    return _flat_numpy(out)


def _flat_numpy(out) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, np.ndarray):
        return [out]
    res = []
    for o in out:
        res.extend(_flat_numpy(o))
    return res


def bench_clusters(measure_links: bool = True):
    """``cpu:1`` and ``cpu:2`` of this machine; ``cpu:2``'s links measured with the
    executor's own hand-off, its devices' contention and the executor's dispatch per run
    (``tvm-pesto cluster bench``), so the 2-device predictions include real synchronisation
    costs and the slowdown of two devices computing at once."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ..api import as_cluster

    c1, c2 = as_cluster("cpu:1"), as_cluster("cpu:2")
    if measure_links and c2.num_devices > 1:
        # lazy: loads TVM, which importing this module does not
        from ..costs.calibrate.dispatch import measure_dispatch

        _measure(c2)
        measure_contention(c2)
        measure_dispatch(c2)  # after the links: it subtracts their latency
    return c1, c2


def _variant(costed, table, solver: str, time_limit_s: float, search_s: float):
    """Solve one variant of the benchmark: the flow's solve of ``costed``
    (:func:`tvm_pesto.api.place_from_costs`) on ``table`` instead of its costs where given,
    without the split decision (the benchmark weighs the 1- and 2-device plans itself)."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ..api import place_from_costs

    if table is not None:
        costed = dataclasses.replace(costed, costs=dataclasses.replace(costed.costs, table=table))
    pl = place_from_costs(costed, solver, time_limit_s=time_limit_s, search_s=search_s, split_margin=0.0)
    return pl.plan, float(pl.sim.run_s)  # the schedule plus the executor's dispatch


@dataclass(frozen=True)
class BackendsBenchSettings:
    """How :func:`bench_model` solves, picks and times a model's variants.

    Attributes
    ----------
    rounds : int
        Timed blocks per variant.
    time_limit_s : float
        Each solve's time limit.
    search_s : float
        Seconds of the joint search after each solve.
    select_by : {"measured", "predicted"}
        How ``joint_s`` picks between the 1- and 2-device joint results: the faster in a
        separate short timing of the two (not reused for the reported numbers), or the
        lower simulated makespan.
    """

    rounds: int = ROUNDS
    time_limit_s: float = 30.0
    search_s: float = 5.0
    select_by: str = "measured"


def bench_model(name: str, size: str = "small", backends=None, cache=None,
                settings: BackendsBenchSettings = BackendsBenchSettings(), progress=None, clusters=None,
                call_s: dict | None = None) -> dict:
    """Benchmark one model (a zoo name or a model file, :func:`tvm_pesto.models.load_model`)
    as ``settings`` say; see the module docstring for what is measured. ``call_s``: each
    backend's fixed cost per call on ``cpu:1`` (:func:`call_costs`; measured here when not given).
    """
    # lazy: loads TVM's compiler and PyTorch, which importing this module does not
    from .. import api
    from ..models import load_model

    def say(msg):
        if progress:
            progress(msg)

    rounds, time_limit_s, search_s = settings.rounds, settings.time_limit_s, settings.search_s
    zm = load_model(name, size)
    ref = _reference(zm)
    c1, c2 = clusters if clusters is not None else bench_clusters()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    analysis = api.analyze(zm.mod)
    cs = api.make_candidates(analysis, c2, backends if backends is not None else "all")
    say(f"{name}: {len(cs)} candidates, measured on cpu:1 and cpu:2")
    ct1 = candidate_costs(cs, c1, "measured", cache=cache)
    ct2 = candidate_costs(cs, c2, "measured", cache=cache)
    measure_s = time.perf_counter() - t0
    costed1, costed2 = api.CostedCandidates(analysis, c1, cs, ct1), api.CostedCandidates(analysis, c2, cs, ct2)
    variants = _solve_variants(name, costed1, costed2, time_limit_s, search_s, say)
    placed, errs, failed, fns = _build_variants(variants, analysis, zm, ref)
    say(f"{name}: tvm_pesto.build on cpu:2 (measured costs, final choice)")
    pesto = _build_pesto(zm, c2, backends, cache, ref)
    if "error" in pesto:
        failed["pesto"] = pesto["error"]
    else:
        placed["pesto"], fns["pesto"], errs["pesto"] = pesto.pop("placed"), pesto.pop("call"), pesto["max_abs_err"]
    predicted, predicted_key, joint_key, select = _choose_joint(variants, fns, settings.select_by)
    say(f"{name}: ceilings (free boundaries on one device, free communication on two)")
    call_s = call_s if call_s is not None else call_costs(c1, backends, cache)
    ceiling = ceilings(costed1, costed2, predicted, call_s, time_limit_s, search_s)
    say(f"{name}: timing {len(placed)} variants in blocks, {rounds} rounds")
    load_timed = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    timed = _time_and_release(fns, placed, rounds)
    med = {k: v["s"] for k, v in timed.items()}
    single_s = {k.split(":", 1)[1]: med[k] for k in med if k.startswith("single:")}
    best_b = min(single_s, key=single_s.get) if single_s else None
    plans = {k: plan for k, (_, (plan, _)) in variants.items()}
    res = {
        "num_ops": analysis.op_graph.num_nodes,
        "single_s": single_s,
        **{f"{b}_s": s for b, s in single_s.items()},
        "best_single_backend": best_b,
        "best_single_s": single_s.get(best_b) if best_b else None,
        "collage_dp_s": med.get("collage_dp"),
        "joint_1dev_s": med.get("joint_1dev"),
        "joint_2dev_s": med.get("joint_2dev"),
        "joint_choice": joint_key,
        "joint_choice_by": settings.select_by,
        "joint_choice_predicted": predicted_key,
        "joint_s": med.get(joint_key),
        "joint_predicted_choice_s": med.get(predicted_key),
        "pesto_s": med.get("pesto"),
        "pesto": pesto,
        "selection_times_s": select,
        "predicted_s": predicted,
        "ceiling": ceiling,
        "search_s": {k: p.solve_s for k, p in plans.items()},
        "backend_mix": {k: p.backend_mix() for k, p in plans.items()},
        "solver_status": {k: api.solver_status(plans[k]) for k in ("joint_1dev", "joint_2dev")},
        "joint_ilp": {k: plans[k].info.get("joint_ilp") for k in ("joint_1dev", "joint_2dev")},
        "max_abs_err_per_variant": errs,
        "max_abs_err": max(errs.values()) if errs else None,
        "candidates": len(cs),
        "candidates_by_backend": cs.by_backend(),
        "measured_this_run": ct1.measured + ct2.measured,
        "cached": ct1.cached + ct2.cached,
        "infeasible": len(ct1.infeasible) + len(ct2.infeasible),
        "measure_s": measure_s,
        "unavailable": dict(cs.unavailable),
        "failed_builds": failed,
        "same_cover_as_best_single": {k: _cover(plans[k]) == _cover(plans[f"single:{best_b}"])
                                      for k in ("collage_dp", "joint_1dev", "joint_2dev")} if best_b else {},
        "devices_used": {k: p.devices_used() for k, p in plans.items()},
        "load_avg_1min": [load_before, load_timed, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "blocks_s": {k: v["blocks_s"] for k, v in timed.items()},
        "same_programs": same_programs(plans),
    }
    res["noise"] = timing_noise(res["blocks_s"], res["same_programs"])
    if best_b:
        for key in ("joint", "pesto", "collage_dp"):
            if res.get(f"{key}_s"):
                res[f"{'speedup' if key == 'joint' else key + '_speedup'}_vs_best_single"] = \
                    res["best_single_s"] / res[f"{key}_s"]
        if res["joint_s"]:
            res["ratio_vs_best_single"] = res["joint_s"] / res["best_single_s"]
            res["speedup_predicted_choice"] = res["best_single_s"] / res["joint_predicted_choice_s"]
    return res


def _build_pesto(zm, cluster, backends, cache, ref: list[np.ndarray]) -> dict:
    """:func:`tvm_pesto.build` of the model on ``cluster`` with measured costs: the module a
    user gets, its call on the example inputs, and what its final choice kept
    (``{"error": ...}`` when it does not build)."""
    # lazy: loads TVM's compiler, which importing this module does not
    from .. import api
    from ..run.thread.executor import max_abs_err

    t = time.perf_counter()
    try:
        pm = api.build(zm.mod, cluster, backends=backends if backends is not None else "all", costs="measured",
                       cache=cache, inputs=zm.example_inputs)
    except PestoError as e:
        return {"error": str(e)}
    build_s = time.perf_counter() - t
    args = tuple(zm.example_inputs)
    summary = pm.placement.summary() if pm.placement is not None else {}
    return {"placed": pm, "call": lambda: pm(*args), "build_s": build_s,
            "max_abs_err": max_abs_err(_flat_numpy(pm(*args)), ref),
            "chosen": pm.decision.chosen if pm.decision else None, "cluster": pm.cluster.name,
            "backend_mix": summary.get("backend_mix"), "decided_by": summary.get("decided_by"),
            "options": {o.name: o.measured_s for o in pm.decision.options} if pm.decision else {}}


def _solve_variants(name: str, costed1, costed2, time_limit_s: float, search_s: float, say) -> dict:
    """Variant -> ``(cluster, (plan, predicted seconds))``: each backend alone and Collage's
    cover on ``costed1``'s one device, the joint solve on ``costed1`` and ``costed2``."""
    c1, c2 = costed1.cluster, costed2.cluster
    joint1 = costed1.joint()
    singles = sorted({c.backend for c in costed1.candidates})
    variants: dict[str, tuple] = {}
    for b in singles:
        table = alone(joint1.candidates, joint1.costs, b, joint1.graph.num_nodes)
        variants[f"single:{b}"] = (c1, _variant(costed1, table, "single", time_limit_s, 0))
    variants["collage_dp"] = (c1, _variant(costed1, None, "single", time_limit_s, 0))
    say(f"{name}: joint solve on 1 and 2 devices")
    variants["joint_1dev"] = (c1, _variant(costed1, None, "ilp", time_limit_s, search_s))
    variants["joint_2dev"] = (c2, _variant(costed2, None, "ilp", time_limit_s, search_s))
    return variants


def call_costs(cluster, backends, cache=None) -> dict:
    """Backend -> the seconds of one call of it on ``cluster``'s first device, measured on a
    one-op model (an add of 16 floats) through the flow: what any call of that backend costs
    beyond its work (backends with no candidate there are left out)."""
    # lazy: both load TVM's compiler, which importing this module does not
    from tvm import relax
    from .. import api

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    an = api.analyze(bb.get())
    cs = api.make_candidates(an, cluster, backends if backends is not None else "all")
    table = candidate_costs(cs, cluster, "measured", cache=cache).table[:, 0]
    return {c.backend: float(v) for c, v in zip(cs, table) if np.isfinite(v)}


def ceilings(costed1, costed2, predicted: dict, fixed_s: dict, time_limit_s: float, search_s: float) -> dict:
    """How much any plan of these candidates could gain over the best single backend, on these costs.

    ``mix`` and ``mix_free_boundaries``: Collage's cover on ``costed1``'s one device, as
    solved and with every library call's fixed cost (``fixed_s``, :func:`call_costs`) taken
    off (:func:`~tvm_pesto.solve.joint.ceiling.mix_ceiling`). ``joint_free_communication``: no plan
    on ``costed1``'s device or on ``costed2``'s devices with links, hand-offs and contention
    free (:func:`~tvm_pesto.cluster.ideal.free_communication`) beats the best single
    backend by more: the joint solve there proves a bound on every plan (``bound_s``, the
    relaxed joint ILP's; :func:`~tvm_pesto.solve.joint.solver.joint_lower_bound` when it has none),
    a run's dispatch added. Both against the best single backend's predicted seconds in
    ``predicted``.
    """
    # lazy: loads the backends' packages and TVM's compiler, which importing this module does not
    from ..api import solver_status
    from ..backends import get_backend
    from ..cluster.dispatch import dispatch_s
    from ..solve.joint.solver import joint_lower_bound

    j1 = costed1.joint()
    native = tuple(b for b in sorted({c.backend for c in j1.candidates}) if getattr(get_backend(b), "native", False))
    mc = mix_ceiling(j1.graph, j1.candidates, j1.costs[:, 0], fixed_s=fixed_s, native=native)
    free = dataclasses.replace(costed2, cluster=free_communication(costed2.cluster))
    plan, span = _variant(free, None, "auto", time_limit_s, search_s)
    bound = plan.info.get("bound_s")
    if bound is None:
        bound = joint_lower_bound(free.joint())["best"]
    best_single = min(v for k, v in predicted.items() if k.startswith("single:"))
    floor = min(predicted["collage_dp"], float(bound) + dispatch_s(free.cluster, 1))
    return {"mix": mc["mix"], "mix_free_boundaries": mc["ceiling"], "fixed_s": mc["fixed_s"],
            "free_mix": mc["free_mix"], "joint_free_communication": best_single / floor,
            "joint_free_bound_s": float(bound), "joint_free_plan_s": span,
            "joint_free_devices": plan.devices_used(), "joint_free_status": solver_status(plan)}


def _build_variants(variants: dict, analysis, zm, ref: list[np.ndarray]):
    """Build every variant of :func:`_solve_variants` and check its output against ``ref``.

    Returns ``(placed, errs, failed, fns)``: the built modules, each one's largest absolute
    error, the variants that failed to build (with why), and each built one's call on the
    example inputs as numpy arrays (as a user calls it, and as the final choice times it).
    """
    # lazy: loads TVM's compiler, which importing this module does not
    from ..builder.placed import PlacedModule
    from ..run.thread.executor import max_abs_err
    from ..builder.rewrite import apply_plan

    placed, errs, failed = {}, {}, {}
    for key, (cl, (plan, _)) in variants.items():
        try:
            pm = PlacedModule(apply_plan(analysis.rg, plan, cl), cl, plan)
        except PestoError as e:
            failed[key] = str(e)
            continue
        placed[key] = pm
        errs[key] = max_abs_err(_flat_numpy(pm(*zm.example_inputs)), ref)
    fns = {k: (lambda pm=pm, args=tuple(zm.example_inputs): pm(*args)) for k, pm in placed.items()}
    return placed, errs, failed, fns


def _choose_joint(variants: dict, fns: dict, select_by: str):
    """Which joint result ``joint_s`` reports (see ``select_by`` of :class:`BackendsBenchSettings`).

    Returns ``(predicted, predicted_key, joint_key, select)``: each variant's predicted
    seconds, the joint variant predicted faster, the one chosen, and the selection's own
    timings (empty when chosen by prediction).
    """
    predicted = {k: span for k, (_, (_, span)) in variants.items()}
    predicted_key = "joint_2dev" if predicted["joint_2dev"] < predicted["joint_1dev"] else "joint_1dev"
    select = {}
    if select_by == "measured" and "joint_1dev" in fns and "joint_2dev" in fns:
        timed = time_blocks({k: fns[k] for k in ("joint_1dev", "joint_2dev")}, rounds=2, warmup_s=0.1, block_s=0.2)
        select = {k: v["blocks_s"] for k, v in timed.items()}
        joint_key = min(timed, key=lambda k: timed[k]["s"])
    else:
        joint_key = predicted_key
    return predicted, predicted_key, joint_key, select


def _time_and_release(fns: dict, placed: dict, rounds: int) -> dict:
    """:func:`~tvm_pesto.costs.measure.blocks.time_blocks` of every built variant, then close them and
    release what the backends built, so the next model starts with free cores and memory."""
    # lazy: loads TVM's compiler and the backends, which importing this module does not
    from ..backends import release_all

    timed = time_blocks(fns, rounds=rounds, agree=AGREE)
    for pm in placed.values():
        pm.close()
    placed.clear()
    release_all()
    gc.collect()
    return timed


def _cover(plan) -> list[tuple]:
    """The plan's units as sorted ``(backend, nodes)``: equal for plans of the same cover."""
    return sorted((u.backend, tuple(u.nodes)) for u in plan.units)


def same_programs(plans: dict) -> list[tuple[str, str]]:
    """Pairs of the one-device variants whose plans are the same cover (the same units of the
    same backends): the same program built twice, whose timings differ only by noise."""
    one_dev = [k for k in plans if k.startswith("single:") or k in ("collage_dp", "joint_1dev")]
    cover = {k: _cover(plans[k]) for k in one_dev}
    return [(a, b) for i, a in enumerate(one_dev) for b in one_dev[i + 1:] if cover[a] == cover[b]]


def bench_backends(models=None, size: str = "small", backends=None, cache=None, rounds: int = ROUNDS,
                   time_limit_s: float = 30.0, progress=None, select_by: str = "measured") -> dict:
    """Run :func:`bench_model` for every model; add geomean speedups and the worst ratios.

    Returns
    -------
    dict
        ``models`` (per model: each single backend's seconds, ``collage_dp_s``, ``joint_s``,
        ``pesto_s``, ``max_abs_err``, ...); over the models, against the best single backend:
        ``geomean_speedup_vs_best_single`` and ``worst_ratio_vs_best_single`` (the joint
        solve), ``geomean_speedup_collage_dp_vs_best_single`` (the mix alone),
        ``geomean_speedup_pesto_vs_best_single`` and ``worst_speedup_pesto_vs_best_single``
        (what ``build`` returns); ``geomean_ceiling_mix_free_boundaries`` and
        ``geomean_ceiling_joint_free_communication`` (every model's :func:`ceilings`); ``noise``
        (:func:`~tvm_pesto.bench.report.timing_noise` over every model's variants).
    """
    quiet_openmp()
    # lazy: loads TVM and PyTorch, which importing this module does not
    from .. import zoo

    names = list(models) if models else zoo.list_models()
    c1, c2 = bench_clusters()
    call_s = call_costs(c1, backends, cache)  # the same for every model
    out = {"size": size, "machine": machine_info(), "clusters": {"cpu:1": c1.to_dict(), "cpu:2": c2.to_dict()},
           "rounds": rounds, "models": {}, "errors": {}}
    for n in names:
        try:
            settings = BackendsBenchSettings(rounds=rounds, time_limit_s=time_limit_s, select_by=select_by)
            out["models"][n] = bench_model(n, size, backends, cache, settings, progress, (c1, c2), call_s=call_s)
        except PestoError as e:
            out["errors"][n] = str(e)
    ms = list(out["models"].values())
    for key, name in (("speedup_predicted_choice", "geomean_speedup_predicted_choice"),
                      ("speedup_vs_best_single", "geomean_speedup_vs_best_single"),
                      ("collage_dp_speedup_vs_best_single", "geomean_speedup_collage_dp_vs_best_single"),
                      ("pesto_speedup_vs_best_single", "geomean_speedup_pesto_vs_best_single")):
        out[name] = geomean([m[key] for m in ms if key in m])
    rt = [m["ratio_vs_best_single"] for m in ms if "ratio_vs_best_single" in m]
    out["worst_ratio_vs_best_single"] = float(max(rt)) if rt else None
    pe = [m["pesto_speedup_vs_best_single"] for m in ms if "pesto_speedup_vs_best_single" in m]
    out["worst_speedup_pesto_vs_best_single"] = float(min(pe)) if pe else None
    for key in ("mix_free_boundaries", "joint_free_communication"):
        out[f"geomean_ceiling_{key}"] = geomean([m["ceiling"][key] for m in ms if "ceiling" in m])
    out["max_abs_err"] = max((m["max_abs_err"] for m in ms if m.get("max_abs_err") is not None), default=None)
    out["noise"] = timing_noise({f"{n}/{k}": b for n, m in out["models"].items() for k, b in m["blocks_s"].items()},
                                [(f"{n}/{a}", f"{n}/{b}") for n, m in out["models"].items() for a, b in m["same_programs"]])
    out["load_average_after"] = machine_info()["load_average"]
    return out


__all__ = ["BackendsBenchSettings", "ROUNDS", "bench_backends", "bench_model", "call_costs", "ceilings", "same_programs"]
