"""Python face of the C++ core (``libtvm_pesto_core``, built from ``src/`` by ``pip install``).

Importing this module raises :class:`ImportError` when the library was not built, so callers
can fall back to the pure-Python reference (:mod:`tvm_pesto.plan.reference`).

The library is a tvm-ffi module: its functions take DLPack tensors and write into outputs
that Python allocates (destination-passing style).
"""
from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import CycleError, PlanError

try:
    import tvm_ffi
except ImportError as err:  # pragma: no cover - tvm-ffi is a hard dependency
    raise ImportError(f"tvm_pesto._core needs apache-tvm-ffi ({err})") from err

if sys.platform.startswith("win"):
    LIB_NAME = "tvm_pesto_core.dll"
elif sys.platform == "darwin":
    LIB_NAME = "libtvm_pesto_core.dylib"
else:
    LIB_NAME = "libtvm_pesto_core.so"


def library_path() -> Path:
    """Where the built core library is.

    Looks at ``$TVM_PESTO_CORE_LIB`` and then in every folder of the ``tvm_pesto`` package
    (an editable install spreads the package over the source tree and site-packages).

    Raises
    ------
    ImportError
        If the library is not found.

    Examples
    --------
    >>> from tvm_pesto import _core
    >>> _core.library_path().name
    'libtvm_pesto_core.so'
    """
    env = os.environ.get("TVM_PESTO_CORE_LIB")
    if env:
        if Path(env).is_file():
            return Path(env)
        raise ImportError(f"TVM_PESTO_CORE_LIB={env} is not a file; unset it or point it at {LIB_NAME}")
    package = sys.modules[__package__]
    folders = list(getattr(package, "__path__", [])) or [str(Path(__file__).parent)]
    for folder in folders:
        path = Path(folder) / LIB_NAME
        if path.is_file():
            return path
    # Running from a source checkout (e.g. `python -c` in the repository root) imports the
    # source tree, which holds no library; the installed distribution may have one.
    try:
        path = Path(distribution("tvm-pesto").locate_file(f"tvm_pesto/{LIB_NAME}"))
        if path.is_file():
            return path
    except (PackageNotFoundError, ImportError, OSError):
        pass
    raise ImportError(f"tvm_pesto's C++ core ({LIB_NAME}) is not built (looked in {folders}); "
                      "run `pip install .` or `pip install -e .` in the tvm-pesto source tree")


class _Deadlock(RuntimeError):
    """Raised by the C++ simulator when a plan deadlocks; turned into PlanError here."""


tvm_ffi.register_error("TvmPestoDeadlock", _Deadlock)

try:
    _LIB = tvm_ffi.load_module(str(library_path()))
    _SIMULATE = _LIB["simulate"]
    _LIST_SCHEDULE = _LIB["list_schedule"]
except ImportError:
    raise
except Exception as err:  # a stale or broken build must not break `import tvm_pesto`
    raise ImportError(f"tvm_pesto's C++ core could not be loaded ({err}); rebuild it with "
                      "`pip install .`") from err


def _tensor(arr: np.ndarray, dtype) -> "tvm_ffi.Tensor":
    arr = np.ascontiguousarray(arr, dtype=dtype)
    if not arr.flags.writeable:  # numpy refuses to export read-only arrays via DLPack
        arr = arr.copy()
    return tvm_ffi.from_dlpack(arr)


