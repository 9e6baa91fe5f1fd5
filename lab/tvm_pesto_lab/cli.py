"""The lab's CLI verbs: ``profile`` and ``cost-model merge|train|eval``.

Registered in ``lab/pyproject.toml`` under the entry-point group ``tvm_pesto.cli``, which the
product's CLI loads (:func:`tvm_pesto.cli.main.add_plugins`): ``profile`` becomes a verb of
``tvm-pesto``, and the commands of :func:`cost_model` join the product's ``cost-model`` group
(which holds ``calibrate``).
"""
from __future__ import annotations

import os

import click

from tvm_pesto.cli.options import ms_db_option, rpc_options
from tvm_pesto.cli.progress import console, step
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.costs.predict.calibration import calibration_path
from tvm_pesto.costs.measure.remote import remote_cluster
from tvm_pesto.costs.predict.xgb import TARGETS, load_model
from tvm_pesto.errors import PestoError
from tvm_pesto.jsonio import write_json

from .fit import DEFAULT_ROUNDS, train
from .metrics import metrics


def _report_skipped(skipped) -> None:
    """Malformed lines are never dropped silently: print each with its line number."""
    if not skipped:
        return
    console.print(f"[yellow]skipped {len(skipped)} malformed line(s):[/]")
    for f, n, why in skipped[:50]:
        console.print(f"  {f}:{n}: {why}")
    if len(skipped) > 50:
        console.print(f"  ... and {len(skipped) - 50} more")


def _pct(x) -> str:
    return "   n/a" if x is None else f"{x:6.1f}"


def _frac(x) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def _corr(x) -> str:
    return "  n/a" if x is None else f"{x:5.3f}"


def print_metrics(name: str, m: dict) -> None:
    if not m or not m.get("n"):
        console.print(f"  {name:10s} (no rows)")
        return
    console.print(f"  {name:10s} n={m['n']:5d}  MAPE {_pct(m['mape'])}%  median {_pct(m['median_ape'])}%  "
                  f"p90 {_pct(m['p90_ape'])}%  within10% {_frac(m['within_10pct'])}  "
                  f"Spearman {_corr(m['spearman'])}  Kendall {_corr(m['kendall'])}  "
                  f"top-1 backend {_frac(m.get('top1_backend_accuracy'))} "
                  f"(of {m.get('n_choices', 0)})  regret {_frac(m.get('mean_regret'))}")


def _print_sizes(name: str, m: dict) -> None:
    """The error per model size, where rows of more than one size were scored."""
    sizes = (m or {}).get("per_size") or {}
    if len(sizes) > 1:
        console.print("  " + name + " by size: " + "; ".join(
            f"{s} n={v['n']} MAPE {_pct(v['mape'])}% Spearman {_corr(v['spearman'])}" for s, v in sizes.items()))


@click.command("profile")
@click.argument("models", nargs=-1, required=True)
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True,
              help="local devices to measure on (equal devices are measured once)")
@click.option("--backends", default=None, help="comma-separated; 'tvm' alone measures the fusion groups only  "
              "[default: tvm,onnxruntime,torch, and tvm-ms when it has a tuning database]")
@click.option("--log", "log_path", default=None,
              help="JSON-lines log to append to [default: $TVM_PESTO_PROFILE_LOG or ~/.cache/tvm-pesto/profile.jsonl]")
@click.option("--repeat", default=5, show_default=True, help="timed repeats per candidate (the median is logged)")
@click.option("--min-repeat-ms", default=5, show_default=True, help="least milliseconds per repeat")
@click.option("--run", "run_label", default="", help="label of a repeated pass: measures again what another "
              "pass measured (training takes the fastest pass)")
