"""Measurement cache and profiler logs under concurrency and crashes.

Several processes append to one JSON-lines file at once and nothing is lost or interleaved;
a last line cut short by a crash is skipped with its line number and the next record
starts on a line of its own; corrupted lines are still skipped and reported.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from tvm_pesto.backends.tvm_cpu import TIMING_STAMP
from tvm_pesto.costs.store import jsonl
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.costs.store.jsonl import INCOMPLETE, append_record, read_records
from tvm_pesto_lab.profile import ProfileLog, merge_logs

WRITERS = 4
RECORDS = 2000  # per writer

# One writer process: builds its log object, says "ready", waits for "go" on stdin, then appends.
WRITER = textwrap.dedent("""
    import sys
    from tvm_pesto.costs.store.cache import MeasureCache
    from tvm_pesto_lab.profile import ProfileLog

    path, kind, w, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    log = MeasureCache(path) if kind == "cache" else ProfileLog(path, model=f"m{w}")
    sys.path.insert(0, sys.argv[5])
    from test_cache_concurrency import record
    print("ready", flush=True)
    sys.stdin.read(1)
    for i in range(n):
        log.put(record(w, i))
""")


def pad_size(w: int, i: int) -> int:
    """Every 10th record is 5-69 KiB (larger than a pipe buffer and a page); the rest are small."""
    return 5 * 1024 + 997 * ((w * 7919 + i) % 64) if i % 10 == 3 else (w + i) % 50


def record(w: int, i: int) -> dict:
    return {"key": f"w{w}-r{i}", "backend": "tvm", "target": "t", "median_s": 1e-6 * (i + 1), "backend_stamp": TIMING_STAMP,
            "pad": chr(ord("a") + w % 26) * pad_size(w, i)}


def run_writers(path, kind: str, reader=None) -> None:
    """Start WRITERS processes, release them together, and call ``reader()`` until they finish."""
    test_dir = str(Path(__file__).parent)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), kind, str(w), str(RECORDS), test_dir],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for w in range(WRITERS)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("g")
            p.stdin.flush()
        while reader is not None and any(p.poll() is None for p in procs):
            reader()
        for p in procs:
            assert p.wait(timeout=120) == 0, f"writer {p.args[3]} failed"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def check_every_record_once(path, extra=None) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == WRITERS * RECORDS
    seen = {}
    for n, line in enumerate(lines, 1):
        rec = json.loads(line)  # an interleaved or torn line does not parse
        w, i = (int(x[1:]) for x in rec["key"].split("-"))
        assert rec["pad"] == record(w, i)["pad"], f"line {n}: record {rec['key']} is damaged"
        if extra:
            extra(w, rec)
        assert rec["key"] not in seen, f"record {rec['key']} written twice (lines {seen[rec['key']]} and {n})"
        seen[rec["key"]] = n
    assert set(seen) == {f"w{w}-r{i}" for w in range(WRITERS) for i in range(RECORDS)}
    return lines


@pytest.mark.slow
def test_concurrent_cache_writers_lose_and_interleave_nothing(tmp_path):
    path = tmp_path / "m.jsonl"
    loads = []

    def reader():  # a third process's view while the writers run: never a torn record
        if path.exists():
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                loads.append(len(MeasureCache(path)))

    run_writers(path, "cache", reader)
    check_every_record_once(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no skipped line
        cache = MeasureCache(path)
    assert len(cache) == WRITERS * RECORDS and cache.skipped == []
    assert cache.get("w1-r3", "tvm", "t")["pad"] == record(1, 3)["pad"]
    assert loads == sorted(loads)  # appends only ever grow what a reader sees


@pytest.mark.slow
def test_concurrent_profile_log_writers_lose_and_interleave_nothing(tmp_path):
    path = tmp_path / "prof.jsonl"
    run_writers(path, "profile")

    def same_model(w, rec):
        assert rec["model"] == f"m{w}" and "host" in rec

    check_every_record_once(path, same_model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = ProfileLog(path, model="m2")
    assert log.skipped == [] and len(log) == WRITERS * RECORDS
    assert log.get("w2-r7", "tvm", "t")["median_s"] == pytest.approx(8e-6)
    assert log.get("w0-r7", "tvm", "t") is None  # another model's record


GOOD = {"key": "k", "backend": "tvm", "target": "t", "median_s": 1e-3, "backend_stamp": TIMING_STAMP}
NEW = {"key": "n", "backend": "tvm", "target": "t", "median_s": 2e-3, "backend_stamp": TIMING_STAMP}


@pytest.mark.parametrize("cls", [MeasureCache, ProfileLog])
def test_truncated_last_line_is_skipped_and_the_next_record_starts_a_new_line(tmp_path, cls):
    p = tmp_path / "m.jsonl"
    line = json.dumps(dict(GOOD, key="cut"))
    p.write_text(json.dumps(GOOD) + "\n" + line[: len(line) // 2])  # the writer died mid-record
    with pytest.warns(RuntimeWarning, match=r"line 2 is incomplete \(the writer was interrupted\?\)"):
        c = cls(p)
    assert c.skipped == [(2, INCOMPLETE)]
    assert len(c) == 1 and c.entries[("k", "tvm", "t")]["median_s"] == 1e-3
    c.put(NEW)
    lines = p.read_text().split("\n")
    assert lines[0] == json.dumps(GOOD) and lines[1] == line[: len(line) // 2] and lines[3] == ""
    assert json.loads(lines[2])["key"] == "n"  # on its own line, not glued to the broken one
    with pytest.warns(RuntimeWarning, match=r"skipped 1 corrupted line\(s\) \(line 2\)$"):
        again = cls(p)
    assert [n for n, _ in again.skipped] == [2]
    assert again.entries[("n", "tvm", "t")]["median_s"] == 2e-3 and len(again) == 2


def test_complete_last_line_without_newline_is_kept(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(GOOD))  # written by hand: valid, just no newline
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = MeasureCache(p)
        c.put(NEW)
        assert len(MeasureCache(p)) == 2
    assert p.read_text() == json.dumps(GOOD) + "\n" + jsonl.encode_record(NEW).decode()


def test_corrupted_lines_and_an_incomplete_last_line_are_reported_apart(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b"\n{not json\n" + json.dumps({"key": "x"}).encode()
                  + b"\n\n\xff\xfe binary\n" + json.dumps(NEW).encode() + b'\n{"key": "half')
    with pytest.warns(RuntimeWarning) as rec:
        c = MeasureCache(p)
    msg = str(rec[0].message)
    assert "skipped 3 corrupted line(s) (line 2, 3, 5)" in msg
    assert "line 7 is incomplete (the writer was interrupted?)" in msg
    assert [n for n, _ in c.skipped] == [2, 3, 5, 7]
    assert set(c.entries) == {("k", "tvm", "t"), ("n", "tvm", "t")}


def test_merge_logs_skips_a_truncated_last_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(NEW)[:-3])
    with pytest.warns(RuntimeWarning, match=r"skipped 1 malformed line\(s\) \(p.jsonl:2\)"):
        res = merge_logs([p], tmp_path / "out.jsonl")
    assert res["records"] == 1 and res["skipped"] == [(str(p), 2, INCOMPLETE)]


def test_append_without_fcntl_still_appends_whole_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "fcntl", None)
    p = tmp_path / "deep" / "m.jsonl"
    p.parent.mkdir()
    p.write_text('{"key": "cut')
    append_record(p, GOOD)
    assert [(n, why) for n, _, why in read_records(p)] == [(1, "not JSON (Unterminated string starting at)"),
                                                           (2, None)]


def test_unserializable_record_leaves_file_and_cache_untouched(tmp_path):
    p = tmp_path / "m.jsonl"
    c = MeasureCache(p)
    c.put(GOOD)
    before = p.read_bytes()
    with pytest.raises(TypeError):
        c.put(dict(NEW, median_s=object()))
    assert p.read_bytes() == before and c.get("n", "tvm", "t") is None


@pytest.mark.slow
def test_a_rewrite_while_others_append_loses_no_record(tmp_path):
    """Appenders wait for a rewrite's lock and append after what it kept: a log compacted
    while other processes write to it keeps every record they wrote (here the rewrite keeps all)."""
    path = tmp_path / "builds.jsonl"
    append_record(path, {"w": -1, "i": 0})
    code = textwrap.dedent("""
        import sys
        from tvm_pesto.costs.store.jsonl import append_record
        for i in range(int(sys.argv[3])):
            append_record(sys.argv[1], {"w": int(sys.argv[2]), "i": i})
    """)
    n = 400
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(w), str(n)]) for w in range(2)]
    rewrites = 0
    while any(p.poll() is None for p in procs):
        jsonl.rewrite_records(path, lambda recs: recs)
        rewrites += 1
    assert all(p.wait() == 0 for p in procs)
    recs = [r for _, r, why in read_records(path) if why is None]
    assert len(recs) == 2 * n + 1 and rewrites > 0
    for w in range(2):
        assert [r["i"] for r in recs if r["w"] == w] == list(range(n))
