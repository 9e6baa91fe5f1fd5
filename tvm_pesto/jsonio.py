"""JSON-ready values and files written whole: one place for every report and result file.

Examples
--------
>>> import tempfile, os, json
>>> from tvm_pesto.jsonio import write_json
>>> p = write_json(os.path.join(tempfile.mkdtemp(), "r.json"), {"x": float("inf")})
>>> json.load(open(p))
{'x': None}
"""
from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np


def jsonable(x):
    """``x`` with NumPy scalars/arrays, tuples and non-finite floats made JSON-safe
    (``inf``/``nan`` become None).

    Examples
    --------
    >>> import numpy as np
    >>> jsonable({"a": np.float64(1.5), "b": (np.int64(2), float("inf"))})
    {'a': 1.5, 'b': [2, None]}
    """
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return jsonable(x.item())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    return str(x)


def _atomic_write(path: str, write) -> str:
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str, data) -> str:
    """Write ``jsonable(data)`` to ``path`` through a temporary file (no half-written file).

    Examples
    --------
    >>> import tempfile, os, json
    >>> p = write_json(os.path.join(tempfile.mkdtemp(), "r.json"), {"x": 1})
    >>> json.load(open(p))
    {'x': 1}
    """
    return _atomic_write(path, lambda f: json.dump(jsonable(data), f, indent=1))


def write_text(path: str, text: str) -> str:
    """Write ``text`` to ``path`` through a temporary file.

    Examples
    --------
    >>> import tempfile, os
    >>> p = write_text(os.path.join(tempfile.mkdtemp(), "t.md"), "# hi\\n")
    >>> open(p).read()
    '# hi\\n'
    """
    return _atomic_write(path, lambda f: f.write(text))


