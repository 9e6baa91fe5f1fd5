"""Constraints through every entry point (issue 55, part 1): ``tvm_pesto.build``,
``PlacementPass`` in ``tvm.compile``, and the ``run`` / ``place`` verbs, on a model of our own
outside the zoo (a small torch module written here)."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import tvm_pesto
from tvm_pesto.cli.main import cli
from tvm_pesto.frontend import from_torch
from tvm_pesto.jsonio import schema_problems

warnings.filterwarnings("ignore", category=RuntimeWarning)

PIN = "relax.nn.conv2d=tvm"


class TwoConvs(nn.Module):
    """conv -> relu -> conv -> relu + skip -> mean -> linear: convolutions a library would take."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        return self.fc((torch.relu(self.c2(y)) + y).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net, x = TwoConvs().eval(), np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    return net, from_torch(net, [x]), x, ref


@pytest.fixture(scope="module")
def pt2(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "two_convs.pt2"
    with torch.no_grad():
        torch.export.save(torch.export.export(model[0], (torch.from_numpy(model[2]),)), str(path))
    return str(path)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path / "cache"))


def _convs_on_tvm(nodes: list, device: str | None = None) -> None:
    convs = [r for r in nodes if r["op"] == "relax.nn.conv2d"]
    assert len(convs) == 2
    assert all(r["backend"] == "tvm" and (device is None or r["device"] == device) for r in convs), convs


@pytest.mark.slow  # builds and times the options
def test_build_honours_the_constraints(model):
    _, mod, x, ref = model
    placed = tvm_pesto.build(mod, "cpu:2", costs="roofline", constraints={"pin": [PIN]}, measure_final=True)
    try:
        np.testing.assert_allclose(placed(x), ref, atol=1e-4)
        _convs_on_tvm([r.__dict__ for r in placed.placement.node_table()])
        assert placed.decision.constraints.holds_under == [f"--pin {PIN}"]
        names = [o.name for o in placed.decision.options]
        assert not any(n.startswith("library:onnxruntime") and "+tvm" not in n for n in names), names
    finally:
        placed.close()


@pytest.mark.slow  # tvm.compile builds the placed module
def test_placement_pass_in_tvm_compile_honours_the_constraints(model):
    import tvm
    from tvm import relax

    _, mod, x, ref = model
    pp = tvm_pesto.PlacementPass("cpu:2", costs="roofline", deterministic=True, measure_final=False,
                                 constraints={"pin": ["relax.nn.conv2d=tvm@cpu1"], "forbid": ["*relu=torch"]})
    ex = tvm.compile(tvm.transform.Sequential([pp])(mod))
    vm = relax.VirtualMachine(ex, [d.tvm_device() for d in pp.last_cluster.devices])
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, ref, atol=1e-4)
    rows = [r.__dict__ for r in pp.last_placement.node_table()]
    _convs_on_tvm(rows, "cpu1")
    assert all(r["backend"] != "torch" for r in rows if r["op"] == "relax.nn.relu")
    assert pp.last_placement.claim()["holds_under"] == ["--pin relax.nn.conv2d=tvm@cpu1", "--forbid *relu=torch"]


def test_build_refuses_constraints_beside_a_given_plan(model):
    with pytest.raises(tvm_pesto.PestoError, match="plan= is applied as it is"):
        tvm_pesto.build(model[1], "cpu:2", plan=object(), constraints={"pin": [PIN]})


def test_place_verb_records_the_constraints_and_every_node(pt2, tmp_path, cache):
    out = tmp_path / "place.json"
    res = CliRunner().invoke(cli, ["place", pt2, "--cluster", "cpu:2", "--costs", "roofline", "--solver", "heft,ilp",
                                   "--pin", "relax.nn.conv2d=tvm@cpu1", "--forbid", "*matmul=onnxruntime",
                                   "--device-memory", "cpu0=1GB", "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert schema_problems("place", d) == []
    assert d["constraints"] == {"pin": ["relax.nn.conv2d=tvm@cpu1"], "forbid": ["*matmul=onnxruntime"],
                                "device_memory": ["cpu0=1GB"]}
    assert d["holds_under"] == ["--pin relax.nn.conv2d=tvm@cpu1", "--forbid *matmul=onnxruntime",
                                "--device-memory cpu0=1GB"]
    assert len(d["nodes"]) == d["num_ops"]
    _convs_on_tvm(d["nodes"], "cpu1")
    assert all(r["backend"] != "onnxruntime" for r in d["nodes"] if r["op"] == "relax.matmul")
    assert "hold under --pin relax.nn.conv2d=tvm@cpu1" in " ".join(res.output.split())


@pytest.mark.parametrize("args, says", [
    (["--pin", "*=nosuch"], "--pin *=nosuch: unknown backend 'nosuch'"),
    (["--pin", "conv2d=tvm@cpu5"], "cpu:2 has no device 'cpu5'"),
    (["--pin", "relax.nn.conv2d=cublas"], "--pin relax.nn.conv2d=cublas: node"),
    (["--pin", "conv2d=tvm@cpu1", "--device-memory", "cpu1=1KB"], "--device-memory cpu1=1KB: the nodes pinned"),
    (["--pin", "conv2d"], "--pin 'conv2d' is not PATTERN=BACKEND[@DEVICE]"),
])
@pytest.mark.parametrize("verb", ["run", "place"])
def test_verbs_refuse_a_constraint_before_building(pt2, cache, verb, args, says):
    res = CliRunner().invoke(cli, [verb, pt2, "--cluster", "cpu:2", "--costs", "roofline", *args])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert says in text, text
    assert "build the plan" not in text  # refused before anything is built


@pytest.mark.slow  # builds, times and runs the model
def test_run_verb_keeps_every_conv_on_tvm_and_records_the_node_table(pt2, tmp_path, cache, monkeypatch):
    out = tmp_path / "run.json"
    monkeypatch.setenv("TVM_PESTO_MEASURE_FINAL", "1")  # the final choice weighs its options, each honouring the pin
    res = CliRunner().invoke(cli, ["run", pt2, "--cluster", "cpu:2", "--costs", "roofline", "--repeat", "3",
                                   "--refit", "--pin", PIN, "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert schema_problems("run", d) == []
    _convs_on_tvm(d["nodes"])
    assert d["max_abs_err"] <= 1e-4
    assert d["constraints"]["pin"] == [PIN] and d["holds_under"] == [f"--pin {PIN}"]
    assert d["flow"]["holds_under"] == [f"--pin {PIN}"]
    assert d["decision"]["measured"] and d["decision"]["constraints"]["holds_under"] == [f"--pin {PIN}"]
    assert not any(o["name"].startswith("library:onnxruntime") and "+tvm" not in o["name"]
                   for o in d["decision"]["options"])
    if d["decision"].get("claim"):
        assert d["decision"]["claim"]["holds_under"] == [f"--pin {PIN}"]
