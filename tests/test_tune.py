"""``tvm-pesto tune`` (issue 11, item 4): MetaSchedule tuning of a model's fused kernels into
a database, resumed without re-spending trials, applied by the ``tvm-ms`` backend (same
numerics, kernels scheduled), measured by the profiler per database version, and the
errors a user can cause.

Short runs: a 2-layer MLP (two kernels), ``replay`` search (random schedules, no cost
model) except for one single-trial run of the default evolutionary search.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from click.testing import CliRunner
from tvm import relax

from tvm_pesto.backends import get_backend
from tvm_pesto.backends.ms_database import RECORD_FILE, WORKLOAD_FILE
from tvm_pesto.backends.tvm_cpu import MS_DB_ENV, apply_tuning_database, fuse_for_tuning, set_tuning_database
from tvm_pesto.cli.main import cli
from tvm_pesto.cli.progress import console
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs.predict.features import device_descriptor
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.costs.tune.tune import split_trials, tune_model, tuning_tasks
from tvm_pesto.costs.tune.tuning_db import DEVICE_FILE, read_device_file, write_device_file
from tvm_pesto.errors import BuildError, CostError, TuningError
from tvm_pesto_lab.tuning_rows import read_tuning_db

CPU = parse_cluster("cpu:1").devices[0]
TARGET = dict(CPU.target)
RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((64, 64)).astype("float32")
W2 = RNG.standard_normal((64, 32)).astype("float32")


def mlp() -> tvm.IRModule:
    """relu(x @ W1) @ W2: two fused kernels (matmul+relu, matmul)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, relax.const(W1))))
            y = bb.emit_output(relax.op.matmul(h, relax.const(W2)))
        bb.emit_func_output(y)
    return bb.get()


def lines(path) -> list[str]:
    return [ln for ln in open(path).read().splitlines() if ln.strip()]


