"""Training steps (tvm_pesto.train): gradients against PyTorch autograd, placed runs equal to
single-device runs with the state kept on its devices, the memory the simulator counts for
a step, and clear errors for what cannot be trained."""
import json
import os

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import tvm_pesto
from tvm_pesto.errors import GraphError, TrainingError
from tvm_pesto.plan import Plan, simulate
from tvm_pesto.train import build_step, build_trainer, gradient_check, place_step
from tvm_pesto.train.choices import make_loss, make_optimizer
from tvm_pesto.train.constraints import group_summary, training_colocation

# inception_v3 and mobilenet_v2 train too, but their float32 gradients differ from autograd by
# up to 2.6e-2 and 3.9e-4: TVM sums BatchNorm's backward reductions sequentially in float32
# over large feature maps (docs/training.md has the numbers and the float64 comparison).
# resnet50's ops (convolutions, BatchNorm, residual adds) are vgg11's and those of the BatchNorm
# CNN trained against PyTorch below; its check took 85 s of the suite
GRAD_MODELS = ["mlp_mixer", "bert", "vgg11", "gpt2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", GRAD_MODELS)
def test_gradients_match_pytorch_autograd(name):
    step = build_step(name)
    r = gradient_check(step)
    assert r["max_rel_err"] <= 1e-4, (r["worst_param"], r["max_rel_err"])
    assert abs(r["loss_tvm"] - r["loss_torch"]) <= 1e-5 * abs(r["loss_torch"])
    assert set(r["rel_err"]) == set(step.backbone.param_names)


def test_every_gradient_op_belongs_to_a_forward_op():
    step = build_step("mlp_mixer")
    backward = [k for k, role in step.roles.items() if role == "backward"]
    assert backward and set(step.grad_of) == set(backward)
    assert all(step.roles[f] == "forward" for f in step.grad_of.values())
    an = tvm_pesto.analyze(step.mod)
    groups = training_colocation(step, an.rg)
    s = group_summary(groups, an.op_graph.num_nodes)
    assert s["largest"] < an.op_graph.num_nodes / 10  # constrained, not one device for all


