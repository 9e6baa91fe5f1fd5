"""The ``openvino`` and ``onnxruntime-parallel`` backends: numerics against TVM, the calling
convention on shared buffers, the device thread's affinity, region-only candidates and the
core-count rule of the parallel mode, costs (``xgb`` fallback, ``measured``), bundles, and
a whole model in OpenVINO through ``tvm_pesto.build``."""
import builtins
import dataclasses
import importlib.util
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_pesto
from tvm_pesto.backends import available_backends, backend_status, get_backend, list_backends, release_all
from tvm_pesto.backends.openvino import OpenVinoBackend
from tvm_pesto.candidates import generate_candidates
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.candidates.generate import Candidate, CandidateSet
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs import candidate_costs
from tvm_pesto.errors import BuildError
from tvm_pesto.graph.relax_import import from_relax
from tvm_pesto.plan import Plan
from tvm_pesto.run.libraries.loaders import LOADERS, direct_call

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
needs_openvino = pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed (pip install openvino)")

WIDE = parse_cluster("cpu:1").devices[0]
#: Two threads whatever this machine has: the parallel mode's smallest device.
TWO_CORES = dataclasses.replace(WIDE, cores=2)
ONE_CORE = dataclasses.replace(WIDE, cores=1)


def _reference_vm(mod):
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    return relax.VirtualMachine(ex, tvm.cpu())


def _reference(mod, inputs, vm=None):
    vm = vm if vm is not None else _reference_vm(mod)
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def _call(gname, inputs, shape):
    out = tvm.runtime.empty(shape, "float32", tvm.cpu())
    tvm.get_global_func(gname)(*[tvm.runtime.tensor(a) for a in inputs], out)
    return out.numpy()


def test_both_backends_are_listed_with_their_status():
    assert {"openvino", "onnxruntime-parallel"} <= set(list_backends())
    status = backend_status(["openvino", "onnxruntime-parallel"])
    assert status["onnxruntime-parallel"] == (True, "")
    assert status["openvino"][0] == HAS_OPENVINO
    assert status["openvino"][0] or "pip install openvino" in status["openvino"][1]


def test_openvino_unavailable_names_the_install_command(monkeypatch):
    real_import = builtins.__import__

    def no_openvino(name, *a, **k):
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError("No module named 'openvino' (simulated)")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_openvino)
    ok, why = OpenVinoBackend().available()
    assert not ok and "pip install openvino" in why and "simulated" in why


@pytest.mark.slow
@pytest.mark.parametrize("model", [tiny_mlp, tiny_cnn])
@pytest.mark.parametrize("backend", [pytest.param("openvino", marks=needs_openvino), "onnxruntime-parallel"])
def test_whole_model_matches_tvm_in_place_and_direct(model, backend):
    mod, inputs = model()
    ref = _reference(mod, inputs)
    gname = get_backend(backend).build(mod["main"], TWO_CORES)
    np.testing.assert_allclose(_call(gname, inputs, ref.shape), ref, atol=1e-5, rtol=1e-5)
    direct = direct_call(gname)
    assert direct is not None
    (got,) = direct(*inputs)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@needs_openvino
def test_openvino_writes_the_dps_buffers_and_follows_new_ones():
    """Requests kept per set of addresses must see new contents in the same buffers, bind new
    buffers (never writing the old output), and be made per calling thread."""
    mod, inputs = tiny_mlp()
    fn = OpenVinoBackend().make_callable(mod["main"], ONE_CORE)
    vm = _reference_vm(mod)
    rng = np.random.default_rng(1)
    x, out = tvm.runtime.tensor(inputs[0]), tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    fn(x, out)
    np.testing.assert_allclose(out.numpy(), _reference(mod, inputs, vm), atol=1e-5, rtol=1e-5)
    second = rng.standard_normal(inputs[0].shape).astype("float32")
    x.copyfrom(second)
    fn(x, out)
    np.testing.assert_allclose(out.numpy(), _reference(mod, [second], vm), atol=1e-5, rtol=1e-5)
    third = rng.standard_normal(inputs[0].shape).astype("float32")
    x2, out2 = tvm.runtime.tensor(third), tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    fn(x2, out2)
    np.testing.assert_allclose(out2.numpy(), _reference(mod, [third], vm), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.numpy(), _reference(mod, [second], vm), atol=1e-5, rtol=1e-5)
    out3 = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    t = threading.Thread(target=fn, args=(x, out3))
    t.start()
    t.join()
    np.testing.assert_allclose(out3.numpy(), _reference(mod, [second], vm), atol=1e-5, rtol=1e-5)


