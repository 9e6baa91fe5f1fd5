"""The interface every backend implements.

A backend runs some subgraphs of a Relax ``main`` function. It says which ones through
Relax dataflow patterns (``tvm.relax.dpl``) with optional ``_check_*`` predicates (as in
TVM's ``relax/backend/cuda/cudnn.py``), and builds a subgraph function into a tvm-ffi
global function that the lowered module calls with ``R.call_dps_packed``.

Calling convention of a built global function ``pesto.<backend>.<key>``::

    f(*inputs, *outputs) -> None

``inputs`` are the subgraph function's parameters in order (``tvm.runtime.Tensor``);
``outputs`` are preallocated tensors, one per tensor the function returns (a tuple result
is flattened), and ``f`` writes into them (DLPack, zero copy). Constants inside the
subgraph are captured by the built callable (weights, ONNX initializers), so equal-shaped
subgraphs with different weights get different global names.

Patterns and their checks are in :mod:`tvm_pesto.backends.patterns`, the readers of Relax
calls (shapes, dtypes, attributes) in :mod:`tvm_pesto.backends.relax_calls`; this module
re-exports them.
"""
from __future__ import annotations

import abc
import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from ..errors import BuildError, PestoError, error_line
from ..run.libraries.loaders import direct_call, register_unit
# re-exported: the backends and the candidate generator import these from here
from .patterns import CheckFn, MatchContext, PatternEntry, default_check, op_level_patterns, region_check  # noqa: F401
from .relax_calls import (  # noqa: F401
    call_attrs, dtype_of, function_bindings, op_short_name, output_types, pads4, prim_value, shape_value, static_shape,
)

#: Prefix of every global function a backend registers.
GLOBAL_PREFIX = "pesto"


class BackendUnavailableError(PestoError):
    """A backend's library is missing or unusable on this machine."""


@dataclass(frozen=True)
class BuiltUnit:
    """One subgraph a backend built: what :meth:`Backend.build` registered, and from what.

    Holding it keeps the callable (its library session, weights and threads) alive, and
    :meth:`Backend.artifact` exports it, after :meth:`Backend.release` (or
    :func:`~tvm_pesto.backends.release_all`) has dropped the backend's own reference and
    unregistered the name: a placed model keeps the units it was built with this way.

    Attributes
    ----------
    name : str
        The global function's name (``pesto.<backend>.<key>.c<cores>``).
    backend : str
        The backend's name.
    func : relax.Function
        The subgraph function it was built from.
    device : Device
        The device it was built for.
    fn : callable
        The callable registered under ``name``.
    build_s : float
        Seconds the backend took to make ``fn`` (compiling the subgraph in its library).
    """

    name: str
    backend: str
    func: relax.Function
    device: object
    fn: Callable
    build_s: float = 0.0


