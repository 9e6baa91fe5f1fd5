"""The cost model on what it never met: ``cost-model eval --holdout family`` and ``--train-size
small --eval-size full`` (``tvm_pesto_lab.generalization``), the family of each row's model
(``tvm_pesto_lab.families``), and a target that scales with the work (``log_work``)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tvm_pesto.costs.predict.xgb import target_base
from tvm_pesto.errors import PestoError
from tvm_pesto.jsonio import schema_problems
from tvm_pesto_lab import fit
from tvm_pesto_lab.cli import cost_model
from tvm_pesto_lab.families import MODEL_FAMILIES, model_family
from tvm_pesto_lab.generalization import fusion_groups

from test_cost_model import CPU_DEV, sweep_descs, synthetic_rows, write_log  # noqa: F401 - a fixture

#: sweep families renamed to models of two architecture families (a zoo model and a corpus
#: model of one family), and one at size full
RENAME = {"sweep-conv2d": "resnet50", "sweep-conv1x1": "corpus:resnet18", "sweep-attention": "vit",
          "sweep-matmul": "vit:full"}


@pytest.fixture(scope="module")
def renamed_log(tmp_path_factory, sweep_descs):  # noqa: F811 - the fixture imported above
    rows = synthetic_rows(sweep_descs)
    for r in rows:
        r["model"] = RENAME.get(r["model"], r["model"])
    d = tmp_path_factory.mktemp("gen")
    log, model = d / "log.jsonl", d / "m.json"
    write_log(log, rows)
    res = CliRunner().invoke(cost_model, ["train", str(log), "-o", str(model), "--rounds", "30"])
    assert res.exit_code == 0, res.output
    return rows, log, model


def _eval(tmp_path, model, *args):
    out = tmp_path / "e.json"
    res = CliRunner().invoke(cost_model, ["eval", "--model", str(model), "--rounds", "30", "--json", str(out), *args])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert schema_problems("cost-model-generalization", data) == []
    return data


def test_every_model_has_one_family_spelled_as_the_corpus_spells_it():
    assert model_family("resnet50") == model_family("corpus:resnet50:full") == "ResNet"
    assert model_family("mobilenet_v3") == model_family("corpus:mobilenetv3_small_100") == "MobileNetV3"
    assert model_family("sweep-pool") == "sweep" and model_family("tuning-db:ms-small") == "tuning-db"
    assert len(set(MODEL_FAMILIES.values())) == len(MODEL_FAMILIES)  # no two zoo models share one


def test_holdout_family_trains_without_each_family_and_scores_it(tmp_path, renamed_log):
    rows, _, model = renamed_log
    r = _eval(tmp_path, model, "--holdout", "family")
    assert r["mode"] == "family" and set(r["folds"]) == {"ResNet", "ViT"}  # sweeps are always trained on
    resnet = [x for x in rows if model_family(x["model"]) == "ResNet"]
    fold = r["folds"]["ResNet"]
    assert fold["rows"]["n"] == len(resnet) and fold["models"] == ["corpus:resnet18", "resnet50"]
    assert fold["train_rows"] <= len(rows) - len(resnet)
    groups = fusion_groups(resnet)
    assert fold["groups"]["n"] == len(groups) > 0
    assert set(fold["group_sums"]) == {"corpus:resnet18", "resnet50"}
    assert r["pooled"]["rows"]["n"] == len(resnet) + sum(model_family(x["model"]) == "ViT" for x in rows)
    assert r["folds"]["ViT"]["groups_by_size"].keys() == {"small", "full"}
    one = _eval(tmp_path, model, "--holdout", "family", "--families", "ViT")
    assert list(one["folds"]) == ["ViT"] and one["folds"]["ViT"] == r["folds"]["ViT"] | {
        "seconds": one["folds"]["ViT"]["seconds"]}  # deterministic


def test_train_small_eval_full_scores_the_full_rows_only(tmp_path, renamed_log):
    rows, _, model = renamed_log
    r = _eval(tmp_path, model, "--train-size", "small", "--eval-size", "full", "--target", "log_work")
    full = [x for x in rows if x["model"] == "vit:full"]
    assert r["mode"] == "size" and r["target"] == "log_work" and list(r["folds"]) == ["ViT"]
    assert r["pooled"]["rows"]["n"] == len(full)
    assert r["pooled"]["train_rows"] <= len(rows) - len(full)


@pytest.mark.parametrize("args, says", [
    (["--holdout", "family", "--families", "Nope"], "no rows of family Nope"),
    (["--holdout", "family", "--train-size", "small", "--eval-size", "full"], "two evaluations"),
    (["--train-size", "small"], "go together"),
    (["--train-size", "full", "--eval-size", "full"], "give two sizes"),
    (["--holdout", "family", "--flow"], "run them apart"),
])
def test_bad_generalization_options_say_what_to_do(renamed_log, args, says):
    res = CliRunner().invoke(cost_model, ["eval", "--model", str(renamed_log[2]), *args])
    assert isinstance(res.exception, PestoError) and says in str(res.exception), res.output


def _matmul_row(m, k, n, rng):
    """A matmul row whose time grows with its FLOPs (a fifth of the peak, a 3 us call)."""
    flops = 2.0 * m * k * n
    desc = {"v": 2, "ops": ["relax.matmul"], "dtype": "float32",
            "dominant": {"op": "relax.matmul", "attrs": {}, "inputs": [[m, k], [k, n]], "outputs": [[m, n]]},
            "out_shapes": [[m, n]], "flops": flops, "bytes_read": 4 * (m * k + k * n), "bytes_written": 4 * m * n,
            "param_bytes": 4 * k * n, "member_bytes": 4 * (m * k + k * n + m * n)}
    t = 3e-6 + flops / (0.2 * CPU_DEV["peak_flops"])
    return {"desc": desc, "device": CPU_DEV, "backend": "tvm", "tuned": 0.0, "model": "mm", "key": f"{m}x{k}x{n}",
            "time_s": float(t * np.exp(0.02 * rng.standard_normal()))}


def test_a_work_target_predicts_past_the_largest_label_where_log_time_clips():
    rng = np.random.default_rng(0)
    small = [_matmul_row(*(int(x) for x in rng.integers(8, 128, size=3)), rng) for _ in range(400)]
    biggest = max(r["desc"]["flops"] for r in small)
    large = [_matmul_row(m, k, n, rng) for m, k, n in [(320, 320, 256), (384, 256, 384), (512, 512, 256),
                                                        (512, 512, 512)]]
    scale = np.array([r["desc"]["flops"] for r in large]) / biggest
    assert scale.min() >= 10 and scale.max() <= 100  # 10x to 100x past every training row
    meas = np.array([r["time_s"] for r in large])
    ratio = {t: fit.train(small, target=t, rounds=60).predict_rows(large) / meas for t in ("log_time", "log_work")}
    assert np.all(ratio["log_time"] < 0.2)  # clipped at the largest label
    assert np.all((ratio["log_work"] > 0.75) & (ratio["log_work"] < 1.33)), ratio["log_work"]
    assert target_base(large, "log_work") == pytest.approx(target_base(large, "log_ratio"))  # no gather here


# -- rows from the corpus ---------------------------------------------------------------------------
def test_profile_refuses_a_name_of_no_model_and_lists_the_corpus(tmp_path):
    from tvm_pesto_lab.cli import profile

    res = CliRunner().invoke(profile, ["corpus:resnet19", "--log", str(tmp_path / "p.jsonl")])
    msg = str(res.exception)
    assert isinstance(res.exception, PestoError) and "unknown model 'corpus:resnet19'" in msg and "resnet18" in msg
    assert not (tmp_path / "p.jsonl").exists()


def _needs_torchvision():
    from tvm_pesto.errors import GraphError
    from tvm_pesto.zoo.corpus import import_torchvision

    try:
        import_torchvision()
    except GraphError as e:
        pytest.skip(str(e))  # the corpus extra is not installed


@pytest.mark.slow
def test_the_flow_evaluation_takes_corpus_models():
    from tvm_pesto_lab.flow_eval import flow_models

    _needs_torchvision()
    mods = flow_models(["corpus:squeezenet1_1", "mlp_mixer"])
    assert list(mods) == ["corpus:squeezenet1_1", "mlp_mixer"]
    assert "conv2d" in mods["corpus:squeezenet1_1"].script()


@pytest.mark.slow
def test_profile_takes_corpus_models_and_names_their_rows_by_size(tmp_path):
    from tvm_pesto_lab.cli import profile
    from tvm_pesto_lab.dataset import load_dataset

    _needs_torchvision()

    log = tmp_path / "p.jsonl"
    for size in ("small", "full"):
        res = CliRunner().invoke(profile, ["corpus:squeezenet1_1", "--size", size, "--backends", "tvm", "--cluster",
                                           "cpu:1", "--repeat", "1", "--min-repeat-ms", "1", "--log", str(log)])
        assert res.exit_code == 0, res.output
    rows = load_dataset([log]).rows
    assert {r["model"] for r in rows} == {"corpus:squeezenet1_1", "corpus:squeezenet1_1:full"}
    assert {model_family(r["model"]) for r in rows} == {"SqueezeNet"}
    assert all(isinstance(r["load"], list) for r in rows)  # each row says how loaded the machine was
    small, full = ([r["desc"]["flops"] for r in rows if r["model"].endswith(s)] for s in ("_1", ":full"))
    assert max(full) > 5 * max(small)  # 224 x 224 against 64 x 64
