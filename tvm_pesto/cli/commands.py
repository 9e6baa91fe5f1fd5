"""What the CLI verbs do, as plain functions returning JSON-ready dicts."""
from __future__ import annotations

import dataclasses

import os
import time

import numpy as np
import tvm
from tvm import relax

from .. import api
from ..choose import skip_reason
from ..choose.final import final_choice
from ..placing import Request
from ..builder.placed import compile_for
from ..cluster import parse_cluster
from ..cluster.device_thread import pinning_failures
from ..constraints import as_constraints, check_names
from ..cluster.dispatch import dispatch_info, local_shape, switch_figures
from ..costs.measure.remote import remote_cluster
from ..errors import InfeasibleError, PestoError
from ..graph import dnn_partitioning as dp
from ..jsonio import jsonable
from ..costs.calibrate.dispatch import machine_dispatch
from ..models import load_model
from ..plan import simulate
from ..plan.problem import layer_graph_problem
from ..plan.expert_split import load_expert_split
from ..plan.objective import check_choice, evaluate
from ..plan.trace import write_trace_dir
from ..run.ray.executor import RaySession, use_ray
from ..run.runtime import BENCH_MIN_S
from ..run.thread.executor import max_abs_err, to_numpy
from ..solve import SOLVERS, budget, get_solver, solve
from ..solve.bounds.makespan import lower_bound
from ..solve.joint.cover import best_cover
from ..solve.joint.solver import joint_lower_bound
from .memory_fit import memory_error
from .options import constraint_report
from .progress import step
from .reporting import with_report
from .settings import PlaceSettings, RunSettings


def load_target(target: str, size: str = "small", input_shapes=None):
    """A zoo model or a model file (ONNX, ``.pt2``, TVMScript) as a static module with inputs."""
    with step(f"load {target}" + (f" ({size})" if "." not in os.path.basename(target) else "")):
        return load_model(target, size, input_shapes=input_shapes)


def reference_output(mod, inputs, target=None):
    """Output of ``mod`` compiled whole for one CPU device (the numerical reference)."""
    target = target or {"kind": "llvm", "num-cores": 1}
    ex = compile_for(mod, target, "the whole model (reference)")
    vm = relax.VirtualMachine(ex, tvm.cpu(0))
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs])
    return to_numpy(out), vm, ex


def run_model(model: str, size: str, cluster_spec: str, request: Request = Request(deterministic=False),
              settings: RunSettings = RunSettings()) -> dict:
    """Place, build and run a model (zoo name or file); compare with the unplaced TVM build.

    ``request`` is what the model is placed with (its ``backends``, ``solver``, ``costs``,
    ``deterministic``, ``executor`` and ``options``; its time limit is the flow's own), ``settings``
    how it is run and reported. ``request.deterministic``: work budgets instead of wall-clock
    ones (:func:`tvm_pesto.api.place`);
    ``res["deterministic"]`` says which mode was used, ``res["plan_deterministic"]`` whether
    no clock decided the plan. ``executor="ray"`` runs the devices as Ray actors
    (:mod:`tvm_pesto.run.ray.executor`; a local Ray on 127.0.0.1, or ``settings.ray_address``). With
    devices of this machine, the executor's links, dispatch and the devices' contention are
    this machine's fit (:func:`tvm_pesto.costs.calibrate.dispatch.machine_dispatch`: the one kept, or
    measured on first use; ``settings.refit`` measures them again now and keeps them), so the plan and
    the simulation use what this executor costs here (``res["link_model"]``,
    ``res["dispatch"]``: figures, source, time of the fit; ``res["contention"]``).
    ``settings.rpc_tracker`` and ``settings.rpc_key`` measure the costs on a
    remote device over TVM RPC (:mod:`tvm_pesto.costs.measure.remote`). ``split_margin`` and
    ``max_build_s`` in ``request.options``: see :func:`tvm_pesto.api.place` (``res["split"]`` and
    ``res["build_budget"]`` have what they decided)."""
    if request.executor not in ("thread", "ray"):
        raise PestoError(f"unknown executor {request.executor!r}; use thread (one pinned thread per device) or ray")
    cluster = parse_cluster(cluster_spec)
    if request.constraints:  # an unknown backend or device is refused before the model is read
        check_names(as_constraints(request.constraints), cluster)
    lm = load_target(model, size, settings.input_shapes)
    if settings.rpc_tracker or settings.rpc_key:
        cluster = remote_cluster(cluster, settings.rpc_tracker or "", settings.rpc_key or "")
    session = None
    if request.executor == "ray":
        ray_address = settings.ray_address
        with step("start Ray" if not ray_address else f"connect to Ray at {ray_address}"):
            session = RaySession(ray_address)
    try:
        return _run_model(lm, cluster, size, request, settings, session)
    finally:
        if session is not None:
            session.close()


