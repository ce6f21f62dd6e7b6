"""The headless Chromium the dashboard's browser tests drive (tests/e2e/test_dashboard.py).

Playwright (a dev dependency) drives it, but never downloads a browser of its own: it is given
the executable of Debian's ``chromium`` package. :func:`chromium` finds it; on a fresh machine
where it is missing, ``python -m testenv.browser`` (run by ``make e2e``) installs the package when
it can (root, with apt-get) and otherwise stops with the command to run (docs/development.md and
README, prerequisites).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

#: An explicit executable wins over any found one.
ENV: Final = "KOORD_QUEUE_CHROMIUM"
#: Debian's binary behind its /usr/bin/chromium wrapper script, then the usual names on PATH.
CANDIDATES: Final = ("/usr/lib/chromium/chromium",)
NAMES: Final = ("chromium", "chromium-browser")
INSTALL: Final = "apt-get install -y chromium"


class BrowserMissing(RuntimeError):
    pass


def find() -> Path | None:
    """The Chromium executable, or None."""
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit) if os.access(explicit, os.X_OK) else None
    for candidate in CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def chromium() -> Path:
    """The Chromium executable; :class:`BrowserMissing` with the command that installs it."""
    found = find()
    if found is None:
        where = f"{ENV}={os.environ[ENV]} is not an executable; " if os.environ.get(ENV) else ""
        raise BrowserMissing(
            f"{where}the dashboard's browser tests need Chromium: install Debian's package as root "
            f"({INSTALL}), or set {ENV} to a Chromium executable"
        )
    return found


def ensure() -> Path:
    """:func:`chromium`, installing Debian's package first when it is missing and this process may
    (root, apt-get on PATH)."""
    found = find()
    if found is not None:
        return found
    if os.environ.get(ENV) or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return chromium()  # raises, naming the command
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
    return chromium()


def main() -> int:
    try:
        print(f"chromium: {ensure()}")
    except (BrowserMissing, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
