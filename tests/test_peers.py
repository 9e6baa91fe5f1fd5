"""``tvm-pesto bench peers``: the blocks' timing, one model against every peer, the CLI's errors."""
import json
import time

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fake_clock import FakeClock

from tvm_pesto.bench.peer_settings import PeerSettings
from tvm_pesto.bench.peers import bench_model, bench_peers, markdown
from tvm_pesto.frontend import from_torch
from tvm_pesto.costs.measure.blocks import time_blocks


def test_blocks_rank_a_slow_call_behind_a_fast_one_and_rotate():
    order, clock = [], FakeClock()
    slow = clock.call(0.002, lambda: order.append("slow"))
    fast = clock.call(0.0001, lambda: order.append("fast"))
    r = time_blocks({"slow": slow, "fast": fast}, rounds=2, warmup_s=0.0, block_s=0.01, min_calls=3, clock=clock)
    assert r["slow"]["s"] == pytest.approx(0.002) and r["fast"]["s"] == pytest.approx(0.0001)
    assert len(r["slow"]["blocks_s"]) == 2 and r["slow"]["calls"] == 2 * 5  # 5 calls fill 10 ms
    runs = [n for k, n in enumerate(order) if k == 0 or order[k - 1] != n]
    assert runs == ["slow", "fast", "slow"]  # round 1: slow, fast; round 2 starts with fast


