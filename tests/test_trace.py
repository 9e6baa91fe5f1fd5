"""The plan and the run as traces and a Gantt chart (:mod:`tvm_pesto.plan.trace`)."""
import json

import pytest

import tvm_pesto
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.plan.trace import sim_events, write_trace_dir


@pytest.fixture(scope="module")
def placed():
    mod, (x,) = tiny_mlp()
    pm = tvm_pesto.build(mod, "cpu:2", costs="roofline", backends="onnxruntime,tvm", measure_final=False)
    yield pm, x
    pm.close()


def test_simulated_units_name_their_backend(placed):
    pm, _ = placed
    pl = pm.placement
    rows = [r for r in sim_events(pl.problem, pl.plan, pl.sim) if r["kind"] == "compute"]
    assert len(rows) == pl.problem.num_nodes
    assert [r["backend"] for r in rows] == [u.backend for u in pl.plan.units]


def test_the_chart_is_written_with_the_median_run(placed, tmp_path):
    pm, x = placed
    pl = pm.placement
    _, trace = pm.run_traced(x)
    files = write_trace_dir(str(tmp_path), pl.problem, pl.plan, pl.sim, trace, ["cpu0", "cpu1"], "mlp",
                            measured_s=1.5e-4)
    assert files == ["gantt.png", "plan_trace.json", "run_trace.json"]
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads((tmp_path / "plan_trace.json").read_text())["traceEvents"]
    assert len(events) >= pl.problem.num_nodes
