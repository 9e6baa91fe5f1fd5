"""The op model's placement ILP and the searches around it.

``model`` (the MIP: its build, constraint families and warm start), ``warm_solve`` (the MIP
solved from a warm start, never worse than it), ``coarsen`` (supernodes) and ``coarse_ilp``
(the MIP on them), ``lns`` (MIP windows of a schedule), ``refine`` (local search),
``polish`` (it from several starts), and ``driver`` (the registry's ``ilp``: coarsen, solve,
LNS, refine). Nothing here but the driver imports the driver.
"""
