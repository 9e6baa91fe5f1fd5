"""Backend + device + order, chosen together.

``cover`` (Collage's covering search), ``ceiling`` (what a mix of backends could gain),
``ilp`` (the backend + device + order MIP), ``relaxation`` (the backend + device MIP on whole
graphs, with a proven bound), ``search`` (local search over backend and device), ``decide``
(the MIPs' step of the joint solve: which plan decides, its gap) and ``solver`` (the flow's
solver: cover, placement, joint search).
"""