class Backend(abc.ABC):
    """A library that can run subgraphs of a Relax function.

    Subclasses set ``name`` and ``device_kinds`` and implement :meth:`patterns`,
    :meth:`available` and :meth:`make_callable` (:meth:`build` registers it).
    ``graph_level`` backends (ONNX Runtime) are also offered every convex region of ops
    they support (:meth:`supports_op`) and windows of it; ``tvm_groups`` backends are
    offered TVM's fusion groups; ``max_ops`` bounds the depth of fused pattern chains.

    Examples
    --------
    >>> from tvm_pesto.backends import get_backend
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> from tvm_pesto.cluster import parse_cluster
    >>> func, device = tiny_mlp()[0]["main"], parse_cluster("cpu:1").devices[0]
    >>> bk = get_backend("torch")
    >>> ok, why = bk.available()
    >>> gname = bk.build(func, device)
    >>> ok, gname
    (True, 'pesto.torch...')
    >>> # then: relax.call_dps_packed(gname, args, out_ty)
    """

    name: str = ""
    device_kinds: tuple[str, ...] = ("cpu",)
    graph_level: bool = False
    max_ops: int = 4
    #: candidates stay as Relax ops in the placed module (only the ``tvm`` backend)
    native: bool = False
    #: candidates are TVM's fusion groups, their sub-chains and single ops (TVM variants)
    tvm_groups: bool = False
    #: bump when the backend's converters change: cached "cannot build" marks of another
    #: version are retried
    version: str = "2"
    #: a backend the cost model stands in for this one until it is trained on it (the ``xgb``
    #: source predicts its candidates as that backend's; None: the roofline estimate)
    cost_proxy: str | None = None
    #: its units have a call on numpy arrays (:meth:`direct_call`), which a program that is one
    #: unit of it runs instead of the VM; a candidate of the whole model is timed as that call
    direct: bool = False
    #: seconds to build a unit, ``(fixed, per op)``, until builds of it are recorded on this
    #: machine (:mod:`tvm_pesto.costs.measure.build_time` fits them then)
    build_s_guess: tuple[float, float] = (0.0, 0.0)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[str, BuiltUnit] = {}  # global name -> what was built under it

    # -- what it accepts -------------------------------------------------------------
    @abc.abstractmethod
    def patterns(self) -> list[PatternEntry]:
        """``[(pattern_name, dpl pattern, check fn or None), ...]``, longest first."""

    def supports_op(self, call: relax.Call) -> bool:
        """Whether a single call can be part of a graph-level subgraph (graph_level only)."""
        return False

    def supports_device(self, device) -> bool:
        return getattr(device, "kind", "cpu") in self.device_kinds

    # -- can it run here --------------------------------------------------------------
    @abc.abstractmethod
    def available(self) -> tuple[bool, str]:
        """``(True, "")`` or ``(False, reason)``; never raises."""

    def require(self) -> None:
        ok, why = self.available()
        if not ok:
            raise BackendUnavailableError(f"backend {self.name!r} is unavailable: {why}")

    # -- build ------------------------------------------------------------------------
    def global_name(self, key: str, device) -> str:
        """The registered name for instance ``key`` built for ``device``. CPU callables use
        the device's core count (not its core ids), so the name carries ``c<cores>`` and CPU
        devices of one size share a build; GPU backends should add the device index."""
        return f"{GLOBAL_PREFIX}.{self.name}.{key}.c{device_cores(device)}"

    @abc.abstractmethod
    def make_callable(self, func: relax.Function, device) -> Callable:
        """A Python callable ``f(*inputs, *outputs)`` that computes ``func`` into ``outputs``."""

    def build(self, func: relax.Function, device, key: str | None = None) -> str:
        """Register ``func`` as a tvm-ffi global function and return its name.

        ``key`` names the instance (default: a hash of the function including constant
        values). Building the same key twice returns the existing name.

        Raises
        ------
        BuildError
            When the backend cannot build this subgraph (the search marks it infeasible).
        """
        self.require()
        if not self.supports_device(device):
            raise BuildError(f"backend {self.name!r} runs on {', '.join(self.device_kinds)} devices, not on "
                             f"{getattr(device, 'name', device)!r}; choose another backend for it")
        if key is None:
            key = instance_key(func)
        gname = self.global_name(key, device)
        with self._lock:
            if gname in self._built:
                return gname
        t0 = time.perf_counter()
        try:
            fn = self.make_callable(func, device)
        except BuildError as e:
            raise BuildError(f"backend {self.name!r} cannot build this subgraph: {e}; it stays on another "
                             "backend") from e
        except PestoError:
            raise
        except Exception as e:  # noqa: BLE001 - any library error means "cannot build this one"
            raise BuildError(f"backend {self.name!r} cannot build this subgraph: {error_line(e)}; "
                             "it stays on another backend") from e
        register_unit(gname, fn)
        with self._lock:
            self._built[gname] = BuiltUnit(gname, self.name, func, device, fn, time.perf_counter() - t0)
        return gname

    def has_built(self) -> bool:
        """Whether this backend holds any unit it built (and has not released)."""
        with self._lock:
            return bool(self._built)

    def is_built(self, func: relax.Function, device) -> bool:
        """Whether :meth:`build` of ``func`` for ``device`` would return a unit it holds."""
        name = self.global_name(instance_key(func), device)
        with self._lock:
            return name in self._built

    def built(self, gname: str) -> BuiltUnit:
        """What this backend built as ``gname`` (and has not released since).

        Raises
        ------
        BuildError
            When it did not build ``gname`` in this process, or released it since.
        """
        with self._lock:
            hit = self._built.get(gname)
        if hit is None:
            raise BuildError(f"backend {self.name!r} did not build {gname!r} in this process (or released it "
                             "since: release_all()); build the placed model again")
        return hit

    def direct_call(self, gname: str):
        """Unit ``gname``'s call on numpy arrays, ``f(*arrays) -> list of arrays``, which a
        program that is this one unit runs instead of the VM; None when its library has none."""
        return direct_call(gname)

    # -- deploy -----------------------------------------------------------------------
    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        """Write what runs ``func`` without TVM's compiler into ``out_dir`` (files named
        ``stem.*``) and return its description: ``{"kind": ..., "files": [...], ...}``.

        ``kind`` names the loader in :mod:`tvm_pesto.run.libraries.loaders` that turns the files
        back into the calling convention above. The default says the backend cannot.

        Raises
        ------
        BuildError
            When the backend has no deployable form.
        """
        raise BuildError(f"backend {self.name!r} cannot export its subgraphs for deployment yet; build the "
                         "model with backends that can (tvm, onnxruntime, torch, tvm-ms)")

    def artifact(self, unit: BuiltUnit | str, out_dir: str, stem: str) -> dict:
        """:meth:`export_artifact` for a unit this backend built: a :class:`BuiltUnit` (kept
        by its holder, whatever was released since), or its global name (looked up with
        :meth:`built`).

        Raises
        ------
        BuildError
            When ``unit`` is a name this backend does not hold, or another backend's unit.
        """
        if isinstance(unit, str):
            unit = self.built(unit)
        if unit.backend != self.name:
            raise BuildError(f"{unit.name!r} was built by backend {unit.backend!r}, not {self.name!r}; export it "
                             f"with get_backend({unit.backend!r})")
        meta = self.export_artifact(unit.func, unit.device, out_dir, stem)
        meta.update(name=unit.name, backend=self.name, num_inputs=len(unit.func.params),
                    num_outputs=len(output_types(unit.func)), cores=device_cores(unit.device))
        return meta

    def release(self, names=None) -> int:
        """Unregister every global function this backend built (or those of ``names``) and
        drop its references to them (their sessions, weights and worker threads are freed
        once no one else holds them: a placed model keeps the :class:`BuiltUnit` of each of
        its units). Returns how many were removed."""
        import tvm_ffi

        with self._lock:
            names = [n for n in (self._built if names is None else names) if n in self._built]
            for n in names:
                del self._built[n]
        for n in names:
            try:
                tvm_ffi.remove_global_func(n)
            except Exception:  # noqa: BLE001 - already gone
                pass
        trim_heap()
        return len(names)


