"""``tvm-pesto tune``: tune a model's kernels with MetaSchedule into a database for ``tvm-ms``.

Registered in ``tvm_pesto/cli/main.py`` with one line. The work (task extraction, budget,
resuming) is :func:`tvm_pesto.costs.tune.tune.tune_model`; this verb loads the model, picks the
device, shows progress and prints what to do with the database.

With ``--rpc-tracker HOST:PORT --rpc-key KEY`` (the options of ``profile`` and ``run``)
the schedules are built here and timed on a server of the key
(:mod:`tvm_pesto.costs.measure.remote`); the records are tagged as that remote device's.

JSON (``--json``): :class:`tvm_pesto.costs.tune.tune.TuneResult` as a dict, plus ``model``,
``device``, ``rpc`` (tracker and key, or None), ``load_avg`` (1-minute load here before and
after) and ``use`` (the options that apply the database).
"""
from __future__ import annotations

import os

import click

from ..cluster import parse_cluster
from ..costs.measure.remote import remote_cluster
from ..costs.tune.tune import check_budget, tune_model
from ..errors import TuningError
from ..jsonio import write_json
from .options import rpc_options
from .progress import console, step


@click.command("tune")
@click.argument("model")
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--input-shape", "input_shape", multiple=True, metavar="NAME=D1,D2,...",
              help="static shape of a model input whose shape is dynamic (repeatable)")
@click.option("--trials", required=True, type=int,
              help="measured schedules over all tasks, counting those already in --work-dir (a rerun tunes only "
                   "the difference)")
@click.option("--work-dir", required=True, help="the MetaSchedule database folder (created, or resumed)")
@click.option("--cluster", "cluster_spec", default="cpu:1", show_default=True,
              help="tune for (and time on) this cluster's first CPU device")
@click.option("--max-tasks", default=None, type=int, help="tune only the heaviest tasks (FLOPs x occurrences)")
@click.option("--strategy", default="evolutionary", show_default=True, type=click.Choice(["evolutionary", "replay"]),
              help="evolutionary: MetaSchedule's search with an XGBoost cost model; replay: random schedules")
@click.option("--trials-per-iter", default=32, show_default=True, type=click.IntRange(min=1),
              help="schedules measured per search round")
@click.option("--baseline/--no-baseline", default=True, show_default=True,
              help="also time each kernel without a schedule (what the tvm backend runs)")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@rpc_options("time the schedules")
def tune(model, size, input_shape, trials, work_dir, cluster_spec, json_path, rpc_tracker, rpc_key, **search):
    """Tune MODEL's fused kernels with MetaSchedule into --work-dir, for the tvm-ms backend."""
    max_tasks, strategy = search["max_tasks"], search["strategy"]
    # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
    from ..models import load_model, parse_input_shapes

    check_budget(trials, max_tasks, strategy)  # before loading the model: the cheapest errors first
    cluster = parse_cluster(cluster_spec)
    if rpc_tracker or rpc_key:  # time on the key's servers: the cluster's devices become remote
        cluster = remote_cluster(cluster, rpc_tracker or "", rpc_key or "")
    devs = [d for d in cluster.devices if d.kind == "cpu" and (d.present or d.remote)]
    if not devs:
        raise TuningError(f"cluster {cluster.name} has no CPU device on this machine to time schedules on; "
                          "tune with --cluster cpu:N (tvm-ms runs on CPU devices)")
    dev = devs[0]
    m = load_model(model, size, input_shapes=parse_input_shapes(input_shape) or None)
    load0 = _load()
    where = f" over TVM RPC (key {dev.rpc_key} at {dev.rpc_tracker})" if dev.remote else ""
    with step(f"tune {m.name} for {dev.name}{where}") as cb:
        try:
            res = tune_model(m.mod, dict(dev.target), work_dir, trials, max_tasks=max_tasks, strategy=strategy,
                             trials_per_iter=search["trials_per_iter"], device=dev,
                             measure_baseline=search["baseline"], progress=cb)
        except KeyboardInterrupt:
            raise TuningError(f"interrupted; the records measured so far stay in {os.path.abspath(work_dir)}: "
                              "rerun the same command to resume") from None
    out = res.to_dict()
    how = "".join([f" --size {size}" if m.source == "zoo" and size != "small" else ""]
                  + [f" --input-shape {s}" for s in input_shape]
                  + [f" --rpc-tracker {dev.rpc_tracker} --rpc-key {dev.rpc_key}" if dev.remote else ""])
    out.update(model=m.name, model_arg=model, device=dev.name, load_avg=[load0, _load()],
               rpc={"tracker": dev.rpc_tracker, "key": dev.rpc_key} if dev.remote else None,
               use=f"{how} --backends tvm,tvm-ms --ms-db {res.work_dir}".strip())
    _print(out)
    if json_path:
        write_json(json_path, out, schema="tune")


def _load():
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _us(s):
    return "-" if s is None else f"{s * 1e6:.1f}"


def _print(r: dict) -> None:
    console.print(f"[bold]{r['model']}[/]: {len(r['tasks'])} tasks for {r['target']} ({r['strategy']} search)")
    console.print(f"  {'task':28s} {'calls':>5s} {'share':>5s} {'had':>4s} {'spent':>5s} {'untuned us':>11s} "
                  f"{'best us':>9s}")
    for t in r["tasks"]:
        console.print(f"  {t['name'][:28]:28s} {t['weight']:5d} {t['budget']:5d} {t['existing']:4d} {t['spent']:5d} "
                      f"{_us(t['baseline_s']):>11s} {_us(t['best_s']):>9s}")
    console.print(f"  trials: {r['trials_spent']} this run, records {r['records_before']} -> {r['records_after']} "
                  f"(--trials {r['trials']})")
    console.print(f"  time:   {r['seconds']:.1f} s; load average {r['load_avg'][0]} -> {r['load_avg'][1]}"
                  + (" here" if r.get("rpc") else ""))
    if r.get("rpc"):
        console.print(f"  timed on the RPC servers of key {r['rpc']['key']} ({r['rpc']['tracker']}); the records are "
                      "that remote device's: a local device refuses them")
    if not r["trials_spent"] and r["records_before"]:
        console.print("  every task already had its share of --trials in the database: raise --trials to tune more")
    console.print(f"database: {r['work_dir']}")
    console.print(f"use it:   tvm-pesto run {r['model_arg']} {r['use']}")
    console.print(f"          (or set TVM_PESTO_MS_DB={r['work_dir']})")


__all__ = ["tune"]
