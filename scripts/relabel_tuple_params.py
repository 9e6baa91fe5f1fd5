"""Relabel the bundled profile records of TVM fusion groups that were timed with a tuple
parameter (or a tuple result) by the measuring harness before 2026-12-02 17:30.

Until then a fused group was cut out for timing with ``cut_function``'s semantics: a tuple
computed outside the group (a ``split``'s parts, a ``batch_norm``'s result) became one
*tuple* parameter, and a group ending in a tuple returned all of it. In the model the group
reads the one tensor it uses. The VM checks every field of a tuple parameter on entry
(``check_tuple_info``, then ``check_tensor_info`` and ``match_shape`` per field), which a
view after ``split`` pays three times: gpt2's views timed 2.3 us that way and 0.6 us as they
run in the model (net of the call; Zen 1, one core). The harness now cuts a group as
:func:`tvm_pesto.candidates.candidate_function` does (tensor parameters only); this script
moves the old records to the new harness without measuring their kernels again:

* for every affected ``tvm`` record (its ``nodes`` cut both ways give different functions)
  the script compiles both cuts of the unit (weights bound, as the harness times them) and
  times them alternately on this machine's device of the record's size: ``delta`` = old -
  new, the median over ``--rounds`` pairs of >= 2 ms timings. It is 1.3-1.5 us per tuple
  parameter of three fields and about 2 us for a ``batch_norm`` whose mean and variance the
  old cut returned (and so computed), on a Zen 1 core; a few new cuts take longer (a
  ``split`` whose parts the new cut returns as a fresh tuple: -0.3 us), and those records
  move up;
* the record's times (``median_s``, ``repeats``, ``runs``) drop by ``delta`` x ``scale``,
  ``scale`` = the record's CPU kind's VM call overhead over this machine's (both from the
  records' and this run's ``__vm_call_overhead__``: entry checks are VM instructions, which
  run at the speed of a VM call), never below the overhead of the call itself; its ``key``
  becomes the new harness's key, and ``relabel`` keeps the old key, ``delta_s`` and
  ``scale``.

Usage::

    python scripts/relabel_tuple_params.py cost_models/profile-cpu.jsonl.gz -o relabeled.jsonl.gz --json relabel.json

The log is read and written gzip-compressed when its name ends in ``.gz``
(:func:`tvm_pesto.costs.jsonl.open_log`).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import time

import numpy as np


def _old_cut(rg, nodes, lift_constants: bool = False):
    """The function a group was timed as before: tuples read from outside as tuple parameters."""
    from tvm_pesto.builder.subgraph import cut_function

    members = set(int(i) for i in nodes)
    g = rg.graph
    outs = [rg.bindings[rg.node_binding[v]].var for v in sorted(members)
            if any(s not in members for s in g.dag.successors(v)) or g.dag.out_degree(v) == 0]
    if not outs:
        outs = [rg.bindings[rg.node_binding[max(members)]].var]
    return cut_function(rg, [rg.node_binding[v] for v in sorted(members)], outs, lift_constants).func


def module_of(name: str):
    from tvm_pesto import zoo
    from tvm_pesto.costs.sweep import sweep_module
    from tvm_pesto.zoo import outside

    if name.startswith("sweep-"):
        return sweep_module(name[len("sweep-"):])
    if name in outside.MODELS:
        return outside.relax_module(name, "small")
    return zoo.load(name, "small").mod


def time_deltas(pairs: dict, device, rounds: int) -> dict:
    """``unit -> seconds`` the old cut takes over the new one on ``device``: the median over
    ``rounds`` alternating timings of >= 2 ms each."""
    import threading

    import tvm
    from tvm import relax

    from tvm_pesto.cluster.device_thread import enter_device_thread
    from tvm_pesto.costs.timing import random_args

    funcs = {}
    for n, (old, new) in enumerate(pairs.values()):
        funcs[f"o{n}"] = old.with_attr("global_symbol", f"o{n}")
        funcs[f"n{n}"] = new.with_attr("global_symbol", f"n{n}")
    out: dict = {}

    def work():
        enter_device_thread(device)
        target = tvm.target.Target(device.target)
        ex = tvm.compile(tvm.IRModule(funcs), target=target, relax_pipeline=relax.get_default_pipeline(target))
        dev = device.tvm_device()
        vm = relax.VirtualMachine(ex, dev)
        rng = np.random.default_rng(0)
        args = {f: random_args(funcs[f].params, dev, rng) for f in funcs}

        def t(f, number):
            return float(vm.time_evaluator(f, dev, number=number, repeat=1)(*args[f]).mean)

        for f in funcs:
            vm[f](*args[f])
        for n, unit in enumerate(pairs):
            number = max(2, int(2e-3 / t(f"n{n}", 20)))
            out[unit] = float(np.median([t(f"o{n}", number) - t(f"n{n}", number) for _ in range(rounds)]))

    th = threading.Thread(target=work)
    th.start()
    th.join()
    if len(out) < len(pairs):
        raise SystemExit(f"timing on {device.name} failed (see the thread's traceback above)")
    return out


def call_overhead(device) -> float:
    """The VM call overhead on ``device``, measured as the profiler measures it."""
    import tempfile
    from pathlib import Path

    from tvm_pesto.costs.cache import MeasureCache
    from tvm_pesto.costs.timing import call_overhead_s, measure_groups

    cache = MeasureCache(Path(tempfile.mkdtemp()) / "m.jsonl")
    measure_groups(None, [], device, cache, repeat=7)
    return call_overhead_s(device, cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()

    from tvm_pesto.api import analyze
    from tvm_pesto.builder.subgraph import structural_key
    from tvm_pesto.candidates import candidate_function
    from tvm_pesto.cluster import parse_cluster
    from tvm_pesto.costs.features import device_key, device_size_key
    from tvm_pesto.costs.jsonl import open_log

    t0 = time.time()
    with open_log(args.log) as f:
        recs = [json.loads(line) for line in f]
    overheads = {device_key(r["device_desc"]): r["median_s"] for r in recs
                 if r.get("key") == "__vm_call_overhead__" and r.get("device_desc")}
    by_model = collections.defaultdict(list)
    for i, r in enumerate(recs):
        if r.get("backend") == "tvm" and r.get("nodes") is not None:
            by_model[r["model"]].append(i)
    devices = {device_size_key({"kind": "cpu", "model": "host-cpu", "cores": d.cores}): d
               for d in (parse_cluster("cpu:2").devices[0], parse_cluster("cpu:1").devices[0])}
    # unit = (model, nodes) -> (old func, new func, new key); records per unit
    pairs, newkey, unit_recs = {}, {}, collections.defaultdict(list)
    for model, idx in by_model.items():
        a = analyze(module_of(model))
        for i in idx:
            nodes = tuple(recs[i]["nodes"])
            unit = (model, nodes)
            if unit not in pairs and unit not in newkey:
                old = _old_cut(a.rg, nodes)
                new = candidate_function(a.rg, list(nodes), lift_constants=False).func
                k_old = structural_key(_old_cut(a.rg, nodes, lift_constants=True))
                k_new = structural_key(candidate_function(a.rg, list(nodes), lift_constants=True).func)
                if k_old == k_new:
                    newkey[unit] = None
                    continue
                if k_old != recs[i]["key"]:
                    raise SystemExit(f"{model} {nodes}: the old cut's key {k_old} is not the record's {recs[i]['key']}")
                pairs[unit], newkey[unit] = (old, new), k_new
            if newkey[unit] is not None:
                unit_recs[unit].append(i)
    print(f"{len(pairs)} units to relabel, {sum(map(len, unit_recs.values()))} records ({time.time() - t0:.1f} s)")
    deltas, here = {}, {}
    for size, dev in devices.items():
        d, ov = time_deltas(pairs, dev, args.rounds), call_overhead(dev)
        deltas[size], here[size] = d, ov
        print(f"{size}: overhead {ov * 1e6:.3f} us, delta median {np.median(list(d.values())) * 1e6:.3f} us "
              f"[{min(d.values()) * 1e6:.3f}, {max(d.values()) * 1e6:.3f}]")
    report = collections.Counter()
    for unit, idx in unit_recs.items():
        for i in idx:
            r = recs[i]
            dk, size = device_key(r["device_desc"]), device_size_key(r["device_desc"])
            scale = overheads[dk] / here[size]
            shift = deltas[size][unit] * scale  # signed: a few new cuts return a fresh tuple and take longer
            floor = overheads[dk]
            r["relabel"] = {"old_key": r["key"], "delta_s": deltas[size][unit], "scale": scale,
                            "why": "timed with a tuple parameter or result before 2026-12-02 "
                                   "(scripts/relabel_tuple_params.py)"}
            r["key"] = newkey[unit]
            r["median_s"] = max(r["median_s"] - shift, floor)
            for f in ("repeats", "runs"):
                if isinstance(r.get(f), list):
                    r[f] = [max(x - shift, floor) for x in r[f]]
            report[dk] += 1
    with open_log(args.out, "w") as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    summary = {"units": len(pairs), "records": dict(report), "overhead_here_s": here,
               "overhead_of_kind_s": overheads, "load": os.getloadavg(), "seconds": time.time() - t0,
               "delta_s": {size: {f"{m}:{','.join(map(str, n))}": v for (m, n), v in d.items()}
                           for size, d in deltas.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "delta_s"}, indent=1))


if __name__ == "__main__":
    main()
