"""Models a user brings, placed over two devices, run in TVM's own VM as the unplaced module
runs: every value a segment reads (constants, ``arange`` and the int64 index arithmetic on
it included) lives on the segment's device. And a placed model owns its library units: it
exports and runs after ``release_all()``."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

import tvm_pesto
from tvm_pesto.backends import release_all
from tvm_pesto.builder.program import legalize_on_devices
from tvm_pesto.builder.rewrite import apply_plan, cluster_vdevices
from tvm_pesto.candidates import placement_candidates
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.candidates.generate import Candidate
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.plan import Plan
from random_relax import example_inputs, random_function
from user_encoders import relax_module

pytestmark = pytest.mark.slow  # random and users' models built and run: out of the `-m "not slow"` lane

CLUSTER = parse_cluster("cpu:2")
DEVICES = [tvm.cpu(0), tvm.cpu(1)]
MODULES_PER_BATCH = 50
BATCHES = 3  # 150 random modules per run (the suite's 15 minutes: 20 s a batch on 2 cores)


def _numpy(out) -> list[np.ndarray]:
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _max_err(got, want) -> float:
    return max(float(np.abs(g - w).max() / max(1.0, float(np.abs(w).max()))) for g, w in zip(got, want))


def _random_topological_order(graph, rng) -> list[int]:
    """A topological order of ``graph`` with ties broken at random (a valid per-device order)."""
    indeg = {v: len(graph.preds(v)) for v in range(graph.num_nodes)}
    ready, order = [v for v, k in indeg.items() if k == 0], []
    while ready:
        v = ready.pop(int(rng.integers(len(ready))))
        order.append(v)
        for w in graph.succs(v):
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order


#: How :func:`forced_plan` splits: alternate along a random topological order (the most
#: crossings), a fair coin per group, a coin that favours device 1 (where the VM's default
#: device is wrong), or everything on device 1 but the last group.
PLAN_KINDS = ("alternate", "random", "mostly-device-1", "device-1")


def forced_plan(analysis, seed: int, kind: str | None = None) -> Plan:
    """A plan over two devices with TVM units only, forced to split (both devices get work);
    ``kind`` is one of :data:`PLAN_KINDS` (default: chosen by ``seed``)."""
    rng = np.random.default_rng(seed)
    kind = PLAN_KINDS[seed % len(PLAN_KINDS)] if kind is None else kind
    g = analysis.graph
    order = _random_topological_order(g, rng)
    pos = np.empty(g.num_nodes, dtype=int)
    pos[order] = np.arange(g.num_nodes)
    if kind == "alternate":
        assignment = pos % 2
    elif kind == "device-1":
        assignment = np.ones(g.num_nodes, dtype=int)
    else:
        assignment = (rng.random(g.num_nodes) < (0.5 if kind == "random" else 0.8)).astype(int)
    if len(set(assignment.tolist())) < 2:
        assignment[order[-1]] = 1 - assignment[order[-1]]
    return Plan.from_assignment(assignment, pos, 2, solver=f"forced-{kind}",
                                units=list(placement_candidates(analysis.rg, analysis.groups)))


@mutator
class _CallsRenamed(PyExprMutator):
    """Calls of the global functions in ``gvars`` made to their new global vars."""

    def __init__(self, gvars):
        super().__init__()
        self.gvars = gvars

    def visit_call_(self, op):
        call = super().visit_call_(op)
        new = self.gvars.get(call.op) if isinstance(call.op, relax.GlobalVar) else None
        return call if new is None else relax.Call(new, call.args, call.attrs, call.ty_args)


def _batch(seeds):
    """The unplaced modules as one IRModule (``f<seed>``), the placed ones as another: each
    module placed on its own (its own analysis and plan), its ``main`` renamed ``f<seed>``
    and its segments ``f<seed>_dev<d>_seg<p>``, so two compiles cover the batch."""
    vdevs = cluster_vdevices(CLUSTER)
    base = tvm.IRModule()
    base.update_global_info("vdevice", vdevs)
    bb = relax.BlockBuilder(base)
    ref, plans = {}, {}
    for seed in seeds:
        mod = random_function(seed)
        ref[relax.GlobalVar(f"f{seed}")] = mod["main"].with_attr("global_symbol", f"f{seed}")
        an = tvm_pesto.analyze(mod)
        plans[seed] = forced_plan(an, seed)
        placed = apply_plan(an.rg, plans[seed], CLUSTER, vdevices=vdevs)
        gvars = {gv: bb.add_func(placed[gv], f"f{seed}_{gv.name_hint}")
                 for gv in placed.get_global_vars() if gv.name_hint != "main"}
        bb.add_func(_CallsRenamed(gvars).visit_expr(placed["main"]).with_attr("global_symbol", f"f{seed}"),
                    f"f{seed}")
    placed = bb.get()
    placed.update_global_info("vdevice", vdevs)
    return tvm.IRModule(ref), placed, plans


def _placed_alone(seed: int):
    """Module ``seed`` placed and built on its own, in the stock VM (to name the modules of a
    batch that fails to build)."""
    mod = random_function(seed)
    an = tvm_pesto.analyze(mod)
    placed = legalize_on_devices(apply_plan(an.rg, forced_plan(an, seed), CLUSTER))
    return relax.VirtualMachine(tvm.compile(placed), DEVICES)["main"]


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"


def _failure(seed: int, ref_vm, placed_fn) -> str | None:
    """Why placed module ``seed`` (``placed_fn()`` gives its function) does not compute what
    the unplaced one does; None when it does."""
    args = [tvm.runtime.tensor(a) for a in example_inputs(seed)]
    want = _numpy(ref_vm[f"f{seed}"](*args))
    try:
        err = _max_err(_numpy(placed_fn()(*args)), want)
    except Exception as e:  # noqa: BLE001 - collected, reported with the seed
        return _first_line(e)
    return None if err <= 1e-5 else f"max relative error {err:.3g}"


@pytest.mark.parametrize("batch", range(BATCHES))
def test_random_modules_placed_on_two_devices_run_in_the_stock_vm_as_unplaced(batch):
    """Seeded random modules over the ops the importers produce (:mod:`random_relax`), each
    forced onto two devices (:func:`forced_plan`), compute in TVM's VM on ``[cpu(0), cpu(1)]``
    what the unplaced module computes on ``cpu(0)``."""
    seeds = range(batch * MODULES_PER_BATCH, (batch + 1) * MODULES_PER_BATCH)
    ref_mod, placed_mod, plans = _batch(seeds)
    ref_vm = relax.VirtualMachine(tvm.compile(ref_mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu(0))
    try:
        vm = relax.VirtualMachine(tvm.compile(legalize_on_devices(placed_mod)), DEVICES)
    except Exception:  # noqa: BLE001 - the batch does not build: build and check its modules one by one
        vm = None
    failures = []
    for seed in seeds:
        placed_fn = (lambda s=seed: vm[f"f{s}"]) if vm is not None else (lambda s=seed: _placed_alone(s))
        why = _failure(seed, ref_vm, placed_fn)
        if why is not None:
            failures.append(f"seed {seed} ({plans[seed].solver}): {why}")
    assert not failures, ("placed random modules do not compute what the unplaced ones do" +
                          ("" if vm is not None else " (the batch did not build)") + ":\n" + "\n".join(failures))


@pytest.mark.parametrize("name", ["t5", "distilbert"])
def test_user_encoder_through_the_placement_pass_runs_in_the_stock_vm(name):
    """As a user calls it: PlacementPass(m-topo, roofline, split_margin=0), tvm.compile,
    relax.VirtualMachine on two CPU devices; and with every group but the last on device 1
    (the ``arange`` chains of the position ids and the relative position bias there)."""
    mod, inputs, want = relax_module(name)
    args = [tvm.runtime.tensor(a) for a in inputs]
    pp = tvm_pesto.PlacementPass("cpu:2", costs="roofline", solver="m-topo", split_margin=0, measure_final=False)
    vm = relax.VirtualMachine(tvm.compile(pp(mod)), DEVICES)
    assert _max_err(_numpy(vm["main"](*args)), [want]) <= 1e-4
    forced = forced_plan(tvm_pesto.analyze(mod), seed=0, kind="device-1")
    vm = relax.VirtualMachine(tvm.compile(tvm_pesto.PlacementPass(CLUSTER, plan=forced)(mod)), DEVICES)
    assert _max_err(_numpy(vm["main"](*args)), [want]) <= 1e-4


def test_a_placed_model_exports_and_runs_after_release_all(tmp_path):
    """release_all() drops the backends' references; the placed model keeps its ONNX Runtime
    unit, so it runs, exports, and its bundle loads and runs."""
    mod, (x,) = tiny_mlp()
    an = tvm_pesto.analyze(mod)
    order = an.rg.graph.topo_order()
    half = len(order) // 2
    units = [Candidate("onnxruntime", tuple(sorted(order[:half]))), Candidate("tvm", tuple(sorted(order[half:])))]
    pm = tvm_pesto.build(mod, CLUSTER, plan=Plan([1, 0], [[1], [0]], units=units))
    assert "onnxruntime" in pm.plan.backend_mix() and pm.devices_used == [0, 1]
    assert release_all() >= 1
    assert pm.units and all(tvm.get_global_func(g, allow_missing=True) is None for g in pm.units)
    want = pm(x)
    path = pm.export(str(tmp_path / "bundle"))
    np.testing.assert_array_equal(pm(x), want)
    loaded = tvm_pesto.load(path)
    try:
        np.testing.assert_allclose(loaded(x), want, rtol=1e-6, atol=1e-6)
    finally:
        loaded.close()
        pm.close()
    ref = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu(0))
    np.testing.assert_allclose(want, ref["main"](tvm.runtime.tensor(x)).numpy(), rtol=1e-4, atol=1e-4)


def test_a_users_own_torch_model_and_its_onnx_come_in_through_the_top_level_importers(tmp_path):
    import torch

    class ConvAttention(torch.nn.Module):  # a conv stem, then attention over its positions
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.ReLU())
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            t = self.stem(x).flatten(2).transpose(1, 2)
            return self.attn(t, t, t, need_weights=False)[0].mean(1)

    torch.manual_seed(0)
    model = ConvAttention().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = model(torch.from_numpy(x)).detach().numpy()
    path = tmp_path / "conv_attention.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(path), input_names=["x"], dynamo=False)
    for mod in (tvm_pesto.from_torch(model, (x,)), tvm_pesto.from_onnx(str(path))):
        placed = tvm_pesto.build(mod, "cpu:2", backends="tvm", costs="roofline", measure_final=False)
        out = placed(x)
        placed.close()
        assert np.abs(np.asarray(out) - ref).max() < 1e-4


def test_a_tensor_moved_to_its_own_device_with_a_dtype_imports_as_a_cast():
    # aten.to.device, which TVM 0.27's importer lacks, beside integer positions whose retry
    # through PyTorch's decomposition fails in the importer too (timm's EdgeNeXt, both at once)
    import torch

    class Positions(torch.nn.Module):
        def forward(self, x):
            pos = (torch.arange(x.shape[-1]) // 2).to(x.device, torch.float32)
            mask = (torch.arange(x.shape[-1]) % 3).to(x.device, torch.bool)
            return (x * pos).masked_fill(mask, 0.0)

    x = torch.randn(2, 6)
    mod = tvm_pesto.from_torch(Positions(), (x,))
    ex = tvm.compile(mod, target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(got, Positions()(x).numpy(), rtol=1e-6)


def test_a_division_with_a_rounding_mode_keeps_the_dtype_of_its_tensor():
    # aten.div.Tensor_mode: TVM 0.27's converter makes the number an int32 constant beside a
    # float tensor (timm's EdgeNeXt floor-divides float positions by 2), which Relax refuses
    import torch

    class Divisions(torch.nn.Module):
        def forward(self, x, i):
            return (torch.div(x, 2, rounding_mode="floor"), torch.div(x, 3.0, rounding_mode="trunc"),
                    torch.div(i, 2, rounding_mode="floor"), torch.div(7.0, x, rounding_mode="floor"))

    x, i = torch.randn(2, 5) * 10, torch.arange(-5, 5).reshape(2, 5)
    mod = tvm_pesto.from_torch(Divisions(), (x, i))
    ex = tvm.compile(mod, target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(i.numpy()))
    for g, want in zip(got, Divisions()(x, i)):
        assert g.numpy().dtype == want.numpy().dtype
        np.testing.assert_array_equal(g.numpy(), want.numpy())
