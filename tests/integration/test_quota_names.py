"""Quota names are unique across the cluster, on the real kube-apiserver
(docs/compatibility.md#same-named-quotas).

Only cluster admins create ElasticQuotas (manifests/rbac/user-roles.yaml gives namespace users
read access), so a duplicate name is an admin's mistake, or a second admin's, never a tenant's
attack; what is proven here is that the team holding the name keeps being served:

* a second quota of a name another namespace's quota holds is refused at the door (the quota-name
  admission policy over the holder the reconciler publishes), and a namespace user cannot create
  one at all;
* a duplicate made in the same second as the original, in a namespace that sorts first (which used
  to win the tie), gets past the door but not the reconciler: the team's jobs, submitted with
  kubectl as a namespace user would, pass the door and are admitted; the Queue and the door's
  ConfigMap name the team's namespace as the holder; the duplicate gets a Warning
  ``DuplicateQuotaName`` and the annotation ``koord-queue/ignored-reason`` naming the holder, and
  serves nobody.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.integration.test_tenant_quotas import ALICE, World, bare_unit, job

pytestmark = pytest.mark.integration


@pytest.fixture
async def w(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[World]:
    tenancy.grant(integration_cluster, namespace_in, ALICE)
    async with kube.client(integration_cluster) as api:
        it = World(api, integration_cluster, namespace_in)
        try:
            yield it
        finally:
            await it.cleanup()


async def early_namespace(w: World) -> str:
    """A namespace whose name sorts before the test's own (``t-…``)."""
    name = f"a-{uuid.uuid4().hex[:8]}"
    await kube.create_namespace(w.api, name)
    w.namespaces.append(name)
    return name


async def holder_on_queue(w: World, name: str) -> str | None:
    queue = await kube.get_custom(
        w.api, names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, name
    )
    return (queue["metadata"].get("annotations") or {}).get(names.QUOTA_HOLDER_ANNOTATION)


async def created_in_one_second(w: World, original_ns: str, duplicate_ns: str) -> str:
    """Create a quota in ``original_ns`` and at once one of the same name in ``duplicate_ns``, both
    stamped with the same second (tried again under a new name when the second ticked between)."""
    for attempt in range(5):
        name = w.name(f"shared-{attempt}")
        first = await w.create_quota(original_ns, name, cpu="2")
        second = await w.create_quota(duplicate_ns, name, cpu="100")
        if first["metadata"]["creationTimestamp"] == second["metadata"]["creationTimestamp"]:
            return name
        await w.delete_quota(duplicate_ns, name)
        await w.delete_quota(original_ns, name)
    raise AssertionError("could not create two quotas within one second")


async def test_a_duplicate_made_in_the_same_second_elsewhere_never_locks_the_team_out(w: World) -> None:
    duplicate_ns = await early_namespace(w)
    shared = await created_in_one_second(w, w.mine, duplicate_ns)

    # The team's jobs pass the door and are admitted, as a new user would try them.
    await w.accepted(job("probe", shared))
    assert w.alice_creates(job("work", shared)).returncode == 0
    await w.wait_admitted(w.mine, "work")
    assert await holder_on_queue(w, shared) == w.mine

    async def door_knows() -> bool:
        data = await w.bindings()
        assert data.get(names.QUOTA_BINDING_HOLDER_PREFIX + shared) == w.mine, data
        assert data.get(f"q.{shared}") == f" {w.mine} ", data
        return True

    await kube.eventually(door_knows, what="the door's ConfigMap names the team's quota")

    # The duplicate is told which quota holds the name, and serves nobody.
    reason = names.duplicate_quota_message(duplicate_ns, shared, w.mine)
    event = await w.wait_event(duplicate_ns, shared, names.DUPLICATE_QUOTA_NAME_REASON)
    assert event.message == reason and event.involved_object.kind == "ElasticQuota"

    async def annotated() -> bool:
        got = await w.get_quota(duplicate_ns, shared)
        return (got["metadata"].get("annotations") or {}).get(names.IGNORED_REASON_ANNOTATION) == reason

    await kube.eventually(annotated, what="the duplicate's ignored-reason annotation")
    await w.create_unit(duplicate_ns, bare_unit("elsewhere", shared))
    await w.wait_message(duplicate_ns, "elsewhere", names.quota_not_bound_message(shared, duplicate_ns, []))

    # Later jobs of the team are still served by the team's own limits (2 cpu, not the duplicate's 100).
    assert w.alice_creates(job("more", shared)).returncode == 0
    await w.wait_admitted(w.mine, "more")
    assert w.alice_creates(job("too-much", shared)).returncode == 0
    await w.wait_message(
        w.mine, "too-much", f"limited quotaName:{shared}, limited resKey:cpu,; preempt failed"
    )
    assert await holder_on_queue(w, shared) == w.mine


async def test_a_second_quota_with_a_name_in_use_is_refused_at_the_door(w: World) -> None:
    other = await early_namespace(w)
    shared = w.name("shared")
    await w.create_quota(w.mine, shared, cpu="2")

    async def door_knows() -> bool:
        return (await w.bindings()).get(names.QUOTA_BINDING_HOLDER_PREFIX + shared) == w.mine

    await kube.eventually(door_knows, what="the door's ConfigMap names the holder")

    async def refused() -> str:
        try:
            await w.create_quota(other, shared, cpu="100")
        except k8s.ApiException as err:
            assert err.status == 403, (err.status, err.body)
            return str(json.loads(err.body)["message"])
        raise AssertionError("the duplicate was created")

    refusal = await kube.eventually(refused, what="the duplicate refused at the door")
    assert names.quota_name_taken_message(shared, w.mine) in refusal, refusal
    assert "choose another name" in refusal

    # A namespace user cannot create an ElasticQuota at all.
    done = w.alice("create", "-f", "-", obj=_quota_body(shared))
    assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr

    # The holder is untouched and keeps serving its team.
    assert await holder_on_queue(w, shared) == w.mine
    await w.create_unit(w.mine, bare_unit("work", shared))
    await w.wait_admitted(w.mine, "work")


def _quota_body(name: str) -> dict[str, object]:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name},
        "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
    }
