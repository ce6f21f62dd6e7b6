"""Queues from ElasticQuotas (docs/compatibility.md#s31-queue-from-an-elasticquota,
docs/compatibility.md#queues-from-elasticquotas), black box with the reconciler running.

Every ElasticQuota gets a Queue of the same name in ``koord-queue``: priority 1000, the policy of
the label ``koord-queue/queue-policy``, the quota's ``koord-queue/*`` annotations (only those) and
its parent label. Removing the label reverts the policy to Priority; deleting the quota deletes the
Queue; a hand-made Queue survives its quota's deletion. A policy of FIFO or Round is refused by the
webhook; one that gets in anyway (the webhook was not installed yet) makes the reconciler report a
Warning ``AddQueueFail`` on the Queue.
"""

from __future__ import annotations

import contextlib
import urllib.error
from collections.abc import AsyncIterator, Iterator

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import wait_until
from tests import kube
from tests import scenario as s
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

KQ = names.COMPONENT_NAMESPACE


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


async def test_s31_a_quota_creates_a_queue_with_its_policy_annotations_and_parent(sc: Scenario) -> None:
    q, parent = sc.name("team-a"), sc.name("org")
    await sc.create_quota(s.quota(parent, cpu="8"))
    await sc.create_quota(
        s.quota(
            q,
            cpu="4",
            parent=parent,
            policy="Block",
            annotations={
                names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
                "example.com/not-ours": "kept on the quota only",
            },
        )
    )
    queue = await sc.wait_queue(q)
    meta = queue["metadata"]
    assert queue["spec"]["priority"] == 1000
    assert queue["spec"]["queuePolicy"] == "Block"
    assert meta["annotations"].get(names.WAIT_FOR_PODS_RUNNING_ANNOTATION) == "true"
    assert "example.com/not-ours" not in meta["annotations"]
    assert names.QUEUE_POLICY_LABEL not in meta["annotations"]
    assert meta["labels"][names.QUOTA_PARENT_LABEL] == parent

    # Annotations added later follow; an admin's own annotation on the Queue is kept.
    await sc.patch_queue(q, {"metadata": {"annotations": {"admin.example.com/note": "mine"}}})
    await sc.patch_quota(q, {"metadata": {"annotations": {names.MAX_DEPTH_ANNOTATION: "5"}}})
    queue = await sc.wait_queue(
        q,
        lambda got: got["metadata"]["annotations"].get(names.MAX_DEPTH_ANNOTATION) == "5",
        what="max-depth copied",
    )
    assert queue["metadata"]["annotations"]["admin.example.com/note"] == "mine"

    await sc.patch_quota(q, {"metadata": {"labels": {names.QUEUE_POLICY_LABEL: None}}})
    await sc.wait_queue(
        q, lambda got: got["spec"]["queuePolicy"] == "Priority", what="policy reverted to Priority"
    )
    await sc.patch_quota(q, {"metadata": {"labels": {names.QUOTA_PARENT_LABEL: None}}})
    await sc.wait_queue(
        q,
        lambda got: names.QUOTA_PARENT_LABEL not in (got["metadata"].get("labels") or {}),
        what="parent label removed with the quota's",
    )

    await sc.delete_quota(q)

    async def gone() -> bool:
        return await sc.get_queue(q) is None

    await kube.eventually(gone, what=f"Queue {q} deleted with its quota")
    assert await sc.get_queue(parent) is not None


async def test_a_queue_deleted_while_its_quota_exists_comes_back_and_its_units_are_admitted(
    sc: Scenario,
) -> None:
    q = sc.name("phoenix")
    await sc.create_quota(s.quota(q, cpu="2"))
    first = await sc.wait_queue(q)
    await sc.delete_queue(q)
    await sc.create_unit(s.unit("orphan", quota=q))

    again = await sc.wait_queue(
        q, lambda got: got["metadata"]["uid"] != first["metadata"]["uid"], what="re-created"
    )
    assert again["spec"] == first["spec"]
    await sc.wait_phase("orphan", "Dequeued")


async def test_a_hand_made_queue_is_adopted_and_survives_its_quotas_deletion(sc: Scenario) -> None:
    q = sc.name("manual")
    await sc.create_queue(s.queue(q, policy="Priority", annotations={"admin.example.com/owner": "me"}))
    await sc.create_quota(s.quota(q, cpu="2", policy="Block"))
    await sc.wait_queue(q, lambda got: got["spec"]["queuePolicy"] == "Block", what="policy from the quota")
    await sc.create_unit(s.unit("work", quota=q))
    await sc.wait_phase("work", "Dequeued")

    await sc.delete_quota(q)
    # The quota's removal is observed when its unit can no longer be checked against it.
    await sc.create_unit(s.unit("after", quota=q))
    await sc.wait_message("after", "CheckUsage found quota not exist")
    kept = await sc.get_queue(q)
    assert kept is not None and kept["metadata"]["annotations"]["admin.example.com/owner"] == "me"


