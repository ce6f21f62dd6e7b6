"""Holding a job before its admission is taken back, and holding a job that escaped the queue: the
two writes on jobs that the job path's lifecycle stages share (``shared.jobs.jobpath``,
docs/architecture.md#the-job-path-view-decide-act).

The stages themselves are decided purely in ``shared.jobs.jobpath``: execution budget and
deactivation (docs/compatibility.md#activation-and-execution-budget), queueing again a job whose
admitted pods changed size (docs/compatibility.md#admitted-pod-size), the running timeout
(docs/compatibility.md#running-timeout) and queueing again an admitted job left without pods
(docs/compatibility.md#jobs-without-pods); each that takes an admission back answers a
``HoldThenRelease`` action, which the executor (``reconciler.job_actions``) carries out with
:func:`hold_then_release`. The order of its writes is part of its correctness and is explained
there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from koord_queue.reconciler import job_units
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.job_units import JobKey
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.jobs import podplan
from koord_queue.shared.jobs.base import JobAdapter

log = logging.getLogger(__name__)


async def hold_then_release(
    client: kube.Kube,
    key: JobKey,
    adapter: JobAdapter,
    job: kube.Obj,
    unit: kube.Obj,
    unit_name: str,
    status_patch: Mapping[str, object],
    *,
    pods_of: Callable[[], Sequence[podplan.PodView]],
    hold: bool = True,
    unit_written: kube.OwnWrites | None = None,
) -> kube.Obj | None:
    """Suspend the job (unless ``hold`` is false or it is held already), then, once none of its
    pods runs any more, write the unit's ``status_patch``, conditional on the unit's version;
    returns what the status write answered, or None while pods still run.

    The order every step that takes an admission back keeps: the status write is what frees the
    quota, so the quota is never handed to another job while this one can still start pods, nor
    while its pods still run: a pod being deleted runs on for its grace period, so the quota stays
    charged until the job has no active or terminating pod (``podplan.still_running``); each pod's
    deletion brings the job back. If the second write fails, the unit still holds its quota with
    its job held, and the next pass decides the same again (these stages run before the resume,
    ``shared.jobs.jobpath``) and writes only the status.

    The status write is remembered in ``unit_written`` (the controller's ``kube.OwnWrites``), so
    that no later pass acts on the unit's copy from before it: the suspension's own watch event
    can arrive first, and on that copy (still admitted) with the job now held, a pass whose step
    no longer decides the same (a pod came into view meanwhile) would reach the resume step and
    release the job while its unit holds nothing. The full chaos run of 2026-12-04 saw exactly
    that after a no-pods requeue (RELIABILITY.md).
    """
    if hold and not adapter.is_suspended(job):
        await client.patch(
            job_units.resource_of(adapter),
            key.name,
            adapter.suspend_merge_patch(job),
            namespace=key.namespace,
        )
    running = podplan.still_running(pods_of()) if hold else []
    if running:
        log.info(
            "%s %s/%s held; the quota is given back once %d pod(s) are gone",
            adapter.kind,
            key.namespace,
            key.name,
            len(running),
        )
        return None
    rv = (unit.get("metadata") or {}).get("resourceVersion")
    written: kube.Obj = await client.patch(
        job_units.QUEUE_UNITS,
        unit_name,
        {**status_patch, "metadata": {"resourceVersion": rv}},
        namespace=key.namespace,
        subresource="status",
    )
    if unit_written is not None:
        unit_written.wrote(f"{key.namespace}/{unit_name}", written)
    return written


async def hold_escaped(
    client: kube.Kube, events: EventRecorder, key: JobKey, adapter: JobAdapter, job: kube.Obj
) -> None:
    """Suspend a managed job that runs without the reconciler's admission (``adoption.escaped_hold``).

    Conditional on the job's resourceVersion, so a release by the reconciler racing with this
    (impossible today: it stamps in the same write) could never be undone by a stale view.
    """
    meta = job.get("metadata") or {}
    body = {**adapter.suspend_merge_patch(job)}
    body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": meta.get("resourceVersion")}
    await client.patch(job_units.resource_of(adapter), key.name, body, namespace=key.namespace)
    log.warning("held %s %s/%s: it ran without being admitted", adapter.kind, key.namespace, key.name)
    events.record(
        job,
        type_="Warning",
        reason=names.EventReason.HELD_UNADMITTED,
        message=names.Message.HELD_UNADMITTED,
    )
