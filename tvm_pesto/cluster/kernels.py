"""Compile the small Relax kernels that measure a cluster's devices.

The contention bench (:mod:`tvm_pesto.cluster.contention`) and the executor's dispatch
measurement (:mod:`tvm_pesto.costs.calibrate.dispatch`) each time a few tiny TVM programs on every
device; :func:`compile_for` builds one for a device's target and explains a failure deep
inside TVM as a :class:`~tvm_pesto.errors.ClusterError`.
"""
from __future__ import annotations

from ..errors import ClusterError, error_line


def compile_for(device, mod, what: str):
    """``tvm.compile`` of the Relax module ``mod`` for ``device``'s target, with TVM's
    default Relax pipeline for that target.

    Raises
    ------
    ClusterError
        When TVM cannot compile it; the message names ``what`` and the device.
    """
    import tvm
    from tvm import relax

    tgt = tvm.target.Target(device.target)
    try:
        return tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    except Exception as e:  # TVM raises many types from deep inside; explain at our boundary
        raise ClusterError(f"TVM could not compile {what} for {device.name}: {error_line(e)}") from e


__all__ = ["compile_for"]
