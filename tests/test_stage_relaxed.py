"""The relaxed stage MIP of one sample's latency on training (two-pass) files
(:func:`tvm_pesto.solve.stage.model.build_stage_ilp` with ``relaxed=True``): every valid
plan is one of its solutions with no larger ``T``, so its optimum and dual bound are lower
bounds, checked against brute force; and the stage ILP runs it where the full MIP is too
large, returning the better of its plan and the start with a status and a gap."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_stage import layer_file, problem_of

from tvm_pesto.bench.stage_ilp import stage_ilp_markdown
from tvm_pesto.cli.main import cli
from tvm_pesto.errors import PestoError
from tvm_pesto.plan import Plan
from tvm_pesto.plan.objective import evaluate
from tvm_pesto.solve.mip import solve_mip
from tvm_pesto.solve.stage import ilp as stage_ilp
from tvm_pesto.solve.stage.dp import device_orders
from tvm_pesto.solve.stage.ilp import solve as ilp_solve
from tvm_pesto.solve.stage.model import build_stage_ilp, relaxed_applies

MiB = 1 << 20


def training_file(seed: int, n: int = 4, fpgas: int = 2) -> dict:
    """``n`` forward layers in a chain and their backward twins (reversed), each pair one
    colour class; the backward of layer ``i`` also reads the forward input of layer ``i``
    (an edge from the forward pass into the backward one), edges of different costs, and
    accelerators that hold a little over half of the layers."""
    rng = np.random.default_rng(seed)
    nodes = [(i, float(rng.uniform(2, 6)), float(rng.uniform(0.3, 2)), MiB, i, False) for i in range(n)]
    nodes += [(n + i, float(rng.uniform(2, 6)), float(rng.uniform(0.3, 2)), MiB, i, True) for i in range(n)]
    edges = [(i, i + 1, float(rng.uniform(0.05, 0.6))) for i in range(n - 1)]
    edges += [(n - 1, 2 * n - 1, float(rng.uniform(0.05, 0.6)))]
    edges += [(n + i + 1, n + i, float(rng.uniform(0.05, 0.6))) for i in range(n - 1)]
    edges += [(i - 1, n + i, float(rng.uniform(0.05, 0.6))) for i in range(1, n)]
    return layer_file(nodes, edges, fpgas=fpgas, cpus=1, size_per_fpga=int((n + 1) * MiB))


def every_valid_plan(p):
    """``(latency, plan)`` of every valid stage plan (brute force over the colour classes)."""
    groups = sorted({nd.extra.get("colorClass", i) for i, nd in enumerate(p.graph.nodes)})
    cls = [groups.index(nd.extra.get("colorClass", i)) for i, nd in enumerate(p.graph.nodes)]
    out = []
    for pick in itertools.product(range(p.num_devices), repeat=len(groups)):
        a = np.array([pick[c] for c in cls])
        plan = Plan(a, device_orders(p, a))
        ev = evaluate(p, plan, "stage", "latency")
        if ev.valid:
            out.append((ev.objective_value, plan))
    return out


def relaxed_optimum(p, fixed=None) -> float:
    """The relaxed latency MIP's optimum in seconds (``fixed``: with ``x`` fixed to a plan)."""
    prob, V = build_stage_ilp(p, "latency", relaxed=True)
    if fixed is not None:
        for (v, d), var in V["x"].items():
            var.lowBound = var.upBound = 1.0 if fixed.assignment[v] == d else 0.0
    res = solve_mip(prob, "highs", time_limit_s=30, gap=1e-7, deterministic=True)
    assert res.status == "optimal"
    return res.objective / V["ts"]


def test_the_files_have_classes_and_both_passes(tmp_path):
    p = problem_of(training_file(0), tmp_path)
    assert relaxed_applies(p, "latency", None) is None and not p.pooled("stage", "latency")
    assert p.colocate and len(every_valid_plan(p)) > 3


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_the_relaxation_is_a_lower_bound_on_the_brute_force_optimum(tmp_path, seed):
    p = problem_of(training_file(seed, n=4, fpgas=2), tmp_path)
    plans = every_valid_plan(p)
    best = min(v for v, _ in plans)
    assert 0 < relaxed_optimum(p) <= best * (1 + 1e-6)


@pytest.mark.slow
def test_every_valid_plan_is_a_solution_no_later_than_its_latency(tmp_path):
    p = problem_of(training_file(5, n=3, fpgas=2), tmp_path)
    for value, plan in every_valid_plan(p):
        assert relaxed_optimum(p, fixed=plan) <= value * (1 + 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_the_stage_ilp_runs_it_where_the_full_mip_is_too_large(tmp_path, seed, monkeypatch):
    p = problem_of(training_file(seed, n=4), tmp_path)
    best = min(v for v, _ in every_valid_plan(p))
    monkeypatch.setattr(stage_ilp, "objective_lower_bound", lambda *a, **k: {"best": 0.0})
    plan = ilp_solve(p, "latency", time_limit_s=20, deterministic=True, max_rows=10)
    info = plan.info
    assert info["mip"] == "relaxed" and info["status"] in ("optimal", "feasible")
    assert 0 < info["lower_bound_s"] <= best * (1 + 1e-6) and info["gap"] is not None
    ev = evaluate(p, plan, "stage", "latency")
    assert ev.valid and ev.objective_value == pytest.approx(info["objective_value_s"])
    assert best * (1 - 1e-9) <= info["objective_value_s"] <= min(info["start_values_s"].values()) * (1 + 1e-9)


def test_it_is_refused_where_it_is_no_relaxation(tmp_path):
    data = training_file(0)  # a forward node fed by the last backward one
    data["nodes"].append(dict(data["nodes"][0], id=8, name="n8", colorClass=8))
    data["edges"].append({"sourceId": 4, "destId": 8, "cost": 0.1, "size": 1})
    p = problem_of(data, tmp_path)
    assert "backward pass to the forward" in relaxed_applies(p, "latency", None)
    with pytest.raises(PestoError, match="does not apply"):
        build_stage_ilp(p, "latency", relaxed=True)


@pytest.mark.slow
def test_bench_placement_writes_the_stage_ilp_table(tmp_path):
    folder = tmp_path / "throughput-inputs" / "LayerGraphs"
    folder.mkdir(parents=True)
    (folder / "tiny_training.json").write_text(json.dumps(training_file(1)))
    out = tmp_path / "out.json"
    res = CliRunner().invoke(cli, ["bench", "placement", "--root", str(tmp_path), "--no-layergraphs", "--no-zoo",
                                   "--stage-ilp", "--ilp-time-limit", "2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["stage_ilp"]
    assert [(r["inputs"], r["graph"], r["objective"]) for r in rows] == [
        ("throughput", "tiny_training", "latency"), ("throughput", "tiny_training", "throughput")]
    for r in rows:
        assert r["valid"] and r["bound"] <= r["ilp"] * (1 + 1e-9) <= min(r["starts"].values()) * (1 + 1e-9)
        assert r["status"] != "heuristic" and r["rules"] == "stage"
    assert stage_ilp_markdown(rows)[2].startswith("| throughput | tiny_training | latency | ")
