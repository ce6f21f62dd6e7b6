"""The job extensions: the job-facing half of the system (ARCHITECTURE decision 8).

For every managed job of an enabled kind this controller keeps a QueueUnit (created owned by the
job, spec kept in step), resumes the job once its unit is admitted, releases (ungates) at most the
admitted number of pods per pod set, carries out reclaims (deleting unbound pods only), and reports
bound pods and the job's end back into the unit's status. Decisions come from ``shared.jobext``;
this module only reads the informers' stores and writes.

Work is keyed by job: events on the job, its unit or its pods mark the job dirty; a small pool of
workers drains the dirty set so one job is never handled by two workers at once and a burst of
events for the same job costs one reconcile.

Two refinements of "a job and its unit":

* a RayJob's pod sets follow the RayCluster KubeRay created for it (REFERENCE §2.5, S27), so
  RayClusters are watched too (optionally: the CRD may be absent) and a cluster's events mark
  its RayJob;
* a released job whose unit was deleted gets it back admitted (REFERENCE §2.3 step 4): the unit
  is created marked for adoption and its status written right after (``shared.adoption``); a
  marked unit without a status is finished whenever it is met, so a restart in between converges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from reconciler import metrics
from reconciler.events import EventRecorder
from reconciler.informer import Informer, key_of, slim
from shared import adoption, jobext, kube, names, podlinks
from shared.jobs import ray, registry
from shared.jobs.base import Job, JobAdapter, JobSpecError, JobStatus, is_dequeued

log = logging.getLogger(__name__)

QUEUE_UNITS = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
ADMITTED_PHASES = frozenset({names.Phase.DEQUEUED, names.Phase.RUNNING, names.Phase.SCHED_SUCCEED})


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
    ) -> None:
        self.client = client
        self.adapters = {(a.api_version, a.kind): a for a in adapters}
        self.units = units
        self.priority_classes = priority_classes
        self.events = events
        self.workers = workers
        #: the cap on the job's priority annotation (cluster-wide and its quota's), None for none
        self.priority_cap = priority_cap
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
        obj = new or old or {}
        ref = self._unit_ref_of_pod(obj)
        if ref is None:
            return
        key = key_of(obj)
        if new is None:
            self._pods_by_unit.get(ref, set()).discard(key)
        else:
            self._pods_by_unit.setdefault(ref, set()).add(key)
        unit = self.units().get(ref)
        if unit is not None:
            self.on_unit(None, unit)

    # --- workers --------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(self.workers):
                tg.create_task(self._worker(), name=f"job-worker-{i}")

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
        if job is None or not adapter.is_managed(job):
            return  # deletion is garbage collection's job (the unit is owned by the job)
        unit_name = adapter.queue_unit_name(job)
        unit_key = f"{key.namespace}/{unit_name}"
        unit = self.units().get(unit_key)
        status = adapter.job_status(job)
        finished = status in (JobStatus.SUCCEEDED, JobStatus.FAILED)
        live = self._live_cluster(adapter, job)
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
        plan = jobext.plan_pods(unit, pods)
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
            if plan.delete or plan.status:
                self.events.record(
                    unit,
                    type_="Normal",
                    reason=names.EventReason.RECLAIMED,
                    message=names.Message.reclaimed_event(unit_name),
                )
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
        """Execution budget and deactivation (REFERENCE §2.9); True when something was written."""
        now = time.time()
        stamp = now_text()
        rv = (unit.get("metadata") or {}).get("resourceVersion")
        budget = jobext.execution_budget(unit, now=now, now_text=stamp)
        if budget.spec_patch is not None and budget.status_patch is not None:
            await self.client.patch(
                QUEUE_UNITS,
                unit_name,
                {**budget.status_patch, "metadata": {"resourceVersion": rv}},
                namespace=key.namespace,
                subresource="status",
            )
            await self.client.patch(QUEUE_UNITS, unit_name, budget.spec_patch, namespace=key.namespace)
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

    def _pods_of(self, unit_key: str, adapter: JobAdapter, job: kube.Obj) -> list[jobext.PodView]:
        """The unit's pods: those naming it that live in its namespace and belong to its job
        (``shared.podlinks``); a pod elsewhere naming the unit is ignored."""
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
        """Write the status of a unit created for adoption (``shared.adoption``); True if written.

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
