"""Availability probes for the GPU stack: each says exactly what is missing and how to get it.

Nothing here needs a GPU: on a machine without one every probe returns ``(False, reason)``.
Results are cached per process.

Examples
--------
>>> from tvm_pesto.cluster import gpu_probe as probe
>>> ok, why = probe.cuda_driver()
>>> isinstance(ok, bool) and (ok or "libcuda" in why or "GPU" in why)
True
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import shutil
import site
import subprocess
import sys

#: What to install for each library (CUDA 13 wheels; TVM 0.27's CUDA runtime links libcudart.so.13).
PIP_HINTS = {
    "cublasLt": "pip install nvidia-cublas  (CUDA 13; nvidia-cublas-cu12 for CUDA 12)",
    "cudnn": "pip install nvidia-cudnn-cu13  (nvidia-cudnn-cu12 for CUDA 12)",
    "cudnn_frontend": "pip install nvidia-cudnn-frontend",
    "tensorrt": "pip install tensorrt-cu13  (tensorrt-cu12 for CUDA 12)",
    "nvrtc": "pip install cuda-bindings nvidia-cuda-nvrtc  (or set TVM_CUDA_COMPILE_MODE=nvcc with nvcc on PATH)",
}

_SONAMES = {
    "cuda": ["libcuda.so.1", "libcuda.so"],
    "cudart": ["libcudart.so.13", "libcudart.so.12", "libcudart.so"],
    "cublasLt": ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
    "cudnn": ["libcudnn.so.9", "libcudnn.so"],
}


def _pip_lib_dirs() -> list[str]:
    """Library folders of NVIDIA pip wheels (``site-packages/nvidia/*/lib``)."""
    roots = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    roots.append(site.getusersitepackages() if hasattr(site, "getusersitepackages") else "")
    roots.extend(p for p in sys.path if p.endswith("site-packages"))
    out = []
    for r in dict.fromkeys(r for r in roots if r):
        out.extend(sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))))
        out.extend(sorted(glob.glob(os.path.join(r, "tensorrt_libs"))))
    return out


@functools.lru_cache(maxsize=None)
def find_library(kind: str) -> tuple[str | None, str]:
    """Load one of the CUDA libraries (``cuda``, ``cudart``, ``cublasLt``, ``cudnn``).

    Tries the system loader first, then the folders of NVIDIA pip wheels.

    Returns
    -------
    (path or soname, "") when it loads, else (None, reason).

    Examples
    --------
    >>> path, why = find_library("cublasLt")
    >>> path is not None or "libcublasLt" in why
    True
    """
    names = _SONAMES[kind]
    errors = []
    for n in names:
        try:
            ctypes.CDLL(n, mode=ctypes.RTLD_GLOBAL)
            return n, ""
        except OSError as e:
            errors.append(str(e))
    for d in _pip_lib_dirs():
        for n in names:
            p = os.path.join(d, n)
            if os.path.exists(p):
                try:
                    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                    return p, ""
                except OSError as e:
                    errors.append(f"{p}: {e}")
    hint = PIP_HINTS.get(kind, "")
    detail = errors[-1] if errors and "cannot open" not in errors[-1] else ""
    msg = f"{names[0].split('.so')[0]}.so not found"
    if kind == "cuda":
        msg = "no CUDA driver: libcuda.so.1 not found (this machine has no NVIDIA driver or GPU)"
    elif hint:
        msg += f": {hint}"
    if detail:
        msg += f" ({detail})"
    return None, msg


@functools.lru_cache(maxsize=None)
def cuda_driver() -> tuple[bool, str]:
    """Whether the CUDA driver loads and sees at least one GPU.

    Examples
    --------
    >>> ok, why = cuda_driver()
    >>> ok or bool(why)
    True
    """
    path, why = find_library("cuda")
    if path is None:
        return False, why
    lib = ctypes.CDLL(path)
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"cuInit failed with CUDA driver error {rc} (driver present but no usable GPU)"
    n = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0 or n.value < 1:
        return False, f"the CUDA driver sees no GPU (cuDeviceGetCount -> {n.value}, error {rc})"
    return True, ""


@functools.lru_cache(maxsize=None)
def tvm_cuda_runtime() -> tuple[bool, str]:
    """Whether TVM can run CUDA modules here (its CUDA runtime loaded and a GPU exists).

    Examples
    --------
    >>> ok, why = tvm_cuda_runtime()
    >>> ok or bool(why)
    True
    """
    ok, why = cuda_driver()
    if not ok:
        return False, f"{why}; TVM's libtvm_runtime_cuda.so needs it to run CUDA modules (compiling still works)"
    import tvm  # noqa: F401 - loads the CUDA runtime sidecar when it can
    import tvm_ffi

    if tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is None:
        lib, why = find_library("cudart")
        extra = "" if lib else f" ({why})"
        return False, ("TVM's CUDA runtime (tvm/lib/libtvm_runtime_cuda.so) did not load: it links "
                       f"libcudart.so.13{extra}; install the CUDA 13 runtime (pip install nvidia-cuda-runtime)")
    if not tvm.cuda(0).exist:
        return False, "TVM's CUDA runtime is loaded but tvm.cuda(0) does not exist"
    return True, ""


@functools.lru_cache(maxsize=None)
def python_package(module: str) -> tuple[bool, str]:
    """Whether a Python module can be found (not imported).

    Examples
    --------
    >>> python_package("numpy")
    (True, '')
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return True, ""
    key = {"cudnn": "cudnn_frontend", "tensorrt": "tensorrt", "cuda.bindings": "nvrtc"}.get(module, module)
    hint = PIP_HINTS.get(key, f"pip install {module}")
    return False, f"Python package {module!r} is missing: {hint}"


@functools.lru_cache(maxsize=None)
def nvcc_archs() -> tuple[str, ...]:
    """The ``sm_XX`` architectures this machine's nvcc compiles for (empty without nvcc).

    Examples
    --------
    >>> archs = nvcc_archs()
    >>> all(a.startswith("sm_") for a in archs)
    True
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return ()
    try:
        r = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(sorted({w.strip() for w in r.stdout.split() if w.strip().startswith("sm_")}))


@functools.lru_cache(maxsize=None)
def jit_compiler() -> tuple[str | None, str]:
    """How TVM will turn CUDA source into a kernel binary on a GPU machine.

    TVM 0.27 compiles CUDA through ``tvm_callback_cuda_compile``: NVRTC (needs the
    ``cuda-bindings`` package) unless ``TVM_CUDA_COMPILE_MODE=nvcc``.

    Returns
    -------
    ("nvrtc" | "nvcc", "") or (None, reason)
    """
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower()
    has_nvrtc = python_package("cuda.bindings")[0]
    has_nvcc = shutil.which("nvcc") is not None
    if mode == "nvcc":
        return ("nvcc", "") if has_nvcc else (None, "TVM_CUDA_COMPILE_MODE=nvcc but nvcc is not on PATH")
    if has_nvrtc:
        return "nvrtc", ""
    if has_nvcc:
        return None, ("cuda-bindings (NVRTC) is missing, nvcc is present: set TVM_CUDA_COMPILE_MODE=nvcc "
                      f"(tvm_cuda.use_available_jit() does it), or {PIP_HINTS['nvrtc']}")
    return None, f"no CUDA compiler for TVM: {PIP_HINTS['nvrtc']}"


def combine(*checks: tuple) -> tuple[bool, str]:
    """All checks together: ok when every one is, with every reason joined by ``"; "``.

    Examples
    --------
    >>> combine((True, ""), (False, "no A"), (False, "no B"))
    (False, 'no A; no B')
    """
    why = [w for ok, w in checks if not ok and w]
    return all(ok for ok, _ in checks), "; ".join(why)


def library(kind: str) -> tuple[bool, str]:
    """:func:`find_library` as an ``(ok, reason)`` check."""
    path, why = find_library(kind)
    return path is not None, why


def report() -> dict[str, tuple[bool, str]]:
    """One line per component of the GPU stack: ``{name: (ok, reason)}``.

    Examples
    --------
    >>> sorted(report())[:3]
    ['TensorRT', 'cuBLASLt', 'cuDNN']
    """
    out = {
        "cuda-driver": cuda_driver(),
        "tvm-cuda-runtime": tvm_cuda_runtime(),
        "tvm-cuda-jit": (lambda r: (r[0] is not None, r[1]))(jit_compiler()),
        "nvcc": (bool(nvcc_archs()), "" if nvcc_archs() else "nvcc not on PATH (only needed to check "
                 "generated CUDA on a machine without GPU, or with TVM_CUDA_COMPILE_MODE=nvcc)"),
    }
    lib, why = find_library("cublasLt")
    out["cuBLASLt"] = (lib is not None, why)
    lib, why = find_library("cudnn")
    fe = python_package("cudnn")
    out["cuDNN"] = (lib is not None and fe[0], why or fe[1])
    out["TensorRT"] = python_package("tensorrt")
    return out
