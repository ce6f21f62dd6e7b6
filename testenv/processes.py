"""Processes of the local control plane: free ports, starting a process in its own session with its
log, stopping it by PID, and polling with a deadline (docs/development.md#test-tiers).

``testenv.cluster`` starts the control plane with these, ``testenv.system`` our processes, and the
tests and benchmarks their own; nothing here knows what the processes are.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar


class ClusterError(RuntimeError):
    """The control plane failed to start; the message carries the tail of the failing log."""


class PortTaken(ClusterError):
    """A process exited because a port it was given was bound by someone else first.

    :func:`free_port` can only say a port is free *now*; between that and the child's bind another
    process may take it. The start is worth one more try with fresh ports (:func:`retry_port_clash`).
    """


#: Where :func:`free_port` picks from when the kernel's ephemeral range cannot be read.
_DEFAULT_EPHEMERAL = (32768, 60999)
#: The lowest port handed out: below it sit well-known and registered services.
_LOWEST_PORT = 10000
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port that is free right now and that nothing else is likely to take next.

    Asking the kernel for port 0 returns one from its ephemeral range, the same range it draws
    the source port of every outgoing connection from; on a busy test run one of those
    connections can take the port before the child process binds it (etcd then exits with
    "address already in use"). So the port is drawn at random from outside that range, skipping
    ports this process has already handed out, and checked by binding it once.
    """
    low, high = _ephemeral_range()
    pools = [r for r in (range(_LOWEST_PORT, low), range(high + 1, 65536)) if len(r)]
    size = sum(len(r) for r in pools)
    with _handed_out_lock:
        if len(_handed_out) > size // 2:
            _handed_out.clear()  # a very long run: start over rather than run dry
        for _ in range(200 if pools else 0):
            pool = random.choices(pools, weights=[len(r) for r in pools])[0]
            port = random.choice(pool)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no range outside: the kernel's
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_T = TypeVar("_T")


def retry_port_clash(start: Callable[[], _T], *, attempts: int = 3) -> _T:
    """Run ``start`` (which picks its own ports) again while it fails with :class:`PortTaken`."""
    for _ in range(attempts - 1):
        with contextlib.suppress(PortTaken):
            return start()
    return start()


def exited_error(process: Component, what: str) -> ClusterError:
    """The error for ``process`` having exited while waiting for ``what``: :class:`PortTaken` when
    its log (from this start on) says a port was taken, :class:`ClusterError` otherwise."""
    kind = PortTaken if process.port_clash() else ClusterError
    return kind(
        f"{process.name} exited with {process.process.returncode} while waiting for {what}:\n{process.tail()}"
    )


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    process: Component | None = None,
) -> None:
    """Poll ``check`` until it is true or the deadline passes (then raise).

    With ``process``, fail at once (with its log tail) if that process exits while waiting, and
    give its log tail on a timeout too.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and not process.alive():
            raise exited_error(process, what)
        try:
            if check():
                return
        except Exception:  # a failed probe is just "not yet"
            pass
        if time.monotonic() > deadline:
            tail = f":\n{process.tail()}" if process is not None else ""
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")
        time.sleep(interval)


@dataclass
class Component:
    """One running binary: its process handle and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int] = field(default_factory=dict)
    #: where this process's output starts in ``log`` (a retried start appends to the same file)
    log_offset: int = 0

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def port_clash(self) -> bool:
        """Whether this process's own output says it could not bind a port (Go and Python alike
        say "address already in use")."""
        try:
            with self.log.open("rb") as handle:
                handle.seek(self.log_offset)
                own = handle.read().decode(errors="replace")
        except OSError:
            return False
        return "address already in use" in own.lower()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, *, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout)


def spawn(
    name: str,
    argv: list[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = True,
    cwd: Path | None = None,
    ports: dict[str, int] | None = None,
) -> Component:
    """Start ``argv`` with its output appended to ``log``, in a session of its own so that
    :meth:`Component.stop` takes its children down too; ``env`` is added to this process's, or with
    ``inherit_env=False`` is the whole environment (``testenv.confined`` builds its own)."""
    with log.open("ab") as handle:
        offset = handle.seek(0, os.SEEK_END)
        process = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**(os.environ if inherit_env else {}), **(env or {})},
            cwd=str(cwd) if cwd is not None else None,
        )
    return Component(name=name, process=process, log=log, ports=ports or {}, log_offset=offset)


def http_ok(url: str) -> bool:
    """A plain-HTTP probe: True on 200 (raises on connection errors, like any probe)."""
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def https_ok(url: str) -> bool:
    """A TLS probe that trusts any certificate (the components' own, on loopback): True on 200."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:
        return False
