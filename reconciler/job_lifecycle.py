"""The job extension's steps on an admitted job's life: execution budget and deactivation
(docs/compatibility.md#activation-and-execution-budget), queueing again a job whose admitted pods
changed size (docs/compatibility.md#admitted-pod-size), the running timeout
(docs/compatibility.md#running-timeout), queueing again an admitted job left without pods
(docs/compatibility.md#jobs-without-pods), and holding a job that escaped the queue.

Each step carries out what a pure decision says (``shared.jobs.lifecycle``,
``shared.jobs.running_timeout``, ``shared.jobs.stranded``, ``shared.jobs.adoption``) and answers
whether it wrote, so the controller (``reconciler.jobs``) stops its pass and waits for the update.
The order of each step's writes is part of its correctness and is explained where it is made. The
controller keeps all state (the running timeout's first sightings, the last pods seen, pending
re-checks) and passes it in.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence

from koord_queue.reconciler import job_units, metrics
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.job_units import JobKey
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.jobs import jobext, lifecycle, podplan, running_timeout, stranded
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
    its job held, and the next pass decides the same again (these steps run before the resume
    step) and writes only the status.

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


async def budget_and_activation(
    client: kube.Kube,
    events: EventRecorder,
    key: JobKey,
    adapter: JobAdapter,
    job: kube.Obj,
    unit: kube.Obj,
    unit_name: str,
    *,
    mark: Callable[[JobKey], None],
    pods_of: Callable[[], Sequence[podplan.PodView]],
    unit_written: kube.OwnWrites | None = None,
) -> bool:
    """Execution budget and deactivation (docs/compatibility.md#activation-and-execution-budget);
    True when something was written. ``mark`` looks at the job again when its budget runs out."""
    now = time.time()
    stamp = job_units.now_text()
    rv = (unit.get("metadata") or {}).get("resourceVersion")
    budget = lifecycle.execution_budget(unit, now=now, now_text=stamp)
    if budget.spec_patch is not None and budget.status_patch is not None:
        # The spec first: once ``spec.active`` is false the unit is parked by ``deactivation``
        # whatever happens next, so a failed second write can never leave the job running
        # with its budget clock stopped (the other order could). The status write then
        # follows the version the spec write made.
        updated = await client.patch(
            job_units.QUEUE_UNITS, unit_name, budget.spec_patch, namespace=key.namespace
        )
        rv = (updated.get("metadata") or {}).get("resourceVersion") or rv
        await client.patch(
            job_units.QUEUE_UNITS,
            unit_name,
            {**budget.status_patch, "metadata": {"resourceVersion": rv}},
            namespace=key.namespace,
            subresource="status",
        )
        seconds = (unit.get("spec") or {}).get("maximumExecutionTimeSeconds")
        events.record(
            job,
            type_="Warning",
            reason=names.EventReason.MAX_EXEC_TIME_EXCEEDED,
            message=f"The maximum execution time ({seconds}s) was exceeded",
        )
        return True
    if budget.remaining is not None:
        asyncio.get_running_loop().call_later(budget.remaining + 0.05, mark, key)
    parked = lifecycle.deactivation(unit, now=now, now_text=stamp)
    if parked is None:
        return False
    held = await hold_then_release(
        client, key, adapter, job, unit, unit_name, parked, pods_of=pods_of, unit_written=unit_written
    )
    if held is None:
        return True  # held; its pods' deletion brings us back
    events.record(
        job,
        type_="Normal",
        reason=names.EventReason.DEACTIVATED,
        message="Job is suspended and its resources are reclaimed because the queue unit is deactivated",
    )
    return True


async def requeue_resized(
    client: kube.Kube,
    events: EventRecorder,
    key: JobKey,
    adapter: JobAdapter,
    job: kube.Obj,
    unit: kube.Obj,
    unit_name: str,
    pod_sets: Sequence[str],
    desired: Mapping[str, object],
    *,
    pods_of: Callable[[], Sequence[podplan.PodView]],
    unit_written: kube.OwnWrites | None = None,
) -> bool:
    """Queue a job again whose admitted pods changed size (``shared.jobs.jobext.admitted_resize``,
    docs/compatibility.md#admitted-pod-size); True when something was written. ``desired`` is
    the unit spec the job asks for now.

    The webhook refuses such an edit from users, so this runs only where the door was bypassed.
    Three writes, in an order that never lets the job run at a size nobody admitted:

    1. the job is suspended (its controller deletes the pods made at either size);
    2. the unit's status: queued again, admissions cleared; this frees the quota, so it comes after
       the hold, as in a running-timeout backoff;
    3. the unit's pod sets follow the job, conditional on the version the second write made.

    The scheduler may admit the unit between 2 and 3 at its old size. Then the third write fails
    (its version is gone) and the next pass finds an admitted unit whose pod sets differ from the
    job again, and starts over from 2; had the third write been unconditional, the next pass would
    have seen an admitted unit in step with its job and released it at a size admitted for less.
    A failure after 1 likewise leaves the job held and the change found again (this step runs
    before the resume step).
    """
    now_text = job_units.now_text()
    patch = lifecycle.requeue_resized(unit, pod_sets, now=time.time(), now_text=now_text)
    if patch is None:
        return False
    queued = await hold_then_release(
        client, key, adapter, job, unit, unit_name, patch, pods_of=pods_of, unit_written=unit_written
    )
    if queued is None:
        return True  # held; its pods' deletion brings us back
    message = (
        f"the resource requests of pod set(s) {', '.join(pod_sets)} changed after the job was admitted; "
        "it is suspended and queued again at its new size"
    )
    log.warning("%s %s/%s: %s", adapter.kind, key.namespace, key.name, message)
    events.record(job, type_="Warning", reason=names.EventReason.ADMITTED_JOB_RESIZED, message=message)
    drift = jobext.spec_drift(
        {**unit, "status": {**(unit.get("status") or {}), **patch["status"]}}, dict(desired)
    )
    if drift is not None:
        rv = (unit.get("metadata") or {}).get("resourceVersion")
        after = (queued.get("metadata") or {}).get("resourceVersion") if isinstance(queued, Mapping) else None
        await client.patch(
            job_units.QUEUE_UNITS,
            unit_name,
            {**drift, "metadata": {"resourceVersion": after or rv}},
            namespace=key.namespace,
        )
    return True


async def enforce_running_timeout(
    client: kube.Kube,
    events: EventRecorder,
    key: JobKey,
    adapter: JobAdapter,
    job: kube.Obj,
    unit: kube.Obj,
    unit_name: str,
    unit_key: str,
    *,
    running_timeouts: running_timeout.RunningTimeouts,
    pods_of: Callable[[], Sequence[podplan.PodView]],
    short_since: dict[str, Mapping[str, float]],
    check_again: Callable[[JobKey, float | None], None],
    unit_written: kube.OwnWrites | None = None,
) -> bool:
    """Running timeout, backoff and partial running timeout (docs/compatibility.md#running-timeout),
    decided by ``shared.jobs.running_timeout``; True when something was written.

    ``pods_of`` reads the unit's pods (only when a timeout is set for the job's kind);
    ``short_since`` is the controller's memory of shortfalls, updated here; ``check_again``
    schedules the job's next look at its timeout.

    Order of the two writes of a backoff: the job is suspended first, the unit's status
    (TimeoutBackoff, admissions cleared) second. The status write is what frees the quota, so
    the quota is never handed to another job while this one can still start pods. If the second
    write fails, the unit still holds its quota with its job held; the next pass (this step runs
    before the resume step) decides the same timeout again and only writes the status. The other
    order would free the quota of a still-released job whenever the suspension failed, and its
    pods could then be bound uncharged.
    """
    timeouts = running_timeouts.for_extension(adapter.extension)
    if not timeouts.enabled:
        return False
    now = time.time()
    decision = running_timeout.decide(
        unit,
        pods_of(),
        timeouts,
        now=now,
        now_text=job_units.now_text(),
        jitter=random.random(),
        short_since=short_since.get(unit_key),
    )
    if decision.short_since:
        short_since[unit_key] = decision.short_since
    else:
        short_since.pop(unit_key, None)
    check_again(key, decision.recheck_in)
    if decision.status_patch is None:
        return False
    written = await hold_then_release(
        client,
        key,
        adapter,
        job,
        unit,
        unit_name,
        decision.status_patch,
        pods_of=pods_of,
        hold=decision.suspend,
        unit_written=unit_written,
    )
    if written is None:
        return True  # held; its pods' deletion brings us back
    log.info("%s %s: %s", decision.event_reason, unit_key, decision.event_message)
    for obj in (unit, job):
        events.record(obj, type_="Warning", reason=decision.event_reason, message=decision.event_message)
    return True


async def requeue_stranded(
    client: kube.Kube,
    events: EventRecorder,
    key: JobKey,
    adapter: JobAdapter,
    job: kube.Obj,
    unit: kube.Obj,
    unit_name: str,
    unit_key: str,
    *,
    running_timeouts: running_timeout.RunningTimeouts,
    pods_of: Callable[[], Sequence[podplan.PodView]],
    pods_seen_at: dict[str, float],
    check_again: Callable[[JobKey, float | None], None],
    unit_written: kube.OwnWrites | None = None,
) -> bool:
    """Take the admission back from a job left without pods (docs/compatibility.md#jobs-without-pods),
    decided by ``shared.jobs.stranded``; True when something was written.

    ``pods_of`` reads every pod of the job (``job_pods.all_pods_of_job``: those its controller owns
    as well as those counted for the unit); ``pods_seen_at`` is the controller's memory of the
    clock's start per unit, updated here; ``check_again`` schedules the next look. The writes are
    the running timeout's, in its order (``hold_then_release``: the job suspended first, the unit's
    status second). If the status write fails, the next pass (this step runs before the resume
    step) decides the same again and writes only the status; once it is written, the controller
    waits for its watch event (``unit_written``) before any step acts on the unit again, so a held
    job is never resumed on a view of its unit from before the requeue.
    """
    timeouts = running_timeouts.for_extension(adapter.extension)
    if timeouts.no_pods_timeout <= 0 or adapter.extension not in stranded.KINDS:
        return False
    now = time.time()
    decision = stranded.decide(
        unit,
        pods_of(),
        timeouts,
        extension=adapter.extension,
        now=now,
        now_text=job_units.now_text(),
        jitter=random.random(),
        pods_seen_at=pods_seen_at.get(unit_key),
    )
    if decision.pods_seen_at is None:
        pods_seen_at.pop(unit_key, None)
    else:
        pods_seen_at[unit_key] = decision.pods_seen_at
    check_again(key, decision.recheck_in)
    if decision.status_patch is None:
        return False
    written = await hold_then_release(
        client,
        key,
        adapter,
        job,
        unit,
        unit_name,
        decision.status_patch,
        pods_of=pods_of,
        unit_written=unit_written,
    )
    if written is None:
        return True  # a pod appeared meanwhile and runs: its deletion brings us back
    metrics.JOBS_WITHOUT_PODS_REQUEUED.labels(kind=adapter.kind).inc()
    log.warning("%s %s: %s", decision.event_reason, unit_key, decision.event_message)
    for obj in (unit, job):
        events.record(obj, type_="Warning", reason=decision.event_reason, message=decision.event_message)
    return True


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
