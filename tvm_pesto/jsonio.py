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
from pathlib import Path

import numpy as np

from .errors import PestoError

#: The JSON Schemas of the files the CLI writes (``<kind>.schema.json``), shipped with the package.
SCHEMAS = Path(__file__).parent / "schemas"


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


def write_json(path: str, data, schema: str | None = None) -> str:
    """Write ``jsonable(data)`` to ``path`` through a temporary file (no half-written file).

    ``schema`` names the JSON Schema the file follows (:func:`schema_path`): the file is
    written whole, then checked; a mismatch raises :class:`~tvm_pesto.errors.PestoError`
    naming the field (a bug of the writer, whose file is kept to report it).

    Examples
    --------
    >>> import tempfile, os, json
    >>> p = write_json(os.path.join(tempfile.mkdtemp(), "r.json"), {"x": 1})
    >>> json.load(open(p))
    {'x': 1}
    """
    out = jsonable(data)
    written = _atomic_write(path, lambda f: json.dump(out, f, indent=1))
    if schema is not None:
        problems = schema_problems(schema, out)
        if problems:
            raise PestoError(f"{written} is written whole, but it does not match its schema "
                             f"({schema_path(schema)}): {'; '.join(problems[:3])}. That is a bug in tvm-pesto: "
                             "please report it with the file")
    return written


def schema_path(kind: str) -> Path:
    """The JSON Schema of the files of ``kind`` (e.g. ``run``: ``tvm-pesto run --json``)."""
    path = SCHEMAS / f"{kind}.schema.json"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
        raise PestoError(f"no JSON Schema for {kind!r}; the schemas are {known}")
    return path


def schema_problems(kind: str, data) -> list[str]:
    """Where ``data`` (JSON-ready) breaks the schema of ``kind``: one line per problem, with
    its JSON path; [] when it matches.

    Examples
    --------
    >>> schema_problems("cluster", {"name": "cpu:2"})[0]
    "$: 'devices' is a required property"
    """
    # lazy: jsonschema is needed only where a file is checked
    import jsonschema
    import referencing

    shipped = [json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.schema.json"))]
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in shipped)  # one schema may name another
    validator = jsonschema.Draft202012Validator(json.loads(schema_path(kind).read_text()), registry=registry)
    return [f"{e.json_path}: {e.message}" for e in sorted(validator.iter_errors(data), key=lambda e: list(e.path))]


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


