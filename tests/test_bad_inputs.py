"""The bad-input catalogue (issue 15, item 6): what a new user can get wrong, and what they see.

Each case feeds one bad input to the CLI (``CliRunner``: exit status 2 and one ``error:``
line) or to the Python API (a :class:`~tvm_pesto.errors.PestoError` subclass, or a
``RuntimeWarning`` where the input is only partly unusable), and checks that the message
names the problem AND the fix: two patterns, both required. Where a case can pass by
accident (a check that is never reached), a control next to it shows the good input goes
through.

Related cases elsewhere: ``tests/test_place_cli.py`` (cyclic and malformed LayerGraphs, the
memory figure that works), ``tests/test_models.py`` (every model-file error),
``tests/test_deploy.py`` (a bundle file missing or changed), ``tests/test_costs.py`` and
``tests/test_cache_concurrency.py`` (corrupt and truncated cache lines).

Where the API says less than the CLI (checked here as it is):

* a model too large for every device: ``tvm-pesto place`` names the smallest memory per
  device with which a plan was found; ``tvm_pesto.place`` names a memory every plan needs
  (necessary, not always enough), once per cover it tried, and with backend choice raises
  a ``SolverError`` ("no cover of the candidates could be placed") rather than an
  ``InfeasibleError``;
* an unknown solver through ``tvm_pesto.place`` comes with the same "no cover" prefix.
"""
from __future__ import annotations

import json
import os
import re
import warnings

import numpy as np
import pytest
import tvm
from click.testing import CliRunner
from tvm.script import ir as I
from tvm.script import relax as R

import tvm_pesto
from tvm_pesto.backends.tvm_cpu import TIMING_STAMP
from tvm_pesto.backends import get_backend
from tvm_pesto.backends.ms_database import RECORD_FILE, WORKLOAD_FILE, check_database_target
from tvm_pesto.backends.tvm_cpu import TvmMetaScheduleBackend
from tvm_pesto.candidates import flow as candidates_flow
from tvm_pesto.cli.main import cli
from tvm_pesto.cli.progress import console
from tvm_pesto.cluster import Cluster, parse_cluster
from tvm_pesto.costs import MeasureCache
from tvm_pesto.errors import (BuildError, ClusterError, CostError, ExecutionError, GraphError, InfeasibleError,
                              PestoError, PlanError, SolverError, UnsupportedModuleError)
from tvm_pesto_lab.tuning_rows import read_tuning_db
from tvm_pesto.models import load_model
from tvm_pesto.plan import Plan
from tvm_pesto.run.bundle.format import BUNDLE_FORMAT, BUNDLE_VERSION, MANIFEST, sha256

MiB = 1 << 20
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def flat(text: str) -> str:
    return " ".join(str(text).split())


def assert_names(msg: str, problem: str, fix: str) -> None:
    """``msg`` matches the ``problem`` pattern and the ``fix`` pattern."""
    msg = flat(msg)
    assert re.search(problem, msg), f"the problem ({problem!r}) is not named in: {msg}"
    assert re.search(fix, msg), f"the fix ({fix!r}) is not named in: {msg}"


@pytest.fixture
def place(monkeypatch):
    """``tvm-pesto ARGS`` through click's runner; returns the one error line (checked: exit 2,
    no traceback). The console is made wide so that a message is one line as printed."""
    monkeypatch.setattr(console, "width", 10_000)

    def invoke(*args, env=None, prefix="error:"):
        res = CliRunner().invoke(cli, [str(a) for a in args], env=env)
        assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
        assert "Traceback" not in res.output
        lines = [ln for ln in res.output.splitlines() if ln.startswith(prefix)]
        assert len(lines) == 1, res.output
        after = res.output.split(lines[0], 1)[1]
        assert not after.strip(), f"the message goes on after its line: {after!r}"
        return lines[0][len(prefix):]

    return invoke


# -- small inputs --------------------------------------------------------------------------------
@I.ir_module
class Two:
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.matmul(x, x)
            b = R.nn.relu(a)
            c = R.matmul(b, x)
            d = R.nn.softmax(c)
            R.output(d)
        return d


