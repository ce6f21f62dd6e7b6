"""Start a process under the container image's runtime constraints, without a container runtime
(docs/development.md#runtime-constraints).

The image (``Dockerfile``) runs as an unprivileged user (uid and gid 65532) and the manifests'
securityContext adds a read-only root filesystem, no capabilities and no privilege escalation; a
pod reads only the files its volumes mount. CI has no Docker, so nothing would prove that the
webhook and the reconciler start and work like that. The e2e suite therefore starts both through
:func:`spawn`, which builds the same constraints from Linux primitives:

1. ``unshare --mount --propagation private`` gives the process a mount table of its own, so what
   follows changes nothing for anyone else.
2. A short stage (:func:`_stage`, still root, inside that namespace) covers every directory the
   image user could not pass through on the way to a file it needs (``/root`` holding a pyenv
   interpreter, pytest's private temporary directories) with an empty tmpfs, into which exactly
   those files are bind-mounted: the interpreter as the image holds it, the certificates and
   kubeconfig as a pod's volumes. Then one recursive ``mount_setattr(2)`` makes every mount
   read-only (the root, ``/tmp``, ``/dev/shm``, ``/proc``, the work tree, everything), and the stage
   checks ``/proc/self/mountinfo`` agrees before it goes on.
3. ``setpriv`` takes the image's uid and gid with no supplementary groups, clears the inheritable
   and bounding capability sets, sets no_new_privs and executes the command.

Every step replaces itself (exec), so the pid ``Popen`` returns is the command's own and
:meth:`testenv.processes.Component.stop` still stops it by its process group. The log file is
opened by the caller before any of this, so output still reaches it.

The environment is built, not inherited: ``PATH``, ``LANG`` and the Python flags the image sets
(``PYTHONDONTWRITEBYTECODE``, ``PYTHONUNBUFFERED``), plus what the caller adds; no ``HOME`` and no
``TMPDIR`` (stricter than the image, whose ``HOME=/tmp`` is an emptyDir in the manifests: nothing
may depend on a writable directory). The working directory is ``/`` and stdin is ``/dev/null``.

Files the process is given (every absolute path among its arguments, or the directory of one that
does not exist yet, plus ``mounts``) are handled
as the kubelet handles a pod's volumes with ``fsGroup``: one the image user cannot read gets the
image's group and group read permission, so a key written 0600 by root becomes readable by the
process and by no one else (:func:`grant_group`). A directory is handed over as it is.

When: :func:`requested` reads ``KOORD_QUEUE_CONFINED``. ``1`` confines (the e2e suite sets it,
``tests/e2e/conftest.py``), unset or ``0`` does not (``make run``, the integration tier,
benchmarks). Confining needs root, ``unshare``, ``setpriv`` and mount namespaces; when asked for
and impossible, :func:`spawn` raises :class:`~testenv.processes.ClusterError` naming the cause and
never falls back to an unconfined start.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testenv import processes
from testenv.processes import ClusterError, Component

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
#: ``1`` confines the processes ``testenv.system`` starts, ``0`` or unset does not.
ENV = "KOORD_QUEUE_CONFINED"
#: What the launched process's environment always holds (the image's ENV and its base's LANG).
BASE_ENV = {"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
#: Variables that would point the process at a writable directory it must not need.
FORBIDDEN_ENV = ("HOME", "TMPDIR", "TEMP", "TMP", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME")
#: The stage's exit status when the namespace could not be set up (its message is in the log).
STAGE_FAILED = 70


def requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``KOORD_QUEUE_CONFINED`` asks for confinement (``1``); anything but 0/1 is an error."""
    value = environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ClusterError(f"{ENV}={value!r}: use 1 (confine the processes) or 0 (do not)")
    return value == "1"


def parse_image_user(dockerfile: str) -> tuple[int, int]:
    """The numeric ``uid:gid`` of the Dockerfile's last ``USER`` instruction (the final stage's)."""
    users = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, flags=re.MULTILINE)
    if not users:
        raise ClusterError("the Dockerfile has no numeric `USER uid:gid` instruction")
    uid, gid = users[-1]
    return int(uid), int(gid)


@functools.cache
def image_user() -> tuple[int, int]:
    """The uid and gid the image runs as, read from the Dockerfile so the two cannot drift."""
    return parse_image_user(DOCKERFILE.read_text())


