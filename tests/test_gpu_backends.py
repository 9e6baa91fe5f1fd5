"""GPU backends: everything that needs no GPU runs here; GPU-only tests skip with the reason.

- ONNX exporter: op-level functions and whole zoo models, checked with onnx.checker and run
  with ONNX Runtime against TVM (CPU).
- TVM-CUDA: modules compile for sm_70/80/90 and export; nvcc compiles the generated CUDA.
- Pattern coverage with TVM's registered cuBLAS/cuDNN/TensorRT patterns and checks.
- cuBLAS GEMM plans and cuDNN convolution plans, emulated in NumPy, against TVM.
- TensorRT: ONNX models of the partitioned regions are valid and compute what TVM computes.
- Probes and streams.
- The device check (tests/gpu/): --prepare, --dry-run (healthy and with a backend broken on purpose),
  the prepared folder loaded runtime-only in a fresh process, the runner's library replays on CPU stand-ins.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.backends import BackendUnavailableError, get_backend
from tvm_pesto.backends.base import MatchContext, instance_key
from tvm_pesto.backends.gpu import cublas, cudnn, patterns, tensorrt, tvm_cuda
from tvm_pesto.cluster import gpu_probe as probe
from tvm_pesto.backends.onnx_export.export import OnnxExportError, flatten_args, relax_to_onnx
from tvm_pesto.backends.onnx_export.ops import supports_call
from tvm_pesto.builder.lower import lower_units
from tvm_pesto.candidates import candidate_function
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import BuildError, ExecutionError
from tvm_pesto.graph.relax_import import from_relax
from tvm_pesto.run.thread import streams

ROOT = Path(__file__).resolve().parents[1]
GPU_OK, GPU_WHY = probe.tvm_cuda_runtime()
needs_gpu = pytest.mark.skipif(not GPU_OK, reason=f"needs a CUDA GPU: {GPU_WHY}")
no_gpu_only = pytest.mark.skipif(GPU_OK, reason="checks the no-GPU messages; this machine has a GPU")
LLVM = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def _rg(name):
    return from_relax(zoo.load(name, "small").mod)


def _cpu_vm(funcs: dict):
    mod = tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in funcs.items()})
    ex = tvm.compile(mod, target=LLVM, relax_pipeline=relax.get_default_pipeline(LLVM))
    return relax.VirtualMachine(ex, tvm.cpu())


def _np_args(params, rng):
    out = []
    for p in params:
        ty = p.ty
        if isinstance(ty, relax.TensorType):
            out.append(rng.standard_normal([int(s) for s in ty.shape.values]).astype(str(ty.dtype)))
        else:
            out.append(tuple(_np_args([relax.Var("f", f) for f in ty.fields], rng)))
    return out


def _tvm(a):
    return tuple(_tvm(x) for x in a) if isinstance(a, tuple) else tvm.runtime.tensor(a)


def _numpy(v):
    if isinstance(v, tvm.runtime.Tensor):
        return v.numpy()
    return [_numpy(x) for x in v]


def _ort(model, args):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), flatten_args(args))})


# -- ONNX exporter: op-level functions ---------------------------------------------------------
def _fn(build, *shapes, dtype="float32"):
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *xs))
        bb.emit_func_output(out)
    return bb.get()["main"]


def _c(*shape, seed=1):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


op = relax.op
OP_CASES = {
    "conv2d_bias_relu": (lambda bb, x: op.nn.relu(op.add(op.nn.conv2d(x, _c(6, 3, 3, 3), strides=2, padding=(1, 0, 2, 1)),
                                                         op.reshape(_c(6), (1, 6, 1, 1)))), [(1, 3, 9, 8)]),
    "conv2d_grouped_dilated": (lambda bb, x: op.nn.conv2d(x, _c(4, 1, 3, 3), padding=2, dilation=2, groups=4),
                               [(1, 4, 8, 8)]),
    "matmul_dense": (lambda bb, x: op.add(op.matmul(x, op.permute_dims(_c(5, 7))), _c(5)), [(2, 3, 7)]),
    "batch_matmul": (lambda bb, x, y: op.matmul(x, y), [(2, 4, 3), (2, 3, 5)]),
    "activations": (lambda bb, x: op.add(op.add(op.nn.gelu(x), op.sigmoid(x)), op.add(op.tanh(x), op.nn.gelu_tanh(x))),
                    [(3, 8)]),
    "silu_rsqrt_clip": (lambda bb, x: op.add(op.nn.silu(x), op.clip(op.rsqrt(op.add(op.abs(x), _c(1))), 0.1, 2.0)),
                        [(4, 5)]),
    "softmax_layer_norm": (lambda bb, x: op.nn.softmax(op.nn.layer_norm(x, _c(6), _c(6, seed=2), axes=[-1]), axis=1),
                           [(2, 3, 6)]),
    "pools": (lambda bb, x: op.concat([op.nn.max_pool2d(x, 3, 2, padding=1),
                                       op.nn.avg_pool2d(x, 3, 2, padding=1, count_include_pad=True)], axis=1),
              [(1, 2, 9, 9)]),
    "adaptive_mean": (lambda bb, x: op.add(op.reshape(op.nn.adaptive_avg_pool2d(x, 1), (1, 3)),
                                           op.mean(x, axis=[2, 3])), [(1, 3, 5, 5)]),
    "reshape_permute_broadcast": (lambda bb, x: op.broadcast_to(op.permute_dims(op.reshape(x, (3, 2, 4)), [2, 0, 1]),
                                                                (2, 4, 3, 2)), [(6, 4)]),
    "elementwise": (lambda bb, x, y: op.maximum(op.subtract(op.multiply(x, y), op.divide(x, op.add(op.exp(y), _c(1)))),
                                                op.negative(y)), [(3, 4), (3, 4)]),
    "split_tuple": (lambda bb, x: relax.Tuple([bb.emit(relax.TupleGetItem(bb.emit(op.split(x, [1, 3], axis=1)), i))
                                               for i in range(3)]), [(2, 5)]),
    "batch_norm_eval": (lambda bb, x: relax.TupleGetItem(bb.emit(op.nn.batch_norm(
        x, _c(3), _c(3, seed=2), _c(3, seed=3), op.abs(_c(3, seed=4)), axis=1, epsilon=1e-5)), 0), [(2, 3, 4, 4)]),
    "batch_norm_training": (lambda bb, x: bb.emit(op.nn.batch_norm(
        x, _c(3), _c(3, seed=2), _c(3, seed=3), op.abs(_c(3, seed=4)), axis=1, epsilon=1e-5, training=True)),
        [(2, 3, 4, 4)]),
    "slice_take_squeeze": (lambda bb, x: op.squeeze(op.take(op.strided_slice(x, [2], [1], [7], [2]),
                                                            relax.const(np.array([2, 0], "int64")), axis=2), [0]),
                           [(1, 3, 8)]),
}


@pytest.fixture(scope="module")
def op_cases():
    funcs = {name: _fn(build, *shapes) for name, (build, shapes) in OP_CASES.items()}
    return funcs, _cpu_vm(funcs)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OP_CASES))
def test_onnx_export_matches_tvm(op_cases, name):
    funcs, vm = op_cases
    func = funcs[name]
    model = relax_to_onnx(func)
    onnx.checker.check_model(model, full_check=True)
    assert not any(n.op_type == "Constant" for n in model.graph.node)
    args = _np_args(func.params, np.random.default_rng(0))
    ref = vm[name](*[_tvm(a) for a in args])
    refs = _numpy(ref)
    refs = refs if isinstance(refs, list) else [refs]
    got = _ort(model, args)
    assert len(got) == len(refs)
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_onnx_constants_become_initializers():
    func = _fn(lambda bb, x: op.add(op.multiply(x, _c(4)), _c(4, seed=3)), (2, 4))
    model = relax_to_onnx(func)
    assert len(model.graph.initializer) == 2
    assert [i.name for i in model.graph.input] == ["x0"]
    assert [n.op_type for n in model.graph.node] == ["Mul", "Add"]


def test_onnx_unsupported_op_is_explained():
    func = _fn(lambda bb, x: op.cumprod(x, axis=0), (3, 2))
    assert not supports_call(func.body.blocks[0].bindings[0].value)
    with pytest.raises(OnnxExportError, match="relax.cumprod"):
        relax_to_onnx(func)
    nhwc = _fn(lambda bb, x: op.nn.conv2d(x, _c(2, 3, 3, 3), data_layout="NHWC", kernel_layout="OHWI"), (1, 5, 5, 3))
    assert not supports_call(nhwc.body.blocks[0].bindings[0].value)
    with pytest.raises(OnnxExportError, match="NCHW"):
        relax_to_onnx(nhwc)


@pytest.mark.slow
def test_onnx_export_zoo_models_match_tvm_and_torch():
    m = zoo.load("mlp_mixer", "small")
    model = relax_to_onnx(m.mod["main"])
    onnx.checker.check_model(model, full_check=True)
    (got,) = _ort(model, list(m.example_inputs))
    vm = _cpu_vm({"main": m.mod["main"]})
    ref = vm["main"](*[tvm.runtime.tensor(a) for a in m.example_inputs]).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    r = zoo.load("resnet50", "small")
    model = relax_to_onnx(r.mod["main"])
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.initializer) > 50
    (got,) = _ort(model, list(r.example_inputs))
    np.testing.assert_allclose(got, zoo.torch_reference(r), rtol=1e-4, atol=1e-4)


# -- TVM-CUDA ------------------------------------------------------------------------------
@pytest.mark.slow
def test_tvm_cuda_models_compile_and_export(tmp_path):
    for name, arch in (("mlp_mixer", "sm_80"), ("vgg11", "sm_90")):
        ex = tvm_cuda.compile_cuda(zoo.load(name, "small").mod, arch, what=name)
        path = tvm_cuda.export_cuda(ex, tmp_path / f"{name}_{arch}.so")
        assert path.stat().st_size > 100_000
        (src,) = tvm_cuda.cuda_sources(ex)
        assert src.count("__global__") >= 5


@pytest.mark.slow
def test_tvm_cuda_captures_cuda_graphs_unless_told_not_to():
    """``compile_cuda`` captures the static parts of ``main`` into CUDA graphs by default (on an
    H200 the small zoo models' ``main`` took 4-23 % less time; docs/gpu.md), not with
    ``cuda_graph=False`` nor inside a PassContext that turns ``relax.backend.use_cuda_graph``
    off, and keeps the caller's PassContext settings."""
    mod = zoo.load("vgg11", "small").mod
    text = {cg: tvm_cuda.compile_cuda(mod, "sm_90", cuda_graph=cg).as_text() for cg in (None, True, False)}
    assert "vm.builtin.cuda_graph.run_or_capture" in text[None] and text[None] == text[True]
    assert "cuda_graph" not in text[False]
    with tvm.transform.PassContext(opt_level=3, config={"relax.backend.use_cuda_graph": False}):
        off = tvm_cuda.compile_cuda(mod, "sm_90").as_text()
        on = tvm_cuda.compile_cuda(mod, "sm_90", cuda_graph=True).as_text()
        assert tvm.transform.PassContext.current().config["relax.backend.use_cuda_graph"] is False
    assert "cuda_graph" not in off and "vm.builtin.cuda_graph.run_or_capture" in on


@pytest.mark.slow
def test_tvm_cuda_groups_for_each_arch_and_nvcc(tmp_path):
    from tvm_pesto.graph.fusion import fusion_groups

    rg = _rg("resnet50")
    groups = fusion_groups(rg.graph)[:5]
    mod = tvm.IRModule({f"g{i}": candidate_function(rg, g).func.with_attr("global_symbol", f"g{i}")
                        for i, g in enumerate(groups)})
    sources = {}
    for arch in ("sm_70", "sm_80", "sm_90"):
        ex = tvm_cuda.compile_cuda(mod, {"kind": "cuda", "arch": arch})
        tvm_cuda.export_cuda(ex, tmp_path / f"groups_{arch}.so")
        (sources[arch],) = tvm_cuda.cuda_sources(ex)
    if not probe.nvcc_archs():
        pytest.skip("nvcc is not on PATH: generated CUDA compiled by TVM only, not checked with nvcc")
    cubin = tvm_cuda.nvcc_check(sources["sm_90"], "sm_90", tmp_path)
    assert cubin.stat().st_size > 1000
    if "sm_70" not in probe.nvcc_archs():
        with pytest.raises(BuildError, match="sm_70"):
            tvm_cuda.nvcc_check(sources["sm_70"], "sm_70", tmp_path)


def test_tvm_cuda_metaschedule_database(tmp_path):
    from tvm.s_tir import meta_schedule as ms

    func = _fn(lambda bb, x: op.nn.relu(op.matmul(x, _c(16, 8))), (4, 16))
    mod = tvm.IRModule({"main": func})
    ms.database.JSONDatabase(work_dir=str(tmp_path))  # an empty database: every kernel falls back to dlight
    ex = tvm_cuda.compile_cuda(mod, "A100", database=tmp_path)
    assert tvm_cuda.cuda_sources(ex)[0].count("__global__") >= 1
    with pytest.raises(BuildError, match="no MetaSchedule database"):
        tvm_cuda.compile_cuda(mod, "sm_80", database=tmp_path / "missing")
    with pytest.raises(BuildError, match="unknown CUDA target"):
        tvm_cuda.cuda_target("K80")


# -- pattern coverage --------------------------------------------------------------------------
def _fuse_ops_by_pattern_count(mod, prefix):
    fused = relax.transform.FuseOpsByPattern(patterns.registry_patterns(prefix), bind_constants=False,
                                             annotate_codegen=False)(mod)
    return sum(1 for b in fused["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.GlobalVar))


@pytest.mark.parametrize("name,lib,op_name", [("bert", "cublas", "relax.matmul"),
                                              ("resnet50", "cudnn", "relax.nn.conv2d")])
def test_pattern_coverage(name, lib, op_name):
    rg = _rg(name)
    cov = patterns.coverage(rg)
    every = {v for v, nd in enumerate(rg.graph.nodes) if nd.op == op_name}
    assert every and every <= set(cov[lib]["nodes"]), f"{lib} must match every {op_name} in {name}"
    assert cov["tensorrt"]["matches"] > 0
    for lib_name, c in cov.items():
        # same number of matches as TVM's own FuseOpsByPattern, nodes disjoint, ops in the patterns
        assert c["matches"] == _fuse_ops_by_pattern_count(rg.mod, lib_name)
        ms = patterns.match_nodes(rg, lib_name)
        flat = [v for m in ms for v in m.nodes]
        assert len(flat) == len(set(flat))
        assert {rg.graph.nodes[v].op for v in flat} <= patterns.ops_in_patterns(lib_name)


def test_backend_pattern_checks_run_tvm_checks():
    entries = {n: (p, chk) for n, p, chk in get_backend("cublas").patterns()}
    pat, check = entries["cublas.matmul"]
    for dtype, expect in (("float32", True), ("int32", False)):
        func = _fn(lambda bb, x, y: op.matmul(x, y), (4, 8), (8, 3), dtype=dtype)
        call = func.body.blocks[0].bindings[0].value
        var2val = relax.analysis.get_var2val(func)
        assert pat.match(call, var2val)
        matched = pat.extract_matched_expr(call, var2val)
        ctx = MatchContext(root=call, calls=[call], annotated_expr={"matmul": call}, matched=dict(matched))
        assert check(ctx) is expect
    names = [n for n, _, _ in get_backend("cudnn").patterns()]
    assert names and all(n.startswith("cudnn.conv2d") for n in names)


# -- cuBLAS plans ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "mlp_mixer", "vgg11"])
def test_cublas_plans_match_tvm(name):
    rg = _rg(name)
    ms = patterns.match_nodes(rg, "cublas")
    assert ms
    segs = [candidate_function(rg, m.nodes, lift_constants=(i % 2 == 0)) for i, m in enumerate(ms)]
    vm = _cpu_vm({f"f{i}": s.func for i, s in enumerate(segs)})
    rng = np.random.default_rng(0)
    epilogues = Counter()
    for i, (m, s) in enumerate(zip(ms, segs)):
        plan = cublas.plan_gemm(s.func)
        epilogues[plan.epilogue] += 1
        args = _np_args(s.func.params, rng)
        ref = vm[f"f{i}"](*[_tvm(a) for a in args]).numpy()
        # cuBLASLt's GELU epilogue is the tanh form; Relax's gelu is erf-based
        tol = 2e-3 if plan.epilogue.startswith("gelu") else 1e-4
        np.testing.assert_allclose(cublas.emulate_gemm(plan, args), ref, rtol=tol, atol=tol, err_msg=m.pattern)
    assert "bias" in epilogues


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 6), n=st.integers(1, 6), k=st.integers(1, 6), batch=st.sampled_from([(), (3,), (2, 2)]),
       rhs_batched=st.booleans(), transposed=st.booleans(), epi=st.sampled_from(["none", "bias", "relu_bias"]))
def test_cublas_plan_layouts(m, n, k, batch, rhs_batched, transposed, epi):
    rhs_shape = (batch if rhs_batched else ()) + ((n, k) if transposed else (k, n))
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    w = rng.standard_normal(rhs_shape).astype("float32")
    bias = rng.standard_normal(n).astype("float32")

    def build(bb, x):
        wt = relax.const(w)
        if transposed:
            nd = len(rhs_shape)
            wt = bb.emit(op.permute_dims(wt, list(range(nd - 2)) + [nd - 1, nd - 2]))
        y = op.matmul(x, wt)
        if epi != "none":
            y = op.add(bb.emit(y), relax.const(bias))
        if epi == "relu_bias":
            y = op.nn.relu(bb.emit(y))
        return y

    func = _fn(build, batch + (m, k))
    x = rng.standard_normal(batch + (m, k)).astype("float32")
    plan = cublas.plan_gemm(func)
    ref = x @ (np.swapaxes(w, -1, -2) if transposed else w)
    if epi != "none":
        ref = ref + bias
    if epi == "relu_bias":
        ref = np.maximum(ref, 0)
    np.testing.assert_allclose(cublas.emulate_gemm(plan, [x]), ref, rtol=1e-5, atol=1e-5)
    assert plan.batch == (int(np.prod(batch)) if rhs_batched and batch else 1)


def test_cublas_plan_rejects_other_subgraphs():
    with pytest.raises(BuildError, match="one matmul"):
        cublas.plan_gemm(_fn(lambda bb, x: op.nn.relu(x), (2, 2)))
    with pytest.raises(BuildError, match="float32/float16/bfloat16"):
        cublas.plan_gemm(_fn(lambda bb, x, y: op.matmul(x, y), (2, 4), (4, 2), dtype="int32"))


# -- cuDNN plans -----------------------------------------------------------------------------
CONV_CASES = {
    "strided_asym_pad": (lambda bb, x: op.nn.conv2d(x, _c(5, 3, 3, 2), strides=(2, 1), padding=(1, 0, 2, 1)), (1, 3, 9, 8)),
    "depthwise_dilated_bias_relu": (lambda bb, x: op.nn.relu(op.add(
        op.nn.conv2d(x, _c(4, 1, 3, 3), padding=2, dilation=2, groups=4), op.reshape(_c(4), (1, 4, 1, 1)))), (2, 4, 7, 7)),
    "nhwc_bias": (lambda bb, x: op.add(op.nn.conv2d(x, _c(6, 3, 3, 3), padding=1, data_layout="NHWC",
                                                    kernel_layout="OHWI"), _c(6)), (1, 5, 5, 3)),
}


@pytest.mark.slow
def test_cudnn_plans_match_tvm():
    rg = _rg("vgg11")
    ms = patterns.match_nodes(rg, "cudnn")
    assert [m.pattern for m in ms] == ["cudnn.conv2d.nhwc_ohwi_bias_relu"] * len(ms)
    funcs = {f"z{i}": candidate_function(rg, m.nodes, lift_constants=(i % 2 == 0)).func for i, m in enumerate(ms[:4])}
    funcs.update({n: _fn(b, s) for n, (b, s) in CONV_CASES.items()})
    vm = _cpu_vm(funcs)
    rng = np.random.default_rng(0)
    for name, func in funcs.items():
        plan = cudnn.plan_conv(func)
        args = _np_args(func.params, rng)
        ref = vm[name](*[_tvm(a) for a in args]).numpy()
        assert tuple(plan.y_dims) == (ref.shape if plan.layout == "NCHW" else
                                      (ref.shape[0], ref.shape[3], ref.shape[1], ref.shape[2]))
        np.testing.assert_allclose(cudnn.emulate_conv(plan, args), ref, rtol=1e-4, atol=1e-4, err_msg=name)


def test_cudnn_plan_rejects_other_subgraphs():
    with pytest.raises(BuildError, match="one conv2d"):
        cudnn.plan_conv(_fn(lambda bb, x: op.nn.max_pool2d(x, 2), (1, 1, 4, 4)))


# -- TensorRT: ONNX regions ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert"])
def test_tensorrt_regions_export_valid_onnx(name):
    rg = _rg(name)
    regions = patterns.merged_regions(rg, "tensorrt")
    assert regions
    trt_bk = get_backend("tensorrt")
    exported = []
    for r in regions:
        seg = candidate_function(rg, r.nodes, lift_constants=False)
        calls = [b.value for b in seg.func.body.blocks[0].bindings if isinstance(b.value, relax.Call)]
        assert all(trt_bk.supports_op(c) for c in calls)
        exported.append((seg, tensorrt.export_subgraph(seg.func)))  # raises if onnx.checker rejects it
    assert len(exported) == len(regions)
    biggest = sorted(exported, key=lambda e: -len(e[1].graph.node))[:2]
    vm = _cpu_vm({f"r{i}": seg.func for i, (seg, _) in enumerate(biggest)})
    rng = np.random.default_rng(0)
    for i, (seg, model) in enumerate(biggest):
        args = _np_args(seg.func.params, rng)
        ref = _numpy(vm[f"r{i}"](*[_tvm(a) for a in args]))
        refs = ref if isinstance(ref, list) else [ref]
        for g, r in zip(_ort(model, args), refs):
            # long float32 chains on random inputs: allow accumulation-order differences
            np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(r).max())))