_libc_trim = None


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere): a released unit's library frees its weights and arenas, and glibc may keep
    the freed pages of its per-thread arenas mapped, counted in the build's resident memory."""
    global _libc_trim
    if _libc_trim is None:
        try:
            import ctypes  # lazy: only where units are released

            _libc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to give back this way
            _libc_trim = False
    if _libc_trim:
        _libc_trim(0)


#: Constants whose digests :func:`constant_digest` keeps (the least recently used go first).
DIGESTS_KEPT = 512
_digests: "OrderedDict" = OrderedDict()
_digests_lock = threading.Lock()


def forget_constants() -> None:
    """Drop the constants :func:`constant_digest` holds (the end of a build: their model may go)."""
    with _digests_lock:
        _digests.clear()


def constant_digest(c) -> bytes:
    """A digest of a Relax constant's value. The candidates of one model share their weights'
    constants, and a weight of 150 MB takes a quarter of a second to read: each constant is
    read once while it stays among the :data:`DIGESTS_KEPT` last asked for (held here, so no
    other constant can take its address meanwhile, until :func:`forget_constants`)."""
    v = c.value
    if not hasattr(v, "numpy"):  # a scalar (a shape's integers): no tensor to read
        return repr(v).encode()
    handle = hash(c)  # the object's address: one per live object
    with _digests_lock:
        hit = _digests.get(handle)
        if hit is not None and hit[0].same_as(c):
            _digests.move_to_end(handle)
            return hit[1]
    arr = np.ascontiguousarray(v.numpy())
    m = hashlib.blake2b(digest_size=16)
    m.update(f"{arr.dtype}{arr.shape}".encode())
    m.update(memoryview(arr).cast("B"))
    digest = m.digest()
    with _digests_lock:
        _digests[handle] = (c, digest)
        while len(_digests) > DIGESTS_KEPT:
            _digests.popitem(last=False)
    return digest


def instance_key(func: relax.Function) -> str:
    """A hex key of ``func`` including its constants' values (so weights are told apart):
    its structure hashed without the tensors' contents, then each constant's
    :func:`constant_digest`.

    Examples
    --------
    >>> x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    >>> def scaled(w):
    ...     bb = relax.BlockBuilder()
    ...     with bb.function("main", [x]):
    ...         bb.emit_func_output(bb.emit(relax.op.multiply(x, relax.const(w))))
    ...     return bb.get()["main"]
    >>> ones = np.ones((2, 3), "float32")
    >>> instance_key(scaled(ones)) == instance_key(scaled(ones.copy())) != instance_key(scaled(2 * ones))
    True
    """
    import tvm_ffi

    h = tvm_ffi.structural_hash(func, map_free_vars=True, skip_tensor_content=True) & 0xFFFFFFFFFFFFFFFF
    consts = _constants(func)
    if consts:  # the structural hash skipped the tensors' contents: fold them in
        m = hashlib.blake2b(digest_size=8)
        m.update(h.to_bytes(8, "little"))
        for c in consts:
            m.update(constant_digest(c))
        return m.hexdigest()
    return f"{h:016x}"


def _constants(func: relax.Function) -> list:
    """The constants ``func`` uses, in visiting order (a constant used twice, twice)."""
    consts = []

    def visit(e):
        if isinstance(e, tvm.ir.Constant):
            consts.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return consts


def constant_bytes(func: relax.Function) -> int:
    """Bytes of the tensors among ``func``'s constants (its weights), each counted once.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> constant_bytes(tiny_mlp()[0]["main"])  # (16 + 16 + 16x32 + 32 + 32x16 + 1) float32s
    4356
    """
    seen, total = set(), 0
    for c in _constants(func):
        v = c.value
        if hasattr(v, "numpy") and hash(c) not in seen:  # a tensor, not a scalar's FloatImm
            seen.add(hash(c))
            total += int(np.prod(v.shape, dtype=np.int64)) * np.dtype(str(v.dtype)).itemsize
    return total


def device_cores(device) -> int:
    """Threads a CPU library call should use on ``device``: its core count (at least 1);
    the calling thread's affinity when the device does not say."""
    cores = getattr(device, "cores", None)
    return max(1, int(cores)) if cores else calling_thread_cores()


def calling_thread_cores() -> int:
    """How many cores the calling thread may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
