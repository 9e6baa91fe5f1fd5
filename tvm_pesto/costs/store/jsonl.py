"""JSON-lines files that several processes append to at once.

The measurement cache (:class:`~tvm_pesto.costs.store.cache.MeasureCache`) and the profiler logs
(:class:`~tvm_pesto_lab.profile.ProfileLog`) are appended to by every run that measures,
and two runs may share a file. :func:`append_record` writes one record as one ``os.write``
of the whole line on a descriptor opened with ``O_APPEND`` (POSIX appends a single write
to a regular file without interleaving it with other appends), inside an exclusive
``flock`` (for records larger than a pipe buffer, and file systems where ``O_APPEND`` alone
is not enough). If the file does not end with a newline (a writer crashed mid-record), the
same locked write starts with one, so the new record never joins the broken one.

:func:`read_records` reads a file under a shared lock and yields every non-blank line with
its number, parsed or with the reason it could not be: a last line without a newline that
is not valid JSON is reported as :data:`INCOMPLETE` (a writer was interrupted).

A log that is only read (the bundled training data, ``cost_models/profile-cpu.jsonl.gz``) may be
gzip-compressed: :func:`log_file` maps a log's name to the file that holds it (``NAME`` or
``NAME.gz``), and :func:`read_records` and :func:`open_log` read either. :func:`open_log` also
writes one whole, compressed when the name ends in ``.gz``; appending is for plain files only.

Examples
--------
>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "log.jsonl")
>>> with open(p, "w") as f:
...     _ = f.write('{"a": 1}\\n{"a": 2, "b"')      # a crash in the middle of the second record
>>> append_record(p, {"a": 3})
>>> for n, rec, why in read_records(p):
...     print(n, rec, why)
1 {'a': 1} None
2 None not JSON (Expecting ':' delimiter)
3 {'a': 3} None
>>> with open(p, "a") as f:
...     _ = f.write('{"a": 4')
>>> list(read_records(p))[-1]
(4, None, 'incomplete (the writer was interrupted?)')
>>> skipped_note([(2, "not JSON"), (4, INCOMPLETE)])
'skipped 1 corrupted line(s) (line 2); line 4 is incomplete (the writer was interrupted?)'
"""
from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

try:  # advisory locks: POSIX only; elsewhere the single O_APPEND write is all we have
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

#: Reason given for a last line that has no newline and does not parse.
INCOMPLETE = "incomplete (the writer was interrupted?)"


