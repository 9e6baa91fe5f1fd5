"""The user's constraints as typed records, and their spellings on the command line.

``--pin PATTERN=BACKEND[@DEVICE]`` (:class:`Pin`), ``--forbid PATTERN=BACKEND``
(:class:`Forbid`) and ``--device-memory DEVICE=SIZE`` (:class:`MemoryCap`) make one
:class:`Constraints`; :func:`as_constraints` takes that record, a dict of the three lists of
spellings, or None. ``PATTERN`` is a glob (:mod:`fnmatch`, case-sensitive) matched against
each op-graph node's names (:func:`tvm_pesto.constraints.resolve.node_names`); ``BACKEND`` is a
backend name, or ``*`` in a pin that fixes the device alone; ``DEVICE`` is a device's name
in the cluster (``cpu0``, ``gpu1``) or its index; ``SIZE`` is bytes with an optional unit
(``2GB`` = 2e9, ``512MiB`` = 512 * 2**20, ``1.5G`` = 1.5e9).

Examples
--------
>>> c = Constraints.parse(pin=["relax.nn.conv2d=tvm", "lv1*=onnxruntime@cpu1"], forbid=["*matmul=torch"],
...                       device_memory=["cpu1=512MiB"])
>>> c.pins[1]
Pin(pattern='lv1*', backend='onnxruntime', device='cpu1')
>>> c.memory[0].bytes, c.spellings()
(536870912, ['--pin relax.nn.conv2d=tvm', '--pin lv1*=onnxruntime@cpu1', '--forbid *matmul=torch', '--device-memory cpu1=512MiB'])
>>> bool(Constraints()), parse_size("2GB")
(False, 2000000000)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import ConstraintError

#: A pin's backend that leaves the backend free (``--pin "block3*=*@cpu1"``: the device alone).
ANY_BACKEND = "*"

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``2GB`` (10**9), ``512MiB`` (2**20), ``1.5G`` or ``4096``.

    Raises
    ------
    ConstraintError
        When ``text`` is not a positive number with one of the units B, KB, MB, GB, TB (powers
        of 1000; K, M, G, T alike) or KiB, MiB, GiB, TiB (powers of 1024).

    Examples
    --------
    >>> parse_size("512MiB"), parse_size("1.5 gb")
    (536870912, 1500000000)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConstraintError(f"size {text!r} is not a positive number of bytes with a unit; give e.g. 2GB, 512MiB "
                              "or 1073741824 (units B, KB, MB, GB, TB and KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Pin:
    """Every node matching ``pattern`` runs in ``backend`` (``*``: any), on ``device`` when given."""

    pattern: str
    backend: str
    device: str | None = None

    def spelling(self) -> str:
        return f"--pin {self.pattern}={self.backend}" + (f"@{self.device}" if self.device is not None else "")


@dataclass(frozen=True)
class Forbid:
    """No node matching ``pattern`` runs in ``backend``."""

    pattern: str
    backend: str

    def spelling(self) -> str:
        return f"--forbid {self.pattern}={self.backend}"


@dataclass(frozen=True)
class MemoryCap:
    """At most ``bytes`` of weights and tensors on ``device`` (``text``: as the user wrote it)."""

    device: str
    bytes: int
    text: str = ""

    def spelling(self) -> str:
        return f"--device-memory {self.device}={self.text or self.bytes}"


def _split(kind: str, text: str) -> tuple[str, str]:
    """``(left, right)`` of ``LEFT=RIGHT`` (the last ``=``: a glob may hold one), or the error."""
    left, eq, right = str(text).rpartition("=")
    if not eq or not left.strip() or not right.strip():
        spell = {"pin": "PATTERN=BACKEND[@DEVICE], e.g. relax.nn.conv2d=tvm or lv3*=onnxruntime@cpu1",
                 "forbid": "PATTERN=BACKEND, e.g. relax.nn.conv2d=torch",
                 "device-memory": "DEVICE=SIZE, e.g. cpu1=2GB"}[kind]
        raise ConstraintError(f"--{kind} {text!r} is not {spell}")
    return left.strip(), right.strip()


def parse_pin(text: str) -> Pin:
    """A :class:`Pin` from ``PATTERN=BACKEND[@DEVICE]``."""
    pattern, rest = _split("pin", text)
    backend, at, device = rest.partition("@")
    if not backend.strip() or (at and not device.strip()):
        raise ConstraintError(f"--pin {text!r} names no {'device after @' if at else 'backend'}; give "
                              "PATTERN=BACKEND[@DEVICE], e.g. relax.nn.conv2d=tvm@cpu1 (or *@cpu1 for the device alone)")
    return Pin(pattern, backend.strip(), device.strip() if at else None)


def parse_forbid(text: str) -> Forbid:
    """A :class:`Forbid` from ``PATTERN=BACKEND``."""
    pattern, backend = _split("forbid", text)
    if backend == ANY_BACKEND or "@" in backend:
        raise ConstraintError(f"--forbid {text!r}: forbid one backend by name (PATTERN=BACKEND); to keep nodes off a "
                              "device, pin them to another (--pin PATTERN=BACKEND@DEVICE)")
    return Forbid(pattern, backend)


def parse_memory(text: str) -> MemoryCap:
    """A :class:`MemoryCap` from ``DEVICE=SIZE``."""
    device, size = _split("device-memory", text)
    return MemoryCap(device, parse_size(size), size)


@dataclass(frozen=True)
class Constraints:
    """A user's pins, forbids and device memory caps (empty: no constraint; false then)."""

    pins: tuple[Pin, ...] = ()
    forbids: tuple[Forbid, ...] = ()
    memory: tuple[MemoryCap, ...] = field(default=())

    @classmethod
    def parse(cls, pin=(), forbid=(), device_memory=()) -> "Constraints":
        """The constraints of the command-line spellings (each a list of strings)."""
        return cls(tuple(parse_pin(p) for p in pin or ()), tuple(parse_forbid(f) for f in forbid or ()),
                   tuple(parse_memory(m) for m in device_memory or ()))

    def __bool__(self) -> bool:
        return bool(self.pins or self.forbids or self.memory)

    @property
    def on_devices(self) -> bool:
        """Whether a constraint names a device (a pin with ``@DEVICE``, a memory cap): it binds
        the cluster asked for, not another core shape of the same machine."""
        return bool(self.memory) or any(p.device is not None for p in self.pins)

    def spellings(self) -> list[str]:
        """Each constraint as the command line spells it."""
        return [c.spelling() for c in (*self.pins, *self.forbids, *self.memory)]

    def to_dict(self) -> dict:
        """The record for a JSON report: ``pin``, ``forbid``, ``device_memory`` as spelled."""
        return {"pin": [p.spelling().removeprefix("--pin ") for p in self.pins],
                "forbid": [f.spelling().removeprefix("--forbid ") for f in self.forbids],
                "device_memory": [m.spelling().removeprefix("--device-memory ") for m in self.memory]}


