"""The harness's own control plane starts even when a port it picked is taken before etcd or the
kube-apiserver binds it: the failed process is dropped and the step runs again on fresh ports.

Real etcd and kube-apiserver; the "someone else" holding the port is a listening socket here.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv import cluster
from testenv.cluster import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def taken() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", cluster.free_port()))
    sock.listen()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.mark.parametrize("component", ["etcd", "kube-apiserver"])
def test_a_port_taken_before_the_bind_is_retried_on_a_fresh_one(
    component: str, taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # etcd asks for two ports (client, peer), the kube-apiserver for the third.
    call, offered = 0, 0 if component == "etcd" else 2
    real = cluster.free_port

    def first_one_taken() -> int:
        nonlocal call
        call += 1
        return taken if call == offered + 1 else real()

    monkeypatch.setattr(cluster, "free_port", first_one_taken)
    plane = LocalCluster(profile="integration", workdir=tmp_path)
    try:
        plane.start()
        assert [c.name for c in plane.components] == ["etcd", "kube-apiserver"]
        assert all(c.alive() for c in plane.components)
        assert plane.request("GET", "/readyz") == "ok"
        log = (tmp_path / "logs" / f"{component}.log").read_text()
        assert "address already in use" in log.lower()  # the first try did meet the taken port
        if component == "kube-apiserver":
            assert plane.apiserver_port != taken
        else:
            assert f":{taken}" not in plane.etcd_url
    finally:
        plane.stop()
