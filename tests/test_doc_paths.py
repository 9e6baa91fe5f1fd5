"""Every repository path the docs name exists in the checkout.

Scanned: ``README.md``, ``docs/**/*.md`` and ``cost_models/README.md``. A path is named in a
code span (inline or fenced) or as a link target. In code, a path is a slash-separated token
that either starts with a top folder of the repository (:data:`TOP_DIRS`) or ends in a
source or data file extension (:data:`EXTENSIONS`); the latter may be written relative to the
checkout, to the doc's own folder (``placement/scale.json`` in ``docs/placement.md``) or to
the package (``costs/predict/xgb.py`` for ``tvm_pesto/costs/predict/xgb.py``). A link target is relative to
the doc's folder, as Markdown reads it. Not checked: placeholders (``<m>``, ``$OUT``, ``~``,
``NAME``), URLs, and the path after an option that names what a command writes (``--json
out/x.json``, ``-o FILE``, ``> FILE``). A glob (``*``) must match at least one file.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Top folders of the checkout: a code token that starts with one of them is a repository path.
TOP_DIRS = ("tvm_pesto", "lab", "tests", "docs", "benchmarks", "cost_models", "tutorials", "src", ".ci")
#: A code token ending in one of these (and holding a ``/``) is a repository path too.
EXTENSIONS = (".py", ".md", ".json", ".jsonl", ".gz", ".png", ".cc", ".h", ".txt", ".toml", ".cfg", ".yml",
              ".yaml", ".sh", ".csv")
#: Options (and shell redirections) after which a path is what the command writes.
OUTPUT_OPTIONS = re.compile(r"(?:^|\s)(?:-o|--json|--md|--plots?|--out|--output|--log|--dir|--work-dir|--export|"
                            r"--trace-dir|--wheel-cache|>>?)[\s=]*[\"']?$")
#: A slash-separated token: not inside a longer word, a URL, a ``$VAR/``, ``~/`` or ``<x>/`` path.
TOKEN = re.compile(r"(?<![\w$~<>{}./:@%-])((?:\.{1,2}/)*[\w*-][\w.*-]*(?:/[\w.*-]+)+/?)(?![\w<>{}$(.*/-])")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_files(root: Path = ROOT) -> list[Path]:
    """The docs whose paths are checked (those that exist)."""
    files = [root / "README.md", root / "cost_models" / "README.md"] + sorted((root / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def code_and_links(text: str):
    """``(line number, kind, text)`` of each code line or span (kind ``code``) and each link
    target (kind ``link``) of a Markdown text."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            yield n, "code", line
            continue
        for m in CODE_SPAN.finditer(line):
            yield n, "code", m.group(2)
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            yield n, "link", m.group(1)


#: Upper-case names that are files, not placeholders.
UPPER_CASE_FILES = {"README", "LICENSE", "ABOUT", "CHANGELOG", "NOTICE"}


def _is_placeholder(path: str) -> bool:
    # an upper-case part (NAME, DIR, MODEL) or an ellipsis stands for the user's own value
    return "..." in path or any(len(p) > 1 and p.isupper() and p not in UPPER_CASE_FILES
                                for p in re.split(r"[/.]", path))


def _exists(path: str, bases) -> bool:
    for base in bases:
        if any(c in path for c in "*?["):
            if next(iter(base.glob(path.rstrip("/"))), None) is not None:
                return True
        elif (base / path).exists():
            return True
    return False


def code_paths(code: str) -> list[str]:
    """The repository paths a piece of code names (see the module docstring)."""
    out = []
    for m in TOKEN.finditer(code):
        path = m.group(1).rstrip(".")
        if OUTPUT_OPTIONS.search(code[:m.start()]) or _is_placeholder(path):
            continue
        first = path.lstrip("./").split("/")[0]
        if first in TOP_DIRS or path.rstrip("/").endswith(EXTENSIONS):
            out.append(path)
    return out


def missing_paths(text: str, doc: Path, root: Path = ROOT) -> list[str]:
    """``"line: path"`` for every path ``text`` (the Markdown of ``doc``) names that is not in
    the checkout at ``root``."""
    missing = []
    for n, kind, s in code_and_links(text):
        if kind == "link":
            target = s.split("#", 1)[0]
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # an anchor, a URL, mailto:
                continue
            if not _exists(target, [doc.parent]):
                missing.append(f"{n}: {target}")
            continue
        for path in code_paths(s):
            if not _exists(path, [root, doc.parent, root / "tvm_pesto"]):
                missing.append(f"{n}: {path}")
    return missing


def test_every_path_named_in_the_docs_exists():
    docs = doc_files()
    assert ROOT / "README.md" in docs and len(docs) > 5  # the scan sees the repository
    stale = [f"{d.relative_to(ROOT)}:{m}" for d in docs for m in missing_paths(d.read_text(encoding="utf-8"), d)]
    assert not stale, ("paths named in the docs that are not in the checkout (moved or deleted: name the new "
                       "place, or drop the mention):\n" + "\n".join(stale))


@pytest.mark.parametrize("text", [
    "the solver is `tvm_pesto/solve/no_such_solver.py`",
    "```bash\npython lab/scripts/no_such_script.py --json out.json\n```",
    "see [the notes](no_such_doc.md)",
    "as `costs/no_such_module.py` does",
    "`tests/test_no_such_file.py::test_case`",
    "`benchmarks/dnn-partitioning/*-inputs/NoSuchFolder/*.json`",
])
def test_a_missing_path_is_found(text):
    assert missing_paths(text, ROOT / "docs" / "synthetic.md"), text


@pytest.mark.parametrize("text", [
    "`tvm_pesto/api.py`, `costs/predict/xgb.py` (the package's), `placement/scale.json` (beside the doc)",
    "`tests/test_doc_paths.py::test_a_missing_path_is_found`, `tvm_pesto/api.py:place`",
    "```bash\ntvm-pesto bench placement --json bench-out/placement.json --md bench-out/p.md\n```",
    "`tvm-pesto cluster bench -o cpu2.json`, `python x.py > out/log.json`",
    "`~/.cache/tvm-pesto/measurements.jsonl`, `$TVM_PESTO_CACHE/tensorrt/<key>.engine`, `$OUT/gpu-check.json`",
    "`cost_models/NAME.json`, `models/<m>.cuda.so`, `cost_models/gpu-check-<gpu>.json`, `run/place/demo`",
    "`cpu/host-cpu/1@AuthenticAMD/23/1`, `data/<m>.<lib>.npz`, `$TVM_PESTO_CACHE/machine/`",
    "[GitHub](https://github.com/msr-fiddle/dnn-partitioning), [below](#device-check)",
    "[the model](../cost_models/README.md) from `docs/`, `benchmarks/dnn-partitioning/*-inputs/LayerGraphs/*.json`",
])
def test_what_is_no_repository_path_is_left_alone(text):
    assert missing_paths(text, ROOT / "docs" / "synthetic.md") == [], text
