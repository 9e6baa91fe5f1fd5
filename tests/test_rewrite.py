"""The plan-applying rewrite, as a pass test (Before / Expected) plus numerics."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_pesto.api import PlacementPass, analyze
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.program import legalize_on_devices, split_by_device
from tvm_pesto.builder.rewrite import apply_plan, plan_segments
from tvm_pesto.candidates import Candidate
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import PlanError
from tvm_pesto.plan import Plan


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((4, 4), "float32"), y: R.Tensor((4, 4), "float32")):
        with R.dataflow():
            a = R.matmul(x, y)
            b = R.nn.relu(a)
            c = R.matmul(x, x)
            d = R.add(b, c)
            R.output(d)
        return d


@I.ir_module
class Expected:
    I.module_global_infos({"vdevice": [I.vdevice({"kind": "llvm", "num-cores": 1}, 0, "global"),
                                       I.vdevice({"kind": "llvm", "num-cores": 1}, 1, "global")]})

    @R.function(private=True)
    def dev0_seg0(x: R.Tensor((4, 4), "float32", "llvm:0")) -> R.Tensor((4, 4), "float32", "llvm:0"):
        R.func_attr({"pesto.device": 0, "pesto.position": 0})
        with R.dataflow():
            c: R.Tensor((4, 4), "float32", "llvm:0") = R.matmul(x, x, out_dtype=None)
            gv: R.Tensor((4, 4), "float32", "llvm:0") = c
            R.output(gv)
        return gv

    @R.function(private=True)
    def dev1_seg0(x: R.Tensor((4, 4), "float32", "llvm:1"), y: R.Tensor((4, 4), "float32", "llvm:1"),
                  c: R.Tensor((4, 4), "float32", "llvm:1")) -> R.Tensor((4, 4), "float32", "llvm:1"):
        R.func_attr({"pesto.device": 1, "pesto.position": 0})
        with R.dataflow():
            a: R.Tensor((4, 4), "float32", "llvm:1") = R.matmul(x, y, out_dtype=None)
            b: R.Tensor((4, 4), "float32", "llvm:1") = R.nn.relu(a)
            d: R.Tensor((4, 4), "float32", "llvm:1") = R.add(b, c)
            gv: R.Tensor((4, 4), "float32", "llvm:1") = d
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((4, 4), "float32", "llvm:0"), y: R.Tensor((4, 4), "float32", "llvm:0")) \
            -> R.Tensor((4, 4), "float32", "llvm:0"):
        R.func_attr({"pesto.placed": True})
        cls = Expected
        with R.dataflow():
            s0: R.Tensor((4, 4), "float32", "llvm:0") = cls.dev0_seg0(x)
            x_d1: R.Tensor((4, 4), "float32", "llvm:1") = R.to_vdevice(x, dst_vdevice="llvm:1")
            y_d1: R.Tensor((4, 4), "float32", "llvm:1") = R.to_vdevice(y, dst_vdevice="llvm:1")
            c_d1: R.Tensor((4, 4), "float32", "llvm:1") = R.to_vdevice(s0, dst_vdevice="llvm:1")
            s1: R.Tensor((4, 4), "float32", "llvm:1") = cls.dev1_seg0(x_d1, y_d1, c_d1)
            d_d0: R.Tensor((4, 4), "float32", "llvm:0") = R.to_vdevice(s1, dst_vdevice="llvm:0")
            gv: R.Tensor((4, 4), "float32", "llvm:0") = d_d0
            R.output(gv)
        return gv


def _plan():
    # units: the fusion groups [[2] = c], [[0, 1, 3] = matmul+relu+add]
    units = [Candidate("tvm", (2,), "fusion_group"), Candidate("tvm", (0, 1, 3), "fusion_group")]
    return Plan([0, 1], [[0], [1]], "manual", units=units)


def test_apply_plan_matches_expected():
    an = analyze(Before)
    assert an.groups == [[2], [0, 1, 3]]
    after = apply_plan(an.rg, _plan(), parse_cluster("cpu:2"))
    tvm.ir.assert_structural_equal(after, Expected)


@I.ir_module
class WithWeight:
    @R.function
    def main(x: R.Tensor((2, 4), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.matmul(a, R.const(np.arange(16, dtype="float32").reshape(4, 4)))
            R.output(b)
        return b


def test_a_segment_off_device_0_copies_its_constants_there():
    """TVM's VM keeps constants on its first device: a segment on device 1 copies each one
    (R.to_vdevice) before use, so no kernel mixes devices."""
    an = analyze(WithWeight)
    units = [Candidate("tvm", (0,), "fusion_group"), Candidate("tvm", (1,), "fusion_group")]
    placed = apply_plan(an.rg, Plan([0, 1], [[0], [1]], "manual", units=units), parse_cluster("cpu:2"))
    seg = placed["dev1_seg0"]
    first = seg.body.blocks[0].bindings[0]
    assert first.value.op.name == "relax.to_vdevice" and isinstance(first.value.args[0], tvm.ir.Constant)
    assert int(first.var.ty.vdevice.vdevice_id) == 1
    x = np.random.default_rng(0).standard_normal((2, 4)).astype("float32")
    want = np.maximum(x, 0) @ np.arange(16, dtype="float32").reshape(4, 4)
    ex = tvm.compile(legalize_on_devices(placed))
    vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(1)])
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x, tvm.cpu(0))).numpy(), want, rtol=1e-5)


def test_split_by_device_and_numerics():
    cluster = parse_cluster("cpu:2")
    an = analyze(Before)
    placed = apply_plan(an.rg, _plan(), cluster)
    per = split_by_device(placed)
    assert sorted(per) == [0, 1]
    assert [gv.name_hint for gv in per[1].get_global_vars()] == ["dev1_seg0"]
    assert per[1]["dev1_seg0"].params[0].ty.vdevice is None  # one-device modules: plain types
    pm = PlacedModule(placed, cluster, _plan())
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 4), dtype="float32"), rng.standard_normal((4, 4), dtype="float32")
    out = pm(x, y)
    np.testing.assert_allclose(out, np.maximum(x @ y, 0) + x @ x, rtol=1e-5, atol=1e-5)
    _, trace = pm.run_traced(x, y)
    assert {t.device for t in trace if t.kind == "compute"} == {0, 1}
    pm.close()


def test_segments_cut_at_cross_device_edges():
    an = analyze(Before)
    segs = plan_segments(an.rg, an.groups, _plan())  # groups = the units' nodes (placement alone)
    assert [(s.device, s.groups) for s in segs] == [(0, [0]), (1, [1])]


def test_plan_with_wrong_size_or_no_units_is_rejected():
    an = analyze(Before)
    units = [Candidate("tvm", (2,)), Candidate("tvm", (0, 1)), Candidate("tvm", (3,))]
    with pytest.raises(PlanError, match="has 3 units but assigns 2"):
        apply_plan(an.rg, Plan([0, 1], [[0], [1]], units=units), parse_cluster("cpu:2"))
    with pytest.raises(PlanError, match="no units"):
        apply_plan(an.rg, Plan([0, 1], [[0], [1]]), parse_cluster("cpu:2"))
    overlap = [Candidate("tvm", (2, 3)), Candidate("tvm", (0, 1, 3))]
    with pytest.raises(PlanError, match="exactly once"):
        apply_plan(an.rg, Plan([0, 1], [[0], [1]], units=overlap), parse_cluster("cpu:2"))


def test_contradictory_order_is_rejected():
    @I.ir_module
    class Chain:
        @R.function
        def main(x: R.Tensor((4, 4), "float32")):
            with R.dataflow():
                a = R.matmul(x, x)
                b = R.matmul(a, x)
                c = R.matmul(b, x)
                R.output(c)
            return c

    an = analyze(Chain)
    # a and c on device 0 with c first, b on device 1: c waits for b, b for a, a after c.
    units = [Candidate("tvm", (v,)) for v in range(3)]
    bad = Plan([0, 1, 0], [[2, 0], [1]], units=units)
    with pytest.raises(PlanError, match="contradict"):
        apply_plan(an.rg, bad, parse_cluster("cpu:2"))


def test_placement_pass_in_a_sequential_runs_in_tvms_own_vm():
    pp = PlacementPass("cpu:2", backends="tvm", solver="m-topo", costs="roofline", measure_final=False)
    out = tvm.transform.Sequential([pp])(Before)
    assert "main" in [gv.name_hint for gv in out.get_global_vars()]
    assert any(gv.name_hint.startswith("dev") for gv in out.get_global_vars())
    assert pp.last_placement is not None and pp.last_placement.plan.units is not None
    ex = tvm.compile(out)
    vm = relax.VirtualMachine(ex, [d.tvm_device() for d in pp.cluster.devices])
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 4), dtype="float32"), rng.standard_normal((4, 4), dtype="float32")
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ y, 0) + x @ x, rtol=1e-5, atol=1e-5)
