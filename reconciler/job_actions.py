"""The job path's executor (docs/architecture.md#the-job-path-view-decide-act): performs, in order,
the actions the pure decision (``shared.jobs.jobpath.decide``) answered for one job, one small
function per kind (``shared.jobs.jobsteps``).

Each function answers whether the pass goes on. Most always do; those that need the API's answer
mid-way say so in their action's docstring: a hold whose pods still run, a reclaim that met a pod
changed since the plan, a unit or label write that did not take. The writes themselves, and the
reasons for their conditions and order, live in ``reconciler.job_units``, ``reconciler.job_pods``
and ``reconciler.job_lifecycle``; the controller (``reconciler.jobs``) keeps all state and is
passed in as ``host``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from koord_queue.reconciler import job_lifecycle, job_pods, job_units, metrics, workloads
from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared import kube
from koord_queue.shared.core import mandatory
from koord_queue.shared.jobs import jobsteps as steps
from koord_queue.shared.jobs.base import JobAdapter
from koord_queue.shared.jobs.jobpath import JobView
from koord_queue.shared.jobs.podplan import PodView
from koord_queue.shared.jobs.unitowners import JobKey


class PodStore(Protocol):
    """The pod informer, as far as the executor reads it."""

    objects: MutableMapping[str, kube.Obj]


class ActionHost(Protocol):
    """What the executor needs of the controller (``reconciler.jobs.JobExtensions``): the client and
    the event recorder, the pod store and the unit's pods, and the controller's memory and timers.
    Its own interface, so the executor never imports the controller that calls it."""

    client: kube.Kube
    events: EventRecorder

    @property
    def pods(self) -> PodStore: ...
    @property
    def unit_written(self) -> kube.OwnWrites: ...
    @property
    def short_since(self) -> dict[str, Mapping[str, float]]: ...
    @property
    def pods_seen_at(self) -> dict[str, float]: ...
    @property
    def report_since(self) -> dict[JobKey, float]: ...
    @property
    def beyond_seen(self) -> dict[str, None]: ...

    def mark(self, key: JobKey, *, urgent: bool = False) -> None: ...
    def forget_report(self, key: JobKey) -> None: ...
    def schedule_check(self, timer: str, key: JobKey, delay: float | None) -> None: ...
    def pods_of(self, unit_key: str, adapter: JobAdapter, job: kube.Obj) -> list[PodView]: ...
    def all_pods_of_job(self, unit_key: str, adapter: JobAdapter, job: kube.Obj) -> list[PodView]: ...


log = logging.getLogger(__name__)

#: After a reclaim met a pod changed since the plan: plan again from fresh state, once the watch
#: delivered it.
REPLAN_SECONDS = 0.2


@dataclass
class _Pass:
    """One execution: the controller, the view decided on, and the unit our last write of it in this
    pass answered (a created unit, or the version a conditional write follows)."""

    host: ActionHost
    view: JobView
    last_unit: kube.Obj | None = None

    @property
    def job(self) -> kube.Obj:
        assert self.view.job is not None, "only a job that exists is acted on"
        return self.view.job

    @property
    def unit(self) -> kube.Obj:
        assert self.view.unit is not None, "only a unit that exists is written"
        return self.view.unit

    @property
    def unit_name(self) -> str:
        return self.view.unit_key.partition("/")[2]

    def version(self, which: steps.Version) -> object:
        """The resourceVersion a unit write is conditional on (``steps.Version``)."""
        seen = (self.unit.get("metadata") or {}).get("resourceVersion")
        if which == "last" and self.last_unit is not None:
            return (self.last_unit.get("metadata") or {}).get("resourceVersion") or seen
        return seen

    def pods_of(self, which: str) -> Callable[[], Sequence[PodView]]:
        """A reader of the pods a hold waits for, read when called (after the suspension)."""
        host, view, job = self.host, self.view, self.job
        if which == "job":
            return lambda: host.all_pods_of_job(view.unit_key, view.adapter, job)
        return lambda: host.pods_of(view.unit_key, view.adapter, job)


async def execute(host: ActionHost, view: JobView, actions: steps.Actions) -> None:
    """Perform ``actions`` in order, stopping at one that ends the pass."""
    run = _Pass(host, view)
    for action in actions:
        if not await _PERFORM[type(action)](run, action):
            return


async def _record_event(run: _Pass, act: steps.RecordEvent) -> bool:
    target = run.job if act.on == "job" else run.unit
    run.host.events.record(target, type_=act.type_, reason=act.reason, message=act.message)
    return True


async def _log(run: _Pass, act: steps.Log) -> bool:
    (log.warning if act.level == "warning" else log.info)("%s", act.message)
    return True


async def _forget_report(run: _Pass, act: steps.ForgetReport) -> bool:
    run.host.forget_report(run.view.key)
    return True


async def _release_orphan(run: _Pass, act: steps.ReleaseOrphan) -> bool:
    await job_units.release_orphan(run.host.client, act.unit, run.view.unit_key, pods_run=False)
    return True


async def _disown(run: _Pass, act: steps.Disown) -> bool:
    await job_units.disown(run.host.client, act.patch, run.view.unit_key, run.view.key)
    return True


async def _hold_escaped(run: _Pass, act: steps.HoldEscaped) -> bool:
    host, view = run.host, run.view
    await job_lifecycle.hold_escaped(host.client, host.events, view.key, view.adapter, run.job)
    return True


async def _set_default_quota(run: _Pass, act: steps.SetDefaultQuota) -> bool:
    key, patch = run.view.key, mandatory.label_patch(run.job, act.quota)
    try:
        await run.host.client.patch(
            job_units.resource_of(run.view.adapter), key.name, patch, namespace=key.namespace
        )
    except (kube.NotFound, kube.Conflict):
        return False  # gone, or changed meanwhile: its watch event brings us back
    return True


async def _create_unit(run: _Pass, act: steps.CreateUnit) -> bool:
    host = run.host
    run.last_unit = await job_units.create_built(
        host.client, host.events, act.unit, run.job, run.view.adapter
    )
    return run.last_unit is not None


async def _finish_adoption(run: _Pass, act: steps.FinishAdoption) -> bool:
    if run.last_unit is not None:
        await job_units.finish_adoption(
            run.host.client, run.last_unit, act.status, suspended=act.suspended, stamped=act.stamped
        )
    return True


async def _patch_unit(run: _Pass, act: steps.PatchUnit) -> bool:
    body = act.patch
    if act.version != "none":
        body = {**act.patch, "metadata": {"resourceVersion": run.version(act.version)}}
    run.last_unit = await run.host.client.patch(
        job_units.QUEUE_UNITS, run.unit_name, body, namespace=run.view.key.namespace
    )
    return True


async def _write_unit_status(run: _Pass, act: steps.WriteUnitStatus) -> bool:
    body = {**act.patch, "metadata": {"resourceVersion": run.version(act.version)}}
    written = await run.host.client.patch(
        job_units.QUEUE_UNITS, run.unit_name, body, namespace=run.view.key.namespace, subresource="status"
    )
    if act.remember:
        run.host.unit_written.wrote(run.view.unit_key, written)
    run.last_unit = written
    return True


async def _hold_then_release(run: _Pass, act: steps.HoldThenRelease) -> bool:
    host, view = run.host, run.view
    written = await job_lifecycle.hold_then_release(
        host.client,
        view.key,
        view.adapter,
        run.job,
        run.unit,
        run.unit_name,
        act.status_patch,
        pods_of=run.pods_of(act.pods),
        hold=act.hold,
        unit_written=host.unit_written,
    )
    if written is None:
        return False  # held; its pods' deletion brings us back
    run.last_unit = written
    return True


async def _recheck(run: _Pass, act: steps.Recheck) -> bool:
    asyncio.get_running_loop().call_later(act.delay + 0.05, run.host.mark, run.view.key)
    return True


async def _schedule_check(run: _Pass, act: steps.ScheduleCheck) -> bool:
    run.host.schedule_check(act.timer, run.view.key, act.delay)
    return True


async def _remember_short_since(run: _Pass, act: steps.RememberShortSince) -> bool:
    memory, unit_key = run.host.short_since, run.view.unit_key
    if act.short_since:
        memory[unit_key] = act.short_since
    else:
        memory.pop(unit_key, None)
    return True


async def _remember_pods_seen_at(run: _Pass, act: steps.RememberPodsSeenAt) -> bool:
    memory, unit_key = run.host.pods_seen_at, run.view.unit_key
    if act.at is None:
        memory.pop(unit_key, None)
    else:
        memory[unit_key] = act.at
    return True


async def _remember_report_since(run: _Pass, act: steps.RememberReportSince) -> bool:
    run.host.report_since[run.view.key] = act.since
    return True


async def _count_requeued_without_pods(run: _Pass, act: steps.CountRequeuedWithoutPods) -> bool:
    metrics.JOBS_WITHOUT_PODS_REQUEUED.labels(kind=run.view.adapter.kind).inc()
    return True


async def _resume_job(run: _Pass, act: steps.ResumeJob) -> bool:
    key = run.view.key
    await run.host.client.patch(
        job_units.resource_of(run.view.adapter), key.name, act.patch, namespace=key.namespace
    )
    return True


async def _delete_pods(run: _Pass, act: steps.DeletePods) -> bool:
    host, view = run.host, run.view
    stale = await job_pods.delete_planned(
        host.client, host.events, host.pods.objects, act.plan, run.job, view.unit_key
    )
    if stale:
        # Plan again from fresh state (once the watch delivered it); no reclaim status yet.
        asyncio.get_running_loop().call_later(REPLAN_SECONDS, host.mark, view.key)
        return False
    return True


async def _report_pod_problems(run: _Pass, act: steps.ReportPodProblems) -> bool:
    job_pods.report_withheld(run.host.events, act.plan, run.job)
    job_pods.report_beyond(run.host.events, act.plan, run.job, run.host.beyond_seen)
    return True


async def _ungate(run: _Pass, act: steps.Ungate) -> bool:
    host, pods = run.host, list(act.pods)
    await workloads.before_ungate(host.client, run.job, run.view.adapter, run.unit, pods)  # native gangs
    placement = act.placement
    refused = await asyncio.gather(
        *(job_pods.ungate(host.client, host.pods.objects, p, placement) for p in pods)
    )
    for pod, why in zip(pods, refused, strict=True):
        if why is not None and placement is not None:  # it stays gated (docs/pools.md#placement)
            message = f"pod {pod.name} stays gated: it cannot run on pool {placement.name}: {why}"
            host.events.record(
                run.job, type_="Warning", reason=job_pods.POOL_PLACEMENT_CONFLICT, message=message
            )
    return True


_PERFORM: dict[type, Callable[[_Pass, Any], Awaitable[bool]]] = {
    steps.RecordEvent: _record_event,
    steps.Log: _log,
    steps.ForgetReport: _forget_report,
    steps.ReleaseOrphan: _release_orphan,
    steps.Disown: _disown,
    steps.HoldEscaped: _hold_escaped,
    steps.SetDefaultQuota: _set_default_quota,
    steps.CreateUnit: _create_unit,
    steps.FinishAdoption: _finish_adoption,
    steps.PatchUnit: _patch_unit,
    steps.WriteUnitStatus: _write_unit_status,
    steps.HoldThenRelease: _hold_then_release,
    steps.Recheck: _recheck,
    steps.ScheduleCheck: _schedule_check,
    steps.RememberShortSince: _remember_short_since,
    steps.RememberPodsSeenAt: _remember_pods_seen_at,
    steps.RememberReportSince: _remember_report_since,
    steps.CountRequeuedWithoutPods: _count_requeued_without_pods,
    steps.ResumeJob: _resume_job,
    steps.DeletePods: _delete_pods,
    steps.ReportPodProblems: _report_pod_problems,
    steps.Ungate: _ungate,
}