def _run_model(lm, cluster, size: str, request: Request, settings: RunSettings, session) -> dict:
    backends, deterministic, executor = request.backends, request.deterministic, request.executor
    repeat, refit, out_dir, export_dir = settings.repeat, settings.refit, settings.trace_dir, settings.export_dir
    pairs = None
    if cluster.num_devices > 1 and local_shape(cluster) is not None:
        # the executor's links and its own cost per run are properties of this machine: the fit
        # kept for it (measured on first use), or measured again now with ``refit``
        what = "measure" if refit else "this machine's fit of"
        with step(f"{what} the {executor} executor's links and dispatch"):
            pairs = machine_dispatch(cluster, executor, refit=refit, session=session)["links"]
    analysis = api.analyze(lm.mod)

    solving = budget.Solving(budget.SOLVE_S, skip_reason(cluster) is None, deterministic)
    with step("candidates, costs and plan") as cb:
        pl = dataclasses.replace(request, progress=cb).place(analysis, cluster, time_limit_s=solving.flow_s(),
                                                             leave_whole=solving.measured)
    flow = pl.claim()  # the flow's plan on the cluster asked for, before the measured final choice
    with step("build the plan (and time it against the one-device and whole-model library plans)") as cb:
        pm = final_choice(lm.mod, pl, cluster, request, inputs=lm.example_inputs, progress=cb, solving=solving)
        asked, (pl, cluster) = cluster.name, (pm.placement, pm.cluster)  # the option kept: its cluster is the core shape used
    dispatch = dispatch_info(cluster)
    link_model = {"engine": cluster.meta.get("links_measured", "spec"),
                  "pairs": pairs or {},
                  "source": dispatch["source"] if cluster.meta.get("links_measured") else "spec",
                  "fitted_at": dispatch["fitted_at"] if cluster.meta.get("links_measured") else None}
    ray_info = None
    if executor == "ray":
        if export_dir:
            with step(f"export the placed model to {export_dir}"):
                pm.export(export_dir)
        with step(f"start {len(pm.devices_used)} Ray actors (one per device) and compile the graph"):
            rex = use_ray(pm, session=session, bundle=export_dir)
            rex.start()
        ray_info = {"node": session.node_address, "actors": {str(d): v for d, v in rex.actor_info.items()},
                    "tasks": {str(d): len(t) for d, t in rex.plan.tasks.items()}}
    with step("reference: the unplaced module, compiled by TVM"):
        ref, _, _ = reference_output(lm.mod, lm.example_inputs, cluster.devices[0].target
                                     if cluster.devices[0].kind == "cpu" else None)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with step(f"run placed model (at least {repeat} timed runs and {BENCH_MIN_S:g} s of them)"):
        out = pm(*lm.example_inputs)
        err = max_abs_err(out, ref)
        bench_res = pm.benchmark(*lm.example_inputs, repeat=repeat)
        _, trace = pm.run_traced(*lm.example_inputs)
    summary = pl.summary()
    res = {
        "model": lm.name, "source": lm.source, "size": size if lm.source == "zoo" else None,
        "cluster": cluster.name, "solver": pl.plan.solver, "solver_status": pl.solver_status,
        "solver_gap": summary["solver_gap"], "solver_bound_s": summary["solver_bound_s"],
        "decided_by": summary["decided_by"] or f"measured ({pm.decision.chosen if pm.decision else None})",
        "solver_bound_all_s": summary["solver_bound_all_s"], "flow": flow,
        "split_margin": summary["split_margin"], "heuristics_s": summary["heuristics_s"],
        **_mode(deterministic, pl.plan.info), "backends": backends, "backend_mix": pl.backend_mix, "cost_source": pl.costs.source,
        "costs": summary["costs"], "num_ops": analysis.op_graph.num_nodes, "num_groups": analysis.graph.num_nodes,
        "num_units": pl.problem.num_nodes, "num_candidates": summary["num_candidates"],
        "candidates_by_backend": summary["candidates_by_backend"],
        "backends_unavailable": summary["backends_unavailable"], "devices_used": pm.devices_used,
        "num_segments": len(pm.program.calls()),
        "build_s_by_backend": pm.build_seconds, "build_budget": summary["build_budget"],
        "measured_s": bench_res["median_s"], "measured_min_s": bench_res["min_s"],
        "measured_runs": bench_res["repeat"],
        "simulated_s": pl.sim.run_s, "simulated_makespan_s": pl.sim.makespan, "dispatch_s": pl.sim.dispatch_s,
        "dispatch": dispatch, "switches": pl.sim.switches, "switch_s": pl.sim.switch_s,
        "switch": [f.to_json() for f in switch_figures(pl.problem.cluster)],
        "max_abs_err": err, "solve_s": pl.plan.solve_s,
        "measured_over_simulated": bench_res["median_s"] / pl.sim.run_s if pl.sim.run_s else None,
        "search": jsonable({k: pl.plan.info.get(k) for k in ("cover", "cover_exact", "cover_s", "search",
                                                              "joint_ilp", "decision") if k in pl.plan.info}),
        "split": pl.plan.info.get("split"),
        "contention": cluster.meta.get("contention"),
        "links": {"latency_s": cluster.latency.tolist(), "bandwidth_Bps": cluster.bandwidth.tolist()},
        "executor": executor, "link_model": link_model, **({"ray": ray_info} if ray_info else {}),
        # Other processes on these cores make both costs and runs noisy: judge the numbers with it.
        "load_avg_1m": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "pinning_failed": pinning_failures(),  # device -> why its threads ran unpinned (costs or run)
        # what was weighed before this plan was kept (tvm_pesto.choose), and the shape of the cores it runs on
        "decision": pm.decision.to_json() if pm.decision else None, "cluster_asked": asked,
        "core_shape": {"devices": cluster.num_devices, "cores": [d.cores for d in cluster.devices]},
        **constraint_report(pl, as_constraints(request.constraints)),
    }
    if out_dir:
        res["artifacts"] = write_trace_dir(out_dir, pl.problem, pl.plan, pl.sim, trace,
                                           [d.name for d in cluster.devices],
                                           f"{lm.name} simulated ({pl.plan.solver})", measured_s=bench_res["median_s"])
    if settings.report_dir:
        res["report"] = pm.report(settings.report_dir, trace=trace, measured_s=bench_res["median_s"], model=lm.name)
    if export_dir:
        if executor != "ray":  # the Ray executor's actors loaded it from there already
            with step(f"export the placed model to {export_dir}"):
                pm.export(export_dir)
        res["exported_to"] = export_dir
    pm.close()
    return res


