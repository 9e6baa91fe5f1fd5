"""``tvm-pesto bench``: benchmark verbs (a click group).

Subcommands: ``placement`` (every solver on the dnn-partitioning LayerGraphs and the zoo
models, against a lower bound), ``scale`` (solver wall time on random DAGs of 1k-100k
ops), ``backends`` (single backends vs Collage's cover vs the joint solve, measured) and
``search`` (the joint search's time on big models, costs predicted); ``report`` writes the
docs' figure tables from the benchmark JSON they show (:mod:`tvm_pesto.bench.doc_tables`). Each writes ``--json``, ``--md`` (a markdown table) and ``--plots`` (PNG files).
``placement``, ``scale`` and ``backends`` compare plans, so they run the solvers in
deterministic mode by default (``--deterministic``: work budgets and fixed seeds, see
:mod:`tvm_pesto.solve.budget`); ``--wall-clock`` gives them budgets in seconds. Their
JSON says which (``deterministic``).

Register the group in ``tvm_pesto/cli/main.py`` with::

    from .bench import bench; cli.add_command(bench)

Add another benchmark with ``@bench.command("name")`` in this module, or in a module of this
package with ``bench.add_command(command)``: ``backends``, ``peers``, ``search`` and
``training`` (tvm_pesto/cli/bench/backends.py, ...) are added at the end of this module.

Examples
--------
>>> from click.testing import CliRunner
>>> from tvm_pesto.cli.bench import bench
>>> "placement" in bench.commands and "scale" in bench.commands
True
"""
from __future__ import annotations

import shlex

import click

from ...bench import doc_tables, placement as bp, scale as bs
from ...bench.operator_graphs import operator_graph_rows, operator_graphs_markdown
from ...bench.stage_ilp import stage_ilp_markdown, stage_ilp_rows
from ...errors import PestoError
from ...jsonio import write_json, write_text
from ...solve import get_solver
from ...solve.budget import deterministic_mode
from ..options import deterministic_option
from ..progress import ErrorGroup, console


@click.group("bench", cls=ErrorGroup)
def bench():
    """Benchmarks: placement quality and solver scaling."""


def _command_line(ctx: click.Context) -> str:
    """``tvm-pesto bench <verb>`` plus the options given on the command line."""
    parts = ["tvm-pesto", "bench", ctx.info_name or ctx.command.name]
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) != click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[p.name]
        opt = max(p.opts, key=len)
        if getattr(p, "is_flag", False):
            parts.append(opt if value else (p.secondary_opts[0] if p.secondary_opts else opt))
        elif isinstance(value, (tuple, list)):
            for v in value:
                parts += [opt, str(v)]
        else:
            parts += [opt, str(value)]
    return " ".join(shlex.quote(x) for x in parts)


def _write_outputs(res: dict, json_path, md_path, plots_dir, markdown, plots, schema: str) -> None:
    if json_path:
        write_json(json_path, res, schema=schema)
        console.print(f"JSON: {json_path}")
    if md_path:
        write_text(md_path, markdown())
        console.print(f"markdown: {md_path}")
    if plots_dir:
        for path in plots(plots_dir):
            console.print(f"plot: {path}")


def _split(values) -> list[str]:
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


@bench.command("placement")
@click.option("--json", "json_path", default=None, help="write the full results as JSON here")
@click.option("--md", "md_path", default=None, help="write the markdown tables here")
@click.option("--plots", "plots_dir", default=None, help="write PNG plots into this folder")
@click.option("--quick", is_flag=True, help="a small subset (two LayerGraphs, one small zoo model) for tests")
@click.option("--ilp-time-limit", default=None, type=float,
              help="MIP time limit per case in seconds  [default: 15, 2 with --quick]")
@click.option("--ilp-target", default=None, type=int, help="coarsen graphs above this many nodes (default: the "
              "ILP solver's own default)")
@click.option("--ilp-refine", default=None, type=float, help="seconds of local search after the ILP  [default: the "
              "ILP time limit]")
@click.option("--algorithms", default=None, help="comma-separated solver names (default: all)")
@click.option("--root", default=None, help="the dnn-partitioning folder (default $TVM_PESTO_DNN_PARTITIONING or "
              "the graphs shipped with tvm-pesto)")
