"""Ray for tvm-pesto: connect to a cluster, or start a local head on 127.0.0.1.

A local head that tvm-pesto starts listens on 127.0.0.1 only (Ray 2.60 has no public switch
for that: it rewrites a loopback node address to the machine's IP, so the session turns that
rewrite off while ``ray.init`` runs). A Ray cluster runs any task submitted to it, so it
belongs on a trusted network only (docs/distributed.md).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
from contextlib import contextmanager

from ...errors import ExecutionError, error_line


def import_ray():
    """Ray with compiled graphs (``ray.dag``), or an :class:`ExecutionError` saying how to install it."""
    try:
        import ray
        import ray.dag  # noqa: F401
    except ImportError as e:
        raise ExecutionError(f"the Ray executor needs Ray with compiled graphs ({e}); install it with "
                             "pip install 'tvm-pesto[distributed]' (ray[cgraph]==2.60.0)") from e
    return ray


@contextmanager
def _loopback_only():
    """While a local head starts: keep Ray's node address on 127.0.0.1 (Ray otherwise
    replaces a loopback address by the machine's IP, and its servers then listen on every
    interface)."""
    from ray._private import ray_constants

    old = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old


class RaySession:
    """Ray for tvm-pesto: an existing cluster (``address``), the one this process is
    already connected to, or a local one started here on 127.0.0.1 with ``num_cpus``
    (default: this machine's usable cores). :meth:`close` shuts Ray down if this session
    started or connected it.

    Raises
    ------
    ExecutionError
        When Ray is not installed or cannot start or connect (the message says why).
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        ray = import_ray()
        self.address = address
        self.owned = False
        if ray.is_initialized():
            return
        loopback = False
        if address:
            loopback = _check_reachable(address)
        try:
            if address:
                # a head on 127.0.0.1 (as a local one tvm-pesto starts): keep the address loopback
                with _loopback_only() if loopback else _nothing():
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
            else:
                n = num_cpus or len(os.sched_getaffinity(0))
                with _loopback_only():
                    ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except Exception as e:  # noqa: BLE001 - Ray raises many types; explain at our boundary
            where = f"connect to the Ray cluster at {address}" if address else "start a local Ray"
            hint = ""
            if address:
                hint = "; check the address and that `ray start --head` runs there"
                if "RAY_AUTH_MODE" not in os.environ:  # Ray sends its token to a named address only when told
                    hint += (" (a cluster with token authentication, Ray's default, also needs RAY_AUTH_MODE=token "
                             "in the environment before Python starts, and the cluster's token in "
                             "~/.ray/auth_token or RAY_AUTH_TOKEN)")
            raise ExecutionError(f"could not {where}: {error_line(e)}"
                                 + hint) from e
        self.owned = True
        logging.getLogger("ray.dag.compiled_dag_node").setLevel(logging.CRITICAL)  # teardown of killed actors

    @property
    def node_address(self) -> str:
        return import_ray().util.get_node_ip_address()

    def close(self) -> None:
        ray = import_ray()
        if self.owned and ray.is_initialized():
            ray.shutdown()
        self.owned = False


def _check_reachable(address: str, timeout_s: float = 5.0) -> bool:
    """Fail at once when nothing listens at a ``HOST:PORT`` (or ``ray://HOST:PORT``) Ray
    address (``ray.init`` retries an absent cluster for minutes); True when the host is
    this machine's loopback."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return False  # "auto" and other forms: Ray resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ExecutionError(f"no Ray cluster answers at {address} ({type(e).__name__}: {e}); start one there "
                             "with `ray start --head --port PORT` or fix the address") from None
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def _nothing():
    yield


__all__ = ["RaySession", "import_ray"]