def place_any(target: str, cluster_spec: str, solvers: list[str], settings: PlaceSettings = PlaceSettings()) -> dict:
    """Place a model (zoo name or model file) or a dnn-partitioning LayerGraph file with one
    or more solvers, as ``settings`` say (the names below are its fields). Models go through the flow ``tvm-pesto run`` places with:
    :func:`tvm_pesto.api.cost_candidates` once (candidates of ``backends``, costs, this
    machine's figures fitted on first use), then :func:`tvm_pesto.api.place_from_costs` per
    solver (joint solve, ``hybrid`` rounds, split decision with ``split_margin``; for the op
    model's latency only, since the decision weighs one sample's latency), so one solver's
    plan is the plan ``run`` builds with the same options. Each result also has its
    ``simulated_s`` and ``units`` (backend, op nodes and device of each); the top level has
    what ``run`` reports of the best plan (:meth:`tvm_pesto.api.Placement.summary`, its
    ``split`` decision, its ``units``). LayerGraph files are placement problems as the file
    defines them.

    ``deterministic`` (the default, as for ``tvm-pesto place``) gives every solver and the
    lower bound work budgets instead of wall-clock ones, so the plans are the same on any
    machine; ``res["deterministic"]`` says which mode was used, each result's
    ``plan_deterministic`` whether no clock decided its plan.

    ``model`` (``op`` or ``stage``; default: ``stage`` for LayerGraph files, the model the
    file defines, else ``op``), ``objective`` (``latency`` or ``throughput``) and
    ``microbatches`` (None: steady state) say what the plans are judged and optimised on
    (:mod:`tvm_pesto.plan.objective`); the JSON says which, and each result has its
    ``objective_value``, ``lower_bound`` (valid for that model and objective) and ``model``.
    An ``expert`` split is validated in the model: ``valid`` and every ``violations`` entry
    (memory, contiguity, acyclicity, co-location).

    ``max_build_s`` keeps each solver's plan within that many seconds of library builds
    (:func:`tvm_pesto.api.place`); a LayerGraph file has no builds, and it is refused there.

    Every input problem raises a :class:`PestoError` before any solver runs where it can
    (unknown solver, bad graph file, cluster mismatch); when the devices lack memory, the
    error names the smallest per-device memory with which a plan was found.

    Examples
    --------
    >>> res = place_any("mlp_mixer", "2xV100-nvlink", ["heft", "m-topo"])
    >>> sorted(res["results"]), res["results"]["heft"]["valid"], res["graph"]
    (['heft', 'm-topo'], True, 'main')
    >>> res["makespan_s"] >= res["lower_bound_s"] * (1 - 1e-9)
    True
    """
    s = settings
    expert, deterministic = s.expert, s.deterministic
    split_margin, max_build_s = s.split_margin, s.max_build_s
    model, objective, microbatches = check_choice(s.model or ("stage" if dp.is_graph_file(target) else "op"),
                                                  s.objective, s.microbatches)
    goal = {"model": model, "objective": objective, "microbatches": microbatches}
    if solvers == ["all"]:  # on a graph file ``auto`` is the ILP: run it once
        solvers = [s for s in SOLVERS if s != "auto" or not dp.is_graph_file(target)]
    if not solvers:
        raise PestoError(f"no solver given; use one of {', '.join(SOLVERS)}, several comma-separated, or all")
    for name in solvers:
        get_solver(name)  # an unknown name fails before the (slow) loading
    if s.report_dir and dp.is_graph_file(target):
        raise PestoError("--report shows where a model's ops run; a LayerGraph file has no ops: leave it out")
    if max_build_s is not None and dp.is_graph_file(target):
        raise PestoError("--max-build-s budgets the library builds of a model's plan; a LayerGraph file has no "
                         "builds: leave it out")

    t_load = time.perf_counter()
    if dp.is_graph_file(target):
        if s.constraints:
            raise PestoError("--pin, --forbid and --device-memory apply to models; a LayerGraph file is placed as the "
                             "file defines it: leave them out")
        (problem, cluster), costed = _layer_graph_problem(target, cluster_spec, split_margin), None
    else:
        problem, cluster, costed = _model_problem(target, cluster_spec, s, expert)
    try:
        problem.check_memory_feasible()
    except InfeasibleError as err:
        raise memory_error(problem, err, str(err).split("; use ")[0], **goal) from None
    load_s = time.perf_counter() - t_load
    op_latency = (model, objective) == ("op", "latency")
    if split_margin is not None and not op_latency:
        raise PestoError(f"--split-margin weighs one sample's latency in the op model, not --model {model} "
                         f"--objective {objective}: leave it out, or use --model op --objective latency")
    if costed is not None and not op_latency and costed.joint().fixed_cover() is None:
        raise PestoError(f"--model {model} --objective {objective} place a fixed set of units; the joint solve "
                         "(backend choice) optimises one sample's op-level latency only: add --backends tvm, or "
                         "use --model op --objective latency")
    solved = _solve_each(problem, cluster, costed, solvers, goal, s.time_limit_s, deterministic, split_margin,
                         max_build_s)
    solved, lb = _judged_with_bound(problem, costed, solved, solvers, goal, deterministic)
    results = {}
    for name, (placed, plan, pl) in solved.items():
        results[name] = _result(placed, plan, evaluate(placed, plan, model, objective, microbatches), lb)
        results[name].update(_mode(deterministic, plan.info))
        if pl is not None:
            results[name].update(simulated_s=float(pl.sim.run_s), units=_units(plan))
    if expert:
        plan = load_expert_split(expert, problem.graph, cluster)
        results["expert"] = _result(problem, plan, evaluate(problem, plan, model, objective, microbatches), lb)
    return with_report(_place_output(problem, cluster, goal, lb, load_s, results, solved, costed, settings), target,
                       {k: pl for k, (_, _, pl) in solved.items()}, cluster, s.report_dir)


