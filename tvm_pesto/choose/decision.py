"""The final choice's decision (:mod:`tvm_pesto.choose`) as typed records and as text.

A :class:`Decision` says whether the options were ``measured`` (and ``why`` not), the option
``chosen``, the core ``shape`` the flow predicted faster, and per option an
:class:`OptionResult` (its cluster, predicted and measured seconds, backend mix, and
``error`` or ``skipped`` where it did not run); the :class:`Runoff`, the :class:`Spell` and
the :class:`Claim`. :meth:`Decision.to_json` gives the run JSON's ``decision`` (schema
``run.schema.json``), :meth:`Decision.from_json` reads it back, :func:`decision_table`
prints it for the CLI's run report.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields


def _value(v):
    """A field's value as JSON: records by their ``to_json``, lists item by item."""
    if hasattr(v, "to_json"):
        return v.to_json()
    return [_value(x) for x in v] if isinstance(v, list) else v


def _json(record) -> dict:
    """``record``'s fields as a JSON object, optional ones (None by default) left out when
    None unless their field says ``keep_none``."""
    return {f.name: _value(getattr(record, f.name)) for f in fields(record)
            if not (getattr(record, f.name) is None and f.default is None and not f.metadata.get("keep_none"))}


@dataclass
class OptionResult:
    """One option as weighed: where it ran, what it was predicted and measured to take."""

    name: str
    cluster: str
    predicted_s: float | None
    devices: int = 1
    cores: list[int] = field(default_factory=list)
    backend_mix: dict = field(default_factory=dict)
    measured_s: float | None = None
    timed_once: str | None = None   # "first call" / "quick calls": not timed in blocks
    skipped: str | None = None      # why it was not run
    error: str | None = None        # why it failed or was left out

    def to_json(self) -> dict:
        return _json(self)


@dataclass
class Runoff:
    """The near-tied options timed again, with as many blocks each, and a library call kept
    within its margin of the fastest."""

    options: list[str]
    blocks: int
    library_kept: str | None = None

    def to_json(self) -> dict:
        return _json(self)


@dataclass
class Spell:
    """The slow-spell probe's ratios after the options were timed, whether the spell ended,
    and the options timed again after it."""

    ratios: list[float]
    ended: bool
    timed_again: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return _json(self)


@dataclass
class ShapeClaim:
    """One core shape's bound: the flow's, scaled by measurement, or solved again on costs
    priced by what the options measured (``solved_again``)."""

    option: str
    cluster: str
    scale: float
    bound_s: float
    decided_by: str | None
    solve_s: float
    solved_again: bool
    flow_decided_by: str | None
    flow_solve_s: float
    priced_s: float | None = None
    priced_mix: dict | None = None
    priced_units: int | None = None
    plan_is: str | None = field(default=None, metadata={"keep_none": True})

    def to_json(self) -> dict:
        out = _json(self)
        if not self.solved_again:
            out.pop("plan_is")
        return out


@dataclass
class Claim:
    """A bound on every plan of both core shapes and the kept option's gap to it."""

    decided_by: str
    bound_s: float
    kept_s: float
    gap: float
    status: str
    shapes: list[ShapeClaim]
    solve_s: float
    holds_under: list[str] = field(default_factory=list)  # the user's constraints it holds under

    def to_json(self) -> dict:
        return _json(self)


@dataclass
class HeldConstraints:
    """The user's constraints a decision was made under (:mod:`tvm_pesto.constraints`), and
    whether the one-device shape was weighed (a device pin or memory cap leaves it out)."""

    holds_under: list[str]
    one_device_shape: bool

    def to_json(self) -> dict:
        return _json(self)


