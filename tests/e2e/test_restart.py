"""The reconciler is killed (SIGKILL) at random moments during a burst and restarted each time.

200 single-pod Jobs over 3 quotas of 4 CPU each arrive at once; pods run a few seconds on kwok nodes,
so the queues drain as jobs finish. The reconciler is SIGKILLed and restarted several times while
that happens. An independent observer follows every QueueUnit version in etcd order and checks:

* every job's unit is admitted exactly once (its admitted replicas go from 0 to 1 once, never again);
* at every observed version, the usage of each quota (the sum of admitted requests) stays within
  its ``max``;
* in the end every job has run to completion.

A restarted reconciler rebuilds its state from a relist
(docs/architecture.md#decision-2-the-cluster-is-the-source-of-truth), so none of this may depend on what
the killed process had in memory.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import Component
from tests import kube
from tests.e2e import burst

pytestmark = pytest.mark.e2e

JOBS = 200
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


@pytest.fixture(scope="module")
def burst_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        profile="e2e", workdir=tmp_path_factory.mktemp("restart-cp"), nodes=2, pod_duration_s=2.0
    )
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


async def test_sigkilled_reconciler_never_admits_twice_or_overruns_a_quota(
    burst_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster = burst_cluster
    logdir: Path = tmp_path_factory.mktemp("restart-system")
    webhook, _ = system.start_webhook(cluster, logdir=logdir)
    rng = random.Random(20261130)
    reconcilers: list[Component] = [system.start_reconciler(cluster, logdir=logdir, name="reconciler-0")]
    burst.create_quotas(cluster)
    try:
        async with kube.Recorder(cluster, UNITS, namespace=burst.NAMESPACE) as recorder:
            async with kube.client(cluster) as api:
                from kubernetes_asyncio import client as k8s

                batch = k8s.BatchV1Api(api)
                await kube.eventually(lambda: burst.service_account_ready(api), what="default ServiceAccount")
                await asyncio.gather(
                    *(batch.create_namespaced_job(burst.NAMESPACE, burst.job(i)) for i in range(JOBS))
                )

                async def all_done() -> bool:
                    jobs = await batch.list_namespaced_job(burst.NAMESPACE)
                    return sum(1 for j in jobs.items if (j.status.succeeded or 0) >= 1) == JOBS

                kills = 0
                for _ in range(5):
                    await asyncio.sleep(rng.uniform(2.0, 6.0))  # a random moment mid-burst, not a sync
                    victim = reconcilers[-1]
                    victim.process.kill()
                    victim.process.wait()
                    kills += 1
                    reconcilers.append(
                        system.start_reconciler(cluster, logdir=logdir, name=f"reconciler-{kills}")
                    )
                await kube.eventually(all_done, timeout=240, interval=1.0, what=f"all {JOBS} jobs Succeeded")
                # The jobs were polled, not the record: let it catch up before it is read.
                await recorder.sync()
            seen = list(recorder.seen)
    finally:
        for r in reconcilers:
            r.stop()
        webhook.stop()

    result = burst.replay(seen)
    assert result.violations == []
    assert result.twice == {}
    assert len(result.admissions) == JOBS
    assert kills == 5
