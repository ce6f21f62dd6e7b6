"""The reconciler is killed (SIGKILL) at random moments during a burst and restarted each time.

200 single-pod Jobs over 3 quotas of 4 CPU each arrive at once; pods run a few seconds on kwok nodes,
so the queues drain as jobs finish. The reconciler is SIGKILLed and restarted several times while
that happens. An independent observer follows every QueueUnit version in etcd order and checks:

* every job's unit is admitted exactly once (its admitted replicas go from 0 to 1 once, never again);
* at every observed version, the usage of each quota (the sum of admitted requests) stays within
  its ``max``;
* in the end every job has run to completion.

A restarted reconciler rebuilds its state from a relist (ARCHITECTURE decision 2), so none of this
may depend on what the killed process had in memory.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared import kube as kq
from shared import names
from testenv import system
from testenv.cluster import Component, LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e

JOBS = 200
QUOTAS = ("burst-a", "burst-b", "burst-c")
QUOTA_CPU = 4
NAMESPACE = "burst"
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


def job(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"job-{i:03d}",
            "namespace": NAMESPACE,
            "labels": {names.QUOTA_NAME_LABEL: QUOTAS[i % len(QUOTAS)]},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            },
        },
    }


def admitted(obj: dict[str, Any]) -> int:
    return sum(int(a.get("replicas", 0)) for a in (obj.get("status") or {}).get("admissions") or [])


async def test_sigkilled_reconciler_never_admits_twice_or_overruns_a_quota(
    burst_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster = burst_cluster
    logdir: Path = tmp_path_factory.mktemp("restart-system")
    webhook, _ = system.start_webhook(cluster, logdir=logdir)
    rng = random.Random(20261130)
    reconcilers: list[Component] = [system.start_reconciler(cluster, logdir=logdir, name="reconciler-0")]
    kube.kubectl(cluster, "create", "namespace", NAMESPACE)
    for quota in QUOTAS:
        kube.kubectl(
            cluster,
            "apply",
            "-f",
            "-",
            input_text=json.dumps(
                {
                    "apiVersion": names.QUOTA_API_VERSION,
                    "kind": "ElasticQuota",
                    "metadata": {"name": quota, "namespace": NAMESPACE},
                    "spec": {"max": {"cpu": str(QUOTA_CPU)}, "min": {"cpu": str(QUOTA_CPU)}},
                }
            ),
        )
    try:
        async with kube.Recorder(cluster, UNITS, namespace=NAMESPACE) as recorder:
            async with kube.client(cluster) as api:
                from kubernetes_asyncio import client as k8s

                batch = k8s.BatchV1Api(api)
                await kube.eventually(lambda: _sa_ready(api), what="default ServiceAccount")
                await asyncio.gather(*(batch.create_namespaced_job(NAMESPACE, job(i)) for i in range(JOBS)))

                async def all_done() -> bool:
                    jobs = await batch.list_namespaced_job(NAMESPACE)
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
            seen = list(recorder.seen)
    finally:
        for r in reconcilers:
            r.stop()
        webhook.stop()

    # Replay the observed history in etcd order.
    current: dict[str, dict[str, Any]] = {}
    admissions_of: dict[str, int] = {}
    violations: list[str] = []
    for kind, obj in seen:
        name = obj["metadata"]["name"]
        before = admitted(current[name]) if name in current else 0
        if kind == "DELETED":
            current.pop(name, None)
            continue
        current[name] = obj
        after = admitted(obj)
        if before == 0 and after > 0:
            admissions_of[name] = admissions_of.get(name, 0) + 1
        usage: dict[str, int] = {}
        for unit in current.values():
            quota = unit["metadata"]["labels"][names.QUOTA_NAME_LABEL]
            usage[quota] = usage.get(quota, 0) + admitted(unit)  # 1 CPU per replica
        violations += [f"{q} at {u} CPU after {name}" for q, u in usage.items() if u > QUOTA_CPU]
    assert violations == []
    twice = {n: c for n, c in admissions_of.items() if c != 1}
    assert twice == {}
    assert len(admissions_of) == JOBS
    assert kills == 5


async def _sa_ready(api: Any) -> bool:
    from kubernetes_asyncio import client as k8s

    accounts = await k8s.CoreV1Api(api).list_namespaced_service_account(NAMESPACE)
    return any(a.metadata.name == "default" for a in accounts.items)
