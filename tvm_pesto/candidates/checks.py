"""What a backend's checks answered while candidates were generated
(:mod:`tvm_pesto.candidates.generate`): a yes, a no, a call they could not read (a no, counted),
or a failure (any other exception), which leaves the backend out of the graph's candidates.
"""
from __future__ import annotations

import warnings

from ..backends.patterns import CHECK_READ_ERRORS
from ..errors import error_line

_WARNED: set[str] = set()


class BackendChecks:
    """The checks of one backend on one graph: how many answered, how many could not read
    their call (:data:`~tvm_pesto.backends.patterns.CHECK_READ_ERRORS`, a no) and how many failed (any other exception).

    Examples
    --------
    >>> checks = BackendChecks("demo")
    >>> checks.ask(lambda: True, "add"), checks.ask(lambda: {}["x"], "add")
    (True, False)
    >>> checks.ask(lambda: 1 / 0, "divide"), checks.failure()
    (False, 'its checks raised 1 time(s), first at divide: ZeroDivisionError: division by zero')
    """

    def __init__(self, backend: str):
        self.backend = backend
        self.answered = 0
        self.unreadable = 0
        self.failed = 0
        self.first_unreadable = ""
        self.first_failure = ""
        self.failure_exc: BaseException | None = None

    def ask(self, predicate, where: str) -> bool:
        """``predicate()`` as a bool; False when it raises (``where`` names the call)."""
        try:
            ok = bool(predicate())
        except CHECK_READ_ERRORS as e:
            self.unreadable += 1
            self.first_unreadable = self.first_unreadable or f"at {where}: {error_line(e)}"
            return False
        except Exception as e:  # noqa: BLE001 - counted, and the backend reported (failure())
            self.failed += 1
            if self.failure_exc is None:
                self.failure_exc = e
                self.first_failure = f"at {where}: {error_line(e)}"
            return False
        self.answered += 1
        return ok

    def failure(self) -> str | None:
        """Why the backend's candidates on this graph cannot be trusted, or None: a check
        raised an unexpected exception, or no check could read any call."""
        if self.failed:
            return f"its checks raised {self.failed} time(s), first {self.first_failure}"
        if self.unreadable and not self.answered:
            return f"no check could read any call ({self.unreadable} raised, first {self.first_unreadable})"
        return None

    def record(self) -> dict:
        """The counts and first exceptions, for :attr:`CandidateSet.check_errors`."""
        out = {"answered": self.answered, "unreadable": self.unreadable, "failed": self.failed}
        if self.first_unreadable:
            out["first_unreadable"] = self.first_unreadable
        if self.first_failure:
            out["first_failure"] = self.first_failure
        return out


def report_failure(name: str, why: str) -> None:
    """Warn once per backend per process that its candidates were left out."""
    if name in _WARNED:
        return
    _WARNED.add(name)
    warnings.warn(f"backend {name!r} left out of candidate generation: {why}; its subgraphs stay on the "
                  "other backends (a bug in the backend's checks, or a TVM API it reads has changed)",
                  RuntimeWarning, stacklevel=3)


__all__ = ["BackendChecks", "report_failure"]
