"""``tvm-pesto run`` and ``place`` on the user's own model files (outside the zoo), through the
one flow with every backend: the JSON says what was chosen, what ran, and how it compared."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
from click.testing import CliRunner

import outside_zoo as oz
from tvm_pesto.backends import release_all
from tvm_pesto.cli.main import cli

pytestmark = pytest.mark.slow  # the CLI runs models end to end with every backend: out of the `-m "not slow"` lane

warnings.filterwarnings("ignore", category=RuntimeWarning)

# split: None unless the plan used several devices; contention: the cluster's, if measured
RUN_KEYS = ("backend_mix", "devices_used", "measured_s", "simulated_s", "max_abs_err", "solver_status", "split",
            "contention", "measured_runs")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"onnx": oz.write_onnx("convnext", d, "small"), "pt2": oz.write_pt2("vit", d, "small"),
            "dynamic": oz.write_onnx("mobilenet_v3", d, "small", dynamic_batch=True)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path / "cache"))


def _run(tmp_path, *args):
    out = tmp_path / "run.json"
    res = CliRunner().invoke(cli, ["run", *args, "--cluster", "cpu:2", "--repeat", "3", "--refit", "--json", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def _run_with_every_backend(tmp_path, path, kind, costs):
    res = _run(tmp_path, path, "--costs", costs)
    for key in RUN_KEYS:
        assert key in res, key
    assert res["measured_runs"] > 3  # --repeat 3, and more until 0.2 s of runs (a small model: thousands)
    assert res["source"] == kind and res["max_abs_err"] <= 1e-4
    assert sum(res["backend_mix"].values()) == res["num_ops"]
    assert res["costs"]["measured" if costs == "measured" else "predicted"] > 0
    # the default solver, auto: the joint ILPs proved a bound and say what decided the flow's plan on cpu:2
    # (the measured final choice may then keep another option: its decided_by says so)
    flow = res["flow"]
    assert flow["cluster"] == "cpu:2" and flow["solver_status"] in ("optimal", "feasible")
    assert flow["decided_by"] and flow["solver_bound_s"] <= flow["simulated_s"] * (1 + 1e-6)
    assert res["decided_by"] and res["devices_used"]
    if res["decision"]["chosen"] == "plan":
        assert res["solver"] == "auto" and res["solver_status"] == flow["solver_status"]
        assert res["solver_gap"] == flow["solver_gap"] and res["decided_by"] == flow["decided_by"]
        assert res["solver_gap"] == pytest.approx(1 - res["solver_bound_s"] / res["simulated_makespan_s"], abs=1e-6)
    elif res["decision"]["chosen"].startswith("library:"):  # with the ILP's claim on measured costs, or none
        chosen = res["decision"]["chosen"]
        by = f"measured-ilp (= {chosen})" if res["decision"]["claim"] else f"measured ({chosen})"
        assert res["decided_by"] == by
    # cpu:2 is on this machine: the executor's dispatch was measured here, not taken from the preset
    # (its multi-device figure is a difference of timings, clipped at 0: a busy machine can give 0)
    assert res["dispatch"]["measured"] and res["dispatch"]["run_s"] > 0 and res["dispatch"]["multi_device_s"] >= 0
    libraries = {b for b in res["backend_mix"] if b != "tvm"}
    assert set(res["build_s_by_backend"]) == libraries  # every library unit's build, timed
    assert all(s > 0 for s in res["build_s_by_backend"].values())
    return res


def test_run_a_model_file_with_every_backend(files, tmp_path, cache):
    """The ONNX file with measured costs (each candidate timed here)."""
    res = _run_with_every_backend(tmp_path, files["onnx"], "onnx", "measured")
    assert res["cost_source"] == "measured"


def test_run_a_model_file_with_predicted_costs(files, tmp_path, cache, cpu_kind):
    """The torch.export file with the cost model's predictions, on a CPU kind the model was
    trained on (``xgb``) and on one it never saw (``xgb-other-cpu``: predicted all the same)."""
    res = _run_with_every_backend(tmp_path, files["pt2"], "pt2", "xgb")
    assert res["cost_source"] == ("xgb" if cpu_kind.trained else "xgb-other-cpu")


def test_run_sets_a_dynamic_input_shape_and_exports(files, tmp_path, cache):
    bundle = tmp_path / "bundle"
    shape = (2,) + tuple(oz.example_shape("mobilenet_v3", "small")[1:])  # the batch axis is the dynamic one
    traces = tmp_path / "trace"
    res = _run(tmp_path, files["dynamic"], "--input-shape", f"{oz.input_name('mobilenet_v3')}={','.join(map(str, shape))}",
               "--costs", "xgb", "--export", str(bundle), "--trace-dir", str(traces))
    assert res["max_abs_err"] <= 1e-4 and res["exported_to"] == str(bundle)
    assert (bundle / "manifest.json").is_file()
    assert res["artifacts"] == ["gantt.png", "plan_trace.json", "run_trace.json"]
    ran = [e for e in json.loads((traces / "run_trace.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    assert ran and all(e["dur"] >= 0 for e in ran)  # what really ran, one event per step


def test_run_within_a_build_budget_of_nothing_builds_no_library_unit(files, tmp_path, cache):
    release_all()  # a unit this process built already would cost nothing to build again
    res = _run(tmp_path, files["onnx"], "--costs", "xgb", "--max-build-s", "0")
    assert res["backend_mix"] == {"tvm": res["num_ops"]} and res["build_s_by_backend"] == {}
    budget = res["build_budget"] or res["flow"]["build_budget"]
    assert budget["max_build_s"] == 0.0 and budget["build_s"] == 0.0
    # no whole-model library call is weighed: none builds in no time (TVM's own build is not in the budget)
    assert not [o for o in res["decision"]["options"] if o["name"].startswith("library:")
                and not o["name"].startswith("library:tvm")]
    assert res["max_abs_err"] <= 1e-4


def test_place_within_a_build_budget_of_nothing_plans_no_library_unit(files, tmp_path, cache):
    release_all()
    out = tmp_path / "place.json"
    res = CliRunner().invoke(cli, ["place", files["onnx"], "--costs", "xgb", "--solver", "auto,heft",
                                   "--max-build-s", "0", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for r in data["results"].values():
        assert set(r["backend_mix"]) == {"tvm"}
        assert r["info"]["build_budget"]["max_build_s"] == 0.0 and r["info"]["build_budget"]["build_s"] == 0.0


def test_a_build_budget_on_a_graph_file_is_refused(tmp_path):
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps({"name": "g", "nodes": [], "edges": []}))
    res = CliRunner().invoke(cli, ["place", str(graph), "--max-build-s", "1"])
    assert res.exit_code != 0 and "--max-build-s" in res.output and "LayerGraph" in res.output


def test_a_dynamic_shape_without_input_shape_names_the_fix(files, tmp_path):
    res = CliRunner().invoke(cli, ["run", files["dynamic"], "--costs", "xgb"])
    assert res.exit_code == 2
    assert "--input-shape" in res.output


def test_place_a_model_file_reports_status_and_backend_mix(files, tmp_path):
    out = tmp_path / "place.json"
    res = CliRunner().invoke(cli, ["place", files["pt2"], "--cluster", "4xV100-pcie", "--costs", "roofline",
                                   "--solver", "heft,ilp", "--time-limit", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"heft", "ilp"}
    for r in data["results"].values():
        assert r["solver_status"] in ("heuristic", "optimal", "time_limit", "node_limit", "feasible") and r["backend_mix"]
        assert r["makespan_s"] >= data["lower_bound_s"] * (1 - 1e-9)
    assert data["solver_status"] and data["backend_mix"]


def test_place_and_run_choose_the_same_plan(tmp_path, cache):
    """``place`` and ``run`` walk one flow (:func:`tvm_pesto.api.place`): with the same options
    they choose the same plan, unit for unit. ``run --refit`` goes first: it measures this
    machine's links and dispatch for cpu:2 and keeps them, and ``place`` plans with those kept figures
    (the suite keeps the flow's plan in ``run``: ``TVM_PESTO_MEASURE_FINAL=0``)."""
    # TVM's fusion groups only: a plan of many units on any machine (with every backend, one
    # whole-model library call may be the plan, which would compare one unit)
    opts = ["mlp_mixer", "--size", "small", "--cluster", "cpu:2", "--costs", "xgb", "--solver", "heft",
            "--deterministic", "--backends", "tvm"]
    bundle, b_json, a_json = tmp_path / "bundle", tmp_path / "b.json", tmp_path / "a.json"
    ran = CliRunner().invoke(cli, ["run", *opts, "--repeat", "3", "--refit", "--export", str(bundle),
                                   "--json", str(b_json)])
    assert ran.exit_code == 0, ran.output
    placed = CliRunner().invoke(cli, ["place", *opts, "--json", str(a_json)])
    assert placed.exit_code == 0, placed.output
    a, b = json.loads(a_json.read_text()), json.loads(b_json.read_text())
    plan = json.loads((bundle / "plan.json").read_text())  # the plan `run` built
    run_units = [{"backend": u["backend"], "nodes": u["nodes"], "device": d}
                 for u, d in zip(plan["units"], plan["assignment"].values())]
    key = lambda u: (u["nodes"], u["backend"])  # noqa: E731
    assert len(run_units) == b["num_units"] > 1
    assert sorted(a["units"], key=key) == sorted(run_units, key=key)
    assert a["results"]["heft"]["units"] == a["units"]
    for k in ("backend_mix", "devices_used", "solver_status", "split", "cost_source", "num_units"):
        assert a[k] == b[k], k
    assert a["simulated_s"] == pytest.approx(b["simulated_s"], rel=1e-9)
    # the figures `run` measured, kept and applied by `place`
    assert b["dispatch"]["measured"] and a["dispatch"]["source"] != "assumed"
    for k in ("run_s", "multi_device_s", "fitted_at"):
        assert a["dispatch"][k] == b["dispatch"][k], k


def test_python_dash_m_runs_the_command(tmp_path):
    # where the scripts folder is not on PATH, the module is the command
    out = subprocess.run([sys.executable, "-m", "tvm_pesto.cli", "run", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: tvm-pesto run")
