"""Importer for the msr-fiddle/dnn-partitioning graphs and human-expert splits."""
from __future__ import annotations

import glob
import json
import os
import warnings

import numpy as np
import pytest

from tvm_pesto.errors import ClusterError, CostError, CycleError, GraphError, PlanError
from tvm_pesto.graph.dnn_partitioning import (
    BENCHMARK_ENV, benchmark_dir, cluster_from_graph, colocation_groups, costs_from_graph, find_expert_split,
    load_layer_graph)
from tvm_pesto.plan.expert_split import load_expert_split, write_split
from tvm_pesto.plan import Problem, simulate
from tvm_pesto.solve import lower_bound, solve

warnings.filterwarnings("ignore", message=".*_core is not built.*")

ROOT = str(benchmark_dir())
FILES = sorted(glob.glob(os.path.join(ROOT, "*", "LayerGraphs", "*.json")))
EXPERTS = sorted(glob.glob(os.path.join(ROOT, "human-experts", "*.json")))
assert FILES and EXPERTS, f"benchmark files missing under {ROOT}"


def ids_of(path):
    return os.path.relpath(path, ROOT)


def build(path):
    g, meta = load_layer_graph(path)
    cl = cluster_from_graph(meta)
    return g, meta, cl, Problem(g, cl, costs_from_graph(g, cl), colocate=colocation_groups(g), cost_source="file")


@pytest.mark.parametrize("path", FILES, ids=ids_of)
def test_graph_keeps_ids_fields_and_times(path):
    raw = json.load(open(path))
    g, meta, cl, p = build(path)
    assert g.num_nodes == len(raw["nodes"]) and g.num_edges == len(raw["edges"])
    by_id = {nd["id"]: nd for nd in raw["nodes"]}
    assert sorted(nd.extra["id"] for nd in g.nodes) == sorted(by_id)
    for v, nd in enumerate(g.nodes):
        orig = by_id[nd.extra["id"]]
        assert nd.name == f"{orig['id']}:{orig['name']}"
        assert nd.param_bytes == int(orig["size"]) and nd.memory_bytes == int(orig["size"])
        assert meta["id_to_index"][orig["id"]] == v
    # node order is topological
    pos = {v: i for i, v in enumerate(g.topo_order())}
    assert all(u < v for u, v, _ in g.edges()) and len(pos) == g.num_nodes
    # cluster and costs
    k, l = raw["maxFPGAs"], raw["maxCPUs"]
    assert cl.num_devices == k + l and cl.name == "from-graph"
    assert [dv.kind for dv in cl.devices] == ["gpu"] * k + ["cpu"] * l
    assert all(dv.memory_bytes == raw["maxSizePerFPGA"] for dv in cl.devices[:k])
    unit = meta["time_unit_s"]
    for v, nd in enumerate(g.nodes):
        orig = by_id[nd.extra["id"]]
        assert p.costs[v, 0] == pytest.approx(orig["fpgaLatency"] * unit)
        assert p.costs[v, -1] == pytest.approx(orig["cpuLatency"] * unit)
    # every edge's transfer reproduces the file's cost: one cost accelerator<->CPU, two
    # between accelerators, none between CPUs
    cost = {(e["sourceId"], e["destId"]): e["cost"] * unit for e in raw["edges"]}
    for u, v, b in g.edges():
        c = cost[(g.nodes[u].extra["id"], g.nodes[v].extra["id"])]
        assert cl.transfer_s(0, k, b) == pytest.approx(c, rel=1e-12, abs=1e-300)
        assert cl.transfer_s(k, 0, b) == pytest.approx(c, rel=1e-12, abs=1e-300)
        if k > 1:
            assert cl.transfer_s(0, 1, b) == pytest.approx(2 * c, rel=1e-12, abs=1e-300)
        if l > 1:
            assert cl.transfer_s(k, k + 1, b) == 0.0


