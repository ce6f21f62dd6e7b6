"""Hostile-tenant attack on a RayJob's submitter pod set (docs/compatibility.md#rayjob).

In KubeRay's default ``K8sJobMode`` a RayJob runs ``ray job submit`` in a ``batch/v1`` Job named
after it and controlled by it; its unit charges that pod as the pod set ``submitter`` (count 1),
sized by ``spec.submitterPodTemplate`` or, when none is declared, by KubeRay's default submitter
(500m CPU, 200Mi memory). Where queueing is mandatory (docs/operations.md#mandatory-queueing) the
webhook gates the template of any Job claiming a parent, so the submitter's pod is born gated and
the reconciler alone may release it, within that pod set's admitted count and per-pod size.

Mallory makes the claim herself: once her small RayJob (no ``submitterPodTemplate``) is admitted
in :data:`chaos.tenant_common.MANDATORY_NAMESPACE`, she creates a Job of the RayJob's name whose
controller is the RayJob (its real UID, which she may read), with no quota label and one pod asking
for :data:`POD_CPU`, far more than the submitter's size but within one kwok node (8 CPU), so a
release would really bind it. Judged on the API alone (:func:`judge`): every version of that Job's
pods seen over the window, from a watch begun before the Job was created, must keep the admission
gate and stay unbound; one ungated or bound is a bypass. A Warning ``PodKeptGated`` seen in the
namespace is reported as detail, never as the verdict.

The chaos control plane has the RayJob CRD but no KubeRay: nothing but the reconciler (which
unsuspends the RayJob) touches the RayJob, so the only Job of its name and the only pods are hers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from chaos.tenant_common import JOBS, MANDATORY_NAMESPACE, UNDO_S, UNITS, Attacker, is_admitted_unit
from koord_queue.shared import kube
from koord_queue.shared.api import names
from testenv.kwok import COMPLETE_DELAY_ANNOTATION

ATTACK: Final = "forged-rayjob-submitter"
DEFENCE: Final = (
    "reconciler: a pod whose controller is a batch/v1 Job counts for a RayJob only as its "
    "submitter pod set (count 1, sized by spec.submitterPodTemplate or KubeRay's default 500m CPU, "
    "200Mi) and only when the RayJob controls that Job, so a larger pod of a Job she makes under "
    "the RayJob's name stays behind the gate the webhook gave it (PodKeptGated; "
    "shared/jobs/ray.py RayJobAdapter.pod_set_of, reconciler/job_pods.py submitter_job)"
)
RAYJOBS: Final = kube.Resource("ray.io", "v1", "rayjobs", "RayJob")
#: CPU of her Job's one pod: far above the submitter's 500m, within one kwok node's 8 CPU.
POD_CPU: Final = "4"
#: CPU of her RayJob's head: with KubeRay's default submitter (500m) it fits the 1-CPU quota.
HEAD_CPU: Final = "100m"
#: How long a pod of her Job is watched after it first appears (seconds).
WINDOW_S: Final = 18.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _gated(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    return isinstance(gates, list) and any(
        isinstance(g, Mapping) and g.get("name") == names.ADMISSION_GATE for g in gates
    )


def controlled_by(pod: Mapping[str, Any], uid: str) -> bool:
    """The pod's controller owner reference carries ``uid``."""
    refs = _meta(pod).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid") == uid for ref in refs
    )


def rayjob_body(name: str, namespace: str, quota: str) -> kube.Obj:
    """Her RayJob: a head of :data:`HEAD_CPU`, no workers, KubeRay's default submitter (no
    ``submitterPodTemplate``), ``shutdownAfterJobFinishes: true`` (KubeRay refuses to suspend one
    without it)."""
    head = {
        "metadata": {},
        "spec": {
            "containers": [
                {
                    "name": "ray-head",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": HEAD_CPU, "memory": "64Mi"}},
                }
            ]
        },
    }
    return {
        "apiVersion": RAYJOBS.api_version,
        "kind": RAYJOBS.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "entrypoint": "python -c 'print(42)'",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": head}},
        },
    }


