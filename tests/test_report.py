"""The report of a built model (:mod:`tvm_pesto.report`): its records say where every node ran,
what each backend would have cost it and what each unit took, and the three files hold them
(``report.json`` against its schema, ``nodes.csv``, ``report.html`` with its tables filled, its
data embedded and nothing loaded from elsewhere). The page in a real browser:
``test_report_browser.py``."""
from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

import tvm_pesto
from report_page import read_page
from tvm_pesto.api import build_placement, place
from tvm_pesto.candidates.examples import tiny_cnn
from tvm_pesto.cli.main import cli
from tvm_pesto.jsonio import schema_problems
from tvm_pesto.plan import Plan, simulate
from tvm_pesto.report import ReportError, build_report, write_report
from tvm_pesto.report.page import page_style
from tvm_pesto.report.records import backend_costs
from tvm_pesto.report.write import CSV_COLUMNS


def _split(pl, unit: int):
    """``pl`` with ``unit`` moved to device 1 (the rest on device 0, in the same order)."""
    n = len(pl.plan.units)
    assignment = np.zeros(n, dtype=int)
    assignment[unit] = 1
    order = [[u for v in pl.plan.order for u in v if u != unit], [unit]]
    plan = Plan(assignment, order, solver="by hand", units=pl.plan.units)
    return dataclasses.replace(pl, plan=plan, sim=simulate(pl.problem, plan))


@pytest.fixture(scope="module")
def split_model():
    """tiny_cnn's TVM fusion groups on cpu:2, the unit holding its tanh alone on device 1, run once."""
    mod, (x,) = tiny_cnn()
    pl = place(mod, "cpu:2", backends="tvm", costs="roofline")
    unit = next(u for u, c in enumerate(pl.plan.units)
                if any(pl.analysis.op_graph.nodes[v].op == "relax.tanh" for v in c.nodes))
    placed = build_placement(_split(pl, unit), pl.problem.cluster)
    placed(x)
    _, trace = placed.run_traced(x)
    yield placed, trace, unit
    placed.close()


@pytest.fixture(scope="module")
def written(split_model, tmp_path_factory):
    placed, trace, _ = split_model
    rep = build_report(placed, trace, measured_s=1e-3, model="tiny_cnn")
    out = tmp_path_factory.mktemp("report")
    return rep, out, write_report(rep, str(out))


def test_every_node_is_in_one_unit_on_its_units_device(split_model):
    placed, trace, unit = split_model
    rep = build_report(placed, trace)
    og = placed.placement.analysis.op_graph
    assert [n.id for n in rep.nodes] == list(range(og.num_nodes))
    assert sorted(v for u in rep.units for v in u.nodes) == list(range(og.num_nodes))
    for n in rep.nodes:
        u = rep.units[n.unit]
        assert n.id in u.nodes and (n.backend, n.device) == (u.backend, u.device)
        assert n.op == og.nodes[n.id].op
    assert [u.device for u in rep.units].count(1) == 1 and rep.units[unit].device == 1
    assert rep.devices == ("cpu0", "cpu1") and rep.backends == ("tvm",)


def test_units_are_timed_by_their_segments(split_model):
    placed, trace, unit = split_model
    rep = build_report(placed, trace)
    ran = {e.name: e.end - e.start for e in trace if e.kind == "compute"}
    assert {u.segment for u in rep.units} == set(ran) == set(placed.unit_segments())
    assert rep.units[unit].segment.startswith("dev1_") and not rep.units[unit].measured_split
    assert rep.units[unit].measured_s == pytest.approx(ran[rep.units[unit].segment])
    for seg in ran:  # a segment's units share its measured time in proportion to their predictions
        mates = [u for u in rep.units if u.segment == seg]
        assert sum(u.measured_s for u in mates) == pytest.approx(ran[seg])
        assert all(u.measured_split == (len(mates) > 1) for u in mates)
    for u in rep.units:
        assert u.predicted_s == pytest.approx(placed.placement.sim.finish[u.id] - placed.placement.sim.start[u.id])


def test_the_gantt_charts_hold_every_unit_and_the_copies(split_model):
    placed, trace, _ = split_model
    rep = build_report(placed, trace)
    compute = [b for b in rep.predicted if b.kind == "compute"]
    assert sorted(u for b in compute for u in b.units) == [u.id for u in rep.units]
    assert {u for b in rep.measured if b.kind == "compute" for u in b.units} == {u.id for u in rep.units}
    assert any(b.kind == "transfer" for b in rep.predicted)  # device 1's input and result cross a link
    assert any(b.kind == "copy" for b in rep.measured)
    assert {b.lane for b in rep.measured} <= set(rep.devices)


