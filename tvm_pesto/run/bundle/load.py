"""Load an exported placed model (a bundle, :mod:`tvm_pesto.run.bundle.format`) and run it with
TVM's runtime only: no search, no measurement, no compiler.

Examples
--------
>>> import numpy as np
>>> import tvm_pesto
>>> from tvm_pesto.candidates.examples import tiny_cnn
>>> mod, (x,) = tiny_cnn()
>>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline")
>>> import tempfile
>>> bundle = tempfile.mkdtemp()
>>> _ = placed.export(bundle)
>>> m = tvm_pesto.load(bundle)                   # e.g. in another process
>>> np.allclose(m(x), placed(x))
True
"""
from __future__ import annotations

import json
import os

from ...cluster.cluster import Cluster
from ...errors import ExecutionError
from ..program import Program
from ..runtime import PlacedRuntime
from .format import load_library, read_manifest, register_artifacts


def _read_json(path: str, name: str):
    with open(os.path.join(path, name)) as f:
        return json.load(f)


def load(path: str, executor: str = "thread", ray_address: str | None = None):
    """Load a bundle: no search, no measurement, no compiler.

    ``executor="ray"`` runs the devices as Ray actors that load their libraries from
    ``path`` (a local Ray on 127.0.0.1, or the cluster at ``ray_address``; see
    :meth:`PlacedRuntime.use_ray`); the default runs one thread per device here.

    Returns
    -------
    PlacedRuntime
        Callable like the built model; the same outputs.

    Raises
    ------
    ExecutionError
        For a missing or corrupt file (named), an artifact that cannot be loaded, or a
        library TVM's runtime refuses.
    """
    if executor not in ("thread", "ray"):
        raise ExecutionError(f"unknown executor {executor!r}; use 'thread' (one thread per device) or 'ray' (one Ray "
                             "actor per device)")
    man = read_manifest(path)
    cluster = Cluster.from_dict(_read_json(path, "cluster.json"))
    program = Program.from_dict(_read_json(path, "program.json"))
    register_artifacts(path, man, cluster)
    vms = {int(d): load_library(path, man, cluster, int(d)) for d in man.get("libraries", {})
           if cluster.devices[int(d)].present}
    rt = PlacedRuntime(program, vms, cluster, plan_info=_read_json(path, "plan.json"))
    rt.bundle_path = path  # where the Ray executor's actors load the libraries from
    if executor == "ray":
        rt.use_ray(address=ray_address, bundle=path)
    return rt


__all__ = ["load"]
