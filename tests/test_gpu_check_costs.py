"""The device check's GPU timings as costs (``tvm_pesto.costs.predict.gpu_check``)."""
from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.backends import get_backend
from tvm_pesto.candidates import candidate_key, generate_candidates, placement_candidates
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs import candidate_costs, roofline_candidate_costs
from tvm_pesto.costs.predict.gpu_check import apply_check_logs, boundary_ops, load_check_logs
from tvm_pesto.costs.predict.roofline import node_seconds
from tvm_pesto.costs.store.cache import measure_target
from tvm_pesto.errors import CostError

H200 = parse_cluster("h200")


def _log(path, cs, timed: dict, main_s: float, gpu: str = "NVIDIA H200"):
    """A device-check log holding ``timed`` (candidate index -> seconds) as one model's
    TVM-CUDA groups, and ``main_s`` as that model's ``main``."""
    target = measure_target(H200.devices[0])
    recs = [{"key": candidate_key(cs.rg, cs[i].nodes), "backend": "tvm-cuda", "target": target, "median_s": s,
             "op": "relax.add", "flops": 1e3, "bytes": 1e4, "count": 1} for i, s in timed.items()]
    row = {"model": "m", "backend": "tvm-cuda", "items": [{"name": "time main", "median_s": main_s}], "timings": recs}
    path.write_text(json.dumps({"environment": {"device": gpu}, "rows": [row]}))
    return path


@pytest.fixture(scope="module")
def mlp_cs():
    return generate_candidates(tvm_pesto.analyze(tiny_mlp()[0]).rg, [get_backend("tvm")])


def test_timed_groups_replace_the_roofline_less_their_launch(tmp_path, mlp_cs):
    """A timed candidate costs its time less the launch its group carried when timed alone
    (here (30 + 50 + 20 - 70) / 3 = 10 us); its ops' shares price the candidates inside it;
    the others get the roofline times the backend's median measured / roofline; an H100 (same
    CUDA target, another GPU) keeps the roofline."""
    cs = mlp_cs
    at = {c.nodes: i for i, c in enumerate(cs)}
    timed = {at[(1, 2, 3)]: 30e-6, at[(4, 5)]: 50e-6, at[(6,)]: 20e-6}
    logs = load_check_logs([_log(tmp_path / "gpu-check-x.json", cs, timed, 70e-6)])
    assert logs[0].launch_s == pytest.approx(10e-6)
    roof = roofline_candidate_costs(cs, H200)
    table, cols, applied = apply_check_logs(cs, H200, roof, ["roofline"], logs=logs)
    assert cols == ["gpu-check+roofline"] and applied[0]["timed"] == 3
    assert [table[at[n], 0] for n in ((1, 2, 3), (4, 5), (6,))] == pytest.approx([20e-6, 40e-6, 10e-6])
    assert sum(table[at[(n,)], 0] for n in (1, 2, 3)) == pytest.approx(20e-6)  # the group's time over its ops
    assert table[at[(1, 2)], 0] == pytest.approx(table[at[(1,)], 0] + table[at[(2,)], 0])
    rec_roof = node_seconds(SimpleNamespace(op="relax.add", flops=1e3, bytes_read=1e4, bytes_written=0), H200.devices[0])
    assert applied[0]["ratio"]["tvm"] == pytest.approx(20e-6 / rec_roof)  # the median of 10, 20, 40 us
    assert table[at[(0,)], 0] == pytest.approx(roof[at[(0,)], 0] * 20e-6 / rec_roof)
    h100 = parse_cluster("h100")
    same, cols100, applied100 = apply_check_logs(cs, h100, roofline_candidate_costs(cs, h100), ["roofline"],
                                                 logs=logs)
    assert cols100 == ["roofline"] and not applied100
    assert np.array_equal(same, roofline_candidate_costs(cs, h100))


