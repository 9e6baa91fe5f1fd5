"""A clock that only the code under test advances, for tests of what is timed: what a timing
reads is then known exactly, whatever else the machine is doing (no clock in an assertion).

Examples
--------
>>> from fake_clock import FakeClock
>>> clock = FakeClock()
>>> work = clock.call(0.25)
>>> work(); work(); clock()
0.5
"""
from __future__ import annotations


class FakeClock:
    """Seconds (``clock()``) that stand still until a call made by :meth:`call` advances them."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def call(self, seconds: float, then=None):
        """A callable (any arguments) that takes ``seconds`` of this clock, then calls ``then()``."""
        def f(*_):
            self.now += seconds
            if then:
                then()
        return f
