"""``tvm-pesto run MODEL --report DIR`` end to end: a zoo model of more ops than the page opens
at once (its units drawn collapsed), TVM and PyTorch competing (a plan of both, of many units), the report beside the run's JSON
and drawn by headless Chromium (``tests/browser.py``: skipped, with the reason, where none can be
installed)."""
from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from report_page import read_page
from test_report import check_drawn
from tvm_pesto.cli.main import cli
from tvm_pesto.report.records import DecisionOption, GanttBar, NodeRecord, Report, UnitRecord

pytestmark = pytest.mark.slow  # builds and runs a whole model


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    res = CliRunner().invoke(cli, ["run", "mobilenet_v2", "--size", "small", "--cluster", "cpu:2", "--costs", "roofline",
                                   "--backends", "tvm,torch", "--repeat", "3", "--refit", "--report", str(d / "report"), "--json", str(d / "run.json")])
    assert res.exit_code == 0, res.output
    return json.loads((d / "run.json").read_text()), d / "report"


def _report(data: dict) -> Report:
    """The records again from report.json (to reuse the page checks)."""
    return Report(**{**data, "units": tuple(UnitRecord(**{**u, "nodes": tuple(u["nodes"])}) for u in data["units"]),
                     "nodes": tuple(NodeRecord(**n) for n in data["nodes"]),
                     "predicted": tuple(GanttBar(**{**b, "units": tuple(b["units"])}) for b in data["predicted"]),
                     "measured": tuple(GanttBar(**{**b, "units": tuple(b["units"])}) for b in data["measured"]),
                     "decision": tuple(DecisionOption(**o) for o in data["decision"])})


def test_run_writes_the_report_of_what_it_ran(ran):
    res, out = ran
    assert res["report"] == ["nodes.csv", "report.html", "report.json"]
    data = json.loads((out / "report.json").read_text())
    assert len(data["nodes"]) == res["num_ops"] > 60 and len(data["units"]) == res["num_units"]
    mix: dict[str, int] = {}
    for n in data["nodes"]:
        mix[n["backend"]] = mix.get(n["backend"], 0) + 1
    assert mix == res["backend_mix"]
    assert {n["device"] for n in data["nodes"]} == set(res["devices_used"])
    assert data["measured_run_s"] == res["measured_s"] and data["predicted_run_s"] == pytest.approx(res["simulated_s"])
    assert set(data["backends"]) == set(res["candidates_by_backend"]) == {"torch", "tvm"}
    assert len(data["units"]) > 1
    assert [o["name"] for o in data["decision"]] == [o["name"] for o in res["decision"]["options"]]
    with open(out / "nodes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["name"], r["backend"]) for r in rows] == [(n["name"], n["backend"]) for n in data["nodes"]]
    page = read_page((out / "report.html").read_text())
    assert page.data() == data and not page.external


def test_the_run_report_renders_in_chromium(ran, chromium, tmp_path):
    _, out = ran
    rep = _report(json.loads((out / "report.json").read_text()))
    check_drawn(read_page(chromium.dump_dom(out / "report.html")), rep)
    shot = chromium.screenshot(out / "report.html", tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