def test_tensorrt_engine_cache_key():
    k = tensorrt.engine_cache_key(b"onnx", "NVIDIA H200", "9.0", "10.13.3.9")
    assert k == tensorrt.engine_cache_key(b"onnx", "NVIDIA H200", "9.0", "10.13.3.9")
    others = {tensorrt.engine_cache_key(b"onnx2", "NVIDIA H200", "9.0", "10.13.3.9"),
              tensorrt.engine_cache_key(b"onnx", "NVIDIA A100", "8.0", "10.13.3.9"),
              tensorrt.engine_cache_key(b"onnx", "NVIDIA H200", "9.0", "11.4.0.106"),
              tensorrt.engine_cache_key(b"onnx", "NVIDIA H200", "9.0", "10.13.3.9", fp16=True)}
    assert k not in others and len(others) == 4


# -- probes, builds and streams without a GPU ------------------------------------------------
@no_gpu_only
def test_probes_say_what_is_missing():
    ok, why = probe.cuda_driver()
    assert not ok and "libcuda.so.1" in why
    status = {n: get_backend(n).available() for n in ("tvm-cuda", "cublas", "cudnn", "tensorrt")}
    assert all(not ok for ok, _ in status.values())
    assert all("libcuda.so.1" in why for _, why in status.values())
    if probe.find_library("cublasLt")[0] is None:
        assert "pip install nvidia-cublas" in status["cublas"][1]
    if not probe.python_package("tensorrt")[0]:
        assert "tensorrt-cu13" in status["tensorrt"][1]
    func = _fn(lambda bb, x, y: op.matmul(x, y), (2, 4), (4, 2))
    dev = __import__("tvm_pesto.cluster", fromlist=["parse_cluster"]).parse_cluster("h200").devices[0]
    with pytest.raises(BackendUnavailableError, match="libcuda"):
        get_backend("cublas").build(func, dev)


