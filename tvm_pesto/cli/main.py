"""``tvm-pesto``: place, build and run Relax models across devices.

Verbs: ``demo``, ``place``, ``run``, ``cluster`` (``profile``, ``cost-model``, ``train``,
``tune`` and ``bench`` are registered at the end, and the installed plugins' verbs, the
cost-model lab's, by :func:`add_plugins`); each step that takes over a second
shows a progress bar; ``--json PATH`` writes the result atomically.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import warnings

import click

from ..cluster import parse_cluster
from ..cluster.contention import measure_contention
from ..cluster.linkbench import measure_links
from ..costs.predict.calibration import CALIBRATION_ENV
from ..choose.decision import Decision, decision_table
from ..errors import PestoError, UnseenOpsWarning, error_line
from ..graph.dnn_partitioning import is_graph_file
from ..jsonio import write_json
from .options import (backends_at, constraint_options, constraints_of, deterministic_option, max_build_s_option,
                      ms_db_option, precision_option, rpc_options, split_margin_option)
from .progress import ErrorGroup, console, step
from .settings import PlaceSettings, RunSettings

COSTS = ["auto", "measured", "roofline", "xgb", "hybrid"]
BACKENDS_HELP = ("backends that compete for each subgraph: all (every backend available on the cluster's "
                 "devices but inductor, whose every candidate is a compile of seconds: name it, as in "
                 "tvm,onnxruntime,inductor, or all,inductor), tvm (TVM's fusion groups only: placement without backend "
                 "choice), or a comma-separated list such as tvm,onnxruntime; openvino-bf16 (bfloat16, on CPUs with "
                 "bfloat16 units) is offered only when named too")
SOLVER_HELP = ("auto: every heuristic, then the joint ILPs decide and prove a bound (the plan's gap to it is "
               "reported); or one of heft, m-etf, m-topo, m-sct, single, ilp, stage-dp")
MODEL_HELP = ("a zoo model name, an ONNX file, a torch.export program (.pt2) or a Relax module as "
              "TVMScript (.py, .tvmscript)")


@click.group(cls=ErrorGroup)
@click.version_option(package_name="tvm-pesto")
@click.option("--calibration", default=None, metavar="PATH|none",
              help="calibration of the xgb cost model's predictions: a file written by `cost-model eval --flow "
                   "--save-calibration` or `cost-model calibrate`, or none for raw predictions [default: this machine's "
                   "(fitted on first use), else the one next to the model file]; "
                   "sets $TVM_PESTO_CALIBRATION")
def cli(calibration):
    """Place deep-learning graphs across devices and backends (Apache TVM Relax)."""
    warnings.filterwarnings("ignore", category=UnseenOpsWarning)  # `run` prints its own line, the JSONs say it
    if calibration is not None:
        os.environ[CALIBRATION_ENV] = calibration


def _shapes(specs):
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from ..models import parse_input_shapes

    return parse_input_shapes(specs) or None


@cli.command()
@click.option("--model", default="inception_v3", show_default=True, help=MODEL_HELP)
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("--backends", default="all", show_default=True, help=BACKENDS_HELP)
@click.option("--solver", default="auto", show_default=True, help=SOLVER_HELP)
@click.option("--costs", default="xgb", show_default=True, type=click.Choice(COSTS),
              help="xgb: the bundled cost model predicts every candidate (nothing is measured)")
@click.option("--out", "out_dir", default="pesto-demo", show_default=True, help="folder for the Gantt chart and traces")
@ms_db_option()
@deterministic_option(False)
def demo(model, size, cluster_spec, backends, solver, costs, out_dir, deterministic):
    """Place a model over this machine's CPU devices (backend, device, order), run it, compare with the plan."""
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from ..placing import Request
    from .commands import run_model

    request = Request(backends, solver, costs, deterministic=deterministic,
                      options={"split_margin": None, "max_build_s": None})
    res = run_model(model, size, cluster_spec, request, RunSettings(trace_dir=out_dir))
    _print_run(res)
    write_json(os.path.join(out_dir, "result.json"), res, schema="run")
    console.print(f"Gantt chart (simulated vs measured): {os.path.join(out_dir, 'gantt.png')}")


