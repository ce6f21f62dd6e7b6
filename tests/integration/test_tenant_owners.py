"""Ownership is resolved, not read (docs/architecture.md#trust-boundaries), attacked as ``alice``, a
namespace user with the built-in ``edit`` role (``tests/tenancy.py``), against the real
kube-apiserver with the webhook and the reconciler running:

* a queued Job's owner references cannot be changed (a controller reference naming a kind the
  queue manages would make it that kind's child, out of the queue);
* a labelled Job created as the child of a TFJob that is not queued itself is queued anyway: the
  webhook, which cannot resolve owners, stores it with its pod template gated (its pods cannot be
  scheduled meanwhile); the reconciler resolves the owner, finds it unmanaged, holds the Job
  (``HeldUnadmitted``) and gives it a QueueUnit; its owner cannot then take the gate off the held
  Job's template to release it by unsuspending;
* a Job whose owner is a queued TFJob with the UID it names is left to its parent, its template
  gated and naming the parent's unit, so its pods wait for the parent's admission.

With a real Job controller the pods themselves are checked in
``tests/e2e/test_tenant_forged_parent.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from koord_queue.shared.api import names
from tests.integration.test_job_kinds import TOO_SMALL
from tests.integration.test_tenant_hold import alice, batch_job, queued_job
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

GATE = {"name": names.ADMISSION_GATE}


@pytest.fixture
def env(alice_in: Scenario) -> Scenario:
    return alice_in


def tfjob(name: str, quota: str | None) -> dict[str, Any]:
    labels = {names.QUOTA_NAME_LABEL: quota} if quota else {}
    container = {"name": "tensorflow", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
    replica = {"replicas": 1, "template": {"spec": {"containers": [container]}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {"tfReplicaSpecs": {"Worker": replica}},
    }


def child_of(parent: dict[str, Any], name: str, quota: str) -> dict[str, Any]:
    job = batch_job(name, quota)
    job["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "name": parent["metadata"]["name"],
            "uid": parent["metadata"]["uid"],
            "controller": True,
        }
    ]
    return job


async def test_a_queued_jobs_owner_references_cannot_be_changed(env: Scenario) -> None:
    job = await queued_job(env, "owned")
    parent = tfjob(env.name("parent"), None)
    code, out = alice(env, "create", "-f", "-", obj=parent)
    assert code == 0, out
    env.remember(parent)
    stored_parent = env.get_job_sync(parent)
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "name": stored_parent["metadata"]["name"],
        "uid": stored_parent["metadata"]["uid"],
        "controller": True,
    }
    patch = [{"op": "add", "path": "/metadata/ownerReferences", "value": [owner]}]
    code, out = alice(env, "patch", "job", job["metadata"]["name"], "--type=json", "-p", _json(patch))
    assert code != 0 and "metadata.ownerReferences" in out, out
    assert env.get_job_sync(job)["spec"]["suspend"] is True


async def test_a_child_of_an_unqueued_parent_is_queued_not_let_through(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    parent = tfjob(env.name("plain"), None)  # not labelled: the queue does not manage it
    code, out = alice(env, "create", "-f", "-", obj=parent)
    assert code == 0, out
    env.remember(parent)
    child = child_of(env.get_job_sync(parent), "claims-parent", quota)
    child["spec"]["parallelism"] = 2  # more than the quota: once queued it stays held
    code, out = alice(env, "create", "-f", "-", obj=child)
    assert code == 0, out  # the webhook cannot resolve owners: the reconciler does
    env.remember(child)
    stored = env.get_job_sync(child)  # meanwhile no pod of it can be scheduled
    assert GATE in stored["spec"]["template"]["spec"]["schedulingGates"], stored["spec"]
    await env.wait_job(
        "claims-parent", lambda j: j["spec"].get("suspend") is True, what="held by the reconciler"
    )
    await env.wait_unit(
        "claims-parent",
        lambda u: (u.get("status") or {}).get("phase") == "Enqueued",
        what="queued on its label",
    )
    # Held, its template may change; not its gate, which would let her release it by unsuspending.
    attack = [
        {"op": "replace", "path": "/spec/template/spec/schedulingGates", "value": []},
        {"op": "replace", "path": "/spec/suspend", "value": False},
    ]
    code, out = alice(env, "patch", "job", "claims-parent", "--type=json", "-p", _json(attack))
    assert code != 0 and "spec.template.spec.schedulingGates" in out, out
    assert GATE in env.get_job_sync(child)["spec"]["template"]["spec"]["schedulingGates"]


async def test_a_child_of_a_queued_parent_is_left_to_its_parent(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    parent = tfjob(env.name("queued"), quota)
    code, out = alice(env, "create", "-f", "-", obj=parent)
    assert code == 0, out
    env.remember(parent)
    stored_parent = env.get_job_sync(parent)
    assert names.JOB_HAS_ENQUEUED_ANNOTATION in stored_parent["metadata"]["annotations"]
    child = child_of(stored_parent, "real-child", quota)
    code, out = alice(env, "create", "-f", "-", obj=child)
    assert code == 0, out
    env.remember(child)
    # The parent's own unit exists (its pass ran); the child never gets one and is never held.
    await env.wait_unit(f"{parent['metadata']['name']}-tf-qu", lambda u: True, what="the parent's unit")
    assert await env.find_unit("real-child") is None
    stored = env.get_job_sync(child)
    assert stored["spec"].get("suspend") is not True
    template = stored["spec"]["template"]
    assert template["spec"]["schedulingGates"] == [GATE]  # released by its parent's admission
    unit = f"{env.ns}/{parent['metadata']['name']}-tf-qu"
    assert template["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == unit


def _json(value: Any) -> str:
    return json.dumps(value)