def _lock(fd: int, exclusive: bool) -> bool:
    """Take an advisory lock on ``fd``; False where the platform or file system has none."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    except OSError:  # e.g. ENOLCK / EOPNOTSUPP on some network file systems
        return False
    return True


def _unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:  # pragma: no cover - closing the descriptor releases it anyway
        pass


def encode_record(rec: dict) -> bytes:
    """The line :func:`append_record` writes for ``rec`` (compact, ASCII, newline-terminated)."""
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode("ascii")


def append_record(path: str | os.PathLike, rec: dict) -> None:
    """Append ``rec`` as one JSON line to ``path``, atomically with respect to other appenders.

    The parent directory is created if needed. The line is encoded first (an object that
    is not JSON serializable raises before the file is touched), then written by one
    ``os.write`` under an exclusive ``flock``; a short write (disk full) is completed by
    further writes while the lock is still held.

    Parameters
    ----------
    path : path-like
        The JSON-lines file.
    rec : dict
        A JSON-serializable record.

    Examples
    --------
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "sub", "cache.jsonl")
    >>> append_record(p, {"key": "k", "median_s": 1e-3}); append_record(p, {"key": "j", "median_s": 2e-3})
    >>> open(p).read()
    '{"key":"k","median_s":0.001}\\n{"key":"j","median_s":0.002}\\n'
    """
    if _compressed(path):
        raise ValueError(f"cannot append to the gzip-compressed log {path}; append to a plain .jsonl file and "
                         "compress it when it is complete")
    data = encode_record(rec)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o666)
    try:
        locked = _lock(fd, exclusive=True)
        try:
            size = os.fstat(fd).st_size
            if size:
                os.lseek(fd, size - 1, os.SEEK_SET)
                if os.read(fd, 1) != b"\n":  # the last writer died mid-record: start a fresh line
                    data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            if locked:
                _unlock(fd)
    finally:
        os.close(fd)


def rewrite_records(path: str | os.PathLike, keep) -> int:
    """Replace the records of the plain JSON-lines file ``path`` by ``keep(records)`` (the
    parsed records in file order, lines that do not parse left out), in place under an
    exclusive ``flock``: appenders wait for it and then append after the kept records.
    Returns the number of records kept.

    Examples
    --------
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "log.jsonl")
    >>> for k in range(5):
    ...     append_record(p, {"k": k})
    >>> rewrite_records(p, lambda recs: recs[-2:])
    2
    >>> open(p).read()
    '{"k":3}\\n{"k":4}\\n'
    """
    if _compressed(path):
        raise ValueError(f"cannot rewrite the gzip-compressed log {path}")
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    try:
        locked = _lock(fd, exclusive=True)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
            recs = []
            for raw in data.split(b"\n"):
                if not raw.strip():
                    continue
                try:
                    recs.append(json.loads(raw))
                except (UnicodeDecodeError, json.JSONDecodeError):  # a torn or foreign line: dropped
                    continue
            kept = list(keep(recs))
            out = b"".join(encode_record(r) for r in kept)
            os.lseek(fd, 0, os.SEEK_SET)
            view = memoryview(out)
            while view:
                view = view[os.write(fd, view):]
            os.ftruncate(fd, len(out))
        finally:
            if locked:
                _unlock(fd)
    finally:
        os.close(fd)
    return len(kept)


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, object | None, str | None]]:
    """Every non-blank line of a JSON-lines file: ``(line number, parsed value, None)`` or
    ``(line number, None, reason)`` for a line that is not JSON.

    The file is read whole under a shared ``flock`` (so a record being appended is seen
    complete or not at all), then parsed. A last line without a newline that does not parse
    gets the reason :data:`INCOMPLETE`. Validating the fields of each record is the caller's
    business.

    Parameters
    ----------
    path : path-like
        An existing JSON-lines file, or the name of one stored gzip-compressed (:func:`log_file`).
    """
    path = log_file(path)
    with open(path, "rb") as f:
        locked = _lock(f.fileno(), exclusive=False)
        try:
            data = f.read()
        finally:
            if locked:
                _unlock(f.fileno())
    if _compressed(path):
        data = gzip.decompress(data)
    lines = data.split(b"\n")
    last = len(lines)  # lines[-1] is b"" when the file ends with a newline
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw), None
        except UnicodeDecodeError:
            yield lineno, None, INCOMPLETE if lineno == last else "not UTF-8 text"
        except json.JSONDecodeError as e:
            yield lineno, None, INCOMPLETE if lineno == last else f"not JSON ({e.msg})"


def _compressed(path) -> bool:
    return str(path).endswith(".gz")


def log_file(path: str | os.PathLike) -> Path:
    """The file holding the log named ``path``: ``path`` itself if it exists, else ``path.gz``
    if that exists (a log stored compressed keeps the name it was trained and recorded under),
    else ``path`` (for the caller to report missing).

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open_log(os.path.join(d, "log.jsonl.gz"), "w") as f:
    ...     _ = f.write('{"a": 1}\\n')
    >>> log_file(os.path.join(d, "log.jsonl")).name
    'log.jsonl.gz'
    >>> [rec for _, rec, _ in read_records(os.path.join(d, "log.jsonl"))]
    [{'a': 1}]
    """
    p = Path(path)
    if p.exists() or _compressed(p):
        return p
    gz = p.with_name(p.name + ".gz")
    return gz if gz.is_file() else p


def open_log(path: str | os.PathLike, mode: str = "r", compressed: bool | None = None):
    """Open a JSON-lines log as text, gzip-compressed or not, to read (``"r"``) or write whole (``"w"``).

    Parameters
    ----------
    path : path-like
        Reading: a log's name (:func:`log_file`). Writing: the file to write.
    mode : {"r", "w"}
    compressed : bool, optional
        Whether the file is gzip data; default: whether its name ends in ``.gz`` (give it when
        writing a temporary file that is renamed afterwards). Written gzip data carry no time
        stamp or file name, so the same records give the same bytes.
    """
    if mode not in ("r", "w"):
        raise ValueError(f"open_log mode {mode!r}; use 'r' or 'w' (append with append_record)")
    if mode == "r":
        path = log_file(path)
    if not (_compressed(path) if compressed is None else compressed):
        return open(path, mode, encoding="utf-8")
    raw = open(path, mode + "b")
    try:
        z = gzip.GzipFile(filename="", mode=mode + "b", fileobj=raw, **({"mtime": 0} if mode == "w" else {}))
    except BaseException:
        raw.close()
        raise
    return _ClosingText(z, raw)


class _ClosingText(io.TextIOWrapper):
    """A text stream over a ``GzipFile`` that also closes the file under it."""

    def __init__(self, z, raw):
        super().__init__(z, encoding="utf-8")
        self._raw = raw

    def close(self):
        try:
            super().close()
        finally:
            self._raw.close()


def skipped_note(skipped: list[tuple[int, str]], noun: str = "corrupted") -> str:
    """One phrase for the lines a loader skipped: ``(line number, reason)`` pairs.

    Lines whose reason is :data:`INCOMPLETE` are named separately from the others.
    """
    incomplete = [n for n, why in skipped if why == INCOMPLETE]
    other = [n for n, why in skipped if why != INCOMPLETE]
    parts = []
    if other:
        head = ", ".join(str(n) for n in other[:10]) + (", ..." if len(other) > 10 else "")
        parts.append(f"skipped {len(other)} {noun} line(s) (line {head})")
    parts += [f"line {n} is {INCOMPLETE}" for n in incomplete]
    return "; ".join(parts)


__all__ = ["INCOMPLETE", "append_record", "encode_record", "log_file", "open_log", "read_records", "rewrite_records",
           "skipped_note"]