def _claim(c: dict) -> str:
    """One line of what the solver says of a plan (a run's JSON or its ``flow``)."""
    gap, m = c.get("solver_gap"), c.get("split_margin")
    rule = (f"; a split must be {m:.0%} faster (the split margin); bound over every plan "
            f"{c['solver_bound_all_s'] * 1e3:.4g} ms" if m and c.get("solver_bound_all_s") else "")
    under = f"; holds under {' '.join(c['holds_under'])}" if c.get("holds_under") else ""
    return (f"{c['decided_by']}; "
            + (f"gap to the proven bound {gap:.2%} (bound {c['solver_bound_s'] * 1e3:.4g} ms{rule})"
               if gap is not None else "no bound proved") + f"; solved in {c['solve_s']:.2f} s{under}")


def _print_run(res):
    what = f"({res['size']})" if res.get("size") else f"({res['source']})"
    console.print(f"[bold]{res['model']}[/] {what}: {res['num_ops']} ops, {res['num_candidates']} candidates, "
                  f"{res['num_units']} units, placed by {res['solver']} ({res['solver_status']}) on {res['cluster']} "
                  f"(costs: {res['cost_source']})")
    if res.get("decided_by"):
        console.print(f"  decided by        {_claim(res)}")
    flow = res.get("flow")
    if flow and flow.get("decided_by") and (res.get("decision") or {}).get("chosen", "plan") != "plan":
        console.print(f"  flow's plan       on {flow['cluster']}, {flow['simulated_s'] * 1e3:.4g} ms predicted: "
                      f"{_claim(flow)}")
    mix = ", ".join(f"{b} {n}" for b, n in sorted(res["backend_mix"].items(), key=lambda kv: -kv[1]))
    console.print(f"  backend mix       {mix} (ops)")
    console.print(f"  devices used      {res['devices_used']}")
    built = res.get("build_s_by_backend") or {}
    if built:
        console.print("  library builds    " + ", ".join(f"{b} {s:.3g} s" for b, s in sorted(built.items())))
    bb = res.get("build_budget") or (res.get("flow") or {}).get("build_budget")
    if bb:
        console.print(f"  build budget      {bb['max_build_s']:g} s: the plan's builds estimated at "
                      f"{bb['build_s']:.3g} s (without the budget {bb['unbudgeted_build_s']:.3g} s; "
                      f"{bb['solves']} solve(s))")
    sp = res.get("split")
    if sp and sp.get("single_s"):
        verdict = "kept" if sp["keep_split"] else f"dropped: all on {sp['device']}"
        console.print(f"  split             {verdict} (predicted gain {sp['gain']:+.1%} over one device, "
                      f"margin {sp['margin']:.0%})")
    c = res.get("costs") or {}
    if c:
        saved = f", profiling saved ~{c['saved_s']:.1f} s" if c.get("saved_s") else ""
        console.print(f"  candidates        {c.get('measured', 0)} measured now, {c.get('cached', 0)} from the cache, "
                      f"{c.get('predicted', 0)} predicted{saved}")
        if c.get("auto"):
            console.print(f"  costs auto        {c['auto']['source']}: {c['auto']['reason']}")
        unseen = c.get("unseen_ops") or {}
        if unseen:
            ops = ", ".join(op.removeprefix("relax.") for op in unseen)
            hint = ("hybrid measured them first, as far as its budget went" if c.get("source") == "hybrid"
                    else "--costs hybrid measures them first")
            console.print(f"  [yellow]never trained on[/] {ops}: {len(unseen)} op kind(s) the cost model never saw, in "
                          f"{c.get('unseen_candidates', '?')} candidates still predicted ({hint}; --costs measured "
                          "times every candidate)")
    disp = res.get("dispatch_s")
    console.print(f"  simulated         {res['simulated_s'] * 1e3:9.3f} ms"
                  + (f"  (schedule {res['simulated_makespan_s'] * 1e3:.3f} + dispatch {disp * 1e6:.1f} us)"
                     if disp else ""))
    if res.get("switches"):
        fig = (res.get("switch") or [{}])[0]
        console.print(f"  switches          {res['switches']} between libraries on a device, "
                      f"{res['switch_s'] * 1e6:.1f} us of the schedule ({fig.get('switch_s', 0) * 1e6:.1f} us each, "
                      f"{fig.get('source', '?')})")
    d = res.get("dispatch") or {}
    if d.get("source"):
        when = f", fitted {d['fitted_at']}" if d.get("fitted_at") else ""
        console.print(f"  dispatch          {d['executor']} executor, {d['source']}{when}: one device "
                      f"{d['run_s'] * 1e6:.1f} us, several {d['multi_device_s'] * 1e6:.1f} us a run"
                      + (f" ({d['why']})" if d.get("why") else ""))
    console.print(f"  measured (median) {res['measured_s'] * 1e3:9.3f} ms  "
                  f"(measured/simulated = {res['measured_over_simulated']:.3f})")
    console.print(f"  max |err| vs single-device build: {res['max_abs_err']:.3g}")
    if res.get("decision"):
        console.print("  weighed before keeping this plan (measured in blocks, the fastest kept):")
        for line in decision_table(Decision.from_json(res["decision"])).splitlines():
            click.echo(f"    {line}")  # a table: not wrapped to the terminal's width
    hint = _stale_calibration_hint(res)
    if hint:
        console.print(f"  [yellow]calibration[/]       {hint}")


