"""Bad inputs to ``tvm-pesto place``: each gives exit code 2, a clear message, and no output file."""
from __future__ import annotations

import json
import re
import warnings

import pytest
from click.testing import CliRunner

from tvm_pesto.cli.main import cli

warnings.filterwarnings("ignore", category=RuntimeWarning)
MiB = 1 << 20


def layer_graph(nodes, edges, fpgas=2, size_per_fpga=1 << 30, cpus=1):
    """A dnn-partitioning LayerGraph: ``nodes`` as (id, cpuLatency, fpgaLatency, size),
    ``edges`` as (src, dst, cost, size)."""
    return {"maxFPGAs": fpgas, "maxSizePerFPGA": size_per_fpga, "maxCPUs": cpus,
            "nodes": [{"id": i, "name": f"n{i}", "cpuLatency": c, "fpgaLatency": f, "supportedOnFpga": True,
                       "size": s, "colorClass": i, "isBackwardNode": False} for i, c, f, s in nodes],
            "edges": [{"sourceId": a, "destId": b, "cost": c, "size": s} for a, b, c, s in edges]}


CHAIN = [(0, 5.0, 1.0, 100 * MiB), (1, 5.0, 1.0, 100 * MiB), (2, 5.0, 1.0, 100 * MiB)]
CHAIN_EDGES = [(0, 1, 0.001, MiB), (1, 2, 0.001, MiB)]


def run_place(tmp_path, graph, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    out = tmp_path / "out" / "result.json"
    res = CliRunner().invoke(cli, ["place", str(path), "--cluster", "from-graph", "--json", str(out), *extra])
    return res, out


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_clean_failure(res, out, *needles):
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    msg = flat(res.output)
    assert "error:" in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert "Traceback" not in res.output
    assert not out.exists()
    assert not out.parent.exists() or not list(out.parent.iterdir())  # no temporary leftovers either


def test_good_graph_places_and_writes_json(tmp_path):
    res, out = run_place(tmp_path, layer_graph(CHAIN, CHAIN_EDGES), "--solver", "heft,m-etf")
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"heft", "m-etf"}
    assert data["makespan_s"] > 0
    for r in data["results"].values():  # each plan's gap to the best proven bound
        assert r["certified_gap"] == pytest.approx(1 - r["lower_bound_s"] / r["objective_value"])
        assert 0 <= r["certified_gap"] < 1


def test_cyclic_graph(tmp_path):
    g = layer_graph(CHAIN, CHAIN_EDGES + [(2, 0, 0.001, MiB)])
    res, out = run_place(tmp_path, g)
    assert_clean_failure(res, out, "cycle", "0 -> 1 -> 2 -> 0")


def test_edge_to_unknown_node(tmp_path):
    res, out = run_place(tmp_path, layer_graph(CHAIN, CHAIN_EDGES + [(1, 7, 0.001, MiB)]))
    assert_clean_failure(res, out, "unknown node 7")


def test_negative_latency(tmp_path):
    nodes = [CHAIN[0], (1, 5.0, -1.0, 100 * MiB), CHAIN[2]]
    res, out = run_place(tmp_path, layer_graph(nodes, CHAIN_EDGES))
    assert_clean_failure(res, out, "node 1", "negative fpgaLatency -1.0")


def test_unknown_solver_fails_before_solving(tmp_path):
    res, out = run_place(tmp_path, layer_graph(CHAIN, CHAIN_EDGES), "--solver", "heft,fastest")
    assert_clean_failure(res, out, "unknown solver 'fastest'", "known solvers: single, heft")


def smallest_capacity(res) -> float:
    m = re.search(r"smallest memory per device with which a plan fits is ([\d.]+) MiB", flat(res.output))
    assert m, res.output
    return float(m.group(1))


@pytest.mark.parametrize("solver", ["heft", "ilp"])
def test_memory_too_small_names_the_capacity_that_works(tmp_path, solver):
    # three 100 MiB nodes on two 50 MiB accelerators, no CPU: the total bound says 150 MiB
    # each, but one device must hold two nodes, so 200 MiB (+ nothing received) is the least
    g = layer_graph(CHAIN, CHAIN_EDGES, fpgas=2, size_per_fpga=50 * MiB, cpus=0)
    res, out = run_place(tmp_path, g, "--solver", solver)
    assert_clean_failure(res, out, "no plan can use less than 150.0 MiB each", "Fix: use devices with at least")
    need = smallest_capacity(res)
    assert 200.0 <= need <= 201.0
    # the figure works ...
    ok = layer_graph(CHAIN, CHAIN_EDGES, fpgas=2, size_per_fpga=int(need * MiB), cpus=0)
    res_ok, out_ok = run_place(tmp_path / "ok", ok, "--solver", solver)
    assert res_ok.exit_code == 0, res_ok.output
    assert out_ok.exists()
    # ... and 3 % less does not
    tight = layer_graph(CHAIN, CHAIN_EDGES, fpgas=2, size_per_fpga=int(0.97 * need * MiB), cpus=0)
    res_t, out_t = run_place(tmp_path / "tight", tight, "--solver", solver)
    assert_clean_failure(res_t, out_t, "Fix: use devices with at least")


def test_received_tensors_count_in_the_capacity(tmp_path):
    # two independent 100 MiB producers feeding one consumer of 10 MiB, two devices, no CPU:
    # totals fit (210 MiB in 2 x 110 MiB) but any split must also hold a received 60 MiB
    # tensor, so the figure exceeds the simple bound
    nodes = [(0, 5.0, 1.0, 100 * MiB), (1, 5.0, 1.0, 100 * MiB), (2, 5.0, 1.0, 10 * MiB)]
    edges = [(0, 2, 60.0, 60 * MiB), (1, 2, 60.0, 60 * MiB)]
    g = layer_graph(nodes, edges, fpgas=2, size_per_fpga=110 * MiB, cpus=0)
    res, out = run_place(tmp_path, g, "--solver", "heft", "--model", "op")  # the op model counts received tensors
    assert_clean_failure(res, out, "no plan can use less than 105.0 MiB each")
    need = smallest_capacity(res)
    assert 170.0 <= need <= 171.0  # 0 and 2 on one device, which also receives 1's 60 MiB output
    ok = layer_graph(nodes, edges, fpgas=2, size_per_fpga=int(need * MiB), cpus=0)
    res_ok, _ = run_place(tmp_path / "ok", ok, "--solver", "heft", "--model", "op")
    assert res_ok.exit_code == 0, res_ok.output


def test_zoo_target_with_layergraph_cluster_is_refused(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["place", "resnet50", "--cluster", "from-graph", "--json", str(out)])
    assert_clean_failure(res, out, "from-graph only applies to LayerGraph JSON files")


def test_split_margin_on_a_layer_graph_is_refused(tmp_path):
    res, out = run_place(tmp_path, layer_graph(CHAIN, CHAIN_EDGES), "--split-margin", "0.1")
    assert_clean_failure(res, out, "--split-margin applies to models", "leave --split-margin out")
