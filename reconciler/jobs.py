"""The job extensions: the job-facing half of the system
(docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own).

For every managed job of an enabled kind this controller keeps a QueueUnit (created owned by the
job, spec kept in step), resumes the job once its unit is admitted, releases (ungates) at most the
admitted number of pods per pod set, carries out reclaims (deleting unbound pods only), and reports
bound pods and the job's end back into the unit's status.

Each job's pass has the scheduler's shape (docs/architecture.md#the-job-path-view-decide-act):
:meth:`JobExtensions.view` builds one view of the job from the stores, ``shared.jobs.jobpath.decide``
(pure) answers the actions in order, and ``reconciler.job_actions`` performs them; the writes
themselves live in ``reconciler.job_units`` (the unit's creation, adoption and orphans),
``reconciler.job_pods`` (pod reclaims and ungates) and ``reconciler.job_lifecycle`` (holding a job
before its quota is given back). This module keeps the state (stores, pod index, work queue, the
timeouts' memory and re-checks), takes events in and runs each job's pass.

Work is keyed by job: events on the job, its unit or its pods mark the job dirty; a small pool of
workers drains the dirty set so one job is never handled by two workers at once and a burst of
events for the same job costs one reconcile.

Three refinements of "a job and its unit":

* a RayJob's pod sets follow the RayCluster KubeRay created for it
  (docs/compatibility.md#s27-rayjob-follows-its-live-raycluster), so RayClusters are watched too
  (optionally: the CRD may be absent) and a cluster's events mark its RayJob;
* an MPIJob's launcher and a JobSet's pods are owned by ``batch/v1`` Jobs their controllers create
  (``pods_through_jobs``), so Jobs are watched too (the ``job`` extension's informer when it is
  enabled) to link those pods to the unit, and a child Job that appears marks its parent, whose
  pods may have been seen before it (docs/compatibility.md#pod-gating);
* a released job whose unit was deleted gets it back admitted
  (docs/compatibility.md#adoption-of-released-jobs): the unit is created marked for adoption and its
  status written right after (``shared.jobs.adoption``); a marked unit without a status is finished whenever
  it is met, so a restart in between converges.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from koord_queue.reconciler import job_actions, job_pods, job_units
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.informer import Informer, key_of, slim
from koord_queue.reconciler.job_units import JobKey
from koord_queue.shared import kube
from koord_queue.shared.api.model import Quota
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.core import mandatory
from koord_queue.shared.jobs import (
    batch_job,
    jobext,
    jobpath,
    poddefaults,
    podplan,
    ray,
    registry,
    running_timeout,
    stranded,
)
from koord_queue.shared.jobs.base import Job, JobAdapter, JobStatus, owner_kinds

log = logging.getLogger(__name__)

_BATCH_JOB: Final = (batch_job.BatchJobAdapter.api_version, batch_job.BatchJobAdapter.kind)
#: After a 409 the watch event of the write we lost to marks the job again; this is only the net
#: for a watch that never delivers it.
CONFLICT_RECHECK_SECONDS: Final = 1.0


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
        allowed_priority_classes: Callable[[Job], frozenset[str] | None] = lambda job: None,
        default_priority_class: Callable[[], str | None] = lambda: None,
        running_timeouts: running_timeout.RunningTimeouts | None = None,
        leadership: kube.Leadership | None = None,
        mandatory_queueing: mandatory.MandatoryQueueing | None = None,
        quotas: Callable[[], Iterable[Quota]] = lambda: (),
        pools: Callable[[str], PoolPlacement | None] = lambda name: None,
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
        #: the PriorityClasses the job's quota allows, None for every class
        #: (docs/compatibility.md#priority-cap)
        self.allowed_priority_classes = allowed_priority_classes
        #: the cluster's globalDefault PriorityClass, None for none
        self.default_priority_class = default_priority_class
        #: per-extension running, backoff and partial running timeouts (all off by default)
        self.running_timeouts = running_timeouts or running_timeout.RunningTimeouts()
        #: unit key -> pod set -> when its shortfall was first seen (``running_timeout.decide``)
        self._short_since: dict[str, Mapping[str, float]] = {}
        #: the pending running-timeout re-check of each job (one at a time)
        self._timeout_checks: dict[JobKey, asyncio.TimerHandle] = {}
        #: unit key -> when a pod of it was last seen, and each job's pending re-check, for the
        #: jobs left without pods (``shared.jobs.stranded``)
        self._pods_seen_at: dict[str, float] = {}
        self._no_pods_checks: dict[JobKey, asyncio.TimerHandle] = {}
        #: UIDs of pods counted as running beyond their admission (``job_pods.report_beyond``)
        self._beyond_seen: dict[str, None] = {}
        #: jobs whose pod-count report is waiting (``podplan.can_wait``): since when, and the re-check
        self._report_since: dict[JobKey, float] = {}
        self._report_checks: dict[JobKey, asyncio.TimerHandle] = {}
        #: our last status write of each unit, until the watch delivers it: a report planned on the
        #: older copy would repeat one already written and only earn a 409
        self._unit_written = kube.OwnWrites()
        self.job_informers = {
            (a.api_version, a.kind): Informer(
                client,
                job_units.resource_of(a),
                handler=self._on_job(a),
                optional=True,
                transform=job_transform(a),
                packed=True,
            )
            for a in adapters
        }
        self.clusters = self._cluster_informer()
        #: (API group, kind) → adapter, for the enabled kinds whose pods are owned by child Jobs
        self._job_parents = {
            (a.api_version.split("/")[0], a.kind): a for a in adapters if a.pods_through_jobs
        }
        self.child_jobs = self._child_job_informer()
        self.pods = Informer(
            client, kube.PODS, handler=self._on_pod, transform=job_pods.slim_pod, packed=True
        )
        #: what the apiserver fills into pods (docs/compatibility.md#requests-the-apiserver-fills-in)
        self.limit_ranges = Informer(client, kube.LIMIT_RANGES, handler=self._on_limit_range)
        self.runtime_classes = Informer(client, kube.RUNTIME_CLASSES, handler=self._on_runtime_class)
        #: namespaces where unlabelled jobs are queued too (docs/operations.md#mandatory-queueing);
        #: their labels are watched only when the switch is on
        self.mandatory_queueing = mandatory_queueing or mandatory.MandatoryQueueing()
        self.quotas = quotas
        #: a pool's placement by name, None while unknown (docs/pools.md#placement)
        self.pools = pools
        self.namespaces = (
            Informer(client, kube.NAMESPACES, handler=self._on_namespace)
            if self.mandatory_queueing.enabled
            else None
        )
        #: namespace → its fill-ins, computed on first use after a change
        self._defaults: dict[str, poddefaults.PodDefaults] = {}
        #: unit key ("ns/name") → pod keys, from the related-queueunit annotation
        self._pods_by_unit: dict[str, set[str]] = {}
        #: batch/v1 Job UID → keys of the pods it controls, named unit or not: the jobs-without-pods
        #: clock counts them all (``job_pods.all_pods_of_job``)
        self._pods_by_controller: dict[str, set[str]] = {}
        self._dirty: dict[JobKey, None] = {}
        #: jobs whose unit was just admitted or that just finished: handled before the rest, so a
        #: burst of new jobs never delays a resume or a quota release (FIFO fell behind by minutes)
        self._urgent: dict[JobKey, None] = {}
        self._wake = asyncio.Event()
        self._busy: set[JobKey] = set()

    # --- the memory the job path's executor updates (``reconciler.job_actions``) -------------------

    @property
    def unit_written(self) -> kube.OwnWrites:
        return self._unit_written

    @property
    def short_since(self) -> dict[str, Mapping[str, float]]:
        return self._short_since

    @property
    def pods_seen_at(self) -> dict[str, float]:
        return self._pods_seen_at

    @property
    def report_since(self) -> dict[JobKey, float]:
        return self._report_since

    @property
    def beyond_seen(self) -> dict[str, None]:
        return self._beyond_seen

    # --- event intake ---------------------------------------------------------------------------

    def informers(self) -> list[Informer]:
        shared = list(self.job_informers.values())
        own = [
            i for i in (self.clusters, self.child_jobs, self.namespaces) if i is not None and i not in shared
        ]
        return [*shared, *own, self.pods, self.limit_ranges, self.runtime_classes]

    def pod_defaults(self, namespace: str) -> poddefaults.PodDefaults:
        """What the apiserver fills into the pods of ``namespace`` (``job_pods.fill_ins``), computed
        on first use after a change."""
        found = self._defaults.get(namespace)
        if found is None:
            ranges, classes = self.limit_ranges.objects, self.runtime_classes.objects
            found = self._defaults[namespace] = job_pods.fill_ins(ranges, classes, namespace)
        return found

    def _on_limit_range(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A LimitRange changed: its namespace's queued jobs follow (admitted ones keep theirs)."""
        namespace = str(((new or old or {}).get("metadata") or {}).get("namespace", ""))
        self._defaults.pop(namespace, None)
        if not self._marking():
            return
        for (api_version, kind), informer in self.job_informers.items():
            adapter = self.adapters[(api_version, kind)]
            for key, job in informer.objects.items():
                if key.startswith(f"{namespace}/") and self.managed(adapter, job):
                    self.mark(JobKey(api_version, kind, namespace, key.partition("/")[2]))

    def _on_runtime_class(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A RuntimeClass changed (rare): every queued job may name it."""
        self._defaults.clear()
        if self._marking():
            self.mark_all()

    # --- mandatory queueing (docs/operations.md#mandatory-queueing) -------------------------------

    def mandatory_in(self, namespace: str) -> bool:
        """Whether every job of ``namespace`` is queued, labelled or not."""
        if self.namespaces is None:
            return False
        found = self.namespaces.objects.get(namespace)
        labels = (found.get("metadata") or {}).get("labels") if found is not None else None
        return self.mandatory_queueing.applies(namespace, labels if isinstance(labels, dict) else None)

    def managed(self, adapter: JobAdapter, job: Job) -> bool:
        """``adapter.is_managed``, or an unlabelled job of a namespace where queueing is mandatory,
        or a Job that would be managed but claims a parent (:meth:`_genuine_child` decides in
        ``reconcile``, which resolves the claim)."""
        if adapter.is_managed(job):
            return True
        namespace = str((job.get("metadata") or {}).get("namespace", ""))
        wanted = adapter.quota_name(job) is not None or (
            self.namespaces is not None and self.mandatory_in(namespace)
        )
        if wanted and self._claim(adapter, job) is not None:
            return True
        if self.namespaces is None:
            return False
        return mandatory.is_managed(adapter, job, mandatory=self.mandatory_in(namespace))

    def has_own_unit(self, adapter: JobAdapter, job: Job, key: JobKey) -> bool:
        """Whether ``job`` has its own QueueUnit (made for it, owned by its UID)."""
        unit = self.units().get(f"{key.namespace}/{adapter.queue_unit_name(job)}")
        return unit is not None and job_units.owns(unit, key, dict(job))

    @staticmethod
    def _claim(adapter: JobAdapter, job: Job) -> batch_job.ParentClaim | None:
        """The parent a ``batch/v1`` Job or a RayCluster claims by its controller owner reference
        (docs/compatibility.md#batchv1-job, docs/compatibility.md#raycluster)."""
        if isinstance(adapter, ray.RayClusterAdapter):
            return ray.claimed_parent(job)
        if (adapter.api_version, adapter.kind) != _BATCH_JOB:
            return None
        return batch_job.claimed_parent(job, registry.PARENT_GROUPS)

    async def _genuine_child(self, adapter: JobAdapter, job: kube.Obj, namespace: str) -> bool:
        """Whether ``job`` is the child of a managed job, by resolving its claimed parent: the owner
        must exist with the UID the reference names (from the cache, else read from the API) and be
        managed itself. Anything else (no such owner, another UID, a kind not enabled, an unmanaged
        owner) leaves the job queued (docs/architecture.md#trust-boundaries)."""
        claim = self._claim(adapter, job)
        if claim is None:
            return False
        for (api_version, kind), informer in self.job_informers.items():
            if kind != claim.kind or api_version.split("/")[0] != claim.group:
                continue
            parent_adapter = self.adapters[(api_version, kind)]
            parent = informer.objects.get(f"{namespace}/{claim.name}")
            if parent is None:
                try:
                    parent = await self.client.get(
                        job_units.resource_of(parent_adapter), claim.name, namespace=namespace
                    )
                except kube.NotFound:
                    return False
            uid = (parent.get("metadata") or {}).get("uid")
            return bool(claim.uid) and uid == claim.uid and self.managed(parent_adapter, parent)
        return False

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A quota changed: unlabelled held jobs may have a default quota now."""
        if self.namespaces is not None and self._marking():
            self._mark_unlabelled(None)

    def _on_namespace(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A namespace's labels changed: its unlabelled jobs may be selected now."""
        if self._marking():
            self._mark_unlabelled(str(((new or old or {}).get("metadata") or {}).get("name", "")))

    def _mark_unlabelled(self, namespace: str | None) -> None:
        for (api_version, kind), informer in self.job_informers.items():
            adapter = self.adapters[(api_version, kind)]
            for key, job in informer.objects.items():
                if namespace is not None and not key.startswith(f"{namespace}/"):
                    continue
                if adapter.quota_name(job) is None and self.managed(adapter, job):
                    ns, _, name = key.partition("/")
                    self.mark(JobKey(api_version, kind, ns, name))

    def _marking(self) -> bool:
        """Whether a change of the fill-ins should look at jobs again now: only while leading and
        once the job stores are full (the first pass, ``_take_over``, looks at every job anyway;
        without this, each LimitRange listed at start would walk every job listed so far)."""
        return self.leadership.leading and all(i.synced.is_set() for i in self.job_informers.values())

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
                self.client, job_units.resource_of(cluster_adapter), handler=self._on_cluster, optional=True
            )
        as_job = shared.handler

        def both(old: kube.Obj | None, new: kube.Obj | None) -> None:
            as_job(old, new)
            self._on_cluster(old, new)

        shared.handler = both
        return shared

    def _child_job_informer(self) -> Informer | None:
        """``batch/v1`` Jobs, watched when a managed kind's pods are owned by Jobs its controller
        creates: such a pod counts for the kind's unit through its Job (``shared.jobs.podlinks``).
        The informer of the ``job`` extension is shared when that is enabled (it keeps every Job,
        managed or not); otherwise one of our own keeping only what links a pod."""
        if not self._job_parents:
            return None
        shared = self.job_informers.get(_BATCH_JOB)
        if shared is None:
            return Informer(
                self.client,
                job_units.resource_of(batch_job.BatchJobAdapter()),
                handler=self._on_child_job,
                transform=job_pods.slim_parent,
                packed=True,
            )
        as_job = shared.handler

        def both(old: kube.Obj | None, new: kube.Obj | None) -> None:
            as_job(old, new)
            self._on_child_job(old, new)

        shared.handler = both
        return shared

    def _on_child_job(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """A Job appeared or went: look at its parent if that is a kind whose pods it owns. A pod
        seen before its Job did not count (its owner was unknown); the parent's next pass counts
        it. Updates are status churn: a Job's name, UID and owners never change."""
        if old is not None and new is not None:
            return
        obj = new or old or {}
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        for api_version, kind, name in owner_kinds(obj, controller_only=True):
            adapter = self._job_parents.get((api_version.split("/")[0], kind))
            if adapter is not None:
                self.mark(JobKey(adapter.api_version, adapter.kind, namespace, name))

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
                if self.managed(adapter, job):
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
            key = JobKey(
                adapter.api_version, adapter.kind, str(meta.get("namespace", "")), str(meta.get("name", ""))
            )
            if (
                new is not None
                and not self.managed(adapter, new)
                and (old is None or not self.managed(adapter, old))
                and not self.has_own_unit(adapter, new, key)
            ):
                return
            finished = new is not None and adapter.job_status(new) in (JobStatus.SUCCEEDED, JobStatus.FAILED)
            self.mark(key, urgent=finished)

        return handle

    def on_unit(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """Called by the unit informer (owned by the scheduler side)."""
        obj = new or old or {}
        if new is None:
            self._short_since.pop(key_of(obj), None)  # running-timeout memory of a deleted unit
            self._pods_seen_at.pop(key_of(obj), None)
            self._unit_written.forget(key_of(obj))
            job_pods.prune_index(self._pods_by_unit, key_of(obj), self.pods.objects)
        else:
            self._unit_written.behind(key_of(obj), new)  # forgets our write once the watch delivered it
        ref = (obj.get("spec") or {}).get("consumerRef") or {}
        api_version, kind = ref.get("apiVersion"), ref.get("kind")
        if (api_version, kind) not in self.adapters:
            return
        namespace = ref.get("namespace") or (obj.get("metadata") or {}).get("namespace", "")
        admitted = new is not None and (new.get("status") or {}).get("phase") in podplan.ADMITTED_PHASES
        self.mark(
            JobKey(str(api_version), str(kind), str(namespace), str(ref.get("name", ""))), urgent=admitted
        )

    def _on_pod(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        """Keep the pod index exact (a pod leaves its old unit's set when it is deleted or names
        another unit; an emptied set is dropped) and look at the units concerned."""
        key = key_of(new or old or {})
        old_uid, new_uid = job_pods.controller_job_uid(old), job_pods.controller_job_uid(new)
        if old_uid is not None and old_uid != new_uid:
            job_pods.unindex(self._pods_by_controller, old_uid, key)
        if new_uid is not None:
            self._pods_by_controller.setdefault(new_uid, set()).add(key)
        old_ref = job_pods.unit_ref_of(old) if old is not None else None
        new_ref = job_pods.unit_ref_of(new) if new is not None else None
        if old_uid is not None or new_uid is not None:
            # The Job looks again whatever unit the pod names (a pod may name another unit than
            # its Job's, see ``pods_of``); marking twice is free.
            self._mark_controlling_job(new or old or {})
        if old_ref is None and new_ref is None:
            return
        if old_ref is not None and old_ref != new_ref:
            job_pods.unindex(self._pods_by_unit, old_ref, key)
        if new_ref is not None:
            self._pods_by_unit.setdefault(new_ref, set()).add(key)
        for ref in dict.fromkeys(r for r in (old_ref, new_ref) if r is not None):
            unit = self.units().get(ref)
            if unit is not None:
                self.on_unit(None, unit)

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
                # Someone wrote in between, so our store is behind: the watch event of that write
                # marks the job again with fresh objects. Looking again at once would plan on the
                # same stale copy and earn another 409; the delayed look is only a safety net.
                asyncio.get_running_loop().call_later(CONFLICT_RECHECK_SECONDS, self.mark, key)
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
        """One pass over a job: build its view, decide, act
        (docs/architecture.md#the-job-path-view-decide-act); the stages are ``shared.jobs.jobpath``'s."""
        view = await self.view(key)
        await job_actions.execute(self, view, jobpath.decide(view))

    async def view(self, key: JobKey) -> jobpath.JobView:
        """What the decision needs about the job of ``key``: its unit, the flags lookups answer, its
        pods, the settings, the controller's memory and the time. No API read, except for a job that
        does not look queued but claims a parent (``_genuine_child``)."""
        adapter = self.adapters[(key.api_version, key.kind)]
        job = self.job_informers[(key.api_version, key.kind)].objects.get(f"{key.namespace}/{key.name}")
        if job is None:
            gone_key = f"{key.namespace}/{adapter.queue_unit_name({'metadata': {'name': key.name}})}"
            gone = self.units().get(gone_key)
            run = gone is not None and self._orphan_pods_run(gone, gone_key, key, None)
            return jobpath.JobView(key, adapter, None, gone, gone_key, orphan_pods_run=run)
        unit_key = f"{key.namespace}/{adapter.queue_unit_name(job)}"
        unit = self.units().get(unit_key)
        managed, child, default = True, False, mandatory.DefaultQuota(None)
        if not adapter.is_managed(job) and not (unit is not None and job_units.owns(unit, key, job)):
            managed = self.managed(adapter, job)
            child = managed and await self._genuine_child(adapter, job, key.namespace)
            if managed and not child and adapter.quota_name(job) is None:
                default = mandatory.default_quota(key.namespace, self.quotas())
        timeouts = self.running_timeouts.for_extension(adapter.extension)
        pool = ((unit or {}).get("status") or {}).get("pool")  # docs/pools.md#placement
        loop_now = asyncio.get_running_loop().time()
        return jobpath.JobView(
            key,
            adapter,
            job,
            unit,
            unit_key,
            managed=managed,
            genuine_child=child,
            default_quota=default.name,
            default_quota_message=default.message,
            own_write_pending=unit is not None and self._unit_written.behind(unit_key, unit),
            orphan_pods_run=unit is not None and self._orphan_pods_run(unit, unit_key, key, job),
            live_cluster=self._live_cluster(adapter, job),
            **self._pods_in_view(unit, unit_key, adapter, job, timeouts),
            settings=jobpath.Settings(
                priority_classes=self.priority_classes(),
                priority_cap=self.priority_cap(job),
                allowed_classes=self.allowed_priority_classes(job),
                default_class=self.default_priority_class(),
                pod_defaults=self.pod_defaults(key.namespace),
                timeouts=timeouts,
            ),
            short_since=self._short_since.get(unit_key),
            pods_seen_at=self._pods_seen_at.get(unit_key),
            report_since=self._report_since.get(key),
            report_check_pending=key in self._report_checks,
            placement=self.pools(pool) if isinstance(pool, str) and pool else None,
            now=time.time(),
            now_text=job_units.now_text(),
            jitter=random.random(),
            monotonic=loop_now,
        )

    def pools_changed(self, names: Iterable[str]) -> None:
        """Pools appeared or changed: the jobs whose unit was admitted to one look again, so pods
        kept gated while it was unknown are released with its placement (docs/pools.md#placement)."""
        changed = set(names)
        for unit in list(self.units().values()):
            if (unit.get("status") or {}).get("pool") in changed:
                self.on_unit(None, unit)

    def _pods_in_view(
        self,
        unit: kube.Obj | None,
        unit_key: str,
        adapter: JobAdapter,
        job: kube.Obj,
        timeouts: running_timeout.RunningTimeout,
    ) -> dict[str, Any]:
        """The pods of the view, read from the pod index once per pass: the unit's, those that name
        it but are not the job's (withheld ones matter only to an admitted unit), and every pod of the
        job only where the jobs-without-pods clock runs for its kind."""
        if unit is None:
            return {}
        named, parents = self._pods_by_unit.get(unit_key, set()), self._parents()
        admitted = (unit.get("status") or {}).get("phase") in podplan.ADMITTED_PHASES
        watched = timeouts.no_pods_timeout > 0 and adapter.extension in stranded.KINDS
        return {
            "pods": tuple(self.pods_of(unit_key, adapter, job)),
            "job_pods": tuple(self.all_pods_of_job(unit_key, adapter, job)) if watched else (),
            **job_pods.not_the_jobs(self.pods.objects, named, parents, unit_key, job, admitted=admitted),
        }

    def _orphan_pods_run(self, unit: kube.Obj, unit_key: str, key: JobKey, job: kube.Obj | None) -> bool:
        """For an orphaned unit only (``job_units.orphaned``): whether one of its pods still runs. A
        new job of the same name is no exception: a pod the unit released counts for it whatever
        owner it has now (docs/compatibility.md#jobs-deleted-with---cascadeorphan)."""
        if not job_units.orphaned(unit, key, job):
            return False
        return job_pods.orphaned_pods_run(self.pods.objects, self._pods_by_unit.get(unit_key, ()), unit_key)

    def forget_report(self, key: JobKey) -> None:
        """The job's report was written, is not needed, or the job is gone."""
        self._report_since.pop(key, None)
        check = self._report_checks.pop(key, None)
        if check is not None:
            check.cancel()

    def schedule_check(self, timer: str, key: JobKey, delay: float | None) -> None:
        """Look at the job again in ``delay`` seconds, or never, replacing the pending re-check of
        ``timer``: the running timeout's, the jobs-without-pods timeout's, or the coalesced report's;
        each has its own timers, so no check cancels another."""
        timers = {
            "timeout": self._timeout_checks,
            "no_pods": self._no_pods_checks,
            "report": self._report_checks,
        }[timer]
        pending = timers.pop(key, None)
        if pending is not None:
            pending.cancel()
        if delay is not None:
            self._recheck(timers, key, delay)

    def _recheck(self, timers: dict[JobKey, asyncio.TimerHandle], key: JobKey, delay: float) -> None:
        """Mark the job in ``delay`` seconds (a little after, so the deadline has passed), keeping
        the timer in ``timers`` until it fires."""

        def due() -> None:
            timers.pop(key, None)
            self.mark(key)

        timers[key] = asyncio.get_running_loop().call_later(delay + 0.05, due)

    def pods_of(self, unit_key: str, adapter: JobAdapter, job: kube.Obj) -> list[podplan.PodView]:
        """The unit's pods, from the pod index (``job_pods.pods_of``); a RayJob's also those of its
        submitter Job, which carry no link where KubeRay's Job is not gated (docs/compatibility.md#rayjob)."""
        keys: Iterable[str] = self._pods_by_unit.get(unit_key, ())
        if isinstance(adapter, ray.RayJobAdapter):
            found = job_pods.submitter_job(self._parents().get("Job", {}), job)
            keys = set(keys) | (self._pods_by_controller.get(found, set()) if found else set())
        elif (adapter.api_version, adapter.kind) == _BATCH_JOB:
            # A Job whose template could not be relinked (``BatchJobAdapter.resume_patch``): its
            # pods name another unit but are its own by their controller reference.
            keys = self._named_or_controlled(unit_key, job)
        return job_pods.pods_of(self.pods.objects, keys, self._parents(), unit_key, adapter, job)

    def _mark_controlling_job(self, pod: kube.Obj) -> None:
        """A pod controlled by a batch/v1 Job changed: the Job's jobs-without-pods clock counts it
        (``job_pods.all_pods_of_job``) and its release may count it whatever unit it names
        (``pods_of``), so a Job with a unit looks again; its going may leave the Job podless, and
        nothing else would wake it. A RayJob's submitter Job wakes its RayJob."""
        adapter = self.adapters.get(("batch/v1", "Job"))
        name = job_pods.controller_job_name(pod)
        if name is None:
            return
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        self._mark_rayjob_of_submitter(namespace, name)
        if adapter is None:
            return
        unit_name = adapter.queue_unit_name({"metadata": {"name": name}})
        if f"{namespace}/{unit_name}" in self.units():
            self.mark(JobKey("batch/v1", "Job", namespace, name))

    def _mark_rayjob_of_submitter(self, namespace: str, job_name: str) -> None:
        """A pod of the Job ``job_name`` changed: a RayJob controlling that Job looks again (its
        submitter, ``job_pods.submitter_parent``; where KubeRay's Job is not gated the pod names no unit)."""
        rayjob = job_pods.submitter_parent(self._parents().get("Job", {}), namespace, job_name)
        for (api_version, kind), informer in self.job_informers.items() if rayjob else ():
            if kind == "RayJob" and f"{namespace}/{rayjob}" in informer.objects:
                self.mark(JobKey(api_version, kind, namespace, str(rayjob)))

    def all_pods_of_job(self, unit_key: str, adapter: JobAdapter, job: kube.Obj) -> list[podplan.PodView]:
        """Every pod the job controls, named unit or not (``job_pods.all_pods_of_job``)."""
        keys = self._named_or_controlled(unit_key, job)
        return job_pods.all_pods_of_job(self.pods.objects, keys, self._parents(), unit_key, adapter, job)

    def _named_or_controlled(self, unit_key: str, job: kube.Obj) -> set[str]:
        """Keys of the pods naming the unit and of those the job controls (the controller index)."""
        uid = str((job.get("metadata") or {}).get("uid") or "")
        return self._pods_by_unit.get(unit_key, set()) | self._pods_by_controller.get(uid, set())

    def _parents(self) -> job_pods.Parents:
        """The stores of the owners that may stand between a job and its pods (``job_pods``)."""
        return job_pods.parent_stores(self.clusters, self.child_jobs)


def _slim_batch_job(job: kube.Obj) -> kube.Obj:
    return jobext.slim_batch_job(slim(job))


def job_transform(adapter: JobAdapter) -> Callable[[kube.Obj], kube.Obj]:
    """What a job informer keeps: ``batch/v1`` Jobs lose the non-scheduling part of their pod
    template (most of a Job's memory); other kinds keep their whole spec, which their adapters
    read in more places."""
    return _slim_batch_job if (adapter.api_version, adapter.kind) == ("batch/v1", "Job") else slim


def default_adapters() -> tuple[JobAdapter, ...]:
    return registry.enabled_adapters(registry.DEFAULT_EXTENSIONS)