#: ``run``/``demo`` with predicted costs: measured/simulated further than this from 1 points at
#: the calibration (issue #11's target for ``run --costs xgb``).
PREDICTION_OFF = 0.15


def _stale_calibration_hint(res) -> str | None:
    """What to do when a run with ``xgb``/``hybrid`` costs measured far from its plan: the
    calibration applied and when it was fitted (a machine's speed drifts, and a fit made at
    another time or load drifts from it)."""
    c = res.get("costs") or {}
    ratio = res.get("measured_over_simulated")
    if c.get("source") not in ("xgb", "hybrid") or ratio is None or abs(ratio - 1.0) <= PREDICTION_OFF:
        return None
    per_device = c.get("prediction_fit") or {}
    fits = {(e.get("file"), e.get("fitted_at")) for dev in per_device.values()
            if isinstance(dev, dict) for e in dev.values() if isinstance(e, dict) and e.get("file")}
    what = "; ".join(f"{f} (fitted {t or 'at an unknown time'})" for f, t in sorted(fits, key=str))
    what = f"the predictions carry the calibration {what}" if what else "no calibration was applied"
    return (f"measured {ratio:.2f}x the prediction; {what}. A machine's speed drifts (a VM's by 15 % within hours): "
            "`tvm-pesto cost-model calibrate` refits it here (about 40 s). If `--costs measured` is as far off, "
            "the gap is in running the plan, not in its costs")