@pytest.fixture
def ms_backend(monkeypatch):
    """The shared tvm-ms backend with no database; restored (and the variable) afterwards."""
    bk = get_backend("tvm-ms")
    monkeypatch.setattr(bk, "database", None)
    monkeypatch.setenv(MS_DB_ENV, "")  # undone afterwards, whatever set_tuning_database writes
    return bk


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A database of the MLP: 6 trials split 3 + 3 over its two tasks."""
    wd = tmp_path_factory.mktemp("ms") / "db"
    seen = []
    res = tune_model(mlp(), TARGET, wd, 6, strategy="replay", trials_per_iter=3, device=CPU, min_repeat_ms=0,
                     measure_baseline=True, progress=lambda d, t, label: seen.append((d, t, label)))
    return wd, res, seen


def test_split_trials_heaviest_first_and_max_tasks():
    assert split_trials(7, 3) == [3, 2, 2] and sum(split_trials(100, 7)) == 100
    assert split_trials(5, 4, max_tasks=1) == [5, 0, 0, 0]
    assert split_trials(2, 3) == [1, 1, 0]


def test_tasks_are_the_fused_kernels_the_tvm_backend_compiles():
    tasks = tuning_tasks(mlp(), TARGET)
    assert [t.task_name for t, _ in tasks] == ["fused_matmul_relu", "matmul1"]  # heaviest first
    flops = [f for _, f in tasks]
    assert flops[0] > flops[1] >= 2 * 8 * 64 * 32


@pytest.mark.slow
def test_tune_writes_a_database_with_every_trial_and_reports_progress(tuned):
    wd, res, seen = tuned
    assert os.path.isfile(wd / WORKLOAD_FILE) and len(lines(wd / WORKLOAD_FILE)) == 2
    assert len(lines(wd / RECORD_FILE)) == 6 == res.trials_spent == res.records_after
    assert [(t.name, t.budget, t.existing, t.spent) for t in res.tasks] == [
        ("fused_matmul_relu", 3, 0, 3), ("matmul1", 3, 0, 3)]
    for t in res.tasks:
        assert 0 < t.best_s < 10 and 0 < t.baseline_s < 10 and t.best_before_s is None
    assert seen[-1][:2] == (6, 6) and {label for _, _, label in seen} == {
        "task 1/2 fused_matmul_relu", "task 2/2 matmul1"}
    rows, skipped = read_tuning_db(wd)  # the cost model reads it as tuned rows
    assert skipped == [] and len(rows) == 2 and {r["backend"] for r in rows} == {"tvm-ms"}
    # ... of the device it was tuned on, which the folder records for whoever reads it later
    assert all(r["device"] == device_descriptor(CPU) for r in rows) and CPU.cpu_kind
    assert read_device_file(wd) == device_descriptor(CPU)


def test_a_database_is_read_as_the_device_it_was_tuned_on(tuned, tmp_path, cpu_kind):
    """A database tuned on another machine (the shipped ``ms-small``, its device read from the
    folder) gives rows of that machine's device, not of the one reading it; one folder holds one
    device. The reader is this machine taken as each kind of the matrix: the shipped database's
    own kind adds to it, any other is refused."""
    import shutil

    from tvm_pesto.costs.predict.features import device_key

    wd, _, _ = tuned
    other = tmp_path / "db"
    shutil.copytree(wd, other)
    shipped = read_device_file(Path(__file__).resolve().parents[1] / "cost_models" / "ms-small")
    assert shipped and shipped["cpu_kind"]
    (other / DEVICE_FILE).write_text(json.dumps(shipped))
    rows, _ = read_tuning_db(other)
    assert rows and all(r["device"] == shipped for r in rows)
    reader = device_descriptor(parse_cluster("cpu:1").devices[0])  # of the kind in force now
    assert reader["cpu_kind"] == cpu_kind.kind
    same = device_key(reader) == device_key(shipped)
    assert same == (cpu_kind.tuned and reader["cores"] == shipped["cores"])
    if same:  # the device it was tuned on: its schedules go on in the same folder
        write_device_file(other, reader)
    else:
        with pytest.raises(CostError, match="another --work-dir"):
            write_device_file(other, reader)
    (other / DEVICE_FILE).write_text("[1, 2]")
    with pytest.raises(CostError, match="not a device descriptor"):
        read_tuning_db(other)


def test_a_second_run_resumes_and_only_spends_the_remaining_trials(tuned, tmp_path):
    import shutil

    wd = tmp_path / "db"
    shutil.copytree(tuned[0], wd)
    before = lines(wd / RECORD_FILE)
    again = tune_model(mlp(), TARGET, wd, 6, strategy="replay", device=CPU, min_repeat_ms=0)
    assert again.trials_spent == 0 and lines(wd / RECORD_FILE) == before
    assert [t.existing for t in again.tasks] == [3, 3] and again.records_before == 6
    assert [t.best_before_s for t in again.tasks] == [t.best_s for t in tuned[1].tasks]
    more = tune_model(mlp(), TARGET, wd, 9, strategy="replay", device=CPU, min_repeat_ms=0)
    after = lines(wd / RECORD_FILE)
    assert [t.spent for t in more.tasks] == [2, 1]  # shares 5 + 4 of 9, minus the 3 + 3 there
    assert after[:6] == before and len(after) == 9 and len(lines(wd / WORKLOAD_FILE)) == 2
    for t in more.tasks:  # the best record can only get better
        assert t.best_s <= t.best_before_s


def test_tvm_ms_applies_the_database_with_tvm_numerics(tuned, ms_backend, tmp_path):
    wd = str(tuned[0])
    ok, why = ms_backend.available()
    assert not ok and "--ms-db" in why
    assert set_tuning_database(wd) == os.path.abspath(wd) and os.environ[MS_DB_ENV] == os.path.abspath(wd)
    assert ms_backend.available() == (True, "")
    # every fused kernel of the model finds its schedule: the tasks are what tvm-ms looks up
    func = mlp()["main"]
    applied = apply_tuning_database(mlp(), tvm.target.Target(TARGET), wd)
    prims = [f for f in applied.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 2 and all(f.attrs.get("tirx.is_scheduled", False) for f in prims)
    untuned = fuse_for_tuning(mlp(), tvm.target.Target(TARGET))  # the control: without the database
    assert not any(f.attrs.get("tirx.is_scheduled", False) for f in untuned.functions.values()
                   if isinstance(f, tvm.tirx.PrimFunc))
    # the backend's callable against numpy and against the tvm backend
    x = RNG.standard_normal((8, 64)).astype("float32")
    outs = {}
    for name in ("tvm-ms", "tvm"):
        out = tvm.runtime.empty((8, 32), "float32", tvm.cpu())
        tvm.get_global_func(get_backend(name).build(func, CPU))(tvm.runtime.tensor(x), out)
        outs[name] = out.numpy()
    ref = np.maximum(x @ W1, 0) @ W2
    np.testing.assert_allclose(outs["tvm-ms"], ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(outs["tvm-ms"], outs["tvm"], rtol=1e-4, atol=1e-4)
    # deployed: the exported library, loaded by the runtime side, computes the same
    from tvm_pesto.run.libraries.loaders import LOADERS

    out_dir = str(tmp_path)
    meta = ms_backend.export_artifact(func, CPU, out_dir, "mlp")
    fn = LOADERS[meta["kind"]]({**meta, "num_inputs": 1, "num_outputs": 1}, out_dir, CPU)
    out = tvm.runtime.empty((8, 32), "float32", tvm.cpu())
    fn(tvm.runtime.tensor(x), out)
    np.testing.assert_allclose(out.numpy(), outs["tvm-ms"], rtol=1e-6, atol=1e-6)


def test_measurements_of_tvm_ms_follow_the_database_version(tuned, ms_backend, tmp_path):
    import shutil

    wd = tmp_path / "db"
    shutil.copytree(tuned[0], wd)
    set_tuning_database(wd)
    cache = MeasureCache(tmp_path / "m.jsonl")
    cache.put({"key": "k", "backend": "tvm-ms", "target": "t", "median_s": 1e-5, "repeats": [1e-5]})
    cache.put({"key": "k", "backend": "tvm", "target": "t", "median_s": 2e-5, "repeats": [2e-5]})
    assert cache.get("k", "tvm-ms", "t")["backend_stamp"].startswith("db:6:")
    assert MeasureCache(tmp_path / "m.jsonl").get("k", "tvm-ms", "t")["median_s"] == 1e-5  # read back
    with open(wd / RECORD_FILE, "a") as f:  # one more record: another database
        f.write(lines(wd / RECORD_FILE)[0] + "\n")
    assert cache.get("k", "tvm-ms", "t") is None and cache.get("k", "tvm", "t")["median_s"] == 2e-5


@pytest.mark.slow
def test_profile_logs_tvm_ms_rows(tuned, ms_backend, tmp_path):
    from tvm_pesto_lab.profile import default_backends, profile_module

    assert "tvm-ms" not in default_backends()
    set_tuning_database(tuned[0])
    assert default_backends()[-1] == "tvm-ms"
    log = tmp_path / "p.jsonl"
    res = profile_module(mlp(), "mlp", "cpu:1", log, ["tvm", "tvm-ms"], repeat=2, min_repeat_ms=1)
    assert res.errors == {} and res.backends["tvm-ms"] > 0
    recs = [json.loads(ln) for ln in lines(log)]
    ms_recs = [r for r in recs if r["backend"] == "tvm-ms"]
    assert ms_recs and all(r["median_s"] > 0 and "desc" in r and r["backend_stamp"].startswith("db:6:")
                           for r in ms_recs)
    # the tuned share: the database holds matmul+relu and the last matmul, not their parts
    assert {tuple(r["nodes"]): r["tuned"] for r in ms_recs} == {(0, 1): 1.0, (2,): 1.0, (0,): 0.0, (1,): 0.0}
    from tvm_pesto_lab.dataset import load_dataset
    from tvm_pesto_lab.profile import merge_logs

    merge_logs([log], tmp_path / "merged.jsonl")  # the bundled log is a merged one: the share survives it
    rows = [r for r in load_dataset([tmp_path / "merged.jsonl"]).rows if r["backend"] == "tvm-ms"]
    assert sorted(r["tuned"] for r in rows) == [0.0, 0.0, 1.0, 1.0]
    assert profile_module(mlp(), "mlp", "cpu:1", log, ["tvm", "tvm-ms"], repeat=2).measured == 0


def _func(mod):
    return mod["main"]


def test_tuned_share_is_the_work_the_database_holds(tuned, ms_backend):
    """``tuned_fraction``: 1 for the tuned MLP, 0 for kernels the database lacks, the FLOP
    share in between; 0 without a database; it is the ``tuned`` feature of a candidate."""
    from tvm_pesto.api import analyze
    from tvm_pesto.costs.predict.features import FEATURE_NAMES, describe_group, device_descriptor, feature_vector

    assert ms_backend.tuned_fraction(_func(mlp()), TARGET) == 0.0  # no database yet
    set_tuning_database(tuned[0])
    assert ms_backend.tuned_fraction(_func(mlp()), TARGET) == 1.0

    def mixed(n_other: int) -> tvm.IRModule:
        """The MLP followed by a 32 x n_other matmul the database has never seen."""
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((8, 64), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, relax.const(W1))))
                h = bb.emit(relax.op.matmul(h, relax.const(W2)))
                w3 = relax.const(RNG.standard_normal((32, n_other)).astype("float32"))
                y = bb.emit_output(relax.op.nn.relu(relax.op.matmul(h, w3)))
            bb.emit_func_output(y)
        return bb.get()

    share = ms_backend.tuned_fraction(_func(mixed(16)), TARGET)
    tuned_flops = 2 * 8 * 64 * 64 + 2 * 8 * 64 * 32
    assert share == pytest.approx(tuned_flops / (tuned_flops + 2 * 8 * 32 * 16), rel=0.05)
    assert 0 < ms_backend.tuned_fraction(_func(mixed(512)), TARGET) < share  # more untuned work
    a = analyze(mixed(16))
    desc = describe_group(a.rg.graph, list(range(a.rg.graph.num_nodes)))
    col = feature_vector(desc, device_descriptor(CPU), "tvm-ms", share)[FEATURE_NAMES.index("tuned")]
    assert col == pytest.approx(share)


@pytest.mark.slow
def test_the_default_evolutionary_search_runs(tmp_path):
    res = tune_model(mlp(), TARGET, tmp_path / "evo", 1, max_tasks=1, device=CPU, min_repeat_ms=0)
    assert res.strategy == "evolutionary" and [t.spent for t in res.tasks] == [1, 0]
    assert len(lines(tmp_path / "evo" / RECORD_FILE)) == 1


def test_an_error_inside_metaschedule_names_the_task_and_keeps_the_records(tmp_path):
    def fail_after_first_batch(done, total, label):  # called from MetaSchedule's C++ task scheduler
        if done:
            raise RuntimeError("disk full")

    wd = tmp_path / "db"
    with pytest.raises(TuningError) as err:
        tune_model(mlp(), TARGET, wd, 4, strategy="replay", trials_per_iter=1, device=CPU, min_repeat_ms=0,
                   progress=fail_after_first_batch)
    msg = " ".join(str(err.value).split())
    assert re.search(r"MetaSchedule failed while tuning task 1/2 'fused_matmul_relu' \(.*disk full\)", msg), msg
    assert "rerun the same command to resume" in msg and f"records measured so far (1) stay in {wd}" in msg
    kept = len(lines(wd / RECORD_FILE))
    assert kept == 1
    res = tune_model(mlp(), TARGET, wd, 4, strategy="replay", device=CPU, min_repeat_ms=0)
    assert [t.spent for t in res.tasks] == [1, 2] and len(lines(wd / RECORD_FILE)) == 4


@pytest.mark.parametrize("kwargs, problem", [
    ({"trials": 0}, r"--trials must be at least 1 .*not 0"),
    ({"trials": 2, "strategy": "annealing"}, r"unknown search strategy 'annealing'; use one of evolutionary, replay"),
    ({"trials": 2, "max_tasks": 0}, r"--max-tasks must be at least 1"),
])
def test_bad_budgets_are_refused(tmp_path, kwargs, problem):
    with pytest.raises(TuningError, match=problem):
        tune_model(mlp(), TARGET, tmp_path / "db", **kwargs)
    assert not (tmp_path / "db").exists()  # refused before anything is written


def test_an_unwritable_or_foreign_work_dir_is_refused(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(TuningError, match=r"cannot write the tuning database in .*file/db.*pick a --work-dir"):
        tune_model(mlp(), TARGET, tmp_path / "file" / "db", 2)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / WORKLOAD_FILE).write_text("")
    (gpu / RECORD_FILE).write_text(json.dumps([0, [[], [1e-4], {"kind": "cuda", "arch": "sm_80"}, []]]) + "\n")
    with pytest.raises(TuningError, match=r"tuned for .*cuda.*tune into a new --work-dir"):
        tune_model(mlp(), TARGET, gpu, 2)


@pytest.mark.slow
def test_cli_tune_prints_the_tasks_and_how_to_use_the_database(tmp_path, monkeypatch, ms_backend):
    monkeypatch.setattr(console, "width", 10_000)
    model = tmp_path / "mlp.tvmscript"
    model.write_text(mlp().script(show_meta=True))
    wd, out = tmp_path / "db", tmp_path / "t.json"
    args = ["tune", str(model), "--trials", "4", "--work-dir", str(wd), "--strategy", "replay", "--json", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["trials_spent"] == 4 and r["model"] == "mlp" and len(r["load_avg"]) == 2
    assert re.search(r"fused_matmul_relu +1 +2 +0 +2 ", res.output), res.output
    assert f"tvm-pesto run {model} --backends tvm,tvm-ms --ms-db {wd}" in res.output
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "trials: 0 this run, records 4 -> 4" in again.output
    assert "raise --trials to tune more" in again.output
    # --ms-db on run/place/demo/profile sets the backend's database
    ok = CliRunner().invoke(cli, ["place", str(model), "--ms-db", str(wd), "--backends", "tvm,tvm-ms",
                                  "--costs", "roofline", "--cluster", "cpu:1", "--json", str(tmp_path / "p.json")])
    assert ok.exit_code == 0, ok.output
    assert ms_backend.database == str(wd) and os.environ[MS_DB_ENV] == str(wd)


@pytest.mark.parametrize("args, problem, fix", [
    (["tune", "no_such_model", "--trials", "2", "--work-dir", "{tmp}/db"], r"no_such_model", r"resnet50"),
    (["tune", "resnet50", "--trials", "0", "--work-dir", "{tmp}/db"], r"--trials must be at least 1",
     r"measured schedules"),
    (["tune", "resnet50", "--trials", "2", "--work-dir", "{tmp}/db", "--cluster", "2xV100-nvlink"],
     r"no CPU device on this machine", r"--cluster cpu:N"),
])
def test_cli_bad_inputs(tmp_path, monkeypatch, args, problem, fix):
    monkeypatch.setattr(console, "width", 10_000)
    res = CliRunner().invoke(cli, [a.format(tmp=tmp_path) for a in args])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert re.search(problem, line) and re.search(fix, line), line
    assert not (tmp_path / "db").exists()


def test_ms_db_that_is_not_a_database_is_a_bad_parameter(tmp_path, ms_backend):
    res = CliRunner().invoke(cli, ["run", "resnet50", "--ms-db", str(tmp_path)])
    assert res.exit_code == 2 and "is not a MetaSchedule database" in res.output
    assert "tvm-pesto tune MODEL --trials N --work-dir" in " ".join(res.output.split())
    assert ms_backend.database is None
    with pytest.raises(BuildError, match="lacks database_workload.json"):
        set_tuning_database(tmp_path)
