"""The bundle format: what an exported placed model is, checked file by file.

A bundle (written by :meth:`tvm_pesto.builder.placed.PlacedModule.export`) is a folder:

* ``manifest.json``: format and version, the per-device libraries, the backend artifacts
  and a SHA-256 checksum of every other file;
* ``device<d>.so``: the compiled segments of device ``d``;
* one artifact per non-TVM unit (``extern<k>.onnx``, ``.pt2``, ``.so``);
* ``program.json`` (the executor's steps), ``cluster.json``, ``plan.json``.

:func:`tvm_pesto.run.bundle.load.load` checks every file against the manifest (:func:`read_manifest`,
:func:`check_files`) before it loads anything, then registers the artifacts' functions
(:func:`register_artifacts`), loads the libraries (:func:`load_library`) and returns a
:class:`~tvm_pesto.run.runtime.PlacedRuntime`. Nothing here imports TVM's compiler
(``tvm.relax``), so it works with ``TVM_USE_RUNTIME_LIB=1`` and no ``libtvm_compiler.so``.
"""
from __future__ import annotations

import hashlib
import json
import os

from ...errors import ExecutionError
from ..libraries.loaders import register_artifact

MANIFEST = "manifest.json"
BUNDLE_FORMAT = "tvm-pesto-bundle"
BUNDLE_VERSION = 1


def sha256(path: str) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(path: str) -> dict:
    """The bundle's manifest, every listed file checked against its checksum.

    Raises
    ------
    ExecutionError
        When the folder or the manifest is missing or malformed, a file is missing, or a
        file's checksum differs (each message names the file and what to do).
    """
    if not os.path.isdir(path):
        raise ExecutionError(f"{path!r} is not a folder; give the folder that PlacedModule.export wrote")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise ExecutionError(f"{path!r} has no {MANIFEST}; it is not a tvm-pesto bundle (write one with "
                             "PlacedModule.export)")
    try:
        with open(mpath) as f:
            man = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ExecutionError(f"{mpath} is not valid JSON ({e}); export the model again") from e
    if not isinstance(man, dict) or man.get("format") != BUNDLE_FORMAT:
        raise ExecutionError(f"{mpath} is not a tvm-pesto bundle manifest (format {man.get('format')!r} if any)")
    if int(man.get("version", -1)) != BUNDLE_VERSION:
        raise ExecutionError(f"{mpath} has bundle version {man.get('version')}; this tvm-pesto reads version "
                             f"{BUNDLE_VERSION}: export the model again with this version")
    check_files(path, man)
    return man


def check_files(path: str, man: dict, names=None) -> None:
    """Check the bundle files ``names`` (default: every file the manifest lists) against
    their checksums.

    Raises
    ------
    ExecutionError
        When a file is missing, unlisted, or differs from its checksum.
    """
    listed = man.get("files", {})
    for fname in listed if names is None else names:
        digest = listed.get(fname)
        if digest is None:
            raise ExecutionError(f"bundle file {fname} is not listed in the manifest of {path!r}; export the model "
                                 "again")
        fpath = os.path.join(path, fname)
        if not os.path.isfile(fpath):
            raise ExecutionError(f"bundle file {fname} is missing from {path!r}; copy the whole folder, or export "
                                 "the model again")
        if sha256(fpath) != digest:
            raise ExecutionError(f"bundle file {fname} in {path!r} does not match its checksum in {MANIFEST} "
                                 "(corrupted or changed after export); export the model again")


def device_files(man: dict, d: int) -> list[str]:
    """The files device ``d`` needs to run its segments: its library and the artifacts of
    its library units."""
    lib = man.get("libraries", {}).get(str(d))
    files = [lib] if lib else []
    for meta in man.get("artifacts", []):
        if int(meta.get("device", 0)) == int(d):
            files.extend(meta["files"])
    return files


def register_artifacts(path: str, man: dict, cluster, device: int | None = None) -> None:
    """Register the backend functions of the bundle's artifacts (of ``device`` only, when given)."""
    for meta in man.get("artifacts", []):
        d = int(meta.get("device", 0))
        if device is None or d == int(device):
            register_artifact(meta, path, cluster.devices[d])


def load_library(path: str, man: dict, cluster, d: int):
    """The ``VirtualMachine`` of device ``d``'s library, on that device.

    Raises
    ------
    ExecutionError
        When the bundle has no library for ``d`` or TVM's runtime refuses it.
    """
    import tvm
    import tvm.runtime.vm  # not imported by ``import tvm`` in runtime-only mode

    fname = man.get("libraries", {}).get(str(d))
    if fname is None:
        raise ExecutionError(f"the bundle in {path!r} has no library for device {d}; export the model again")
    try:
        lib = tvm.runtime.load_module(os.path.join(path, fname))
        return tvm.runtime.vm.VirtualMachine(lib, cluster.devices[int(d)].tvm_device())
    except Exception as e:  # noqa: BLE001 - TVM's loader error, explained
        raise ExecutionError(f"TVM's runtime could not load {fname} from {path!r}: {type(e).__name__}: "
                             f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from e


__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "MANIFEST", "check_files", "device_files", "load_library",
           "read_manifest", "register_artifacts", "sha256"]