@no_gpu_only
def test_streams_without_gpu():
    s = streams.StreamSet([tvm.cpu(0), tvm.cpu(1)])
    assert s.streams == [None, None]
    s.wait(0, 1)
    s.synchronize()
    with pytest.raises(ExecutionError, match="libcuda"):
        streams.StreamSet([tvm.cpu(0), tvm.cuda(0)])


def test_peer_access_pairs():
    assert streams.peer_access_pairs(2, lambda i, j: True) == [(0, 1), (1, 0)]
    assert streams.peer_access_pairs(3, lambda i, j: False) == []


# -- the device check: tests/gpu/device_check.py, prepare.py (here), gpu_runner.py (GPU machine) --
GPU_DIR = ROOT / "tests" / "gpu"
DEVICE_CHECK = GPU_DIR / "device_check.py"
MIB = 1 << 20
NVCC_SM90 = "sm_90" in probe.nvcc_archs()
needs_nvcc = pytest.mark.skipif(not NVCC_SM90, reason="no nvcc for sm_90 on PATH: --prepare compiles TVM's CUDA "
                                "into the fatbins the GPU machine loads (install the CUDA 13 toolkit)")


def _gpu_runner():
    if str(GPU_DIR) not in sys.path:
        sys.path.insert(0, str(GPU_DIR))
    import gpu_runner

    return gpu_runner


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_gpu_peers_torch_convolution_is_the_plans(case):
    """gpu_peers.py times ``torch.nn.functional.conv2d`` as the peer of each cuDNN call: on the
    CPU it computes the plan's convolution (layout, groups, dilation, bias, ReLU), and says so
    when the plan's padding is one PyTorch cannot express."""
    import torch
    import torch.nn.functional as F

    _gpu_runner()
    import gpu_peers

    func = _fn(*CONV_CASES[case])
    plan = cudnn.plan_conv(func)
    args = _np_args(func.params, np.random.default_rng(0))
    ops = {name: tvm.runtime.tensor(np.ascontiguousarray(op.value(args)))
           for name, op in (("X", plan.x), ("W", plan.w), ("B", plan.bias)) if op is not None}
    got = gpu_peers.torch_conv(torch, F, plan, ops, cudnn.emulate_conv(plan, args), sync=lambda: None)
    if plan.pre_padding != plan.post_padding:
        assert got == {"torch_conv_us": "skipped: asymmetric padding"}
    else:
        assert got["torch_conv_err"] < 1e-4 and got["torch_conv_us"] > 0


