"""The plan-applying rewrite, as a pass test (Before / Expected) plus numerics."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_pesto.api import PlacementPass, analyze
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.rewrite import apply_plan, plan_segments
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import PlanError
from tvm_pesto.plan import Plan
from tvm_pesto.run.program import split_by_device


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

    @R.function
    def dev0_seg0(x: R.Tensor((4, 4), dtype="float32")) -> R.Tensor((4, 4), dtype="float32"):
        R.func_attr({"pesto.device": 0, "pesto.position": 0})
        with R.dataflow():
            c: R.Tensor((4, 4), dtype="float32") = R.matmul(x, x, out_dtype=None)
            gv: R.Tensor((4, 4), dtype="float32") = c
            R.output(gv)
        return gv

    @R.function
    def dev1_seg0(x: R.Tensor((4, 4), dtype="float32"), y: R.Tensor((4, 4), dtype="float32"),
                  c: R.Tensor((4, 4), dtype="float32")) -> R.Tensor((4, 4), dtype="float32"):
        R.func_attr({"pesto.device": 1, "pesto.position": 0})
        with R.dataflow():
            a: R.Tensor((4, 4), dtype="float32") = R.matmul(x, y, out_dtype=None)
            b: R.Tensor((4, 4), dtype="float32") = R.nn.relu(a)
            d: R.Tensor((4, 4), dtype="float32") = R.add(b, c)
            gv: R.Tensor((4, 4), dtype="float32") = d
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((4, 4), dtype="float32"), y: R.Tensor((4, 4), dtype="float32")):
        R.func_attr({"pesto.placed": True})
        cls = Expected
        with R.dataflow():
            s0: R.Tensor((4, 4), dtype="float32") = cls.dev0_seg0(x)
            x_d1: R.Tensor((4, 4), dtype="float32", vdevice="llvm:1:global") = R.to_vdevice(x, dst_vdevice="llvm:1:global")
            y_d1: R.Tensor((4, 4), dtype="float32", vdevice="llvm:1:global") = R.to_vdevice(y, dst_vdevice="llvm:1:global")
            c_d1: R.Tensor((4, 4), dtype="float32", vdevice="llvm:1:global") = R.to_vdevice(s0, dst_vdevice="llvm:1:global")
            s1: R.Tensor((4, 4), dtype="float32") = cls.dev1_seg0(x_d1, y_d1, c_d1)
            d_d0: R.Tensor((4, 4), dtype="float32", vdevice="llvm:0:global") = R.to_vdevice(s1, dst_vdevice="llvm:0:global")
            gv: R.Tensor((4, 4), dtype="float32", vdevice="llvm:0:global") = d_d0
            R.output(gv)
        return gv


def _plan():
    # groups: [[2] = c], [[0, 1, 3] = matmul+relu+add]
    return Plan([0, 1], [[0], [1]], "manual")


def test_apply_plan_matches_expected():
    an = analyze(Before)
    assert an.groups == [[2], [0, 1, 3]]
    after = apply_plan(an.rg, an.groups, _plan(), parse_cluster("cpu:2"))
    tvm.ir.assert_structural_equal(after, Expected)


def test_split_by_device_and_numerics():
    cluster = parse_cluster("cpu:2")
    an = analyze(Before)
    placed = apply_plan(an.rg, an.groups, _plan(), cluster)
    per = split_by_device(placed)
    assert sorted(per) == [0, 1]
    assert [gv.name_hint for gv in per[1].get_global_vars()] == ["dev1_seg0"]
    pm = PlacedModule(placed, cluster)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 4), dtype="float32"), rng.standard_normal((4, 4), dtype="float32")
    out = pm(x, y)
    np.testing.assert_allclose(out, np.maximum(x @ y, 0) + x @ x, rtol=1e-5, atol=1e-5)
    _, trace = pm.run_traced(x, y)
    assert {t.device for t in trace if t.kind == "compute"} == {0, 1}
    pm.close()


def test_segments_cut_at_cross_device_edges():
    an = analyze(Before)
    segs = plan_segments(an.rg, an.groups, _plan())
    assert [(s.device, s.groups) for s in segs] == [(0, [0]), (1, [1])]


def test_plan_with_wrong_size_is_rejected():
    an = analyze(Before)
    with pytest.raises(PlanError, match="fused groups"):
        apply_plan(an.rg, an.groups, Plan([0, 0, 1], [[0, 1], [2]]), parse_cluster("cpu:2"))


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
    bad = Plan([0, 1, 0], [[2, 0], [1]])
    with pytest.raises(PlanError, match="contradict"):
        apply_plan(an.rg, an.groups, bad, parse_cluster("cpu:2"))


def test_placement_pass_in_a_sequential():
    seq = tvm.transform.Sequential([PlacementPass("cpu:2", solver="heft", costs="roofline")])
    out = seq(Before)
    assert "main" in [gv.name_hint for gv in out.get_global_vars()]
    assert any(gv.name_hint.startswith("dev") for gv in out.get_global_vars())