def submitter_job_body(rayjob: Mapping[str, Any]) -> kube.Obj:
    """A ``batch/v1`` Job as KubeRay names its submitter (the RayJob's name, the RayJob as
    controller with its real UID, no ``blockOwnerDeletion``, no quota label), whose one pod asks for
    :data:`POD_CPU`; the pod would run for 300 s once bound."""
    meta = _meta(rayjob)
    owner = {
        "apiVersion": RAYJOBS.api_version,
        "kind": RAYJOBS.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    container = {
        "name": "ray-job-submitter",
        "image": "busybox",
        "resources": {"requests": {"cpu": POD_CPU, "memory": "64Mi"}},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "ownerReferences": [owner]},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {COMPLETE_DELAY_ANNOTATION: "300s"}},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def judge(
    versions: Sequence[Mapping[str, Any]],
    job_uid: str,
    *,
    unit_held: bool,
    kept_gated_seen: bool,
    seconds: float,
) -> tuple[str, str]:
    """The outcome and its detail from every version of her Job's pods seen over the window (those
    controlled by the Job ``job_uid``; others are ignored). Pure, and independent of the product's
    code: a version without the ``koord-queue/admission`` gate, or bound to a node, is a bypass
    (``SUCCEEDED``); no version at all proves nothing (``skipped``), nor does a gate kept while her
    RayJob's unit did not hold its admission at every read of the window (``unit_held`` false:
    ``skipped``); else ``neutralised``, saying
    whether a Warning ``PodKeptGated`` naming one of the pods was seen (detail only); ``seconds``:
    how long the pods were watched."""
    mine = [v for v in versions if controlled_by(v, job_uid)]
    for version in mine:
        meta = _meta(version)
        pod = f"pod {meta.get('name')} (resourceVersion {meta.get('resourceVersion')})"
        node = (version.get("spec") or {}).get("nodeName")
        if node:
            return "SUCCEEDED", f"{pod} of her forged submitter Job was bound to {node}"
        if not _gated(version):
            return (
                "SUCCEEDED",
                f"{pod} of her forged submitter Job was out of the {names.ADMISSION_GATE} gate",
            )
    if not mine:
        return "skipped", "no pod of her forged submitter Job was seen in the window"
    if not unit_held:
        return "skipped", "her RayJob's unit did not hold its admission for the whole window"
    pods = sorted({str(_meta(v).get("name")) for v in mine})
    event = "a Warning PodKeptGated named it" if kept_gated_seen else "no PodKeptGated event was seen"
    detail = (
        f"accepted; {len(pods)} pod(s) of her {POD_CPU}-CPU Job stayed gated and unbound in all "
        f"{len(mine)} version(s) seen over {seconds:.0f}s; {event}"
    )
    return "neutralised", detail


def kept_gated_seen(events: Sequence[Mapping[str, Any]], pods: set[str]) -> bool:
    """A Warning ``PodKeptGated`` among ``events`` names one of ``pods`` in its message."""
    return any(
        e.get("reason") == names.EventReason.POD_KEPT_GATED
        and any(f"pod {p} " in str(e.get("message") or "") for p in pods)
        for e in events
    )


async def _watch_versions(
    tenant: Attacker, namespace: str, selector: str, revision: str, job_uid: str, created: float
) -> tuple[list[kube.Obj], int, float]:
    """Every version of the pods matching ``selector`` from ``revision`` on, until :data:`WINDOW_S`
    after the first pod of the Job ``job_uid`` was seen (or ``UNDO_S`` after ``created`` while none
    was); how many times the watch had to be begun again from a fresh list (each may have missed a
    version in between; a watch that merely ended resumes from its last revision); and how long the
    first pod was watched (seconds, 0 when none was seen)."""

    seen: list[kube.Obj] = []
    relists = 0
    first: float | None = None
    loop = asyncio.get_running_loop()

    def deadline() -> float:
        return created + UNDO_S if first is None else first + WINDOW_S

    def at_deadline() -> float:
        """The deadline on the event loop's clock (what ``asyncio.timeout`` reads)."""
        return loop.time() + max(0.0, deadline() - time.monotonic())

    def note(obj: kube.Obj) -> None:
        nonlocal first
        seen.append(obj)
        if first is None and controlled_by(obj, job_uid):
            first = time.monotonic()

    while time.monotonic() < deadline():
        try:
            async with asyncio.timeout_at(at_deadline()) as scope:
                stream = tenant.admin.watch(
                    kube.PODS,
                    resource_version=revision,
                    namespace=namespace,
                    label_selector=selector,
                    timeout_seconds=max(1, int(deadline() - time.monotonic()) + 1),
                )
                try:
                    async for kind, obj in stream:
                        revision = str(_meta(obj).get("resourceVersion") or revision)
                        if kind != "BOOKMARK":
                            note(obj)
                            scope.reschedule(at_deadline())
                finally:
                    close = getattr(stream, "aclose", None)  # an async generator: end its request
                    if close is not None:
                        await close()
        except TimeoutError:
            continue  # the window is over (the loop's test ends it)
        except kube.KubeError:
            await asyncio.sleep(0.5)
            try:
                pods, revision = await tenant.admin.list(
                    kube.PODS, namespace=namespace, label_selector=selector
                )
            except kube.KubeError:
                continue
            relists += 1
            for pod in pods:
                note(pod)
    watched = 0.0 if first is None else time.monotonic() - first
    return seen, relists, watched