@click.option("--json", "json_path", default=None, help="write a summary as JSON here")
@rpc_options("time the candidates")
@ms_db_option()
def profile(models, cluster_spec, backends, log_path, json_path, rpc_tracker, rpc_key, **timing):
    """Measure every candidate of MODELS and append the records a cost model trains on.

    MODELS are zoo names, ``zoo`` (all of them), names of models outside the zoo
    (``tvm_pesto.zoo.outside``), ``outside`` (all of those), corpus models ``corpus:NAME``
    (timm and torchvision architectures of ``tvm_pesto.zoo.corpus``; rows named
    ``corpus:NAME``, ``corpus:NAME:full`` at size full), ``corpus`` (all of those), ``sweep``
    (all shape-sweep families) or ``sweep-FAMILY`` (conv2d, matmul, attention, elementwise,
    pool, movement).
    """
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .families import model_names
    from .profile import ProfileSettings, default_backends, default_log_path, profile_zoo
    from .sweep import FAMILIES

    sweeps = ["sweep"] + [f"sweep-{f}" for f in FAMILIES]
    names = [n for m in models for n in ([m] if m in sweeps else model_names([m]))]
    log_path = log_path or str(default_log_path())
    bks = [b.strip() for b in backends.split(",") if b.strip()] if backends else default_backends()
    if rpc_tracker or rpc_key:  # the cluster's devices are measured on the remote servers
        cluster_spec = remote_cluster(parse_cluster(cluster_spec), rpc_tracker or "", rpc_key or "")
    results = []
    for name in names:
        with step(f"profile {name}") as cb:
            settings = ProfileSettings(size=timing["size"], backends=bks, repeat=timing["repeat"],
                                       min_repeat_ms=timing["min_repeat_ms"], run=timing["run_label"])
            results.extend(profile_zoo([name], cluster=cluster_spec, log_path=log_path, settings=settings, progress=cb))
    total_s = 0.0
    for r in results:
        total_s += r.seconds
        err = f"  [yellow]{'; '.join(f'{k}: {v}' for k, v in r.errors.items())}[/]" if r.errors else ""
        console.print(f"  {r.model}: {r.candidates} candidates {r.backends}, measured {r.measured}, "
                      f"infeasible {r.infeasible}, {r.seconds:.1f} s{err}")
    console.print(f"log: {log_path}  ({total_s:.1f} s measuring)")
    if json_path:
        write_json(json_path, {"log": log_path, "seconds": total_s,
                                "models": [r.__dict__ for r in results]})


@click.group("cost-model")
def cost_model():
    """Train and evaluate the XGBoost cost model (cost source ``xgb``); the product's CLI adds
    these verbs to its own ``cost-model`` group (``calibrate``)."""


@cost_model.command("merge")
@click.argument("logs", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="merged JSON-lines log to write (gzip-compressed if it ends "
              "in .gz)")
@click.option("--assume-cpu-kind", default=None, metavar="VENDOR/FAMILY/MODEL",
              help="the CPU kind of CPU records that name none (logged before tvm-pesto recorded it), "
                   "e.g. AuthenticAMD/25/17 (lscpu's Vendor ID, CPU family, Model)")
def merge_cmd(logs, output, assume_cpu_kind):
    """Merge profiler LOGS (and repeated passes) into one compact log, one record per subgraph."""
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .profile import merge_logs

    res = merge_logs(logs, output, assume_cpu_kind=assume_cpu_kind)
    _report_skipped(res["skipped"])
    console.print(f"{output}: {res['records']} records from {res['lines']} lines "
                  f"({os.path.getsize(output) / 1e6:.2f} MB)")


@cost_model.command("train")
@click.argument("logs", nargs=-1)
@click.option("-o", "--output", required=True, help="model file to write (XGBoost JSON), e.g. cost_models/NAME.json")
@click.option("--tuning-db", "tuning_dbs", multiple=True,
              help="a MetaSchedule work directory (database_workload.json + database_tuning_record.json); repeatable")
@click.option("--target", default="log_time", show_default=True, type=click.Choice(list(TARGETS)),
              help="predict log(time), log(time / roofline), log(time / work) or log((time - misses) / work): the "
                   "last three scale with the work, the last adds untuned TVM reductions' cache misses "
                   "(tvm_pesto.costs.predict.xgb.target_base, target_offset)")