@needs_openvino
def test_openvino_binds_inputs_by_name_when_it_drops_an_unused_one():
    """OpenVINO leaves out a graph input the model does not read; the others must still meet
    their arguments (in place and in the direct call)."""
    x, y = (relax.Var(n, relax.TensorType((4, 4), "float32")) for n in ("x", "y"))
    bb = relax.BlockBuilder()
    with bb.function("main", [y, x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    ys, xs = np.random.default_rng(0).standard_normal((2, 4, 4)).astype("float32")
    gname = get_backend("openvino").build(func, ONE_CORE)
    np.testing.assert_allclose(_call(gname, [ys, xs], (4, 4)), 2 * xs, rtol=1e-6)
    np.testing.assert_allclose(direct_call(gname)(ys, xs)[0], 2 * xs, rtol=1e-6)


@needs_openvino
def test_openvino_keeps_inputs_bound_across_new_views_of_the_same_memory(monkeypatch):
    """A torch tensor comes in as a new numpy view on every call: the same memory stays bound
    (no new binding); a view of other strides at the same address, or other memory, does not."""
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(out)
    call = direct_call(get_backend("openvino").build(bb.get()["main"], ONE_CORE))
    binds = []
    bind = call._bind
    monkeypatch.setattr(call, "_bind", lambda arrays: binds.append(1) or bind(arrays))
    a = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    np.testing.assert_allclose(call(a)[0], 2 * a, rtol=1e-6)
    a[0, 0] = 7.0  # the bound memory changes in place
    np.testing.assert_allclose(call(a.view())[0], 2 * a, rtol=1e-6)
    np.testing.assert_allclose(call(a[:])[0], 2 * a, rtol=1e-6)
    assert len(binds) == 1
    np.testing.assert_allclose(call(a.T)[0], 2 * a.T, rtol=1e-6)  # same address, other strides
    np.testing.assert_allclose(call(a.copy() + 1)[0], 2 * (a + 1), rtol=1e-6)  # other memory
    assert len(binds) == 3


@needs_openvino
def test_openvino_keeps_the_device_threads_affinity():
    """A device thread pinned to one core stays there through OpenVINO's calls (OpenVINO's
    own pinning would move it to every core of the process)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores to tell one core from all of them")
    mod, inputs = tiny_mlp()
    fn = OpenVinoBackend().make_callable(mod["main"], ONE_CORE)
    seen = {}

    def work():
        os.sched_setaffinity(0, {cores[-1]})
        out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
        for _ in range(3):
            fn(tvm.runtime.tensor(inputs[0]), out)
        seen["after"] = os.sched_getaffinity(0)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["after"] == {cores[-1]}


def test_parallel_backend_is_offered_regions_only():
    bk = get_backend("onnxruntime-parallel")
    assert bk.patterns() == [] and bk.graph_level
    cs = generate_candidates(from_relax(tiny_cnn()[0]), [bk])
    mine = [c for c in cs if c.backend == bk.name]
    assert mine and {c.pattern for c in mine} <= {"region", "window"}
    assert any(c.pattern == "region" for c in mine)


def test_parallel_backend_refuses_one_core_devices():
    bk = get_backend("onnxruntime-parallel")
    assert bk.supports_device(TWO_CORES) and not bk.supports_device(ONE_CORE)
    with pytest.raises(BuildError, match="two or more cores"):
        bk.build(tiny_mlp()[0]["main"], ONE_CORE)


def test_costs_of_untrained_backends():
    """``xgb`` was never trained on these backends: their candidates get the roofline estimate
    (finite), and the parallel mode is ``inf`` on one-core devices."""
    names = ["openvino", "onnxruntime-parallel"] if HAS_OPENVINO else ["onnxruntime-parallel"]
    an = tvm_pesto.analyze(tiny_cnn()[0])
    cs = tvm_pesto.make_candidates(an, "cpu:2", names)
    ct = candidate_costs(cs, parse_cluster("cpu:2"), "xgb")
    for name in names:
        rows = ct.table[[i for i, c in enumerate(cs) if c.backend == name]]
        assert len(rows)
        if name == "onnxruntime-parallel" and all(d.cores < 2 for d in parse_cluster("cpu:2").devices):
            assert np.isinf(rows).all()
        else:
            assert np.isfinite(rows).all() and (rows > 0).all()


def test_measured_costs_time_whole_regions():
    from tvm_pesto.costs.measure.measured import measure_candidates

    rg = from_relax(tiny_mlp()[0])
    nodes = tuple(range(rg.graph.num_nodes))
    names = ["openvino", "onnxruntime-parallel"] if HAS_OPENVINO else ["onnxruntime-parallel"]
    cs = CandidateSet(rg, [Candidate(n, nodes, "region") for n in names])
    costs = measure_candidates(cs, WIDE, repeat=2, min_repeat_ms=1)
    for n, c in zip(names, costs):
        if n == "onnxruntime-parallel" and WIDE.cores < 2:
            assert np.isinf(c)
        else:
            assert np.isfinite(c) and c > 0, (n, c)


def _bundle_round_trip(tmp_path, backend, kind, atol=1e-5):
    """Build tiny_mlp with ``backend`` on its first half and TVM on the rest, export, release
    every built unit, load the bundle and compare; the artifact's record and the build's
    largest error against TVM."""
    mod, (x,) = tiny_mlp()
    an = tvm_pesto.analyze(mod)
    order = an.rg.graph.topo_order()
    half = len(order) // 2
    units = [Candidate(backend, tuple(sorted(order[:half]))), Candidate("tvm", tuple(sorted(order[half:])))]
    pm = tvm_pesto.build(mod, "cpu:1", plan=Plan([0, 0], [[0, 1]], units=units))
    try:
        assert backend in pm.plan.backend_mix()
        want = pm(x)
        err = float(np.max(np.abs(want - _reference(mod, [x]))))
        np.testing.assert_allclose(want, _reference(mod, [x]), atol=atol, rtol=atol)
        path = pm.export(str(tmp_path / "bundle"))
        man = json.loads(Path(path, "manifest.json").read_text())
        arts = [a for a in man["artifacts"] if a["backend"] == backend]
        assert [a["kind"] for a in arts] == [kind]
        assert release_all() >= 1
        loaded = tvm_pesto.load(path)
        try:
            np.testing.assert_allclose(loaded(x), want, atol=1e-6, rtol=1e-6)
        finally:
            loaded.close()
    finally:
        pm.close()
    return arts[0], err


@pytest.mark.slow
@needs_openvino
def test_openvino_bundle_exports_and_loads(tmp_path):
    art, _ = _bundle_round_trip(tmp_path, "openvino", "openvino")
    assert "precision" not in art  # float32: the loader's default
    assert art["files"][0].endswith(".onnx") and "openvino" in LOADERS


@pytest.mark.slow
def test_parallel_bundle_exports_and_loads(tmp_path):
    if WIDE.cores < 2:
        pytest.skip("onnxruntime-parallel needs a device of two or more cores (this machine has one)")
    art, _ = _bundle_round_trip(tmp_path, "onnxruntime-parallel", "onnx")
    assert art["parallel"] is True


@pytest.mark.slow
@needs_openvino
def test_build_runs_a_whole_tiny_model_in_openvino():
    """``build(mod, "cpu:1", backends=["openvino"])``: the whole model as one OpenVINO unit is
    an option that builds, runs and is timed, and the model built as that unit computes the
    reference."""
    from tvm_pesto.choose import whole_model_placement

    mod, (x,) = tiny_cnn()
    ref = _reference(mod, [x])
    n = tvm_pesto.analyze(mod).op_graph.num_nodes
    pm = tvm_pesto.build(mod, "cpu:1", backends=["openvino"], costs="roofline", measure_final=True)
    try:
        opts = {o["name"]: o for o in pm.decision.to_json()["options"]}
        lib = opts.get("library:openvino", opts["plan"])  # where the flow's plan is that unit, it stands for it
        assert lib["backend_mix"] == {"openvino": n} and lib["measured_s"] > 0, lib
        np.testing.assert_allclose(pm(x), ref, atol=1e-5, rtol=1e-5)
    finally:
        pm.close()
    whole = whole_model_placement(tvm_pesto.place(mod, "cpu:1", backends=["openvino"], costs="roofline"),
                                  "openvino", parse_cluster("cpu:1"))
    pm = tvm_pesto.build(mod, "cpu:1", plan=whole.plan)
    try:
        assert pm.plan.backend_mix() == {"openvino": n}
        np.testing.assert_allclose(pm(x), ref, atol=1e-5, rtol=1e-5)  # numpy: OpenVINO's own call
        np.testing.assert_allclose(pm(tvm.runtime.tensor(x)).numpy(), ref, atol=1e-5, rtol=1e-5)
    finally:
        pm.close()


BF16 = backend_status(["openvino-bf16"])["openvino-bf16"]


def test_bfloat16_is_offered_only_when_named_and_says_why_not():
    usable, why = available_backends(None)
    assert "openvino-bf16" not in [b.name for b in usable] + list(why)
    ok, reason = BF16
    assert ok or "bfloat16" in reason or "openvino" in reason, reason


@needs_openvino
def test_bfloat16_on_a_cpu_without_it_names_the_backend_to_use(monkeypatch):
    import openvino as ov

    from tvm_pesto.backends.openvino import OpenVinoBf16Backend

    class Core:
        available_devices = ["CPU"]

        def get_property(self, device, name):
            return ["FP32", "INT8", "EXPORT_IMPORT"]

    monkeypatch.setattr(ov, "Core", Core)
    ok, why = OpenVinoBf16Backend().available()
    assert not ok and "no bfloat16 units" in why and "FP32, INT8" in why and "use the openvino backend" in why


@pytest.mark.slow
@pytest.mark.skipif(not BF16[0], reason=f"openvino-bf16 is unavailable here: {BF16[1]}")
def test_bfloat16_computes_in_bfloat16_and_its_bundle_keeps_the_precision(tmp_path):
    art, err = _bundle_round_trip(tmp_path, "openvino-bf16", "openvino", atol=0.1)
    assert art["precision"] == "bf16" and art["files"][0].endswith(".onnx")
    assert err > 1e-5  # not float32's 1e-7: bfloat16 keeps 8 bits of mantissa


def test_available_backends_offers_both_on_cpu():
    usable, why = available_backends(["onnxruntime-parallel", "openvino"], device_kind="cpu")
    assert "onnxruntime-parallel" in [b.name for b in usable]
    assert ("openvino" in [b.name for b in usable]) == HAS_OPENVINO, why
