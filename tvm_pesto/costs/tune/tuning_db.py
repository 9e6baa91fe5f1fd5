"""The device a MetaSchedule tuning database was timed on, kept in its work directory.

``tvm-pesto tune`` (:func:`tvm_pesto.costs.tune.tune.tune_model`) writes the descriptor of the
device it times schedules on (:func:`tvm_pesto.costs.predict.features.device_descriptor`) next to the
database (:data:`DEVICE_FILE`), so that its records' timings are read as that device's on
any machine; :func:`device_for_target` describes a device from a record's target when no
such file is there. The database files themselves are :mod:`tvm_pesto.backends.ms_database`'s.

Examples
--------
>>> import tempfile
>>> work_dir = tempfile.mkdtemp()
>>> dev = device_for_target({"kind": "llvm", "num-cores": 1})
>>> _ = write_device_file(work_dir, dev)
>>> read_device_file(work_dir) == dev, dev["kind"], dev["cores"]
(True, 'cpu', 1)
"""
from __future__ import annotations

import json
from pathlib import Path

from ...cluster.host import cpu_identity
from ...cluster.specs import GPU_MODELS, cpu_info
from ...errors import CostError
from ...jsonio import write_json
from ..predict.features import device_key

#: The device a database was tuned on (:func:`write_device_file`): its records' timings are
#: that device's, whatever machine reads them.
DEVICE_FILE = "tvm_pesto_device.json"


def device_for_target(target: dict, device: dict | None = None) -> dict:
    """Device descriptor for a record's target: ``device`` if given, else this machine's
    CPU (for ``llvm``) or the GPU preset with the target's ``arch`` (for ``cuda``)."""
    if device is not None:
        return dict(device)
    kind = str(target.get("kind", "llvm"))
    if kind == "llvm":
        _, per_core, mem = cpu_info()
        cores = int(target.get("num-cores", 1) or 1)
        out = {"kind": "cpu", "model": "host-cpu", "peak_flops": per_core * cores, "mem_bandwidth": 8e9 * cores,
               "memory_bytes": mem, "cores": cores}
        kind = cpu_identity()["kind"]
        return {**out, "cpu_kind": kind} if kind else out
    if kind == "cuda":
        arch = str(target.get("arch", ""))
        for name, (peak, bw, mem, sms, a) in GPU_MODELS.items():
            if a == arch:
                return {"kind": "gpu", "model": name, "peak_flops": peak, "mem_bandwidth": bw, "memory_bytes": mem,
                        "cores": sms}
    raise CostError(f"no device description for target {target}; pass one as read_tuning_db(..., device=...) "
                    "(see tvm_pesto.costs.predict.features.device_descriptor)")


def write_device_file(work_dir, device: dict) -> str:
    """Record in ``work_dir`` the descriptor of the device its database is tuned on
    (:data:`DEVICE_FILE`; :func:`tvm_pesto.costs.predict.features.device_descriptor`).

    Raises
    ------
    CostError
        When the folder already records another device (another CPU kind or core count):
        one database's timings come from one device.
    """
    old = read_device_file(work_dir)
    if old is not None and device_key(old) != device_key(device):
        raise CostError(f"{work_dir} holds schedules timed on {device_key(old)}, not on {device_key(device)}; "
                        "tune this device into another --work-dir")
    return write_json(str(Path(work_dir) / DEVICE_FILE), dict(device))


def read_device_file(work_dir) -> dict | None:
    """The device descriptor :func:`write_device_file` recorded in ``work_dir``, or None.

    Raises
    ------
    CostError
        When the file is there but is not a descriptor.
    """
    p = Path(work_dir) / DEVICE_FILE
    if not p.is_file():
        return None
    try:
        dev = json.loads(p.read_text())
        if not isinstance(dev, dict):
            raise TypeError("not a JSON object")
        device_key(dev)
        float(dev["peak_flops"]), float(dev["mem_bandwidth"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CostError(f"{p} is not a device descriptor ({type(e).__name__}: {e}); it needs kind, model, cores, "
                        "peak_flops and mem_bandwidth; delete it to read the database as this machine's") from None
    return dev


__all__ = ["DEVICE_FILE", "device_for_target", "read_device_file", "write_device_file"]