def _layer_graph_problem(target: str, cluster_spec: str, split_margin: float | None):
    """``(problem, cluster)`` of a dnn-partitioning LayerGraph file for :func:`place_any`: the
    placement problem with the devices, costs and co-location the file defines."""
    if split_margin is not None:
        raise PestoError("--split-margin applies to models (the flow's split decision); a LayerGraph file is "
                         "placed as the file defines it: leave --split-margin out")
    if cluster_spec != "from-graph":
        raise PestoError("LayerGraph files carry their own devices and costs: use --cluster from-graph")
    problem = layer_graph_problem(target)[0]
    return problem, problem.cluster


def _model_problem(target: str, cluster_spec: str, s: PlaceSettings, expert: str | None):
    """``(problem, cluster, costed)`` of a model (zoo name or file) for :func:`place_any`: its
    candidates costed on the cluster (:func:`tvm_pesto.api.cost_candidates`) and the
    placement problem of its fusion groups, which the memory check reads before any solver runs."""
    if cluster_spec == "from-graph":
        raise PestoError("--cluster from-graph only applies to LayerGraph JSON files; give a spec like cpu:2")
    if expert:
        raise PestoError("--expert applies to LayerGraph JSON files (their human-expert splits)")
    cluster = parse_cluster(cluster_spec)
    if s.constraints:  # an unknown backend or device is refused before the model is read
        check_names(as_constraints(s.constraints), cluster)
    lm = load_target(target, s.size, s.input_shapes)
    with step("candidates and costs") as cb:
        costed = api.cost_candidates(api.analyze(lm.mod), cluster, s.backends, s.costs, progress=cb,
                                     constraints=s.constraints)
    cluster = costed.cluster  # its memory caps applied
    cs = costed.candidates
    # the fusion groups' placement problem (under constraints that drop some, a cover of what is left): the
    # memory check before any solver runs
    units = [i for i, c in enumerate(cs) if c.backend == "tvm" and c.pattern == "fusion_group"]
    if sum(len(cs[i].nodes) for i in units) != costed.analysis.op_graph.num_nodes:
        t = costed.table().table
        units = best_cover(costed.analysis.op_graph, [c.nodes for c in cs], t.min(axis=1), exact_work=0).chosen
    return costed.joint().contract(units), cluster, costed


