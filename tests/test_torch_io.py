"""A placed model called from PyTorch: torch tensors in, torch tensors out, on the library's
own call and on the executor's path alike, and a clear error for a tensor that needs grad."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

import torch  # noqa: E402 - a required dependency: a broken install fails, it does not skip

import tvm_pesto  # noqa: E402
from tvm_pesto.api import build_placement, place  # noqa: E402
from tvm_pesto.candidates.examples import tiny_mlp  # noqa: E402
from tvm_pesto.cluster.specs import cpu_cluster  # noqa: E402
from tvm_pesto.choose import whole_model_placement  # noqa: E402
from tvm_pesto.errors import ExecutionError  # noqa: E402
from tvm_pesto.plan import Plan  # noqa: E402
from tvm_pesto.run.torch_io import from_torch  # noqa: E402
from tvm_pesto.train import build_step, build_trainer  # noqa: E402


@pytest.fixture(scope="module")
def one_unit():
    import onnxruntime  # noqa: F401 - required
    mod, inputs = tiny_mlp()
    wide = cpu_cluster(1)
    placed = build_placement(whole_model_placement(place(mod, wide, costs="roofline"), "onnxruntime", wide), wide)
    assert placed._direct is not None  # one ONNX Runtime unit: the library's own call
    yield placed, inputs
    placed.close()


@pytest.fixture(scope="module")
def two_devices():
    """TVM's kernels on both devices, alternating (tensors cross between them)."""
    mod, inputs = tiny_mlp()
    pl = place(mod, "cpu:2", costs="roofline", backends="tvm")
    n = pl.problem.num_nodes
    order = np.argsort(np.argsort(pl.problem.graph.topo_order()))
    plan = dataclasses.replace(Plan.from_assignment(np.arange(n) % 2, order, 2), units=pl.plan.units)
    placed = tvm_pesto.build(mod, "cpu:2", backends="tvm", costs="roofline", plan=plan, measure_final=False)
    assert placed.devices_used == [0, 1] and any(s.kind == "copy" for s in placed.program.steps)
    yield placed, inputs
    placed.close()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["one_unit", "two_devices"])
def test_torch_in_torch_out_equal_to_numpy(which, request):
    placed, inputs = request.getfixturevalue(which)
    want = placed(*inputs)
    x = torch.from_numpy(inputs[0].copy())
    got = placed(x)
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu"
    np.testing.assert_array_equal(got.numpy(), want)
    # a second call on other values leaves the first result as it was (no buffer reused under it)
    other = placed(torch.from_numpy(2 * inputs[0]))
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(other.numpy(), placed(2 * inputs[0]))
    # a view that is not contiguous is read as its values, and the caller's tensor is not touched
    wide = torch.from_numpy(np.repeat(inputs[0], 2, axis=-1))
    np.testing.assert_array_equal(placed(wide[..., ::2]).numpy(), want)
    out, trace = placed.run_traced(x)
    assert isinstance(out, torch.Tensor) and trace
    np.testing.assert_array_equal(out.numpy(), want)
    assert placed.benchmark(x, repeat=3, warmup=1, min_seconds=0, warmup_seconds=0)["repeat"] == 3


def test_torch_inputs_take_the_library_call_not_the_vm(one_unit, monkeypatch):
    placed, inputs = one_unit

    def refuse(*a, **k):
        raise AssertionError("the VM path ran; the library's own call was expected")

    monkeypatch.setattr(placed, "_run", refuse)
    np.testing.assert_array_equal(placed(torch.from_numpy(inputs[0])).numpy(), placed(*inputs))


@pytest.mark.parametrize("which", ["one_unit", "two_devices"])
def test_a_tensor_that_requires_grad_is_refused_with_the_fix(which, request, monkeypatch):
    placed, inputs = request.getfixturevalue(which)
    x = torch.from_numpy(inputs[0].copy()).requires_grad_()
    with pytest.raises(ExecutionError, match=r"input 0 .*requires grad.*x\.detach\(\)"):
        placed(x)
    np.testing.assert_array_equal(placed(x.detach()).numpy(), placed(*inputs))


def test_what_numpy_cannot_view_goes_through_dlpack():
    bf = torch.arange(4, dtype=torch.float32).to(torch.bfloat16)
    args, torch_in = from_torch((bf, np.ones(2), torch.ones(())))
    assert torch_in
    assert isinstance(args[0], tvm.runtime.Tensor) and str(args[0].dtype) == "bfloat16"
    assert isinstance(args[1], np.ndarray) and isinstance(args[2], np.ndarray) and args[2].shape == ()
    a = np.ones(2)
    args, torch_in = from_torch((a,))
    assert not torch_in and args[0] is a  # no torch tensor: the arguments as they were


def test_a_training_step_from_torch_returns_torch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    step = build_step((model, (np.ones((1, 4), np.float32),)), "mse", "sgd")
    tr = build_trainer(step, cluster="cpu:1", costs="roofline", solver="single")
    try:
        (x,), t = tr.batch()
        want = [float(tr.module.step(x, t).numpy()) for _ in range(2)]
        tr.reset()
        got = [tr.module.step(torch.from_numpy(x), torch.from_numpy(t)) for _ in range(2)]
        assert all(isinstance(g, torch.Tensor) for g in got)
        assert [float(g) for g in got] == want and want[1] < want[0]
    finally:
        tr.close()


def test_the_same_tensor_gets_the_same_view_and_a_changed_one_a_new_view():
    views: dict = {}
    t = torch.arange(6.0).reshape(2, 3)
    first = from_torch((t,), views)[0][0]
    assert from_torch((t,), views)[0][0] is first  # a binding by the object recognises it
    t[0, 0] = 9.0
    assert first[0, 0] == 9.0  # a view: in-place changes are seen
    t.resize_(3, 2)
    again = from_torch((t,), views)[0][0]
    assert again is not first and again.shape == (3, 2)
    nc = torch.arange(6.0).reshape(2, 3).t()  # not contiguous: a copy each call, never kept
    a = from_torch((nc,), views)[0][0]
    nc[0, 0] = 5.0
    b = from_torch((nc,), views)[0][0]
    assert a[0, 0] == 0.0 and b[0, 0] == 5.0


def test_a_placed_model_sees_in_place_changes_of_a_torch_input(one_unit):
    placed, inputs = one_unit
    x = torch.from_numpy(inputs[0].copy())
    placed(x)
    x.mul_(2)
    np.testing.assert_array_equal(placed(x).numpy(), placed(2 * inputs[0]))