@click.option("--heldout", default="", help="comma-separated model names kept out of training (eval reports them)")
@click.option("--eval-heldout", default="", help="comma-separated model names trained on, whose held-out figures "
              "eval gets by retraining the same recipe without them (the shipped model uses all the data)")
@click.option("--rounds", default=None, type=int, help="boosting rounds [default: 1000]")
@click.option("--work-floor", "work_floor_s", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="seconds: a target that scales with the work is relative to at least this long (subgraphs of "
                   "less work are learnt as log_time learns them; 0: no floor)")
@click.option("--json", "json_path", default=None, help="write the training summary as JSON here")
def train_cmd(logs, output, tuning_dbs, target, heldout, eval_heldout, rounds, work_floor_s, json_path):
    """Train a cost model on profiler LOGS (and MetaSchedule databases) and save it."""
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .dataset import base_model, load_dataset
    from .evaluate import split_by_model

    if not logs and not tuning_dbs:
        raise PestoError("no training data: give profiler logs (tvm-pesto profile ...) and/or --tuning-db DIR")
    with step("read logs"):
        ds = load_dataset(logs, tuning_dbs)
    _report_skipped(ds.skipped)
    held = [h.strip() for h in heldout.split(",") if h.strip()]
    recipe = [h.strip() for h in eval_heldout.split(",") if h.strip()]
    both = sorted(set(held) & set(recipe))
    if both:
        raise PestoError(f"{', '.join(both)} cannot be both kept out of training (--heldout) and trained on "
                         "(--eval-heldout); name each model in one of them")
    train_rows, test_rows = split_by_model(ds.rows, held)
    missing = [h for h in held + recipe if not any(base_model(r["model"]) == base_model(h) for r in ds.rows)]
    if missing:
        raise PestoError(f"held-out model(s) {', '.join(missing)} have no rows in the logs; "
                         f"models present: {', '.join(sorted({r['model'] for r in ds.rows}))}")
    out_dir = os.path.dirname(os.path.abspath(output))
    meta = {"logs": [os.path.relpath(os.path.abspath(p), out_dir) for p in logs],
            "tuning_dbs": [os.path.relpath(os.path.abspath(p), out_dir) for p in tuning_dbs],
            "heldout_models": held, "eval_heldout_models": recipe}
    with step(f"train ({len(train_rows)} rows, target {target})"):
        model = train(train_rows, target=target, rounds=rounds or DEFAULT_ROUNDS, meta=meta, overheads=ds.overheads,
                      work_floor_s=work_floor_s)
        model.save(output)
    console.print(f"model: {output}  ({os.path.getsize(output) / 1e6:.2f} MB; {len(train_rows)} training rows, "
                  f"{ds.no_desc} records without description, {ds.infeasible} infeasible)")
    summary = {"model": output, "rows": len(ds.rows), "train_rows": len(train_rows), "heldout_rows": len(test_rows),
               "skipped_lines": [list(s) for s in ds.skipped], "meta": model.meta}
    summary["seen"] = metrics(train_rows, model.predict_rows(train_rows))
    print_metrics("seen", summary["seen"])
    if test_rows:
        summary["heldout"] = metrics(test_rows, model.predict_rows(test_rows))
        print_metrics("held-out", summary["heldout"])
    if json_path:
        write_json(json_path, summary)


@cost_model.command("eval")
@click.option("--model", "model_path", default=None, help="model file [default: the bundled cost_models/default.json.gz]")
@click.option("--logs", multiple=True, help="evaluate on these logs instead of the model's own (repeatable)")
@click.option("--tuning-db", "tuning_dbs", multiple=True, help="MetaSchedule work directory to evaluate on too")
@click.option("--cv", is_flag=True, help="also leave-one-model-out (both targets) and leave-one-op-kind-out CV")
@click.option("--plot", default=None, help="write a log-log predicted-vs-measured PNG here")
@click.option("--label", default="min", show_default=True, type=click.Choice(["min", "median"]),
              help="measured time of a subgraph profiled in several passes: the fastest pass or the median")
