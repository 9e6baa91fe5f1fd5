"""Streams, cross-device dependencies and peer copies for running placed modules on GPUs.

TVM 0.27's runtime API (checked): ``Device.create_raw_stream()``, ``Device.set_raw_stream(s)``
(sets the stream of the *calling thread* for that device: TVM keeps it thread-local),
``Device.sync(stream)``, ``Device.free_raw_stream(s)``, and the globals
``runtime.Device_StreamSyncFromTo(dev, src, dst)`` (records an event on ``src`` and makes
``dst`` wait for it, without blocking the host) and ``runtime.get_cuda_stream()``. There is
no event object in Python, and ``Tensor.copyto`` between two GPUs runs
``cudaMemcpyPeerAsync`` on the legacy default stream. This module adds:

- :class:`StreamSet`: one stream per GPU, bound to the executor's worker thread of that GPU.
- :meth:`StreamSet.wait`: a cross-device dependency as a stream-to-stream event wait.
- :meth:`StreamSet.copy`: an asynchronous copy ordered after the producer's kernels
  (``cudaMemcpyPeerAsync`` on the producer's stream, peer access enabled when the GPUs
  allow it), followed by a wait of the consumer's stream.

Examples
--------
>>> from tvm_pesto.run.thread.streams import StreamSet
>>> s = StreamSet([])            # no GPU devices: every call is a no-op
>>> s.wait(0, 1) is None
True
"""
from __future__ import annotations

import ctypes
import threading

import tvm

from ...cluster import gpu_probe as probe
from ...errors import ExecutionError

_MEMCPY_DEFAULT = 4


class _Cudart:
    """The CUDA runtime TVM itself uses (same library, same primary contexts)."""

    _inst = None
    _lock = threading.Lock()

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.cudaMemcpyPeerAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                                 ctypes.c_size_t, ctypes.c_void_p]
        self.lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_void_p]

    @classmethod
    def get(cls) -> "_Cudart":
        with cls._lock:
            if cls._inst is None:
                path, why = probe.find_library("cudart")
                if path is None:
                    raise ExecutionError(f"cannot copy between GPUs: {why}")
                cls._inst = cls(path)
            return cls._inst

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise ExecutionError(f"{what} failed with CUDA error {rc}")


def peer_access_pairs(n: int, can_access) -> list[tuple[int, int]]:
    """Ordered GPU pairs (i, j), i != j, for which ``can_access(i, j)`` is true.

    Examples
    --------
    >>> peer_access_pairs(3, lambda i, j: abs(i - j) == 1)
    [(0, 1), (1, 0), (1, 2), (2, 1)]
    """
    return [(i, j) for i in range(n) for j in range(n) if i != j and can_access(i, j)]


class StreamSet:
    """One CUDA stream per GPU of a cluster (``None`` entries for CPU devices).

    Parameters
    ----------
    devices : list of tvm.runtime.Device
        The executor's devices, by cluster index. Streams are created for the CUDA ones.
    """

    def __init__(self, devices):
        self.devices = list(devices)
        self.streams: list = [None] * len(self.devices)
        self.peer: set[tuple[int, int]] = set()
        gpus = [i for i, d in enumerate(self.devices) if _is_cuda(d)]
        if gpus:
            ok, why = probe.tvm_cuda_runtime()
            if not ok:
                raise ExecutionError(f"cannot create CUDA streams: {why}")
        for i in gpus:
            self.streams[i] = self.devices[i].create_raw_stream()
        self._sync_from_to = tvm.get_global_func("runtime.Device_StreamSyncFromTo", allow_missing=True)
        if len(gpus) > 1:
            self._enable_peer_access(gpus)

    # -- setup ----------------------------------------------------------------------
    def _enable_peer_access(self, gpus) -> None:
        rt = _Cudart.get()
        ids = {i: self.devices[i].index for i in gpus}

        def can(i, j):
            v = ctypes.c_int(0)
            rc = rt.lib.cudaDeviceCanAccessPeer(ctypes.byref(v), ids[i], ids[j])
            return rc == 0 and v.value == 1

        for i, j in peer_access_pairs(len(self.devices), lambda a, b: a in ids and b in ids and can(a, b)):
            rt.check(rt.lib.cudaSetDevice(ids[i]), "cudaSetDevice")
            rc = rt.lib.cudaDeviceEnablePeerAccess(ids[j], 0)
            if rc in (0, 704):  # 704: cudaErrorPeerAccessAlreadyEnabled
                self.peer.add((i, j))
                if rc == 704:
                    rt.lib.cudaGetLastError()

    def bind(self, d: int) -> None:
        """Make stream ``d`` the current stream of the calling thread for device ``d``
        (call once at the start of that device's worker thread)."""
        if self.streams[d] is not None:
            self.devices[d].set_raw_stream(self.streams[d])

    # -- dependencies ------------------------------------------------------------------
    def wait(self, src: int, dst: int) -> None:
        """Make device ``dst``'s stream wait for everything queued so far on ``src``'s
        stream, without blocking the host. No-op when either is not a GPU."""
        s, t = self.streams[src] if src < len(self.streams) else None, \
            self.streams[dst] if dst < len(self.streams) else None
        if s is None or t is None or src == dst:
            return None
        self._sync_from_to(self.devices[src], s, t)
        return None

    def synchronize(self, d: int | None = None) -> None:
        """Block the host until device ``d``'s stream (all GPU streams when None) is done."""
        for i, s in enumerate(self.streams):
            if s is not None and (d is None or i == d):
                self.devices[i].sync(s)

    # -- copies ----------------------------------------------------------------------------
    def copy(self, value, src: int, dst: int):
        """Copy a tensor produced on ``src`` to ``dst``: queued on ``src``'s stream after the
        producer's kernels, and ``dst``'s stream waits for it. CPU ends fall back to
        ``Tensor.copyto`` after synchronizing the GPU stream involved."""
        if isinstance(value, (tuple, list)):
            return tuple(self.copy(v, src, dst) for v in value)
        sdev, ddev = self.devices[src], self.devices[dst]
        if not (_is_cuda(sdev) and _is_cuda(ddev)):
            if _is_cuda(sdev):
                self.synchronize(src)
            out = value.copyto(ddev)
            return out
        out = tvm.runtime.empty(tuple(value.shape), str(value.dtype), ddev)
        nbytes = _nbytes(value)
        rt = _Cudart.get()
        stream = ctypes.c_void_p(_stream_int(self.streams[src]))
        if sdev.index == ddev.index:
            rt.check(rt.lib.cudaMemcpyAsync(out.data_ptr(), value.data_ptr(), nbytes, _MEMCPY_DEFAULT, stream),
                     "cudaMemcpyAsync")
        else:
            rt.check(rt.lib.cudaMemcpyPeerAsync(out.data_ptr(), ddev.index, value.data_ptr(), sdev.index, nbytes,
                                                stream), "cudaMemcpyPeerAsync")
        self.wait(src, dst)
        return out

    def close(self) -> None:
        for i, s in enumerate(self.streams):
            if s is not None:
                self.devices[i].sync(s)
                self.devices[i].free_raw_stream(s)
                self.streams[i] = None


def _is_cuda(dev) -> bool:
    return dev is not None and dev.dlpack_device_type() == tvm.cuda(0).dlpack_device_type()


def _nbytes(t) -> int:
    n = 1
    for s in t.shape:
        n *= int(s)
    dt = tvm.runtime.DataType(str(t.dtype))
    return n * dt.bits * dt.lanes // 8


def _stream_int(s) -> int:
    v = getattr(s, "value", s)
    return int(v or 0)
