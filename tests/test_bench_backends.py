"""``tvm-pesto bench backends``: what it sums over the models, and its timing of the variants.

The benchmark itself builds and times every variant of every zoo model (minutes); these
tests check its parts: the per-model figures become the right geomeans and worst ratios,
a variant that failed to build is left out of them, and variants are timed in blocks.
"""
from __future__ import annotations

import math

import pytest

from tvm_pesto.bench import backends as bb
from tvm_pesto.jsonio import jsonable, schema_problems


class _Cluster:
    def __init__(self, name):
        self.name = name

    def to_dict(self):  # the dict of a real cluster of that name: the JSON's clusters follow the cluster schema
        from tvm_pesto.cluster import parse_cluster

        return {**parse_cluster(self.name).to_dict(), "name": self.name}


def _model(best, dp, joint, pesto=None):
    m = {"best_single_s": best, "collage_dp_s": dp, "joint_s": joint, "pesto_s": pesto, "max_abs_err": 1e-6,
         "collage_dp_speedup_vs_best_single": best / dp, "speedup_vs_best_single": best / joint,
         "ratio_vs_best_single": joint / best, "speedup_predicted_choice": best / joint,
         "blocks_s": {"single:x": [best, best], "collage_dp": [dp, dp * 1.2]}, "same_programs": [],
         "ceiling": {"mix_free_boundaries": best / dp * 1.1, "joint_free_communication": best / joint * 1.5}}
    if pesto is not None:
        m["pesto_speedup_vs_best_single"] = best / pesto
    return m


def test_the_summary_is_the_geomean_and_worst_over_the_models(monkeypatch):
    per = {"a": _model(1.0, 0.8, 0.5, 0.5), "b": _model(1.0, 1.25, 2.0, 1.0), "c": _model(2.0, 2.0, 1.0)}
    monkeypatch.setattr(bb, "bench_clusters", lambda: (_Cluster("cpu:1"), _Cluster("cpu:2")))
    monkeypatch.setattr(bb, "call_costs", lambda *a, **k: {})  # measured once per run, on the real cpu:1
    monkeypatch.setattr(bb, "bench_model", lambda name, *a, **k: per[name])
    res = bb.bench_backends(["a", "b", "c"])
    assert res["geomean_speedup_collage_dp_vs_best_single"] == pytest.approx((1.25 * 0.8 * 1.0) ** (1 / 3))
    assert res["geomean_speedup_vs_best_single"] == pytest.approx((2.0 * 0.5 * 2.0) ** (1 / 3))
    assert res["worst_ratio_vs_best_single"] == pytest.approx(2.0)
    # the ceilings too: each model's figure over its best single backend, as a geomean
    assert res["geomean_ceiling_mix_free_boundaries"] == pytest.approx(1.1 * (1.25 * 0.8 * 1.0) ** (1 / 3))
    assert res["geomean_ceiling_joint_free_communication"] == pytest.approx(1.5 * (2.0 * 0.5 * 2.0) ** (1 / 3))
    # c's build did not run: the build's figures are over a and b only
    assert res["geomean_speedup_pesto_vs_best_single"] == pytest.approx(math.sqrt(2.0 * 1.0))
    assert res["worst_speedup_pesto_vs_best_single"] == pytest.approx(1.0)
    assert res["max_abs_err"] == pytest.approx(1e-6) and res["errors"] == {}
    assert res["machine"]["nproc"] >= 1 and res["rounds"] == bb.ROUNDS
    # every model's every variant counts in the run's noise: each collage_dp's blocks differ by 20 %
    assert res["noise"]["count"] == 6 and sorted(res["noise"]["unconfirmed"]) == ["a/collage_dp", "b/collage_dp",
                                                                                 "c/collage_dp"]
    # what `tvm-pesto bench backends --json` writes (it adds these two) follows its schema
    assert schema_problems("bench-backends", jsonable({**res, "cache_skipped_lines": [], "deterministic": True})) == []


class _Plan:
    def __init__(self, *units):
        self.units = [type("U", (), {"backend": b, "nodes": n}) for b, n in units]


def test_variants_of_the_same_cover_are_the_same_program_and_their_difference_is_noise():
    ort, tvm_a, tvm_b = ("onnxruntime", (0, 1, 2)), ("tvm", (0,)), ("onnxruntime", (1, 2))
    plans = {"single:onnxruntime": _Plan(ort), "single:tvm": _Plan(tvm_a, ("tvm", (1, 2))),
             "collage_dp": _Plan(ort), "joint_1dev": _Plan(tvm_b, tvm_a), "joint_2dev": _Plan(ort)}
    # joint_1dev's cover is not ort's; joint_2dev's is, but on other devices: not the same program
    assert bb.same_programs(plans) == [("single:onnxruntime", "collage_dp")]
    noise = bb.timing_noise({"single:onnxruntime": [1.0, 1.01], "collage_dp": [1.3, 1.31]},
                            bb.same_programs(plans))
    assert noise["same_program_max"] == pytest.approx(0.3) and noise["unconfirmed"] == []


