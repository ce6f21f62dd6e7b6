"""The job extensions: the job-facing half of the system
(docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own).

For every managed job of an enabled kind this controller keeps a QueueUnit (created owned by the
job, spec kept in step), resumes the job once its unit is admitted, releases (ungates) at most the
admitted number of pods per pod set, carries out reclaims (deleting unbound pods only), and reports
bound pods and the job's end back into the unit's status. Decisions come from ``shared.jobs.jobext``;
this module only reads the informers' stores and writes.

Work is keyed by job: events on the job, its unit or its pods mark the job dirty; a small pool of
workers drains the dirty set so one job is never handled by two workers at once and a burst of
events for the same job costs one reconcile.

Two refinements of "a job and its unit":

* a RayJob's pod sets follow the RayCluster KubeRay created for it
  (docs/compatibility.md#s27-rayjob-follows-its-live-raycluster), so RayClusters are watched too
  (optionally: the CRD may be absent) and a cluster's events mark its RayJob;
* a released job whose unit was deleted gets it back admitted
  (docs/compatibility.md#adoption-of-released-jobs): the unit is created marked for adoption and its
  status written right after (``shared.jobs.adoption``); a marked unit without a status is finished whenever
  it is met, so a restart in between converges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from reconciler import metrics
from reconciler.events import EventRecorder
from reconciler.informer import Informer, key_of, slim
from shared import kube
from shared.api import names
from shared.jobs import adoption, jobext, podlinks, ray, registry, running_timeout
from shared.jobs.base import Job, JobAdapter, JobSpecError, JobStatus, is_dequeued, is_enqueued

log = logging.getLogger(__name__)

QUEUE_UNITS = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
ADMITTED_PHASES = jobext.ADMITTED_PHASES


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resource_of(adapter: JobAdapter) -> kube.Resource:
    group, _, version = adapter.api_version.rpartition("/")
    return kube.Resource(group, version, adapter.plural, adapter.kind)


@dataclass(frozen=True, slots=True)
class JobKey:
    api_version: str
    kind: str
    namespace: str
    name: str


class JobExtensions:
    """Owns the job and pod informers; reads units from the shared unit store."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        adapters: tuple[JobAdapter, ...],
        units: Callable[[], Mapping[str, kube.Obj]],
        priority_classes: Callable[[], dict[str, int]],
        events: EventRecorder,
        workers: int = 8,
        priority_cap: Callable[[Job], int | None] = lambda job: None,
        running_timeouts: running_timeout.RunningTimeouts | None = None,
        leadership: kube.Leadership | None = None,
    ) -> None:
        self.client = client
        #: closed while following: events of jobs, units and pods only fill the stores and the pod
        #: index, no job is marked (the leader's first pass, ``_take_over``, looks at all of them)
        self.leadership = leadership if leadership is not None else kube.Leadership()
        self.adapters = {(a.api_version, a.kind): a for a in adapters}
        self.units = units
        self.priority_classes = priority_classes
        self.events = events
        self.workers = workers
        #: the cap on the job's priority annotation (cluster-wide and its quota's), None for none
        self.priority_cap = priority_cap
        #: per-extension running, backoff and partial running timeouts (all off by default)
        self.running_timeouts = running_timeouts or running_timeout.RunningTimeouts()
        #: unit key -> pod set -> when its shortfall was first seen (``running_timeout.decide``)
        self._short_since: dict[str, Mapping[str, float]] = {}
        #: the pending running-timeout re-check of each job (one at a time)
        self._timeout_checks: dict[JobKey, asyncio.TimerHandle] = {}
        self.job_informers = {
            (a.api_version, a.kind): Informer(
                client,
                resource_of(a),
                handler=self._on_job(a),
                optional=True,
                transform=job_transform(a),
                packed=True,
            )
            for a in adapters
        }
        self.clusters = self._cluster_informer()
        self.pods = Informer(client, kube.PODS, handler=self._on_pod, transform=slim_pod, packed=True)
        #: unit key ("ns/name") → pod keys, from the related-queueunit annotation
        self._pods_by_unit: dict[str, set[str]] = {}
        self._dirty: dict[JobKey, None] = {}
        #: jobs whose unit was just admitted or that just finished: handled before the rest, so a
        #: burst of new jobs never delays a resume or a quota release (FIFO fell behind by minutes)
        self._urgent: dict[JobKey, None] = {}
        self._wake = asyncio.Event()
        self._busy: set[JobKey] = set()

    # --- event intake ---------------------------------------------------------------------------

    def informers(self) -> list[Informer]:
        own = (
            [self.clusters]
            if self.clusters is not None and self.clusters not in self.job_informers.values()
            else []
        )
        return [*self.job_informers.values(), *own, self.pods]

    def _ray_job_adapter(self) -> JobAdapter | None:
        """The enabled RayJob adapter (one served version at most, see ``registry``)."""
        return next((a for a in self.adapters.values() if isinstance(a, ray.RayJobAdapter)), None)

    def _cluster_informer(self) -> Informer | None:
        """RayClusters, watched when RayJobs are managed: their live replicas raise the RayJob's
        pod sets. The informer of the ``raycluster`` extension is shared when that is enabled
        too (one watch per resource); otherwise an optional one of our own (no CRD: no clusters)."""
        if self._ray_job_adapter() is None:
            return None
        cluster_adapter = ray.RayClusterAdapter()
        shared = self.job_informers.get((cluster_adapter.api_version, cluster_adapter.kind))
        if shared is None:
            return Informer(
                self.client, resource_of(cluster_adapter), handler=self._on_cluster, optional=True
            )
        as_job = shared.handler

        def both(old: kube.Obj | None, new: kube.Obj | None) -> None:
            as_job(old, new)
            self._on_cluster(old, new)

        shared.handler = both
        return shared

    def _on_cluster(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A RayCluster changed (the autoscaler scaled it, it appeared or went): look at its RayJob."""
        adapter = self._ray_job_adapter()
        obj = new or old or {}
        parent = ray.parent_job(obj)
        if adapter is None or parent is None:
            return
        if old is not None and new is not None and ray.cluster_replicas(old) == ray.cluster_replicas(new):
            return  # status churn: nothing the pod sets depend on
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        self.mark(JobKey(adapter.api_version, adapter.kind, namespace, parent))

    def _live_cluster(self, adapter: JobAdapter, job: kube.Obj) -> Job | None:
        if self.clusters is None or not isinstance(adapter, ray.RayJobAdapter):
            return None
        return ray.live_cluster(job, self.clusters.objects)

    def mark_all(self) -> None:
        """Look at every managed job again (after a change that may concern any of them)."""
        for (api_version, kind), informer in self.job_informers.items():
            adapter = self.adapters[(api_version, kind)]
            for job in informer.objects.values():
                if adapter.is_managed(job):
                    meta = job.get("metadata") or {}
                    self.mark(
                        JobKey(api_version, kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
                    )

    def mark(self, key: JobKey, *, urgent: bool = False) -> None:
        if not self.leadership.leading:
            return  # a follower queues no work: it would pile up, and be stale on take-over
        if urgent:
            self._urgent[key] = None
        else:
            self._dirty[key] = None
        self._wake.set()

    def _on_job(self, adapter: JobAdapter) -> Callable[[kube.Obj | None, kube.Obj | None], None]:
        def handle(old: kube.Obj | None, new: kube.Obj | None) -> None:
            obj = new or old or {}
            meta = obj.get("metadata") or {}
            if (
                new is not None
                and not adapter.is_managed(new)
                and (old is None or not adapter.is_managed(old))
            ):
                return
            finished = new is not None and adapter.job_status(new) in (JobStatus.SUCCEEDED, JobStatus.FAILED)
            self.mark(
                JobKey(
                    adapter.api_version,
                    adapter.kind,
                    str(meta.get("namespace", "")),
                    str(meta.get("name", "")),
                ),
                urgent=finished,
            )

        return handle

    def on_unit(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """Called by the unit informer (owned by the scheduler side)."""
        obj = new or old or {}
        if new is None:
            self._short_since.pop(key_of(obj), None)  # running-timeout memory of a deleted unit
            self._prune_pod_index(key_of(obj))
        ref = (obj.get("spec") or {}).get("consumerRef") or {}
        api_version, kind = ref.get("apiVersion"), ref.get("kind")
        if (api_version, kind) not in self.adapters:
            return
        namespace = ref.get("namespace") or (obj.get("metadata") or {}).get("namespace", "")
        admitted = new is not None and (new.get("status") or {}).get("phase") in ADMITTED_PHASES
        self.mark(
            JobKey(str(api_version), str(kind), str(namespace), str(ref.get("name", ""))), urgent=admitted
        )

    def _unit_ref_of_pod(self, pod: kube.Obj) -> str | None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        ref = annotations.get(names.RELATED_QUEUEUNIT_ANNOTATION)
        return ref if isinstance(ref, str) and ref else None

    def _on_pod(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """Keep the pod index exact (a pod leaves its old unit's set when it is deleted or names
        another unit; an emptied set is dropped) and look at the units concerned."""
        old_ref = self._unit_ref_of_pod(old) if old is not None else None
        new_ref = self._unit_ref_of_pod(new) if new is not None else None
        if old_ref is None and new_ref is None:
            return
        key = key_of(new or old or {})
        if old_ref is not None and old_ref != new_ref:
            self._unindex_pod(old_ref, key)
        if new_ref is not None:
            self._pods_by_unit.setdefault(new_ref, set()).add(key)
        for ref in dict.fromkeys(r for r in (old_ref, new_ref) if r is not None):
            unit = self.units().get(ref)
            if unit is not None:
                self.on_unit(None, unit)

    def _unindex_pod(self, unit_key: str, pod_key: str) -> None:
        pods = self._pods_by_unit.get(unit_key)
        if pods is not None:
            pods.discard(pod_key)
            if not pods:
                del self._pods_by_unit[unit_key]

    def _prune_pod_index(self, unit_key: str) -> None:
        """A unit went away: forget its pods that are gone too. Pods still in the store keep naming
        it and stay indexed: a unit re-created under the same key (adoption) finds them at once,
        and they leave with their own deletion events."""
        pods = self._pods_by_unit.get(unit_key)
        if pods is None:
            return
        pods.intersection_update([k for k in pods if k in self.pods.objects])
        if not pods:
            del self._pods_by_unit[unit_key]

    # --- workers --------------------------------------------------------------------------------

    async def run(self) -> None:
        """The workers; runs only while leading (``reconciler/main.py``)."""
        self._take_over()
        async with asyncio.TaskGroup() as tg:
            for i in range(self.workers):
                tg.create_task(self._worker(), name=f"job-worker-{i}")

    def _take_over(self) -> None:
        """The first pass of a new leader: every managed job, and the consumer of every unit (a
        unit whose job is gone is found only this way), since a follower marked nothing."""
        self.mark_all()
        for unit in self.units().values():
            self.on_unit(None, unit)

    async def _worker(self) -> None:
        while True:
            key = self._next()
            if key is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._busy.add(key)
            try:
                await self.reconcile(key)
            except kube.Conflict:
                self.mark(key)  # someone wrote in between: look again with fresh objects
            except kube.KubeError as err:
                log.warning("job %s/%s: %s; will retry", key.namespace, key.name, err)
                asyncio.get_running_loop().call_later(1.0, self.mark, key)
            except Exception:
                log.exception("job %s/%s: reconcile failed", key.namespace, key.name)
            finally:
                self._busy.discard(key)
                if self._dirty or self._urgent:
                    self._wake.set()

    def _next(self) -> JobKey | None:
        for queue in (self._urgent, self._dirty):
            for key in queue:
                if key not in self._busy:
                    del queue[key]
                    self._dirty.pop(key, None)
                    return key
        return None

    # --- one job --------------------------------------------------------------------------------

    async def reconcile(self, key: JobKey) -> None:
        adapter = self.adapters[(key.api_version, key.kind)]
        store = self.job_informers[(key.api_version, key.kind)].objects
        job = store.get(f"{key.namespace}/{key.name}")
        if job is None:
            # A unit left behind by a job deleted with --cascade=orphan; any other unit of a
            # deleted job still has its owner reference, and garbage collection deletes it.
            gone_key = f"{key.namespace}/{adapter.queue_unit_name({'metadata': {'name': key.name}})}"
            gone = self.units().get(gone_key)
            if gone is not None and orphaned(gone, key, None):
                await self._release_orphan(gone, gone_key, None)
            return
        if not adapter.is_managed(job):
            return
        unit_name = adapter.queue_unit_name(job)
        unit_key = f"{key.namespace}/{unit_name}"
        unit = self.units().get(unit_key)
        if unit is not None and orphaned(unit, key, job):
            await self._release_orphan(unit, unit_key, job)
            return  # a predecessor's unit: its deletion brings us back to create this job's own
        if unit is not None and owned_by_another(unit, key, job):
            return  # a predecessor's unit, which garbage collection deletes: that brings us back
        live = self._live_cluster(adapter, job)
        status = ray.hold_while_cluster_lives(adapter.job_status(job), live)
        finished = status in (JobStatus.SUCCEEDED, JobStatus.FAILED)
        suspended, stamped = adapter.is_suspended(job), is_dequeued(job)
        if adoption.escaped_hold(status, suspended=suspended, stamped=stamped):
            await self._hold_escaped(key, adapter, job)
            return  # the job's update brings us back
        if unit is None:
            if not finished and (job.get("metadata") or {}).get("deletionTimestamp") is None:
                adopt = adoption.needs_adoption(status, suspended=suspended, stamped=stamped)
                await self._create_unit(job, adapter, live_cluster=live, adopt=adopt)
            return
        if await self._finish_adoption(unit, status, suspended=suspended, stamped=stamped):
            return  # the unit's update brings us back
        desired = None
        if not finished:  # a finished job's pod sets shrink to 0: nothing left to keep in step
            with contextlib.suppress(JobSpecError):
                desired = jobext.desired_spec(
                    job,
                    adapter,
                    self.priority_classes(),
                    live_cluster=live,
                    max_user_priority=self.priority_cap(job),
                )
        if desired is not None:
            drift = jobext.spec_drift(unit, desired)
            if drift is not None:
                await self.client.patch(QUEUE_UNITS, unit_name, drift, namespace=key.namespace)
        if not finished and await self._lifecycle(key, adapter, job, unit, unit_name):
            return  # the unit's update brings us back
        # Before the resume below: a job held by a running timeout whose unit write failed must be
        # decided again, not released again (see ``_running_timeout``).
        if not finished and await self._running_timeout(key, adapter, job, unit, unit_name, unit_key):
            return  # the unit's update brings us back
        phase = (unit.get("status") or {}).get("phase", "")
        if phase in ADMITTED_PHASES and not finished and adapter.is_suspended(job):
            await self.client.patch(
                resource_of(adapter),
                key.name,
                adapter.resume_patch(job, now_text=now_text()),
                namespace=key.namespace,
            )
            return  # the job's update brings us back with fresh objects
        pods = self._pods_of(unit_key, adapter, job)
        plan = jobext.plan_pods(unit, pods, now_text=now_text())
        stale = False
        for pod in plan.delete:
            if await self._reclaim_pod(pod):
                metrics.RECLAIMED_PODS.inc()
                log.info("reclaim: deleted unbound pod %s/%s of %s", pod.namespace, pod.name, unit_key)
            elif pod_key_of(pod) in self.pods.objects:
                stale = True
        for pod in plan.unadmitted:
            if await self._reclaim_pod(pod):
                log.warning(
                    "deleted pod %s/%s of %s: released without admission", pod.namespace, pod.name, unit_key
                )
                self.events.record(
                    job,
                    type_="Warning",
                    reason=names.EventReason.UNADMITTED_POD_DELETED,
                    message=names.Message.unadmitted_pod_deleted(pod.name),
                )
            elif pod_key_of(pod) in self.pods.objects:
                stale = True
        if stale:
            # Plan again from fresh state (once the watch delivered it); no reclaim status yet.
            asyncio.get_running_loop().call_later(0.2, self.mark, key)
            return
        if plan.status is not None:
            body = {
                **plan.status,
                "metadata": {"resourceVersion": (unit.get("metadata") or {}).get("resourceVersion")},
            }
            await self.client.patch(
                QUEUE_UNITS, unit_name, body, namespace=key.namespace, subresource="status"
            )
            # No event here: the scheduler records Reclaimed when it sees the reclaim done and
            # replicas taken back (shared.core.scheduling.reclaim_took_back), for bare units too.
            return  # the unit's update brings us back
        await asyncio.gather(*(self._ungate(p) for p in plan.ungate))
        if adapter.kind == "Job" and status == JobStatus.RUNNING and not any(p.bound for p in pods):
            status = JobStatus.PENDING  # active pods that are all gated or unbound are not running
        patch = jobext.report(unit, pods, status, now_text=now_text())
        if patch is not None:
            body = {
                **patch,
                "metadata": {"resourceVersion": (unit.get("metadata") or {}).get("resourceVersion")},
            }
            await self.client.patch(
                QUEUE_UNITS, unit_name, body, namespace=key.namespace, subresource="status"
            )

    async def _lifecycle(
        self, key: JobKey, adapter: JobAdapter, job: kube.Obj, unit: kube.Obj, unit_name: str
    ) -> bool:
        """Execution budget and deactivation (docs/compatibility.md#activation-and-execution-budget);
        True when something was written."""
        now = time.time()
        stamp = now_text()
        rv = (unit.get("metadata") or {}).get("resourceVersion")
        budget = jobext.execution_budget(unit, now=now, now_text=stamp)
        if budget.spec_patch is not None and budget.status_patch is not None:
            # The spec first: once ``spec.active`` is false the unit is parked by ``deactivation``
            # whatever happens next, so a failed second write can never leave the job running
            # with its budget clock stopped (the other order could). The status write then
            # follows the version the spec write made.
            updated = await self.client.patch(
                QUEUE_UNITS, unit_name, budget.spec_patch, namespace=key.namespace
            )
            rv = (updated.get("metadata") or {}).get("resourceVersion") or rv
            await self.client.patch(
                QUEUE_UNITS,
                unit_name,
                {**budget.status_patch, "metadata": {"resourceVersion": rv}},
                namespace=key.namespace,
                subresource="status",
            )
            seconds = (unit.get("spec") or {}).get("maximumExecutionTimeSeconds")
            self.events.record(
                job,
                type_="Warning",
                reason=names.EventReason.MAX_EXEC_TIME_EXCEEDED,
                message=f"The maximum execution time ({seconds}s) was exceeded",
            )
            return True
        if budget.remaining is not None:
            asyncio.get_running_loop().call_later(budget.remaining + 0.05, self.mark, key)
        parked = jobext.deactivation(unit, now=now, now_text=stamp)
        if parked is None:
            return False
        if not adapter.is_suspended(job):
            await self.client.patch(
                resource_of(adapter), key.name, adapter.suspend_merge_patch(job), namespace=key.namespace
            )
        await self.client.patch(
            QUEUE_UNITS,
            unit_name,
            {**parked, "metadata": {"resourceVersion": rv}},
            namespace=key.namespace,
            subresource="status",
        )
        self.events.record(
            job,
            type_="Normal",
            reason=names.EventReason.DEACTIVATED,
            message="Job is suspended and its resources are reclaimed because the queue unit is deactivated",
        )
        return True

    async def _running_timeout(
        self,
        key: JobKey,
        adapter: JobAdapter,
        job: kube.Obj,
        unit: kube.Obj,
        unit_name: str,
        unit_key: str,
    ) -> bool:
        """Running timeout, backoff and partial running timeout (docs/compatibility.md#running-timeout),
        decided by ``shared.jobs.running_timeout``; True when something was written.

        Order of the two writes of a backoff: the job is suspended first, the unit's status
        (TimeoutBackoff, admissions cleared) second. The status write is what frees the quota, so
        the quota is never handed to another job while this one can still start pods. If the second
        write fails, the unit still holds its quota with its job held; the next pass (this step runs
        before the resume step) decides the same timeout again and only writes the status. The other
        order would free the quota of a still-released job whenever the suspension failed, and its
        pods could then be bound uncharged.
        """
        timeouts = self.running_timeouts.for_extension(adapter.extension)
        if not timeouts.enabled:
            return False
        now = time.time()
        decision = running_timeout.decide(
            unit,
            self._pods_of(unit_key, adapter, job),
            timeouts,
            now=now,
            now_text=now_text(),
            jitter=random.random(),
            short_since=self._short_since.get(unit_key),
        )
        if decision.short_since:
            self._short_since[unit_key] = decision.short_since
        else:
            self._short_since.pop(unit_key, None)
        self._check_again(key, decision.recheck_in)
        if decision.status_patch is None:
            return False
        if decision.suspend and not adapter.is_suspended(job):
            await self.client.patch(
                resource_of(adapter), key.name, adapter.suspend_merge_patch(job), namespace=key.namespace
            )
        rv = (unit.get("metadata") or {}).get("resourceVersion")
        await self.client.patch(
            QUEUE_UNITS,
            unit_name,
            {**decision.status_patch, "metadata": {"resourceVersion": rv}},
            namespace=key.namespace,
            subresource="status",
        )
        log.info("%s %s: %s", decision.event_reason, unit_key, decision.event_message)
        for obj in (unit, job):
            self.events.record(
                obj, type_="Warning", reason=decision.event_reason, message=decision.event_message
            )
        return True

    def _check_again(self, key: JobKey, delay: float | None) -> None:
        """Look at the job again in ``delay`` seconds (replacing any earlier re-check), or never."""
        pending = self._timeout_checks.pop(key, None)
        if pending is not None:
            pending.cancel()
        if delay is not None:

            def due() -> None:
                self._timeout_checks.pop(key, None)
                self.mark(key)

            self._timeout_checks[key] = asyncio.get_running_loop().call_later(delay + 0.05, due)

    async def _release_orphan(self, unit: kube.Obj, unit_key: str, job: kube.Obj | None) -> None:
        """Release an orphaned unit (:func:`orphaned`) by deleting it, once none of its pods runs.

        A job deleted with ``kubectl delete --cascade=orphan`` leaves its unit behind without an
        owner: the garbage collector never deletes it, and an admitted one would hold its quota for
        good. Deleting it gives the quota back as a finished job's ``admissions: []`` does (the
        scheduler stops charging a unit that is gone, exactly as one that holds nothing), frees the
        name for a new job of the same name (the usual reason for orphaning: re-create a job with
        a changed spec), and leaves no ownerless unit in ``kubectl get qu``; a terminal phase would
        keep that ghost forever and block the name. The orphaned pods keep running on their
        nodes, though, so the unit stays (still charged) until none of them runs: a tenant cannot
        run pods outside the quota by orphaning them (docs/architecture.md#trust-boundaries).

        The delete is conditional on the unit's UID and version: a unit re-created or changed
        meanwhile is looked at again.
        """
        if self._orphaned_pods_run(unit_key, _uid_of(job)):
            return  # the pods' events bring us back
        meta = unit.get("metadata") or {}
        namespace, _, name = unit_key.partition("/")
        try:
            await self.client.delete(
                QUEUE_UNITS,
                name,
                namespace=namespace,
                precondition_uid=str(meta.get("uid") or "") or None,
                precondition_rv=str(meta.get("resourceVersion") or "") or None,
            )
        except kube.NotFound:
            return
        ref = (unit.get("spec") or {}).get("consumerRef") or {}
        log.info("released QueueUnit %s: its %s %s is gone", unit_key, ref.get("kind"), ref.get("name"))

    def _orphaned_pods_run(self, unit_key: str, job_uid: str | None) -> bool:
        """Does a pod of an orphaned unit still run, or is it released to run? Its job is gone, so
        its pods are the ones naming the unit in the unit's namespace, except pods of the live job
        of the same name (``job_uid``), if any. A pod still gated never ran and never will."""
        namespace = unit_key.partition("/")[0]
        parent = self._parent_lookup(namespace)
        for pod_key in sorted(self._pods_by_unit.get(unit_key, ())):
            pod = self.pods.objects.get(pod_key)
            if pod is None or (pod.get("metadata") or {}).get("namespace") != namespace:
                continue
            if job_uid and podlinks.owned_by(pod, job_uid, parent):
                continue
            view = jobext.pod_view(pod, "")
            if view.live and (view.bound or not view.gated):
                return True
        return False

    def _pods_of(self, unit_key: str, adapter: JobAdapter, job: kube.Obj) -> list[jobext.PodView]:
        """The unit's pods: those naming it that live in its namespace and belong to its job
        (``shared.jobs.podlinks``); a pod elsewhere naming the unit is ignored."""
        namespace = unit_key.partition("/")[0]
        job_uid = str((job.get("metadata") or {}).get("uid") or "")
        views = []
        for pod_key in sorted(self._pods_by_unit.get(unit_key, ())):
            pod = self.pods.objects.get(pod_key)
            if pod is None:
                continue
            if not podlinks.counts_for(
                pod, unit_namespace=namespace, job_uid=job_uid, parent=self._parent_lookup(namespace)
            ):
                continue
            pod_set = adapter.pod_set_of(pod)
            if pod_set:
                views.append(jobext.pod_view(pod, pod_set))
        return views

    def _parent_lookup(self, namespace: str) -> podlinks.ParentLookup:
        """Owners that stand between a job and its pods: a RayJob's RayCluster, a Spark driver pod."""

        def parent(kind: str, name: str) -> Mapping[str, Any] | None:
            if kind == "Pod":
                return self.pods.objects.get(f"{namespace}/{name}")
            if kind == "RayCluster" and self.clusters is not None:
                return self.clusters.objects.get(f"{namespace}/{name}")
            return None

        return parent

    async def _hold_escaped(self, key: JobKey, adapter: JobAdapter, job: kube.Obj) -> None:
        """Suspend a managed job that runs without the reconciler's admission (``adoption.escaped_hold``).

        Conditional on the job's resourceVersion, so a release by the reconciler racing with this
        (impossible today: it stamps in the same write) could never be undone by a stale view.
        """
        meta = job.get("metadata") or {}
        body = {**adapter.suspend_merge_patch(job)}
        body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": meta.get("resourceVersion")}
        await self.client.patch(resource_of(adapter), key.name, body, namespace=key.namespace)
        log.warning("held %s %s/%s: it ran without being admitted", adapter.kind, key.namespace, key.name)
        self.events.record(
            job,
            type_="Warning",
            reason=names.EventReason.HELD_UNADMITTED,
            message=names.Message.HELD_UNADMITTED,
        )

    async def _create_unit(
        self, job: kube.Obj, adapter: JobAdapter, *, live_cluster: Job | None, adopt: bool
    ) -> None:
        """Create the job's unit; for a released job (``adopt``) finish its adoption at once."""
        meta = job.get("metadata") or {}
        try:
            unit = jobext.build_queue_unit(
                job,
                adapter,
                self.priority_classes(),
                live_cluster=live_cluster,
                adopted=adopt,
                max_user_priority=self.priority_cap(job),
            )
        except JobSpecError as err:
            self.events.record(
                job, type_="Warning", reason="InvalidJob", message=f"cannot queue this {adapter.kind}: {err}"
            )
            return
        try:
            created = await self.client.create(QUEUE_UNITS, unit, namespace=str(meta.get("namespace", "")))
        except kube.Conflict as err:
            if err.reason != "AlreadyExists":
                raise
            return  # our store lagged; the unit's event brings us back
        except kube.Invalid as err:
            self.events.record(
                job,
                type_="Warning",
                reason="InvalidJob",
                message=f"cannot create the QueueUnit for this {adapter.kind}: {err.message}",
            )
            return
        if adopt:
            log.info(
                "adopted %s/%s: its unit was missing while the job runs",
                meta.get("namespace"),
                meta.get("name"),
            )
            await self._finish_adoption(
                created,
                adapter.job_status(job),
                suspended=adapter.is_suspended(job),
                stamped=is_dequeued(job),
            )

    async def _finish_adoption(
        self, unit: kube.Obj, status: JobStatus, *, suspended: bool, stamped: bool
    ) -> bool:
        """Write the status of a unit created for adoption (``shared.jobs.adoption``); True if written.

        Conditional on the unit's resourceVersion: a conflict means someone else wrote first, and
        the worker looks again with fresh objects.
        """
        patch = adoption.completion_status(
            unit, status, suspended=suspended, stamped=stamped, now_text=now_text()
        )
        if patch is None:
            return False
        meta = unit.get("metadata") or {}
        body = {**patch, "metadata": {"resourceVersion": meta.get("resourceVersion")}}
        await self.client.patch(
            QUEUE_UNITS,
            str(meta.get("name", "")),
            body,
            namespace=str(meta.get("namespace", "")),
            subresource="status",
        )
        return True

    async def _reclaim_pod(self, pod: jobext.PodView) -> bool:
        """Delete one unbound pod of a reclaim; False when it is gone or changed since we looked.

        Every write is conditional on the resourceVersion we saw unbound, so a pod the scheduler
        binds meanwhile is never deleted. A Job controller pod first loses its tracking finalizer:
        otherwise the Job controller counts the deletion as a pod failure, and a preempted Job with
        ``backoffLimit: 0`` would end Failed instead of waiting for its next admission. Without the
        finalizer the deletion is uncounted and the Job creates a replacement, gated like the first.
        """
        rv = pod.resource_version or None
        current = self.pods.objects.get(pod_key_of(pod)) or {}
        finalizers = (current.get("metadata") or {}).get("finalizers") or []
        untracked = False
        if names.JOB_TRACKING_FINALIZER in finalizers and rv is not None:
            index = finalizers.index(names.JOB_TRACKING_FINALIZER)
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {
                    "op": "test",
                    "path": f"/metadata/finalizers/{index}",
                    "value": names.JOB_TRACKING_FINALIZER,
                },
                {"op": "remove", "path": f"/metadata/finalizers/{index}"},
            ]
            try:
                updated = await self.client.patch(
                    kube.PODS, pod.name, ops, namespace=pod.namespace, content_type=kube.JSON_PATCH
                )
            except (kube.NotFound, kube.Invalid, kube.Conflict):
                return False  # a failed test answers 422: the pod changed, plan again
            rv = str((updated.get("metadata") or {}).get("resourceVersion") or "") or None
            untracked = True
        try:
            await self.client.delete(
                kube.PODS, pod.name, namespace=pod.namespace, precondition_uid=pod.uid, precondition_rv=rv
            )
        except kube.NotFound:
            return False
        except kube.Conflict:
            if untracked:
                # Bound between our two writes: it runs, so the Job controller must count it again.
                with contextlib.suppress(kube.NotFound, kube.Invalid, kube.Conflict):
                    await self.client.patch(
                        kube.PODS,
                        pod.name,
                        [
                            {
                                "op": "add",
                                "path": "/metadata/finalizers/-",
                                "value": names.JOB_TRACKING_FINALIZER,
                            }
                        ],
                        namespace=pod.namespace,
                        content_type=kube.JSON_PATCH,
                    )
            return False
        return True

    async def _ungate(self, pod: jobext.PodView) -> None:
        current = self.pods.objects.get(f"{pod.namespace}/{pod.name}")
        gates: list[Any] = ((current or {}).get("spec") or {}).get("schedulingGates") or []
        index = next((i for i, g in enumerate(gates) if g.get("name") == names.ADMISSION_GATE), None)
        if index is None:
            return
        ops = [
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": names.ADMISSION_GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
        ]
        with contextlib.suppress(kube.NotFound, kube.Invalid, kube.Conflict):
            updated = await self.client.patch(
                kube.PODS, pod.name, ops, namespace=pod.namespace, content_type=kube.JSON_PATCH
            )
            # Assume the write at once, so a reconcile before the watch catches up does not
            # pick another pod to release; but never over a newer version the watch delivered
            # meanwhile (a stale "unbound" copy could make a running pod look reclaimable).
            pod_key = f"{pod.namespace}/{pod.name}"
            latest = self.pods.objects.get(pod_key)
            if latest is not None and _rv_of(latest) == _rv_of(current):
                self.pods.objects[pod_key] = slim_pod(updated)


def _names_consumer(unit: kube.Obj, key: JobKey) -> bool:
    ref = (unit.get("spec") or {}).get("consumerRef") or {}
    namespace = ref.get("namespace") or (unit.get("metadata") or {}).get("namespace")
    return (ref.get("kind"), ref.get("name"), namespace) == (key.kind, key.name, key.namespace)


def _owners(unit: kube.Obj, key: JobKey) -> list[str]:
    """UIDs of the unit's owner references to a job of ``key``'s kind and name."""
    return [uid for kind, name, uid in podlinks.owner_uids(unit) if (kind, name) == (key.kind, key.name)]


def orphaned(unit: kube.Obj, key: JobKey, job: kube.Obj | None) -> bool:
    """``unit`` was made for a job called like ``key`` that was deleted with ``--cascade=orphan``.

    The job extension creates every unit owned by its job; the garbage collector removes that
    owner reference only when the job is deleted with orphan propagation. So a unit naming the job
    as its consumer, without an owner reference to it, carrying the webhook's enqueue stamp
    (copied from the job it was made from) is orphaned when no such job exists, or when the job
    of that name (``job``) is younger than the unit: a unit is never made before its job. A unit
    without the stamp was created directly and stands on its own
    (docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own), never ours to release.
    """
    if not _names_consumer(unit, key) or _owners(unit, key) or not is_enqueued(unit):
        return False
    if job is None:
        return True
    made = str((unit.get("metadata") or {}).get("creationTimestamp") or "")
    born = str((job.get("metadata") or {}).get("creationTimestamp") or "")
    return bool(made and born and made < born)  # RFC 3339 in UTC: ordered as text


def owned_by_another(unit: kube.Obj, key: JobKey, job: kube.Obj) -> bool:
    """``unit`` still belongs to an earlier job of ``job``'s name, deleted (only one job has a name
    at a time): garbage collection deletes it, and ``job`` must neither use its admission nor
    take it for its own."""
    owners = _owners(unit, key)
    return _names_consumer(unit, key) and bool(owners) and _uid_of(job) not in owners


def _uid_of(obj: kube.Obj | None) -> str | None:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "") or None


def _rv_of(obj: kube.Obj | None) -> object:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def slim_pod(pod: kube.Obj) -> kube.Obj:
    return jobext.slim_pod(slim(pod))


def _slim_batch_job(job: kube.Obj) -> kube.Obj:
    return jobext.slim_batch_job(slim(job))


def job_transform(adapter: JobAdapter) -> Callable[[kube.Obj], kube.Obj]:
    """What a job informer keeps: ``batch/v1`` Jobs lose the non-scheduling part of their pod
    template (most of a Job's memory); other kinds keep their whole spec, which their adapters
    read in more places."""
    return _slim_batch_job if (adapter.api_version, adapter.kind) == ("batch/v1", "Job") else slim


def pod_key_of(pod: jobext.PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def default_adapters() -> tuple[JobAdapter, ...]:
    return registry.enabled_adapters(registry.DEFAULT_EXTENSIONS)
