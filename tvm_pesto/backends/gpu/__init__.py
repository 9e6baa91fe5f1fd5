"""GPU backends: TVM-CUDA, cuBLAS, cuDNN and TensorRT.

Each backend is a Relax ``call_dps_packed`` into a tvm-ffi function that calls the real
library on DLPack tensors (see :mod:`tvm_pesto.backends.base`). What each library accepts
comes from TVM's registered BYOC patterns (:mod:`.patterns`). Importing this package
registers the four backends; on a machine without a GPU they report why they are
unavailable (:mod:`.probe`), and their build paths that need no GPU (TVM-CUDA compile and
export, ONNX export for TensorRT, GEMM/convolution plans) still run.

Examples
--------
>>> from tvm_pesto.backends import backend_status
>>> sorted(n for n in backend_status() if n in GPU_BACKENDS)
['cublas', 'cudnn', 'tensorrt', 'tvm-cuda']
"""
from __future__ import annotations

from .. import register_backend
from .cublas import CublasBackend
from .cudnn import CudnnBackend
from .tensorrt import TensorRTBackend
from .tvm_cuda import TvmCudaBackend

#: Backend name -> class.
GPU_BACKENDS = {
    "tvm-cuda": TvmCudaBackend,
    "cublas": CublasBackend,
    "cudnn": CudnnBackend,
    "tensorrt": TensorRTBackend,
}

for _name, _cls in GPU_BACKENDS.items():
    register_backend(_name, _cls)

__all__ = ["GPU_BACKENDS", "CublasBackend", "CudnnBackend", "TensorRTBackend", "TvmCudaBackend"]
