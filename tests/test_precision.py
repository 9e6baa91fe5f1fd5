"""``precision``: float32 by default; ``bf16`` lets the backends that compute in bfloat16 on
this CPU compete, through every entry point, or says why none can."""
import pytest

import tvm_pesto
from tvm_pesto.backends import backend_status
from tvm_pesto.candidates import flow
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.errors import PestoError

BF16_OK, BF16_WHY = backend_status(["openvino-bf16"])["openvino-bf16"]


def test_fp32_leaves_the_backends_as_asked_and_an_unknown_precision_is_named():
    assert flow.with_precision("all", "fp32") == "all"
    assert flow.with_precision("tvm,onnxruntime", "fp32") == "tvm,onnxruntime"
    with pytest.raises(PestoError, match="unknown precision 'fp8'; use one of fp32, bf16"):
        flow.with_precision("all", "fp8")


def test_bf16_adds_the_reduced_precision_backends_or_says_why_none_can_run(monkeypatch):
    if BF16_OK:
        assert flow.with_precision("all", "bf16") == ["all", "openvino-bf16"]
        assert flow.with_precision("tvm,onnxruntime", "bf16") == ["tvm", "onnxruntime", "openvino-bf16"]
    else:
        with pytest.raises(PestoError, match="no backend can compute in bfloat16 on this CPU"):
            flow.with_precision("all", "bf16")
    monkeypatch.setattr(flow, "backend_status", lambda names: {n: (False, "no bf16 units") for n in names})
    with pytest.raises(PestoError, match=r"precision bf16: .*openvino-bf16: no bf16 units.*use precision fp32"):
        flow.with_precision("all", "bf16")


def test_build_and_place_take_precision():
    mod, _ = tiny_mlp()
    pl = tvm_pesto.place(mod, "cpu:1", costs="roofline", deterministic=True)
    assert "openvino-bf16" not in {c.backend for c in pl.candidates}
    if not BF16_OK:
        with pytest.raises(PestoError, match="bfloat16"):
            tvm_pesto.build(mod, "cpu:1", costs="roofline", measure_final=False, precision="bf16")
        return  # the error is the answer on a CPU without bfloat16 units
    pl = tvm_pesto.place(mod, "cpu:1", costs="roofline", deterministic=True, precision="bf16")
    assert "openvino-bf16" in {c.backend for c in pl.candidates}
    placed = tvm_pesto.build(mod, "cpu:1", costs="roofline", measure_final=False, precision="bf16")
    assert "openvino-bf16" in {c.backend for c in placed.placement.candidates}


def test_the_pass_in_tvm_compile_takes_precision():
    import tvm

    from tvm_pesto.api import PlacementPass

    mod, _ = tiny_mlp()
    p = PlacementPass("cpu:1", costs="roofline", measure_final=False, deterministic=True, precision="bf16")
    if not BF16_OK:
        with pytest.raises(PestoError, match="bfloat16"):
            tvm.transform.Sequential([p])(mod)
        return  # the error is the answer on a CPU without bfloat16 units
    tvm.transform.Sequential([p])(mod)
    assert "openvino-bf16" in {c.backend for c in p.last_placement.candidates}
