"""Time candidates on a device behind a TVM RPC tracker.

A device with ``rpc_key`` set (``Device.rpc_tracker`` = ``HOST:PORT``) is measured there:
the measurement module is built here for the device's target, exported as a shared
library, uploaded to a server the tracker hands out for the key, loaded there with TVM's
runtime and timed with the same ``time_evaluator`` calls as a local device
(:mod:`tvm_pesto.costs.measure.timing`). Records go to the cache under the remote device's key
(:func:`tvm_pesto.costs.store.cache.measure_target`), so a local and a remote device of the same
target never share a measurement. Library backends (ONNX Runtime, PyTorch) run in this
process only: on a remote device their candidates are not measured (``inf``). ``tvm-pesto
tune`` times MetaSchedule's schedules the same way, one session per search round
(:class:`tvm_pesto.costs.tune.ms_measure.InProcessMeasurer`).

The other side is TVM's own::

    python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port 9190
    python -m tvm.exec.rpc_server --host 127.0.0.1 --port 9090 --tracker 127.0.0.1:9190 --key cpu2

A TVM RPC server runs any module uploaded to it: keep trackers and servers on 127.0.0.1 or
a trusted network (docs/distributed.md).

Faults. A tracker that refuses the connection, or does not answer within
:data:`CONNECT_TIMEOUT_S`, a key no server is registered under, and a session that ends
early (the server's ``session_timeout`` passed, the server died) raise
:class:`~tvm_pesto.errors.CostError` saying what to start or raise; what was measured
before stays in the cache, one complete record per line.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> c = remote_cluster(parse_cluster("cpu:1"), "127.0.0.1:9190", "cpu2")
>>> c.devices[0].rpc_tracker, c.devices[0].remote
('127.0.0.1:9190', True)
>>> parse_tracker("localhost:9190")
('localhost', 9190)
"""
from __future__ import annotations

import os
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import replace

from ...cluster.cluster import Cluster
from ...errors import CostError

#: Seconds to reach the tracker and get its answers.
CONNECT_TIMEOUT_S = 10.0
#: Seconds a server keeps one measurement session (it kills the session after that); read
#: when a session starts, so it can be changed at run time.
SESSION_TIMEOUT_S = 600.0


def parse_tracker(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` as ``(host, port)``.

    Raises
    ------
    CostError
        When it is not ``HOST:PORT`` with an integer port.
    """
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CostError(f"RPC tracker address {text!r} is not HOST:PORT; give e.g. --rpc-tracker 127.0.0.1:9190")
    return host, int(port)


def remote_cluster(cluster, tracker: str, key: str):
    """A copy of ``cluster`` whose every device is measured on the tracker's ``key`` servers.

    Raises
    ------
    CostError
        For a malformed tracker address or an empty key.
    """
    parse_tracker(tracker)
    if not str(key).strip():
        raise CostError("an RPC measurement needs the key its servers registered under: give --rpc-key KEY")
    devs = [replace(d, rpc_tracker=str(tracker), rpc_key=str(key).strip()) for d in cluster.devices]
    return Cluster(cluster.name, devs, cluster.latency.copy(), cluster.bandwidth.copy(), dict(cluster.meta),
                   list(cluster.hosts))


def _tracker(device):
    """A connected ``TrackerSession`` for ``device`` (its sockets time out), after checking
    that a server is registered under the device's key."""
    from tvm import rpc

    host, port = parse_tracker(device.rpc_tracker)
    start = (f"start one with `python -m tvm.exec.rpc_tracker --host {host} --port {port}`, or fix "
             "--rpc-tracker")
    try:  # TVM's own connect retries a refused connection for a minute: ask once first
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise CostError(f"the RPC tracker at {host}:{port} did not accept a connection ({type(e).__name__}: {e}); "
                        f"{start}") from None
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(CONNECT_TIMEOUT_S)  # the tracker session's socket is made inside TVM
    try:
        tracker = rpc.connect_tracker(host, port)
        summary = tracker.summary()
    except (OSError, RuntimeError) as e:
        raise CostError(f"{host}:{port} did not answer as an RPC tracker within {CONNECT_TIMEOUT_S:g} s "
                        f"({type(e).__name__}: {e}); {start}") from None
    finally:
        socket.setdefaulttimeout(old)
    keys = sorted({str(s.get("key", "")).split(":", 1)[-1] for s in summary.get("server_info", [])})
    if device.rpc_key not in keys:
        raise CostError(f"no RPC server is registered under key {device.rpc_key!r} at the tracker {host}:{port} "
                        f"(keys there: {', '.join(keys) or 'none'}); start one with `python -m tvm.exec.rpc_server "
                        f"--tracker {host}:{port} --key {device.rpc_key}` or fix --rpc-key")
    return tracker


