#!/usr/bin/env python
"""What ``tvm-pesto cost-model eval --train-size small --eval-size full`` misses, group by group.

Trains the bundled model's recipe on the rows of size small (sweeps and tuning databases
count as small) and predicts the TVM fusion groups of size full, as the evaluation does;
prints, per CPU kind, the groups' scores and the median predicted/measured ratio per dominant
op kind, then the groups farthest off with what the roofline and the miss term give them.

    python lab/scripts/small_to_full_groups.py [--logs cost_models/profile-cpu.jsonl.gz]
        [--kind GenuineIntel/6/167] [--rounds 1000] [--worst 25]
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from tvm_pesto.costs.predict.features import dominant_kind
from tvm_pesto.costs.predict.roofline import miss_s, work_s
from tvm_pesto.costs.predict.xgb import load_model
from tvm_pesto_lab.dataset import load_dataset, model_size
from tvm_pesto_lab.evaluate import model_logs, relabel
from tvm_pesto_lab.generalization import Recipe, _without, fusion_groups, score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", action="append", help="profiler logs [default: the model's own]")
    ap.add_argument("--tuning-db", default=None, help="MetaSchedule work directory [default: the model's own]")
    ap.add_argument("--kind", default=None, help="score only this CPU kind's rows (vendor/family/model)")
    ap.add_argument("--rounds", type=int, default=None, help="boosting rounds [default: the model's]")
    ap.add_argument("--worst", type=int, default=25, help="groups to list")
    a = ap.parse_args()
    model = load_model()
    logs, tuning_dbs = model_logs(model, a.logs or (), [a.tuning_db] if a.tuning_db else ())
    ds = load_dataset(logs, tuning_dbs)
    rows = relabel(ds.rows, "min")
    recipe = Recipe(target=model.target, rounds=a.rounds or int(model.meta.get("rounds", 300)),
                    params=model.meta.get("params"), overheads=ds.overheads, work_floor_s=model.work_floor_s)
    full = [r for r in rows if model_size(r["model"]) == "full"]
    train = [r for r in _without(rows, full) if model_size(r["model"]) == "small"]
    test = [r for r in full if a.kind is None or r["device"].get("cpu_kind") == a.kind]
    pred = recipe.fit(train).predict_rows(test)
    meas = np.array([r["time_s"] for r in test])
    groups = fusion_groups(test)
    by_kind: dict = defaultdict(list)
    by_op: dict = defaultdict(list)
    for i in groups:
        r = test[i]
        dom = r["desc"]["dominant"]
        kind = r["device"].get("cpu_kind", "")
        by_kind[kind].append(i)
        by_op[(kind, dominant_kind(dom["op"], dom.get("attrs", {}), dom.get("inputs", [])))].append(pred[i] / meas[i])
    for kind, idx in sorted(by_kind.items()):
        s = score([test[i] for i in idx], pred[idx])
        print(f"{kind}: {s.n} groups, MAPE {s.mape:.1f} %, median {s.median_ape:.1f} %, sum {s.sum_ratio:.2f}, "
              f"{100 * s.within_3x:.1f} % within 1/3-3x ({s.ratio_min:.2f}-{s.ratio_max:.2f})")
    for (kind, op), v in sorted(by_op.items()):
        print(f"  {kind:20s} {op:18s} {len(v):4d} groups, predicted/measured median {np.median(v):.2f} "
              f"({min(v):.2f}-{max(v):.2f})")
    print("farthest off:")
    for i in sorted(groups, key=lambda i: -abs(np.log(pred[i] / meas[i])))[:a.worst]:
        r = test[i]
        dom = r["desc"]["dominant"]
        print(f"  {r['device'].get('cpu_kind', '')} {r['device']['cores']} core(s) {r['model']:18s} "
              f"{dom['op'].removeprefix('relax.'):16s} {str(dom.get('inputs'))[:44]:44s} measured "
              f"{meas[i] * 1e3:9.3f} ms, predicted {pred[i] * 1e3:9.3f} ({pred[i] / meas[i]:.2f}x); work "
              f"{work_s(r['desc'], r['device']) * 1e3:.3f} ms, misses {miss_s(r['desc'], r['device'], 'tvm') * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