@dataclass
class Decision:
    """What the final choice weighed and kept."""

    measured: bool
    chosen: str
    shape: str
    options: list[OptionResult]
    why: str | None = None
    runoff: Runoff | None = field(default=None, metadata={"keep_none": True})
    spell: Spell | None = field(default=None, metadata={"keep_none": True})
    claim: Claim | None = field(default=None, metadata={"keep_none": True})
    claim_error: str | None = None
    constraints: HeldConstraints | None = None

    def option(self, name: str) -> OptionResult:
        """The option called ``name`` (KeyError when none is)."""
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def measured_s(self) -> dict[str, float]:
        """Option name -> measured seconds a call, for the options that were measured."""
        return {o.name: o.measured_s for o in self.options if o.measured_s is not None}

    def to_json(self) -> dict:
        out = _json(self)
        if not self.measured:  # nothing was timed: no runoff, spell or claim to speak of
            for k in ("runoff", "spell", "claim"):
                out.pop(k)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Decision":
        """The decision of a run JSON's ``decision`` object.

        Examples
        --------
        >>> d = Decision(True, "plan", "cpu:2", [OptionResult("plan", "cpu:2", 1e-3, measured_s=1.1e-3)],
        ...              runoff=Runoff(["plan"], 4))
        >>> Decision.from_json(d.to_json()) == d
        True
        """
        claim = data.get("claim")
        if claim:
            claim = Claim(**{**claim, "shapes": [ShapeClaim(**s) for s in claim["shapes"]]})
        return cls(measured=data["measured"], chosen=data["chosen"], shape=data.get("shape", ""),
                   options=[OptionResult(**o) for o in data["options"]], why=data.get("why"),
                   runoff=Runoff(**data["runoff"]) if data.get("runoff") else None,
                   spell=Spell(**data["spell"]) if data.get("spell") else None,
                   claim=claim or None, claim_error=data.get("claim_error"),
                   constraints=HeldConstraints(**data["constraints"]) if data.get("constraints") else None)


def unmeasured(why: str, placement, cluster) -> Decision:
    """The decision of a build that kept the flow's plan without timing it."""
    return Decision(measured=False, why=why, chosen="plan", shape=cluster.name, options=[
        OptionResult("plan", cluster.name, float(placement.sim.run_s), devices=cluster.num_devices,
                     cores=[d.cores for d in cluster.devices], backend_mix=placement.backend_mix)])


def decision_table(decision: Decision) -> str:
    """The decision as a few text lines: each option's shape, predicted and measured time.

    Examples
    --------
    >>> print(decision_table(Decision(True, "plan", "cpu:2", [
    ...     OptionResult("plan", "cpu:2", 1e-3, measured_s=1.1e-3, backend_mix={"tvm": 3})])))
    option                          shape      predicted ms  measured ms  backends
    plan (kept)                     cpu:2             1.000        1.100  tvm 3
    """
    names = [o.name + (" (kept)" if o.name == decision.chosen else "")
             + (f" ({o.timed_once})" if o.timed_once else "") for o in decision.options]
    w = max([32] + [len(n) + 2 for n in names])
    lines = [f"{'option':{w}s}{'shape':10s}{'predicted ms':>13s}{'measured ms':>13s}  backends"]
    for name, o in zip(names, decision.options):
        meas = f"{o.measured_s * 1e3:13.3f}" if o.measured_s is not None else f"{'—':>13s}"
        mix = ", ".join(f"{b} {k}" for b, k in sorted((o.backend_mix or {}).items()))
        note = f"failed: {o.error}" if o.error is not None else (o.skipped or mix)
        lines.append(f"{name:{w}s}{o.cluster:10s}{o.predicted_s * 1e3:13.3f}{meas}  {note}")
    if not decision.measured:
        lines.append(f"not measured: {decision.why}")
    if decision.claim_error:
        lines.append(f"no claim: {decision.claim_error}")
    if decision.runoff:
        r = decision.runoff
        lines.append(f"runoff of {', '.join(r.options)} ({r.blocks} blocks each)"
                     + (f"; {r.library_kept}" if r.library_kept else ""))
    return "\n".join(lines)


__all__ = ["Claim", "Decision", "HeldConstraints", "OptionResult", "Runoff", "ShapeClaim", "Spell", "decision_table", "unmeasured"]
