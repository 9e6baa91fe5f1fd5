"""The cost-model lab's verbs reach ``tvm-pesto`` through the entry-point group ``tvm_pesto.cli``
(``lab/pyproject.toml``, :func:`tvm_pesto.cli.main.add_plugins`); without the lab, each says how
to install it rather than failing on an import."""
from __future__ import annotations

import importlib
import tomllib
import warnings
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tvm_pesto.cli.cost_model import LAB_COST_MODEL_VERBS, LAB_INSTALL, needs_lab
from tvm_pesto.cli.main import PLUGIN_GROUP, add_plugins, cli
from tvm_pesto.cli.progress import ErrorGroup

ROOT = Path(__file__).resolve().parents[1]


def lab_entry_points() -> dict[str, str]:
    """Name -> ``module:attribute`` of the verbs the lab registers."""
    with open(ROOT / "lab" / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["entry-points"][PLUGIN_GROUP]


class FakeEntryPoint:
    def __init__(self, value: str):
        self.value = value

    def load(self):
        module, attr = self.value.split(":")
        return getattr(importlib.import_module(module), attr)


def stand_in_cli() -> click.Group:
    """``tvm-pesto`` as the product alone has it: the lab's verbs are stand-ins."""
    top = ErrorGroup("tvm-pesto")
    top.add_command(needs_lab("profile", "profile"))
    group = click.Group("cost-model")
    for verb in LAB_COST_MODEL_VERBS:
        group.add_command(needs_lab(verb, f"cost-model {verb}"))
    top.add_command(group)
    return top


@pytest.mark.parametrize("verb", ["profile zoo", "cost-model train a.jsonl -o m.json", "cost-model eval --help",
                                  "cost-model merge a.jsonl -o b.jsonl"])
def test_a_lab_verb_without_the_lab_says_how_to_install_it(verb):
    res = CliRunner().invoke(stand_in_cli(), verb.split())
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"`{LAB_INSTALL}`" in said and "pip install ./lab" in said, said


def test_the_lab_registers_what_the_product_stands_in_for():
    eps = lab_entry_points()
    assert sorted(eps) == ["cost-model", "profile"]
    profile, cost_model = FakeEntryPoint(eps["profile"]).load(), FakeEntryPoint(eps["cost-model"]).load()
    assert profile.name == "profile" and cost_model.name == "cost-model"
    assert sorted(cost_model.commands) == sorted(LAB_COST_MODEL_VERBS)
    assert "profile" in cli.commands and set(LAB_COST_MODEL_VERBS) < set(cli.commands["cost-model"].commands)
    assert "calibrate" in cli.commands["cost-model"].commands  # the product's own, beside the lab's


def test_the_lab_verbs_take_the_stand_ins_place():
    top = stand_in_cli()

    class Broken(FakeEntryPoint):
        def load(self):
            raise ImportError("no module named tvm_pesto_lab.gone")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_plugins(top, [FakeEntryPoint(v) for v in lab_entry_points().values()] + [Broken("tvm_pesto_lab.gone:x")])
    assert any("tvm_pesto_lab.gone:x" in str(w.message) for w in caught)
    res = CliRunner().invoke(top, ["cost-model", "train"])
    assert res.exit_code == 2 and "Missing option '-o'" in res.output, res.output  # the lab's train
    res = CliRunner().invoke(top, ["profile", "--help"])
    assert res.exit_code == 0 and "Measure every candidate of MODELS" in res.output
