"""What ``bench peers`` builds and times each model with (:mod:`tvm_pesto.bench.peers`)."""
from __future__ import annotations

from dataclasses import dataclass

#: timed blocks per variant
ROUNDS = 3


@dataclass(frozen=True)
class PeerSettings:
    """How :func:`tvm_pesto.bench.peers.bench_peers` benches each model.

    Attributes
    ----------
    cores : int, optional
        Threads for the peers and N of ``cpu:N`` (None: this machine's).
    torch_compile : bool
        Include torch.compile (Inductor compiles each model for tens of seconds).
    build_options : dict, optional
        Keywords of tvm-pesto's build (e.g. ``{"costs": "roofline"}``).
    rounds : int
        Timed blocks per variant (order rotated).
    extra_builds : bool
        Also build on ``cpu:1`` and with ``openvino-bf16`` named
        (:func:`~tvm_pesto.bench.peers.peer_variants`).
    overhead : bool
        Also time the one-unit overhead of each model
        (:func:`~tvm_pesto.bench.peers.one_unit_overhead`).
    cold_cache : bool
        Each model's builds measure into a measurement cache of their own, as a user's first
        build of a model does (the machine's one-time fits, kept beside the shared cache, still
        hold); False: the shared cache (``~/.cache/tvm-pesto``), so a model built before is a
        warm build.
    """

    cores: int | None = None
    torch_compile: bool = True
    build_options: dict | None = None
    rounds: int = ROUNDS
    extra_builds: bool = True
    overhead: bool = True
    cold_cache: bool = True


__all__ = ["PeerSettings", "ROUNDS"]
