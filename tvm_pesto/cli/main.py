"""``tvm-pesto``: place, build and run Relax models across devices.

Verbs: ``demo``, ``place``, ``run``, ``cluster``; each step that takes over a second
shows a progress bar; ``--json PATH`` writes the result atomically.
"""
from __future__ import annotations

import json
import os
import tempfile

import click

from .progress import ErrorGroup, console

ZOO = ["inception_v3", "resnet50", "bert", "mobilenet_v2", "vgg11", "gpt2", "mlp_mixer"]


def write_json(path: str, data: dict) -> None:
    """Write JSON to ``path`` through a temporary file, so no half-written file is left."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@click.group(cls=ErrorGroup)
@click.version_option(package_name="tvm-pesto")
def cli():
    """Place deep-learning graphs across devices and backends (Apache TVM Relax)."""


@cli.command()
@click.option("--model", default="inception_v3", show_default=True, type=click.Choice(ZOO))
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("--solver", default="heft", show_default=True)
@click.option("--costs", default="xgb", show_default=True, type=click.Choice(["auto", "measured", "roofline", "xgb"]),
              help="xgb: the bundled cost model predicts every group (nothing is measured)")
@click.option("--out", "out_dir", default="pesto-demo", show_default=True, help="folder for the Gantt chart and traces")
def demo(model, size, cluster_spec, solver, costs, out_dir):
    """Place a zoo model over this machine's CPU devices, run it, and compare with the plan."""
    from .commands import run_model

    res = run_model(model, size, cluster_spec, solver=solver, costs=costs, out_dir=out_dir)
    _print_run(res)
    write_json(os.path.join(out_dir, "result.json"), res)
    console.print(f"Gantt chart (simulated vs measured): {os.path.join(out_dir, 'gantt.png')}")


def _print_run(res):
    console.print(f"[bold]{res['model']}[/] ({res['size']}): {res['num_ops']} ops in {res['num_groups']} fused groups, "
                  f"placed by {res['solver']} on {res['cluster']} (costs: {res['cost_source']})")
    console.print(f"  devices used      {res['devices_used']}")
    console.print(f"  simulated         {res['simulated_s'] * 1e3:9.3f} ms")
    console.print(f"  measured (median) {res['measured_s'] * 1e3:9.3f} ms  "
                  f"(measured/simulated = {res['measured_over_simulated']:.3f})")
    console.print(f"  max |err| vs single-device build: {res['max_abs_err']:.3g}")


@cli.command()
@click.argument("target")
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True,
              help="cpu:N, 2xV100-nvlink, 4xV100-pcie, 8xA100-nvlink, h200, a JSON file, or from-graph")
@click.option("--solver", default="heft", show_default=True, help="a solver name, several comma-separated, or all")
@click.option("--size", default="small", type=click.Choice(["small", "full"]))
@click.option("--costs", default="auto", type=click.Choice(["auto", "measured", "roofline", "xgb"]))
@click.option("--expert", default=None, help="a human-expert split file to evaluate as a baseline")
@click.option("--time-limit", default=30.0, show_default=True,
              help="ILP time limit (s); the local search after it gets as long again")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
def place(target, cluster_spec, solver, size, costs, expert, time_limit, json_path):
    """Place TARGET (a zoo model name or a dnn-partitioning LayerGraph JSON) on a cluster."""
    from .commands import place_any

    solvers = ["all"] if solver == "all" else [s.strip() for s in solver.split(",") if s.strip()]
    res = place_any(target, cluster_spec, solvers, size=size, costs=costs, expert=expert, time_limit_s=time_limit)
    console.print(f"[bold]{res['graph']}[/]: {res['num_nodes']} nodes on {res['cluster']}; lower bound "
                  f"{res['lower_bound_s'] * 1e3:.3f} ms")
    for name, r in res["results"].items():
        ratio = r["ratio_to_lower_bound"]
        console.print(f"  {name:8s} makespan {r['makespan_s'] * 1e3:10.3f} ms  "
                      f"x{ratio:.3f} of bound  solve {r['solve_s']:.3f} s" if ratio else f"  {name}: {r}")
    if json_path:
        write_json(json_path, res)


@cli.command()
@click.argument("model", type=click.Choice(ZOO))
@click.option("--size", default="small", type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("--solver", default="heft", show_default=True)
@click.option("--costs", default="auto", type=click.Choice(["auto", "measured", "roofline", "xgb"]))
@click.option("--repeat", default=20, show_default=True, help="timed runs")
@click.option("--trace-dir", default=None, help="write Gantt PNG and Chrome traces here")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
def run(model, size, cluster_spec, solver, costs, repeat, trace_dir, json_path):
    """Place MODEL, build one module per device, run them together and check numerics."""
    from .commands import run_model

    res = run_model(model, size, cluster_spec, solver=solver, costs=costs, repeat=repeat, out_dir=trace_dir)
    _print_run(res)
    if json_path:
        write_json(json_path, res)


@cli.group()
def cluster():
    """Inspect and measure clusters."""


@cluster.command("show")
@click.argument("spec")
def cluster_show(spec):
    """Print a cluster spec as JSON."""
    from ..cluster import parse_cluster

    click.echo(json.dumps(parse_cluster(spec).to_dict(), indent=1))


@cluster.command("bench")
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True)
@click.option("-o", "--output", required=True, help="write the measured cluster JSON here")
def cluster_bench(cluster_spec, output):
    """Measure link latency and bandwidth between this machine's devices."""
    from ..cluster import parse_cluster
    from ..cluster.linkbench import measure_links
    from .progress import step

    c = parse_cluster(cluster_spec)
    with step("measure links"):
        pts = measure_links(c)
    for k, v in pts.items():
        console.print(f"  {k}: latency {v['latency_s'] * 1e6:.1f} us, bandwidth {v['bandwidth_Bps'] / 1e9:.2f} GB/s")
    d = c.to_dict()
    d["meta"]["link_points"] = pts
    write_json(output, d)


from .bench import bench  # noqa: E402  (bench placement | scale | backends)
from .cost_model import cost_model, profile  # noqa: E402

cli.add_command(bench)
cli.add_command(profile)
cli.add_command(cost_model)


def main(argv=None):
    cli.main(args=argv, prog_name="tvm-pesto")


if __name__ == "__main__":
    main()
