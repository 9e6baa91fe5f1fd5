"""The final choice's decision record (:mod:`tvm_pesto.choose`) as data and as text.

A decision is a dict: whether the options were ``measured`` (and ``why`` not), the option
``chosen``, the core ``shape``, and per option its cluster, predicted and measured seconds,
backend mix, and ``error`` or ``skipped`` where it did not run; the ``runoff`` and the
``claim``. :func:`decision_table` prints it for the CLI's run report.
"""
from __future__ import annotations


def unmeasured(why: str, placement, cluster) -> dict:
    """The decision of a build that kept the flow's plan without timing it."""
    return {"measured": False, "why": why, "chosen": "plan", "shape": cluster.name,
            "options": [{"name": "plan", "cluster": cluster.name, "devices": cluster.num_devices,
                         "cores": [d.cores for d in cluster.devices], "predicted_s": float(placement.sim.run_s),
                         "backend_mix": placement.backend_mix}]}


def decision_table(decision: dict) -> str:
    """The decision as a few text lines: each option's shape, predicted and measured time.

    Examples
    --------
    >>> print(decision_table({"measured": True, "chosen": "plan", "options": [
    ...     {"name": "plan", "cluster": "cpu:2", "predicted_s": 1e-3, "measured_s": 1.1e-3, "backend_mix": {"tvm": 3}}]}))
    option                          shape      predicted ms  measured ms  backends
    plan (kept)                     cpu:2             1.000        1.100  tvm 3
    """
    names = [o["name"] + (" (kept)" if o["name"] == decision["chosen"] else "")
             + (f" ({o['timed_once']})" if o.get("timed_once") else "") for o in decision["options"]]
    w = max([32] + [len(n) + 2 for n in names])
    lines = [f"{'option':{w}s}{'shape':10s}{'predicted ms':>13s}{'measured ms':>13s}  backends"]
    for name, o in zip(names, decision["options"]):
        meas = f"{o['measured_s'] * 1e3:13.3f}" if "measured_s" in o else f"{'—':>13s}"
        mix = ", ".join(f"{b} {k}" for b, k in sorted((o.get("backend_mix") or {}).items()))
        note = f"failed: {o['error']}" if "error" in o else o.get("skipped", mix)
        lines.append(f"{name:{w}s}{o['cluster']:10s}{o['predicted_s'] * 1e3:13.3f}{meas}  {note}")
    if not decision.get("measured"):
        lines.append(f"not measured: {decision.get('why')}")
    if decision.get("claim_error"):
        lines.append(f"no claim: {decision['claim_error']}")
    runoff = decision.get("runoff") or {}
    if runoff:
        lines.append(f"runoff of {', '.join(runoff['options'])} ({runoff['blocks']} blocks each)"
                     + (f"; {runoff['library_kept']}" if runoff.get("library_kept") else ""))
    return "\n".join(lines)


__all__ = ["decision_table", "unmeasured"]
