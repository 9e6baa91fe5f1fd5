"""``tvm-pesto bench search``: the joint search's time on big models, costs predicted."""
from __future__ import annotations

import click

from ...bench.search import bench_search
from ...jsonio import write_json
from ..progress import console


@click.command("search")
@click.argument("targets", nargs=-1)
@click.option("--size", default="full", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("--costs", default="xgb", show_default=True, type=click.Choice(["xgb", "roofline", "measured"]))
@click.option("--backends", default="all", show_default=True)
@click.option("--solver", default="auto", show_default=True)
@click.option("--search-s", default=5.0, show_default=True, help="joint local search budget (s)")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
def search(targets, size, cluster_spec, costs, backends, solver, search_s, json_path):
    """Time candidates + costs + joint solve for TARGETS (zoo names or model files; default: the zoo)."""
    # lazy: loads TVM and PyTorch; the CLI imports a verb's code when the verb runs
    from ...zoo import list_models

    res = bench_search(list(targets) or list_models(), size=size, cluster=cluster_spec, costs=costs,
                       backends=backends, solver=solver, search_s=search_s,
                       progress=lambda m: console.print(f"  {m}"))
    console.print(f"[bold]{'model':24s}{'ops':>6s}{'cands':>7s}{'units':>6s}{'cands s':>9s}{'costs s':>9s}"
                  f"{'solve s':>9s}{'total s':>9s}  exact[/]")
    for name, m in res["models"].items():
        console.print(f"{name:24s}{m['num_ops']:6d}{m['num_candidates']:7d}{m['num_units']:6d}"
                      f"{m['candidates_s']:9.1f}{m['costs_s']:9.1f}{m['solve_s']:9.1f}{m['search_total_s']:9.1f}  "
                      f"{m['cover']['cover_exact']}")
    console.print(f"longest: {res['max_search_total_s']:.1f} s; load average {res['machine']['load_average']} -> "
                  f"{res['machine_after']['load_average']}")
    if json_path:
        write_json(json_path, res, schema="bench-search")
