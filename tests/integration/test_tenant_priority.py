"""A namespace user cannot raise her unit's priority past what the admins allow: the attacks, made
for real (docs/compatibility.md#priority-cap).

alice (``kubectl --as=alice``) holds only the built-in ``edit`` role in her namespace
(``tests/tenancy.py``); the real kube-apiserver runs the webhook and the reconciler:

* a raw ``priority: 1000000`` in her Job's pod template (which the apiserver would refuse on a
  pod) gives her unit no priority at all, and beside a PriorityClass it gives the class's value;
* a PriorityClass her quota's ``koord-queue/allowed-priority-classes`` does not list gives her unit
  no class and no value, with a Warning ``PriorityClassNotAllowed`` on the job naming the classes
  she may use; a class on the list counts, and the unit follows when an admin adds a class;
* an Argo Workflow's ``spec.priority`` is clamped to her quota's ``koord-queue/max-user-priority``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from tests.integration.test_tenant_quotas import World, alice_may_submit, job
from tests.integration.test_tenant_quotas import w as w  # the fixture: alice's namespace and her rights

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
RAW = 1_000_000


def raw_priority_job(name: str, quota: str, *, class_name: str | None = None) -> Obj:
    """alice's Job whose pod template carries a raw ``priority`` (and a class, if any)."""
    body = job(name, quota)
    spec = body["spec"]["template"]["spec"]
    spec["priority"] = RAW
    if class_name:
        spec["priorityClassName"] = class_name
    return body


def prioritized_workflow(name: str, quota: str, priority: int) -> Obj:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "labels": {names.QUOTA_NAME_LABEL: quota},
            "annotations": {names.MIN_RESOURCES_ANNOTATION: '{"cpu": "1"}'},
        },
        "spec": {
            "priority": priority,
            "entrypoint": "main",
            "templates": [{"name": "main", "container": {"image": "busybox"}}],
        },
    }


@contextlib.asynccontextmanager
async def priority_classes(w: World, values: dict[str, int]) -> AsyncIterator[dict[str, str]]:
    """Cluster-wide PriorityClasses made by the admin for this test (names prefixed with alice's
    namespace), deleted afterwards; yields short name -> real name."""
    api = k8s.SchedulingV1Api(w.api)
    made = {short: w.name(short) for short in values}
    for short, value in values.items():
        await api.create_priority_class(
            k8s.V1PriorityClass(metadata=k8s.V1ObjectMeta(name=made[short]), value=value)
        )
    try:
        yield made
    finally:
        for name in made.values():
            with contextlib.suppress(k8s.ApiException):
                await api.delete_priority_class(name)


def priority_of(unit: Obj) -> tuple[str | None, int | None]:
    spec = unit.get("spec") or {}
    return spec.get("priorityClassName"), spec.get("priority")


async def test_a_raw_template_priority_gives_her_unit_nothing_and_a_class_its_value(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1", annotations={names.MAX_USER_PRIORITY_ANNOTATION: "10"})
    await alice_may_submit(w, mine)
    async with priority_classes(w, {"low": 5}) as pcs:
        done = w.alice_creates(raw_priority_job("raw", mine))
        assert done.returncode == 0, done.stderr
        done = w.alice_creates(raw_priority_job("classed", mine, class_name=pcs["low"]))
        assert done.returncode == 0, done.stderr
        await w.wait_unit(w.mine, "raw", "no priority", lambda u: priority_of(u) == (None, None))
        await w.wait_unit(w.mine, "classed", "the class's value", lambda u: priority_of(u) == (pcs["low"], 5))


async def test_a_class_her_quota_does_not_allow_counts_as_none_and_she_is_told(w: World) -> None:
    mine = w.name("mine")
    async with priority_classes(w, {"low": 10, "urgent": RAW}) as pcs:
        allowed = f'["{pcs["low"]}"]'
        await w.create_quota(
            w.mine, mine, cpu="1", annotations={names.ALLOWED_PRIORITY_CLASSES_ANNOTATION: allowed}
        )
        await alice_may_submit(w, mine)
        urgent, low = raw_priority_job("urgent", mine, class_name=pcs["urgent"]), job("low", mine)
        low["spec"]["template"]["spec"]["priorityClassName"] = pcs["low"]
        assert w.alice_creates(urgent).returncode == 0
        assert w.alice_creates(low).returncode == 0
        await w.wait_unit(w.mine, "low", "the allowed class", lambda u: priority_of(u) == (pcs["low"], 10))
        # (Had her job come before the reconciler saw the quota, the unit follows the list.)
        await w.wait_unit(w.mine, "urgent", "no class", lambda u: priority_of(u) == (None, None))
        event = await w.wait_event(w.mine, "urgent", "PriorityClassNotAllowed")
        assert f"PriorityClass '{pcs['urgent']}' is not allowed for quota '{mine}'" in event.message
        assert f"allowed: {pcs['low']}" in event.message
        assert names.ALLOWED_PRIORITY_CLASSES_ANNOTATION in event.message
        # alice cannot change the list herself: quotas are the admins'.
        done = w.alice(
            "annotate",
            "elasticquota",
            mine,
            f'{names.ALLOWED_PRIORITY_CLASSES_ANNOTATION}=["{pcs["urgent"]}"]',
            "--overwrite",
        )
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
        # An admin allows the class: the unit follows.
        both = f'["{pcs["low"]}", "{pcs["urgent"]}"]'
        await w.annotate_quota(w.mine, mine, {names.ALLOWED_PRIORITY_CLASSES_ANNOTATION: both})
        await w.wait_unit(
            w.mine, "urgent", "the class once allowed", lambda u: priority_of(u) == (pcs["urgent"], RAW)
        )


async def test_a_workflows_priority_is_clamped_to_her_quotas_cap(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1", annotations={names.MAX_USER_PRIORITY_ANNOTATION: "10"})
    await alice_may_submit(w, mine)
    done = w.alice("create", "-f", "-", obj=prioritized_workflow("wf", mine, RAW))
    assert done.returncode == 0, done.stderr
    try:
        await w.wait_unit(w.mine, "wf", "priority 10", lambda u: priority_of(u) == (None, 10))
    finally:
        w.alice("delete", "workflow", "wf", "--ignore-not-found", "--wait=false")