def test_a_model_that_fails_is_reported_not_summed(monkeypatch):
    def model(name, *a, **k):
        if name == "bad":
            raise bb.PestoError("bad: no candidate covers op 3")
        return _model(1.0, 1.0, 0.5, 0.5)

    monkeypatch.setattr(bb, "bench_clusters", lambda: (_Cluster("cpu:1"), _Cluster("cpu:2")))
    monkeypatch.setattr(bb, "call_costs", lambda *a, **k: {})  # measured once per run, on the real cpu:1
    monkeypatch.setattr(bb, "bench_model", model)
    res = bb.bench_backends(["good", "bad"])
    assert res["errors"] == {"bad": "bad: no candidate covers op 3"}
    assert list(res["models"]) == ["good"] and res["geomean_speedup_vs_best_single"] == pytest.approx(2.0)


@pytest.mark.slow
def test_the_joint_shape_is_chosen_by_blocks_or_by_prediction():
    import time

    def slow():
        time.sleep(2e-4)

    variants = {"joint_1dev": (None, (None, 1.0)), "joint_2dev": (None, (None, 2.0))}
    fns = {"joint_1dev": slow, "joint_2dev": lambda: None}
    predicted, pkey, key, select = bb._choose_joint(variants, fns, "measured")
    assert pkey == "joint_1dev" and key == "joint_2dev"  # measured faster, though predicted slower
    assert len(select["joint_1dev"]) == 2 and predicted == {"joint_1dev": 1.0, "joint_2dev": 2.0}
    assert bb._choose_joint(variants, fns, "predicted")[2:] == ("joint_1dev", {})


def test_a_model_file_is_loaded_like_a_zoo_name_and_a_missing_one_is_named(monkeypatch, tmp_path):
    """``--model`` takes model files as ``tvm-pesto run`` does (``models.load_model``): a file that
    is not there is reported under its path, with the fix, and the other models still run."""
    monkeypatch.setattr(bb, "bench_clusters", lambda: (_Cluster("cpu:1"), _Cluster("cpu:2")))
    monkeypatch.setattr(bb, "call_costs", lambda *a, **k: {})  # measured once per run, on the real cpu:1
    missing = str(tmp_path / "mine.onnx")
    res = bb.bench_backends([missing])
    assert list(res["errors"]) == [missing] and "does not exist" in res["errors"][missing]
    assert "check the path" in res["errors"][missing] and res["models"] == {}


@pytest.mark.slow
def test_bench_model_runs_end_to_end_on_a_tiny_model_file(tmp_path):
    """The function behind ``tvm-pesto bench backends``, unreplaced, on a 12-op MLP given as a
    model file: every variant built, timed and checked, the ceilings computed (figures are
    the machine's; only what must hold on any machine is checked)."""
    from tvm_pesto.candidates.examples import tiny_mlp

    mod, _ = tiny_mlp()
    path = tmp_path / "mlp.tvmscript"
    path.write_text(mod.script(show_meta=True))
    res = bb.bench_model(str(path), backends="tvm,onnxruntime",
                         settings=bb.BackendsBenchSettings(rounds=1, time_limit_s=5.0, search_s=0.5),
                         clusters=bb.bench_clusters(measure_links=False))
    assert res["num_ops"] == 12 and res["failed_builds"] == {}
    assert set(res["single_s"]) == {"tvm", "onnxruntime"} and all(s > 0 for s in res["single_s"].values())
    assert res["best_single_s"] == min(res["single_s"].values())
    for key in ("collage_dp_s", "joint_1dev_s", "joint_2dev_s", "pesto_s"):
        assert res[key] > 0, key
    assert res["max_abs_err"] <= 1e-4 and set(res["max_abs_err_per_variant"]) >= {"collage_dp", "pesto"}
    # a ceiling is a bound over the best single backend: a library alone is one of its covers
    assert res["ceiling"]["mix_free_boundaries"] >= 1.0 - 1e-9
    assert res["ceiling"]["joint_free_communication"] >= 1.0 - 1e-9
    assert res["pesto_speedup_vs_best_single"] == pytest.approx(res["best_single_s"] / res["pesto_s"])
