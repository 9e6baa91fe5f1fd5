"""``tvm-pesto bench training``: every solver's plan of a training step, measured and simulated.

``tvm_pesto/cli/bench/__init__.py`` adds this command to the ``bench`` group
(``bench.add_command(training)``).
"""
from __future__ import annotations

import os
import shlex
import sys

import click

from ...bench import training as bt
from ...jsonio import write_json, write_text
from ...solve.budget import deterministic_mode
from ..options import deterministic_option
from ..progress import console


@click.command("training")
@click.option("--model", "models", multiple=True, help="zoo model (repeatable; default: mlp_mixer, bert, resnet50)")
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "full"]))
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True, help="the cluster that runs")
@click.option("--solvers", default=None, help="comma-separated solvers (default: single,m-etf,m-sct,heft,ilp)")
@click.option("--gpu-clusters", default=None,
              help="comma-separated GPU presets, simulated (default: 2xV100-nvlink,4xV100-pcie,4xA100-nvlink)")
@click.option("--steps", default=10, show_default=True, help="timed steps per plan (after one warm-up step)")
@click.option("--optimizer", default="sgd", show_default=True, type=click.Choice(["sgd", "momentum", "adam"]))
@click.option("--costs", default="auto", show_default=True, help="cost source on the CPU cluster")
@click.option("--gpu-costs", default="auto", show_default=True, help="cost source on the GPU presets (predicted)")
@click.option("--json", "json_path", default=None, help="write the result as JSON here")
@click.option("--md", "md_path", default=None, help="write the tables as markdown here")
@deterministic_option(True)
def training(models, cluster_spec, solvers, gpu_clusters, json_path, md_path, deterministic, **settings):
    """Step time of each solver's plan for training steps: measured vs simulated on --cluster,
    simulated on GPU presets."""
    split = lambda v, d: [x.strip() for x in v.split(",") if x.strip()] if v else list(d)  # noqa: E731
    with deterministic_mode(deterministic):
        st = bt.TrainingBenchSettings(solvers=split(solvers, bt.SOLVERS),
                                      gpu_clusters=split(gpu_clusters, bt.GPU_CLUSTERS), **settings)
        res = bt.bench_training(list(models) or list(bt.MODELS), cluster=cluster_spec, settings=st,
                                progress=lambda m: console.print(f"  {m}"))
    res["deterministic"] = deterministic
    res["command"] = " ".join([os.path.basename(sys.argv[0])] + [shlex.quote(a) for a in sys.argv[1:]])
    md = bt.training_markdown(res)
    console.print(md)
    console.print(f"load average {res['machine']['load_average']} -> {res['machine_after']['load_average']}")
    if json_path:
        write_json(json_path, res, schema="bench-training")
    if md_path:
        write_text(md_path, md + "\n")


__all__ = ["training"]
