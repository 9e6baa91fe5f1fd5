"""The stage ILP starts from the best of the DP and every heuristic, for the objective in use,
so it is never worse than any of them; where it has no MIP result it says so."""
from __future__ import annotations

import json
import os
import warnings

import pytest
from click.testing import CliRunner
from test_stage import layer_file

from tvm_pesto.bench.random_dag import dnn_like_problem
from tvm_pesto.cli.main import cli
from tvm_pesto.graph import dnn_partitioning as dp
from tvm_pesto.plan import Problem
from tvm_pesto.plan.objective import evaluate
from tvm_pesto.solve import HEURISTICS, solve
from tvm_pesto.solve.stage import ilp as stage_ilp_module
from tvm_pesto.solve.stage.ilp import START_SOLVERS
from tvm_pesto.solve.stage.ilp import solve as stage_ilp

warnings.filterwarnings("ignore", category=RuntimeWarning)
ROOT = str(dp.benchmark_dir())


def heuristic_values(p: Problem, objective: str) -> dict[str, float]:
    """Every heuristic's (and the DP's) stage plan, as the registry gives it, judged by ``objective``."""
    out = {}
    for name in (*HEURISTICS, "stage-dp"):
        ev = evaluate(p, solve(p, name, model="stage", objective=objective), "stage", objective)
        if ev.valid:
            out[name] = ev.objective_value
    return out


def no_relaxed(monkeypatch) -> None:
    """No relaxed stage MIP either (its own row limits, apart from ``max_rows``)."""
    monkeypatch.setattr(stage_ilp_module, "RELAXED_MAX_ROWS", 0)
    monkeypatch.setattr(stage_ilp_module, "RELAXED_LATENCY_MAX_ROWS", 0)


def test_every_heuristic_is_a_start():
    assert set(START_SOLVERS) == {*HEURISTICS, "stage-dp"}


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_the_ilp_is_never_worse_than_a_heuristic_on_a_layergraph(objective, monkeypatch):
    g, meta = dp.load_layer_graph(os.path.join(ROOT, "throughput-inputs", "LayerGraphs", "bert24_training.json"))
    cl = dp.cluster_from_graph(meta)
    p = Problem(g, cl, dp.costs_from_graph(g, cl), colocate=dp.colocation_groups(g))
    best = min(heuristic_values(p, objective).values())
    # with the MIP (a short wall-clock budget: the property holds whatever it finds) ...
    plan = solve(p, "ilp", model="stage", objective=objective, time_limit_s=1.0, deterministic=False)
    assert evaluate(p, plan, "stage", objective).objective_value <= best * (1 + 1e-6)
    # ... and without it (nor its relaxation): the best start, said to be one
    no_relaxed(monkeypatch)
    plan = stage_ilp(p, objective=objective, max_rows=0)
    value = evaluate(p, plan, "stage", objective).objective_value
    assert value <= best * (1 + 1e-6)
    info = plan.info
    assert info["start_values_s"][info["start"]] == pytest.approx(value) == pytest.approx(best)
    if info["status"] != "optimal":  # unless the start meets the lower bound
        assert info["status"] == "heuristic" and "max_rows=0" in info["reason"] and info["start"] in info["reason"]
    assert info["lower_bound_s"] <= value and info["gap"] == pytest.approx(value / info["lower_bound_s"] - 1)


@pytest.mark.slow
def test_when_m_topo_is_the_best_heuristic_the_ilp_starts_from_it(monkeypatch):
    p = dnn_like_problem(24, seed=5, cluster="4xV100-pcie")  # 24 ops, 4 GPUs
    vals = heuristic_values(p, "latency")
    best = min(vals, key=vals.get)
    assert best == "m-topo" and vals["m-topo"] < 0.9 * min(v for k, v in vals.items() if k != "m-topo"), vals
    with monkeypatch.context() as m:
        no_relaxed(m)
        skipped = stage_ilp(p, objective="latency", max_rows=0)
    assert skipped.info["status"] == "heuristic" and skipped.info["start"] == "m-topo"
    assert skipped.info["source"] == "m-topo" and "not built" in skipped.info["reason"]
    assert evaluate(p, skipped, "stage", "latency").objective_value == pytest.approx(vals["m-topo"])
    plan = stage_ilp(p, objective="latency", time_limit_s=1.0, deterministic=True)
    assert plan.info["start"] == "m-topo" and plan.info["status"] in ("optimal", "node_limit", "time_limit")
    assert plan.info["mip_status"] == plan.info["status"]
    assert evaluate(p, plan, "stage", "latency").objective_value <= vals["m-topo"] * (1 + 1e-6)


def test_place_prints_the_gap(tmp_path):
    data = layer_file([(0, 5.0, 1.0, 100 << 20), (1, 4.0, 2.0, 100 << 20), (2, 6.0, 1.5, 100 << 20),
                       (3, 5.0, 1.0, 100 << 20)], [(0, 1, 0.1), (0, 2, 0.1), (1, 3, 0.2), (2, 3, 0.2)])
    g = tmp_path / "g.json"
    g.write_text(json.dumps(data))
    out = tmp_path / "out.json"
    res = CliRunner().invoke(cli, ["place", str(g), "--cluster", "from-graph", "--solver", "all", "--time-limit", "1",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "gap: best heuristic" in text and "of optimal" in text
    r = json.loads(out.read_text())["results"]
    assert r["ilp"]["objective_value"] <= min(v["objective_value"] for k, v in r.items() if k != "ilp") * (1 + 1e-6)
    assert r["ilp"]["info"]["start"] in START_SOLVERS
