"""The dnn-partitioning benchmark's rule for the host CPUs (:class:`tvm_pesto.plan.problem.HostPool`):
validity and latency in the stage evaluator against the authors' evaluator restated here
(``latency-greedy/greedy.cpp -computeLatency``), the bounds and the piece MIP under the rule
against brute force, and the relaxed steady-state MIP of graphs too large for the full one."""
from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from test_stage import layer_file as training_layer_file
from test_stage_pieces import MiB, layer_file, problem_of

from tvm_pesto.errors import PestoError
from tvm_pesto.plan import Plan
from tvm_pesto.plan.objective import evaluate
from tvm_pesto.plan.problem import HostPool, layer_graph_problem
from tvm_pesto.plan.stage import evaluate_stages
from tvm_pesto.solve.bounds.objective import objective_lower_bound
from tvm_pesto.solve.mip import solve_mip
from tvm_pesto.solve.settings import MipSettings
from tvm_pesto.solve.stage import ilp as stage_ilp
from tvm_pesto.solve.stage.dp import device_orders
from tvm_pesto.solve.stage.ilp import solve as ilp_solve
from tvm_pesto.solve.stage.model import build_stage_ilp
from tvm_pesto.solve.stage.piece_mip import PieceData, solve_pieces
from tvm_pesto.solve.stage.hull_bound import hull_path_bound
from tvm_pesto.solve.stage.pieces import Units, contract_units, improve


def authors_latency(raw: dict, machine_of: dict) -> float:
    """The authors' latency of a contiguous split, restated from their description: ``machine_of``
    maps a node id to ``"cpu"`` or an accelerator number. A CPU node ends its ``cpuLatency``
    after its last producer; an accelerator's subgraph starts after every outside node that
    feeds it, and takes the outgoing cost of each of those, its nodes' ``fpgaLatency`` and the
    outgoing cost of each of its nodes with an edge leaving it; all its nodes end with it."""
    out_cost = {e["sourceId"]: e["cost"] for e in raw["edges"]}
    node = {nd["id"]: nd for nd in raw["nodes"]}
    block = {v: ("v", v) if m == "cpu" else ("acc", m) for v, m in machine_of.items()}
    g = nx.DiGraph()
    g.add_nodes_from(set(block.values()))
    g.add_edges_from((block[e["sourceId"]], block[e["destId"]]) for e in raw["edges"]
                     if block[e["sourceId"]] != block[e["destId"]])
    preds = {v: [e["sourceId"] for e in raw["edges"] if e["destId"] == v] for v in node}
    succs = {v: [e["destId"] for e in raw["edges"] if e["sourceId"] == v] for v in node}
    done: dict = {}
    for b in nx.topological_sort(g):
        if b[0] == "v":
            done[b[1]] = max((done[u] for u in preds[b[1]]), default=0.0) + node[b[1]]["cpuLatency"]
            continue
        inside = {v for v, m in machine_of.items() if m == b[1]}
        feeding = {u for v in inside for u in preds[v] if u not in inside}
        leaving = {v for v in inside if any(w not in inside for w in succs[v])}
        end = max((done[u] for u in feeding), default=0.0) + sum(out_cost[u] for u in feeding) + \
            sum(node[v]["fpgaLatency"] for v in inside) + sum(out_cost[v] for v in leaving)
        done.update({v: end for v in inside})
    return max(done.values(), default=0.0)


def random_file(seed: int, n: int = 9, classes: int = 7, fpgas: int = 2, cap: float = 0.5) -> dict:
    """A small LayerGraph whose nodes share a few colour classes, each node's edges one cost."""
    rng = np.random.default_rng(seed)
    colour = rng.integers(0, classes, n)
    nodes = [(i, float(rng.uniform(1, 6)), float(rng.uniform(0.1, 1.5)), int(rng.integers(1, 4)) * MiB, int(colour[i]))
             for i in range(n)]
    cost = rng.uniform(0.05, 0.8, n)
    edges = sorted({(i, int(j), float(cost[i])) for i in range(n - 1)
                    for j in rng.choice(np.arange(i + 1, n), size=min(2, n - 1 - i), replace=False)})
    return layer_file(nodes, edges, fpgas=fpgas, cpus=2, size_per_fpga=int(sum(nd[3] for nd in nodes) * cap))