# --- the plan: which paths need a tmpfs cover and a bind mount (pure) ------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """Mounts the stage makes before everything turns read-only.

    ``covers`` are the outermost directories the image user cannot pass through on the way to an
    exposed path; each gets an empty tmpfs. ``binds`` are the exposed paths below a cover (path,
    is a directory), bind-mounted back at their own place inside it.
    """

    covers: tuple[str, ...] = ()
    binds: tuple[tuple[str, bool], ...] = ()

    def to_json(self) -> str:
        return json.dumps({"covers": list(self.covers), "binds": [list(b) for b in self.binds]})

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw = json.loads(text)
        return cls(covers=tuple(raw["covers"]), binds=tuple((str(p), bool(d)) for p, d in raw["binds"]))


def plan_mounts(
    paths: Iterable[Path], *, traversable: Callable[[Path], bool], is_dir: Callable[[Path], bool]
) -> Plan:
    """The covers and binds that make every one of ``paths`` (absolute, resolved) reachable.

    A path whose ancestors the user can all pass through needs nothing. Otherwise its outermost
    blocked ancestor is covered (the outermost from the root is the same for every path below it, so
    covers never nest) and the path is bound, unless a bound directory already holds it.
    """
    covers: list[Path] = []
    bound: dict[Path, bool] = {}
    for path in sorted(set(paths)):
        blocked = next((a for a in reversed(path.parents) if not traversable(a)), None)
        if blocked is None:
            continue
        if blocked not in covers:
            covers.append(blocked)
        bound[path] = is_dir(path)
    binds = [
        (str(p), d)
        for p, d in bound.items()
        if not any(q != p and bound[q] and p.is_relative_to(q) for q in bound)
    ]
    return Plan(covers=tuple(str(c) for c in covers), binds=tuple(binds))


def argument_paths(args: Sequence[str]) -> list[Path]:
    """What the absolute paths among ``args`` (``/path`` or ``--flag=/path``) ask to be mounted:
    the path when it exists, else its directory when that exists (a file that appears later, as
    the kubelet projects a ConfigMap's key into a volume the pod mounted at start)."""
    found: list[Path] = []
    for arg in args:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value.startswith("/"):
            continue
        path = Path(value)
        if path.exists():
            found.append(path)
        elif path.parent.is_dir():
            found.append(path.parent)
    return found


def environment(extra: Mapping[str, str] | None, *, prefix: str = sys.prefix) -> dict[str, str]:
    """The confined process's whole environment: :data:`BASE_ENV`, a ``PATH`` with the virtual
    environment first (as the image's ``/opt/venv/bin``), and ``extra``."""
    env = {"PATH": f"{Path(prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin", **BASE_ENV, **(extra or {})}
    if given := sorted(set(FORBIDDEN_ENV) & env.keys()):
        raise ClusterError(f"a confined process gets no {', '.join(given)} (the image has no writable home)")
    return env


def _can_traverse(uid: int, gid: int) -> Callable[[Path], bool]:
    def check(directory: Path) -> bool:
        st = directory.stat()
        if st.st_uid == uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == gid:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    return check


# --- the environment: can this machine confine at all? --------------------------------------------


@functools.cache
def tools() -> tuple[str, str]:
    """The paths of ``unshare`` and ``setpriv`` once a mount namespace was seen to work; raises
    :class:`ClusterError` naming what is missing otherwise (checked once per process)."""
    hint = f"(the e2e suite runs the webhook and the reconciler confined; {ENV}=0 runs them unconfined)"
    if not sys.platform.startswith("linux"):
        raise ClusterError(f"confining a process needs Linux, not {sys.platform} {hint}")
    missing = [name for name in ("unshare", "setpriv") if shutil.which(name) is None]
    if missing:
        raise ClusterError(f"confining a process needs {' and '.join(missing)} (util-linux) on PATH {hint}")
    if os.geteuid() != 0:
        raise ClusterError(
            f"confining a process needs root (mount namespaces and switching to the image's user), "
            f"but this runs as uid {os.geteuid()} {hint}"
        )
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    assert unshare is not None and setpriv is not None
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        raise ClusterError(f"mount namespaces are not permitted here: {probe.stderr.strip()} {hint}")
    return unshare, setpriv


def _readable(path: Path, uid: int, gid: int) -> bool:
    st = path.stat()
    need = 0o5 if stat.S_ISDIR(st.st_mode) else 0o4  # a directory must be listable and passable
    bits = st.st_mode >> 6 if st.st_uid == uid else st.st_mode >> 3 if st.st_gid == gid else st.st_mode
    return bits & need == need


def grant_group(paths: Iterable[Path], uid: int, gid: int, *, within: Sequence[Path]) -> None:
    """Give the image's group read access to each of ``paths`` it cannot read yet, as the kubelet
    applies ``fsGroup`` to a pod's volume (a key written 0600 by root becomes 0640, group
    65532). Only the given paths, never what a directory holds; and only below ``within`` (the
    temporary and log directories the harness writes its files to): any other path the image user
    cannot read is an error, so no system file's ownership is ever changed."""
    for path in paths:
        resolved = path.resolve()
        if _readable(resolved, uid, gid):
            continue
        if not any(resolved.is_relative_to(root) for root in within):
            raise ClusterError(
                f"{resolved} is not readable by the image user (uid {uid}) and lies outside "
                f"{', '.join(map(str, within))}, where the harness may hand files over"
            )
        st = resolved.stat()
        os.chown(resolved, -1, gid)
        extra = stat.S_IRGRP | (stat.S_IXGRP if stat.S_ISDIR(st.st_mode) else 0)
        os.chmod(resolved, stat.S_IMODE(st.st_mode) | extra)


def image_paths() -> list[Path]:
    """What the image holds: the interpreter's installation, the virtual environment, the source."""
    return sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), PROJECT_ROOT})


