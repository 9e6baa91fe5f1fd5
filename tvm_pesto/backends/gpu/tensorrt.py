"""TensorRT backend: a Relax subgraph -> ONNX -> TensorRT engine, cached on disk.

The subgraph (any convex region of ops TVM's ``tensorrt.*`` patterns accept) is exported
with :func:`tvm_pesto.backends.onnx_export.export.relax_to_onnx`, checked with ``onnx.checker``,
parsed by TensorRT's ONNX parser and built into an engine. Engines are cached in
``$TVM_PESTO_CACHE/tensorrt`` (default ``~/.cache/tvm-pesto/tensorrt``) under a key made of
the ONNX model's bytes, the GPU name, its compute capability, the TensorRT version and the
precision flags, so a second build of the same subgraph on the same GPU loads the plan.

Examples
--------
>>> from tvm_pesto.backends.gpu.tensorrt import engine_cache_key
>>> len(engine_cache_key(b"model", "NVIDIA H200", "9.0", "10.13.3", fp16=False))
32
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Callable

import tvm
from tvm import relax

from ...errors import BuildError
from ...package_data import cache_root
from ..base import Backend
from ..onnx_export.export import flatten_args, relax_to_onnx
from ..onnx_export.ops import supports_call
from ...cluster import gpu_probe as probe
from .cublas import _as_int
from .patterns import backend_patterns, ops_in_patterns


def default_cache_dir() -> Path:
    return cache_root() / "tensorrt"


def engine_cache_key(onnx_bytes: bytes, gpu_name: str, compute: str, trt_version: str, fp16: bool = False) -> str:
    """Hex key of an engine: ONNX bytes (the subgraph and its weights), GPU, TensorRT version.

    Examples
    --------
    >>> a = engine_cache_key(b"m", "NVIDIA H200", "9.0", "10.13.3")
    >>> a != engine_cache_key(b"m", "NVIDIA A100", "8.0", "10.13.3")
    True
    """
    h = hashlib.blake2b(digest_size=16)
    for part in (onnx_bytes, gpu_name.encode(), compute.encode(), trt_version.encode(), b"fp16" if fp16 else b"fp32"):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def export_subgraph(func: relax.Function, check: bool = True):
    """The ONNX model of a subgraph, validated with ``onnx.checker`` (full check).

    Raises
    ------
    BuildError
        When the exporter cannot express the subgraph or the checker rejects it.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> model = export_subgraph(tiny_mlp()[0]["main"])
    >>> model.graph.node[0].op_type, len(model.graph.input)
    ('LayerNormalization', 1)
    """
    import onnx

    model = relax_to_onnx(func, name="pesto_trt_subgraph")
    if check:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:  # noqa: BLE001 - onnx raises ValidationError / InferenceError
            raise BuildError(f"the ONNX export of this subgraph is invalid: {str(e).splitlines()[0]}") from e
    return model


class _Logger:
    _inst = None

    @classmethod
    def get(cls, trt):
        if cls._inst is None:
            cls._inst = trt.Logger(trt.Logger.WARNING)
        return cls._inst


def build_engine(model, device_index: int = 0, cache_dir=None, fp16: bool = False,
                 workspace_bytes: int = 1 << 30) -> tuple[bytes, bool]:
    """A serialized TensorRT engine for an ONNX model, from the disk cache when there.

    Returns
    -------
    (engine bytes, True when it came from the cache)
    """
    import tensorrt as trt

    dev = tvm.cuda(device_index)
    onnx_bytes = model.SerializeToString()
    key = engine_cache_key(onnx_bytes, str(dev.device_name), str(dev.compute_version), trt.__version__, fp16)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / f"{key}.engine"
    if path.exists():
        return path.read_bytes(), True
    logger = _Logger.get(trt)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"TensorRT's ONNX parser rejected the subgraph: {errs[:400]}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BuildError("TensorRT could not build an engine for this subgraph (see the TensorRT log above)")
    data = bytes(plan)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data, False


class TensorRTBackend(Backend):
    """TensorRT engines for regions of ops that TVM's ``tensorrt.*`` patterns accept."""

    name = "tensorrt"
    build_s_guess = (2.0, 0.1)  # an engine per unit, its tactics timed
    device_kinds = ("gpu",)
    graph_level = True
    max_ops = 64
    fp16 = False

    def __init__(self, cache_dir=None) -> None:
        super().__init__()
        self.cache_dir = cache_dir
        self._single_ops: set[str] | None = None
        self.cache_hits = 0

    def patterns(self) -> list:
        return backend_patterns("tensorrt")

    def _ops(self) -> set[str]:
        if self._single_ops is None:
            self._single_ops = ops_in_patterns("tensorrt")
        return self._single_ops

    def supports_op(self, call) -> bool:
        """A call is accepted when a TensorRT pattern covers its op and the ONNX exporter
        can express it."""
        return (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                and call.op.name in self._ops() and supports_call(call))

    def available(self) -> tuple[bool, str]:
        return probe.combine(probe.tvm_cuda_runtime(), probe.python_package("tensorrt"))

    def global_name(self, key: str, device) -> str:
        return f"pesto.{self.name}.{key}.gpu{getattr(device, 'index', 0)}"

    def make_callable(self, func: relax.Function, device) -> Callable:
        import tensorrt as trt

        model = export_subgraph(func)
        idx = int(getattr(device, "index", 0))
        data, hit = build_engine(model, idx, self.cache_dir, self.fp16)
        self.cache_hits += int(hit)
        runtime = trt.Runtime(_Logger.get(trt))
        engine = runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise BuildError("TensorRT could not load the engine (built for another GPU or TensorRT version?)")
        context = engine.create_execution_context()
        in_names = [i.name for i in model.graph.input]
        out_names = [o.name for o in model.graph.output]
        get_stream = tvm.get_global_func("runtime.get_cuda_stream")
        n_params = len(func.params)
        lock = threading.Lock()
        keep = (runtime, engine)

        def run(*args):
            with lock:  # one execution context, one caller at a time
                for name, t in zip(in_names, flatten_args(args[:n_params])):
                    context.set_tensor_address(name, int(t.data_ptr()))
                for name, t in zip(out_names, args[n_params:]):
                    context.set_tensor_address(name, int(t.data_ptr()))
                if not context.execute_async_v3(_as_int(get_stream())):
                    raise RuntimeError("TensorRT execute_async_v3 failed")
            _ = keep

        return run
