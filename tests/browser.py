"""Headless Chromium for the report page's test (``tests/test_report_browser.py``): found on
this machine, or installed into the checkout's private, git-ignored ``.browser/`` folder from
the Debian package ``chromium-headless-shell`` and the libraries it needs that the machine
lacks (``apt-get install --download-only`` into that folder, unpacked with ``dpkg-deb -x``:
nothing is installed into the system or the Python environment).

Where none can be found or installed, :func:`find_or_install` raises :class:`BrowserUnavailable`
naming every place it looked and why the install failed; the test skips with that reason.
``TVM_PESTO_CHROMIUM`` names a binary to use instead.

The page is opened as Chromium's command line does: ``--dump-dom`` prints the DOM once the
page's scripts have run, ``--screenshot`` saves the window; the network is cut off
(``--host-resolver-rules``), so the page is shown as it is when opened offline.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRIVATE = ROOT / ".browser"
PACKAGE = "chromium-headless-shell"
#: Binaries of Chromium a machine may have on its PATH, in the order they are tried.
NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell")
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND"


class BrowserUnavailable(Exception):
    """No headless Chromium here, and none could be installed (the message says why)."""


@dataclass(frozen=True)
class Browser:
    """A headless Chromium binary and the environment it runs in."""

    path: str
    env: dict = field(default_factory=dict)

    def _run(self, url: str, *flags: str, timeout: float = 180.0) -> str:
        with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
            res = subprocess.run([self.path, "--headless", "--no-sandbox", "--disable-gpu", OFFLINE,
                                  f"--user-data-dir={profile}", *flags, url], capture_output=True, text=True,
                                 timeout=timeout, env={**os.environ, **self.env})
        if res.returncode != 0:
            raise RuntimeError(f"{self.path} exited {res.returncode}: {res.stderr.strip()[-800:]}")
        return res.stdout

    def version(self) -> str:
        return self._run("--version").strip() or "?"

    def dump_dom(self, page: Path, fragment: str = "") -> str:
        """The page's DOM after its scripts ran (opened at ``#fragment``, if given)."""
        return self._run(Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else ""), "--dump-dom")

    def screenshot(self, page: Path, png: Path, width: int = 1300, height: int = 2000) -> Path:
        self._run(Path(page).resolve().as_uri(), f"--screenshot={Path(png).resolve()}",
                  f"--window-size={width},{height}", "--hide-scrollbars")
        return Path(png)


def _works(browser: Browser) -> str | None:
    """None when ``browser`` starts, else why not."""
    try:
        subprocess.run([browser.path, "--version"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **browser.env}, check=True)
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"{browser.path} does not start: {getattr(e, 'stderr', '') or e}".strip()[-400:]


def _private() -> Browser:
    root = PRIVATE / "root"
    libs = sorted({str(p.parent) for p in root.glob("usr/lib/*-linux-gnu/**/*.so*")})
    path = root / "usr/lib/chromium" / PACKAGE
    env = {"LD_LIBRARY_PATH": os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)}
    return Browser(str(path), env)


def _apt(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, timeout=900)


def install() -> Browser:
    """Download ``chromium-headless-shell`` and the libraries this machine lacks into
    ``.browser/`` and unpack them there."""
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise BrowserUnavailable("cannot install it: this machine has no apt-get and dpkg-deb (not Debian-like)")
    debs = PRIVATE / "debs"
    (debs / "partial").mkdir(parents=True, exist_ok=True)
    fetch = ["install", "-y", "--download-only", "--no-install-recommends", "-o", f"Dir::Cache::archives={debs}",
             "-o", "Debug::NoLocking=1", PACKAGE]
    res = _apt(fetch)
    if res.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        _apt(["update"])  # a fresh machine may have no package lists yet
        res = _apt(fetch)
    if res.returncode != 0:
        raise BrowserUnavailable(f"apt-get could not download {PACKAGE}: "
                                 f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(PRIVATE / "root")], check=True, capture_output=True)
    shutil.rmtree(debs)  # unpacked: the archives are not needed again
    return _private()


def find_or_install() -> Browser:
    """A headless Chromium that starts: ``TVM_PESTO_CHROMIUM``, one on the PATH, the one in
    ``.browser/``, or one installed there now.

    Raises
    ------
    BrowserUnavailable
        Naming where it looked and why the install failed.
    """
    tried = []
    given = os.environ.get("TVM_PESTO_CHROMIUM")
    candidates = [Browser(given)] if given else []
    candidates += [Browser(p) for p in (shutil.which(n) for n in NAMES) if p]
    for b in candidates:
        why = _works(b)
        if why is None:
            return b
        tried.append(why)
    PRIVATE.mkdir(exist_ok=True)
    with open(PRIVATE / ".lock", "w") as lock:  # one install at a time (xdist workers, other checkouts' runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        b = _private()
        if Path(b.path).is_file() and _works(b) is None:
            return b
        try:
            b = install()
        except (OSError, subprocess.SubprocessError) as e:
            raise BrowserUnavailable(f"no headless Chromium: none on the PATH ({', '.join(NAMES)}); "
                                     f"installing {PACKAGE} into {PRIVATE} failed: {e}") from e
        except BrowserUnavailable as e:
            raise BrowserUnavailable(f"no headless Chromium: none on the PATH ({', '.join(NAMES)}){'; ' if tried else ''}"
                                     f"{'; '.join(tried)}; {e}") from e
        why = _works(b)
        if why is not None:
            raise BrowserUnavailable(f"{PACKAGE} was unpacked into {PRIVATE} but {why}")
        return b
