"""CLI verbs of the learned cost model: ``cost-model calibrate`` here, and the lab's.

The verbs that make and judge the model, ``profile`` and ``cost-model merge|train|eval``, are
the cost-model lab's (the distribution ``tvm-pesto-lab`` in ``lab/``): it registers them under
the entry-point group ``tvm_pesto.cli``, and :func:`tvm_pesto.cli.main.add_plugins` puts them
in place of the stand-ins here, which say how to install the lab (:data:`LAB_INSTALL`).
Registered in :mod:`tvm_pesto.cli.main` with ``cli.add_command(profile)`` and
``cli.add_command(cost_model)``.
"""
from __future__ import annotations

import click

from ..costs.calibrate.machine import MACHINE_MODELS, calibrate_machine
from ..costs.predict.xgb import load_model
from ..errors import PestoError
from ..jsonio import write_json
from .progress import console, step

#: How to install the cost-model lab, from the root of a tvm-pesto checkout.
LAB_INSTALL = "pip install ./lab"
#: The lab's verbs of the ``cost-model`` group.
LAB_COST_MODEL_VERBS = ("merge", "train", "eval")


def needs_lab(name: str, verb: str) -> click.Command:
    """A stand-in for the lab's command ``name`` (``verb`` is how the user types it): whatever it
    is given, it says that the verb needs the cost-model lab and how to install it."""

    @click.command(name, add_help_option=False, help=f"(needs the cost-model lab: {LAB_INSTALL})",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def stand_in(args):
        raise PestoError(f"`tvm-pesto {verb}` belongs to the cost-model lab, which is not installed; install it "
                         f"from the root of a tvm-pesto checkout with `{LAB_INSTALL}`")

    return stand_in


profile = needs_lab("profile", "profile")


@click.group("cost-model")
def cost_model():
    """Train and evaluate the XGBoost cost model (cost source ``xgb``)."""


for _verb in LAB_COST_MODEL_VERBS:
    cost_model.add_command(needs_lab(_verb, f"cost-model {_verb}"))


@cost_model.command("calibrate")
@click.option("--model", "model_path", default=None, help="cost model file [default: the bundled one]")
@click.option("--cluster", "cluster_spec", default="cpu:2", show_default=True,
              help="devices of this machine to fit for (each device size once)")
@click.option("--models", "names", default=",".join(MACHINE_MODELS), show_default=True,
              help="comma-separated zoo models (small) whose units are timed")
@click.option("--json", "json_path", default=None, help="write the fitted calibration here too")
def calibrate_cmd(model_path, cluster_spec, names, json_path):
    """Fit the cost model's calibration to this machine (what the xgb source does on first
    use) and keep it where the xgb source finds it."""
    model = load_model(model_path)
    models = [n.strip() for n in names.split(",") if n.strip()]
    with step(f"time {', '.join(models)} on {cluster_spec} and fit"):
        cal = calibrate_machine(cluster_spec, model, models=models)
    console.print(f"[bold]this machine's calibration[/] of {model.path} ({cal.meta['seconds']:.1f} s, load "
                  f"{cal.meta['label_load']['max_1min']:.2f}): {cal.path}")
    counts = cal.meta.get("n_groups", {})
    for (bk, dk), (a, b) in sorted(cal.entries.items()):
        console.print(f"  {bk:12s} {dk:18s} a = {a:.3f}  b = {b * 1e6:+.2f} us  ({counts.get(f'{bk}|{dk}')} units)")
    if json_path:
        write_json(json_path, cal.to_json())


__all__ = ["LAB_INSTALL", "cost_model", "needs_lab", "profile"]
