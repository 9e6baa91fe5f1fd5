"""The JSON Schemas of the files the CLI writes (``tvm_pesto/schemas``): every writer names one
that ships, each is a valid schema, and a file that breaks its schema is caught at writing.

Every test that runs a verb with ``--json`` checks that file against its schema on the way
(:func:`tvm_pesto.jsonio.write_json`), so the schemas follow what the verbs write.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import jsonschema
import pytest

import tvm_pesto
import tvm_pesto_lab
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import PestoError
from tvm_pesto.jsonio import SCHEMAS, jsonable, schema_path, schema_problems, write_json

CLI = Path(tvm_pesto.__file__).parent / "cli"
#: Where files the CLI writes are written: the verbs, the report's writer (``run --report``) and the
#: cost-model lab's verbs.
WRITERS = (CLI, Path(tvm_pesto.__file__).parent / "report", Path(tvm_pesto_lab.__file__).parent)


def _named_by_writers() -> set[str]:
    """Every ``schema=`` literal (and ``_write_outputs``'s last argument) in the writers' sources."""
    names = set()
    for path in (p for d in WRITERS for p in d.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "schema" and isinstance(kw.value, ast.Constant):
                    names.add(kw.value.value)
            if getattr(node.func, "id", None) == "_write_outputs" and isinstance(node.args[-1], ast.Constant):
                names.add(node.args[-1].value)
    return names


def test_every_shipped_schema_is_valid():
    shipped = sorted(SCHEMAS.glob("*.schema.json"))
    assert len(shipped) >= 12
    for path in shipped:
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"].endswith("/" + path.name), path.name


def test_every_writer_names_a_shipped_schema_and_every_schema_has_a_writer():
    named = _named_by_writers()
    shipped = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")}
    assert {"run", "place", "train", "report", "bench-peers", "bench-placement", "bench-scale", "bench-backends",
            "bench-search", "bench-training"} <= named
    assert named <= shipped, sorted(named - shipped)
    assert shipped <= named, sorted(shipped - named)


def test_the_run_schema_says_what_every_field_means():
    props = json.loads(schema_path("run").read_text())["properties"]
    assert len(props) >= 50
    assert not [k for k, v in props.items() if not v.get("description")]


def test_a_report_that_breaks_its_schema_is_written_whole_and_refused(tmp_path):
    cluster = jsonable(parse_cluster("cpu:2").to_dict())
    assert schema_problems("cluster", cluster) == []
    broken = {**cluster, "devices": [{**cluster["devices"][0], "kind": "tpu"}]}
    with pytest.raises(PestoError, match=r"does not match its schema .*cluster\.schema\.json.*\$\.devices\[0\]\.kind"):
        write_json(tmp_path / "c.json", broken, schema="cluster")
    assert json.loads((tmp_path / "c.json").read_text())["devices"][0]["kind"] == "tpu"  # kept, to report


def test_a_schema_refers_to_another_by_its_id():
    cluster = jsonable(parse_cluster("cpu:2").to_dict())
    res = {"size": "small", "machine": {}, "clusters": {"cpu:1": cluster}, "rounds": 3, "models": {}, "errors": {},
           "deterministic": True}
    assert schema_problems("bench-backends", res) == []
    res["clusters"]["cpu:1"] = {"name": "no devices"}
    assert any("devices" in p for p in schema_problems("bench-backends", res))


def test_an_unknown_schema_is_named_with_the_known_ones():
    with pytest.raises(PestoError, match=r"no JSON Schema for 'rnu'; the schemas are \[.*'run'"):
        schema_path("rnu")


def test_a_run_that_kept_the_one_device_shape_has_no_contention_and_validates():
    # the cluster's contention is measured for several devices; a kept one-device shape has none
    schema = json.loads(schema_path("run").read_text())
    jsonschema.validate(None, schema["properties"]["contention"])
    jsonschema.validate({"slowdown": 1.2}, schema["properties"]["contention"])