def test_the_launch_is_the_median_over_every_logged_model(tmp_path, mlp_cs):
    """Each timing loses the launch fitted over all models of all logs, not over those read
    before it: gaps of 10 us (first model) and 20 us (second) give 15 us for both."""
    cs = mlp_cs
    at = {c.nodes: i for i, c in enumerate(cs)}
    a = json.loads(_log(tmp_path / "a.json", cs, {at[(1, 2, 3)]: 30e-6}, 20e-6).read_text())
    b = json.loads(_log(tmp_path / "b.json", cs, {at[(4, 5)]: 50e-6}, 30e-6).read_text())
    a["rows"][0]["model"], b["rows"][0]["model"] = "first", "second"
    (tmp_path / "gpu-check-1.json").write_text(json.dumps(a))
    (tmp_path / "gpu-check-2.json").write_text(json.dumps(b))
    logs = load_check_logs([tmp_path / "gpu-check-1.json", tmp_path / "gpu-check-2.json"])
    assert logs[0].launch_s == pytest.approx(15e-6)
    table, _, _ = apply_check_logs(cs, H200, roofline_candidate_costs(cs, H200), ["roofline"], logs=logs)
    assert [table[at[(1, 2, 3)], 0], table[at[(4, 5)], 0]] == pytest.approx([15e-6, 35e-6])
    (held,) = load_check_logs([tmp_path / "gpu-check-1.json", tmp_path / "gpu-check-2.json"], skip_models=("second",))
    assert held.launch_s == pytest.approx(10e-6) and list(held.mains) == ["first"]
    assert not any(k[0] == candidate_key(cs.rg, cs[at[(4, 5)]].nodes) for k in held.seconds)


def test_only_roofline_gpu_columns_change(tmp_path, mlp_cs):
    cs = mlp_cs
    logs = load_check_logs([_log(tmp_path / "gpu-check-x.json", cs, {0: 9e-6}, 5e-6)])
    table = np.full((len(cs), 1), 1e-3)
    out, cols, applied = apply_check_logs(cs, H200, table, ["measured"], logs=logs)
    assert cols == ["measured"] and not applied and np.array_equal(out, table)
    cpu = parse_cluster("cpu:1")
    out, cols, applied = apply_check_logs(cs, cpu, table, ["roofline"], logs=logs)
    assert cols == ["roofline"] and not applied


def test_a_file_that_is_not_a_check_log_is_named(tmp_path):
    bad = tmp_path / "gpu-check-bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(CostError, match="gpu-check-bad.json is not a device-check log"):
        load_check_logs([bad])


def test_library_units_timed_in_cuda_graphs_replace_their_loop_timings(tmp_path):
    """A cuDNN unit timed in a Python loop costs what the same unit costs replayed in a CUDA
    graph, where a graph log has it (a module built with CUDA graphs captures its library calls);
    the backend's ratio follows; units without one keep the loop timing; a model left out is
    left out of both logs; a file that is not a graph log is named."""
    target = measure_target(H200.devices[0])
    recs = [{"key": f"k{i}", "backend": "cudnn", "target": target, "median_s": 50e-6, "op": "relax.nn.conv2d",
             "flops": 1e6, "bytes": 1e5, "count": 1} for i in range(4)]
    check = tmp_path / "gpu-check-x.json"
    check.write_text(json.dumps({"environment": {"device": "NVIDIA H200"},
                                 "rows": [{"model": "m", "backend": "cudnn", "items": [], "timings": recs}]}))
    graphs = tmp_path / "gpu-graphs-x.json"
    units = [{"model": "m", "lib": "cudnn", "key": f"k{i}", "graph_us": 5.0 + i, "loop_us": 50.0} for i in range(3)]
    graphs.write_text(json.dumps({"device": "NVIDIA H200", "target": target, "graphs": units}))
    (loop,) = load_check_logs([check])
    (ct,) = load_check_logs([check], graph_paths=[graphs])
    assert loop.seconds[("k0", "cudnn")] == ("cudnn", 50e-6) and loop.graph_timed == 0
    assert ct.graph_timed == 3
    assert [ct.seconds[(f"k{i}", "cudnn")][1] for i in range(4)] == pytest.approx([5e-6, 6e-6, 7e-6, 50e-6])
    roof = node_seconds(SimpleNamespace(op="relax.nn.conv2d", flops=1e6, bytes_read=1e5, bytes_written=0),
                        H200.devices[0])
    assert ct.ratios(H200.devices[0])["cudnn"] == pytest.approx(((6e-6 + 7e-6) / 2) / roof)
    assert loop.ratios(H200.devices[0])["cudnn"] == pytest.approx(50e-6 / roof)
    assert not load_check_logs([check], skip_models=("m",), graph_paths=[graphs])
    bad = tmp_path / "gpu-graphs-bad.json"
    bad.write_text(json.dumps({"device": "NVIDIA H200"}))
    with pytest.raises(CostError, match="gpu-graphs-bad.json is not a log of library units timed in CUDA graphs"):
        load_check_logs([check], graph_paths=[bad])