@click.option("--model", "models", multiple=True, help="zoo model(s) to include (default: all)")
@click.option("--cluster", "clusters", multiple=True, help="cluster(s) for the zoo models (default: 2xV100-nvlink, "
              "4xV100-pcie, 8xA100-nvlink)")
@click.option("--size", default=None, type=click.Choice(["small", "full"]), help="zoo size [default: full, small "
              "with --quick]")
@click.option("--layergraphs/--no-layergraphs", default=True, help="include the dnn-partitioning LayerGraphs")
@click.option("--zoo/--no-zoo", default=True, help="include the zoo models")
@click.option("--operator-graphs/--no-operator-graphs", default=False, help="add the table of the latency "
              "operator graphs (stage ILP, bound and gap beside the authors' and the paper's figures)")
@click.option("--stage-ilp/--no-stage-ilp", default=False, help="add the stage ILP's table: per LayerGraph and "
              "objective, the best heuristic, the ILP with its status and whose plan it is, the bound and the gap "
              "(each row what `place FILE --cluster from-graph --solver all --objective OBJ` finds)")
@deterministic_option(True)
def placement(json_path, md_path, plots_dir, quick, algorithms, deterministic, **cases):
    """Every solver on every LayerGraph and zoo model: makespan / lower bound, solve time, memory."""
    ctx = click.get_current_context()
    ilp_time_limit, ilp_target, ilp_refine = cases["ilp_time_limit"], cases["ilp_target"], cases["ilp_refine"]
    models, clusters, size = cases["models"], cases["clusters"], cases["size"]
    algs = _split([algorithms]) if algorithms else list(bp.ALGORITHMS)
    for a in algs:
        get_solver(a)  # unknown names fail before the (slow) imports
    limit = ilp_time_limit if ilp_time_limit is not None else (2.0 if quick else 15.0)
    models = _split(models) or (bp.QUICK["models"] if quick else None)
    clusters = _split(clusters) or (bp.QUICK["clusters"] if quick else list(bp.ZOO_CLUSTERS))
    size = size or (bp.QUICK["size"] if quick else "full")
    say = lambda m: console.print(f"  {m}")  # noqa: E731
    found = []
    if cases["layergraphs"]:
        kw = {"names": bp.QUICK["layergraphs"], "settings": bp.QUICK["settings"]} if quick else {}
        found += bp.layergraph_cases(cases["root"], **kw)
    if cases["zoo"]:
        found += bp.zoo_cases(models, size=size, clusters=clusters, progress=say)
    if not found and not cases["operator_graphs"] and not cases["stage_ilp"]:
        raise PestoError("nothing to benchmark: --no-layergraphs and --no-zoo leave no cases; add --operator-graphs "
                         "or --stage-ilp, or leave one of them on")
    console.print(f"[bold]bench placement[/]: {len(found)} cases x {len(algs)} algorithms, ILP limit {limit:g} s"
                  f" ({'work budgets' if deterministic else 'wall-clock budgets'})")
    with deterministic_mode(deterministic):
        res = bp.run_placement(found, algs, ilp_time_limit_s=limit, ilp_target=ilp_target, progress=say,
                               ilp_options=None if ilp_refine is None else {"refine_s": ilp_refine})
    if cases["operator_graphs"]:
        with deterministic_mode(deterministic):
            res["operator_graphs"] = operator_graph_rows(cases["root"], time_limit_s=limit, deterministic=deterministic,
                                                         progress=say)
    if cases["stage_ilp"]:
        with deterministic_mode(deterministic):
            res["stage_ilp"] = stage_ilp_rows(cases["root"], time_limit_s=limit, deterministic=deterministic,
                                              progress=say)
    res["command"] = _command_line(ctx)
    res["deterministic"] = deterministic
    s = res["summary"]
    console.print(f"ILP never worse than the best heuristic: {s['ilp_never_worse']} ({s['checked']} cases); "
                  f"within 5% of the bound on {s['ilp_within_5pct_where_applicable']} of the "
                  f"{s['heuristics_within_10pct']} cases where a heuristic is within 10%"
                  + (f"; missed: {', '.join(s['goal_missed'])}" if s["goal_missed"] else ""))
    md = lambda: bp.placement_markdown(res, res["command"]) + (  # noqa: E731
        "\n".join([""] + operator_graphs_markdown(res["operator_graphs"])) if "operator_graphs" in res else "") + (
        "\n".join(["", ""] + stage_ilp_markdown(res["stage_ilp"]) + [""]) if "stage_ilp" in res else "")
    _write_outputs(res, json_path, md_path, plots_dir, md, lambda d: bp.placement_plots(res, d), "bench-placement")


