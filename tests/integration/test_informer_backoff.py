"""An informer rides out a kube-apiserver crash on the retry policy it always had
(docs/architecture.md#retries): while the apiserver is away its list and watch back off (equal
jitter, never more than 10 s apart), and once it is back the informer resumes and sees what was
written meanwhile. The test crashes an apiserver of its own, so the session's stays untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from koord_queue.reconciler.informer import Informer
from koord_queue.shared import kube as kq
from koord_queue.shared import retrying
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration

CONFIG_MAPS = kq.Resource("", "v1", "configmaps", "ConfigMap")


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir: Path = tmp_path_factory.mktemp("informer-backoff")
    with LocalCluster(profile="integration", workdir=workdir) as cluster:
        yield cluster


def config_map(name: str) -> kq.Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def test_an_informer_backs_off_while_the_apiserver_is_down_and_resumes_after(
    own_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    waits: list[float] = []
    real_sleep = retrying.sleep

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(seconds)

    monkeypatch.setattr(retrying, "sleep", recorded)
    client = await kq.Kube.connect(kubeconfig=str(own_cluster.kubeconfig))
    writer = await kq.Kube.connect(kubeconfig=str(own_cluster.kubeconfig))
    informer = Informer(client, CONFIG_MAPS, handler=lambda old, new: None, namespace="default")
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), timeout=30)
        await writer.create(CONFIG_MAPS, config_map("before"), namespace="default")

        async def seen(name: str) -> bool:
            return f"default/{name}" in informer.objects

        await kube.eventually(lambda: seen("before"), what="the ConfigMap written before the crash")
        with caplog.at_level(logging.WARNING, logger="koord_queue.reconciler.informer"):
            await asyncio.to_thread(own_cluster.restart_component, "kube-apiserver", kill=True)
            await writer.create(CONFIG_MAPS, config_map("after"), namespace="default")
            await kube.eventually(lambda: seen("after"), timeout=60, what="the ConfigMap written after it")
        assert waits, "the informer never waited: did the crash reach it?"
        assert all(0.2 <= wait <= 10.0 for wait in waits), waits  # 0.4 s at the first failure, x0.5-1
        assert "configmaps list/watch failed" in caplog.text and "retrying in" in caplog.text
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        await writer.close()