@click.option("--json", "json_path", default=None, help="write all metrics as JSON here")
@click.option("--flow", is_flag=True, help="score on the product's path instead: each model's fused groups, "
              "xgb-predicted against measured now (scaled to the whole model), raw and calibrated")
@click.option("--models", "flow_names", default="", help="--flow: comma-separated zoo models, models outside "
              "the zoo (tvm_pesto.zoo.outside) and corpus models (corpus:NAME, or corpus for all: "
              "tvm_pesto.zoo.corpus) [default: the zoo and outside]")
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]), help="--flow")
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True, help="--flow: devices to measure on")
@click.option("--backends", default="all", show_default=True,
              help="--flow: library backends whose units are scored beside TVM's groups: all (every one available "
                   "but inductor, whose every unit is a compile of seconds), or a comma-separated list such as "
                   "onnxruntime,openvino,inductor")
@click.option("--cache", "cache_path", default=None, help="--flow: measurement log to reuse [default: a fresh one, "
              "so every label is measured now, under the load reported]")
@click.option("--max-load", default=1.0, show_default=True, type=float,
              help="--flow: flag labels measured above this 1-minute load average")
@click.option("--strict", is_flag=True, help="--flow: refuse instead of flagging labels measured above --max-load")
@click.option("--no-calibration", is_flag=True, help="--flow: raw predictions only (no calibration fitted or applied)")
@click.option("--label-runs", default=1, show_default=True, type=click.IntRange(1, 10),
              help="--flow: measure the labels this many times (fresh each time); labels are the median, and "
                   "label_noise says how far the runs differ (what a perfect model would score against one run)")
@click.option("--save-calibration", is_flag=True, help="--flow: fit the calibration on all the models and store it "
              "next to the model file (NAME.calibration.json), where the xgb cost source applies it")
@click.option("--holdout", type=click.Choice(["family"]), default=None,
              help="train the model's recipe without each architecture family in turn and score that family")
@click.option("--train-size", type=click.Choice(["small", "full"]), default=None,
              help="train the recipe on the rows of this model size (with --eval-size)")
@click.option("--eval-size", type=click.Choice(["small", "full"]), default=None,
              help="score the rows of this model size (with --train-size)")
@click.option("--families", default="", help="--holdout family: comma-separated families to hold out [default: all]")
@click.option("--target", default=None, type=click.Choice(list(TARGETS)),
              help="--holdout/--train-size: the target to train [default: the model's own]")
@click.option("--rounds", default=None, type=click.IntRange(1), help="--holdout/--train-size: boosting rounds of "
              "each fold [default: the model's own]")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1),
              help="--holdout/--train-size: XGBoost threads per training")
@click.option("--work-floor", "work_floor_s", default=None, type=click.FloatRange(0.0),
              help="--holdout/--train-size: the target's work floor in seconds (cost-model train --work-floor) "
                   "[default: the model's own]")
