#!/usr/bin/env python3
"""``kubectl koord-queue`` as krew installs it (docs/operations.md#the-kubectl-plugin).

The plugin is Python, so the krew archive carries the package's wheel and this launcher, twice:
as ``kubectl-koord_queue`` and as its completion hook ``kubectl_complete-koord_queue``. On first use
it makes a private virtual environment beside itself with the python3 it runs under and installs
the wheel there without extras: the plugin's own dependencies only, never the servers'
(cryptography, prometheus-client, tenacity). Later runs go straight to it. Only the standard
library is used here, since nothing else is installed yet when it first runs.

The environment is built under a temporary name and renamed into place, so two first uses at once
(a command and a completion) never see half an environment; the loser of the rename uses the
winner's. Its interpreter finds its packages from its own location, so the rename is safe; the
console scripts pip writes would not be (their first line names the temporary path), which is why
the entry points are called through that interpreter instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: what this file is installed as -> the entry point it runs (pyproject.toml [project.scripts])
ENTRY_POINTS = {
    "kubectl-koord_queue": "entry",
    "kubectl_complete-koord_queue": "complete_entry",
}
MINIMUM_PYTHON = (3, 11)
ENVIRONMENT = "venv"


def fail(message: str) -> int:
    sys.stderr.write(f"kubectl-koord_queue: {message}\n")
    return 1


def interpreter(environment: Path) -> Path:
    return environment / "bin" / "python"


def install(here: Path) -> Path:
    """The private environment, made and filled on first use; raises on any failure."""
    environment = here / ENVIRONMENT
    if interpreter(environment).exists():
        return environment
    wheels = sorted(here.glob("koord_queue_py-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(
            f"expected one koord_queue_py wheel beside the launcher in {here}, found {len(wheels)}"
        )
    sys.stderr.write(f"kubectl-koord_queue: first use: installing {wheels[0].name} into {environment}\n")
    staging = Path(tempfile.mkdtemp(prefix=f".{ENVIRONMENT}-", dir=here))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True, stdout=sys.stderr)
        pip = [str(interpreter(staging)), "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
        subprocess.run([*pip, str(wheels[0])], check=True, stdout=sys.stderr)
        try:
            staging.rename(environment)
        except OSError:
            if not interpreter(environment).exists():
                raise  # not a lost race: something else is in the way
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return environment


def main() -> int:
    name = Path(__file__).name  # krew's link in ~/.krew/bin keeps the name
    if name not in ENTRY_POINTS:
        return fail(f"installed under an unknown name {name!r}; expected one of {sorted(ENTRY_POINTS)}")
    if sys.version_info < MINIMUM_PYTHON:
        wanted = ".".join(map(str, MINIMUM_PYTHON))
        return fail(f"needs python3 {wanted} or newer on PATH, found {sys.version.split()[0]}")
    try:
        environment = install(Path(__file__).resolve().parent)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
        return fail(f"could not install the plugin: {err}")
    call = (
        f"import sys; sys.argv[0] = {name!r}; "
        f"from koord_queue.cli.main import {ENTRY_POINTS[name]} as run; run()"
    )
    # -I: neither PYTHONPATH, the user's site-packages nor the working directory can shadow the plugin
    python = str(interpreter(environment))
    os.execv(python, [python, "-I", "-c", call, *sys.argv[1:]])
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