def _gap_line(res) -> str | None:
    """For ``place --solver ...,ilp,...`` on a graph file: the best heuristic, the ILP (its
    status, and why it has no MIP result where it has none), the tightest lower bound (the
    place bound, or the stage ILP's own where larger) and how far above it the ILP is at most."""
    rs = res["results"]
    heur = {k: r for k, r in rs.items() if k not in ("ilp", "expert") and r["valid"]}
    ilp = rs.get("ilp")
    if ilp is None or not heur:
        return None
    own = ilp["info"].get("lower_bound_s") if ilp["info"].get("model") == "stage" else None
    bound = max(res["lower_bound_s"], own or 0.0)
    low = min(r["objective_value"] for r in heur.values())
    best = ", ".join(k for k, r in heur.items() if r["objective_value"] <= low * (1 + 1e-9))  # ties: all of them
    why = ilp["info"].get("reason")
    gap = f"ilp within {(ilp['objective_value'] / bound - 1) * 100:.1f} % of optimal" if bound > 0 else "no bound"
    return (f"  gap: best heuristic {best} {low * 1e3:.3f} ms, ilp "
            f"{ilp['objective_value'] * 1e3:.3f} ms ({ilp['solver_status']}{': ' + why if why else ''}), lower bound "
            f"{bound * 1e3:.3f} ms: {gap}")


@cli.command()
@click.argument("target")
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True,
              help="cpu:N, 2xV100-nvlink, 4xV100-pcie, 8xA100-nvlink, h200, a JSON file, or from-graph")
@click.option("--backends", default="all", show_default=True, help=BACKENDS_HELP)
@click.option("--solver", default="auto", show_default=True, help=SOLVER_HELP + "; several comma-separated, or all")
@click.option("--size", default="small", type=click.Choice(["small", "full"]))
@click.option("--costs", default="auto", type=click.Choice(COSTS))
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1,D2,...",
              help="static shape of a model input whose shape is dynamic (repeatable)")
@click.option("--expert", default=None, help="a human-expert split file to evaluate (and validate) as a baseline")
@click.option("--objective", default="latency", show_default=True, type=click.Choice(["latency", "throughput"]),
              help="latency: one sample's time; throughput: time per sample with --microbatches in flight")
@click.option("--model", "exec_model", default=None, type=click.Choice(["op", "stage"]),
              help="execution model: op (per-op schedule) or stage (contiguous blocks per device)  [default: stage "
                   "for LayerGraph files, op otherwise]")
@click.option("--microbatches", default=0, show_default=True, type=click.IntRange(min=0),
              help="microbatches in flight for --objective throughput (0: steady state)")
@click.option("--time-limit", default=30.0, show_default=True,
              help="ILP time limit (s; with --deterministic nominal seconds of work); the local search after "
                   "it gets as long again")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@click.option("--report", "report_dir", default=None, metavar="DIR",
              help="write report.html, report.json and nodes.csv of a model's best plan here (predicted only)")
@ms_db_option()
@max_build_s_option()
@split_margin_option()
@precision_option()
@constraint_options()
@deterministic_option(True)
def place(**options):
    """Place TARGET (a model: zoo name, ONNX, .pt2, TVMScript; or a dnn-partitioning LayerGraph JSON)."""
    o = options
    target, solver = o["target"], o["solver"]
    settings = PlaceSettings(size=o["size"], costs=o["costs"], backends=backends_at(o["backends"], o["precision"]),
                             input_shapes=_shapes(o["input_shape"]), expert=o["expert"],
                             time_limit_s=o["time_limit"], deterministic=o["deterministic"], model=o["exec_model"],
                             objective=o["objective"], microbatches=o["microbatches"] or None,
                             split_margin=o["split_margin"], max_build_s=o["max_build_s"],
                             constraints=constraints_of(o), report_dir=o["report_dir"])
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from .commands import place_any

    solvers = ["all"] if solver == "all" else [s.strip() for s in solver.split(",") if s.strip()]
    res = place_any(target, o["cluster_spec"], solvers, settings)
    what = res["objective"] + (f" ({res['microbatches']} microbatches)" if res["microbatches"] else
                               " (steady state)" if res["objective"] == "throughput" else "")
    console.print(f"[bold]{res['graph']}[/]: {res.get('num_ops', res['num_nodes'])} nodes on {res['cluster']}; "
                  f"{res['model']} model, {what}; lower bound {res['lower_bound_s'] * 1e3:.3f} ms")
    for name, r in res["results"].items():
        ratio = r["ratio_to_lower_bound"]
        mix = ", ".join(f"{b} {n}" for b, n in r.get("backend_mix", {}).items())
        console.print(f"  {name:8s} {r['objective']} {r['objective_value'] * 1e3:10.3f} ms  "
                      f"x{ratio:.3f} of bound  solve {r['solve_s']:.3f} s  {r['solver_status']}"
                      + (f"  ({mix})" if mix else "") if ratio else f"  {name}: {r['objective_value']}")
        for v in r["violations"]:
            console.print(f"    [red]invalid[/] ({v['kind']}): {v['message']}")
    if res.get("holds_under"):
        console.print(f"  statuses and bound hold under {' '.join(res['holds_under'])} (not for the unconstrained problem)")
    gap = _gap_line(res) if is_graph_file(target) else None
    if gap:
        console.print(gap)
    if o["json_path"]:
        write_json(o["json_path"], res, schema="place")