def eval_cmd(model_path, logs, tuning_dbs, cv, plot, label, json_path, flow, **flow_options):
    """Evaluate a cost model on its held-out models and on the models it saw (or, with
    --flow, on whole models through the cost sources; with --holdout family or --train-size
    and --eval-size, on architecture families and sizes its recipe never trained on)."""
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .evaluate import evaluate_model

    model = load_model(model_path)
    o = flow_options
    gen = {k: o.pop(k) for k in ("holdout", "train_size", "eval_size", "families", "target", "rounds", "threads",
                                 "work_floor_s")}
    if gen["holdout"] or gen["train_size"] or gen["eval_size"]:
        if flow or cv or plot:
            raise PestoError("--holdout and --train-size/--eval-size retrain on the records; --flow, --cv and --plot "
                             "are other evaluations: run them apart")
        _eval_generalization(model, list(logs), list(tuning_dbs), label, gen, json_path)
        return
    save_calibration, strict, no_calibration = o["save_calibration"], o["strict"], o["no_calibration"]
    cache_path, label_runs, backends = o["cache_path"], o["label_runs"], o["backends"]
    if flow:
        if logs or tuning_dbs or cv or plot:
            raise PestoError("--flow measures models on this machine; --logs, --tuning-db, --cv and --plot score the "
                             "profiler's records: run them without --flow")
        # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
        from .flow_eval import FlowEvalSettings

        settings = FlowEvalSettings(calibrate=not no_calibration, max_load=o["max_load"], strict=strict,
                                    save_calibration=calibration_path(model.path) if save_calibration else None,
                                    label_runs=label_runs, backends=backends)
        _eval_flow(model, o["flow_names"], o["size"], o["cluster_spec"], cache_path, settings, json_path)
        return
    if save_calibration or strict or no_calibration or cache_path or label_runs != 1 or backends != "all":
        raise PestoError("--save-calibration, --strict, --no-calibration, --cache, --label-runs and --backends belong "
                         "to --flow; add --flow")
    with step("evaluate" + (" with cross-validation" if cv else "")):
        res = evaluate_model(model, cv=cv, plot=plot, logs=list(logs) or None, tuning_dbs=tuning_dbs,
                             label=label)
    _report_skipped([tuple(s) for s in res["skipped_lines"]])
    console.print(f"[bold]{res['model']}[/] (target {res['target']}; label {label}; held-out models: "
                  f"{', '.join(res['heldout_models']) or 'none'})")
    print_metrics("held-out", res["heldout"])
    _print_sizes("held-out", res["heldout"])
    if res.get("heldout_scored_by"):
        console.print(f"  (held-out: scored by the same recipe retrained without them on "
                      f"{res['heldout_scored_by']['train_rows']} rows; the shipped model was trained on them)")
    for fam, m in (res.get("heldout_family") or {}).items():
        print_metrics(f"held-out family {fam}" if fam != "pooled" else "held-out families (outside the zoo)", m)
    print_metrics("seen", res["seen"])
    nf = res["noise_floor"]
    if nf.get("n_records"):
        console.print(f"  noise floor: CV of repeats median {100 * nf['cv_median']:.1f}% "
                      f"(p90 {100 * nf['cv_p90']:.1f}%)"
                      + (f"; re-run MAPE {nf['rerun_mape']:.1f}% over {nf['n_rerun_pairs']} pairs"
                         if nf.get("n_rerun_pairs") else "")
                      + (f"; load median {nf['load_median']:.1f}" if "load_median" in nf else ""))
    for dk, ld in (nf.get("load_by_device") or {}).items():
        busy = f"  [yellow]{ld['busy']} written while another job ran[/]" if ld["busy"] else ""
        console.print(f"  labels on {dk}: {ld['n']} records, load median {ld['median']:.2f} max {ld['max']:.2f}{busy}")
    if cv:
        for t, r in res["cv"].items():
            console.print(f"  leave-one-model-out ({t}):")
            print_metrics("pooled", r["pooled"])
            for name, m in r["folds"].items():
                print_metrics(name[:10], m)
        console.print(f"  leave-one-op-kind-out ({res['cv_op_kind']['target']}):")
        for name, m in res["cv_op_kind"]["folds"].items():
            print_metrics(name[:10], m)
    if plot:
        console.print(f"plot: {plot}")
    if json_path:
        write_json(json_path, res)


