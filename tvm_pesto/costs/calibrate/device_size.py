"""The figures of a device size of this machine, kept in the executor's record beside its
dispatch figures (:mod:`.dispatch`): what a switch between libraries costs on a device of the
size (:mod:`.switch`) and what a library call costs there after the rest of a model ran
(:mod:`.cold`). Each is measured the first time a cluster with a CPU device of the size needs
it, unless ``$TVM_PESTO_MACHINE_CALIBRATION=off``.
"""
from __future__ import annotations

import sys

from ...errors import ClusterError
from ...jsonio import write_json
from . import cold, switch
from .machine import auto_enabled


def ensure_sizes(record: dict, key: str, cluster, what: str, measure) -> bool:
    """Add to ``record[key]`` the fit of each CPU device size of ``cluster`` it lacks,
    ``measure(device)`` (a JSON-ready dict) on a device of that size, announced on stderr as
    measuring ``what``, unless ``$TVM_PESTO_MACHINE_CALIBRATION`` is ``off``; returns whether it
    added any (the caller keeps the record again). A size ``measure`` refuses (a
    :class:`~tvm_pesto.errors.ClusterError`: a library it needs is not installed here) is said
    on stderr and left out: it gets the assumed figures."""
    have = record.setdefault(key, {})
    added = False
    for dev in cluster.devices:
        if dev.kind != "cpu" or str(int(dev.cores)) in have or not auto_enabled():
            continue
        print(f"tvm-pesto: measuring {what} on a {dev.cores}-core device of this machine (once, seconds); kept with "
              "the executor's figures", file=sys.stderr, flush=True)
        try:
            have[str(int(dev.cores))] = measure(dev)
        except ClusterError as e:
            print(f"tvm-pesto: no {key} figures for {dev.cores}-core devices ({e}); the assumed ones apply",
                  file=sys.stderr, flush=True)
            continue
        added = True
    return added


def keep_device_fits(cluster, record: dict, path, source: str) -> None:
    """Give ``cluster`` the per-device-size fits of ``record``, the fit kept at ``path``
    (``source`` as the dispatch figures': ``measured`` or ``cached``): what a switch between
    libraries costs (:mod:`.switch`) and what a call costs after the rest of a model ran
    (:mod:`.cold`). The sizes of its devices that the record lacks are measured now
    (:func:`ensure_sizes`) and the record is kept again with them, their source then
    ``measured``."""
    added = ensure_sizes(record, "switch", cluster, "what a switch between libraries costs",
                         lambda dev: switch.measure_switch(dev).to_json())
    added |= ensure_sizes(record, "cold", cluster, "what a library call costs after the rest of a model ran",
                          lambda dev: cold.measure_cold(dev))
    if added:
        write_json(str(path), record)
        source = "measured"
    switch.apply_switch(cluster, record, source, path)
    cold.apply_cold(cluster, record, source, path)


__all__ = ["ensure_sizes", "keep_device_fits"]