async def _unit_held(tenant: Attacker, namespace: str, unit: str, stop: asyncio.Event) -> bool:
    """Did every read of the unit ``unit`` until ``stop`` show it holding an admission? A read the
    apiserver does not answer (a fault) shows nothing; a unit gone did not hold it."""

    held = True
    while not stop.is_set():
        try:
            held = held and is_admitted_unit(await tenant.admin.get(UNITS, unit, namespace=namespace))
        except kube.NotFound:
            held = False
        except kube.KubeError:
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return held


async def _list_revision(tenant: Attacker, namespace: str, selector: str) -> str | None:
    """The revision of a list of the pods matching ``selector``, retried through faults for up to
    ``UNDO_S``; None when the apiserver never answered."""

    begun = time.monotonic()
    while time.monotonic() - begun < UNDO_S:
        try:
            _, revision = await tenant.admin.list(kube.PODS, namespace=namespace, label_selector=selector)
            return revision
        except kube.KubeError:
            await asyncio.sleep(0.5)
    return None


async def forged_submitter(tenant: Attacker, r: int) -> None:
    """Her admitted RayJob, then a Job of its name controlled by it whose pod is far larger than
    the submitter pod set (module docstring); judged by :func:`judge`."""

    m = tenant.mallory
    assert m is not None
    namespace = MANDATORY_NAMESPACE
    name = f"mallory-submitter-{r}"
    target = f"{namespace}/{name}"
    unit_name = f"{name}-ray-qu"
    selector = f"batch.kubernetes.io/job-name={name}"
    body = rayjob_body(name, namespace, MANDATORY_NAMESPACE)
    try:
        sent = await tenant.send(lambda: m.create(RAYJOBS, body, namespace=namespace))
        if sent.status != "accepted":
            tenant.record(ATTACK, r, target, "skipped", f"her RayJob was not accepted: {sent.message}")
            return
        begun = time.monotonic()
        admitted = False
        while not admitted and time.monotonic() - begun < UNDO_S:
            with contextlib.suppress(kube.KubeError):
                admitted = is_admitted_unit(await tenant.admin.get(UNITS, unit_name, namespace=namespace))
            if not admitted:
                await asyncio.sleep(0.5)
        if not admitted:
            tenant.record(ATTACK, r, target, "skipped", "her RayJob was not admitted in time")
            return
        # The pods' record begins before her Job exists, so the watch sees each of its versions.
        revision = await _list_revision(tenant, namespace, selector)
        if revision is None:
            tenant.record(ATTACK, r, target, "skipped", "her namespace's pods were unreadable")
            return
        job = submitter_job_body(sent.obj)
        created_at = time.monotonic()
        created = await tenant.send(lambda: m.create(JOBS, job, namespace=namespace))
        if created.status == "refused":
            tenant.record(ATTACK, r, target, "refused", created.message)
            return
        if created.status != "accepted":
            tenant.record(ATTACK, r, target, "skipped", f"her Job was not stored: {created.message}")
            return
        job_uid = str(_meta(created.obj).get("uid") or "")
        stop = asyncio.Event()
        holding = asyncio.create_task(_unit_held(tenant, namespace, unit_name, stop))
        try:
            versions, relists, watched = await _watch_versions(
                tenant, namespace, selector, revision, job_uid, created_at
            )
        finally:
            stop.set()
            unit_held = await holding
        pods = {str(_meta(v).get("name")) for v in versions if controlled_by(v, job_uid)}
        events = await tenant._read(lambda: tenant.admin.list(kube.EVENTS, namespace=namespace)) or []
        outcome, detail = judge(
            versions,
            job_uid,
            unit_held=unit_held,
            kept_gated_seen=kept_gated_seen(events, pods),
            seconds=watched,
        )
        template_spec = ((created.obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        if outcome == "neutralised":
            stored = "born gated" if _gated({"spec": template_spec}) else "stored without the gate"
            detail += f"; her Job's template was {stored}"
            if relists:
                detail += f"; the watch was begun again {relists} time(s) from a fresh list"
        tenant.record(ATTACK, r, target, outcome, detail)
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=namespace, propagation="Background")
        with contextlib.suppress(kube.KubeError):
            await m.delete(RAYJOBS, name, namespace=namespace, propagation="Background")