def test_each_backend_is_priced_by_its_smallest_candidate_holding_the_node():
    from tvm_pesto.candidates.generate import Candidate

    cands = [Candidate("tvm", (0, 1)), Candidate("tvm", (1,)), Candidate("ort", (0, 1, 2)), Candidate("ort", (0, 1)),
             Candidate("ort", (0,)), Candidate("torch", (2,))]
    table = np.array([[3.0, 3.0], [1.0, 9.0], [0.5, 0.5], [2.0, 2.0], [np.inf, 4.0], [1.0, np.inf]])
    got = backend_costs(cands, table, {0: 0, 1: 1, 2: 1})
    assert got[0] == {"tvm": (3.0, 2), "ort": (2.0, 2)}  # ort's one-op candidate cannot run on device 0
    assert got[1] == {"tvm": (9.0, 1), "ort": (2.0, 2)}
    assert got[2] == {"ort": (0.5, 3)}  # torch's candidate cannot run on device 1


def test_the_nodes_costs_come_from_the_candidates(split_model):
    placed, trace, _ = split_model
    rep = build_report(placed, trace)
    pl = placed.placement
    cands = list(pl.candidates)
    for n in rep.nodes:
        holding = [(len(c.nodes), pl.costs.table[k, n.device]) for k, c in enumerate(cands)
                   if c.backend == "tvm" and n.id in c.nodes]
        size, cost = min(holding)
        assert n.costs["tvm"] == pytest.approx(cost) and n.cost_ops["tvm"] == size


def test_a_model_built_from_a_given_plan_has_no_report():
    mod, (x,) = tiny_cnn()
    pl = place(mod, "cpu:2", backends="tvm", costs="roofline")
    placed = tvm_pesto.build(mod, "cpu:2", plan=pl.plan)
    with pytest.raises(ReportError, match="holds no placement.*tvm_pesto.build"):
        build_report(placed)
    placed.close()


def test_report_json_follows_its_schema_and_holds_the_records(written):
    rep, out, files = written
    assert files == ["nodes.csv", "report.html", "report.json"]
    data = json.loads((out / "report.json").read_text())
    assert schema_problems("report", data) == []
    assert len(data["nodes"]) == len(rep.nodes) and len(data["units"]) == len(rep.units)
    assert data["measured_run_s"] == 1e-3 and data["model"] == "tiny_cnn"
    broken = {**data, "units": [{**data["units"][0], "device": "cpu0"}]}
    assert any("device" in p for p in schema_problems("report", broken))