def command(argv: Sequence[str], *, files: Sequence[Path] = ()) -> list[str]:
    """The full command line that runs ``argv`` confined, with ``files`` made reachable."""
    unshare, setpriv = tools()
    uid, gid = image_user()
    image = image_paths()
    plan = plan_mounts(
        [*image, *(f.resolve() for f in files)], traversable=_can_traverse(uid, gid), is_dir=Path.is_dir
    )
    stage = (
        f"import sys; sys.path.insert(0, {str(PROJECT_ROOT)!r}); "
        "from testenv.confined import _stage; _stage()"
    )
    return [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "--",
        sys.executable,
        "-I",
        "-B",
        "-c",
        stage,
        plan.to_json(),
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        *argv,
    ]


def spawn(
    name: str,
    argv: list[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    mounts: Sequence[Path] = (),
    ports: dict[str, int] | None = None,
) -> Component:
    """Start ``argv`` confined (module docstring), its output appended to ``log``.

    ``mounts`` are files or directories it reads besides the absolute paths in its arguments.
    Raises :class:`ClusterError` when this machine cannot confine a process.
    """
    uid, gid = image_user()
    files = [*mounts, *argument_paths(argv[1:])]
    grant_group(files, uid, gid, within=[Path(tempfile.gettempdir()).resolve(), log.parent.resolve()])
    return processes.spawn(
        name,
        command(argv, files=files),
        log,
        env=environment(env),
        inherit_env=False,
        cwd=Path("/"),
        ports=ports,
    )


# --- the stage: runs as root inside the new mount namespace, then executes setpriv ---------------

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 0x2, 0x4, 0x1000, 0x4000
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture since Linux 5.12
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def writable_mounts(mountinfo: str) -> list[str]:
    """The mount points of ``/proc/<pid>/mountinfo`` whose per-mount options are not read-only."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 5 and "ro" not in fields[5].split(","):
            found.append(fields[4].encode().decode("unicode_escape"))
    return found


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _stage() -> None:
    """``sys.argv[1]`` is the :class:`Plan`, the rest the command (setpriv ...) to execute."""
    try:
        plan, cmd = Plan.from_json(sys.argv[1]), sys.argv[2:]
        libc = ctypes.CDLL(None, use_errno=True)
        # Hold every bind source before a cover hides it; bind it from /proc/self/fd afterwards.
        sources = [(path, directory, os.open(path, os.O_PATH)) for path, directory in plan.binds]
        for cover in plan.covers:
            _check(
                libc.mount(b"tmpfs", cover.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k"),
                f"tmpfs on {cover}",
            )
        for path, directory, fd in sources:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if directory:
                target.mkdir(exist_ok=True)
            else:
                target.touch(exist_ok=True)
            source = f"/proc/self/fd/{fd}".encode()
            _check(libc.mount(source, path.encode(), None, _MS_BIND | _MS_REC, None), f"bind {path}")
            os.close(fd)
        attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY)
        _check(
            libc.syscall(
                _SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
            ),
            "mount_setattr(/, AT_RECURSIVE, MOUNT_ATTR_RDONLY) (needs Linux 5.12)",
        )
        if writable := writable_mounts(Path("/proc/self/mountinfo").read_text()):
            raise OSError(f"mounts still writable: {', '.join(writable)}")
    except OSError as err:
        print(f"confined: cannot set up the mount namespace: {err}", file=sys.stderr, flush=True)
        sys.exit(STAGE_FAILED)
    os.execv(cmd[0], cmd)