class RemoteRunner:
    """One measurement session on a remote device: upload an executable, get its VM there.

    Use as a context manager (:func:`remote_session`); ``dev`` is the remote device.
    """

    def __init__(self, device, session_timeout_s: float | None = None):
        self.device = device
        self.session_timeout_s = float(SESSION_TIMEOUT_S if session_timeout_s is None else session_timeout_s)
        tracker = _tracker(device)
        tracker._sock.settimeout(CONNECT_TIMEOUT_S)  # a request the tracker cannot serve must not wait forever
        try:
            self.sess = tracker.request(device.rpc_key, session_timeout=self.session_timeout_s, max_retry=1)
        except (OSError, RuntimeError) as e:
            raise CostError(f"the RPC tracker {device.rpc_tracker} did not hand out a {device.rpc_key!r} server within "
                            f"{CONNECT_TIMEOUT_S:g} s (all busy, or gone: {e}); try again, or start more servers") \
                from None
        finally:
            tracker.close()
        self.dev = self.sess.cpu(0) if device.kind == "cpu" else self.sess.cuda(device.index)
        cfg = None
        try:
            cfg = self.sess.get_function("runtime.config_threadpool")
        except Exception:  # noqa: BLE001 - an older server: its pool keeps its own size
            pass
        if cfg is not None and device.kind == "cpu":
            cfg(1, max(1, int(device.cores)))  # the device's cores, as a local measurement uses

    def load(self, module, name: str):
        """Export ``module`` (a built executable or kernel library), upload it as ``name``.so
        and return the module loaded there (a ``.so``: the server needs no compiler)."""
        with tempfile.TemporaryDirectory(prefix="tvm-pesto-rpc-") as tmp:
            path = os.path.join(tmp, f"{name}.so")
            module.export_library(path)
            self.sess.upload(path)
        return self.sess.load_module(f"{name}.so")

    def vm(self, executable, name: str):
        """Export ``executable``, upload it as ``name``.so and return its VM on :attr:`dev`."""
        from tvm import relax

        return relax.VirtualMachine(self.load(executable, name), self.dev)

    def close(self) -> None:
        self.sess = None


@contextmanager
def remote_session(device, session_timeout_s: float | None = None):
    """A :class:`RemoteRunner` for ``device``; an RPC failure inside becomes a
    :class:`~tvm_pesto.errors.CostError` that says the session ended.

    Raises
    ------
    CostError
        As the module docstring says.
    """
    runner = RemoteRunner(device, session_timeout_s)
    try:
        yield runner
    except CostError:
        raise
    except Exception as e:  # noqa: BLE001 - TVM's RPC errors come as TVMError/RuntimeError
        text = str(e).strip().splitlines()
        raise CostError(f"the RPC session on {device.rpc_key!r} ({device.rpc_tracker}) ended early: "
                        f"{type(e).__name__}: {text[-1] if text else ''}; the server may have timed out (the session "
                        f"lasts {runner.session_timeout_s:g} s) or died. What was measured before stays in the "
                        "cache; run again to measure the rest") from e
    finally:
        runner.close()


__all__ = ["CONNECT_TIMEOUT_S", "RemoteRunner", "SESSION_TIMEOUT_S", "parse_tracker", "remote_cluster",
           "remote_session"]