def _flatten_order(order: Sequence[Sequence[int]], num_devices: int) -> tuple[np.ndarray, np.ndarray]:
    if len(order) != num_devices:
        raise PlanError(f"plan has orders for {len(order)} devices; the cluster has {num_devices}")
    sizes = np.array([len(seq) for seq in order], dtype=np.int64)
    offsets = np.zeros(num_devices + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    if sizes.sum():
        flat = np.concatenate([np.asarray(seq, dtype=np.int32).reshape(-1) for seq in order])
    else:
        flat = np.zeros(0, dtype=np.int32)
    return flat, offsets


def simulate(g, assignment, order, cost):
    """Simulate a plan in C++; same arguments and result as
    :func:`tvm_pesto.plan.reference.simulate_reference`.

    Parameters
    ----------
    g : SimArrays
        The graph and links (:class:`tvm_pesto.plan.reference.SimArrays`, with ``mem``).
    assignment : array of int, shape (n,)
        Device of each node.
    order : list of list of int, or (flat, offsets)
        ``order[d]``: the nodes device ``d`` runs, in order; or already flattened: every
        device's order one after another (``flat``) and where each starts (``offsets``,
        ``d + 1`` entries).
    cost : array of float, shape (n,)
        Seconds each node takes on its device.

    Returns
    -------
    start, finish : ndarray, shape (n,)
    busy, peak : ndarray, shape (d,)
    transfers : ndarray, shape (k, 6)
        Rows ``(producer, src_dev, dst_dev, start, end, bytes)`` in the order they were queued.

    Raises
    ------
    PlanError
        If the orders do not cover every node once on its device, or the plan deadlocks.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm_pesto import _core
    >>> from tvm_pesto.plan.reference import SimArrays
    >>> g = SimArrays(2, np.array([0]), np.array([1]), np.array([8.0]), np.zeros((2, 2)), np.full((2, 2), 0.25), 2,
    ...               mem=np.zeros(2))
    >>> start, finish, busy, peak, tx = _core.simulate(g, np.array([0, 1]), [[0], [1]], np.array([1.0, 1.0]))
    >>> finish.tolist(), tx.tolist()
    ([1.0, 4.0], [[0.0, 0.0, 1.0, 1.0, 3.0, 8.0]])
    """
    n, d, hosts = g.n, int(g.num_devices), g.hosts
    src = np.asarray(g.src, dtype=np.int32).reshape(-1)
    dst = np.asarray(g.dst, dtype=np.int32).reshape(-1)
    assignment = np.asarray(assignment, dtype=np.int32).reshape(-1)
    if assignment.shape != (n,):
        raise PlanError(f"plan assigns {assignment.shape[0]} nodes; the graph has {n}")
    if isinstance(order, tuple) and len(order) == 2 and isinstance(order[0], np.ndarray):
        flat, offsets = order
        if offsets.shape != (d + 1,):
            raise PlanError(f"plan has order offsets for {offsets.shape[0] - 1} devices; the cluster has {d}")
    else:
        flat, offsets = _flatten_order(order, d)
    if flat.shape[0] != n:
        raise PlanError(f"the orders list {flat.shape[0]} slots for {n} nodes; each node needs exactly one")
    # At most one transfer per (producer, destination device): bounded by the cross-device
    # edges and by n * (d - 1).
    if len(src) and n:
        cross = int(np.count_nonzero(assignment[src] != assignment[dst]))
    else:
        cross = 0
    rows = min(cross, n * max(d - 1, 0))
    hosts = np.zeros(d, dtype=np.int32) if hosts is None else np.asarray(hosts, dtype=np.int32).reshape(-1)
    if hosts.shape != (d,):
        raise PlanError(f"hosts names {hosts.shape[0]} devices; the cluster has {d}")
    start = np.empty(n)
    finish = np.empty(n)
    busy = np.empty(d)
    peak = np.empty(d)
    transfers = np.empty((rows, 6))
    blocked = np.full(d, -1, dtype=np.int32)
    args = [
        _tensor(src, np.int32), _tensor(dst, np.int32), _tensor(g.ebytes, np.float64),
        _tensor(assignment, np.int32), _tensor(flat, np.int32), _tensor(offsets, np.int32),
        _tensor(cost, np.float64), _tensor(g.latency, np.float64), _tensor(g.inv_bw, np.float64),
        _tensor(g.mem, np.float64), _tensor(hosts, np.int32),
    ]
    outs = [tvm_ffi.from_dlpack(a) for a in (start, finish, busy, peak, transfers, blocked)]
    try:
        k = _SIMULATE(*args, *outs)
    except _Deadlock as err:
        raise PlanError(str(err)) from None
    except (ValueError, TypeError) as err:
        raise PlanError(f"the simulator rejected the plan: {err}") from None
    return start, finish, busy, peak, transfers[:k]


def list_schedule(g, costs, priority, assignment):
    """Order each device's nodes by insertion-free list scheduling, for a fixed assignment.

    Ready nodes (all predecessors placed) are taken smallest ``(priority, id)`` first; each is
    appended to its device's order and starts when its device is free and its inputs have
    arrived (``latency + bytes * inv_bw`` after the producer finishes, for the largest edge
    from the producer to that device; link contention is ignored, the simulator adds it).

    Parameters
    ----------
    g : SimArrays
        The graph and links (:class:`tvm_pesto.plan.reference.SimArrays`; ``mem`` and
        ``hosts`` are not read).
    costs : array of float, shape (n, d)
        Seconds of each node on each device.
    priority : array of float, shape (n,)
        Smaller runs earlier when several nodes are ready (e.g. minus the upward rank).
    assignment : array of int, shape (n,)

    Returns
    -------
    order : list of list of int
        Per-device order, usable as ``Plan(assignment, order)``.
    start, finish : ndarray, shape (n,)
        The scheduler's estimates (no link contention).

    Raises
    ------
    CycleError
        If the graph has a cycle.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm_pesto import _core
    >>> from tvm_pesto.plan.reference import SimArrays
    >>> g = SimArrays(3, np.array([0, 0]), np.array([1, 2]), np.zeros(2), np.zeros((1, 1)), np.zeros((1, 1)), 1)
    >>> order, start, finish = _core.list_schedule(g, np.ones((3, 1)), np.array([0.0, 2.0, 1.0]), np.zeros(3))
    >>> order
    [[0, 2, 1]]
    """
    n, d = g.n, int(g.num_devices)
    assignment = np.asarray(assignment, dtype=np.int32).reshape(-1)
    if assignment.shape != (n,):
        raise PlanError(f"assignment has {assignment.shape[0]} nodes; the graph has {n}")
    flat = np.zeros(n, dtype=np.int32)
    offsets = np.zeros(d + 1, dtype=np.int32)
    start = np.empty(n)
    finish = np.empty(n)
    args = [
        _tensor(g.src, np.int32), _tensor(g.dst, np.int32), _tensor(g.ebytes, np.float64),
        _tensor(np.asarray(costs, dtype=np.float64).reshape(n, d), np.float64),
        _tensor(g.latency, np.float64), _tensor(g.inv_bw, np.float64),
        _tensor(priority, np.float64), _tensor(assignment, np.int32),
    ]
    outs = [tvm_ffi.from_dlpack(a) for a in (flat, offsets, start, finish)]
    try:
        placed = _LIST_SCHEDULE(*args, *outs)
    except (ValueError, TypeError) as err:
        raise PlanError(f"list scheduling rejected its input: {err}") from None
    if placed != n:
        raise CycleError(f"the graph has a cycle through {n - placed} nodes, so no order exists; "
                         "break the cycle before placing the graph")
    order = [flat[offsets[k]:offsets[k + 1]].tolist() for k in range(d)]
    return order, start, finish
