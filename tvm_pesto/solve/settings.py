"""What a MIP solve is given besides its model: :class:`MipSettings`, the settings the
placement MIPs (:mod:`tvm_pesto.solve.placement_ilp`, :mod:`tvm_pesto.solve.joint.ilp`) pass
on to :func:`tvm_pesto.solve.mip.solve_mip`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class MipSettings:
    """How one MIP is solved.

    Attributes
    ----------
    time_limit_s : float
        Limit for the MIP solver itself, seconds (deterministic mode: the node limit's worth).
    solver : {"cbc", "highs"}
        The MIP backend; when it crashes, :func:`~tvm_pesto.solve.mip.solve_mip` tries the other one.
    gap : float, optional
        Relative MIP gap at which to stop (``0`` proves optimality).
    msg : bool
        Let the solver print its log.
    threads : int, optional
        Solver threads (None: the solver's default; deterministic mode uses one).
    deterministic : bool, optional
        A node limit, one thread and a fixed seed instead of the time limit
        (:mod:`tvm_pesto.solve.budget`); None: the ambient mode.

    Examples
    --------
    >>> MipSettings.take({"gap": 0.0, "target": 10}, time_limit_s=3.0)
    MipSettings(time_limit_s=3.0, solver='cbc', gap=0.0, msg=False, threads=None, deterministic=None)
    """

    time_limit_s: float = 30.0
    solver: str = "cbc"
    gap: float | None = 1e-4
    msg: bool = False
    threads: int | None = None
    deterministic: bool | None = None

    @classmethod
    def take(cls, options: dict, **defaults) -> MipSettings:
        """The settings among ``options`` (removed from it), the rest from ``defaults``, then
        the class's defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{**defaults, **{k: options.pop(k) for k in list(options) if k in names}})

    def solve_options(self) -> dict:
        """The keywords of :func:`~tvm_pesto.solve.mip.solve_mip` after its model and solver."""
        out = asdict(self)
        out.pop("solver")
        return out


__all__ = ["MipSettings"]