def _solve_each(problem, cluster, costed, solvers: list[str], goal: dict, time_limit_s: float,
                deterministic: bool, split_margin: float | None, max_build_s: float | None = None) -> dict:
    """Solver -> (its placement problem, plan, Placement or None). A model's ``costed``
    candidates go through the flow's solve, as ``run`` places (the split decision for the op
    model's latency only; the build budget ``max_build_s``); a LayerGraph file's ``problem``
    goes to the solver as it is."""
    op_latency = (goal["model"], goal["objective"]) == ("op", "latency")
    solved = {}
    for name in solvers:
        with step(f"solve with {name}"):
            try:
                if costed is not None:  # the flow's solve, as `run` places
                    pl = api.place_from_costs(costed, name, time_limit_s=time_limit_s, deterministic=deterministic,
                                              split_margin=split_margin if op_latency else 0.0,
                                              max_build_s=max_build_s, **({} if op_latency else goal))
                    solved[name] = (pl.problem, pl.plan, pl)
                else:
                    opts = {"time_limit_s": time_limit_s} if name == "ilp" else {}
                    plan = solve(problem, name, deterministic=deterministic, **goal, **opts)
                    if goal["model"] == "op":
                        simulate(problem, plan)  # memory checked: a plan that does not fit is an error
                    solved[name] = (problem, plan, None)
            except InfeasibleError as err:
                raise memory_error(problem, err, f"{problem.graph.name}: {name} found no plan within the memory "
                                                 f"of {cluster.name}", **goal) from None
    return solved


