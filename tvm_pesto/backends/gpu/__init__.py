"""GPU backends: TVM-CUDA, cuBLAS, cuDNN and TensorRT (one module each).

Each backend is a Relax ``call_dps_packed`` into a tvm-ffi function that calls the real
library on DLPack tensors (see :mod:`tvm_pesto.backends.base`). What each library accepts
comes from TVM's registered BYOC patterns (:mod:`.patterns`). The registry
(:mod:`tvm_pesto.backends.registry`) imports them on first use; on a machine without a GPU
they report why they are unavailable (:mod:`tvm_pesto.cluster.gpu_probe`), and their build paths that need no
GPU (TVM-CUDA compile and export, ONNX export for TensorRT, GEMM/convolution plans) still run.

Examples
--------
>>> from tvm_pesto.backends import backend_status
>>> sorted(n for n in backend_status() if n in GPU_BACKENDS)
['cublas', 'cudnn', 'tensorrt', 'tvm-cuda']
"""

#: The GPU backends' registry names.
GPU_BACKENDS = ("tvm-cuda", "cublas", "cudnn", "tensorrt")

__all__ = ["GPU_BACKENDS"]
