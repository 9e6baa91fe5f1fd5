"""The stage model: contiguous pipeline stages, one per device.

``ideal_dp`` (contiguous splits by DP over ideals, and its bound), ``dp`` (the ``stage-dp``
solver built on it), ``model`` (the stage model's MIP), ``ilp`` (it solved from the best
start) and ``bounds`` (the stage model's chain bound on latency).
"""