def test_the_shipped_graph_log_times_every_logged_library_unit():
    """Every cuBLASLt and cuDNN unit of the shipped check logs has its CUDA-graph timing (the
    graph log was taken of the same prepared units; a change of ``candidate_key`` or a new
    check log without one would leave loop timings in: run ``gpu_peers.py --parts graphs``)."""
    (h200,) = [c for c in load_check_logs() if c.serves(H200.devices[0])]
    libs = [r for r in h200.records if r[0] in ("cublas", "cudnn")]
    assert len(libs) >= 90 and h200.graph_timed == len(libs)
    assert all(r[1] < 20e-6 for r in libs)  # replayed in a graph: 2-16 us on the H200, not 14-66 us


@pytest.mark.slow
def test_the_shipped_h200_logs_time_the_zoos_fusion_groups():
    """The shipped logs are keyed as the planner keys candidates: on an H200 preset every zoo
    model the check ran has its fusion groups costed from the logs (a change of
    ``candidate_key`` would leave them unmatched: run the device check again on a GPU)."""
    (h200,) = [c for c in load_check_logs() if c.serves(H200.devices[0])]
    models = {"mlp_mixer", "bert", "vgg11", "resnet50", "mobilenet_v2", "gpt2", "inception_v3"}
    for name in sorted(models):
        cs = placement_candidates(tvm_pesto.analyze(zoo.load(name, "small").mod).rg)
        ct = candidate_costs(cs, H200, "roofline")
        assert ct.columns == ["gpu-check+roofline"], name
        assert ct.gpu_check[0]["timed"] >= 0.9 * len(cs), (name, ct.gpu_check, len(cs))
        assert np.all(np.isfinite(ct.table)) and np.all(ct.table > 0)
    assert 1e-6 < h200.launch_s < 1e-5
    assert candidate_costs(cs, parse_cluster("2xA100-nvlink"), "roofline").columns == ["roofline", "roofline"]


@pytest.mark.slow
def test_libraries_named_for_a_gpu_this_machine_lacks_are_planned_with_the_logs():
    """Planning for the ``h200`` preset on a machine without its GPU: cuBLAS and cuDNN, asked
    for by name, are candidates (the plan is for the H200), priced from the shipped logs; on
    vgg11 the plan puts convolutions on cuDNN and simulates faster than TVM alone (as the mixed
    module measured on the H200: docs/gpu.md). ``all`` leaves them out where they cannot load,
    and a CPU cluster (present here) keeps an unavailable library on TVM."""
    mod = zoo.load("vgg11", "small").mod
    mixed = tvm_pesto.place(mod, H200, backends="tvm,cublas,cudnn")
    tvm_only = tvm_pesto.place(mod, H200, backends="tvm")
    used = {u.backend for u in mixed.plan.units}
    assert {"cudnn", "tvm"} <= used, used
    assert mixed.sim.makespan < 0.8 * tvm_only.sim.makespan
    if not get_backend("cudnn").available()[0]:
        every = tvm_pesto.place(mod, H200)
        assert "cudnn" not in {u.backend for u in every.plan.units}
        with warnings.catch_warnings():  # "its subgraphs stay on tvm", once per process
            warnings.simplefilter("ignore", RuntimeWarning)
            on_cpu = tvm_pesto.make_candidates(tvm_pesto.analyze(mod), parse_cluster("cpu:1"), backends="tvm,cudnn")
        assert "cudnn" not in {c.backend for c in on_cpu} and "cudnn" in on_cpu.unavailable