async def test_freed_parent_quota_goes_to_the_queue_with_the_higher_priority(sc: Scenario) -> None:
    parent, low, high = sc.name("shared"), sc.name("low-queue"), sc.name("high-queue")
    await sc.create_quota(s.quota(parent, cpu="1"))
    # Hand-made Queues keep their spec.priority when their quotas adopt them.
    await sc.create_queue({**s.queue(low), "spec": {"queuePolicy": "Priority", "priority": 10}})
    await sc.create_queue({**s.queue(high), "spec": {"queuePolicy": "Priority", "priority": 2000}})
    await sc.create_quota(s.quota(low, cpu="4", parent=parent))
    await sc.create_quota(s.quota(high, cpu="4", parent=parent))

    await sc.create_unit(s.unit("holder", quota=low, priority=1000))
    await sc.wait_phase("holder", "Dequeued")
    # The unit in the low queue has the higher unit priority and came first; queues still win.
    await sc.create_unit(s.unit("in-low", quota=low, priority=100))
    await sc.wait_message("in-low", f"limited quotaName:{parent}")
    await sc.create_unit(s.unit("in-high", quota=high, priority=0))
    await sc.wait_message("in-high", f"limited quotaName:{parent}")

    await sc.delete_unit("holder")
    await sc.wait_phase("in-high", "Dequeued")
    await sc.assert_waiting("in-low")


# --- unsupported policies -------------------------------------------------------------------------


def _dry_run_quota(cluster: LocalCluster, namespace: str, policy: str) -> bool:
    """Whether the apiserver accepts (dry run) a quota with this policy label."""
    body = s.quota("probe", cpu="1", policy=policy)
    path = f"/apis/{names.QUOTA_API_VERSION}/namespaces/{namespace}/{names.QUOTA_PLURAL}?dryRun=All"
    try:
        cluster.request("POST", path, body)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code in (400, 403, 422):
            return False
        raise
    return True


@contextlib.contextmanager
def webhook_unregistered(
    cluster: LocalCluster, processes: system.Processes, namespace: str
) -> Iterator[None]:
    """Take the webhook configurations away (as before the webhook is installed), then restore."""
    system.unregister_webhook(cluster)
    try:
        wait_until(lambda: _dry_run_quota(cluster, namespace, "FIFO"), timeout=30, what="webhook gone")
        yield
    finally:
        system.register_webhook(cluster, port=processes.webhook_port)
        wait_until(lambda: not _dry_run_quota(cluster, namespace, "FIFO"), timeout=30, what="webhook back")


async def test_s31_fifo_and_round_are_refused_or_reported_with_add_queue_fail(
    sc: Scenario, integration_cluster: LocalCluster, system_integration: system.Processes
) -> None:
    for policy in ("FIFO", "Round"):
        assert not _dry_run_quota(integration_cluster, sc.ns, policy), f"the webhook refuses {policy}"

    fifo, round_, manual = sc.name("fifo"), sc.name("round"), sc.name("manual-round")
    with webhook_unregistered(integration_cluster, system_integration, sc.ns):
        await sc.create_quota(s.quota(fifo, policy="FIFO"), wait_queue=False)
        await sc.create_quota(s.quota(round_, policy="Round"), wait_queue=False)
        await sc.create_queue(s.queue(manual, policy="Round"))

    for q, policy in ((fifo, "FIFO"), (round_, "Round")):
        queue = await sc.wait_queue(q)
        event = await sc.wait_event(
            q, names.EventReason.ADD_QUEUE_FAIL, type_="Warning", namespace=KQ, kind="Queue"
        )
        assert policy in event.message, event.message
        # Deliberate difference from upstream: the Queue still works, with Priority.
        assert queue["spec"]["queuePolicy"] == "Priority"
    await sc.create_unit(s.unit("served", quota=fifo))
    await sc.wait_phase("served", "Dequeued")

    event = await sc.wait_event(
        manual, names.EventReason.ADD_QUEUE_FAIL, type_="Warning", namespace=KQ, kind="Queue"
    )
    assert "unsupported strategy" in event.message