@bench.command("scale")
@click.option("--json", "json_path", default=None, help="write the rows as JSON here")
@click.option("--md", "md_path", default=None, help="write the markdown tables here")
@click.option("--plots", "plots_dir", default=None, help="write PNG plots into this folder")
@click.option("--quick", is_flag=True, help="small graphs (300 and 1000 ops) for tests")
@click.option("--ilp-time-limit", default=2.0, show_default=True, type=float, help="MIP time limit (s) on the "
              "coarse graph")
@click.option("--sizes", default=None, help="comma-separated op counts [default: 1000,10000,100000]")
@click.option("--algorithms", default=None, help="comma-separated solver names (default: all)")
@click.option("--target", default=40, show_default=True, help="supernodes after coarsening")
@click.option("--solver", default="cbc", show_default=True, type=click.Choice(["cbc", "highs"]), help="MIP backend")
@click.option("--seed", default=0, show_default=True)
@click.option("--lns", "lns_s", default=None, type=float,
              help="seconds of large-neighbourhood search (MIP windows) in the ILP path  [default: 25, 3 with --quick]")
@click.option("--ilp-refine", "refine_s", default=None, type=float,
              help="seconds of local search at the end of the ILP path  [default: 5, 1 with --quick]")
@click.option("--ilp-max-s", default=bs.ILP_MAX_S, show_default=True, type=float,
              help="wall-clock seconds the ILP path may take per size (0: no cap)")
@deterministic_option(True)
def scale(json_path, md_path, plots_dir, quick, sizes, algorithms, seed, deterministic, **ilp):
    """Wall time of every solver and of coarsen+ILP on random DNN-like DAGs of 1k, 10k, 100k ops."""
    ctx = click.get_current_context()
    lns_s, refine_s, ilp_max_s = ilp["lns_s"], ilp["refine_s"], ilp["ilp_max_s"]
    path = bs.IlpPath(time_limit_s=ilp["ilp_time_limit"], target=ilp["target"], solver=ilp["solver"],
                      lns_s=lns_s if lns_s is not None else (3.0 if quick else 25.0),
                      refine_s=refine_s if refine_s is not None else (1.0 if quick else 5.0),
                      max_s=ilp_max_s if ilp_max_s > 0 else None)
    try:
        ns = [int(x) for x in _split([sizes])] if sizes else list(bs.QUICK_SIZES if quick else bs.DEFAULT_SIZES)
    except ValueError:
        raise PestoError(f"--sizes must be comma-separated integers, not {sizes!r}") from None
    algs = _split([algorithms]) if algorithms else list(bs.ALGORITHMS)
    console.print(f"[bold]bench scale[/]: sizes {ns}, algorithms {', '.join(algs)}")
    with deterministic_mode(deterministic):
        res = bs.run_scale(ns, algs, ilp=path, seed=seed, progress=lambda m: console.print(f"  {m}"))
    res["command"] = _command_line(ctx)
    res["deterministic"] = deterministic
    _write_outputs(res, json_path, md_path, plots_dir, lambda: bs.scale_markdown(res),
                   lambda d: bs.scale_plots(res, d), "bench-scale")


@bench.command("report")
@click.argument("docs", default="docs", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help="write nothing; exit 1 when a table differs from its JSON")
def report(docs, check):
    """Write the docs' figure tables from their benchmark JSON (the blocks between
    ``<!-- bench report KIND JSON -->`` and ``<!-- end bench report -->`` in DOCS/**/*.md)."""
    stale = doc_tables.update_docs(docs, check=check)
    for t in stale:
        click.echo(f"  {'stale' if check else 'written'}: {t.doc} ({t.kind} from {t.json})")
    if check and stale:
        raise SystemExit(1)
    click.echo(f"{len(stale)} table(s) {'stale' if check else 'written'}")


from .backends import backends  # noqa: E402  (verbs that live in their own modules)
from .peers import peers  # noqa: E402
from .search import search  # noqa: E402
from .training import training  # noqa: E402

bench.add_command(backends)
bench.add_command(peers)
bench.add_command(search)
bench.add_command(training)
__all__ = ["bench"]
