"""The ``log_work_miss`` target: the cache misses of TVM's unscheduled reductions
(``tvm_pesto.costs.predict.roofline.miss_s``) added to what the trees learn, so a size whose
strided walk no longer stays in L2 (no training row's) is priced from what it fetches."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_pesto.costs.predict.caches import L2_WAYS, LINE_BYTES, strided_reduction
from tvm_pesto.costs.predict.roofline import miss_s
from tvm_pesto.costs.predict.xgb import target_base, target_offset
from tvm_pesto_lab import fit

DEV = {"kind": "cpu", "model": "test-cpu", "peak_flops": 1e11, "mem_bandwidth": 1e10, "memory_bytes": 8e9, "cores": 1}


def _mm(m, k, n):
    return {"v": 2, "ops": ["relax.matmul"], "dtype": "float32",
            "dominant": {"op": "relax.matmul", "attrs": {}, "inputs": [[m, k], [k, n]], "outputs": [[m, n]]},
            "out_shapes": [[m, n]], "flops": 2.0 * m * k * n, "bytes_read": 4 * (m * k + k * n),
            "bytes_written": 4 * m * n, "param_bytes": 4 * k * n, "member_bytes": 4 * (m * k + 2 * k * n)}


def _conv(cin, hw, cout, kh):
    return {"v": 2, "ops": ["relax.nn.conv2d"], "dtype": "float32",
            "dominant": {"op": "relax.nn.conv2d", "attrs": {"groups": 1, "padding": [0, 0, 0, 0]},
                         "inputs": [[1, cin, hw, hw], [cout, cin, kh, kh]],
                         "outputs": [[1, cout, hw - kh + 1, hw - kh + 1]]},
            "out_shapes": [[1, cout, hw - kh + 1, hw - kh + 1]], "flops": 0.0, "bytes_read": 0, "bytes_written": 0}


def test_misses_count_a_line_per_strided_access_only_past_the_l2_ways():
    big = _mm(32, 512, 2048)                     # B's rows 8 KiB apart: 512 lines on 8 of 1,024 L2 sets
    assert strided_reduction("matmul", big["dominant"]["inputs"], {}, 4)[3] > L2_WAYS
    assert miss_s(big, DEV, "tvm") == pytest.approx(32 * 2048 * 512 * LINE_BYTES / DEV["mem_bandwidth"])
    assert miss_s(big, DEV, "tvm-ms", tuned=0.25) == pytest.approx(0.75 * miss_s(big, DEV, "tvm"))
    for backend, tuned in (("onnxruntime", 0.0), ("torch", 0.0), ("tvm-ms", 1.0)):
        assert miss_s(big, DEV, backend, tuned) == 0.0, backend
    assert miss_s(_mm(32, 512, 96), DEV, "tvm") == 0.0   # 384-byte stride: the lines spread over the sets
    conv = _conv(64, 64, 16, 3)                  # channels 16 KiB apart: 192 lines on 12 L2 sets
    assert strided_reduction("conv2d", conv["dominant"]["inputs"], {}, 4)[3] > L2_WAYS
    assert miss_s(conv, DEV, "tvm") == pytest.approx(16 * 62 * 62 * 64 * 3 * LINE_BYTES / DEV["mem_bandwidth"])
    assert miss_s(_conv(64, 30, 16, 3), DEV, "tvm") == 0.0
    rows = [{"desc": big, "device": DEV, "backend": b} for b in ("tvm", "torch")]
    assert target_offset(rows, "log_work_miss").tolist() == [miss_s(big, DEV, "tvm"), 0.0]
    assert not target_offset(rows, "log_work").any() and not target_offset(rows, "log_time").any()
    assert target_base(rows, "log_work_miss") == pytest.approx(target_base(rows, "log_work"))


def test_the_devices_l2_geometry_decides_the_conflicts_and_the_misses(tmp_path):
    from tvm_pesto.cluster import Cluster, parse_cluster
    from tvm_pesto.cluster.host import l2_geometry
    from tvm_pesto.costs.predict.features import FEATURE_NAMES, device_descriptor, feature_vector

    qkv = _mm(128, 768, 2304)                    # B's rows 144 lines apart
    wide = dict(DEV, l2_sets=2048, l2_ways=16)   # 2 MiB of 16 ways: 128 sets hold its 768 lines, 6 a set
    assert strided_reduction("matmul", qkv["dominant"]["inputs"], {}, 4)[3] == 12.0    # 1,024 sets: 64 used
    assert strided_reduction("matmul", qkv["dominant"]["inputs"], {}, 4, 2048)[3] == 6.0
    assert miss_s(qkv, DEV, "tvm") > 0 and miss_s(qkv, wide, "tvm") == 0.0
    assert miss_s(qkv, dict(DEV, l2_sets=2048, l2_ways=4), "tvm") == miss_s(qkv, DEV, "tvm")  # 6 lines > 4 ways
    col = FEATURE_NAMES.index("log2_red_l2_conflict")
    assert feature_vector(qkv, wide, "tvm")[col] < feature_vector(qkv, DEV, "tvm")[col]
    # read from sysfs: the level-2 entry, whichever index it has
    for idx, (level, sets, ways) in enumerate([(1, 64, 12), (2, 2048, 16), (3, 4096, 16)]):
        d = tmp_path / "cpu3" / "cache" / f"index{idx}"
        d.mkdir(parents=True)
        for name, v in (("level", level), ("number_of_sets", sets), ("ways_of_associativity", ways)):
            (d / name).write_text(f"{v}\n")
    assert l2_geometry(3, str(tmp_path)) == (2048, 16) and l2_geometry(0, str(tmp_path)) == (0, 0)
    # carried by the device, its descriptor and the cluster's JSON
    dev = parse_cluster("cpu:1").devices[0]
    assert (dev.l2_sets, dev.l2_ways) == l2_geometry(dev.cpu_ids[0])
    desc = device_descriptor(dev)
    assert ("l2_sets" in desc) == bool(dev.l2_sets) and desc.get("l2_ways", 0) == dev.l2_ways
    c = parse_cluster("cpu:1")
    c.devices[0].l2_sets, c.devices[0].l2_ways = 2048, 16
    path = tmp_path / "c.json"
    c.to_json(str(path))
    back = Cluster.from_dict(__import__("json").loads(path.read_text()))
    assert (back.devices[0].l2_sets, back.devices[0].l2_ways) == (2048, 16)


def _row(m, k, n, rng):
    """An untuned TVM matmul: a fifth of the peak, plus its cache misses, plus a 3 us call."""
    desc = _mm(m, k, n)
    t = 3e-6 + desc["flops"] / (0.2 * DEV["peak_flops"]) + miss_s(desc, DEV, "tvm")
    return {"desc": desc, "device": DEV, "backend": "tvm", "tuned": 0.0, "model": "mm", "key": f"{m}x{k}x{n}",
            "time_s": float(t * np.exp(0.02 * rng.standard_normal()))}


def test_a_miss_regime_no_training_row_reached_is_priced_by_log_work_miss_only():
    rng = np.random.default_rng(0)
    small = [_row(*(int(x) for x in rng.integers(8, 128, size=3)), rng) for _ in range(400)]
    assert not target_offset(small, "log_work_miss").any()        # no training row misses
    large = [_row(m, k, n, rng) for m, k, n in [(32, 512, 2048), (64, 768, 3072), (16, 1024, 4096)]]
    misses = target_offset(large, "log_work_miss")
    meas = np.array([r["time_s"] for r in large])
    assert np.all(misses > 0.5 * meas)                            # most of their time
    ratio = {t: fit.train(small, target=t, rounds=60).predict_rows(large) / meas for t in ("log_work", "log_work_miss")}
    assert np.all(ratio["log_work"] < 0.5), ratio["log_work"]      # priced at the small rows' speed
    assert np.all((ratio["log_work_miss"] > 0.75) & (ratio["log_work_miss"] < 1.33)), ratio["log_work_miss"]


def test_log_work_miss_labels_never_drop_below_a_share_of_the_time():
    big = _mm(32, 512, 2048)
    misses = miss_s(big, DEV, "tvm")
    rows = [{"desc": big, "device": DEV, "backend": "tvm", "time_s": t} for t in (0.5 * misses, 3.0 * misses)]
    y = fit._target_values(rows, "log_work_miss")
    work = target_base(rows, "log_work")
    assert y[0] == pytest.approx(np.log(fit.MISS_LABEL_FLOOR * 0.5 * misses / work[0]))
    assert y[1] == pytest.approx(np.log(2.0 * misses / work[1]))


def test_a_work_floor_prices_less_work_as_log_time_does_and_is_saved_with_the_model(tmp_path):
    from tvm_pesto.costs.predict.xgb import CostModel
    from tvm_pesto.errors import CostError

    rng = np.random.default_rng(1)
    small = [_row(*(int(x) for x in rng.integers(8, 128, size=3)), rng) for _ in range(300)]
    large = [_row(m, k, n, rng) for m, k, n in [(512, 512, 96), (384, 256, 384)]]   # 10-20x the FLOPs, no misses
    meas = np.array([r["time_s"] for r in large])
    ratio = {f: fit.train(small, target="log_work", rounds=40, work_floor_s=f).predict_rows(large) / meas
             for f in (0.0, 1e3)}
    assert np.all((ratio[0.0] > 0.75) & (ratio[0.0] < 1.33)), ratio[0.0]
    assert np.all(ratio[1e3] < 0.2), ratio[1e3]        # every row's work below the floor: clipped as log_time is
    model = fit.train(small, target="log_work_miss", rounds=40, work_floor_s=1e-5)
    assert model.meta["work_floor_s"] == 1e-5 and "work_floor_s" not in fit.train(small, rounds=5).meta
    model.save(tmp_path / "m.json")
    again = CostModel.load(tmp_path / "m.json")
    assert again.work_floor_s == 1e-5
    np.testing.assert_allclose(again.predict_rows(large), model.predict_rows(large), rtol=1e-6)
    with pytest.raises(CostError, match="negative"):
        fit.train(small, target="log_work", rounds=5, work_floor_s=-1.0)