def as_constraints(value) -> Constraints | None:
    """``value`` as :class:`Constraints` (None when there is none): a ``Constraints``, a dict
    with the keys ``pin``, ``forbid`` and ``device_memory`` (lists of spellings; a single
    string is one), a list of :class:`Pin`, :class:`Forbid` and :class:`MemoryCap`, or None.

    Examples
    --------
    >>> as_constraints({"pin": "relax.nn.conv2d=tvm"}).pins
    (Pin(pattern='relax.nn.conv2d', backend='tvm', device=None),)
    >>> as_constraints({}) is None
    True
    """
    if value is None:
        return None
    if isinstance(value, Constraints):
        return value or None
    if isinstance(value, dict):
        bad = sorted(set(value) - {"pin", "forbid", "device_memory"})
        if bad:
            raise ConstraintError(f"constraints has keys {bad}; use pin, forbid and device_memory (lists of "
                                  "PATTERN=BACKEND[@DEVICE], PATTERN=BACKEND and DEVICE=SIZE)")
        lists = {k: [v] if isinstance(v, str) else list(v or ()) for k, v in value.items()}
        return Constraints.parse(**lists) or None
    if isinstance(value, (list, tuple)):
        kinds = {Pin: [], Forbid: [], MemoryCap: []}
        for c in value:
            if type(c) not in kinds:
                raise ConstraintError(f"constraint {c!r} is not a Pin, Forbid or MemoryCap")
            kinds[type(c)].append(c)
        return Constraints(tuple(kinds[Pin]), tuple(kinds[Forbid]), tuple(kinds[MemoryCap])) or None
    raise ConstraintError(f"constraints= takes a tvm_pesto.constraints.Constraints, a dict of pin/forbid/device_memory "
                          f"lists or a list of Pin/Forbid/MemoryCap, not {type(value).__name__}")


__all__ = ["ANY_BACKEND", "Constraints", "Forbid", "MemoryCap", "Pin", "as_constraints", "parse_forbid",
           "parse_memory", "parse_pin", "parse_size"]