@pytest.mark.parametrize("path", FILES, ids=ids_of)
def test_colocation_pairs_forward_with_backward(path):
    g, _, _, _ = build(path)
    groups = colocation_groups(g)
    backward = [v for v, nd in enumerate(g.nodes) if nd.op == "backward"]
    if not backward:
        assert groups == []
        return
    assert len(groups) == len(backward) == g.num_nodes // 2
    for grp in groups:
        kinds = sorted(g.nodes[v].op for v in grp)
        assert kinds == ["backward", "forward"]
        fwd, bwd = sorted(grp, key=lambda v: g.nodes[v].op != "forward")
        assert g.nodes[bwd].extra["name"] == g.nodes[fwd].extra["name"] + "grad"
    assert colocation_groups(g, forward_backward=False) == []


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=ids_of)
def test_heuristic_split_round_trips_through_the_file_format(path, tmp_path):
    g, _, cl, p = build(path)
    plan = solve(p, "heft")
    res = simulate(p, plan)
    # the cheap bounds only: the segment MIPs took 32 s on resnet50 (tests/test_comm_bounds.py checks them)
    assert res.makespan >= lower_bound(p, lp=False, comm=False)["best"] * (1 - 1e-9)
    split = write_split(plan, g, cl)
    assert len(split["fpgas"]) + len(split["cpus"]) == cl.num_devices
    f = tmp_path / "split.json"
    f.write_text(json.dumps(split))
    back = load_expert_split(str(f), g, cl)
    assert back.assignment.tolist() == plan.assignment.tolist()
    assert [[g.nodes[v].extra["id"] for v in seq] for seq in plan.order] == \
        [e["nodes"] for e in split["fpgas"] + split["cpus"]]


@pytest.mark.parametrize("expert", EXPERTS, ids=ids_of)
def test_expert_splits_load_and_round_trip(expert, tmp_path):
    raw = json.load(open(expert))
    graphs = [f for f in FILES if find_expert_split(f) == os.path.abspath(expert)]
    assert graphs, f"no graph for {expert}"
    for path in graphs:
        g, meta, cl, p = build(path)
        used = [k for k, e in enumerate(raw["fpgas"]) if e["nodes"]]
        if len(used) > meta["max_accelerators"]:
            with pytest.raises(PlanError, match="only"):
                load_expert_split(expert, g, cl)
            continue
        plan = load_expert_split(expert, g, cl)
        assert plan.solver == "expert"
        for k, entry in enumerate(raw["fpgas"]):
            for nid in entry["nodes"]:
                assert plan.assignment[meta["id_to_index"][nid]] == k
        res = simulate(p, plan, check_memory=False)
        assert res.makespan > 0
        f = tmp_path / "again.json"
        f.write_text(json.dumps(write_split(plan, g, cl)))
        again = load_expert_split(str(f), g, cl)
        assert again.assignment.tolist() == plan.assignment.tolist()
        assert again.order == plan.order


def test_expert_without_cluster_numbers_fpgas_then_cpus():
    path = os.path.join(ROOT, "throughput-inputs", "LayerGraphs", "bert24_inference.json")
    g, _ = load_layer_graph(path)
    plan = load_expert_split(find_expert_split(path), g)
    assert plan.num_devices == 7 and set(plan.assignment.tolist()) == set(range(6))


def test_shipped_graphs_are_found_without_the_variable(monkeypatch):
    monkeypatch.delenv(BENCHMARK_ENV, raising=False)
    root = benchmark_dir()
    assert root.parent.name == "benchmarks" and root.name == "dnn-partitioning"
    assert (root / "LICENSE.txt").is_file() and (root / "ABOUT.md").is_file()
    assert len(list(root.glob("*-inputs/LayerGraphs/*.json"))) == 12
    assert len(list(root.glob("human-experts/*_expert.json"))) == 6