def test_a_best_block_stands_only_when_another_block_reproduces_it():
    clock, n = FakeClock(), {"calls": 0}

    def wobbly():  # each block (a warm-up call and 3 timed ones) 30 % faster than the one before
        clock.now += 0.004 * 0.7 ** (n["calls"] // 4)
        n["calls"] += 1

    steady = clock.call(0.001)
    r = time_blocks({"wobbly": wobbly, "steady": steady}, rounds=2, warmup_s=0.0, block_s=0.0, min_calls=3,
                    agree=0.03, max_rounds=5, clock=clock)
    assert r["steady"]["confirmed"] and len(r["steady"]["blocks_s"]) == 5  # timed in every round
    assert len(r["wobbly"]["blocks_s"]) == 5 and not r["wobbly"]["confirmed"]
    assert r["wobbly"]["spread"] == pytest.approx(1 / 0.7 - 1)
    assert r["wobbly"]["s"] == pytest.approx(np.median(r["wobbly"]["blocks_s"]))  # no two blocks agree
    assert "confirmed" not in time_blocks({"a": steady}, rounds=2, warmup_s=0.0, block_s=0.0, min_calls=1,
                                          clock=clock)["a"]


def test_one_lucky_block_is_not_a_variants_time():
    # one block 25 % under every other (a quick spell of the machine), never reproduced: the
    # variant's time is its least block that another reproduces, as for every variant
    clock, n = FakeClock(), {"calls": 0}

    def lucky():  # the third block (a warm-up call and 3 timed ones each) runs at 0.75 ms a call
        clock.now += 0.00075 if n["calls"] // 4 == 2 else 0.001 + 0.00001 * (n["calls"] // 4)
        n["calls"] += 1

    r = time_blocks({"lucky": lucky}, rounds=3, warmup_s=0.0, block_s=0.0, min_calls=3, agree=0.03, max_rounds=5,
                    clock=clock)
    assert min(r["lucky"]["blocks_s"]) == pytest.approx(0.00075) and not r["lucky"]["confirmed"]
    assert r["lucky"]["s"] == pytest.approx(0.001)


def test_every_variant_gets_the_rounds_one_unsteady_variant_asks_for():
    """A steady variant timed only in a slow spell of the machine would be judged slower than one
    whose further blocks met the quick spell after it: both get those rounds."""
    clock, n = FakeClock(), {"calls": 0}

    def spell(seconds):  # the machine runs at half speed for its first 0.2 s
        def f():
            clock.now += seconds * (2.0 if clock.now < 0.2 else 1.0)
        return f

    def wobbly():  # unsteady: each block 30 % faster than the one before, so it keeps asking
        spell(0.004 * 0.7 ** (n["calls"] // 4))()
        n["calls"] += 1

    r = time_blocks({"steady": spell(0.01), "wobbly": wobbly}, rounds=2, warmup_s=0.0, block_s=0.0, min_calls=3,
                    agree=0.03, max_rounds=6, clock=clock)
    assert r["steady"]["blocks_s"][:2] == pytest.approx([0.02, 0.02])  # confirmed within the slow spell
    assert len(r["steady"]["blocks_s"]) == len(r["wobbly"]["blocks_s"]) == 6
    assert r["steady"]["s"] == pytest.approx(0.01)  # the quick spell's time


def test_the_error_is_also_read_against_the_outputs_magnitude():
    from tvm_pesto.bench.peers import summarize

    rows = {"large": {"max_abs_err": 8e-4, "output_scale": 43.0, "variants": {}},  # float32 rounding at 43
            "small": {"max_abs_err": 5e-5, "output_scale": 0.5, "variants": {}}}   # read against 1, not 0.5
    out = summarize(rows)
    assert out["max_abs_err"] == 8e-4 and out["max_rel_err"] == pytest.approx(5e-5)


def test_a_slow_model_ends_its_block_early():
    clock = FakeClock()
    r = time_blocks({"a": clock.call(0.02)}, rounds=1, warmup_s=0.0, block_s=10.0, min_calls=100,
                    max_block_s=0.05, clock=clock)
    assert r["a"]["calls"] == 3  # 60 ms: past max_block_s with the three calls a median needs


def test_blocks_time_real_calls_by_default():
    r = time_blocks({"a": lambda: time.sleep(0.001)}, rounds=1, warmup_s=0.0, block_s=0.0, min_calls=3)
    assert r["a"]["calls"] == 3 and r["a"]["s"] >= 0.001  # a sleep lasts at least as long as asked


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    x = (np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32),)
    return model, x, from_torch(model, x, name="mlp")


@pytest.fixture(scope="module")
def one_model():
    model, x, mod = _mlp()
    return bench_peers([("mlp", lambda: (model, x, mod))], PeerSettings(cores=2, torch_compile=False,
                       build_options={"costs": "roofline"}, rounds=1))


@pytest.mark.slow
def test_every_peer_is_reported_with_its_time_or_why_not(one_model):
    m = one_model["models"]["mlp"]
    v = m["variants"]
    for name in ("ort", "ort-parallel", "ort-1", "torch", "pesto", "pesto-1dev"):
        assert v[name]["seconds"] > 0, (name, v[name])
        assert v[name]["max_abs_err"] < 1e-4, (name, v[name])
    assert "seconds" in v["openvino"] or "openvino" in v["openvino"]["error"]
    if "seconds" in v["openvino-f32"]:  # OpenVINO asked for float32, whatever its default on this CPU
        assert v["openvino-f32"]["precision"] == "f32" and v["openvino-f32"]["max_abs_err"] < 1e-4
    assert v["pesto"]["peak_rss_mb"] > 0 and one_model["models"]["mlp"]["error"] is None
    # the suite builds without timing the final choice (conftest: $TVM_PESTO_MEASURE_FINAL=0):
    # nothing was measured at build time, so nothing to hold against
    m = one_model["models"]["mlp"]
    assert v["pesto"]["options_measured_s"] == {v["pesto"]["chosen"]: None} and m["held"] is None


@pytest.mark.slow
def test_held_is_the_blocks_time_over_the_build_time_measurement_of_the_kept_option(monkeypatch):
    monkeypatch.setenv("TVM_PESTO_MEASURE_FINAL", "1")
    model, x, mod = _mlp()
    r = bench_peers([("mlp", lambda: (model, x, mod))], PeerSettings(cores=2, torch_compile=False, extra_builds=False,
                    build_options={"costs": "roofline"}, rounds=1, overhead=False))
    m = r["models"]["mlp"]
    p = m["variants"]["pesto"]
    kept = p["options_measured_s"][p["chosen"]]
    assert kept > 0 and len(p["options_measured_s"]) > 1
    assert m["held"] == pytest.approx(p["seconds"] / kept) and r["held_median"] == r["held_worst"] == m["held"]


@pytest.mark.slow
def test_the_ratio_is_the_best_float32_peer_over_pesto(one_model):
    m = one_model["models"]["mlp"]
    v = m["variants"]
    secs = {n: r["seconds"] for n, r in v.items() if "seconds" in r}
    f32 = {n: t for n, t in secs.items()
           if n in ("ort", "ort-parallel", "ort-1", "torch", "openvino-f32", "torch-compile")
           or (n == "openvino" and v[n]["precision"] == "f32")}
    assert {"ort", "ort-parallel", "ort-1", "torch"} <= set(f32)
    assert m["best_peer"] == min(f32, key=f32.get)
    assert m["ratio_vs_best_peer"] == pytest.approx(f32[m["best_peer"]] / secs["pesto"])
    every = {n: s for n, s in secs.items() if not n.startswith("pesto")}
    assert m["best_peer_all"] == min(every, key=every.get)
    assert one_model["geomean_vs_best_peer"] == pytest.approx(m["ratio_vs_best_peer"])
    assert one_model["worst_vs_best_peer"] == pytest.approx(m["ratio_vs_best_peer"])
    assert one_model["max_abs_err"] == m["max_abs_err"]
    assert one_model["max_rel_err"] == pytest.approx(m["max_abs_err"] / max(1.0, m["output_scale"]))
    json.dumps(one_model)  # the JSON the CLI writes
    table = markdown(one_model)
    assert "| mlp |" in table and f"{m['ratio_vs_best_peer']:.2f}" in table


@pytest.mark.slow
def test_a_peer_that_cannot_run_is_reported_not_fatal():
    class NoOnnx(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()  # the TorchScript ONNX exporter has no fft

    x = (np.ones((2, 8), np.float32),)
    r = bench_model("fft", NoOnnx().eval(), x, None, PeerSettings(cores=1, torch_compile=False, rounds=1))
    assert "error" in r["variants"]["ort"] and "error" in r["variants"]["pesto"]
    assert r["variants"]["torch"]["seconds"] > 0
    assert r["ratio_vs_best_peer"] is None


def test_the_cli_names_an_unknown_model():
    from tvm_pesto.cli.main import cli

    res = CliRunner().invoke(cli, ["bench", "peers", "--model", "no_such_model"])
    assert res.exit_code != 0 and "unknown model(s) no_such_model" in res.output and "resnet50" in res.output


@pytest.mark.slow
def test_reduced_precision_is_its_own_variant_where_the_cpu_has_it(one_model):
    """The default build stays in float32; where OpenVINO would compute in bfloat16 by default,
    a build that may use it is timed beside it, with its own error."""
    from tvm_pesto.backends import backend_status

    v = one_model["models"]["mlp"]["variants"]
    if "seconds" in v["openvino"]:
        assert v["openvino"]["precision"] in ("f32", "bf16", "f16")
    assert "openvino-bf16" not in (v["pesto"]["backend_mix"] or {})
    ok, why = backend_status(["openvino-bf16"])["openvino-bf16"]
    assert ("pesto-bf16" in v) == ok, why
    if ok:
        assert v["pesto-bf16"]["seconds"] > 0 and v["pesto-bf16"]["max_abs_err"] < 0.05
        assert "pesto-bf16" in markdown(one_model)


@pytest.mark.slow
def test_a_corpus_folder_is_benched_file_by_file_each_in_its_own_process(tmp_path):
    """``--corpus DIR``: every ONNX file is a row (a broken one with its error); the model's
    own ONNX file is what the ONNX peers run, and with no PyTorch model ONNX Runtime's output
    is the reference; the JSON carries the build's seconds and memory, and the summary."""
    from outside_zoo import write_onnx

    from tvm_pesto.bench.peers import FLOAT32_PEERS
    from tvm_pesto.cli.main import cli

    folder = tmp_path / "corpus"
    folder.mkdir()
    write_onnx("convnext", folder)
    (folder / "broken.onnx").write_bytes(b"not onnx")
    out = tmp_path / "c.json"
    res = CliRunner().invoke(cli, ["bench", "peers", "--corpus", str(folder), "--no-torch-compile", "--rounds", "1",
                                   "--costs", "roofline", "--json", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert set(r["models"]) == {"broken.onnx", "convnext_small.onnx"} and r["complete"] is True
    bad, good = r["models"]["broken.onnx"], r["models"]["convnext_small.onnx"]
    assert bad["error"].startswith("load: ") and "broken.onnx" in bad["error"] and bad["ratio_vs_best_peer"] is None
    assert good["error"] is None and good["reference"] == "ort" and good["max_abs_err"] < 1e-4
    assert good["variants"]["torch"]["error"].startswith("no PyTorch model")
    assert good["best_peer"] in FLOAT32_PEERS and good["ratio_vs_best_peer"] > 0
    assert good["build_s"] > 0 and good["peak_rss_mb"] > 100  # a Python process with TVM and ONNX Runtime loaded
    assert r["failed"] == ["broken.onnx"] and r["peak_rss_mb_max"] == good["peak_rss_mb"]
    assert r["build_s_max"] == r["build_s_median"] == good["build_s"]
    assert "broken.onnx: load: " in res.output and "build: median" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("cold", [True, False])
def test_each_model_builds_from_an_empty_measurement_cache_unless_warm_is_asked(monkeypatch, cold):
    import tvm_pesto
    from tvm_pesto.costs.store.cache import MeasureCache, default_cache_path

    seen, real = [], tvm_pesto.build

    def build(mod, cluster, **options):
        seen.append(options.get("cache"))
        return real(mod, cluster, **options)

    monkeypatch.setattr(tvm_pesto, "build", build)
    model, x, mod = _mlp()
    r = bench_peers([("mlp", lambda: (model, x, mod))], PeerSettings(cores=2, torch_compile=False, extra_builds=False,
                    build_options={"costs": "roofline"}, rounds=1, overhead=False, cold_cache=cold))
    assert r["models"]["mlp"]["error"] is None and seen
    if cold:  # its own log, not the shared one: a user's first build of this model
        assert all(isinstance(c, MeasureCache) and c.path != default_cache_path() for c in seen)
    else:
        assert seen == [None]


@pytest.mark.slow
def test_a_stopped_run_is_resumed_and_its_rows_count(tmp_path):
    """``--resume JSON``: the earlier run's models are kept, not run again; the result holds
    both, its figures over all of them, and names the run it continued."""
    from tvm_pesto.cli.main import cli

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.onnx").write_bytes(b"not onnx")
    first = tmp_path / "first.json"
    args = ["bench", "peers", "--corpus", str(folder), "--no-torch-compile", "--rounds", "1", "--costs", "roofline"]
    res = CliRunner().invoke(cli, [*args, "--json", str(first)])
    assert res.exit_code == 0, res.output
    (folder / "b.onnx").write_bytes(b"not onnx either")
    kept = json.loads(first.read_text())
    kept["models"]["a.onnx"]["error"] = "load: as the earlier run left it"  # to tell a kept row from a new one
    first.write_text(json.dumps(kept))
    out = tmp_path / "both.json"
    res = CliRunner().invoke(cli, [*args, "--resume", str(first), "--json", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["models"]["a.onnx"]["error"] == "load: as the earlier run left it"  # kept, not run again
    assert r["models"]["b.onnx"]["error"].startswith("load: ") and "b.onnx" in r["models"]["b.onnx"]["error"]
    assert r["failed"] == ["a.onnx", "b.onnx"] and r["complete"] is True
    assert [x["command"] for x in r["resumed"]] == [kept["command"]]
    from tvm_pesto.bench.doc_tables import header

    assert f"resuming `{kept['command']}`" in header(r, "both.json")


def test_a_run_of_another_machine_or_settings_is_not_resumed(tmp_path):
    from tvm_pesto.bench.report import machine_info
    from tvm_pesto.cli.main import cli

    here = machine_info()
    run = {"command": "tvm-pesto bench peers --corpus timm", "corpus": "timm", "measurement_cache": "cold",
           "cores": int(here["nproc"]), "machine": {"cpu_id": "OtherVendor/1/2/3"}, "models": {}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    res = CliRunner().invoke(cli, ["bench", "peers", "--corpus", "timm", "--resume", str(path)])
    said = " ".join(res.output.split())  # the message as words, however the console wrapped it
    assert res.exit_code != 0 and "cannot be continued" in said and "CPU OtherVendor/1/2/3 there" in said
    path.write_text("{}")
    res = CliRunner().invoke(cli, ["bench", "peers", "--corpus", "timm", "--resume", str(path)])
    assert res.exit_code != 0 and "not the JSON of a bench peers run" in " ".join(res.output.split())