def _print_fold(name: str, f: dict) -> None:
    r, g = f["rows"], f["groups"]
    console.print(f"  {name[:16]:16s} {r['n']:6d} {_fmt(r['mape'], '7.1f')} {_fmt(r['median_ape'], '6.1f')} "
                  f"{_fmt(r['spearman'], '6.3f')} {_fmt(r['sum_ratio'], '5.2f')} | {g['n']:5d} {_fmt(g['mape'], '7.1f')} "
                  f"{_fmt(g['median_ape'], '6.1f')} {_fmt(g['spearman'], '6.3f')} {_fmt(g['sum_ratio'], '5.2f')} "
                  f"{_frac(g['within_3x'])} {_fmt(g['ratio_min'], '5.2f')}-{_fmt(g['ratio_max'], '.2f')}")


def _eval_generalization(model, logs, tuning_dbs, label, gen: dict, json_path) -> None:
    """``eval --holdout family`` or ``eval --train-size A --eval-size B``
    (:mod:`tvm_pesto_lab.generalization`), printed and written as JSON."""
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .dataset import load_dataset
    from .evaluate import model_logs, relabel
    from .generalization import Recipe, holdout_families, train_on_size

    if gen["holdout"] and (gen["train_size"] or gen["eval_size"]):
        raise PestoError("--holdout family and --train-size/--eval-size are two evaluations: run them apart")
    if not gen["holdout"] and not (gen["train_size"] and gen["eval_size"]):
        raise PestoError("--train-size and --eval-size go together (e.g. --train-size small --eval-size full)")
    if gen["families"] and not gen["holdout"]:
        raise PestoError("--families names the families --holdout family holds out; add --holdout family")
    logs, tuning_dbs = model_logs(model, logs, tuning_dbs)
    with step("read logs"):
        ds = load_dataset(logs, tuning_dbs)
    _report_skipped(ds.skipped)
    rows = relabel(ds.rows, label)
    recipe = Recipe(target=gen["target"] or model.target, rounds=gen["rounds"] or int(model.meta.get("rounds", 300)),
                    params=model.meta.get("params"), threads=gen["threads"], overheads=ds.overheads,
                    work_floor_s=model.work_floor_s if gen["work_floor_s"] is None else gen["work_floor_s"])
    fams = [f.strip() for f in gen["families"].split(",") if f.strip()]
    what = "each family held out" if gen["holdout"] else f"trained on {gen['train_size']}, scored on {gen['eval_size']}"
    floor = f", work floor {recipe.work_floor_s:g} s" if recipe.work_floor_s else ""
    with step(f"{what} (target {recipe.target}{floor}, {recipe.rounds} rounds, {recipe.threads} thread(s))") as cb:
        if gen["holdout"]:
            res = holdout_families(rows, recipe, fams or None, progress=cb)
        else:
            res = train_on_size(rows, recipe, gen["train_size"], gen["eval_size"], progress=cb)
    out = {"model": model.path, "logs": list(logs) + list(tuning_dbs), **res.to_json(), "load": list(os.getloadavg()),
           "skipped_lines": [list(s) for s in ds.skipped]}
    console.print(f"[bold]{model.path}[/] recipe, {what}: {res.rows} rows, {res.seconds:.0f} s; MAPE and median "
                  f"in %, sum = predicted / measured; groups = TVM fusion groups")
    console.print(f"  {'family':16s} {'rows':>6s} {'MAPE':>7s} {'median':>6s} {'Spear':>6s} {'sum':>5s} | "
                  f"{'groups':>5s} {'MAPE':>7s} {'median':>6s} {'Spear':>6s} {'sum':>5s} {'in 3x':>6s} pred/meas")
    for name, f in out["folds"].items():
        _print_fold(name, f)
    if out["pooled"]:
        _print_fold("pooled", out["pooled"])
    if json_path:
        write_json(json_path, out, schema="cost-model-generalization")


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _noise(r) -> str:
    """` | 17% 1.01`: how far the label runs differ per group, and their sums (with --label-runs)."""
    n = r.get("label_noise")
    if not n:
        return ""
    sums = "/".join(f"{x:.2f}" for x in n["rerun_sum_ratio"])
    return f" | {n['rerun_mape']:.0f}% {sums}" + (" [yellow]![/]" if n["above_target"] else "")