def _judged_with_bound(problem, costed, solved: dict, solvers: list[str], goal: dict, deterministic: bool):
    """``(solved, lb)``: the plans as they are judged (with ``hybrid`` costs, on the last
    solver's table) and the lower bound they are judged against, valid for the model and
    objective (with backend choice, the bound over every cover)."""
    # lazy: loads PuLP (the MIP solvers); the CLI imports a verb's code when the verb runs
    from ..solve.bounds.objective import objective_lower_bound

    bound_of = problem
    if costed is not None:
        # with hybrid costs the last solver's rounds measured the most: every plan is judged on that table
        joint = costed.joint(solved[solvers[-1]][2].costs)
        fixed = joint.fixed_cover()
        bound_of = None if fixed is None else joint.contract(fixed)
        if costed.hybrid is not None:
            solved = {k: (joint.contract(joint.cover_of(plan)), plan, pl)
                      for k, (_, plan, pl) in solved.items()}
    if bound_of is None:  # backend choice: the bound over every cover, and what ``auto`` proved on this table
        lb = joint_lower_bound(joint)
        proven = [plan.info.get("bound_all_s", plan.info.get("bound_s"))  # over every plan, no split margin
                  for k, (_, plan, _) in solved.items() if costed.hybrid is None or k == solvers[-1]]
        proven = [float(b) for b in proven if b]
        if proven and max(proven) > lb["best"]:
            lb = {**lb, "relaxed_ilp_s": max(proven), "best": max(proven)}
        return solved, lb
    lat = lower_bound(bound_of, deterministic=deterministic) if goal["model"] == "op" else None
    lb = objective_lower_bound(bound_of, goal["model"], goal["objective"], goal["microbatches"],
                               deterministic=deterministic, latency_bound=lat)
    # a MIP's dual bound (the stage MIPs report one only where it bounds this model and objective)
    proven = [float(plan.info["mip_bound_s"]) for _, plan, _ in solved.values() if plan.info.get("mip_bound_s")
              and (plan.info.get("model"), plan.info.get("objective"), plan.info.get("microbatches"))
              == (goal["model"], goal["objective"], goal["microbatches"])]
    if proven and max(proven) > lb["best"]:
        lb = {**lb, "stage_mip_s": max(proven), "best": max(proven)}
    return solved, lb


