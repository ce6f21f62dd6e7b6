"""Hostile-tenant attacks on an Argo Workflow's reservation (docs/compatibility.md#argo-workflow).

A Workflow is charged its ``koord-queue/min-resources``, a reservation its pods must run within:
the webhook labels ``spec.podMetadata`` with ``koord-queue/gated-pod`` (which Argo copies onto every
step pod, and the pod webhook gates), and the reconciler releases a pod only while the summed
requests of the workflow's running pods plus its own fit the reservation. Mallory, a namespace
user (``chaos.tenant``), attacks that from her own namespace:

``workflow-strip-pod-gate-label``
    she removes the label from the ``spec.podMetadata`` of her admitted Workflow, so the next step
    pods would be born ungated; the validating webhook must refuse it;
``workflow-steps-beyond-reservation``
    her admitted Workflow reserves 500m cpu, and she creates its step pods herself, as Argo's
    controller would (labels and annotations from ``spec.podMetadata``, the Workflow as controller
    with its real UID): three of 400m and one of 1 CPU, far more in sum than reserved. Judged by
    reading the pods for a while: the summed cpu requests of the pods that run (bound, or out of the
    gate) never exceed what the unit holds, and the 1-CPU pod, larger than the whole reservation,
    never runs.

The chaos run has no Argo controller: nothing else creates the pods, and the Workflow is deleted at
the end (an admitted one would hold its quota for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Mapping
from typing import Any, Final

from chaos.tenant_common import NAMESPACE, QUOTA, WORKFLOWS, Attacker, held_cpu_milli, is_admitted_unit, runs
from koord_queue.shared import kube
from koord_queue.shared.api import names, podtemplates, quantities

STRIP: Final = "workflow-strip-pod-gate-label"
OUTGROW: Final = "workflow-steps-beyond-reservation"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``, the report's table).
ATTACKS: Final[dict[str, str]] = {
    STRIP: "validating webhook: the koord-queue/gated-pod label and the unit link in a managed "
    "Workflow's spec.podMetadata cannot be removed or changed (WorkflowAdapter.admission_errors)",
    OUTGROW: "pod webhook gates every pod labelled koord-queue/gated-pod (copied from "
    "spec.podMetadata); reconciler releases a Workflow's pod only while the summed requests of its "
    "running pods plus this one fit the reservation (shared/jobs/podbudget.py), a pod larger than "
    "the whole reservation never (PodKeptGated)",
}
#: The reservation her workflow declares, and her step pods' requests (milli-CPU).
RESERVE_MILLI: Final = 500
STEP_MILLI: Final = (400, 400, 400, 1000)
#: How long the running pods are read after the steps are created.
WATCH_S: Final = 12.0
ADMIT_S: Final = 30.0


def step_pod(workflow: Mapping[str, Any], index: int, cpu_milli: int) -> kube.Obj:
    """A step pod as Argo's controller makes it: ``spec.podMetadata`` copied on, the workflow's
    own label, and the Workflow as controller (its real UID: she may read it)."""
    meta = workflow["metadata"]
    pod_meta = (workflow.get("spec") or {}).get("podMetadata") or {}
    labels = {**(pod_meta.get("labels") or {}), "workflows.argoproj.io/workflow": meta["name"]}
    owner = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    resources = {"requests": {"cpu": f"{cpu_milli}m"}, "limits": {"cpu": f"{cpu_milli}m"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-step-{index}",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": dict(pod_meta.get("annotations") or {}),
            "ownerReferences": [owner],
        },
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]},
    }


def running_cpu_milli(pods: list[kube.Obj]) -> int:
    """Summed cpu requests of the pods that run or may start (``chaos.tenant_common.runs``)."""

    total = 0
    for pod in pods:
        if runs(pod):
            with contextlib.suppress(quantities.QuantityError):
                total += podtemplates.pod_requests(pod.get("spec") or {}).get("cpu", 0)
    return total


async def workflow_reservation(t: Attacker, r: int) -> None:
    """Both attacks of this module on one admitted Workflow of hers (module docstring)."""

    m = t.mallory
    assert m is not None
    name = f"mallory-wfr-{r}"
    target = f"{NAMESPACE}/{name}"
    body = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {names.QUOTA_NAME_LABEL: QUOTA},
            "annotations": {names.MIN_RESOURCES_ANNOTATION: json.dumps({"cpu": f"{RESERVE_MILLI}m"})},
        },
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "busybox"}}]},
    }
    sent = await t.send(lambda: m.create(WORKFLOWS, body, namespace=NAMESPACE))
    if sent.status != "accepted":
        for attack in (STRIP, OUTGROW):
            t.record(attack, r, target, "skipped", f"her workflow was not accepted: {sent.message}")
        return
    try:
        begun = time.monotonic()
        while not is_admitted_unit(await t._own_unit(name)):
            if time.monotonic() - begun > ADMIT_S:
                for attack in (STRIP, OUTGROW):
                    t.record(attack, r, target, "skipped", "her workflow was not admitted in time")
                return
            await asyncio.sleep(0.5)
        await _strip(t, r, name, target)
        await _outgrow(t, r, name, target)
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(WORKFLOWS, name, namespace=NAMESPACE, propagation="Background")


async def _strip(t: Attacker, r: int, name: str, target: str) -> None:
    """Remove the gate's label from her admitted Workflow's ``spec.podMetadata``."""

    m = t.mallory
    assert m is not None
    patch = {"spec": {"podMetadata": {"labels": {names.GATED_POD_LABEL: None}}}}
    sent = await t.send(lambda: m.patch(WORKFLOWS, name, patch, namespace=NAMESPACE))
    if sent.status == "refused":
        t.record(STRIP, r, target, "refused", sent.message)
    elif sent.status == "accepted":
        kept = ((sent.obj.get("spec") or {}).get("podMetadata") or {}).get("labels") or {}
        if names.GATED_POD_LABEL in kept:
            t.record(STRIP, r, target, "neutralised", "accepted; the label is still there")
        else:
            t.record(STRIP, r, target, "SUCCEEDED", "the label was removed from spec.podMetadata")
    else:
        t.record(STRIP, r, target, "skipped", sent.message)


async def _outgrow(t: Attacker, r: int, name: str, target: str) -> None:
    """Step pods far larger in sum than the reservation, judged by reading them (module docstring)."""

    m = t.mallory
    assert m is not None
    workflow = await t._read(lambda: m.get(WORKFLOWS, name, namespace=NAMESPACE))
    if not workflow:
        t.record(OUTGROW, r, target, "skipped", "her workflow is gone")
        return
    for index, milli in enumerate(STEP_MILLI):
        sent = await t.send(
            functools.partial(m.create, kube.PODS, step_pod(workflow, index, milli), namespace=NAMESPACE)
        )
        if sent.status not in ("accepted", "exists"):
            t.record(OUTGROW, r, target, "refused", f"step pod {index}: {sent.message}")
            return
    worst, worst_held, released, big_ran = 0, 0, 0, False
    begun = time.monotonic()
    while time.monotonic() - begun < WATCH_S:
        unit = await t._own_unit(name)
        held = held_cpu_milli(unit)
        listed = await t._read(
            lambda: m.list(
                kube.PODS,
                namespace=NAMESPACE,
                label_selector=f"workflows.argoproj.io/workflow={name}",
            )
        )
        pods = list(listed or [])
        running = running_cpu_milli(pods)
        if running > worst:
            worst, worst_held = running, held
        if running > held and is_admitted_unit(unit):
            detail = f"her workflow's pods ran {running}m cpu at once; its unit holds {held}m"
            t.record(OUTGROW, r, target, "SUCCEEDED", detail)
            return
        released = max(released, sum(1 for p in pods if runs(p)))
        big_ran = big_ran or any(
            runs(p) and p["metadata"]["name"].endswith(f"-step-{len(STEP_MILLI) - 1}") for p in pods
        )
        await asyncio.sleep(0.5)
    if big_ran:
        t.record(OUTGROW, r, target, "SUCCEEDED", "the step larger than the whole reservation ran")
        return
    t.record(
        OUTGROW,
        r,
        target,
        "neutralised",
        f"accepted; at most {worst}m cpu of her steps ran at once (unit held "
        f"{worst_held or RESERVE_MILLI}m), at most {released} step(s) running together, the 1-CPU step "
        "kept gated",
    )