@cli.command()
@click.argument("model")
@click.option("--size", default="small", type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("--backends", default="all", show_default=True, help=BACKENDS_HELP)
@click.option("--solver", default="auto", show_default=True, help=SOLVER_HELP)
@click.option("--costs", default="auto", type=click.Choice(COSTS))
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1,D2,...",
              help="static shape of a model input whose shape is dynamic (repeatable)")
@click.option("--repeat", default=20, show_default=True,
              help="timed runs, at least (more until they last 0.2 s, after 0.05 s of warm-up runs)")
@click.option("--trace-dir", default=None, help="write Gantt PNG and Chrome traces here")
@click.option("--report", "report_dir", default=None, metavar="DIR",
              help="write report.html (where every node ran and why), report.json and nodes.csv here")
@click.option("--export", "export_dir", default=None,
              help="also write the placed model as a bundle here (tvm_pesto.load runs it with TVM's runtime only)")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@click.option("--objective", default="latency", show_default=True, type=click.Choice(["latency", "throughput"]),
              help="throughput: place a stage plan and stream --microbatches microbatches through it (pipelined)")
@click.option("--microbatches", default=8, show_default=True, type=click.IntRange(min=1),
              help="microbatches per stream for --objective throughput")
@click.option("--executor", default="thread", show_default=True, type=click.Choice(["thread", "ray"]),
              help="thread: one pinned thread per device in this process; ray: one Ray actor per device over a Ray "
                   "compiled graph (its links and dispatch fitted over Ray on first use)")
@click.option("--ray-address", default=None, help="an existing Ray cluster (default: start a local one on 127.0.0.1)")
@click.option("--refit", is_flag=True, help="measure the executor's links, dispatch and contention on this machine "
              "again now and keep them (default: the fit kept for this machine, measured on first use)")