class TinyCNN(nn.Module):
    """Two parallel BatchNorm branches (placement has something to split); no bias before a
    BatchNorm (its gradient vanishes, and Adam would amplify the rounding noise)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(4, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = self.a(x)
        return self.fc((self.b(y) + self.c(y)).mean(dim=(2, 3)))


def _tiny():
    torch.manual_seed(0)
    return TinyCNN(), (np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32),)


@pytest.mark.slow
def test_placed_run_equals_single_device_and_pytorch():
    model, inputs = _tiny()
    step = build_step((model, inputs), "cross_entropy", "adam")
    placed = build_trainer(step, cluster="cpu:2", costs="roofline", solver="m-etf", deterministic=True)
    single = build_trainer(step, cluster="cpu:2", costs="roofline", solver="single")
    try:
        assert placed.devices_used == [0, 1] and len(single.devices_used) == 1
        prog = placed.module.program
        # state lives where it is read, and its next value is made on that same device
        maker = {s.out: s.device for s in prog.steps if s.kind == "call"}
        for s in prog.steps:
            if s.kind in ("item", "alias") and s.args[0] in maker:
                maker[s.out] = maker[s.args[0]]
        fields = prog.output if isinstance(prog.output, tuple) else next(
            s.args for s in prog.steps if s.out == prog.output and s.kind == "tuple")
        assert 1 in [prog.input_devices[i] for _, i in prog.state]
        for o, i in prog.state:
            assert maker[fields[o]] == prog.input_devices[i], prog.inputs[i]  # made there, not copied
        x, t = placed.batch()
        a, b = placed.fit(4, x, t)["losses"], single.fit(4, x, t)["losses"]
        assert np.allclose(a, b, rtol=1e-5, atol=0), (a, b)
        assert a[-1] < a[0]
        sa, sb = placed.state(), single.state()
        for k in sa:
            np.testing.assert_allclose(sa[k], sb[k], rtol=1e-5, atol=1e-6, err_msg=k)
    finally:
        placed.close()
        single.close()
    # the same four Adam steps in PyTorch: parameters and BatchNorm running statistics
    ref = step.backbone.torch_model
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    xt, tt = torch.from_numpy(x[0]), torch.from_numpy(t)
    for _ in range(4):
        opt.zero_grad()
        nn.functional.cross_entropy(ref(xt), tt).backward()
        opt.step()
    sd = ref.state_dict()
    for name in step.backbone.param_names + step.backbone.state_names:
        np.testing.assert_allclose(sa[name], sd[name].numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_memory_of_a_step_counts_kept_activations_once():
    """Hand count for Linear(4,3) -> ReLU -> Linear(3,2), MSE, SGD (batch 1, float32).

    TVM's fusion groups are the units; a unit holds its weights and the tensors leaving it.
    Weights: W1 48 B + W2 24 B + SGD's int64 step counter 8 B, each once although W1 and W2
    are read by the forward, the backward and the update; constants 28 B (2.0 of the mean's
    gradient 4, two 0.0 of the ReLU gradient 8, int64 1 of the counter 8, lr twice 8).
    Tensors leaving units, 187 B: the activations the backward reads, kept to the end of the
    step: pre-ReLU 12 B (the ReLU gradient's mask), ReLU output 12 B (dW2), residual 8 B (the
    MSE gradient); the square 8, the loss 4, the loss gradient's pieces 4 + 8 + 8 + 8, the
    transposed output gradient 8, the ReLU mask 3 (bool), the hidden gradient 12 and its
    transpose 12, the new counter 8, the new W1 48 and W2 24. Total 80 + 28 + 187 = 295.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 2, bias=False))
    step = build_step((model, (np.ones((1, 4), np.float32),)), "mse", "sgd")
    pl, _ = place_step(step, "cpu:2", solver="single", costs="roofline")
    assert sorted(pl.sim.peak_memory.tolist()) == [0.0, 295.0]
    # The ReLU's unit alone on device 1: it holds its output (12 B) and the pre-ReLU
    # activation it receives (12 B); device 0 keeps everything else and receives the ReLU
    # output, which two of its units read (the next layer and dW2): one 12 B copy.
    prob = pl.problem
    relu = next(u for u in range(prob.num_nodes) if prob.graph.nodes[u].name == "lv2:relu")
    assign = np.zeros(prob.num_nodes, dtype=np.int64)
    assign[relu] = 1
    plan = Plan.from_assignment(assign, np.argsort(np.argsort(prob.graph.topo_order())), 2)
    assert simulate(prob, plan).peak_memory.tolist() == [295.0, 24.0]


@pytest.mark.slow
def test_training_decreases_the_loss_on_the_synthetic_task():
    tr = build_trainer("mlp_mixer", "auto", "sgd", "cpu:2", costs="roofline", solver="single")
    try:
        losses = tr.fit(20)["losses"]
    finally:
        tr.close()
    assert losses[-1] < 0.8 * losses[0]


def test_no_trainable_parameters_is_a_clear_error():
    with pytest.raises(TrainingError, match="no trainable parameter.*give a model with parameters"):
        build_step((nn.ReLU(), (np.ones((1, 4), np.float32),)))


@pytest.mark.slow
def test_unknown_optimizer_and_loss_name_the_fix():
    with pytest.raises(TrainingError, match=r"unknown optimizer 'adagrad'; use one of sgd, momentum, adam"):
        make_optimizer("adagrad")
    step_out = build_step("bert").backbone.output_type
    with pytest.raises(TrainingError, match=r"unknown loss 'hinge'; use one of auto, mse"):
        make_loss("hinge", step_out)
    with pytest.raises(TrainingError, match=r"needs an output of shape \(batch, classes\).*use --loss mse"):
        make_loss("cross_entropy", step_out)
    with pytest.raises(TrainingError, match="learning rate must be > 0"):
        make_optimizer("sgd", lr=0.0)