def test_the_variable_names_another_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(BENCHMARK_ENV, str(tmp_path))
    assert benchmark_dir() == tmp_path
    monkeypatch.setenv(BENCHMARK_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(GraphError, match=f"{BENCHMARK_ENV}.*not a folder"):
        benchmark_dir()


# -- errors ------------------------------------------------------------------------------------
def write(tmp_path, data, name="g.json"):
    f = tmp_path / name
    f.write_text(json.dumps(data))
    return str(f)


def tiny(**over):
    data = {
        "maxFPGAs": 2, "maxSizePerFPGA": 1000.0, "maxCPUs": 1,
        "nodes": [
            {"id": 10, "name": "a", "cpuLatency": 5.0, "fpgaLatency": 1.0, "supportedOnFpga": 1, "size": 10.0,
             "colorClass": 10, "isBackwardNode": 0},
            {"id": 20, "name": "b", "cpuLatency": 5.0, "fpgaLatency": 1.0, "supportedOnFpga": 0, "size": 10.0,
             "colorClass": 20, "isBackwardNode": 0},
        ],
        "edges": [{"sourceId": 10, "destId": 20, "cost": 0.5, "size": 1000.0}],
    }
    data.update(over)
    return data


def test_tiny_graph_imports(tmp_path):
    g, meta, cl, p = build(write(tmp_path, tiny()))
    assert np.isinf(p.costs[1, :2]).all() and p.costs[1, 2] == pytest.approx(5e-3)
    assert meta["bytes_per_time_unit"] == 2000.0 and g.edge_bytes(0, 1) == 1000
    plan = solve(p, "heft")
    assert plan.assignment[1] == 2


def test_cycle_is_named_by_original_ids(tmp_path):
    data = tiny(edges=[{"sourceId": 10, "destId": 20, "cost": 1.0}, {"sourceId": 20, "destId": 10, "cost": 1.0}])
    with pytest.raises(CycleError, match="10 -> 20 -> 10|20 -> 10 -> 20"):
        load_layer_graph(write(tmp_path, data))


def test_edge_to_unknown_node_is_named(tmp_path):
    data = tiny(edges=[{"sourceId": 10, "destId": 99, "cost": 1.0}])
    with pytest.raises(GraphError, match=r"10 -> 99\) names unknown node 99"):
        load_layer_graph(write(tmp_path, data))


def test_negative_latency_is_named(tmp_path):
    data = tiny()
    data["nodes"][1]["cpuLatency"] = -1.0
    with pytest.raises(CostError, match="node 20 has negative cpuLatency"):
        load_layer_graph(write(tmp_path, data))


def test_negative_edge_cost_and_missing_fields(tmp_path):
    with pytest.raises(CostError, match="negative cost"):
        load_layer_graph(write(tmp_path, tiny(edges=[{"sourceId": 10, "destId": 20, "cost": -1}])))
    data = tiny()
    del data["maxCPUs"]
    with pytest.raises(GraphError, match="maxCPUs"):
        load_layer_graph(write(tmp_path, data))
    data = tiny()
    data["nodes"][1]["id"] = 10
    with pytest.raises(GraphError, match="appears twice"):
        load_layer_graph(write(tmp_path, data))
    with pytest.raises(GraphError, match="does not exist"):
        load_layer_graph(str(tmp_path / "missing.json"))


def test_cluster_needs_devices(tmp_path):
    _, meta = load_layer_graph(write(tmp_path, tiny(maxFPGAs=0, maxCPUs=0)))
    with pytest.raises(ClusterError, match="no devices"):
        cluster_from_graph(meta)


def test_bad_splits_are_plan_errors(tmp_path):
    g, _, cl, _ = build(write(tmp_path, tiny()))
    cases = {
        "unknown": ({"fpgas": [{"nodes": [10, 30]}], "cpus": [{"nodes": [20]}]}, "node id 30"),
        "twice": ({"fpgas": [{"nodes": [10]}, {"nodes": [10]}], "cpus": [{"nodes": [20]}]}, "placed twice"),
        "missing": ({"fpgas": [{"nodes": [10]}], "cpus": []}, r"ids \[20\]"),
        "too many": ({"fpgas": [{"nodes": [10]}, {"nodes": []}, {"nodes": [20]}], "cpus": []}, "only 2"),
    }
    for name, (split, msg) in cases.items():
        with pytest.raises(PlanError, match=msg):
            load_expert_split(write(tmp_path, split, f"{name}.json"), g, cl)


def test_costs_need_imported_graph():
    from tvm_pesto.graph.opgraph import OpGraph, OpNode

    g = OpGraph([OpNode("x", "op")], [], name="plain")
    path = os.path.join(ROOT, "throughput-inputs", "LayerGraphs", "bert24_inference.json")
    _, meta = load_layer_graph(path)
    with pytest.raises(CostError, match="load_layer_graph"):
        costs_from_graph(g, cluster_from_graph(meta))