@max_build_s_option()
@split_margin_option()
@precision_option()
@constraint_options()
@rpc_options()
@ms_db_option()
@deterministic_option(False)
def run(**options):
    """Place MODEL (zoo name, ONNX, .pt2 or TVMScript), build one module per device, run, check numerics."""
    o = options
    model, size, cluster_spec, solver, json_path = o["model"], o["size"], o["cluster_spec"], o["solver"], o["json_path"]
    backends = backends_at(o["backends"], o["precision"])
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from ..placing import Request
    from .commands import run_model

    if o["objective"] == "throughput":
        if constraints_of(o):
            raise PestoError("--pin, --forbid and --device-memory apply to the flow's plan (--objective latency); a "
                             "pipelined run places TVM's fusion groups as stages: leave them out")
        # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
        from .pipelined import run_pipelined

        res = run_pipelined(model, size, cluster_spec, o["microbatches"],
                            solver="stage-dp" if solver == "auto" else solver, costs=o["costs"],
                            repeat=min(o["repeat"], 5), input_shapes=_shapes(o["input_shape"]),
                            deterministic=o["deterministic"])
        console.print(f"[bold]{res['model']}[/]: stage plan by {res['solver']} on {res['cluster']}, "
                      f"{res['microbatches']} microbatches; time per sample: measured "
                      f"{res['measured_time_per_sample_s'] * 1e3:.3f} ms, simulated "
                      f"{res['simulated_time_per_sample_s'] * 1e3:.3f} ms, one by one "
                      f"{res['measured_one_by_one_s'] * 1e3:.3f} ms; max |pipelined - one by one| "
                      f"{res['max_abs_err_pipelined_vs_one_by_one']:.3g}")
        if json_path:
            write_json(json_path, res, schema="run-throughput")
        return

    request = Request(backends, solver, o["costs"], deterministic=o["deterministic"], executor=o["executor"],
                      options={"split_margin": o["split_margin"], "max_build_s": o["max_build_s"]},
                      constraints=constraints_of(o))
    settings = RunSettings(repeat=o["repeat"], refit=o["refit"], trace_dir=o["trace_dir"], export_dir=o["export_dir"],
                           report_dir=o["report_dir"], input_shapes=_shapes(o["input_shape"]), ray_address=o["ray_address"],
                           rpc_tracker=o["rpc_tracker"], rpc_key=o["rpc_key"])
    res = run_model(model, size, cluster_spec, request, settings)
    _print_run(res)
    if json_path:
        write_json(json_path, res, schema="run")


@cli.command("backends")
@click.option("--json", "json_path", default=None, help="write the table as JSON here")
def backends_cmd(json_path):
    """List every backend: available or not, and why (package missing, no driver, import error)."""
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from ..backends import backend_status, get_backend
    from ..backends.registry import BUILTIN

    rows = {}
    for name, (ok, why) in backend_status().items():
        try:
            kinds = list(get_backend(name).device_kinds)
        except Exception:  # noqa: BLE001 - a backend that cannot load has no device kinds to show
            kinds = []
        rows[name] = {"available": ok, "reason": why, "device_kinds": kinds,
                      "module": f"tvm_pesto/backends/{BUILTIN[name].split(':')[0].replace('.', '/')}.py"
                      if name in BUILTIN else "registered"}
    width = max(map(len, rows), default=12)
    for name, r in rows.items():
        mark = "[green]available  [/]" if r["available"] else "[red]unavailable[/]"
        kinds = ",".join(r["device_kinds"]) or "?"
        console.print(f"{name:{width}s} {mark} {kinds:8s} {r['reason']}")
    if json_path:
        write_json(json_path, rows, schema="backends")


@cli.group()
def cluster():
    """Inspect and measure clusters."""


@cluster.command("show")
@click.argument("spec")
def cluster_show(spec):
    """Print a cluster spec as JSON."""
    click.echo(json.dumps(parse_cluster(spec).to_dict(), indent=1))


@cluster.command("bench")
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("-o", "--output", required=True, help="write the measured cluster JSON here")
@click.option("--executor", default="thread", show_default=True, type=click.Choice(["thread", "ray"]),
              help="what moves the bytes: the thread executor's hand-off, or Ray channels between actors")
@click.option("--ray-address", default=None, help="an existing Ray cluster (default: start a local one on 127.0.0.1)")
@click.option("--contention/--no-contention", default=True, show_default=True,
              help="also time kernels on each device alone and on all at once: how much the devices of a host slow "
                   "each other (written to meta.contention; the simulator uses it)")
@click.option("--dispatch/--no-dispatch", default=True, show_default=True,
              help="also time the thread executor's cost per run on one device and on several (written to "
                   "meta.dispatch; the simulator adds it to a plan's makespan)")
