// Draws the report's graph (laid out by dagre) and Gantt charts from the embedded data;
// the tables are in the page already. Sets body[data-rendered] when done.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const style = JSON.parse(document.getElementById("report-style").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  const unitOf = new Map(data.nodes.map((n) => [n.id, n.unit]));
  // small models start with every unit's ops shown; large ones with the units collapsed
  const EXPAND_UP_TO = 60;
  const expanded = new Set(data.nodes.length <= EXPAND_UP_TO ?
    data.units.filter((u) => u.nodes.length > 1).map((u) => u.id) : []);
  const tip = document.getElementById("tooltip");

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function ms(s) { return s === null || s === undefined ? "\u2014" : String(Number((s * 1e3).toPrecision(4))); }
  function fill(backend) { return style.backends[backend] || "#ccc"; }
  function outline(e, device) {
    const d = style.devices[device] || { colour: "#000", dash: "" };
    e.setAttribute("stroke", d.colour);
    e.setAttribute("stroke-width", "2");
    if (d.dash) e.setAttribute("stroke-dasharray", d.dash);
  }
  function esc(s) { return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]); }
  function short(op) { return op.replace(/^relax\./, "").replace(/^nn\./, ""); }

  function nodeTip(n) {
    const rows = data.backends.map((b) => {
      const c = n.costs[b];
      const ops = n.cost_ops[b] && n.cost_ops[b] > 1 ? ` (${n.cost_ops[b]} ops)` : "";
      return `<tr><td>${b === n.backend ? "<b>" + esc(b) + "</b>" : esc(b)}</td><td>${ms(c)} ms${ops}</td></tr>`;
    });
    return `<b>${esc(n.name)}</b> (${esc(n.op)})<br>unit ${n.unit} on ${esc(n.backend)}, ` +
      `${esc(data.devices[n.device])}<br>what each backend would cost it:<table>${rows.join("")}</table>`;
  }
  function nodeTitle(n) {
    const costs = data.backends.map((b) => `${b} ${ms(n.costs[b])} ms` +
      (n.cost_ops[b] > 1 ? ` (${n.cost_ops[b]} ops)` : "")).join("; ");
    return `${n.name} (${n.op}) on ${n.backend}, ${data.devices[n.device]}; each backend: ${costs}`;
  }
  function unitTip(u) {
    return `<b>unit ${u.id}</b>: ${esc(u.backend)} on ${esc(data.devices[u.device])}, ${u.nodes.length} ops<br>` +
      `predicted ${ms(u.predicted_end_s - u.predicted_start_s)} ms, measured ${ms(u.measured_s)} ms` +
      (u.measured_split ? " (share of its segment)" : "") + `<br>segment ${esc(u.segment || "\u2014")}` +
      (u.nodes.length === 1 ? "<br>" + nodeTip(data.nodes[u.nodes[0]]) : "<br>click to show its ops");
  }
  function hover(e, html) {
    e.addEventListener("mousemove", (ev) => {
      tip.innerHTML = html();
      tip.hidden = false;
      tip.style.left = ev.clientX + 14 + "px";
      tip.style.top = ev.clientY + 10 + "px";
    });
    e.addEventListener("mouseleave", () => { tip.hidden = true; });
  }

  function unitLabel(u) {
    return `${u.backend} \u00b7 ${u.nodes.length === 1 ? short(data.nodes[u.nodes[0]].op) : u.nodes.length + " ops"}`;
  }

  function layout() {
    const g = new dagre.graphlib.Graph({ compound: true, multigraph: false });
    g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 30, marginx: 8, marginy: 24 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const u of data.units) {
      if (expanded.has(u.id)) {
        g.setNode("u" + u.id, {});
        for (const v of u.nodes) {
          g.setNode("n" + v, { width: Math.max(60, 7 * short(data.nodes[v].op).length), height: 24 });
          g.setParent("n" + v, "u" + u.id);
        }
      } else {
        g.setNode("u" + u.id, { width: Math.max(120, 7 * unitLabel(u).length + 16), height: 34 });
      }
    }
    const key = (v) => (expanded.has(unitOf.get(v)) ? "n" + v : "u" + unitOf.get(v));
    for (const [a, b] of data.node_edges) {
      const ka = key(a), kb = key(b);
      if (ka !== kb && !g.hasEdge(ka, kb)) g.setEdge(ka, kb);
    }
    dagre.layout(g);
    return g;
  }

  function drawGraph() {
    const box = document.getElementById("graph");
    box.textContent = "";
    const g = layout();
    const gg = g.graph();
    const svg = el("svg", { width: gg.width + 16, height: gg.height + 16, id: "graph-svg" }, box);
    const edges = el("g", { class: "edges" }, svg);
    for (const e of g.edges()) {
      const pts = g.edge(e).points;
      el("path", { class: "edge", d: "M" + pts.map((p) => p.x + "," + p.y).join("L"), "marker-end": "" }, edges);
    }
    for (const u of data.units) {
      const n = g.node("u" + u.id);
      const grp = el("g", { class: "unit" + (expanded.has(u.id) ? " expanded" : ""), "data-unit": u.id }, svg);
      const top = expanded.has(u.id) ? 16 : 0;  // an open unit's title sits above its ops
      const r = el("rect", { x: n.x - n.width / 2, y: n.y - n.height / 2 - top, width: n.width, height: n.height + top, rx: 4,
                             fill: fill(u.backend), "fill-opacity": expanded.has(u.id) ? 0.15 : 0.85 }, grp);
      outline(r, u.device);
      const label = expanded.has(u.id) ? `unit ${u.id}: ${u.backend}` : unitLabel(u);
      const t = el("text", { x: n.x, y: expanded.has(u.id) ? n.y - n.height / 2 - 4 : n.y + 4,
                             "text-anchor": "middle" }, grp);
      t.textContent = label;
      el("title", {}, grp).textContent = `unit ${u.id} (${u.backend}, ${data.devices[u.device]}): predicted ` +
        `${ms(u.predicted_end_s - u.predicted_start_s)} ms, measured ${ms(u.measured_s)} ms` +
        (u.nodes.length === 1 ? "; " + nodeTitle(data.nodes[u.nodes[0]]) : "");
      hover(grp, () => unitTip(u));
      grp.addEventListener("click", () => {
        if (u.nodes.length > 1 || expanded.has(u.id)) {
          expanded.has(u.id) ? expanded.delete(u.id) : expanded.add(u.id);
          drawGraph();
        }
      });
      if (!expanded.has(u.id)) continue;
      for (const v of u.nodes) {
        const m = g.node("n" + v), node = data.nodes[v];
        const og = el("g", { class: "op", "data-node": v }, svg);
        const rr = el("rect", { x: m.x - m.width / 2, y: m.y - m.height / 2, width: m.width, height: m.height,
                                rx: 3, fill: fill(node.backend) }, og);
        outline(rr, node.device);
        const tt = el("text", { x: m.x, y: m.y + 4, "text-anchor": "middle" }, og);
        tt.textContent = short(node.op);
        el("title", {}, og).textContent = nodeTitle(node);
        hover(og, () => nodeTip(node));
      }
    }
  }

  function drawGantt(id, bars, perUnit) {
    const box = document.getElementById(id);
    if (!bars.length) {
      box.textContent = "no traced run: tvm-pesto place builds nothing (run --report, or placed.report(dir, inputs=...), " +
        "times one)";
      return;
    }
    const lanes = [];
    for (const b of bars) if (!lanes.includes(b.lane)) lanes.push(b.lane);
    lanes.sort((a, b) => (a.startsWith("link") - b.startsWith("link")) || a.localeCompare(b));
    const end = Math.max(...bars.map((b) => b.end_s)) || 1e-9;
    const W = 1000, L = 90, H = 26;
    const svg = el("svg", { width: W + L + 20, height: lanes.length * H + 30 }, box);
    const x = (s) => L + (s / end) * W;
    lanes.forEach((ln, k) => { el("text", { x: 4, y: k * H + 17 }, svg).textContent = ln; });
    for (const b of bars) {
      const attrs = { class: "bar " + b.kind, x: x(b.start_s), y: lanes.indexOf(b.lane) * H + 3,
                      width: Math.max(1, x(b.end_s) - x(b.start_s)), height: H - 6,
                      fill: b.kind === "compute" ? (b.backend ? fill(b.backend) : "#bbb") : "#999", stroke: "#333",
                      "stroke-width": 0.5, "data-units": b.units.join(" ") };
      if (perUnit && b.units.length === 1) attrs["data-unit"] = b.units[0];
      const r = el("rect", attrs, svg);
      const what = b.units.length ? `units ${b.units.join(", ")}` : b.kind;
      el("title", {}, r).textContent = `${b.name}: ${what}, ${ms(b.start_s)}\u2013${ms(b.end_s)} ms`;
    }
    const axis = el("text", { x: L, y: lanes.length * H + 20 }, svg);
    axis.textContent = `0 \u2013 ${ms(end)} ms`;
  }

  function search() {
    const q = document.getElementById("search").value.trim().toLowerCase();
    let shown = 0;
    for (const tr of document.querySelectorAll("#node-table tbody tr")) {
      const hit = !q || tr.textContent.toLowerCase().includes(q);
      tr.classList.toggle("hidden", !hit);
      shown += hit;
    }
    document.getElementById("search-count").textContent = `${shown} of ${data.nodes.length} nodes`;
  }

  // the address's fragment opens the page filtered and/or with every unit open: #q=conv2d&expand=all
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("expand") === "all") data.units.forEach((u) => u.nodes.length > 1 && expanded.add(u.id));
  if (params.get("expand") === "none") expanded.clear();
  if (params.get("q")) document.getElementById("search").value = params.get("q");

  try {
    drawGraph();
    drawGantt("gantt-predicted", data.predicted, true);
    drawGantt("gantt-measured", data.measured, false);
    document.getElementById("search").addEventListener("input", search);
    document.getElementById("expand-all").addEventListener("click", () => {
      data.units.forEach((u) => u.nodes.length > 1 && expanded.add(u.id)); drawGraph();
    });
    document.getElementById("collapse-all").addEventListener("click", () => { expanded.clear(); drawGraph(); });
    search();
    document.body.setAttribute("data-rendered", "ok");
  } catch (err) {
    document.body.setAttribute("data-rendered", "error: " + err.message);
    throw err;
  }
})();