def _device_check(*args, before: str = "", timeout: float = 600):
    """device_check.py in a fresh process; ``before``: Python that process runs first."""
    argv = [str(DEVICE_CHECK), *map(str, args)]
    code = f"{before}\nimport runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path({str(DEVICE_CHECK)!r}, run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _rows(log_path) -> dict:
    return {(r["model"], r["backend"]): r for r in json.loads(Path(log_path).read_text())["rows"]}


def _runtime_only(folder, out, *args):
    """The folder's runner in a fresh process with TVM_USE_RUNTIME_LIB=1 and only the folder's TVM on PYTHONPATH."""
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=str(Path(folder) / "runtime"))
    return subprocess.run([sys.executable, str(Path(folder) / "run_gpu_check.py"), "--cpu-twins", "--out", str(out),
                           "--repeat", "1", "--min-repeat-ms", "1", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One ``--dry-run --prepare DIR`` of mlp_mixer (cuBLAS, cuDNN and TensorRT subgraphs)."""
    if not NVCC_SM90:
        pytest.skip("no nvcc for sm_90 on PATH: --prepare needs it")
    root = tmp_path_factory.mktemp("gpucheck")
    folder, log = root / "folder", root / "dry-run.json"
    r = _device_check("--dry-run", "--prepare", folder, "--models", "mlp_mixer", "--out", log, "--allow-missing-wheels")
    return folder, log, r


def test_check_rows_allow_only_documented_skips():
    runner = _gpu_runner()
    row = runner.Row("m", "cublas")
    with pytest.raises(ValueError, match="not documented"):
        row.skip("the calls", "no time")
    with pytest.raises(ValueError, match="use skip"):
        row.add("the calls", "skipped")
    assert runner.Row("m", "cudnn").to_dict()["status"] == "crashed"  # a row that checked nothing
    row.add("s0", "ok")
    row.add("s1", "mismatch", "max abs error 1")
    row.add("s2", "ok")
    d = row.to_dict()
    assert (d["status"], d["detail"]) == ("mismatch", "s1: max abs error 1")
    skipped = runner.Row("m", "cudnn")
    skipped.skip("everything", "no-matches", "no conv2d")
    assert skipped.to_dict()["status"] == "skipped"
    assert runner.exit_code([skipped.to_dict()]) == 0 and runner.exit_code([d, skipped.to_dict()]) == 1


@pytest.mark.slow
@needs_nvcc
def test_device_check_dry_run_passes_on_the_healthy_tree(prepared):
    _, log, r = prepared
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "summary" in r.stdout
    rows = _rows(log)
    backends = ("tvm-cuda", "cublas", "cudnn", "tensorrt", "cpu-twin", "mixed", "mixed-cpu-twin")
    assert {("mlp_mixer", b) for b in backends} | {("*", "bundle"), ("*", "runtime")} <= set(rows)
    reasons = _gpu_runner().SKIP_REASONS
    for row in rows.values():
        assert row["status"] in ("ok", "skipped"), row
        assert all(s["reason"] in reasons for s in row["skipped"]), row
    for b in backends:  # checked here, not forced to "skipped"
        assert rows[("mlp_mixer", b)]["status"] == "ok" and rows[("mlp_mixer", b)]["items"], b
    names = [i["name"] for i in rows[("mlp_mixer", "cublas")]["items"]]
    assert sum("plan (NumPy) vs TVM CPU" in n for n in names) == rows[("mlp_mixer", "cublas")]["subgraphs"] > 0
    assert {s["reason"] for s in rows[("mlp_mixer", "tensorrt")]["skipped"]} == {"tensorrt-not-in-workplace"}
    if not GPU_OK:
        assert {s["reason"] for s in rows[("mlp_mixer", "cublas")]["skipped"]} == {"no-gpu"}


@pytest.mark.slow
@needs_nvcc
def test_device_check_dry_run_fails_when_a_backend_is_broken(tmp_path):
    broken = ("import tvm_pesto.backends.gpu.cublas as cublas\n"
              "def plan_gemm(func):\n"
              "    raise RuntimeError('cuBLAS plan builder broken on purpose')\n"
              "cublas.plan_gemm = plan_gemm\n")
    log = tmp_path / "log.json"
    r = _device_check("--dry-run", "--prepare", tmp_path / "folder", "--models", "mlp_mixer", "--out", log,
                      "--allow-missing-wheels", before=broken)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    rows = _rows(log)
    row = rows[("mlp_mixer", "cublas")]
    assert row["status"] == "build_failed" and "broken on purpose" in row["detail"], row
    assert all(i["status"] == "build_failed" for i in row["items"] if i["name"].endswith(": plan"))
    mixed = rows[("mlp_mixer", "mixed")]  # its cuBLAS units cannot be planned either
    assert mixed["status"] == "build_failed" and "broken on purpose" in mixed["detail"], mixed
    twin = rows[("mlp_mixer", "mixed-cpu-twin")]
    assert twin["status"] == "build_failed" and "library units have no plan" in twin["detail"], twin
    failing = {("mlp_mixer", "cublas"), ("mlp_mixer", "mixed"), ("mlp_mixer", "mixed-cpu-twin")}
    assert all(r_["status"] in ("ok", "skipped") for k, r_ in rows.items() if k not in failing)
    assert "build_failed" in r.stdout and "broken on purpose" in r.stdout
    man = json.loads((tmp_path / "folder" / "manifest.json").read_text())
    subs = man["models"]["mlp_mixer"]["libraries"]["cublas"]["subgraphs"]
    assert subs and all(s["plan"] is None and s["status"] == "build_failed" for s in subs)  # the GPU run fails too


@pytest.mark.slow
@needs_nvcc
def test_prepared_folder_fits_and_its_cpu_twins_load_runtime_only(prepared, tmp_path):
    from tvm_pesto.run.bundle.runtime_pkg import tree_bytes

    folder, _, r = prepared
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    man = json.loads((folder / "manifest.json").read_text())
    assert man["size_bytes"] <= 60 * MIB and tree_bytes(folder) <= 60 * MIB
    files = set(man["files"])
    for f in ("run_gpu_check.py", "runtime/tvm/lib/libtvm_runtime.so", "runtime/tvm/lib/libtvm_runtime_cuda.so",
              "lib/gpu_probe.py", "lib/pesto_cublaslt.py", "lib/pesto_cudnn_graph.py", "lib/pesto_emulate.py",
              "models/mlp_mixer.cuda.so",
              "models/mlp_mixer.cpu.so", "data/mlp_mixer.npz", "data/mlp_mixer.cublas.npz", "data/mlp_mixer.cudnn.npz"):
        assert f in files, f
    assert not [f for f in files if "libtvm_compiler" in f or "3rdparty/" in f or "__pycache__" in f]
    entry = man["models"]["mlp_mixer"]
    assert entry["cuda"]["kernels"] and all(man["kernels"][k] in files for k in entry["cuda"]["kernels"])
    out = tmp_path / "twins.json"
    res = _runtime_only(folder, out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    env = json.loads(out.read_text())["environment"]
    assert (folder / env["tvm_file"]).resolve().parent == (folder / "runtime" / "tvm").resolve(), env  # folder-relative
    assert env["runtime_only"] and not env["compiler_mapped"] and not env["relax_imported"], env
    twin = _rows(out)[("mlp_mixer", "cpu-twin")]
    assert twin["status"] == "ok", twin
    items = {i["name"]: i for i in twin["items"]}
    assert items["main vs PyTorch"]["status"] == "ok" and items["main vs PyTorch"]["max_err"] < 1e-3
    assert len(twin["timings"]) == len(entry["groups"]) > 0
    if not GPU_OK:  # the CUDA library itself cannot load without libcuda.so.1: expected, and said
        assert "needs TVM's CUDA runtime" in items["parse CUDA library"]["detail"]
        assert [s["reason"] for s in twin["skipped"]] == ["no-gpu"]
    for name, ext in (("tvm-ffi", "tvm_ffi/core.cpython-312"), ("cudnn-frontend", "cudnn/_compiled_module.cpython-312")):
        w = man["wheels"][name]
        if "missing" in w:
            pytest.skip(f"the {name} wheel is not in the folder: {w['missing']}")
        with zipfile.ZipFile(folder / w["file"]) as z:
            assert any(n.startswith(ext) for n in z.namelist()), name


def test_lowering_for_another_machine_names_units_it_cannot_build():
    """``lower_units(build=False)``: cuDNN and cuBLAS units (unavailable without a GPU) become
    extern calls under the names their backends register, and nothing is registered here."""
    _gpu_runner()  # tests/gpu on the path
    import prepare  # lazy: tests/gpu is on the path only after _gpu_runner()

    rg = from_relax(zoo.load("mlp_mixer", "small").mod)
    device = parse_cluster("h200").devices[0]
    units = prepare.library_units(rg)
    n_lib = sum(u.backend != "tvm" for u in units)
    assert [u.backend != "tvm" for u in units[:n_lib]] == [True] * n_lib
    low = lower_units(rg, units, [device] * len(units), build=False)
    assert sorted(low.externs.values()) == list(range(n_lib)) and n_lib > 1
    for gname, k in low.externs.items():
        func = candidate_function(rg, units[k].nodes, lift_constants=False).func
        assert gname == get_backend(units[k].backend).global_name(instance_key(func), device)
        assert gname.endswith(".gpu0") and tvm.get_global_func(gname, allow_missing=True) is None
    calls = [b.value for b in low.mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert sum(c.op.name == "relax.call_dps_packed" for c in calls if isinstance(c.op, tvm.ir.Op)) == n_lib
    if not get_backend("cublas").available()[0]:
        with pytest.raises(BackendUnavailableError, match=r"'cublas' is unavailable.*a device this machine does not "
                           r"have: build it on the machine that has it.*build=False"):
            lower_units(rg, units, [device] * len(units))


@pytest.mark.slow
@needs_nvcc
def test_mixed_module_twin_runs_the_library_units_runtime_only(prepared, tmp_path):
    """The mixed module (tvm-pesto's plan for h200 with TVM, cuBLAS and cuDNN: its library units
    extern calls, the rest TVM), its CPU twin runtime-only with the backends' NumPy emulations
    registered under the externs' names: it matches PyTorch; one wrong weight in one unit is a
    mismatch."""
    folder = prepared[0]
    info = json.loads((folder / "manifest.json").read_text())["models"]["mlp_mixer"]["mixed"]
    libs = Counter(e["lib"] for e in info["externs"].values())
    assert info["cover"] == "plan" and sum(libs.values()) == info["units"] > 0, libs
    pl = tvm_pesto.place(zoo.load("mlp_mixer", "small").mod, "h200", backends="tvm,cublas,cudnn")
    assert len(info["externs"]) == sum(u.backend != "tvm" for u in pl.plan.units)
    assert {"models/mlp_mixer.mixed.cuda.so", "models/mlp_mixer.mixed.cpu.so"} <= {
        str(p.relative_to(folder)) for p in (folder / "models").iterdir()}
    out = tmp_path / "twins.json"
    res = _runtime_only(folder, out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    row = _rows(out)[("mlp_mixer", "mixed-cpu-twin")]
    assert row["status"] == "ok" and row["subgraphs"] == len(info["externs"]), row
    main = {i["name"]: i for i in row["items"]}["main vs PyTorch"]
    assert main["status"] == "ok" and main["max_err"] <= main["tol"], main
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad, ignore=shutil.ignore_patterns("logs", ".unpacked"))
    data = dict(np.load(bad / info["data"]))
    key = sorted(k for k in data if "_c_" in k)[0]
    data[key] = data[key] + 1.0  # same size: the manifest still matches
    np.savez(bad / info["data"], **data)
    res = _runtime_only(bad, tmp_path / "bad.json")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert _rows(tmp_path / "bad.json")[("mlp_mixer", "mixed-cpu-twin")]["status"] == "mismatch"


@pytest.mark.slow
@needs_nvcc
def test_the_twins_emulated_units_compute_each_librarys_plans(prepared, monkeypatch):
    """What the mixed twin registers for a cuBLAS or cuDNN unit (``emulated_unit``), called as
    the VM calls an extern (inputs, then the output to write), computes every prepared plan's
    TVM reference."""
    runner = _gpu_runner()
    folder = prepared[0]
    monkeypatch.syspath_prepend(str(folder / "lib"))
    monkeypatch.delitem(sys.modules, "pesto_emulate", raising=False)
    entry = json.loads((folder / "manifest.json").read_text())["models"]["mlp_mixer"]
    for lib in ("cublas", "cudnn"):
        info = entry["libraries"][lib]
        data = np.load(folder / info["data"])
        assert info["subgraphs"]
        for sub in info["subgraphs"]:
            args = [tvm.runtime.tensor(data[p["fill"][len("data:"):]]) for p in sub["params"]]
            ref = data[f"{sub['name']}_ref0"]
            out = tvm.runtime.empty(ref.shape, str(ref.dtype))
            runner.emulated_unit(None, lib, sub["plan"], data, sub["name"], len(args))(*args, out)
            np.testing.assert_allclose(out.numpy(), ref, rtol=2e-3, atol=2e-3, err_msg=f"{lib} {sub['name']}")


def _plan_from_dict(cls, d, data, prefix):
    kw = {}
    for f in dataclasses.fields(cls):
        v = d.get(f.name)
        if isinstance(v, dict):
            kw[f.name] = (cublas.Operand(const=data[f"{prefix}_{v['const']}"]) if "const" in v
                          else cublas.Operand(index=v["param"], item=v["item"]))
        elif isinstance(v, list):
            kw[f.name] = tuple(v)
        elif f.name in d:
            kw[f.name] = v
    return cls(**kw)


@pytest.mark.slow
@needs_nvcc
def test_prepared_plans_reproduce_the_reference(prepared):
    """The plans as plain data (what the GPU runner replays) compute the stored reference."""
    folder = prepared[0]
    man = json.loads((folder / "manifest.json").read_text())
    for lib, cls, emulate in (("cublas", cublas.GemmPlan, cublas.emulate_gemm),
                              ("cudnn", cudnn.ConvPlan, cudnn.emulate_conv)):
        info = man["models"]["mlp_mixer"]["libraries"][lib]
        data = np.load(folder / info["data"])
        assert info["subgraphs"]
        for sub in info["subgraphs"]:
            plan = _plan_from_dict(cls, sub["plan"], data, sub["name"])
            args = [data[p["fill"][len("data:"):]] for p in sub["params"]]
            np.testing.assert_allclose(emulate(plan, args), data[f"{sub['name']}_ref0"], rtol=2e-3, atol=2e-3,
                                       err_msg=f"{lib} {sub['name']}")


class _StandInCublasLt:
    """cuBLASLt for the runner's call sequence on the CPU: records layouts, writes ``expect``
    (plus ``offset``) through the output pointer it is given."""

    def __init__(self, offset):
        self.lib, self.offset, self.layouts, self.expect = self, offset, [], None

    def check(self, rc, what):
        assert rc == 0, what

    def handle(self, index):
        return ctypes.c_void_p(1)

    def layout(self, *args):
        self.layouts.append(args)
        return ctypes.c_void_p(len(self.layouts))

    def cublasLtMatmulDescCreate(self, *args):
        return 0

    def cublasLtMatmulDescSetAttribute(self, *args):
        return 0

    def cublasLtMatmul(self, handle, desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, ws, ws_bytes, stream):
        want = np.ascontiguousarray(self.expect + self.offset, dtype=np.float32)
        ctypes.memmove(d, want.ctypes.data, want.nbytes)
        return 0


class _StandInGraph:
    """cudnn-frontend's pygraph for the backend's build_cudnn_graph, on the CPU."""

    calls: list = []
    packs: list = []
    deselected: list = []
    expect = None
    offset = 0.0

    class T:
        def __init__(self, name):
            self.name, self.output = name, False

        def set_output(self, flag):
            self.output = flag
            return self

        def set_data_type(self, dt):
            return self

        def set_dim(self, dims):
            return self

        def set_stride(self, strides):
            return self

    def __init__(self, **kw):
        self.kw = kw

    def tensor(self, name, dim, stride, data_type):
        return self.T(name)

    def conv_fprop(self, **kw):
        _StandInGraph.calls.append(kw)
        return self.T("conv")

    def bias(self, name, input, bias):
        return self.T(name)

    def relu(self, name, input):
        return self.T(name)

    def validate(self):
        pass

    build_operation_graph = check_support = build_plans = validate

    def create_execution_plans(self, modes):
        pass

    def deselect_numeric_notes(self, notes):
        _StandInGraph.deselected += list(notes)

    def get_workspace_size(self):
        return 0

    def execute(self, pack, workspace, handle=None):
        """Writes ``expect`` (plus ``offset``) through the output's raw device pointer."""
        _StandInGraph.packs.append(dict(pack))
        assert all(type(v) is int for v in pack.values()) and type(workspace) is int, "raw pointers, not tensors"
        (y,) = [v for k, v in pack.items() if k.output]
        want = np.ascontiguousarray(self.expect + self.offset, dtype=np.float32)
        ctypes.memmove(y, want.ctypes.data, want.nbytes)


#: cudnn-frontend's module, as far as the backend and the runner use it, on the CPU.
_STAND_IN_CUDNN = SimpleNamespace(
    pygraph=_StandInGraph, data_type=SimpleNamespace(FLOAT=0, HALF=1), heur_mode=SimpleNamespace(A=0, FALLBACK=1),
    numerical_note=SimpleNamespace(TENSOR_CORE="tensor_core", DOWN_CONVERT_INPUTS="down_convert_inputs"),
    set_stream=lambda handle, stream: None, create_handle=object)


class _TvmOnCpu:
    """``tvm`` for the cuDNN backend with the CPU standing in for ``tvm.cuda``."""

    def __getattr__(self, name):
        return getattr(tvm, name)

    @staticmethod
    def cuda(index=0):
        return tvm.cpu(0)

    @staticmethod
    def get_global_func(name, allow_missing=False):
        return lambda: 0


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_cudnn_backend_calls_with_raw_pointers_and_exact_float32(monkeypatch, allow_tf32):
    """``CudnnBackend.make_callable`` against a CPU stand-in of cuDNN: the variant pack holds the
    call's raw pointers (TVM tensors cost the frontend 100-170 us a call on an H200, pointers
    24-52 us; docs/gpu.md), the output is what the library wrote, and float32 plans leave out
    tensor-core (TF32) engines unless ``allow_tf32``."""
    func = _fn(*CONV_CASES["nhwc_bias"])
    monkeypatch.setitem(sys.modules, "cudnn", _STAND_IN_CUDNN)
    monkeypatch.setattr(cudnn, "tvm", _TvmOnCpu())
    monkeypatch.setattr(cudnn._Handles, "per_device", {})
    args = _np_args(func.params, np.random.default_rng(0))
    want = cudnn.emulate_conv(cudnn.plan_conv(func), args)
    monkeypatch.setattr(_StandInGraph, "expect", want)
    monkeypatch.setattr(_StandInGraph, "packs", [])
    monkeypatch.setattr(_StandInGraph, "deselected", [])
    backend = cudnn.CudnnBackend()
    backend.allow_tf32 = allow_tf32
    run = backend.make_callable(func, SimpleNamespace(index=0))
    xs = [tvm.runtime.tensor(a) for a in args]
    out = tvm.runtime.empty(want.shape, "float32", tvm.cpu(0))
    run(*xs, out)
    np.testing.assert_array_equal(out.numpy(), want)
    (pack,) = _StandInGraph.packs
    assert {xs[0].data_ptr(), out.data_ptr()} <= set(pack.values())
    assert ("tensor_core" in _StandInGraph.deselected) is (not allow_tf32)


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("offset,status", [(0.0, "ok"), (0.5, "mismatch")])
def test_runner_replays_plans_through_the_library_calls(prepared, monkeypatch, offset, status):
    """The runner's cuBLASLt and cuDNN replays against CPU stand-ins of the libraries: the
    plan's dimensions reach the library, the result goes through the comparison and the
    timing; a wrong result is a mismatch."""
    import time

    runner = _gpu_runner()
    folder = prepared[0]
    monkeypatch.syspath_prepend(str(folder / "lib"))
    for m in ("pesto_cublaslt", "pesto_cudnn_graph", "gpu_probe"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    import pesto_cublaslt

    lt = _StandInCublasLt(offset)
    monkeypatch.setattr(pesto_cublaslt._Lt, "get", classmethod(lambda cls: lt))
    fake_cudnn = _STAND_IN_CUDNN
    monkeypatch.setitem(sys.modules, "cudnn", fake_cudnn)
    _StandInGraph.calls, _StandInGraph.offset, _StandInGraph.deselected = [], offset, []
    real = dict(runner.LIBRARY_UNITS)

    def expecting(lib):
        def unit(ctx, plan, data, prefix, n_in):
            (lt if lib == "cublas" else _StandInGraph).expect = data[f"{prefix}_ref0"]
            return real[lib](ctx, plan, data, prefix, n_in)
        return unit

    monkeypatch.setattr(runner, "LIBRARY_UNITS", {lib: expecting(lib) for lib in real})
    man = json.loads((folder / "manifest.json").read_text())
    ctx = SimpleNamespace(folder=folder, probe=None, tol=man["tolerances"], repeat=1, min_repeat_ms=1,
                          deadline=time.time() + 120, served=[], cudnn=fake_cudnn, cudnn_handle=object(),
                          target=man["target"], cache_version=man["cache_version"], tvm=tvm, dev=tvm.cpu(0),
                          device_name="stand-in")
    entry = man["models"]["mlp_mixer"]
    for lib in ("cublas", "cudnn"):
        d = runner.run_library_gpu(ctx, "mlp_mixer", lib, entry).to_dict()
        subs = entry["libraries"][lib]["subgraphs"]
        assert d["status"] == status, d
        assert len(d["items"]) == len(subs)
        assert len(d["timings"]) == (len(subs) if status == "ok" else 0)
    p = entry["libraries"]["cublas"]["subgraphs"][0]["plan"]
    a_rows, a_cols = (p["m"], p["k"]) if p["transa"] == "N" else (p["k"], p["m"])
    assert (a_rows, a_cols, p["lda"], p["batch"], p["stride_a"]) in [lay[1:] for lay in lt.layouts]
    c = entry["libraries"]["cudnn"]["subgraphs"][0]["plan"]
    assert _StandInGraph.calls[0]["pre_padding"] == c["pre_padding"] and _StandInGraph.calls[0]["stride"] == c["stride"]
    assert "tensor_core" in _StandInGraph.deselected  # float32 plans stay exact, as CudnnBackend builds them


@pytest.mark.slow
@needs_nvcc
def test_runner_fails_on_a_mismatch_and_stops_on_a_truncated_folder(prepared, tmp_path):
    folder = prepared[0]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad, ignore=shutil.ignore_patterns("logs", ".unpacked"))
    data = dict(np.load(bad / "data" / "mlp_mixer.npz"))
    data["ref0"] = data["ref0"] + 1.0  # same size: the manifest still matches
    np.savez(bad / "data" / "mlp_mixer.npz", **data)
    res = _runtime_only(bad, tmp_path / "log.json")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    twin = _rows(tmp_path / "log.json")[("mlp_mixer", "cpu-twin")]
    assert twin["status"] == "mismatch" and "max abs error" in twin["detail"], twin
    with open(bad / "models" / "mlp_mixer.cpu.so", "r+b") as f:
        f.truncate(1000)
    res = _runtime_only(bad, tmp_path / "log2.json")
    assert res.returncode == 2 and "truncated" in res.stderr, res.stderr[-2000:]


@pytest.mark.slow
@needs_nvcc
def test_runner_serves_the_prebuilt_kernels_to_tvms_cuda_loader(prepared, tmp_path):
    """TVM's CUDA loader asks ``tvm_callback_cuda_compile`` for a module's binary: the runner
    answers with the fatbin nvcc made at prepare time, and hands other sources to TVM's callback."""
    import hashlib

    import tvm_ffi

    runner = _gpu_runner()
    folder = prepared[0]
    man = json.loads((folder / "manifest.json").read_text())
    rel = next(iter(man["kernels"].values()))
    source = "extern \"C\" __global__ void k(float* x) { x[0] = 1.f; }"
    man["kernels"] = {hashlib.sha256(source.encode()).hexdigest(): rel}
    name = "tvm_callback_cuda_compile"
    original = tvm_ffi.get_global_func(name)
    tvm_ffi.register_global_func(name, lambda code: b"compiled by the JIT", override=True)
    try:
        served = []
        runner.serve_prebuilt_kernels(folder, man, served)
        compile_cuda = tvm_ffi.get_global_func(name)
        assert bytes(compile_cuda(source)) == (folder / rel).read_bytes()
        assert bytes(compile_cuda("another source")) == b"compiled by the JIT"
        assert [s_["how"].split()[0] for s_ in served] == ["prebuilt", "jit"]
    finally:
        tvm_ffi.register_global_func(name, original, override=True)
    if not GPU_OK:  # GPU mode on a machine without a GPU: it says so and exits 2 (nothing checked)
        res = subprocess.run([sys.executable, str(folder / "run_gpu_check.py"), "--out", str(tmp_path / "gpu.json")],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "no usable GPU" in res.stderr, res.stderr[-2000:]


@needs_gpu
def test_device_check_on_a_gpu(tmp_path):
    """A machine with TVM and a GPU: --prepare, then the runner on tvm.cuda(0)."""
    log = tmp_path / "log.json"
    r = _device_check("--models", "mlp_mixer", "--out", log, "--budget-s", "60")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = _rows(log)
    assert rows[("mlp_mixer", "tvm-cuda")]["status"] == "ok" and rows[("mlp_mixer", "tvm-cuda")]["timings"]

# -- on a GPU ----------------------------------------------------------------------------------
@needs_gpu
def test_gpu_backends_match_tvm_cuda():
    """Each available library backend, on a matched subgraph, equals TVM-CUDA's result."""
    from tvm_pesto.cluster import parse_cluster

    dev_spec = parse_cluster("h200").devices[0]
    dev = tvm.cuda(0)
    cases = [("bert", "cublas"), ("vgg11", "cudnn"), ("resnet50", "tensorrt")]
    ran = 0
    for model, lib in cases:
        bk = get_backend(lib)
        ok, why = bk.available()
        if not ok:
            continue
        rg = _rg(model)
        nodes = (patterns.merged_regions(rg, lib) if lib == "tensorrt" else patterns.match_nodes(rg, lib))[0].nodes
        seg = candidate_function(rg, nodes, lift_constants=False)
        ex = tvm_cuda.compile_cuda(tvm.IRModule({"main": seg.func}), dev_spec)
        vm = relax.VirtualMachine(ex, dev)
        args = [tvm.runtime.tensor(a, device=dev) for a in _np_args(seg.func.params, np.random.default_rng(0))]
        ref = vm["main"](*args).numpy()
        fn = bk.make_callable(seg.func, dev_spec)
        out = tvm.runtime.empty(ref.shape, str(ref.dtype), dev)
        fn(*args, out)
        dev.sync()
        np.testing.assert_allclose(out.numpy(), ref, rtol=3e-3, atol=3e-3, err_msg=lib)
        ran += 1
    if ran == 0:
        pytest.skip("a GPU is present but no library backend is installed (pip install '.[gpu]')")


@needs_gpu
def test_streams_on_gpu():
    dev = tvm.cuda(0)
    s = streams.StreamSet([dev, dev])
    x = tvm.runtime.tensor(np.arange(1000, dtype="float32"), device=dev)
    y = s.copy(x, 0, 1)
    s.synchronize()
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    s.close()