def test_library_units_at_mains_edge_keep_their_loop_timing():
    """A module built with CUDA graphs runs an op that reads an input of ``main`` or writes its
    result outside the captured graph (as a Python call, for a library unit): on mlp_mixer the
    cuDNN patch convolution (it reads the image) costs its loop timing, an interior cuBLASLt
    GEMM its CUDA-graph timing."""
    (h200,) = [c for c in load_check_logs() if c.serves(H200.devices[0])]
    rg = tvm_pesto.analyze(tiny_mlp()[0]).rg
    edge = boundary_ops(rg)
    ops = [n.op for n in rg.graph.nodes]
    assert {0, len(ops) - 1} <= edge and ops[0] == "relax.nn.layer_norm"  # reads x; the result
    assert not edge & {1, 2, 3}  # interior ops read only values computed inside
    cs = tvm_pesto.make_candidates(tvm_pesto.analyze(zoo.load("mlp_mixer", "small").mod), H200,
                                   backends="tvm,cublas,cudnn")
    table = candidate_costs(cs, H200, "roofline").table[:, 0]
    edge = boundary_ops(cs.rg)
    seen = set()
    for i, c in enumerate(cs):
        k = (candidate_key(cs.rg, c.nodes), c.backend)
        if c.backend not in ("cublas", "cudnn") or k not in h200.loop:
            continue
        at_edge = bool(edge.intersection(c.nodes))
        want = h200.loop[k] if at_edge else h200.seconds[k][1]
        assert table[i] == pytest.approx(want), (c.label(), at_edge)
        seen.add((c.backend, at_edge))
    assert ("cudnn", True) in seen and ("cublas", False) in seen, seen


@pytest.mark.slow
def test_a_library_never_timed_on_a_gpu_not_here_is_left_out_of_its_plan():
    """Planning for a GPU this machine lacks, a library that cannot load here is priced only
    from that GPU's logs: TensorRT (never timed on the H200) and cuDNN on a V100 (no logs) get
    infinite costs and no unit, instead of a bare roofline guess (vgg11's whole-model TensorRT
    region would simulate at 0.006 ms against TVM's measured 0.22 ms); cuDNN on the H200 keeps
    its logged costs."""
    an = tvm_pesto.analyze(zoo.load("vgg11", "small").mod)
    for cluster, named, left_out, kept in ((H200, "tvm,cudnn,tensorrt", "tensorrt", "cudnn"),
                                           (parse_cluster("1xV100-pcie"), "tvm,cudnn", "cudnn", "tvm")):
        if get_backend(left_out).available()[0]:
            continue  # it loads here: its candidates are measured, not planned for elsewhere
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            cs = tvm_pesto.make_candidates(an, cluster, backends=named)
            ct = candidate_costs(cs, cluster, "roofline")
        lib = np.array([c.backend == left_out for c in cs])
        assert lib.any() and np.isinf(ct.table[lib, 0]).all(), left_out
        assert ct.gpu_check[0]["unpriced"] == {left_out: int(lib.sum())}
        other = np.array([c.backend == kept for c in cs])
        assert np.isfinite(ct.table[other, 0]).all(), kept
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            plan = tvm_pesto.place(an, cluster, backends=named).plan
        assert left_out not in {u.backend for u in plan.units}
