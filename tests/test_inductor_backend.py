"""The ``inductor`` backend (TorchInductor on the CPU): its status and the reasons it gives when
the C++ compiler or PyTorch is missing, region-only candidates costed as ``torch`` units, a whole
model compiled into one unit against TVM, and a bundle of AOTInductor packages loaded in a fresh
process that cannot compile."""
import builtins
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_pesto
from tvm_pesto.backends import available_backends, backend_status, get_backend, list_backends
from tvm_pesto.backends.base import BackendUnavailableError
from tvm_pesto.backends.inductor import InductorBackend
from tvm_pesto.candidates import generate_candidates
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.candidates.generate import Candidate
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs import candidate_costs
from tvm_pesto.graph.relax_import import from_relax
from tvm_pesto.plan import Plan

#: Inductor compiles C++ with the machine's compiler: without one, these tests cannot build.
AVAILABLE, WHY = InductorBackend().available()
needs_inductor = pytest.mark.skipif(not AVAILABLE, reason=f"inductor is unavailable here: {WHY}")


def _reference(mod, inputs):
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def test_inductor_is_listed_with_its_status():
    assert "inductor" in list_backends()
    ok, why = backend_status(["inductor"])["inductor"]
    assert (ok, why) == (AVAILABLE, WHY)
    assert ok or why


def test_all_leaves_it_out_and_naming_it_offers_it():
    """Each candidate is a compile of seconds: ``all`` does not offer it, naming it does."""
    assert "inductor" not in [b.name for b in available_backends()[0]]
    named, why = available_backends(["tvm", "inductor"])
    assert ("inductor" in [b.name for b in named]) == AVAILABLE, why


def test_a_missing_compiler_is_named_with_the_fix():
    """Inductor's own compiler search (``cpp.cxx``, each candidate run with ``--version``)."""
    from torch._inductor import config

    with config.patch({"cpp.cxx": ("pesto-no-such-c++",)}):
        ok, why = InductorBackend().available()
    assert not ok
    assert "C++ compiler" in why and "pesto-no-such-c++" in why and "CXX" in why


def test_missing_torch_is_named_and_stops_a_build(monkeypatch):
    real_import = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch' (simulated)")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    bk = InductorBackend()
    ok, why = bk.available()
    assert not ok and "pip install torch" in why and "simulated" in why
    with pytest.raises(BackendUnavailableError, match="'inductor' is unavailable.*pip install torch"):
        bk.build(tiny_mlp()[0]["main"], parse_cluster("cpu:1").devices[0])


def test_candidates_are_regions_costed_as_torch():
    """Regions and windows of the torch backend's ops, no op-level chains; ``xgb`` predicts
    them as ``torch`` units (finite, positive) until it is trained on Inductor."""
    bk = get_backend("inductor")
    assert bk.patterns() == [] and bk.graph_level and bk.cost_proxy == "torch"
    rg = from_relax(tiny_cnn()[0])
    cs = generate_candidates(rg, [bk])
    mine = [c for c in cs if c.backend == "inductor"]
    assert mine and {c.pattern for c in mine} <= {"region", "window"}
    assert any(len(c.nodes) == rg.graph.num_nodes for c in mine)  # every op of tiny_cnn is supported
    an = tvm_pesto.analyze(tiny_cnn()[0])
    cs = tvm_pesto.make_candidates(an, "cpu:1", ["inductor"])
    rows = candidate_costs(cs, parse_cluster("cpu:1"), "xgb").table[[i for i, c in enumerate(cs)
                                                                     if c.backend == "inductor"]]
    assert len(rows) and np.isfinite(rows).all() and (rows > 0).all()


@pytest.mark.slow
@needs_inductor
def test_whole_model_is_one_inductor_unit_matching_tvm():
    """``place(..., backends=["inductor"])`` then the whole model as one Inductor unit: built
    (compiled at build time, its seconds recorded) and run by the placed module within 1e-4."""
    from tvm_pesto.choose import whole_model_placement

    mod, (x,) = tiny_cnn()
    ref = _reference(mod, [x])
    n = tvm_pesto.analyze(mod).op_graph.num_nodes
    whole = whole_model_placement(tvm_pesto.place(mod, "cpu:1", backends=["inductor"], costs="roofline"),
                                  "inductor", parse_cluster("cpu:1"))
    assert whole is not None
    pm = tvm_pesto.build(mod, "cpu:1", plan=whole.plan)
    try:
        assert pm.plan.backend_mix() == {"inductor": n}
        np.testing.assert_allclose(pm(x), ref, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(pm(x), ref, atol=1e-4, rtol=1e-4)  # a second call does not compile again
        units = list(pm.units.values())
        assert [u.backend for u in units] == ["inductor"] and units[0].fn.build_s > 0
    finally:
        pm.close()


#: Run in a fresh process: load the bundle with every C++ build of Inductor failing loudly.
_LOAD_WITHOUT_COMPILING = textwrap.dedent("""
    import sys
    import numpy as np
    import torch._inductor.cpp_builder as cpp_builder

    def refuse(*a, **k):
        raise RuntimeError("the bundle tried to compile C++")

    cpp_builder.CppBuilder.build = refuse
    import torch._inductor.compile_fx as compile_fx
    compile_fx.compile_fx = refuse
    import tvm_pesto

    bundle, x_path, out_path = sys.argv[1:4]
    m = tvm_pesto.load(bundle)
    try:
        np.save(out_path, m(np.load(x_path)))
    finally:
        m.close()
""")


@pytest.mark.slow
@needs_inductor
def test_bundle_of_aot_packages_loads_in_a_fresh_process_without_compiling(tmp_path):
    """Half of tiny_mlp on Inductor, the rest on TVM: built, exported (an AOTInductor ``.pt2``
    for the Inductor unit), loaded in a new process where compiling C++ raises and no
    compiler is on ``$CXX``: the same outputs."""
    mod, (x,) = tiny_mlp()
    an = tvm_pesto.analyze(mod)
    order = an.rg.graph.topo_order()
    half = len(order) // 2
    units = [Candidate("inductor", tuple(sorted(order[:half])), "region"),
             Candidate("tvm", tuple(sorted(order[half:])))]
    pm = tvm_pesto.build(mod, "cpu:1", plan=Plan([0, 0], [[0, 1]], units=units))
    try:
        assert "inductor" in pm.plan.backend_mix()
        want = pm(x)
        np.testing.assert_allclose(want, _reference(mod, [x]), atol=1e-4, rtol=1e-4)
        path = pm.export(str(tmp_path / "bundle"))
    finally:
        pm.close()
    man = json.loads(Path(path, "manifest.json").read_text())
    arts = [a for a in man["artifacts"] if a["backend"] == "inductor"]
    assert [a["kind"] for a in arts] == ["inductor-aoti"] and arts[0]["files"][0].endswith(".pt2")
    np.save(tmp_path / "x.npy", x)
    scratch = tmp_path / "tmpdir"  # the process's $TMPDIR: PyTorch unpacks the package there
    scratch.mkdir()
    env = {**os.environ, "CXX": "pesto-no-such-c++", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "empty-cache"),
           "TMPDIR": str(scratch)}
    res = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_COMPILING, path, str(tmp_path / "x.npy"),
                          str(tmp_path / "got.npy")], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), want, atol=1e-6, rtol=1e-6)
    left = [p.name for p in scratch.iterdir() if p.name.startswith(("aotinductor_", "tvm-pesto-aoti-"))]
    assert not left, f"the unpacked package outlived the process: {left}"
