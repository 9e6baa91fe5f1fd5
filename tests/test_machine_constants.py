"""The executors' links and dispatch as machine constants (tvm_pesto.costs.calibrate.dispatch.machine_dispatch,
tvm_pesto.cluster.dispatch): fitted here on first use for a cluster of this machine's CPU
devices, kept per machine, executor and device shape, reused without measuring again, assumed
(and said to be) for devices that are not here, charged by the simulator, named in the run JSON.

The suite runs with ``TVM_PESTO_MACHINE_CALIBRATION=off`` (conftest), so every other test
sees the assumed figures; the tests here turn fitting on where they need it."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tvm.script import ir as I
from tvm.script import relax as R

from tvm_pesto.api import analyze, make_candidates, place
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.cli.main import cli
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.contention import contention_factors
from tvm_pesto.cluster.cold import ASSUMED_COLD
from tvm_pesto.cluster.dispatch import ASSUMED_DISPATCH, dispatch_info, set_dispatch
from tvm_pesto.cluster.linkbench import fit_links
from tvm_pesto.costs.calibrate.machine import MACHINE_ENV
from tvm_pesto.errors import ClusterError
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.costs.calibrate import dispatch as rd
from tvm_pesto.costs.calibrate import cold as cf
from tvm_pesto.costs.calibrate import switch as sw
from tvm_pesto.plan import Plan, Problem, simulate


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    monkeypatch.setenv(MACHINE_ENV, "auto")
    # the switch between libraries is measured beside the figures: a stand-in here (tests/test_switch.py)
    monkeypatch.setattr(sw, "measure_switch", lambda dev, *a, **k: sw.SwitchFit(int(dev.cores), 4e-6))
    monkeypatch.setattr(cf, "measure_cold", lambda dev, *a, **k: {**ASSUMED_COLD, "cores": int(dev.cores)})
    return tmp_path


def _fake_fit(calls):
    """A stand-in for the measurement: counts its calls, returns a record as fit_constants does."""
    def fit(cluster, executor, session=None):
        calls.append(executor)
        run_s, multi_s = (7e-6, 90e-6) if executor == "thread" else (400e-6, 650e-6)
        pts = {"0->1": {"latency_s": 5e-5, "bandwidth_Bps": 1e9, "points": {"1024": 5.1e-5, "1048576": 1.1e-3}},
               "1->0": {"latency_s": 6e-5, "bandwidth_Bps": 1e9, "points": {"1024": 6.1e-5, "1048576": 1.1e-3}}}
        return {"format": rd.FORMAT, "version": rd.VERSION, "executor": executor, "cluster": cluster.name,
                "fitted_at": f"fit-{len(calls)}", "load": [0.0, 0.0],
                "dispatch": {"run_s": run_s * len(calls), "multi_device_s": multi_s, "crossing_excess_s": 2e-5},
                "links": pts,
                "contention": {"compute": 1.25, "memory": 1.5}}
    return fit


def test_the_first_use_fits_and_keeps_the_figures_and_later_uses_read_them(own_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(rd, "fit_constants", _fake_fit(calls))
    first = rd.machine_dispatch(parse_cluster("cpu:2"), "thread", announce=False)
    assert calls == ["thread"] and first["source"] == "measured" and first["fitted_at"] == "fit-1"
    path = rd.constants_path(parse_cluster("cpu:2"), "thread")
    assert first["file"] == str(path) and path.is_file() and path.parent.parent == own_cache
    c = parse_cluster("cpu:2")
    again = rd.machine_dispatch(c, "thread", announce=False)
    assert calls == ["thread"]  # read back, not measured again
    assert again["source"] == "cached" and again["fitted_at"] == "fit-1" and again["run_s"] == pytest.approx(7e-6)
    # the links' fit, each latency raised by what a crossing costs the executor beyond it
    assert c.latency[0, 1] == pytest.approx(5e-5 + 2e-5, rel=0.05) and c.meta["links_measured"] == "thread"
    assert contention_factors(c) == {"compute": 1.25, "memory": 1.5} and c.meta["contention"]["source"] == "cached"
    assert rd.machine_dispatch(c, "thread", announce=False)["source"] == "cached" and calls == ["thread"]
    # each executor and each device shape has its own fit
    assert rd.constants_path(c, "ray") != path != rd.constants_path(parse_cluster("cpu:1"), "thread")
    ray = rd.machine_dispatch(parse_cluster("cpu:2"), "ray", session=object(), announce=False)
    assert calls == ["thread", "ray"] and ray["executor"] == "ray" and ray["multi_device_s"] == pytest.approx(650e-6)
    # refit measures whatever is kept, and keeps the new figures
    assert rd.machine_dispatch(parse_cluster("cpu:2"), "thread", refit=True)["fitted_at"] == "fit-3"
    assert rd.machine_dispatch(parse_cluster("cpu:2"), "thread")["fitted_at"] == "fit-3" and len(calls) == 3


def test_the_figures_from_the_programs_times():
    t = {"one": 10e-6, "there": 200e-6, "back": 300e-6}
    f = rd.dispatch_from_times(t, 1e-6, 40e-6, 30e-6)
    assert f["run_s"] == pytest.approx(9e-6) and f["handoff_s"] == pytest.approx(99e-6)
    # one more crossing cost 99 us, the link bench's latency b->a 30 us: 69 us is the executor's own
    assert f["crossing_excess_s"] == pytest.approx(69e-6) and f["link_latency_s"] == pytest.approx(109e-6)
    assert f["multi_device_s"] == pytest.approx(200e-6 - 2e-6 - 109e-6)
    assert rd.dispatch_from_times({"one": 10e-6, "there": 20e-6, "back": 25e-6}, 1e-6, 40e-6, 30e-6)[
        "crossing_excess_s"] == 0.0  # a crossing cheaper than the bench's latency: nothing added
    assert "handoff_s" not in rd.dispatch_from_times({"one": 1e-5, "there": 1e-4}, 0.0, 0.0, 0.0)


def test_fitting_off_assumes_unless_a_fit_is_kept(own_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(rd, "fit_constants", _fake_fit(calls))
    monkeypatch.setenv(MACHINE_ENV, "off")
    info = rd.machine_dispatch(parse_cluster("cpu:2"), "thread")
    assert calls == [] and info["source"] == "assumed" and not info["measured"] and MACHINE_ENV in info["why"]
    assert info["run_s"] == ASSUMED_DISPATCH["thread"]["run_s"]
    monkeypatch.setenv(MACHINE_ENV, "auto")
    rd.machine_dispatch(parse_cluster("cpu:2"), "thread", announce=False)
    monkeypatch.setenv(MACHINE_ENV, "off")
    assert rd.machine_dispatch(parse_cluster("cpu:2"), "thread")["source"] == "cached" and len(calls) == 1


def test_a_kept_file_that_is_not_a_fit_names_the_fix(own_cache):
    path = rd.constants_path(parse_cluster("cpu:2"), "thread")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ClusterError, match="delete it"):
        rd.machine_dispatch(parse_cluster("cpu:2"), "thread")


def test_links_measured_over_ray_are_not_replaced_by_a_plan_for_threads(own_cache, monkeypatch):
    """Ray's links measured into a cluster (as ``measure_ray_links`` does) and then a plan for
    the thread executor: refused, naming both executors and the fix, not replaced silently;
    planned for Ray they are used, and a refit replaces them on purpose."""
    calls = []
    monkeypatch.setattr(rd, "fit_constants", _fake_fit(calls))
    c = parse_cluster("cpu:2")
    fit_links(c, {(0, 1): {1024: 4e-4, 1 << 20: 1.1e-3}, (1, 0): {1024: 4e-4, 1 << 20: 1.1e-3}}, "ray")
    ray_latency = float(c.latency[0, 1])
    with pytest.raises(ClusterError, match=r"measured over the ray executor.*executor='ray'.*--executor thread"):
        rd.machine_dispatch(c, "thread", announce=False)
    assert calls == [] and c.latency[0, 1] == ray_latency  # nothing measured, nothing written
    with pytest.raises(ClusterError, match="measured over the ray executor"):
        place(analyze(tiny_mlp()[0]), c, backends="tvm", costs="roofline", solver="m-topo")
    assert rd.machine_dispatch(c, "ray", session=object(), announce=False)["executor"] == "ray"
    assert rd.machine_dispatch(c, "thread", refit=True, announce=False)["executor"] == "thread"
    assert c.meta["links_measured"] == "thread" and calls == ["ray", "thread"]


@pytest.mark.slow
def test_the_thread_fit_measures_here_once(own_cache, monkeypatch):
    monkeypatch.undo()  # the real switch measurement too
    monkeypatch.setenv("TVM_PESTO_CACHE", str(own_cache))
    monkeypatch.setenv(MACHINE_ENV, "auto")
    c = parse_cluster("cpu:2")
    info = rd.machine_dispatch(c, "thread", announce=False)
    assert info["source"] == "measured" and info["links"] and 0 < info["run_s"] < info["multi_device_s"]
    assert c.meta["contention"]["source"] == "measured" and min(contention_factors(c).values()) >= 1.0
    kept = json.loads(open(info["file"]).read())
    assert kept["dispatch"]["run_s"] == info["run_s"] and kept["machine"]["cores"] and kept["shape"] == [[1, [0]],
                                                                                                          [1, [1]]]
    monkeypatch.setattr(rd, "fit_constants", lambda *a, **k: pytest.fail("measured again"))
    assert rd.machine_dispatch(parse_cluster("cpu:2"), "thread")["run_s"] == info["run_s"]


@pytest.mark.parametrize("spec", ["4xV100-pcie", "cpu:1"])
@pytest.mark.parametrize("executor", ["thread", "ray"])
def test_devices_not_here_or_too_few_get_assumed_figures_that_say_so(spec, executor, own_cache, monkeypatch):
    monkeypatch.setattr(rd, "fit_constants", lambda *a, **k: pytest.fail("nothing to fit"))
    c = parse_cluster(spec)
    latency = c.latency.copy()
    info = rd.machine_dispatch(c, executor)
    assert info["source"] == "assumed" and info["fitted_at"] is None and info["why"]
    assert info["run_s"] == ASSUMED_DISPATCH[executor]["run_s"] and info["executor"] == executor
    assert np.array_equal(c.latency, latency)  # its spec's links stay


@pytest.mark.parametrize("executor", ["thread", "ray"])
def test_one_device_takes_the_dispatch_of_the_kept_fit(executor, own_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(rd, "fit_constants", _fake_fit(calls))
    rd.machine_dispatch(parse_cluster("cpu:2"), executor, session=object(), announce=False)
    monkeypatch.setattr(rd, "fit_constants", lambda *a, **k: pytest.fail("one device: nothing to fit"))
    one = parse_cluster("cpu:1")
    info = rd.machine_dispatch(one, executor)
    assert info["source"] == "cached" and info["fitted_at"] == "fit-1" and info["links"] is None
    assert info["run_s"] == pytest.approx(7e-6 if executor == "thread" else 400e-6)
    assert one.meta["dispatch"]["from_shape"] == "cpu:2"
    other = "ray" if executor == "thread" else "thread"  # the other executor has no fit kept: assumed
    assert rd.machine_dispatch(parse_cluster("cpu:1"), other)["source"] == "assumed"


def test_a_gpu_preset_placement_says_its_figures_are_assumed(own_cache):
    mod, _ = tiny_mlp()
    pl = place(mod, "4xV100-pcie", costs="roofline", deterministic=True)
    d = pl.summary()["dispatch"]
    assert d["source"] == "assumed" and d["why"] == "devices not on this machine" and not d["measured"]


def _two_nodes():
    g = OpGraph([OpNode("a", "op", flops=1e9, bytes_read=4096, bytes_written=4096),
                 OpNode("b", "op", flops=1e9, bytes_read=4096, bytes_written=4096)], [(0, 1, 4096)])
    return Problem(g, parse_cluster("cpu:2"), np.full((2, 2), 1e-3))


def test_the_simulator_charges_the_fitted_figures():
    split = Plan(np.array([0, 1], dtype=np.int32), [[0], [1]])
    one = Plan(np.array([0, 0], dtype=np.int32), [[0, 1], []])
    p = _two_nodes()
    assumed2, assumed1 = simulate(p, split), simulate(p, one)
    set_dispatch(p.cluster, {"run_s": 5e-4, "multi_device_s": 2e-3}, "thread", "cached", "2026-01-01T00:00:00")
    fit2, fit1 = simulate(p, split), simulate(p, one)
    assert fit1.run_s - assumed1.run_s == pytest.approx(5e-4 - ASSUMED_DISPATCH["thread"]["run_s"])
    assert fit2.run_s - assumed2.run_s == pytest.approx(2e-3 - ASSUMED_DISPATCH["thread"]["multi_device_s"])
    assert fit2.makespan == assumed2.makespan and fit2.io_s == assumed2.io_s > 0
    # under Ray the caller talks to each actor: no home-device copy, only the bytes of its hops
    # (a's 4 KiB input, b's 4 KiB result back, at the fitted rate), and a plan on one device away
    # from home is one hop
    set_dispatch(p.cluster, {"run_s": 4e-4, "multi_device_s": 7e-4, "caller_s_per_byte": 1e-9}, "ray", "measured",
                 "2026-01-01T00:00:00")
    ray2, away = simulate(p, split), simulate(p, Plan(np.array([1, 1], dtype=np.int32), [[], [0, 1]]))
    assert ray2.io_s == pytest.approx(2 * 4096 * 1e-9)
    assert ray2.run_s == pytest.approx(ray2.makespan + ray2.io_s + 7e-4)
    assert away.io_s == pytest.approx(ray2.io_s) and away.dispatch_s == pytest.approx(4e-4)


@I.ir_module
class Branches:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.nn.softmax(R.matmul(x, x), axis=-1)
            b = R.nn.softmax(R.matmul(x, x), axis=-1)
            c = R.add(a, b)
            R.output(c)
        return c


@pytest.mark.parametrize("multi_s,devices", [(0.0, 2), (1.0, 1)])
def test_the_plan_weighs_the_fitted_figures(multi_s, devices):
    """Two branches of 2 ms each: split when a run over two devices costs nothing more, on one
    device when the fit says such a run costs a second more."""
    a = analyze(Branches)
    cs = make_candidates(a, "cpu:2", "tvm")
    ops = [n.op for n in a.op_graph.nodes]
    table = np.array([[sum(2e-3 if ops[v] == "relax.matmul" else 1e-5 for v in cand.nodes)] * 2 for cand in cs])
    c = parse_cluster("cpu:2")
    set_dispatch(c, {"run_s": 1e-6, "multi_device_s": multi_s}, "thread", "measured", "now")
    pl = place(a, c, backends="tvm", costs=table, split_margin=0.01, deterministic=True)
    assert len(pl.plan.devices_used()) == devices and pl.summary()["dispatch"]["source"] == "measured"
    assert pl.sim.dispatch_s == pytest.approx(1e-6 if devices == 1 else multi_s)


@pytest.mark.slow
def test_the_run_json_names_the_figures_and_when_they_were_fitted(own_cache, tmp_path, monkeypatch):
    mod, _ = tiny_mlp()
    src = tmp_path / "tiny.tvmscript"
    src.write_text(mod.script(show_meta=True))
    out = tmp_path / "run.json"
    res = CliRunner().invoke(cli, ["run", str(src), "--cluster", "cpu:2", "--backends", "tvm", "--costs", "roofline",
                                   "--repeat", "3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    d = r["dispatch"]
    assert d["executor"] == "thread" and d["source"] == "measured" and d["fitted_at"] and d["measured"]
    assert r["dispatch_s"] == pytest.approx(d["run_s"] if len(r["devices_used"]) == 1 else d["multi_device_s"])
    assert r["link_model"]["engine"] == "thread" and r["link_model"]["source"] == "measured"
    pair = r["link_model"]["pairs"]["0->1"]  # as applied: the link fit's latency and the executor's excess
    assert r["links"]["latency_s"][0][1] == pytest.approx(pair["latency_s"])
    assert pair["latency_s"] == pytest.approx(pair["link_latency_s"] + kept_excess(), abs=1e-12)
    assert "dispatch          thread executor, measured, fitted" in res.output
    kept = rd.load_constants(rd.constants_path(parse_cluster("cpu:2"), "thread"))
    assert kept["dispatch"]["run_s"] == pytest.approx(d["run_s"])  # the run's measurement is this machine's fit now


def kept_excess() -> float:
    kept = rd.load_constants(rd.constants_path(parse_cluster("cpu:2"), "thread"))
    return float(kept["dispatch"].get("crossing_excess_s") or 0.0)


def test_the_ray_caller_sleeps_through_most_of_a_run():
    from tvm_pesto.run.ray.executor import RECENT_RUNS, WAIT_SHARE, WAKE_S, RayExecutor

    ex = object.__new__(RayExecutor)  # the waiting rule alone: no actors
    ex._ready = [2e-3] * (RECENT_RUNS - 1)
    assert ex._wait_s() == 0.0  # too few runs seen
    ex._ready = [3e-3, 2e-3] + [4e-3] * (RECENT_RUNS - 2)
    assert ex._wait_s() == pytest.approx(WAIT_SHARE * 2e-3 - WAKE_S)
    ex._ready = [WAKE_S] * RECENT_RUNS
    assert ex._wait_s() == 0.0  # runs this short: read at once
