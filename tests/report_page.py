"""What a report page holds, read with the standard library's HTML parser: from the file as
written (the tables and the embedded data) or from the DOM a browser printed after the page's
script ran (the graph and the Gantt charts too)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
CONTAINERS = ("graph", "gantt-predicted", "gantt-measured", "decision-table", "unit-table", "node-table")


@dataclass
class Page:
    rendered: str | None = None
    graph_units: list[int] = field(default_factory=list)  # a g.unit per unit drawn
    graph_ops: list[int] = field(default_factory=list)  # a g.op per op of an open unit
    predicted_bars: list[int] = field(default_factory=list)  # the simulated chart's unit bars
    measured_units: set[int] = field(default_factory=set)  # units the measured chart's compute bars run
    rows: dict[str, list[list[str]]] = field(default_factory=dict)  # table id -> its body's cells
    scripts: dict[str, str] = field(default_factory=dict)  # id -> text of a JSON script
    external: list[str] = field(default_factory=list)  # src/href that would load something
    titles: dict[tuple[str, int], str] = field(default_factory=dict)  # ("unit"|"op", id) -> its hover text
    hidden_nodes: list[int] = field(default_factory=list)  # node-table rows the search hides

    def data(self, ident: str = "report-data"):
        return json.loads(self.scripts[ident])


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.page, self.stack = Page(), []  # stack: (tag, id, classes, attributes)
        self.cell: list[str] | None = None
        self.script: str | None = None
        self.title: tuple[str, int] | None = None

    def _inside(self, ident: str) -> bool:
        return any(i == ident for _, i, _, _ in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("#"):
                self.page.external.append(a[key])
        if tag == "body":
            self.page.rendered = a.get("data-rendered")
        if tag == "g" and self._inside("graph"):
            if "unit" in classes:
                self.page.graph_units.append(int(a["data-unit"]))
            if "op" in classes:
                self.page.graph_ops.append(int(a["data-node"]))
        if tag == "rect" and "bar" in classes:
            if self._inside("gantt-predicted") and a.get("data-unit") is not None:
                self.page.predicted_bars.append(int(a["data-unit"]))
            if self._inside("gantt-measured") and "compute" in classes:
                self.page.measured_units.update(int(u) for u in (a.get("data-units") or "").split())
        if tag == "tr" and any(t == "tbody" for t, _, _, _ in self.stack):
            table = next(i for t, i, _, _ in reversed(self.stack) if t == "table")
            self.page.rows.setdefault(table, []).append([])
            if table == "node-table" and "hidden" in classes:
                self.page.hidden_nodes.append(int(a["data-node"]))
        if tag == "title" and self.stack and self.stack[-1][0] == "g":
            _, _, owner, oa = self.stack[-1]
            if "unit" in owner:
                self.title = ("unit", int(oa["data-unit"]))
            elif "op" in owner:
                self.title = ("op", int(oa["data-node"]))
        if tag == "td":
            self.cell = []
        if tag == "script" and a.get("type") == "application/json":
            self.script = a["id"]
        if tag not in VOID:
            self.stack.append((tag, a.get("id"), classes, a))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag == "script":
            self.script = None
        if tag == "title":
            self.title = None
        if tag == "td" and self.cell is not None:
            table = next(i for t, i, _, _ in reversed(self.stack) if t == "table")
            self.page.rows[table][-1].append("".join(self.cell).strip())
            self.cell = None
        while self.stack:  # close up to the matching tag (HTML lets some end tags be left out)
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)
        if self.script is not None:
            self.page.scripts[self.script] = self.page.scripts.get(self.script, "") + data
        if self.title is not None:
            self.page.titles[self.title] = self.page.titles.get(self.title, "") + data


def read_page(text: str) -> Page:
    r = _Reader()
    r.feed(text)
    r.close()
    return r.page
