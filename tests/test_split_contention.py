"""Issue 11, item 6: devices of one host slow each other (measured, simulated), and a split is
kept only when its predicted gain beats the cost source's error margin."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from tvm.script import ir as I
from tvm.script import relax as R

import tvm_pesto
from tvm_pesto.api import make_candidates, place
from tvm_pesto.cli.main import cli
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.contention import contention_factors, measure_contention
from tvm_pesto.cluster.dispatch import DEFAULT_DISPATCH, dispatch_figures, dispatch_s
from tvm_pesto.errors import ClusterError, PestoError
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.costs.calibrate.dispatch import measure_dispatch
from tvm_pesto.plan import Plan, Problem, simulate
from tvm_pesto.solve.split import check_margin, split_decision, split_margin


@pytest.fixture(autouse=True)
def _assumed_dispatch(tmp_path, monkeypatch):
    """Each test plans with the assumed dispatch figures (DEFAULT_DISPATCH) it reasons with, not
    a fit another test of this process kept (``run --refit``), measured under whatever load."""
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TVM_PESTO_MACHINE_CALIBRATION", "off")


@I.ir_module
class TwoBranches:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.nn.softmax(R.matmul(x, x), axis=-1)
            b = R.nn.softmax(R.matmul(x, x), axis=-1)
            c = R.add(a, b)
            R.output(c)
        return c


def _two_nodes(contention=None, hosts=(0, 0)):
    """Two independent 1-second compute-bound nodes, one per device."""
    c = parse_cluster("cpu:2")
    for dev, h in zip(c.devices, hosts):
        dev.host = h
    c = type(c)(c.name, c.devices, c.latency, c.bandwidth, dict(c.meta, **({"contention": contention}
                                                                           if contention else {})))
    g = OpGraph([OpNode(n, "op", flops=1e12, bytes_read=8, bytes_written=8) for n in "ab"], [])
    return Problem(g, c, np.ones((2, 2)))


def test_nodes_running_at_once_on_one_host_are_slowed_by_the_measured_factor():
    plan = Plan(np.array([0, 1], dtype=np.int32), [[0], [1]])
    assert simulate(_two_nodes(), plan).makespan == pytest.approx(1.0)  # nothing measured: no slowdown
    sim = simulate(_two_nodes({"compute": 1.6, "memory": 3.0}), plan)
    assert sim.makespan == pytest.approx(1.6) and sim.slowdown == pytest.approx([1.6, 1.6])  # compute-bound
    one = Plan(np.array([0, 0], dtype=np.int32), [[0, 1], []])  # one device: nothing overlaps
    assert simulate(_two_nodes({"compute": 1.6, "memory": 3.0}), one).makespan == pytest.approx(2.0)
    other_hosts = simulate(_two_nodes({"compute": 1.6, "memory": 3.0}, hosts=(0, 1)), plan)
    assert other_hosts.makespan == pytest.approx(1.0)  # devices of two machines share nothing


@pytest.mark.slow
def test_contention_is_measured_on_this_machine():
    c = parse_cluster("cpu:2")
    res = measure_contention(c, repeat=3, min_repeat_ms=10)
    for kind in ("compute", "memory"):  # each factor is the median slowdown of its kernels (at least 1)
        ratios = [k["together_s"][d] / k["alone_s"][d] for k in res["kernels"].values() if k["kind"] == kind
                  for d in k["alone_s"]]
        assert res[kind] == pytest.approx(max(float(np.median(ratios)), 1.0))
    assert contention_factors(c) == {"compute": res["compute"], "memory": res["memory"]}
    for k in res["kernels"].values():
        assert set(k["alone_s"]) == {"cpu0", "cpu1"} and all(v > 0 for v in k["together_s"].values())
        assert min(k["overlap"]) > 0.5  # the "together" runs really ran together
    with pytest.raises(ClusterError, match="no host with two devices.*cpu:2"):
        measure_contention(parse_cluster("cpu:1"))


@pytest.mark.slow
def test_cluster_bench_writes_the_contention_the_simulator_reads(tmp_path):
    out = tmp_path / "c.json"
    res = CliRunner().invoke(cli, ["cluster", "bench", "--cluster", "cpu:2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "slowdown: compute" in res.output
    loaded = parse_cluster(str(out))
    written = json.loads(out.read_text())["meta"]["contention"]
    assert contention_factors(loaded) == {"compute": written["compute"], "memory": written["memory"]}
    assert "dispatch per run" in res.output
    disp = json.loads(out.read_text())["meta"]["dispatch"]
    assert dispatch_figures(loaded) == {"run_s": disp["run_s"], "multi_device_s": disp["multi_device_s"],
                                        "measured": True}
    assert dispatch_s(loaded, 2) == disp["multi_device_s"]


def test_the_simulator_adds_the_dispatch_of_the_devices_a_plan_uses():
    split = Plan(np.array([0, 1], dtype=np.int32), [[0], [1]])
    one = Plan(np.array([0, 0], dtype=np.int32), [[0, 1], []])
    s2, s1 = simulate(_two_nodes(), split), simulate(_two_nodes(), one)
    assert s2.makespan == pytest.approx(1.0) and s1.makespan == pytest.approx(2.0)  # the schedule: unchanged
    assert s2.dispatch_s == DEFAULT_DISPATCH["multi_device_s"] and s1.dispatch_s == DEFAULT_DISPATCH["run_s"]
    # node b on device 1 reads its 8-byte input from device 0 and returns its 8-byte result there
    assert s1.io_s == 0.0 and s2.io_s == pytest.approx(2 * (30e-6 + 8 / 15e9))
    assert s2.run_s == pytest.approx(1.0 + s2.io_s + DEFAULT_DISPATCH["multi_device_s"])
    assert s2.summary()["run_s"] == pytest.approx(s2.run_s)
    measured = _two_nodes()
    measured.cluster.meta["dispatch"] = {"run_s": 1e-3, "multi_device_s": 0.25}
    assert simulate(measured, split).run_s == pytest.approx(1.25 + s2.io_s)
    assert simulate(measured, one).run_s == pytest.approx(2.001)
    away = simulate(measured, Plan(np.array([1, 1], dtype=np.int32), [[], [0, 1]]))  # one device, not home
    # both inputs copied before the run (one after another); a's result goes back while b runs
    assert away.dispatch_s == 0.25 and away.io_s == pytest.approx(3 * (30e-6 + 8 / 15e9))
    assert dispatch_figures(parse_cluster("cpu:2"))["measured"] is False


def test_a_split_that_saves_less_than_its_dispatch_is_dropped():
    """Scaled down 30x, the two branches' split schedule is ~39 us shorter than one device's:
    less than the ~39 us more a run on two devices costs the executor than a run on one, so
    even a 1 % margin drops it."""
    a = tvm_pesto.analyze(TwoBranches)
    table = _table(a) / 30.0  # 143 us on one device; split, with its transfers, 104 us
    pl = place(a, "cpu:2", backends="tvm", costs=table, split_margin=0.01, deterministic=True)
    d = pl.plan.info["split"]
    assert len(pl.plan.devices_used()) == 1 and not d["keep_split"]
    assert d["split_s"] > d["single_s"] == pytest.approx(pl.sim.run_s)
    assert d["split_s"] - DEFAULT_DISPATCH["multi_device_s"] < d["single_s"] - DEFAULT_DISPATCH["run_s"]  # schedule


def test_dispatch_is_measured_with_the_executor_on_this_machine():
    c = parse_cluster("cpu:2")
    res = measure_dispatch(c, repeat=50, rounds=3)
    assert 0 < res["run_s"] < res["programs_s"]["there"] < res["programs_s"]["back"]
    assert res["multi_device_s"] == pytest.approx(max(res["programs_s"]["there"] - 2 * res["add_s"]
                                                      - res["link_latency_s"], 0.0))
    assert c.meta["dispatch"]["run_s"] == res["run_s"] and dispatch_figures(c)["measured"]
    with pytest.raises(ClusterError, match="two CPU devices.*cpu:1"):
        measure_dispatch(parse_cluster("cpu:1"))


def _table(analysis):
    """2 ms per matmul, 0.1 ms per other op, on either device: the two branches' matmuls are
    most of the work, and they can run side by side."""
    cs = make_candidates(analysis, "cpu:2", "tvm")
    ops = [n.op for n in analysis.op_graph.nodes]
    return np.array([[sum(2e-3 if ops[v] == "relax.matmul" else 1e-4 for v in c.nodes)] * 2 for c in cs])


def test_a_split_is_kept_only_when_its_gain_beats_the_margin():
    a = tvm_pesto.analyze(TwoBranches)
    table = _table(a)  # 4.3 ms on one device, ~2.3 ms split: a gain of ~45 %
    kept = place(a, "cpu:2", backends="tvm", costs=table, split_margin=0.2, deterministic=True)
    assert len(kept.plan.devices_used()) == 2
    info = kept.plan.info["split"]
    assert info["keep_split"] and info["gain"] > 0.2 and info["split_s"] == pytest.approx(kept.sim.run_s)
    dropped = place(a, "cpu:2", backends="tvm", costs=table, split_margin=0.6, deterministic=True)
    assert len(dropped.plan.devices_used()) == 1
    d = dropped.plan.info["split"]
    assert not d["keep_split"] and d["single_s"] == pytest.approx(dropped.sim.run_s)
    assert d["split_s"] == pytest.approx(info["split_s"])
    assert dropped.sim.makespan > kept.sim.makespan  # what the margin gave up, predicted
    off = place(a, "cpu:2", backends="tvm", costs=table, split_margin=0, deterministic=True)
    assert "split" not in off.plan.info and len(off.plan.devices_used()) == 2


def test_the_claim_is_made_under_the_split_margin():
    """A split counts its makespan / (1 - margin): the kept plan's bound is the least value
    of that objective over every plan (every split, every one-device plan), in its makespan."""
    a = tvm_pesto.analyze(TwoBranches)
    table = _table(a)
    for margin in (0.2, 0.6):  # the split kept, then dropped
        pl = place(a, "cpu:2", backends="tvm", costs=table, split_margin=margin, deterministic=True)
        info, split_kept = pl.plan.info, len(pl.plan.devices_used()) == 2
        assert split_kept == (margin == 0.2) and info["split_margin"] == margin
        b_all, b_one = info["bound_all_s"], info["bound_one_device_s"]
        assert b_all <= info["split"]["split_s"] and b_all <= b_one <= info["split"]["single_s"]
        want = min(b_all / (1 - margin), b_one) * ((1 - margin) if split_kept else 1.0)
        assert info["bound_s"] == pytest.approx(want) and info["bound_s"] <= pl.sim.makespan * (1 + 1e-9)
        assert info["mip_gap"] == pytest.approx((pl.sim.makespan - info["bound_s"]) / pl.sim.makespan, abs=1e-9)
        assert info["decided_by"].startswith("split-margin") != split_kept
    # one device runs its units one after another: the one-device plan is proven optimal under the margin
    assert info["status"] == "optimal" and info["bound_s"] == pytest.approx(pl.sim.makespan)


def test_split_margins_and_bad_margins():
    assert split_margin("roofline") > split_margin("xgb") > split_margin("measured") > split_margin("given") == 0
    assert split_decision(1.0, None, 0.5)["keep_split"]  # no single device can run it
    for bad in (-0.1, 1.0, "x", None):
        with pytest.raises(PestoError, match=r"split margin .* is not a share in \[0, 1\)"):
            check_margin(bad)
    res = CliRunner().invoke(cli, ["run", "vgg11", "--split-margin", "1.5"])
    assert res.exit_code == 2 and "--split-margin" in res.output


def test_a_plan_is_not_put_away_from_home_for_kernels_a_hair_faster_there():
    """Device 1's kernels 1 % faster: its one-device plan still copies the input from device 0
    and the result back, and runs on worker threads; the home device's plan is faster."""
    a = tvm_pesto.analyze(TwoBranches)
    table = _table(a) / 30.0
    table[:, 1] *= 0.99
    pl = place(a, "cpu:2", backends="tvm", costs=table, split_margin=0.01, deterministic=True)
    d = pl.plan.info["split"]
    assert pl.plan.devices_used() == [0] and d["device"] == "cpu0" and not d["keep_split"]
    assert pl.sim.io_s == 0.0 and pl.sim.dispatch_s == DEFAULT_DISPATCH["run_s"]
    assert d["single_s"] == pytest.approx(pl.sim.run_s) and d["single_s"] < d["split_s"]
