"""A Workflow's ``koord-queue/min-resources`` is a reservation its pods run within, attacked by a
namespace user on the real apiserver with the webhook, the admission policies and the reconciler
running (docs/compatibility.md#argo-workflow).

``alice`` holds a namespace user's rights (``tests/tenancy.py``: ``edit`` and the job and pod rules it
aggregates). Her admitted Workflow carries, in ``spec.podMetadata``, the label
``koord-queue/gated-pod`` and the unit link that Argo's controller copies onto every step pod; she
tries to take them off (so that the next steps would be born ungated, outside the reservation)
and is refused, whatever the form of the write.

Then the test plays Argo's controller (no Argo runs here; ``tests/e2e/test_operators.py`` has the real
one): step pods made from ``spec.podMetadata`` with the Workflow as controller are born gated, and
the reconciler releases them only while their summed requests fit the reservation: of two 1-CPU
steps under a 1-CPU reservation one is released and the other waits (a Normal
``PodWaitsForReservation``) until the first finishes; a 2-CPU step never runs (a Warning
``PodKeptGated`` says it is larger than the whole reservation).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from tests import kube, tenancy
from tests.integration.test_job_kinds import metadata
from tests.scenario import Scenario, phase

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
WORKFLOWS = "workflows.argoproj.io"
GATED = names.GATED_POD_LABEL


def workflow(name: str, quota: str) -> Obj:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": metadata(name, quota, annotations={names.MIN_RESOURCES_ANNOTATION: '{"cpu": "1"}'}),
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "busybox"}}]},
    }


def alice(env: Scenario, *args: str, obj: Obj | None = None) -> tuple[int, str]:
    text = yaml.safe_dump(obj) if obj is not None else None
    done = tenancy.as_user(env.cluster, tenancy.ALICE, "-n", env.ns, *args, input_text=text)
    return done.returncode, done.stdout + done.stderr


def step_pod(stored: Obj, name: str, cpu: str) -> Obj:
    """A step pod as Argo's controller makes it: ``spec.podMetadata`` copied on, the Workflow as
    controller."""
    pod_meta = stored["spec"]["podMetadata"]
    meta = stored["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**pod_meta["labels"], "workflows.argoproj.io/workflow": meta["name"]},
            "annotations": dict(pod_meta["annotations"]),
            "ownerReferences": [
                {
                    "apiVersion": "argoproj.io/v1alpha1",
                    "kind": "Workflow",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]
        },
    }


def gated(pod: Obj) -> bool:
    return {"name": names.ADMISSION_GATE} in (pod["spec"].get("schedulingGates") or [])


async def test_alice_cannot_take_the_pod_gate_off_her_admitted_workflow_and_its_steps_run_within_it(
    alice_in: Scenario,
) -> None:
    env = alice_in
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "4", "memory": "4Gi"})
    obj = workflow("wf", quota)
    code, out = alice(env, "create", "-f", "-", obj=obj)
    assert code == 0, out
    env.remember(obj)
    await env.wait_unit("wf", lambda u: phase(u) in ("Dequeued", "Running"), what="admitted")
    stored = await env.wait_job(obj, lambda j: j["spec"].get("suspend") is False, what="released")
    pod_meta = stored["spec"]["podMetadata"]
    assert pod_meta["labels"] == {GATED: "true"}, pod_meta
    assert pod_meta["annotations"] == {
        names.RELATED_QUEUEUNIT_ANNOTATION: f"{env.ns}/wf",
        names.RELATED_PODSET_ANNOTATION: "default",
    }

    # Every way of taking the label (or the unit link) off is refused, naming the field.
    for kind, patch, field in (
        ("merge", {"spec": {"podMetadata": {"labels": {GATED: None}}}}, f"labels[{GATED}]"),
        ("merge", {"spec": {"podMetadata": {"labels": {GATED: "false"}}}}, f"labels[{GATED}]"),
        ("json", [{"op": "remove", "path": "/spec/podMetadata"}], f"labels[{GATED}]"),
        (
            "merge",
            {"spec": {"podMetadata": {"annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: None}}}},
            f"annotations[{names.RELATED_QUEUEUNIT_ANNOTATION}]",
        ),
    ):
        code, out = alice(env, "patch", WORKFLOWS, "wf", f"--type={kind}", "-p", json.dumps(patch))
        assert code != 0, f"{patch} was accepted"
        assert f"spec.podMetadata.{field}: Forbidden" in out and "delete and re-create the Workflow" in out, (
            out
        )
    assert (await env.get_job(obj))["spec"]["podMetadata"] == pod_meta

    # Playing Argo's controller: two 1-CPU steps in parallel and one of 2 CPU, each born gated.
    for name, cpu in (("step-1", "1"), ("step-2", "1"), ("step-3", "2")):
        env.kubectl("-n", env.ns, "create", "-f", "-", input_text=json.dumps(step_pod(stored, name, cpu)))

    def pods() -> dict[str, Obj]:
        listed = env.kubectl(
            "-n", env.ns, "get", "pods", "-l", "workflows.argoproj.io/workflow=wf", "-o", "json"
        )
        return {p["metadata"]["name"]: p for p in json.loads(listed.stdout)["items"]}

    async def one_released() -> dict[str, Obj] | None:
        found = pods()
        return found if len(found) == 3 and not gated(found["step-1"]) else None

    found = await kube.eventually(one_released, what="the first step released")
    waits = await env.wait_event("wf", "PodWaitsForReservation", type_="Normal", kind="Workflow")
    assert "step-2" in waits.message and "cpu 1 of its reservation (cpu 1)" in waits.message, waits.message
    never = await env.wait_event("wf", names.EventReason.POD_KEPT_GATED, type_="Warning", kind="Workflow")
    assert "step-3" in never.message and "can never run" in never.message, never.message
    found = pods()
    assert gated(found["step-2"]) and gated(found["step-3"]), found

    # The first step ends: the second takes its place, the 2-CPU step stays gated.
    env.kubectl(
        "-n",
        env.ns,
        "patch",
        "pod",
        "step-1",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Succeeded"}}',
    )

    async def second_released() -> dict[str, Obj] | None:
        now = pods()
        return now if not gated(now["step-2"]) else None

    found = await kube.eventually(second_released, what="the second step released once the first ended")
    assert gated(found["step-3"])
