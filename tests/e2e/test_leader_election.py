"""Two reconcilers with leader election: only the leader acts; when it is SIGKILLed the other takes
over within the lease duration, and no unit is admitted twice and no quota is overrun during the
hand-over (checked by replaying every QueueUnit version in etcd order)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from shared import kube as kq
from shared import names
from testenv import system
from testenv.cluster import Component, LocalCluster
from tests import kube
from tests.e2e import burst

pytestmark = pytest.mark.e2e

LEASE_S = 4.0
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
ELECTION = [
    "--leader-elect",
    f"--lease-duration={LEASE_S}",
    "--renew-deadline=3",
    "--retry-period=1.1",
    "--leader-election-namespace=koord-queue",
]


@pytest.fixture(scope="module")
def ha_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        profile="e2e", workdir=tmp_path_factory.mktemp("ha-cp"), nodes=2, pod_duration_s=2.0
    )
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


def holder(cluster: LocalCluster) -> str:
    lease = json.loads(
        cluster.request(
            "GET", "/apis/coordination.k8s.io/v1/namespaces/koord-queue/leases/koord-queue-reconciler"
        )
    )
    return str(lease["spec"].get("holderIdentity", ""))


async def test_the_standby_takes_over_without_double_admission(
    ha_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster = ha_cluster
    logdir = tmp_path_factory.mktemp("ha-system")
    webhook, _ = system.start_webhook(cluster, logdir=logdir)
    replicas: dict[str, Component] = {}
    for name in ("a", "b"):
        replicas[name] = system.start_reconciler(
            cluster,
            logdir=logdir,
            name=f"reconciler-{name}",
            extra_args=[*ELECTION, f"--leader-election-identity={name}"],
        )
    burst.create_quotas(cluster)
    try:
        await kube.eventually(lambda: _async(holder(cluster) in replicas), what="a leader")
        async with kube.Recorder(cluster, UNITS, namespace=burst.NAMESPACE) as recorder:
            async with kube.client(cluster) as api:
                from kubernetes_asyncio import client as k8s

                batch = k8s.BatchV1Api(api)
                await kube.eventually(lambda: burst.service_account_ready(api), what="default ServiceAccount")
                await asyncio.gather(
                    *(batch.create_namespaced_job(burst.NAMESPACE, burst.job(i)) for i in range(60))
                )
                await kube.eventually(
                    lambda: _async(sum(1 for _, o in recorder.seen if burst.admitted(o)) >= 6),
                    what="admissions under the first leader",
                )
                leader = holder(cluster)
                standby = "b" if leader == "a" else "a"
                replicas[leader].process.kill()
                replicas[leader].process.wait()
                killed_at = time.monotonic()
                await kube.eventually(
                    lambda: _async(holder(cluster) == standby),
                    timeout=3 * LEASE_S,
                    interval=0.2,
                    what=f"{standby} holding the lease",
                )
                takeover = time.monotonic() - killed_at

                async def all_done() -> bool:
                    jobs = await batch.list_namespaced_job(burst.NAMESPACE)
                    return sum(1 for j in jobs.items if (j.status.succeeded or 0) >= 1) == 60

                await kube.eventually(all_done, timeout=180, interval=1.0, what="all 60 jobs Succeeded")
            seen = list(recorder.seen)
    finally:
        for r in replicas.values():
            r.stop()
        webhook.stop()
    assert takeover <= LEASE_S + 2.0, f"take-over took {takeover:.1f}s"

    result = burst.replay(seen)
    assert result.violations == []
    assert result.twice == {}
    assert len(result.admissions) == 60


async def _async(value: bool) -> bool:
    return value
