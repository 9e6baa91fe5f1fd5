"""The figures of a device size of this machine, kept in the executor's record beside its
dispatch figures (:mod:`.dispatch`): what a switch between libraries costs on a device of the
size (:mod:`.switch`) and what a library call costs there after the rest of a model ran
(:mod:`.cold`). Both are measured the first time a cluster with a device of the size needs
them, unless ``$TVM_PESTO_MACHINE_CALIBRATION=off``.
"""
from __future__ import annotations

from ...jsonio import write_json
from .cold import apply_cold, ensure_cold
from .switch import apply_switch, ensure_switch


def keep_device_fits(cluster, record: dict, path, source: str) -> None:
    """Give ``cluster`` the per-device-size fits of ``record``, the fit kept at ``path``
    (``source`` as the dispatch figures': ``measured`` or ``cached``): what a switch between
    libraries costs (:mod:`.switch`) and what a call costs after the rest of a model ran
    (:mod:`.cold`). The sizes of its devices that the record lacks are measured now and the
    record is kept again with them, their source then ``measured``."""
    if ensure_switch(record, cluster) | ensure_cold(record, cluster):
        write_json(str(path), record)
        source = "measured"
    apply_switch(cluster, record, source, path)
    apply_cold(cluster, record, source, path)


__all__ = ["keep_device_fits"]
