"""Two reconcilers with leader election: only the leader acts; when it is SIGKILLed the other takes
over within the lease duration, and no unit is admitted twice and no quota is overrun during the
hand-over (checked by replaying every QueueUnit version in etcd order)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import Component
from tests import kube
from tests.e2e import burst

pytestmark = pytest.mark.e2e

#: A pod set as small as the QueueUnit schema allows.
POD_SET = [
    {"name": "main", "count": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
]

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
        profile="e2e",
        workdir=tmp_path_factory.mktemp("ha-cp"),
        nodes=2,
        pod_duration_s=2.0,
        audit_writes=True,
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
                # The jobs were polled, not the record: let it catch up before it is read.
                await recorder.sync()
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


QUIET_NS = "ha-quiet"


def writes(cluster: LocalCluster, identity: str) -> list[str]:
    """Every write one replica made, from the apiserver's audit log (the API's own record, not the
    replica's tally): ``verb resource/subresource namespace/name`` each."""
    found = []
    for event in cluster.audited_writes(f"koord-queue-reconciler/{identity}"):
        ref = event.get("objectRef") or {}
        what = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
        found.append(f"{event['verb']} {what} {ref.get('namespace', '')}/{ref.get('name', '')}")
    return found


def quiet_job(name: str, quota: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": QUIET_NS, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            }
        },
    }


