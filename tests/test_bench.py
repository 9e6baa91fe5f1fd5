"""``tvm-pesto bench placement|scale --quick`` through click, into a temporary folder."""
from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

from tvm_pesto.bench.placement_case import case_checks
from tvm_pesto.cli.bench import bench

warnings.filterwarnings("ignore", category=RuntimeWarning)
HEURISTICS = {"single", "m-topo", "m-etf", "m-sct", "heft"}


def invoke(*args):
    res = CliRunner().invoke(bench, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


@pytest.fixture(scope="module")
def placement(tmp_path_factory):
    out = tmp_path_factory.mktemp("placement")
    res = invoke("placement", "--quick", "--json", str(out / "p.json"), "--md", str(out / "p.md"),
                 "--plots", str(out / "plots"))
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "p.json").read_text())


@pytest.mark.slow
def test_placement_json_has_every_case_algorithm_and_field(placement):
    _, data = placement
    assert data["benchmark"] == "placement"
    assert {"nproc", "cpu_model", "load_average"} <= set(data["machine"])
    assert data["settings"]["ilp_time_limit_s"] == 2.0
    assert data["command"].startswith("tvm-pesto bench placement") and "--quick" in data["command"]
    names = [c["name"] for c in data["cases"]]
    assert names == ["latency/bert24_inference", "throughput/bert24_inference", "zoo/mlp_mixer@2xV100-nvlink"]
    for case in data["cases"]:
        assert case["lower_bound_s"] > 0
        expected = HEURISTICS | {"ilp"} | ({"expert"} if case["name"].startswith("throughput/") else set())
        assert set(case["results"]) == expected, case["name"]
        for alg, r in case["results"].items():
            assert "error" not in r, (case["name"], alg, r)
            assert r["makespan_s"] >= case["lower_bound_s"] * (1 - 1e-6)
            assert r["ratio_to_lower_bound"] == pytest.approx(r["makespan_s"] / case["lower_bound_s"])
            assert r["solve_s"] >= 0
            assert len(r["peak_memory_bytes"]) == case["devices"] == len(case["capacity_bytes"])
            if alg != "expert":
                assert r["memory_ok"]
                assert all(p <= c * (1 + 1e-9) for p, c in zip(r["peak_memory_bytes"], case["capacity_bytes"]))


def test_placement_ilp_never_worse_than_best_heuristic(placement):
    _, data = placement
    for case in data["cases"]:
        best = min(case["results"][h]["makespan_s"] for h in HEURISTICS)
        assert case["best_heuristic_makespan_s"] == best
        assert case["results"]["ilp"]["makespan_s"] <= best * (1 + 1e-9), case["name"]
        assert case["checks"]["ilp_not_worse_than_heuristics"] is True
        assert case["checks"] == case_checks(case)
    assert data["summary"]["ilp_never_worse"] is True
    assert data["summary"]["checked"] == len(data["cases"])


def test_placement_markdown_and_plots(placement):
    out, data = placement
    md = (out / "p.md").read_text()
    assert "| case |" in md and "throughput/bert24_inference" in md and data["command"] in md
    assert "AMD" in md or data["machine"]["cpu_model"] in md
    for name in ("placement_ratio.png", "placement_solve_time.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_case_checks_flag_a_missed_goal_and_a_worse_ilp():
    row = {"lower_bound_s": 1.0, "best_heuristic_makespan_s": 1.08, "results": {"ilp": {"makespan_s": 1.07}}}
    c = case_checks(row)
    assert c["heuristics_within_10pct"] and not c["ilp_within_5pct"] and not c["goal_met"]
    row["results"]["ilp"]["makespan_s"] = 1.09
    assert case_checks(row)["ilp_not_worse_than_heuristics"] is False
    row["best_heuristic_makespan_s"] = 1.5  # heuristics far from the bound: the goal does not apply
    assert case_checks(row)["goal_met"] is True


@pytest.mark.slow
def test_scale_quick(tmp_path):
    res = invoke("scale", "--quick", "--ilp-time-limit", "0.5", "--lns", "0.5", "--ilp-refine", "0.2",
                 "--json", str(tmp_path / "s.json"),
                 "--md", str(tmp_path / "s.md"), "--plots", str(tmp_path))
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["settings"]["sizes"] == [300, 1000] and data["settings"]["lns_s"] == 0.5
    assert [g["n"] for g in data["graphs"]] == [300, 1000]
    algs = {"single", "m-topo", "m-etf", "m-sct", "heft", "ilp"}
    assert {(r["n"], r["algorithm"]) for r in data["rows"]} == {(n, a) for n in (300, 1000) for a in algs}
    for r in data["rows"]:
        assert "error" not in r, r
        assert r["wall_s"] > 0 and r["makespan_s"] > 0 and r["ratio_to_lower_bound"] >= 1 - 1e-6
    ilp = [r for r in data["rows"] if r["algorithm"] == "ilp"]
    assert all(r["coarse_nodes"] <= 40 and r["coarsen_s"] >= 0 for r in ilp)
    assert "| ops |" in (tmp_path / "s.md").read_text()
    assert (tmp_path / "scale_wall_time.png").exists()


@pytest.mark.slow
def test_scale_caps_the_ilp_path_and_says_where(tmp_path):
    res = invoke("scale", "--sizes", "300", "--algorithms", "heft,ilp", "--lns", "600", "--ilp-refine", "600",
                 "--ilp-max-s", "2", "--json", str(tmp_path / "s.json"), "--md", str(tmp_path / "s.md"))
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "s.json").read_text())
    ilp = next(r for r in data["rows"] if r["algorithm"] == "ilp")
    heft = next(r for r in data["rows"] if r["algorithm"] == "heft")
    assert data["settings"]["ilp_max_s"] == 2 and ilp["deterministic"] is False
    assert "cap hit in the LNS" in ilp["clock_stopped"] and ilp["wall_s"] < 60  # its budgets alone: 1200 s
    assert ilp["makespan_s"] <= heft["makespan_s"] * (1 + 1e-9)
    assert "Where a clock stopped the ILP path" in (tmp_path / "s.md").read_text()


@pytest.mark.parametrize("args, needle", [
    (["placement", "--quick", "--algorithms", "heft,nope"], "unknown solver 'nope'"),
    (["scale", "--sizes", "10,ten"], "--sizes must be comma-separated integers"),
    (["scale", "--sizes", "0", "--algorithms", "heft"], "at least 1 op"),
])
def test_bad_options_exit_2_without_output(tmp_path, args, needle):
    out = tmp_path / "r.json"
    res = invoke(*args, "--json", str(out))
    assert res.exit_code == 2, res.output
    assert needle in " ".join(res.output.split())
    assert not out.exists()
