"""This machine's CPU as ``/proc/cpuinfo`` describes it: the one reader of that file.

A VM's brand string can hide which CPU it runs on: two 2-core VMs both read ``AMD EPYC``,
one a Zen 1 with AVX2 only, the other a Zen 4 with AVX-512 and twice the L2, and the same
untuned TVM kernels run several times slower on the first (docs/cost_model.md, "Kinds of
CPU"). What tells them apart is the family, model and stepping,
and the vector extensions in ``flags``.

``TVM_PESTO_CPU_KIND=VENDOR/FAMILY/MODEL`` (:data:`CPU_KIND_ENV`) makes this machine's CPU
that kind (its ``kind`` and ``id``; the brand string, clock and vector extensions stay as read):
the cost model and its calibrations then treat it as that kind, e.g. to see what a kind
the model was trained on, or one it never saw, gives on this machine.

Examples
--------
>>> ident = parse_cpuinfo('''processor : 0
... vendor_id : AuthenticAMD
... cpu family : 23
... model : 1
... model name : AMD EPYC
... stepping : 2
... cpu MHz : 1996.248
... cache size : 512 KB
... flags : fpu sse sse2 fma avx avx2
... ''')
>>> ident["id"], ident["kind"], ident["isa"], ident["mhz"]
('AuthenticAMD/23/1/2', 'AuthenticAMD/23/1', ['avx2', 'fma'], 1996.248)
"""
from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path

from ..errors import ClusterError

#: Environment variable that overrides this machine's CPU kind (``vendor/family/model``).
CPU_KIND_ENV = "TVM_PESTO_CPU_KIND"
#: Vector extensions that change what a kernel costs, the widest first; ``isa`` lists those present.
ISA_FLAGS = ("amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "fma", "sve", "asimd")
#: SIMD width in 32-bit lanes times two (one FMA per lane and cycle) of the widest extension present.
FLOPS_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("asimd", 8), ("sse2", 8))


def parse_cpuinfo(text: str) -> dict:
    """The identity of the first processor described in ``text`` (``/proc/cpuinfo``'s format).

    Returns
    -------
    dict
        ``name`` (the brand string, or ``""``), ``id`` (``vendor/family/model/stepping``,
        ``""`` when the file has none of them), ``kind`` (``vendor/family/model``: the
        microarchitecture, what a kernel's cost depends on; the stepping is left out),
        ``isa`` (the :data:`ISA_FLAGS` present, in
        that order), ``mhz`` (float or None), ``cache`` (the ``cache size`` line, or ``""``),
        ``flops_per_cycle`` (single-precision FLOPs per core and cycle of the widest
        extension: 64 with AVX-512, 32 with AVX2, 8 with SSE2 or NEON; None without a
        ``flags`` or ``Features`` line).
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    parts = [fields.get(k, "") for k in ("vendor_id", "cpu family", "model", "stepping")]
    if not any(parts):  # Arm: implementer/part instead
        parts = [fields.get(k, "") for k in ("cpu implementer", "cpu architecture", "cpu part", "cpu variant")]
    mhz = None
    if re.fullmatch(r"[\d.]+", fields.get("cpu mhz", "")):
        mhz = float(fields["cpu mhz"])
    return {
        "name": fields.get("model name", ""),
        "id": "/".join(parts) if any(parts) else "",
        "kind": "/".join(parts[:3]) if any(parts[:3]) else "",
        "isa": [f for f in ISA_FLAGS if f in flags],
        "mhz": mhz,
        "cache": fields.get("cache size", ""),
        "flops_per_cycle": next((n for flag, n in FLOPS_PER_CYCLE if flag in flags), 8 if flags else None),
    }


def check_cpu_kind(kind: str, where: str, hint: str = "") -> str:
    """``kind`` if it is a CPU kind, ``vendor/family/model`` (three non-empty parts without
    spaces, ``/`` or ``@``, as :func:`parse_cpuinfo` writes ``kind``).

    Raises
    ------
    ClusterError
        Naming ``where`` the value came from (and ending with ``hint``), when it is not one.

    Examples
    --------
    >>> check_cpu_kind("GenuineIntel/6/143", "--cpu-kind")
    'GenuineIntel/6/143'
    """
    if not re.fullmatch(r"[^/@\s]+/[^/@\s]+/[^/@\s]+", kind):
        raise ClusterError(f"{where} {kind!r} is not a CPU kind vendor/family/model (the vendor_id, cpu family and "
                           f"model lines of /proc/cpuinfo, e.g. AuthenticAMD/25/17 or GenuineIntel/6/143){hint}")
    return kind


def cpu_identity() -> dict:
    """:func:`parse_cpuinfo` of this machine (``platform.processor()`` as the name where there
    is no ``/proc/cpuinfo``), with ``kind`` and ``id`` set to ``$TVM_PESTO_CPU_KIND`` where
    that is set and not empty (:data:`CPU_KIND_ENV`). The file is read once per process; the variable at
    every call. Returns a new dict.

    Raises
    ------
    ClusterError
        When ``$TVM_PESTO_CPU_KIND`` is set but not ``vendor/family/model``.

    Examples
    --------
    >>> sorted(cpu_identity()) == ["cache", "flops_per_cycle", "id", "isa", "kind", "mhz", "name"]
    True
    """
    ident = dict(_cpuinfo())
    ident["isa"] = list(ident["isa"])
    kind = os.environ.get(CPU_KIND_ENV, "").strip()
    if kind:
        mine = ident["kind"] or "unknown"
        ident["kind"] = ident["id"] = check_cpu_kind(
            kind, f"${CPU_KIND_ENV}", f"; unset it for this machine's own kind ({mine})")
    return ident


def l2_geometry(cpu: int = 0, root: str = "/sys/devices/system/cpu") -> tuple[int, int]:
    """``(sets, ways)`` of the level-2 cache of logical CPU ``cpu``, read from ``root``'s
    ``cpuN/cache/index*/`` (Linux sysfs); ``(0, 0)`` where it does not say (another OS, a
    container hiding it): the cost model's features and miss term then take their defaults.

    Examples
    --------
    >>> sets, ways = l2_geometry(root="/no/such/dir")
    >>> sets, ways
    (0, 0)
    """
    base = Path(root) / f"cpu{int(cpu)}" / "cache"
    try:
        entries = sorted(base.glob("index*"))
    except OSError:
        return 0, 0
    for d in entries:
        try:
            level, sets, ways = (int((d / f).read_text()) for f in ("level", "number_of_sets", "ways_of_associativity"))
        except (OSError, ValueError):
            continue
        if level == 2 and sets > 0 and ways > 0:
            return sets, ways
    return 0, 0


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict:
    """:func:`parse_cpuinfo` of ``/proc/cpuinfo``, read once per process (do not change the result)."""
    try:
        with open("/proc/cpuinfo") as f:
            ident = parse_cpuinfo(f.read())
    except OSError:
        ident = parse_cpuinfo("")
    if not ident["name"]:
        ident["name"] = platform.processor() or ""
    return ident


__all__ = ["CPU_KIND_ENV", "FLOPS_PER_CYCLE", "ISA_FLAGS", "check_cpu_kind", "cpu_identity", "l2_geometry",
           "parse_cpuinfo"]