def random_split(p, seed: int) -> np.ndarray:
    """Units cut into intervals of a random topological order, each on a new accelerator or a
    random CPU (intervals of a topological order are contiguous)."""
    rng = np.random.default_rng(seed)
    u = contract_units(p)
    g = nx.DiGraph(u.edges)
    g.add_nodes_from(range(u.count))
    order = list(nx.lexicographical_topological_sort(g, key=lambda i: rng.random()))
    cpus = [d for d, dv in enumerate(p.cluster.devices) if dv.kind == "cpu"]
    accs = [d for d, dv in enumerate(p.cluster.devices) if dv.kind != "cpu"]
    cuts = sorted(rng.choice(np.arange(1, u.count), size=min(u.count - 1, int(rng.integers(1, 5))), replace=False))
    a, nxt = np.zeros(p.num_nodes, dtype=np.int64), 0
    for seg in np.split(np.array(order), cuts):
        on_acc = nxt < len(accs) and rng.random() < 0.6
        dev = accs[nxt] if on_acc else cpus[int(rng.integers(len(cpus)))]
        nxt += on_acc
        for i in seg:
            a[u.members[i]] = dev
    return a


def pooled_optimum(p) -> float:
    """The best latency under the host pool over every unit -> machine choice (CPU units on the
    first CPU: in the pool any CPU is as good)."""
    u = contract_units(p)
    cpu0 = next(d for d, dv in enumerate(p.cluster.devices) if dv.kind == "cpu")
    accs = [d for d, dv in enumerate(p.cluster.devices) if dv.kind != "cpu"]
    best = np.inf
    for choice in itertools.product([cpu0] + accs, repeat=u.count):
        a = np.array(choice)[u.unit_of]
        ev = evaluate(p, Plan(a, device_orders(p, a)), "stage", "latency")
        if ev.valid:
            best = min(best, ev.objective_value)
    return best


def test_the_rule_is_the_files_and_holds_for_one_samples_stage_latency(tmp_path):
    p = problem_of(random_file(0), tmp_path)
    assert p.host_pool == HostPool()
    assert p.pooled("stage", "latency") and not p.pooled("stage", "throughput") and not p.pooled("op", "latency")
    assert not p.pooled("stage", "latency", 4)
    assert HostPool().to_json()["rule"] == "host-pool"
    assert problem_of(training_file(0), tmp_path, "t").host_pool is None  # the latency setting's graphs are inference


def test_a_colour_class_over_two_cpus_is_valid_in_the_pool_only(tmp_path):
    # 0 -> 1 -> 2, 0 and 2 one class; 1 only on the accelerators would break contiguity, so on a CPU
    nodes = [(0, 2.0, 1.0, MiB, 5), (1, 3.0, 1.0, MiB, 6), (2, 2.0, 1.0, MiB, 5)]
    p = problem_of(layer_file(nodes, [(0, 1, 0.5), (1, 2, 0.5)], fpgas=1, cpus=2), tmp_path)
    cpu0, cpu1 = 1, 2
    plan = Plan(np.array([cpu0, cpu0, cpu1]), device_orders(p, np.array([cpu0, cpu0, cpu1])))
    pooled, strict = evaluate_stages(p, plan, pooled=True), evaluate_stages(p, plan)
    assert pooled.valid and pooled.latency_s == pytest.approx(7e-3)
    assert {v["kind"] for v in strict.violations} == {"colocation"}
    assert evaluate(p, plan, "stage", "latency").valid and not evaluate(p, plan, "stage", "throughput").valid


def test_cpu_nodes_run_side_by_side_and_a_cpu_stage_need_not_be_contiguous(tmp_path):
    # 0 -> {1, 2} -> 3, all on one CPU but 1 on the accelerator: the CPU's nodes 0, 2, 3 are
    # not contiguous; 2 runs while the accelerator runs 1
    nodes = [(0, 1.0, 9.0, MiB), (1, 5.0, 1.0, MiB), (2, 4.0, 9.0, MiB), (3, 1.0, 9.0, MiB)]
    edges = [(0, 1, 0.5), (0, 2, 0.5), (1, 3, 0.25), (2, 3, 0.25)]
    p = problem_of(layer_file(nodes, edges, fpgas=1, cpus=1), tmp_path)
    a = np.array([1, 0, 1, 1])
    r = evaluate_stages(p, Plan(a, device_orders(p, a)), pooled=True)
    assert r.valid and not evaluate_stages(p, Plan(a, device_orders(p, a))).valid
    # 0 (1) -> accelerator: in 0.5 + work 1 + out 0.25 -> 3 at 2.75 + 1; 2 ends at 5, then 3: 6
    assert r.latency_s == pytest.approx(6e-3)


