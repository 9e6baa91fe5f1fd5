"""GPU backends: everything that needs no GPU runs here; GPU-only tests skip with the reason.

- ONNX exporter: op-level functions and whole zoo models, checked with onnx.checker and run
  with ONNX Runtime against TVM (CPU).
- TVM-CUDA: modules compile for sm_70/80/90 and export; nvcc compiles the generated CUDA.
- Pattern coverage with TVM's registered cuBLAS/cuDNN/TensorRT patterns and checks.
- cuBLAS GEMM plans and cuDNN convolution plans, emulated in NumPy, against TVM.
- TensorRT: ONNX models of the partitioned regions are valid and compute what TVM computes.
- Probes, streams, and the device-check script's dry run.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_pesto import zoo
from tvm_pesto.backends import BackendUnavailableError, get_backend
from tvm_pesto.backends.base import MatchContext
from tvm_pesto.backends.gpu import cublas, cudnn, patterns, tensorrt, tvm_cuda
from tvm_pesto.cluster import gpu_probe as probe
from tvm_pesto.run import streams
from tvm_pesto.backends.onnx_export import OnnxExportError, flatten_args, relax_to_onnx, supports_call
from tvm_pesto.builder.subgraph import group_function
from tvm_pesto.errors import BuildError, ExecutionError
from tvm_pesto.graph.relax_import import from_relax

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
    func = _fn(lambda bb, x: op.cumsum(x, axis=0), (3, 2))
    assert not supports_call(func.body.blocks[0].bindings[0].value)
    with pytest.raises(OnnxExportError, match="relax.cumsum"):
        relax_to_onnx(func)
    nhwc = _fn(lambda bb, x: op.nn.conv2d(x, _c(2, 3, 3, 3), data_layout="NHWC", kernel_layout="OHWI"), (1, 5, 5, 3))
    assert not supports_call(nhwc.body.blocks[0].bindings[0].value)
    with pytest.raises(OnnxExportError, match="NCHW"):
        relax_to_onnx(nhwc)


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
def test_tvm_cuda_models_compile_and_export(tmp_path):
    for name, arch in (("mlp_mixer", "sm_80"), ("vgg11", "sm_90")):
        ex = tvm_cuda.compile_cuda(zoo.load(name, "small").mod, arch, what=name)
        path = tvm_cuda.export_cuda(ex, tmp_path / f"{name}_{arch}.so")
        assert path.stat().st_size > 100_000
        (src,) = tvm_cuda.cuda_sources(ex)
        assert src.count("__global__") >= 5


def test_tvm_cuda_groups_for_each_arch_and_nvcc(tmp_path):
    from tvm_pesto.graph.fusion import fusion_groups

    rg = _rg("resnet50")
    groups = fusion_groups(rg.graph)[:5]
    mod = tvm.IRModule({f"g{i}": group_function(rg, g).func.with_attr("global_symbol", f"g{i}")
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
@pytest.mark.parametrize("name", ["bert", "mlp_mixer", "vgg11"])
def test_cublas_plans_match_tvm(name):
    rg = _rg(name)
    ms = patterns.match_nodes(rg, "cublas")
    assert ms
    segs = [group_function(rg, m.nodes, lift_constants=(i % 2 == 0)) for i, m in enumerate(ms)]
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


def test_cudnn_plans_match_tvm():
    rg = _rg("vgg11")
    ms = patterns.match_nodes(rg, "cudnn")
    assert [m.pattern for m in ms] == ["cudnn.conv2d.nhwc_ohwi_bias_relu"] * len(ms)
    funcs = {f"z{i}": group_function(rg, m.nodes, lift_constants=(i % 2 == 0)).func for i, m in enumerate(ms[:4])}
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
@pytest.mark.parametrize("name", ["resnet50", "bert"])
def test_tensorrt_regions_export_valid_onnx(name):
    rg = _rg(name)
    regions = patterns.merged_regions(rg, "tensorrt")
    assert regions
    trt_bk = get_backend("tensorrt")
    exported = []
    for r in regions:
        seg = group_function(rg, r.nodes, lift_constants=False)
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


def test_device_check_dry_run(tmp_path):
    out = tmp_path / "log.jsonl"
    env = dict(os.environ, TVM_PESTO_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "device_check.py"), "--dry-run",
                        "--models", "mlp_mixer", "--out", str(out), "--no-nvcc"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = r.stdout
    assert "summary" in text.lower() and "mlp_mixer" in text
    for bk in ("tvm-cuda", "cublas", "cudnn", "tensorrt"):
        assert bk in text
    if not GPU_OK:
        assert "skipped" in text and "libcuda" in text


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
        seg = group_function(rg, nodes, lift_constants=False)
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