async def test_the_follower_writes_nothing_and_replays_no_event_on_takeover(
    ha_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """While one replica leads, the other only watches: its own request counter shows no POST, PUT,
    PATCH or DELETE although it sees everything the leader handles (an unlabelled unit whose
    reason the leader writes, a Queue with an unsupported policy that gets a Warning event, jobs
    admitted, parked and finished). When it takes over it acts, but replays nothing it saw while
    following: the Queue still has exactly one ``AddQueueFail`` event, and every event the new
    leader emits is about work that happened after the hand-over."""
    cluster = ha_cluster
    logdir = tmp_path_factory.mktemp("ha-quiet")
    webhook, webhook_port = system.start_webhook(cluster, logdir=logdir)
    replicas: dict[str, Component] = {}
    for name in ("c", "d"):
        replicas[name] = system.start_reconciler(
            cluster,
            logdir=logdir,
            name=f"reconciler-{name}",
            extra_args=[*ELECTION, f"--leader-election-identity={name}"],
        )
    quota, broken = "ha-quiet", "ha-quiet-broken"
    problems: list[str] = []
    kube.kubectl(cluster, "create", "namespace", QUIET_NS)
    kube.apply_quota(cluster, quota, QUIET_NS, cpu="1")
    try:
        await kube.eventually(
            lambda: _async(holder(cluster) in replicas), timeout=3 * LEASE_S, what="a leader"
        )
        leader = holder(cluster)
        follower = "d" if leader == "c" else "c"
        async with kube.client(cluster) as api:
            from kubernetes_asyncio import client as k8s

            objects, batch = k8s.CustomObjectsApi(api), k8s.BatchV1Api(api)
            core = k8s.CoreV1Api(api)
            await kube.eventually(lambda: _sa_ready(core), what="default ServiceAccount")
            await objects.create_namespaced_custom_object(
                names.GROUP,
                names.VERSION,
                QUIET_NS,
                names.QUEUEUNIT_PLURAL,
                {
                    "apiVersion": names.API_VERSION,
                    "kind": "QueueUnit",
                    "metadata": {"name": "unlabelled"},
                    "spec": {
                        "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": "x"},
                        "resource": {"cpu": "1"},
                        "podSet": POD_SET,
                    },
                },
            )

            async def create_broken_queue() -> bool:
                try:
                    await objects.create_namespaced_custom_object(
                        names.GROUP,
                        names.VERSION,
                        names.COMPONENT_NAMESPACE,
                        names.QUEUE_PLURAL,
                        {
                            "apiVersion": names.API_VERSION,
                            "kind": "Queue",
                            "metadata": {"name": broken},
                            "spec": {"queuePolicy": "NoSuchPolicy"},
                        },
                    )
                except k8s.ApiException:
                    return False  # refused by the webhook until the apiserver drops it
                return True

            # The webhook refuses the policy: let it in while the webhook is away, as an install
            # that predates the webhook would.
            system.unregister_webhook(cluster)
            await kube.eventually(create_broken_queue, what="a Queue with an unsupported policy")
            system.register_webhook(cluster, port=webhook_port)
            for i in range(3):  # one CPU of quota: they run one after the other, the rest parked
                await batch.create_namespaced_job(QUIET_NS, quiet_job(f"before-{i}", quota))

            async def unit_message() -> bool:
                unit = await kube.get_custom(
                    api, names.GROUP, names.VERSION, QUIET_NS, names.QUEUEUNIT_PLURAL, "unlabelled"
                )
                return (unit.get("status") or {}).get("message") == names.Message.NO_QUOTA_LABEL

            async def succeeded(prefix: str, count: int) -> bool:
                jobs = await batch.list_namespaced_job(QUIET_NS)
                done = [j for j in jobs.items if j.metadata.name.startswith(prefix) and j.status.succeeded]
                return len(done) == count

            async def queue_events() -> list[Any]:
                found = await core.list_namespaced_event(
                    names.COMPONENT_NAMESPACE, field_selector=f"involvedObject.name={broken}"
                )
                return [e for e in found.items if e.reason == names.EventReason.ADD_QUEUE_FAIL]

            await kube.eventually(unit_message, what="the unlabelled unit's reason written")
            await kube.eventually(queue_events, what="AddQueueFail on the broken Queue")
            await kube.eventually(
                lambda: succeeded("before-", 3), timeout=90, interval=0.5, what="3 jobs Succeeded"
            )
            led = writes(cluster, leader)
            followed = writes(cluster, follower)
            if not led:
                problems.append(f"the leader {leader} wrote nothing")
            if followed:
                problems.append(f"the follower {follower} wrote while following: {followed}")

            killed_at = datetime.now(UTC)  # from here on only the new leader can emit events
            replicas[leader].process.kill()
            replicas[leader].process.wait()
            await kube.eventually(
                lambda: _async(holder(cluster) == follower),
                timeout=3 * LEASE_S,
                interval=0.2,
                what=f"{follower} holding the lease",
            )
            await batch.create_namespaced_job(QUIET_NS, quiet_job("after-0", quota))
            await kube.eventually(
                lambda: succeeded("after-", 1), timeout=60, interval=0.5, what="a job after the take-over"
            )
            if len(writes(cluster, follower)) == len(followed):
                problems.append(f"the new leader {follower} did not act")
            # Leftovers queued while following would have been written the moment the new leader
            # started its event writers, well before a job it admitted could run and succeed.
            replayed = [
                f"{e.reason} x{e.count} at {e.event_time or e.first_timestamp}" for e in await queue_events()
            ]
            if len(replayed) != 1:
                problems.append(f"the broken Queue's AddQueueFail events: {replayed}")
            late: list[str] = []
            for ns in (QUIET_NS, names.COMPONENT_NAMESPACE):
                for e in (await core.list_namespaced_event(ns)).items:
                    if e.reporting_component != names.CONTROLLER_AGENT:
                        continue
                    if (e.event_time or e.first_timestamp) < killed_at:
                        continue
                    if not e.involved_object.name.startswith("after-"):
                        late.append(f"{e.reason} on {e.involved_object.kind} {e.involved_object.name}")
            if late:
                problems.append(f"events after the take-over about earlier work: {late}")
    finally:
        for r in replicas.values():
            r.stop()
        webhook.stop()
        kube.kubectl(cluster, "delete", "namespace", QUIET_NS, "--wait=false", check=False)
        kube.kubectl(
            cluster, "delete", "queue", "-n", names.COMPONENT_NAMESPACE, broken, "--wait=false", check=False
        )
    assert problems == [], "\n".join(problems)


async def _sa_ready(core: Any) -> bool:
    accounts = await core.list_namespaced_service_account(QUIET_NS)
    return any(a.metadata.name == "default" for a in accounts.items)