@pytest.mark.parametrize("seed", range(6))
def test_the_pooled_latency_is_the_authors_on_random_splits(tmp_path, seed):
    raw = random_file(seed, cap=0.8)
    p = problem_of(raw, tmp_path)
    ids = [nd.extra["id"] for nd in p.graph.nodes]
    accs = {d: k for k, d in enumerate(d for d, dv in enumerate(p.cluster.devices) if dv.kind != "cpu")}
    checked = 0
    for k in range(24):
        a = random_split(p, 100 * seed + k)
        ev = evaluate(p, Plan(a, device_orders(p, a)), "stage", "latency")
        if not ev.valid:
            assert {v["kind"] for v in ev.violations} == {"memory"}
            continue
        theirs = authors_latency(raw, {ids[v]: ("cpu" if int(a[v]) not in accs else accs[int(a[v])])
                                       for v in range(p.num_nodes)})
        assert ev.objective_value == pytest.approx(theirs * 1e-3, rel=1e-9)
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("seed", range(4))
def test_the_bound_and_the_piece_mip_hold_under_the_pool(tmp_path, seed):
    p = problem_of(random_file(seed, n=8, classes=6), tmp_path)
    best = pooled_optimum(p)
    assert objective_lower_bound(p, "stage", "latency", lp=False)["best"] <= best * (1 + 1e-9)
    a = random_split(p, seed)
    start = Plan(a, device_orders(p, a))
    ev = evaluate(p, start, "stage", "latency")
    if not ev.valid:
        start = ilp_solve(p, "latency", time_limit_s=20, deterministic=True)  # the DP's plan, at least
        ev = evaluate(p, start, "stage", "latency")
    found, res, facts = solve_pieces(p, start, ev.objective_value, MipSettings(solver="highs", time_limit_s=20,
                                                                                       deterministic=True))
    assert res.status == "optimal" and facts["mip_bound_s"] <= best * (1 + 1e-9)
    values = [evaluate(p, Plan(f, device_orders(p, f)), "stage", "latency") for f in found]
    assert all(v.valid for v in values)
    assert min(v.objective_value for v in values) == pytest.approx(best, rel=1e-6)
    assert PieceData(p).times(PieceData(p).machines_of(Plan(found[-1], device_orders(p, found[-1]))))["latency"] == \
        pytest.approx(values[-1].objective_value, rel=1e-9)


def test_cpu_work_side_by_side_is_not_bounded_by_a_devices_load(tmp_path):
    # four CPU-only nodes of 1 ms each, side by side: the latency is 1 ms, while the work per
    # device (4 / 2 devices) would say 2
    nodes = [(i, 1.0, 1e9, MiB) for i in range(4)]
    p = problem_of(layer_file(nodes, [], fpgas=1, cpus=1), tmp_path)
    p.costs[:, 0] = np.inf
    a = np.ones(4, dtype=np.int64)
    assert evaluate(p, Plan(a, device_orders(p, a)), "stage", "latency").objective_value == pytest.approx(1e-3)
    lb = objective_lower_bound(p, "stage", "latency", lp=False)
    assert lb["best"] <= 1e-3 * (1 + 1e-9) and "bottleneck_s" not in lb["latency"]


def test_the_hull_bound_counts_the_work_between_a_runs_ends(tmp_path):
    # 0 -> {1, 2} -> 3, dear on the CPU: one accelerator runs all four (4 ms), the critical
    # path says 3, the hull of the path 0 -> 1 -> 3 holds 2 as well
    nodes = [(i, 50.0, 1.0, MiB) for i in range(4)]
    p = problem_of(layer_file(nodes, [(0, 1, 0.5), (0, 2, 0.5), (1, 3, 0.5), (2, 3, 0.5)], fpgas=1), tmp_path)
    assert hull_path_bound(p)["bound_s"] == pytest.approx(4e-3, rel=1e-5)
    assert objective_lower_bound(p, "stage", "latency", lp=False)["latency"]["critical_path_s"] == pytest.approx(3e-3)
    assert hull_path_bound(p)["bound_s"] <= pooled_optimum(p) * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_the_hull_bound_holds_on_random_graphs(tmp_path, seed):
    p = problem_of(random_file(seed, n=8, classes=6, cap=0.4 if seed % 2 else 0.9), tmp_path)
    assert 0 < hull_path_bound(p)["bound_s"] <= pooled_optimum(p) * (1 + 1e-9)


