"""No absolute path into one machine's folders in the package, the lab (and its scripts), tests or docs.

A user's machine has none of the development machines' folders (their shared benchmark
folder, the checkout's location, a home folder, a scratch folder under ``/tmp``). Shipped data
are found through :mod:`tvm_pesto.package_data`; commands in docs use paths relative to the
checkout. Paths every machine has (``/proc/cpuinfo``, ``/dev/null``, ``/usr/bin/env``) and ``~``
stay allowed.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What is scanned, relative to the checkout: folders (every text file under them) and files.
SCANNED = ("tvm_pesto", "lab", "tests", "docs", "tutorials", "benchmarks", "README.md", "cost_models/README.md",
           "CMakeLists.txt", "pyproject.toml")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis", "build"}  # build: `pip install ./lab` copies
BINARY_SUFFIXES = {".png", ".so", ".pyc", ".npz", ".gz", ".whl"}

#: An absolute path into a machine's own folders: the checkout's parent (``/work/``), a home
#: folder (``/root``, ``/home/<user>``, ``/Users/<user>``), a named folder under ``/tmp``, mount
#: and scratch folders, and ``../shared`` (the folder beside a development checkout). It must
#: start a path: not inside a URL or a longer path (no word character, ``.``, ``~``, ``/`` or
#: ``-`` before it).
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])(?:/work/|/root\b|/home/\w|/Users/\w|/tmp/\w|/mnt/|/scratch/)"
    r"|(?<![\w.~/-])(?:\.\./)+shared\b"
)


def scanned_files() -> list[Path]:
    """Every text file of :data:`SCANNED`, but this one (its examples are machine paths)."""
    out = []
    for rel in SCANNED:
        p = ROOT / rel
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix not in BINARY_SUFFIXES
                    and not SKIPPED_DIRS & set(f.relative_to(ROOT).parts)]
    return [f for f in out if f != Path(__file__).resolve()]


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of ``text`` holding a machine path."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if MACHINE_PATH.search(line)]


@pytest.mark.parametrize("text", [
    "ROOT = \"/" + "work/shared/benchmarks/dnn-partitioning\"",  # split: this file holds no machine path itself
    "tvm-pesto place ../shared/benchmarks/dnn-partitioning/x.json",
    "--json /tmp/b6/placement.json",
    "    '/home/me/ms_work'",
    "cache in /root/.cache/tvm-pesto",
    "cd /root",
    "(`/work/main/cost_models/default.json`)",
    "open('/Users/ann/data.json')",
    "/mnt/data/x",
])
def test_machine_paths_are_found(text):
    assert machine_paths(text), text


@pytest.mark.parametrize("text", [
    "with open('/proc/cpuinfo') as f:",
    "fd 1 pointed at /dev/null",
    "#!/usr/bin/env python",
    "~/.cache/tvm-pesto/profile.jsonl",
    "https://github.com/msr-fiddle/dnn-partitioning/tree/main/work/x",
    "benchmarks/dnn-partitioning/latency-inputs",
    "tempfile.mkdtemp() under /tmp",
    "a network/work/ folder, the tree root/home/x",
    "cost_models/ms-small/tvm_pesto_device.json",
])
def test_generic_paths_are_allowed(text):
    assert not machine_paths(text), text


def test_no_machine_paths():
    files = scanned_files()
    assert len(files) > 100 and ROOT / "README.md" in files  # the scan sees the repository
    hits = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        hits += [f"{f.relative_to(ROOT)}:{n}: {line[:160]}" for n, line in machine_paths(text)]
    assert not hits, ("absolute paths into one machine's folders (use a path relative to the checkout, a "
                      "shipped data folder via tvm_pesto.package_data, or tmp_path):\n" + "\n".join(hits))