def _eval_flow(model, names, size, cluster_spec, cache_path, settings, json_path) -> None:
    """``eval --flow``: :func:`~tvm_pesto_lab.flow_eval.flow_eval` of the ``names`` models as
    ``settings`` (a :class:`~tvm_pesto_lab.flow_eval.FlowEvalSettings`) say, printed."""
    # lazy: loads TVM's compiler and PyTorch; the CLI imports a verb's code when the verb runs
    from .flow_eval import flow_eval, flow_models

    with step("build models"):
        mods = flow_models([n.strip() for n in names.split(",") if n.strip()], size)
    cache = MeasureCache(cache_path) if cache_path else None
    with step(f"measure and predict {len(mods)} models on {cluster_spec}") as cb:
        res = flow_eval(mods, cluster_spec, model=model, cache=cache, settings=settings, progress=cb)
    applied = res["calibration"].get("applied")
    console.print(f"[bold]{res['model']}[/] on the flow ({res['cluster']}; labels: {res['label_source']}); "
                  f"MAPE in %, sum = predicted / measured; predictions as estimate_costs gives them, calibrated by "
                  f"{applied or 'nothing'}; raw = no calibration; LOO = calibration fitted on the other models")
    console.print(f"  {'model':14s} {'groups':>6s} {'MAPE':>7s} {'sum':>6s} {'Spearman':>8s} | "
                  f"{'raw MAPE':>8s} {'raw sum':>7s} | {'LOO MAPE':>8s} {'LOO sum':>7s} | load"
                  + (" | runs differ, sum (! above target)" if res.get("label_noise") else ""))
    for name, r in res["flow"].items():
        c, w = r.get("calibrated_heldout") or {}, r["raw"]
        flag = " [yellow]high[/]" if r["high_load"] else ""
        fit = "*" if r.get("in_fit") else " "
        console.print(f"  {name:13s}{fit} {r['n_groups']:6d} {_fmt(r['mape'], '7.1f')} {_fmt(r['sum_ratio'], '6.2f')} "
                      f"{_fmt(r['spearman'], '8.3f')} | {_fmt(w['mape'], '8.1f')} {_fmt(w['sum_ratio'], '7.2f')} | "
                      f"{_fmt(c.get('mape'), '8.1f')} {_fmt(c.get('sum_ratio'), '7.2f')}"
                      f" | {r['load']['label_1min']:.2f}{flag}{_noise(r)}")
    if any(r.get("in_fit") for r in res["flow"].values()):
        console.print("  * among the models the applied calibration was fitted on")
    pooled = res["pooled"]
    for k, m in pooled.items():
        console.print(f"  pooled {k}: MAPE {_fmt(m['mape'], '.1f')}%, sum {_fmt(m['sum_ratio'], '.2f')}, "
                      f"Spearman {_fmt(m['spearman'], '.3f')} over {m['n']} groups")
    for b, m in res.get("library", {}).items():
        console.print(f"  {b} units ({', '.join(m['models'])}): MAPE {_fmt(m['mape'], '.1f')}% (raw "
                      f"{_fmt(m['raw']['mape'], '.1f')}%), sum {_fmt(m['sum_ratio'], '.2f')}, Spearman "
                      f"{_fmt(m['spearman'], '.3f')} over {m['n']} units")
    if res.get("label_noise"):
        n = res["label_noise"]
        console.print(f"  label noise ({n['runs']} runs): the runs differ by {n['rerun_mape']:.1f}% per group (sums "
                      f"{', '.join(f'{x:.2f}' for x in n['rerun_sum_ratio'])}); beyond a target's tolerance on "
                      f"{', '.join(n['above_target_models']) or 'no model'}")
    if res.get("load_note"):
        console.print(f"[yellow]{res['load_note']}[/]")
    if res["calibration"].get("saved"):
        console.print(f"calibration: {res['calibration']['saved']}")
    if json_path:
        write_json(json_path, res)


__all__ = ["cost_model", "profile"]