@I.ir_module
class TwoAdd:  # the same shape of graph as Two (4 ops, 3 groups), other ops
    @R.function
    def main(x: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.nn.relu(a)
            c = R.matmul(b, x)
            d = R.nn.softmax(c)
            R.output(d)
        return d


@I.ir_module
class Seven:
    @R.function
    def main(x: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.add(x, x)
            b = R.nn.relu(a)
            c = R.multiply(b, x)
            d = R.nn.softmax(c)
            e = R.exp(d)
            f = R.nn.relu(e)
            g = R.matmul(f, x)
            R.output(g)
        return g


@I.ir_module
class Dynamic:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")):
        with R.dataflow():
            y = R.nn.relu(x)
            R.output(y)
        return y


DYNAMIC_SCRIPT = '''
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Model:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")):
        with R.dataflow():
            y = R.nn.relu(x)
            R.output(y)
        return y
'''

NO_MAIN_SCRIPT = DYNAMIC_SCRIPT.replace("def main", "def forward").replace('("n", 4)', "(2, 4)")


def layer_graph(fpgas=2, cpus=1) -> dict:
    """A three-node dnn-partitioning LayerGraph."""
    nodes = [{"id": i, "name": f"n{i}", "cpuLatency": 5.0, "fpgaLatency": 1.0, "supportedOnFpga": True,
              "size": MiB, "colorClass": i, "isBackwardNode": False} for i in range(3)]
    edges = [{"sourceId": i, "destId": i + 1, "cost": 0.001, "size": MiB} for i in range(2)]
    return {"maxFPGAs": fpgas, "maxSizePerFPGA": 1 << 30, "maxCPUs": cpus, "nodes": nodes, "edges": edges}


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def gpu_cluster_json(tmp_path, name="c.json", **change) -> str:
    """``2xV100-pcie`` as a JSON file (simulated devices: the same on every machine), with
    ``change`` applied: ``memory_bytes`` to every device, ``bandwidth_Bps`` to link 0->1."""
    c = parse_cluster("2xV100-pcie").to_dict()
    for d in c["devices"]:
        d["memory_bytes"] = change.get("memory_bytes", d["memory_bytes"])
    c["links"][0]["bandwidth_Bps"] = change.get("bandwidth_Bps", c["links"][0]["bandwidth_Bps"])
    return write(tmp_path / name, c)


def celu_onnx(tmp_path) -> str:
    """An ONNX file whose one op (Celu) neither TVM's importer nor any backend supports."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Celu", ["x"], ["y"], alpha=1.0)], "celu", [x], [y])
    path = str(tmp_path / "celu.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


# -- the CLI -------------------------------------------------------------------------------------
def test_cli_unknown_model(place):
    msg = place("place", "resnet", "--cluster", "cpu:1")
    assert_names(msg, r"'resnet' is neither a zoo model nor a model file",
                 r"give a zoo name \(.*resnet50.*\) or the path of a file ending in \.onnx, \.pt2")


def test_cli_model_file_that_does_not_exist(place, tmp_path):
    msg = place("place", tmp_path / "missing.onnx", "--cluster", "cpu:1")
    assert_names(msg, r"model file '.*missing\.onnx' does not exist", r"check the path")


def test_cli_model_file_with_an_unknown_suffix(place, tmp_path):
    msg = place("place", write(tmp_path / "model.h5", "weights"), "--cluster", "cpu:1")
    assert_names(msg, r"'.*model\.h5' has an unknown suffix '\.h5'", r"use one of \.onnx, \.pt2, \.py")


def test_cli_cpu_0(place):
    msg = place("place", "mlp_mixer", "--cluster", "cpu:0")
    assert_names(msg, r"cpu:0 asks for 0 devices", rf"use cpu:1 \.\. cpu:{CORES}")


def test_cli_more_cpu_devices_than_cores(place):
    n = max(99, CORES + 1)
    msg = place("place", "mlp_mixer", "--cluster", f"cpu:{n}")
    assert_names(msg, rf"cpu:{n} asks for {n} devices but this machine has {CORES} usable cores",
                 rf"use cpu:1 \.\. cpu:{CORES}")


def test_cli_unknown_preset(place):
    msg = place("place", "mlp_mixer", "--cluster", "tpu-pod")
    assert_names(msg, r"unknown cluster spec 'tpu-pod'", r"use one of cpu:N, NxV100-nvlink, .*h200.* or a JSON file")


def test_cli_zero_gpus(place):
    msg = place("place", "mlp_mixer", "--cluster", "0xV100-pcie")
    assert_names(msg, r"'0xV100-pcie': the device count must be at least 1", r"use e\.g\. 1xV100-pcie")


def test_cli_cluster_file_that_does_not_exist(place, tmp_path):
    msg = place("place", "mlp_mixer", "--cluster", tmp_path / "nowhere.json")
    assert_names(msg, r"cluster file '.*nowhere\.json' does not exist",
                 r"check the path, or write one with `tvm-pesto cluster show cpu:2 > FILE`")


def test_cli_truncated_graph_file(place, tmp_path):
    text = json.dumps(layer_graph())
    msg = place("place", write(tmp_path / "cut.json", text[: len(text) // 2]), "--cluster", "from-graph")
    assert_names(msg, r"graph file '.*cut\.json' is not valid JSON: it ends before the JSON is complete \(truncated\?\)",
                 r"give the whole file")


def test_cli_graph_file_that_is_not_json(place, tmp_path):
    msg = place("place", write(tmp_path / "notes.json", "nodes: 3\nedges: 2\n"), "--cluster", "from-graph")
    assert_names(msg, r"graph file '.*notes\.json' is not valid JSON: it is not JSON text", r"give the whole file")


def test_cli_cluster_file_without_devices(place, tmp_path):
    msg = place("place", "mlp_mixer", "--cluster", write(tmp_path / "empty.json", {"devices": []}))
    assert_names(msg, r"cluster 'empty\.json' has no devices", r"give at least one \(e\.g\. 'cpu:1'\)")


def test_cli_layer_graph_without_devices(place, tmp_path):
    msg = place("place", write(tmp_path / "g.json", layer_graph(fpgas=0, cpus=0)), "--cluster", "from-graph")
    assert_names(msg, r"maxFPGAs=0, maxCPUs=0 gives no devices", r"set maxFPGAs or maxCPUs in the file to at least 1")


def test_cli_layer_graph_with_a_local_cluster(place, tmp_path):
    graph = write(tmp_path / "g.json", layer_graph())
    msg = place("place", graph, "--cluster", "cpu:1")
    assert_names(msg, r"LayerGraph files carry their own devices and costs", r"use --cluster from-graph")
    res = CliRunner().invoke(cli, ["place", graph, "--cluster", "from-graph"])  # the control
    assert res.exit_code == 0, res.output


def test_cli_unknown_solver(place):
    msg = place("place", "mlp_mixer", "--cluster", "cpu:1", "--solver", "heft,fastest")
    assert_names(msg, r"unknown solver 'fastest'", r"known solvers: single, heft, m-topo, m-etf, m-sct, ilp")


def test_cli_unknown_cost_source(place):
    # click's own check of the choice: exit 2, "Error:" and the choices
    msg = place("place", "mlp_mixer", "--cluster", "cpu:1", "--costs", "guess", prefix="Error:")
    assert_names(msg, r"Invalid value for '--costs': 'guess'", r"is not one of 'auto', 'measured', 'roofline', 'xgb'")


def test_cli_unknown_backend(place):
    msg = place("place", "mlp_mixer", "--cluster", "cpu:1", "--backends", "tvm,fastlib")
    assert_names(msg, r"unknown backend 'fastlib'", r"known backends: .*onnxruntime, .*torch, tvm")


def test_cli_missing_cost_model_file(place, tmp_path):
    missing = tmp_path / "model.json"
    msg = place("place", "mlp_mixer", "--cluster", "cpu:1", "--costs", "xgb", "--backends", "tvm",
                env={"TVM_PESTO_COST_MODEL": str(missing)})
    assert_names(msg, rf"cost model {re.escape(str(missing))} does not exist",
                 r"train one with `tvm-pesto cost-model train`")


def test_cli_malformed_input_shape(place):
    msg = place("place", "mlp_mixer", "--cluster", "cpu:1", "--input-shape", "x=1,three,96,96")
    assert_names(msg, r"malformed --input-shape 'x=1,three,96,96'",
                 r"expected NAME=D1,D2,\.\.\. with positive integer dimensions, e\.g\. x=1,3,224,224")


def test_cli_relax_module_with_dynamic_shapes(place, tmp_path):
    msg = place("place", write(tmp_path / "dyn.py", DYNAMIC_SCRIPT), "--cluster", "cpu:1")
    assert_names(msg, r"input 'x' of .*dyn\.py has dynamic shape \(n, 4\) \(axis 0 is 'n'\)",
                 r"give its shape with --input-shape x=1,4")


def test_cli_relax_module_without_main(place, tmp_path):
    msg = place("place", write(tmp_path / "nomain.py", NO_MAIN_SCRIPT), "--cluster", "cpu:1")
    assert_names(msg, r"nomain\.py: the module has no 'main' function", r"rename the entry function")


def test_cli_onnx_file_with_an_op_nothing_supports(place, tmp_path):
    # Today TVM's ONNX importer refuses the op before any backend could be asked, so the
    # answer is a clear error naming it (not a fallback to TVM, which cannot run it either).
    msg = place("place", celu_onnx(tmp_path), "--cluster", "cpu:1")
    assert_names(msg, r"'.*celu\.onnx' uses operator\(s\) the Relax ONNX importer does not support: Celu",
                 r"Replace them in the model, or export it with an opset in which the exporter decomposes them")


def test_cli_model_too_large_for_every_device(place, tmp_path):
    cluster = gpu_cluster_json(tmp_path, memory_bytes=100e3)
    msg = place("place", "mlp_mixer", "--cluster", cluster, "--costs", "roofline", "--backends", "tvm")
    assert_names(msg, r"weights and activations need [\d.]+ MiB but the 2 devices of .* hold 0\.2 MiB in all",
                 r"Fix: use devices with at least [\d.]+ MiB each, or more devices")
    works = float(re.search(r"smallest memory per device with which a plan fits is ([\d.]+) MiB", msg).group(1))
    floor = float(re.search(r"no plan can use less than ([\d.]+) MiB each", msg).group(1))
    assert 100e3 / MiB < floor <= works  # the figure named is more than the devices hold, and not below the bound
    assert re.search(rf"Fix: use devices with at least {works} MiB each", msg)


def test_cli_cluster_with_a_negative_bandwidth(place, tmp_path):
    msg = place("place", "mlp_mixer", "--cluster", gpu_cluster_json(tmp_path, bandwidth_Bps=-1e9))
    assert_names(msg, r"cluster JSON link 0->1 has bandwidth_Bps -1e\+09",
                 r"give a rate > 0 \(bytes per second, e\.g\. 1e10 for 10 GB/s\)")


# -- the Python API ------------------------------------------------------------------------------
def test_api_relax_module_with_dynamic_shapes():
    with pytest.raises(UnsupportedModuleError) as err:
        tvm_pesto.build(Dynamic, "cpu:1", costs="roofline")
    assert_names(str(err.value), r"parameter 'x' has a dynamic dimension n; tvm-pesto places static graphs only",
                 r"export the model with concrete input shapes .* or give them when loading it "
                 r"\(tvm_pesto\.models\.load_model\(path, input_shapes=\.\.\.\)")


def test_api_empty_module():
    with pytest.raises(GraphError) as err:
        tvm_pesto.place(tvm.IRModule(), "cpu:1", costs="roofline")
    assert_names(str(err.value), r"the module is empty: it has no function 'main' to place",
                 r"give a module whose 'main' is a Relax function")


def test_api_module_without_main():
    with pytest.raises(GraphError) as err:
        tvm_pesto.analyze(tvm.IRModule({"forward": Two["main"]}))
    assert_names(str(err.value), r"module has no function 'main' \(it has \['forward'\]\)",
                 r"rename the function to place to 'main' \(tvm_pesto\.analyze also takes func_name='forward'\)")


def test_api_unknown_solver():
    with pytest.raises(SolverError) as err:
        tvm_pesto.place(Two, "cpu:1", solver="magic", costs="roofline", backends="tvm")
    assert_names(str(err.value), r"unknown solver 'magic'", r"known solvers: single, heft, m-topo, m-etf, m-sct, ilp")


def test_api_unknown_cost_source():
    with pytest.raises(CostError) as err:
        tvm_pesto.estimate_costs(tvm_pesto.analyze(Two), parse_cluster("cpu:1"), "guess")
    assert_names(str(err.value), r"unknown cost source 'guess'", r"use one of auto, measured, roofline, xgb")


@pytest.mark.parametrize("backends,error", [("tvm", InfeasibleError), ("all", PestoError)])
def test_api_model_too_large_for_every_device(backends, error):
    # Placement only (tvm): the memory check of the one cover. With backend choice the joint
    # solve reports each cover it tried (a SolverError today, see the module docstring).
    small = 100e3
    mod = load_model("mlp_mixer").mod
    with pytest.raises(error) as err:
        tvm_pesto.place(mod, parse_cluster("2xV100-pcie").with_memory(small), costs="roofline", backends=backends)
    msg = flat(err.value)
    assert_names(msg, r"weights and activations need [\d.]+ MiB but the 2 devices of 2xV100-pcie hold 0\.2 MiB in all",
                 r"use devices with at least [\d.]+ MiB each, or more devices")
    named = [float(x) for x in re.findall(r"use devices with at least ([\d.]+) MiB each", msg)]
    assert min(named) > small / MiB  # never a figure the devices already have


def test_api_negative_bandwidth():
    data = parse_cluster("2xV100-pcie").to_dict()
    data.pop("links")
    data["default_link"] = {"latency_s": 1e-6, "bandwidth_Bps": -5}
    with pytest.raises(ClusterError) as err:
        Cluster.from_dict(data)
    assert_names(str(err.value), r"cluster JSON default_link has bandwidth_Bps -5", r"give a rate > 0")
    devs = parse_cluster("2xV100-pcie").devices
    with pytest.raises(ClusterError) as err:  # built in Python: the same check, naming the link
        Cluster("mine", devs, np.zeros((2, 2)), np.array([[1.0, 1e9], [-1e9, 1.0]]))
    assert_names(str(err.value), r"link 1->0 \(.* -> .*\) has bandwidth -1e\+09", r"give it a rate > 0")


@pytest.fixture(scope="module")
def two_placed():
    return tvm_pesto.place(Two, "cpu:1", backends="tvm", costs="roofline", search_s=0)


def test_api_plan_for_another_module(two_placed):
    plan = two_placed.plan
    with pytest.raises(PlanError) as err:  # a larger module
        tvm_pesto.build(Seven, "cpu:1", plan=plan)
    assert_names(str(err.value), r"the plan's units cover 4 ops, but this module has 7 .* the plan is for another module",
                 r"place this module \(tvm_pesto\.place / build without plan=\) or pass the plan made for it")
    seven = tvm_pesto.place(Seven, "cpu:1", backends="tvm", costs="roofline", search_s=0).plan
    with pytest.raises(PlanError) as err:  # a smaller one
        tvm_pesto.build(Two, "cpu:1", plan=seven)
    assert_names(str(err.value), r"names op \d, but this module has 4 ops \(the plan's units cover 7\): the plan is "
                                 r"for another module", r"place this module")


def test_api_plan_file_for_another_graph(two_placed, tmp_path):
    path = str(tmp_path / "plan.json")
    two_placed.plan.save(path, two_placed.problem.graph)
    back = Plan.load(path, graph=tvm_pesto.analyze(Two).op_graph)  # the control: its own graph
    assert back.assignment.tolist() == two_placed.plan.assignment.tolist() and back.order == two_placed.plan.order
    assert back.units == two_placed.plan.units
    # a graph of the same size and shape but other ops: only the saved names tell
    with pytest.raises(PlanError) as err:
        Plan.load(path, graph=tvm_pesto.analyze(TwoAdd).op_graph)
    assert_names(str(err.value), r"plan file '.*plan\.json' is for another graph: its node 0 is 'a:matmul\.\.b:relu', "
                                 r"but in 'main' node 0 is 'a:add\.\.b:relu'",
                 r"place 'main' again \(tvm_pesto\.place\) or load the plan saved for it")
    with pytest.raises(PlanError) as err:
        Plan.load(path, graph=tvm_pesto.analyze(Seven).op_graph)
    assert_names(str(err.value), r"is for another graph: its units cover 4 ops .* but 'main' has 7 ops",
                 r"load the plan saved for it")


def test_api_truncated_plan_file(two_placed, tmp_path):
    path = tmp_path / "plan.json"
    two_placed.plan.save(str(path))
    path.write_text(path.read_text()[:-20])
    with pytest.raises(PlanError) as err:
        Plan.load(str(path))
    assert_names(str(err.value), r"plan file '.*plan\.json' is not valid JSON", r"save the plan again")


GOOD = {"key": "k", "backend": "tvm", "target": "t", "median_s": 1e-3, "backend_stamp": TIMING_STAMP}


def test_api_partial_cost_cache(tmp_path):
    p = tmp_path / "m.jsonl"
    lines = [GOOD, {"key": "half", "backend": "tvm", "target": "t"},
             {"key": "odd", "backend": "tvm", "target": {"kind": "llvm"}, "median_s": 1e-3}]
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.warns(RuntimeWarning) as rec:
        cache = MeasureCache(p)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert_names(msg, r"corrupted: field 'target' is a dict, not a string, lacks field\(s\) median_s; "
                      r"skipped 2 corrupted line\(s\) \(line 2, 3\)",
                 r"ignored and their subgraphs measured again \(delete those lines, or the file")
    assert cache.get("k", "tvm", "t")["median_s"] == 1e-3 and len(cache) == 1  # the rest is used


def test_api_expired_cost_cache_records(tmp_path):
    p = tmp_path / "m.jsonl"
    other_target = dict(GOOD, key="elsewhere", target="t2")
    lines = [GOOD, dict(GOOD, key="old", cache_version=0), other_target]
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.warns(RuntimeWarning) as rec:
        cache = MeasureCache(p)
    assert len(rec) == 1 and cache.skipped == [] and cache.expired == [(2, 0)]
    assert_names(str(rec[0].message), r"1 expired record\(s\) of cache format version 0 \(line 2; this tvm-pesto reads "
                                      r"version 1\)", r"ignored and their subgraphs measured again")
    assert cache.get("old", "tvm", "t") is None  # measured again, not used
    # a record for another target is no error: kept for that target, never used for this one
    assert cache.get("elsewhere", "tvm", "t2") == other_target and cache.get("elsewhere", "tvm", "t") is None


def _tuning_db(path, target: dict, workload=None):
    """A MetaSchedule work directory with one record tuned for ``target``."""
    path.mkdir()
    (path / WORKLOAD_FILE).write_text(json.dumps(workload or ["0", "not a module"]) + "\n")
    rec = [0, [[[], []], [1e-4, 1.1e-4], target, [["TENSOR", "float32", [4, 4]], ["TENSOR", "float32", [4, 4]]]]]
    (path / RECORD_FILE).write_text(json.dumps(rec) + "\n")
    return str(path)


def test_api_metaschedule_database_from_another_target(tmp_path):
    cpu = parse_cluster("cpu:1").devices[0]
    gpu_db = _tuning_db(tmp_path / "gpu", {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024})
    with pytest.raises(BuildError) as err:
        TvmMetaScheduleBackend(database=gpu_db).build(Two["main"], cpu)
    assert_names(str(err.value), r"backend 'tvm-ms' cannot build this subgraph: MetaSchedule database '.*gpu' holds "
                                 r"records tuned for \{\"arch\": \"sm_90\", \"kind\": \"cuda\"\}, not for this device's "
                                 r"target \{\"kind\": \"llvm\"\}",
                 r"tune a database for this target \(tune_tir/tune_relax\) and point TVM_PESTO_MS_DB at it")
    check_database_target(_tuning_db(tmp_path / "cpu", {"kind": "llvm", "num-cores": 4}), cpu.target)  # the control


def test_api_metaschedule_database_read_for_another_device(tmp_path):
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    a = te.placeholder((4, 4), name="A")
    func = te.create_prim_func([a, te.compute((4, 4), lambda i, j: a[i, j] + 1.0, name="T_add")])
    workload = [str(x) for x in ms.database.Workload(tvm.IRModule({"main": func})).as_json()]
    db = _tuning_db(tmp_path / "gpu", {"kind": "cuda", "arch": "sm_90"}, workload)
    rows, skipped = read_tuning_db(db)  # the control: read for the device the record names
    assert len(rows) == 1 and rows[0]["device"]["kind"] == "gpu" and skipped == []
    with pytest.warns(RuntimeWarning) as rec:
        rows, skipped = read_tuning_db(db, device={"kind": "cpu", "model": "host-cpu", "peak_flops": 1e11,
                                                   "mem_bandwidth": 1e10, "memory_bytes": 1e9, "cores": 1})
    assert rows == [] and [n for _, n, _ in skipped] == [1]
    assert_names(str(rec[0].message), r"database_tuning_record\.json line 1: tuned for target "
                                      r"\{\"arch\": \"sm_90\", \"kind\": \"cuda\"\}, not for the given cpu device",
                 r"read a database tuned for that device, or pass no device")


def _bundle(path):
    """A bundle folder with a checked manifest (nothing to run: the checks come first)."""
    path.mkdir()
    docs = {"program.json": {"steps": []}, "cluster.json": parse_cluster("2xV100-pcie").to_dict()}
    for name, data in docs.items():
        (path / name).write_text(json.dumps(data))
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "libraries": {}, "artifacts": [],
                "files": {name: sha256(str(path / name)) for name in docs}}
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def test_api_bundle_with_a_corrupt_file(tmp_path):
    from tvm_pesto.run.bundle.format import read_manifest

    bundle = _bundle(tmp_path / "b")
    read_manifest(str(bundle))  # the control: intact, it passes the checks
    with open(bundle / "program.json", "ab") as f:
        f.write(b" ")
    with pytest.raises(ExecutionError) as err:
        tvm_pesto.load(str(bundle))
    assert_names(str(err.value), r"bundle file program\.json in '.*b' does not match its checksum in manifest\.json",
                 r"export the model again")


def test_api_bundle_with_a_corrupt_manifest(tmp_path):
    bundle = _bundle(tmp_path / "b")
    (bundle / MANIFEST).write_text((bundle / MANIFEST).read_text()[:30])
    with pytest.raises(ExecutionError) as err:
        tvm_pesto.load(str(bundle))
    assert_names(str(err.value), r"manifest\.json is not valid JSON", r"export the model again")


def test_api_unavailable_backend_warns_once_and_names_what_stands_in(monkeypatch):
    monkeypatch.setattr(candidates_flow, "_WARNED", set())  # other tests may have had the warning already
    monkeypatch.setattr(get_backend("tvm-ms"), "database", None)  # whatever TVM_PESTO_MS_DB says here
    an = tvm_pesto.analyze(Two)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(2):
            cs = tvm_pesto.make_candidates(an, "cpu:1", ["tvm", "tvm-ms"])
    said = [str(w.message) for w in rec if "tvm-ms" in str(w.message)]
    assert len(said) == 1, said
    assert_names(said[0], r"backend 'tvm-ms' is unavailable \(no MetaSchedule tuning database given; set "
                          r"TVM_PESTO_MS_DB to a work directory", r"its subgraphs stay on tvm")
    assert set(cs.by_backend()) == {"tvm"} and "tvm-ms" in cs.unavailable


def test_a_plan_applied_on_a_cluster_of_another_size_names_the_cluster_to_use():
    from tvm_pesto.builder.rewrite import apply_plan
    from tvm_pesto.candidates.examples import tiny_mlp

    mod, _ = tiny_mlp()
    one = tvm_pesto.place(mod, "cpu:1", backends="tvm", solver="m-topo", costs="roofline")
    with pytest.raises(PlanError, match=r"orders for 1 devices; cpu:2 has 2: .*placed\.cluster"):
        apply_plan(one.analysis.rg, one.plan, parse_cluster("cpu:2"))