def test_a_unit_moves_with_its_ancestors_where_one_alone_would_not_pay():
    # units 0 -> 1 on accelerator 1; either alone on the CPUs costs more, both together less
    units = Units([[0], [1]], np.array([0, 1]), [(0, 1)], {0: [1]})
    value = {(1, 1): 10.0, (0, 1): 11.0, (1, 0): 11.0, (0, 0): 5.0}
    out = improve(units, np.array([1, 1]), lambda m: value[tuple(m.tolist())], np.ones((2, 2), dtype=bool),
                  np.zeros(2), np.array([1.0]))
    assert out.tolist() == [0, 0]


def test_the_ilp_states_the_rule_and_runs_the_piece_mip(tmp_path):
    p = problem_of(random_file(3), tmp_path)
    plan = ilp_solve(p, "latency", time_limit_s=20, deterministic=True)
    assert plan.info["rules"] == HostPool().to_json() and plan.info["objective"] == "latency"
    assert plan.info["mip"] == "pieces" or plan.info["status"] == "optimal"
    assert evaluate(p, plan, "stage", "latency").valid


def training_file(seed: int, n: int = 5) -> dict:
    """A chain of ``n`` forward nodes and their backward twins (reversed), each pair one class."""
    rng = np.random.default_rng(seed)
    nodes = [(i, float(rng.uniform(2, 6)), float(rng.uniform(0.5, 2)), MiB, i, False) for i in range(n)]
    nodes += [(n + i, float(rng.uniform(2, 6)), float(rng.uniform(0.5, 2)), MiB, i, True) for i in range(n)]
    cost = rng.uniform(0.05, 0.4, 2 * n)
    edges = [(i, i + 1, float(cost[i])) for i in range(n - 1)] + [(n - 1, 2 * n - 1, float(cost[n - 1]))]
    edges += [(n + i + 1, n + i, float(cost[n + i + 1])) for i in range(n - 1)]
    return training_layer_file(nodes, edges, fpgas=2, cpus=1, size_per_fpga=int(1.6 * n * MiB))


@pytest.mark.parametrize("seed", range(3))
def test_the_relaxed_steady_state_mip_bounds_and_plans(tmp_path, seed, monkeypatch):
    p = problem_of(training_file(seed), tmp_path)
    full = ilp_solve(p, "throughput", time_limit_s=20, deterministic=True)
    assert full.info["status"] == "optimal"
    prob, V = build_stage_ilp(p, "throughput", warm=full, relaxed=True)
    whole, _ = build_stage_ilp(p, "throughput", warm=full)
    assert prob.numConstraints() < whole.numConstraints() and not V["rin"] and "pi" not in V
    res = solve_mip(prob, "highs", time_limit_s=20, gap=1e-6, deterministic=True)
    assert res.status == "optimal" and res.bound / V["ts"] <= full.info["objective_value_s"] * (1 + 1e-6)
    # through the stage ILP where the full model is too large and the cheap bound says little
    monkeypatch.setattr(stage_ilp, "objective_lower_bound", lambda *a, **k: {"best": 0.0})
    relaxed = ilp_solve(p, "throughput", time_limit_s=20, deterministic=True, max_rows=10)
    assert relaxed.info["mip"] == "relaxed" and relaxed.info["status"] in ("optimal", "feasible")
    assert 0 < relaxed.info["lower_bound_s"] <= full.info["objective_value_s"] * (1 + 1e-6)
    assert evaluate(p, relaxed, "stage", "throughput").valid
    assert relaxed.info["objective_value_s"] >= full.info["objective_value_s"] * (1 - 1e-9)
    with pytest.raises(PestoError, match="not 4 microbatches"):
        build_stage_ilp(p, "throughput", 4, relaxed=True)


@pytest.mark.slow
def test_bert_l3_reaches_the_papers_split_within_three_percent():
    from tvm_pesto.graph import dnn_partitioning as dp
    p = layer_graph_problem(dp.benchmark_dir() / "latency-inputs" / "OperatorGraphs" / "bert_l-3_inference.json.gz")[0]
    plan = ilp_solve(p, "latency", time_limit_s=3, deterministic=True)
    assert plan.info["objective_value_s"] <= 0.408474 * (1 + 1e-6)
    assert plan.info["gap"] <= 0.03 and evaluate(p, plan, "stage", "latency").valid