def test_nodes_csv_has_a_row_per_node_and_a_cost_column_per_backend(written):
    rep, out, _ = written
    with open(out / "nodes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [*CSV_COLUMNS, *(f"cost_{b}_s" for b in rep.backends), "pinned"]
    assert [int(r["node"]) for r in rows] == [n.id for n in rep.nodes]
    for r, n in zip(rows, rep.nodes):
        assert (r["backend"], r["device"], int(r["unit"])) == (n.backend, rep.devices[n.device], n.unit)
        assert float(r["cost_tvm_s"]) == pytest.approx(n.costs["tvm"])
        assert float(r["measured_end_s"]) > float(r["measured_start_s"]) >= 0
        assert r["pinned"] == (n.pinned or "")


def test_the_page_holds_its_tables_and_data_and_loads_nothing(written):
    rep, out, _ = written
    page = read_page((out / "report.html").read_text())
    assert page.data() == json.loads((out / "report.json").read_text())
    assert page.data("report-style") == page_style(rep)
    assert not page.external
    assert [int(r[0]) for r in page.rows["unit-table"]] == [u.id for u in rep.units]
    assert [int(r[0]) for r in page.rows["node-table"]] == [n.id for n in rep.nodes]
    for r, n in zip(page.rows["node-table"], rep.nodes):
        assert r[1] == n.name and r[4] == n.backend and all(c for c in r)
    assert rep.decision == () and "decision-table" not in page.rows  # built without a final choice
    assert page.rendered is None  # the script marks the page drawn: only a browser runs it


def test_the_final_choice_is_reported_with_the_option_kept(tmp_path):
    mod, (x,) = tiny_cnn()
    placed = tvm_pesto.build(mod, "cpu:2", costs="roofline", measure_final=False)
    files = placed.report(str(tmp_path), inputs=[x])
    rep = build_report(placed, placed.last_trace)
    placed.close()
    assert [(o.name, o.kept, o.measured_s) for o in rep.decision] == [("plan", True, None)]
    assert rep.decision[0].backend_mix == placed.placement.backend_mix
    assert rep.decision_note.startswith("not measured: ") and rep.measured_run_s is None
    page = read_page((tmp_path / "report.html").read_text())
    assert files == ["nodes.csv", "report.html", "report.json"]
    assert page.rows["decision-table"][0][:2] == ["plan (kept)", "cpu:2"]


def check_drawn(page, rep) -> None:
    """What a browser drew of ``rep``'s page: every unit once in the graph (its ops too when
    the page opened it), a bar per unit in the simulated chart, every unit in the measured
    one, and the tables filled."""
    assert page.rendered == "ok", page.rendered
    assert sorted(page.graph_units) == [u.id for u in rep.units]
    shown = rep.units if len(rep.nodes) <= 60 else ()  # small models open with every unit's ops shown
    assert sorted(page.graph_ops) == sorted(v for u in shown if len(u.nodes) > 1 for v in u.nodes)
    assert sorted(page.predicted_bars) == [u.id for u in rep.units]
    if rep.measured:
        assert page.measured_units == {u.id for u in rep.units}
    assert len(page.rows["unit-table"]) == len(rep.units) and len(page.rows["node-table"]) == len(rep.nodes)
    assert all(all(c for c in row) for row in page.rows["node-table"])
    # hover: each unit says its times, each op shown what every backend would have cost it
    assert sorted(k for kind, k in page.titles if kind == "unit") == [u.id for u in rep.units]
    for (kind, k), text in page.titles.items():
        if kind == "op":
            n = rep.nodes[k]
            assert text.startswith(n.name) and all(f"{b} " in text.split("each backend: ")[1] for b in rep.backends)


@pytest.mark.slow  # starts Chromium
def test_the_page_draws_every_unit_in_chromium(written, chromium, tmp_path):
    rep, out, _ = written
    check_drawn(read_page(chromium.dump_dom(out / "report.html")), rep)
    shot = chromium.screenshot(out / "report.html", tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


@pytest.mark.slow  # starts Chromium
def test_the_address_opens_the_page_filtered_and_expanded(written, chromium):
    rep, out, _ = written
    q = rep.nodes[-1].op.removeprefix("relax.")
    page = read_page(chromium.dump_dom(out / "report.html", f"q={q}&expand=all"))
    assert page.rendered == "ok"
    assert sorted(page.graph_ops) == sorted(v for u in rep.units if len(u.nodes) > 1 for v in u.nodes)
    shown = [int(r[0]) for r in page.rows["node-table"] if q in " ".join(r).lower()]
    assert 0 < len(shown) < len(rep.nodes)
    assert sorted(page.hidden_nodes) == sorted(set(range(len(rep.nodes))) - set(shown))
    page = read_page(chromium.dump_dom(out / "report.html", "expand=none"))
    assert page.graph_ops == [] and sorted(page.graph_units) == [u.id for u in rep.units]


def test_place_reports_its_best_plan_predicted_only(tmp_path):
    res = CliRunner().invoke(cli, ["place", "mlp_mixer", "--cluster", "2xV100-nvlink", "--costs", "roofline",
                                   "--solver", "heft", "--report", str(tmp_path / "r"), "--json", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "p.json").read_text())
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert out["report"] == ["nodes.csv", "report.html", "report.json"]
    assert [(u["backend"], u["nodes"], u["device"]) for u in data["units"]] == \
        [(u["backend"], u["nodes"], u["device"]) for u in out["units"]]
    assert data["measured"] == [] and data["decision"] == [] and data["measured_run_s"] is None
    assert all(u["measured_s"] is None for u in data["units"])
    assert data["predicted_run_s"] == pytest.approx(out["simulated_s"])
    page = read_page((tmp_path / "r" / "report.html").read_text())
    assert page.data() == data and len(page.rows["node-table"]) == out["num_ops"]


def test_place_refuses_a_report_of_a_layer_graph(tmp_path):
    from tvm_pesto.package_data import data_dirs

    graph = next(p for d in data_dirs("benchmarks") for p in
                 sorted(d.glob("dnn-partitioning/throughput-inputs/LayerGraphs/*.json")))
    res = CliRunner().invoke(cli, ["place", str(graph), "--cluster", "from-graph", "--solver", "heft",
                                   "--report", str(tmp_path / "r")])
    assert res.exit_code != 0 and "--report shows where a model's ops run" in res.output
    assert not (tmp_path / "r").exists()


def test_without_chromium_the_browser_tests_say_why(tmp_path, monkeypatch):
    import browser

    monkeypatch.setattr(browser, "PRIVATE", tmp_path / ".browser")
    monkeypatch.setenv("PATH", str(tmp_path))  # no Chromium, no apt-get
    monkeypatch.delenv("TVM_PESTO_CHROMIUM", raising=False)
    with pytest.raises(browser.BrowserUnavailable, match=r"none on the PATH \(chromium-headless-shell.*no apt-get"):
        browser.find_or_install()


def test_a_pinned_node_says_which_pin_put_it_there(tmp_path):
    mod, (x,) = tiny_cnn()
    placed = tvm_pesto.build(mod, "cpu:2", costs="roofline", measure_final=False,
                             constraints={"pin": ["conv2d=tvm"]})
    rep = build_report(placed)
    convs = [n for n in rep.nodes if n.op == "relax.nn.conv2d"]
    assert convs and all(n.backend == "tvm" and n.pinned == "relax.nn.conv2d matches --pin conv2d=tvm"
                         for n in convs)
    assert all(n.pinned is None for n in rep.nodes if n.op != "relax.nn.conv2d")
    write_report(rep, str(tmp_path))
    assert "conv2d=tvm" in (tmp_path / "nodes.csv").read_text()