def _place_output(problem, cluster, goal: dict, lb: dict, load_s: float, results: dict, solved: dict, costed,
                  settings: PlaceSettings) -> dict:
    """:func:`place_any`'s JSON: every result, and at the top level the best valid plan (for a
    model, also what ``run`` reports of it: the flow's summary, the split decision, the units)."""
    backends, deterministic = settings.backends, settings.deterministic
    valid = [k for k in results if results[k]["valid"]] or list(results)
    best = min(valid, key=lambda k: results[k]["objective_value"])
    out = {"graph": problem.graph.name, "num_nodes": problem.num_nodes, "num_edges": problem.graph.num_edges,
           "cluster": cluster.name, "devices": [d.name for d in cluster.devices], "cost_source": problem.cost_source,
           "model": goal["model"], "objective": goal["objective"], "microbatches": goal["microbatches"],
           "lower_bound_s": lb["best"], "lower_bound": jsonable(lb), "load_s": load_s, "best": best,
           "results": results,
           # top level: the best plan, as `place --json` promises
           "objective_value": results[best]["objective_value"],
           "makespan_s": results[best]["makespan_s"], "solver": best, "solve_s": results[best]["solve_s"],
           "solver_status": results[best]["solver_status"], "assignment": results[best]["assignment"],
           "order": results[best]["order"], **_mode(deterministic, results[best]),
           "lower_bound_deterministic": bool(lb.get("deterministic", True))}
    if costed is not None:  # what `run` reports of the plan: the flow's summary, the split decision, the units
        pl = solved[best][2]
        out.update({k: v for k, v in pl.summary().items() if k not in out})
        out.update(backends=backends, split=jsonable(pl.plan.info.get("split")), units=results[best]["units"],
                   **constraint_report(pl, as_constraints(settings.constraints)))
    return out


def _units(plan) -> list[dict]:
    """The units of a flow's plan: each one's backend, op-graph nodes and device."""
    return [{"backend": u.backend, "nodes": [int(v) for v in u.nodes], "device": int(d)}
            for u, d in zip(plan.units, plan.assignment)]


def _result(problem, plan, ev, lb) -> dict:
    """One solver's (or the expert's) row: ``ev`` is its :class:`tvm_pesto.plan.objective.Evaluation`;
    ``makespan_s`` is the latency in the model used."""
    g = problem.graph
    ids = [str(nd.extra.get("id", nd.name)) for nd in g.nodes]
    return {"model": ev.model, "objective": ev.objective, "microbatches": ev.microbatches,
            "objective_value": ev.objective_value, "lower_bound": lb["best"], "lower_bound_s": lb["best"],
            "ratio_to_lower_bound": ev.objective_value / lb["best"] if lb["best"] > 0 else None,
            # the plan's gap to the best proven bound (the MIP's own gap is against its dual bound only)
            "certified_gap": 1 - lb["best"] / ev.objective_value if lb["best"] > 0 and ev.objective_value > 0 else None,
            "makespan_s": ev.latency_s, "latency_s": ev.latency_s, "bottleneck_s": ev.bottleneck_s,
            "time_per_sample_s": ev.time_per_sample_s, "valid": ev.valid, "violations": ev.violations,
            "solve_s": plan.solve_s, "solver_status": api.solver_status(plan), "solver_gap": api.solver_gap(plan),
            "peak_memory_bytes": ev.memory_bytes.tolist(), "device_load_s": ev.device_load_s.tolist(),
            "devices_used": plan.devices_used(), "backend_mix": plan.backend_mix(),
            "info": jsonable(plan.info), "assignment": {ids[v]: int(d) for v, d in enumerate(plan.assignment)},
            "order": [[ids[v] for v in seq] for seq in plan.order]}


def _mode(deterministic: bool, info: dict) -> dict:
    """For the JSON output: the budget mode used and whether no clock decided the plan
    (``info`` is a plan's info, with ``deterministic``, or a result with ``plan_deterministic``;
    a plan without either, e.g. a heuristic's, is deterministic)."""
    ok = info.get("plan_deterministic", info.get("deterministic", True))
    out = {"deterministic": bool(deterministic), "budget": "work" if deterministic else "wall-clock",
           "plan_deterministic": bool(ok)}
    if not ok and info.get("deterministic_reason"):
        out["deterministic_reason"] = info["deterministic_reason"]
    return out