def test_operator_without_gradient_is_named():
    class Sliced(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)[:, :2]

    with pytest.raises(TrainingError, match=r"without a gradient in TVM: relax.strided_slice; register one"):
        build_step((Sliced(), (np.ones((1, 4), np.float32),)), "mse")


@pytest.mark.slow
def test_cli_train_writes_the_figures(tmp_path):
    from tvm_pesto.cli.main import cli

    out = tmp_path / "out.json"
    res = CliRunner().invoke(cli, ["train", "mlp_mixer", "--steps", "5", "--costs", "roofline", "--solver", "m-etf",
                                   "--deterministic", "--json", str(out), "--trace-dir", str(tmp_path / "trace")])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert len(r["losses"]) == 5 and r["losses"][-1] < r["losses"][0]
    assert r["grad_max_rel_err"] <= 1e-4
    # mlp_mixer's step is one chain: with roofline costs no solver splits it (the split itself
    # is checked on a two-branch CNN above); the memory of both devices is reported either way
    assert r["devices_used"] == len(r["devices"]) >= 1
    assert r["measured_step_s"] > 0 and r["simulated_step_s"] > 0
    assert len(r["peak_memory_bytes"]) == 2 and max(r["peak_memory_bytes"]) > 0
    assert {"gantt.png", "plan_trace.json", "step_trace.json"} <= set(os.listdir(tmp_path / "trace"))


def test_cli_train_bad_input():
    from tvm_pesto.cli.main import cli

    res = CliRunner().invoke(cli, ["train", "nosuchmodel", "--steps", "2"])
    assert res.exit_code == 2 and "unknown zoo model 'nosuchmodel'" in res.output
    res = CliRunner().invoke(cli, ["train", "mlp_mixer", "--steps", "0"])
    assert res.exit_code == 2 and "--steps must be >= 1" in res.output
    res = CliRunner().invoke(cli, ["train", "mlp_mixer", "--optimizer", "adagrad"])
    assert res.exit_code == 2 and "adagrad" in res.output


def test_unknown_zoo_model_lists_the_names():
    with pytest.raises(GraphError, match="unknown zoo model 'nosuch'; valid names"):
        build_step("nosuch")


@pytest.mark.slow
def test_bench_training_measures_and_simulates_every_plan():
    from tvm_pesto.bench.training import TrainingBenchSettings, bench_training, training_markdown

    res = bench_training(["mlp_mixer"], settings=TrainingBenchSettings(
        solvers=["single", "m-etf"], gpu_clusters=["2xV100-nvlink"], steps=2, costs="roofline"))
    m = res["models"]["mlp_mixer"]
    used = m["cpu"]["m-etf"]["devices_used"]
    assert m["cpu"]["single"]["devices_used"] == [0] and used and set(used) <= {0, 1}
    for r in m["cpu"].values():
        assert r["measured_step_s"] > 0 and r["simulated_step_s"] > 0 and len(r["losses"]) == 3
    np.testing.assert_allclose(m["cpu"]["single"]["losses"], m["cpu"]["m-etf"]["losses"], rtol=1e-5)
    assert m["gpu"]["2xV100-nvlink"]["m-etf"]["simulated_step_s"] > 0
    md = training_markdown(res)
    assert f"| mlp_mixer | m-etf | {','.join(map(str, used))} |" in md and "2xV100-nvlink" in md
    # what `tvm-pesto bench training --json` writes (it adds these two) follows its schema
    from tvm_pesto.jsonio import jsonable, schema_problems

    written = {**res, "deterministic": True, "command": "tvm-pesto bench training"}
    assert schema_problems("bench-training", jsonable(written)) == []