def cluster_bench(cluster_spec, output, executor, ray_address, contention, dispatch):
    """Measure link latency and bandwidth between this machine's devices (or their Ray actors), how
    much devices that share a memory system slow each other, and what the executor costs per run."""
    c = parse_cluster(cluster_spec)
    if contention and sum(d.present and d.kind == "cpu" for d in c.devices) > 1:
        with step("measure contention (each device alone, then all at once)"):
            cres = measure_contention(c)
        for name, k in cres["kernels"].items():
            ratios = ", ".join(f"{dv} {k['together_s'][dv] / k['alone_s'][dv]:.2f}x" for dv in k["alone_s"])
            console.print(f"  {name} ({k['kind']}-bound): together / alone {ratios} "
                          f"(overlap {min(k['overlap']):.0%})")
        console.print(f"  slowdown: compute {cres['compute']:.2f}x, memory {cres['memory']:.2f}x "
                      f"(load {cres['load'][0]:.2f} -> {cres['load'][1]:.2f})")
    if executor == "ray":
        # lazy: loads TVM; the CLI imports a verb's code when the verb runs
        from ..run.ray.executor import RaySession, measure_ray_links

        session = RaySession(ray_address)
        try:
            with step("measure links over Ray"):
                pts = measure_ray_links(c, session)
        finally:
            session.close()
    else:
        with step("measure links"):
            pts = measure_links(c)
    for k, v in pts.items():
        console.print(f"  {k}: latency {v['latency_s'] * 1e6:.1f} us, bandwidth {v['bandwidth_Bps'] / 1e9:.2f} GB/s")
    if dispatch and executor == "thread" and sum(d.present and d.kind == "cpu" for d in c.devices) > 1:
        # lazy: loads TVM; the CLI imports a verb's code when the verb runs
        from ..costs.calibrate.dispatch import measure_dispatch

        with step("measure the executor's dispatch (one device, two): after the links, whose latency it uses"):
            dres = measure_dispatch(c)
        console.print(f"  dispatch per run: one device {dres['run_s'] * 1e6:.1f} us, several "
                      f"{dres['multi_device_s'] * 1e6:.1f} us beyond the transfers (one more transfer "
                      f"{dres['handoff_s'] * 1e6:.1f} us; link latency {dres['link_latency_s'] * 1e6:.1f} us) "
                      f"(load {dres['load'][0]:.2f} -> {dres['load'][1]:.2f})")
    d = c.to_dict()
    d["meta"]["link_points"] = pts
    write_json(output, d, schema="cluster")


from .bench import bench  # noqa: E402  (bench placement | scale | backends | search | training)
from .cost_model import cost_model, profile  # noqa: E402
from .train import train  # noqa: E402
from .tune import tune  # noqa: E402

cli.add_command(bench)
cli.add_command(profile)
cli.add_command(cost_model)
cli.add_command(train)
cli.add_command(tune)

#: Entry-point group of the verbs other distributions add to ``tvm-pesto`` (the cost-model lab's).
PLUGIN_GROUP = "tvm_pesto.cli"


def add_plugins(group: click.Group, entry_points=None) -> None:
    """Add to ``group`` the click commands registered under the entry-point group
    :data:`PLUGIN_GROUP` (``entry_points``: those, by default the installed distributions').

    A command takes the place of ``group``'s command of its name (the lab's ``profile`` that
    of the stand-in saying it needs the lab); a group named as one of ``group``'s groups adds
    its commands to it (the lab's ``cost-model`` verbs beside ``calibrate``). An entry point
    that fails to load is reported in a warning, and its verbs stay the stand-ins."""
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=PLUGIN_GROUP)
    for ep in entry_points:
        try:
            cmd = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin must not take the other verbs down
            warnings.warn(f"the tvm-pesto verbs of {ep.value} did not load: {error_line(e)}", RuntimeWarning,
                          stacklevel=2)
            continue
        mine = group.commands.get(cmd.name)
        if isinstance(mine, click.Group) and isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                mine.add_command(sub)
        else:
            group.add_command(cmd)


add_plugins(cli)


def main(argv=None):
    cli.main(args=argv, prog_name="tvm-pesto")


if __name__ == "__main__":
    main()
