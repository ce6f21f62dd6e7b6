"""The test harness's port picking: ports outside the kernel's ephemeral range, and one more try
when a child still finds its port taken (testenv.processes.free_port, retry_port_clash).

The children here are real processes binding real sockets; a port is "taken" by a listening
socket this test holds.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv import processes
from testenv.processes import (
    ClusterError,
    Component,
    PortTaken,
    exited_error,
    free_port,
    retry_port_clash,
    spawn,
    wait_until,
)

#: A child that binds 127.0.0.1:<argv[1]>, says so, and listens until it is stopped.
BIND = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])));"
    " s.listen(); print('listening', flush=True); time.sleep(60)"
)


@pytest.fixture
def held() -> Iterator[socket.socket]:
    """A listening socket on a port free_port could hand out."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


def _port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def _child(port: int, log: Path) -> Component:
    return spawn("binder", [sys.executable, "-c", BIND, str(port)], log)


def _says_listening(child: Component) -> bool:
    """From the child's own output: a probe of the port would also reach the held socket."""
    with child.log.open("rb") as handle:
        handle.seek(child.log_offset)
        return b"listening" in handle.read()


def test_ports_come_from_outside_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, high = processes._ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(not low <= p <= high for p in ports), [p for p in ports if low <= p <= high]
    assert all(p >= 10000 for p in ports)


def test_a_port_someone_listens_on_is_skipped(held: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    taken, other = _port(held), free_port()
    processes._handed_out.discard(taken)
    processes._handed_out.discard(other)
    draws = iter([taken, other])
    monkeypatch.setattr(processes.random, "choice", lambda pool: next(draws))
    assert free_port() == other


def test_a_child_that_finds_its_port_taken_raises_port_taken(held: socket.socket, tmp_path: Path) -> None:
    child = _child(_port(held), tmp_path / "binder.log")
    with pytest.raises(PortTaken, match=r"(?i)address already in use"):
        wait_until(lambda: False, timeout=30, what="never", process=child)


def test_a_taken_port_is_retried_with_a_fresh_one(held: socket.socket, tmp_path: Path) -> None:
    log = tmp_path / "binder.log"
    offered = iter([_port(held), free_port()])
    started: list[Component] = []

    def start() -> int:
        port = next(offered)
        child = _child(port, log)
        started.append(child)
        wait_until(lambda: _says_listening(child), timeout=30, what="binder listening", process=child)
        return port

    try:
        port = retry_port_clash(start)
        assert len(started) == 2 and port != _port(held)
        assert started[1].alive() and not started[0].alive()
    finally:
        for child in started:
            child.stop()


def test_other_exits_are_not_retried_and_an_older_clash_in_the_log_does_not_count(
    held: socket.socket, tmp_path: Path
) -> None:
    log = tmp_path / "binder.log"
    first = _child(_port(held), log)  # leaves "address already in use" in the shared log
    first.process.wait(timeout=30)
    assert isinstance(exited_error(first, "x"), PortTaken)
    calls = 0

    def start() -> None:
        nonlocal calls
        calls += 1
        child = spawn("failer", [sys.executable, "-c", "raise SystemExit('bad flag')"], log)
        wait_until(lambda: False, timeout=30, what="never", process=child)

    with pytest.raises(ClusterError) as error:
        retry_port_clash(start)
    assert not isinstance(error.value, PortTaken) and "bad flag" in str(error.value)
    assert calls == 1


def test_retries_give_up_after_the_last_attempt(held: socket.socket, tmp_path: Path) -> None:
    calls = 0

    def start() -> None:
        nonlocal calls
        calls += 1
        child = _child(_port(held), tmp_path / "binder.log")
        wait_until(lambda: False, timeout=30, what="never", process=child)

    with pytest.raises(PortTaken):
        retry_port_clash(start, attempts=2)
    assert calls == 2
