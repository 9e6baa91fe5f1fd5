"""ONNX Runtime's workers spin only where the session runs alone on every core: the direct
call of a one-unit program; never the DPS call that shares its device with other units."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_pesto.backends.onnx_export.export import relax_to_onnx
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.run.libraries import loaders
import onnxruntime  # noqa: F401 - a required dependency: a broken install fails, it does not skip


@pytest.fixture
def model_bytes():
    mod, inputs = tiny_mlp()
    return relax_to_onnx(mod["main"]).SerializeToString(), inputs


def _record(monkeypatch):
    made = []
    real = loaders.onnx_session

    def session(model, cores, parallel=False, spin=False):
        sess = real(model, cores, parallel=parallel, spin=spin)
        made.append(sess.get_session_options().get_session_config_entry("session.intra_op.allow_spinning"))
        return sess

    monkeypatch.setattr(loaders, "onnx_session", session)
    return made


@pytest.mark.parametrize("owns", [True, False])
def test_only_the_direct_call_on_every_core_spins(monkeypatch, model_bytes, owns):
    model, inputs = model_bytes
    made = _record(monkeypatch)
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: owns)
    run = loaders.onnx_runner(model, 2)
    assert made == ["0"]  # the DPS session, shared with other units
    (out,) = run.direct(*inputs)
    (again,) = run.direct(*inputs)
    assert made == (["0", "1"] if owns else ["0"])  # the spinning session is made once, on first use
    np.testing.assert_array_equal(out, again)


def test_the_spinning_session_is_made_when_asked_not_in_the_first_call(monkeypatch, model_bytes):
    # a program of this one unit prepares it when made: its first call is a call (a session made
    # inside it ran 20x a call and read as a runaway to the final choice)
    model, inputs = model_bytes
    made = _record(monkeypatch)
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: True)
    run = loaders.onnx_runner(model, 2)
    run.direct.prepare()
    assert made == ["0", "1"]
    run.direct.prepare()
    (out,) = run.direct(*inputs)
    assert made == ["0", "1"]
    np.testing.assert_array_equal(out, loaders.onnx_runner(model, 1).direct(*inputs)[0])


def test_one_core_never_spins(monkeypatch, model_bytes):
    model, inputs = model_bytes
    made = _record(monkeypatch)
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: True)
    loaders.onnx_runner(model, 1).direct(*inputs)
    assert made == ["0"]


def test_direct_and_dps_calls_agree(model_bytes):
    import tvm

    model, inputs = model_bytes
    run = loaders.onnx_runner(model, 2)
    (want,) = run.direct(*inputs)
    out = tvm.runtime.empty(want.shape, "float32", tvm.cpu())
    run(*[tvm.runtime.tensor(a) for a in inputs], out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)


def _live_sessions(monkeypatch):
    import weakref

    live = []
    real = loaders.onnx_session

    def session(model, cores, parallel=False, spin=False):
        sess = real(model, cores, parallel=parallel, spin=spin)
        live.append(weakref.ref(sess))
        return sess

    monkeypatch.setattr(loaders, "onnx_session", session)
    return lambda: sum(r() is not None for r in live)


def test_a_unit_called_only_directly_keeps_one_session(monkeypatch, model_bytes):
    # each session holds the weights and their prepacked copies: the whole model called
    # directly drops the DPS session it was built with; a later DPS call runs the spinning one
    import gc

    import tvm

    model, inputs = model_bytes
    live = _live_sessions(monkeypatch)
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: True)
    run = loaders.onnx_runner(model, 2)
    (want,) = run.direct(*inputs)
    gc.collect()
    assert live() == 1
    out = tvm.runtime.empty(want.shape, "float32", tvm.cpu())
    run(*[tvm.runtime.tensor(a) for a in inputs], out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)


def test_a_unit_called_through_dps_first_keeps_both_sessions(monkeypatch, model_bytes):
    import gc

    import tvm

    model, inputs = model_bytes
    (want,) = loaders.onnx_runner(model, 1).direct(*inputs)
    live = _live_sessions(monkeypatch)
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: True)
    run = loaders.onnx_runner(model, 2)
    out = tvm.runtime.empty(want.shape, "float32", tvm.cpu())
    run(*[tvm.runtime.tensor(a) for a in inputs], out)  # a DPS call first (the measurement's warm-up)
    (direct,) = run.direct(*inputs)
    gc.collect()
    assert live() == 2
    np.testing.assert_allclose(out.numpy(), direct, rtol=1e-6, atol=1e-6)
