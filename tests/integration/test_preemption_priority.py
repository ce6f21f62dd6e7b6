"""A namespace user cannot turn preemption priority or the preemption policy against others: the
attacks, made for real (docs/compatibility.md#preemption-priority,
docs/compatibility.md#non-preempting-jobs).

alice (``kubectl --as=alice``) holds only the built-in ``edit`` role in her namespace
(``tests/tenancy.py``); the real kube-apiserver runs the webhook and the reconciler:

* her job's preemption priority reaches its unit, capped by her quota's cap; the webhook refuses
  raising, adding or removing it once the job exists, and, started with ``--max-user-priority``,
  a value above the cap;
* a job that does not preempt (annotation, or its PriorityClass's ``preemptionPolicy: Never``) gets
  ``spec.preemptionPolicy: Never`` on its unit, and she cannot flip or remove the annotation after
  creation;
* she cannot write either field on the QueueUnit herself: units are not hers to write;

and the running scheduler honours both: a unit that does not preempt waits for room and marks
nobody, and a victim guarded by its preemption priority is taken only by a unit above it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from testenv import system
from testenv.cluster import LocalCluster
from tests.integration import preemption_helpers as h
from tests.integration.test_tenant_priority import priority_classes
from tests.integration.test_tenant_quotas import World, alice_may_submit, job, webhook_with_cap
from tests.integration.test_tenant_quotas import w as w  # the fixture: alice's namespace and her rights

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
PP = names.PREEMPTION_PRIORITY_ANNOTATION
POLICY = names.PREEMPTION_POLICY_ANNOTATION
NEVER = names.PREEMPTION_POLICY_NEVER


def guarded_job(name: str, quota: str, annotations: dict[str, str]) -> Obj:
    body = job(name, quota)
    body["metadata"]["annotations"].update(annotations)
    return body


def spec(unit: Obj) -> Obj:
    return dict(unit.get("spec") or {})


def refused_as_immutable(done: Any, key: str) -> bool:
    return done.returncode != 0 and f"{key} is immutable" in done.stderr


async def test_her_preemption_priority_is_capped_and_cannot_be_raised_after_creation(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1", annotations={names.MAX_USER_PRIORITY_ANNOTATION: "10"})
    await alice_may_submit(w, mine)
    done = w.alice_creates(guarded_job("guarded", mine, {PP: "1000000", names.PRIORITY_ANNOTATION: "5"}))
    assert done.returncode == 0, done.stderr
    await w.wait_unit(
        w.mine, "guarded", "preemption priority 10", lambda u: spec(u).get("preemptionPriority") == 10
    )
    for attempt in (
        ("annotate", "job", "guarded", f"{PP}=2000000", "--overwrite"),
        ("annotate", "job", "guarded", f"{PP}-"),
    ):
        assert refused_as_immutable(w.alice(*attempt), PP), attempt
    # A job made without one cannot get one later either.
    assert w.alice_creates(guarded_job("plain", mine, {})).returncode == 0
    assert refused_as_immutable(w.alice("annotate", "job", "plain", f"{PP}=10"), PP)
    # Below her own priority at creation: refused, with the reason.
    refusal = await w.refused(
        guarded_job("low", mine, {PP: "1", names.PRIORITY_ANNOTATION: "5"}), "must not be below"
    )
    assert f"metadata.annotations[{PP}]" in refusal


async def test_a_preemption_priority_above_the_cluster_cap_is_refused_at_the_door(
    w: World, system_integration: system.Processes, tmp_path: Any
) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine)
    await alice_may_submit(w, mine)
    with webhook_with_cap(w.cluster, system_integration, tmp_path, 100):
        refusal = await w.refused(guarded_job("pushy", mine, {PP: "101"}), "must be at most 100")
        assert f"metadata.annotations[{PP}]" in refusal and "maxUserPriority" in refusal
        await w.accepted(guarded_job("fair", mine, {PP: "100"}))


async def test_she_cannot_make_a_non_preempting_job_preempt_after_creation(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1")
    await alice_may_submit(w, mine)
    assert w.alice_creates(guarded_job("patient", mine, {POLICY: NEVER})).returncode == 0
    await w.wait_unit(
        w.mine, "patient", "preemptionPolicy Never", lambda u: spec(u).get("preemptionPolicy") == NEVER
    )
    for attempt in (
        ("annotate", "job", "patient", f"{POLICY}={names.PREEMPTION_POLICY_PREEMPT}", "--overwrite"),
        ("annotate", "job", "patient", f"{POLICY}-"),
    ):
        assert refused_as_immutable(w.alice(*attempt), POLICY), attempt
    await w.refused(guarded_job("odd", mine, {POLICY: "Sometimes"}), "Unsupported value")


async def test_a_priority_classs_never_reaches_her_unit(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1")
    await alice_may_submit(w, mine)
    api = k8s.SchedulingV1Api(w.api)
    name = w.name("patient")
    await api.create_priority_class(
        k8s.V1PriorityClass(metadata=k8s.V1ObjectMeta(name=name), value=50, preemption_policy=NEVER)
    )
    try:
        async with priority_classes(w, {"eager": 60}) as made:
            body, eager = job("classed", mine), job("eager", mine)
            body["spec"]["template"]["spec"]["priorityClassName"] = name
            eager["spec"]["template"]["spec"]["priorityClassName"] = made["eager"]
            # The owner's annotation cannot lift the class's Never.
            body["metadata"]["annotations"][POLICY] = names.PREEMPTION_POLICY_PREEMPT
            assert w.alice_creates(body).returncode == 0
            assert w.alice_creates(eager).returncode == 0
            await w.wait_unit(
                w.mine, "classed", "Never from its class", lambda u: spec(u).get("preemptionPolicy") == NEVER
            )
            unit = await w.wait_unit(w.mine, "eager", "priority 60", lambda u: spec(u).get("priority") == 60)
            assert "preemptionPolicy" not in spec(unit)
    finally:
        await api.delete_priority_class(name)


async def test_she_cannot_write_the_preemption_fields_of_a_queue_unit(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1")
    await alice_may_submit(w, mine)
    assert w.alice_creates(guarded_job("mine", mine, {})).returncode == 0
    await w.wait_unit(w.mine, "mine", "created", lambda u: True)
    for patch in (
        '{"spec":{"preemptionPriority":2147483647}}',
        '{"spec":{"preemptionPolicy":"PreemptLowerPriority"}}',
    ):
        done = w.alice("patch", "queueunit", "mine", "--type=merge", "-p", patch)
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
    unit = await w.get_unit(w.mine, "mine")
    assert "preemptionPriority" not in spec(unit) and "preemptionPolicy" not in spec(unit)


# --- the running scheduler: victims by preemption priority, preemptors that do not preempt ----------


@pytest.fixture
async def pb(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[h.Bench]:
    async with h.bench(integration_cluster, namespace_in) as it:
        yield it


async def create_unit(pb: h.Bench, name: str, *, quota: str, priority: int, **spec: object) -> None:
    """A bare QueueUnit of 2 cpu with extra ``spec`` fields (an admin may write them)."""
    body = h.unit(name, quota=quota, cpu="2", priority=priority)
    body["spec"].update(spec)
    await pb.objects.create_namespaced_custom_object(
        names.GROUP, names.VERSION, pb.ns, names.QUEUEUNIT_PLURAL, body
    )


async def test_a_unit_that_does_not_preempt_waits_for_room_and_marks_nobody(pb: h.Bench) -> None:
    q = await pb.make_quota("never", cpu="2")
    await pb.create("victim", quota=q, cpu="2", priority=10)
    await pb.admitted("victim")
    await create_unit(pb, "patient", quota=q, priority=100, preemptionPolicy=NEVER)
    expected = Message.limited(q, "cpu") + names.NON_PREEMPTING_SUFFIX
    await pb.parked("patient", lambda m: m == expected, what="'does not preempt'")
    await pb.caught_up()
    pb.assert_never_marked("victim")
    assert h.is_admitted(await pb.get("victim"))


async def test_a_victim_guarded_by_its_preemption_priority_is_not_marked_and_a_higher_unit_takes_it(
    pb: h.Bench,
) -> None:
    q = await pb.make_quota("guard", cpu="2")
    await create_unit(pb, "guarded", quota=q, priority=10, preemptionPriority=200)
    await pb.admitted("guarded")
    await pb.create("high", quota=q, cpu="2", priority=100)
    await pb.parked("high", lambda m: m.endswith(Message.PREEMPT_FAILED_SUFFIX), what="'; preempt failed'")
    await pb.caught_up()
    pb.assert_never_marked("guarded")
    await pb.create("top", quota=q, cpu="2", priority=300)
    await pb.wait("guarded", h.is_marked, what="marked by a preemptor above its preemption priority")
