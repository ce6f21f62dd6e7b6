"""A unit's pods as the job extensions see them, and the two writes they make on pods
(docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones).

Reads: the pod index (unit key → keys of the pods naming it; the controller holds it, these
functions keep it exact), which of those pods count for a unit (``shared.jobs.podlinks``: in the unit's
namespace and owned by its job, through a RayCluster, a Spark driver pod or a child ``batch/v1``
Job), and whether a pod of an orphaned unit still runs. Writes: deleting an unbound pod for a
reclaim and removing the admission gate, both conditional so that a pod bound meanwhile is never
touched. Apart from the
controller (``reconciler.jobs``) because these are the only pod writes, each with its own race to
close; the controller passes its stores in and keeps all state. The controller reads the pods into
the job path's view, and its executor (``reconciler.job_actions``) makes the writes
(docs/architecture.md#the-job-path-view-decide-act).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, Final

from koord_queue.reconciler import metrics
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.informer import Informer, slim
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement, release_ops
from koord_queue.shared.jobs import poddefaults, podlinks, podplan
from koord_queue.shared.jobs.base import JobAdapter

log = logging.getLogger(__name__)

Store = Mapping[str, kube.Obj]
#: The Warning on a job one of whose pods contradicts the pool its unit was admitted to: the pod stays
#: gated (docs/pools.md#placement).
POOL_PLACEMENT_CONFLICT: Final = "PoolPlacementConflict"
#: Stores of the owners that may stand between a job and its pods, by owner kind (``RayCluster``,
#: ``Job``); pods themselves (a Spark executor's driver) come from the pod store.
Parents = Mapping[str, Store]


# --- the pod index: unit key -> keys of the pods naming it ----------------------------------------


def unit_ref_of(pod: kube.Obj) -> str | None:
    """The unit a pod names (its related-queueunit annotation), the key of the pod index."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    ref = annotations.get(names.RELATED_QUEUEUNIT_ANNOTATION)
    return ref if isinstance(ref, str) and ref else None


def unindex(index: dict[str, set[str]], unit_key: str, pod_key: str) -> None:
    """The pod no longer names the unit; an emptied set is dropped."""
    pods = index.get(unit_key)
    if pods is not None:
        pods.discard(pod_key)
        if not pods:
            del index[unit_key]


def prune_index(index: dict[str, set[str]], unit_key: str, pods: Store) -> None:
    """A unit went away: forget its pods that are gone too. Pods still in the store keep naming
    it and stay indexed: a unit re-created under the same key (adoption) finds them at once,
    and they leave with their own deletion events."""
    found = index.get(unit_key)
    if found is None:
        return
    found.intersection_update([k for k in found if k in pods])
    if not found:
        del index[unit_key]


# --- reads ----------------------------------------------------------------------------------------


def pods_of(
    pods: Store,
    pod_keys: Iterable[str],
    parents: Parents,
    unit_key: str,
    adapter: JobAdapter,
    job: kube.Obj,
) -> list[podplan.PodView]:
    """The unit's pods: those naming it (``pod_keys``, from the pod index) that live in its
    namespace and belong to its job (``shared.jobs.podlinks``), in a pod set of the job; a pod
    elsewhere naming the unit is ignored."""
    return _counted(pods, pod_keys, parents, unit_key, adapter, job, without_pod_set=False)


def _counted(
    pods: Store,
    pod_keys: Iterable[str],
    parents: Parents,
    unit_key: str,
    adapter: JobAdapter,
    job: kube.Obj,
    *,
    without_pod_set: bool,
) -> list[podplan.PodView]:
    """The pods of ``pod_keys`` that count for the unit (``podlinks.counts_for``: in its namespace,
    controlled by its job), as views; those in no pod set of the job only ``without_pod_set``."""
    namespace = unit_key.partition("/")[0]
    job_uid = str((job.get("metadata") or {}).get("uid") or "")
    parent = parent_lookup(pods, parents, namespace)
    views = []
    for pod_key in sorted(set(pod_keys)):
        pod = pods.get(pod_key)
        if pod is None or not podlinks.counts_for(
            pod, unit_namespace=namespace, job_uid=job_uid, parent=parent
        ):
            continue
        pod_set = adapter.pod_set_of(pod)
        if pod_set or without_pod_set:
            views.append(podplan.pod_view(pod, pod_set or ""))
    return views


def controller_job_uid(pod: kube.Obj | None) -> str | None:
    """The UID in the pod's controller reference when that controller is a ``batch/v1`` Job: the
    key of the controller index, which finds a Job's pods whatever unit they name, if any."""
    ref = podlinks.controller_of(pod) if pod is not None else None
    return ref[2] if ref is not None and ref[0] == "Job" else None


def submitter_job(jobs: Store, rayjob: kube.Obj) -> str | None:
    """The UID of the ``batch/v1`` Job in ``jobs`` named after ``rayjob`` (KubeRay's name for the
    submitter Job) when ``rayjob`` controls it; None otherwise (docs/compatibility.md#rayjob)."""
    metadata = rayjob.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    found = jobs.get(f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}")
    ref = podlinks.controller_of(found) if found is not None and uid else None
    if ref is None or ref[0] != "RayJob" or ref[2] != uid:
        return None
    return str((found or {}).get("metadata", {}).get("uid") or "") or None


def submitter_parent(jobs: Store, namespace: str, job_name: str) -> str | None:
    """The name of the RayJob controlling the Job ``namespace/job_name`` in ``jobs``, if one does:
    that Job is the RayJob's submitter (docs/compatibility.md#rayjob)."""
    found = jobs.get(f"{namespace}/{job_name}")
    ref = podlinks.controller_of(found) if found is not None else None
    return ref[1] if ref is not None and ref[0] == "RayJob" else None


def controller_job_name(pod: kube.Obj) -> str | None:
    """The name in the pod's controller reference when that controller is a ``batch/v1`` Job."""
    ref = podlinks.controller_of(pod)
    return ref[1] if ref is not None and ref[0] == "Job" else None


def all_pods_of_job(
    pods: Store,
    pod_keys: Iterable[str],
    parents: Parents,
    unit_key: str,
    adapter: JobAdapter,
    job: kube.Obj,
) -> list[podplan.PodView]:
    """Every pod of the job, for the jobs-without-pods clock (docs/compatibility.md#jobs-without-pods):
    ``pod_keys`` are the pods naming the unit and those whose controller reference is the job (the
    controller index); kept are those in the unit's namespace that the job controls
    (``podlinks.owned_by``), gated or not, being deleted or finished, with or without a pod set. A
    pod naming the unit that the job does not control is left out: anyone may make one, and it
    says nothing about whether the job's controller still makes pods. Pure."""
    return _counted(pods, pod_keys, parents, unit_key, adapter, job, without_pod_set=True)


def escaped_of(
    pods: Store, pod_keys: Iterable[str], parents: Parents, unit_key: str, job: kube.Obj
) -> list[podplan.PodView]:
    """Pods that name the unit, live in its namespace and are out of the admission gate, but that
    its job, alive and not being deleted, provably does not own (``podlinks.left_job``): they left
    the job (a label its controller selects by, or the owner reference, was changed) or never were
    its own. Either way nothing accounts for them, so they are deleted
    (docs/architecture.md#trust-boundaries)."""
    meta = job.get("metadata") or {}
    job_uid = str(meta.get("uid") or "")
    if not job_uid or meta.get("deletionTimestamp") is not None:
        return []  # a job deleted with --cascade=orphan lets go of its pods on purpose
    namespace = unit_key.partition("/")[0]
    parent = parent_lookup(pods, parents, namespace)
    found = []
    for pod_key in sorted(pod_keys):
        pod = pods.get(pod_key)
        if pod is None or (pod.get("metadata") or {}).get("namespace") != namespace:
            continue
        view = podplan.pod_view(pod, "")
        live = view.live and not view.deleting  # one being deleted is on its way out already
        if live and not view.gated and podlinks.left_job(pod, job_uid, parent):
            found.append(view)
    return found


def not_the_jobs(
    pods: Store, pod_keys: Iterable[str], parents: Parents, unit_key: str, job: kube.Obj, *, admitted: bool
) -> dict[str, Any]:
    """The job path's view of the pods that name the unit but are not the job's: the ``escaped``
    (:func:`escaped_of`) and, for an admitted unit only (they matter to nothing else), the
    ``withheld`` (:func:`withheld_of`)."""
    withheld = withheld_of(pods, pod_keys, parents, unit_key, job) if admitted else []
    return {"escaped": tuple(escaped_of(pods, pod_keys, parents, unit_key, job)), "withheld": tuple(withheld)}


def fill_ins(limit_ranges: Store, runtime_classes: Store, namespace: str) -> poddefaults.PodDefaults:
    """What the apiserver fills into the pods of ``namespace``
    (docs/compatibility.md#requests-the-apiserver-fills-in): its LimitRanges' default requests and
    every RuntimeClass's overhead (``shared.jobs.poddefaults``). Pure."""
    ranges = [lr for key, lr in limit_ranges.items() if key.startswith(f"{namespace}/")]
    overheads = {
        str((rc.get("metadata") or {}).get("name")): poddefaults.runtime_class_overhead(rc)
        for rc in runtime_classes.values()
    }
    return poddefaults.PodDefaults(
        requests=poddefaults.limit_range_requests(ranges),
        overheads={name: o for name, o in overheads.items() if o},
    )


def withheld_of(
    pods: Store, pod_keys: Iterable[str], parents: Parents, unit_key: str, job: kube.Obj
) -> list[tuple[podplan.PodView, str]]:
    """Gated, live pods that name the unit and live in its namespace but that are certainly not its
    job's (``podlinks.left_job``), each with why (``podlinks.ownership_problem``): they stay gated
    whatever the admission holds (docs/compatibility.md#pod-gating). A pod whose controller is an
    intermediate not seen yet is left out: that is a watch running behind, not a claim."""
    job_uid = str((job.get("metadata") or {}).get("uid") or "")
    if not job_uid:
        return []
    namespace = unit_key.partition("/")[0]
    parent = parent_lookup(pods, parents, namespace)
    found = []
    for pod_key in sorted(pod_keys):
        pod = pods.get(pod_key)
        if pod is None or (pod.get("metadata") or {}).get("namespace") != namespace:
            continue
        view = podplan.pod_view(pod, "")
        why = podlinks.ownership_problem(pod, job_uid, parent)
        if view.live and view.gated and why is not None and podlinks.left_job(pod, job_uid, parent):
            found.append((view, why))
    return found


def report_withheld(events: EventRecorder, plan: podplan.PodPlan, job: kube.Obj) -> None:
    """A Warning ``PodKeptGated`` on the job for each pod the plan keeps gated, saying why, and a
    Normal ``PodWaitsForReservation`` for each pod that waits for room in its job's reservation
    (docs/compatibility.md#argo-workflow); the recorder folds repeats into one event's count."""
    for pod, why in plan.withheld:
        events.record(
            job,
            type_="Warning",
            reason=names.EventReason.POD_KEPT_GATED,
            message=names.Message.pod_kept_gated(pod.name, why),
        )
    for pod, why in plan.waiting:
        events.record(
            job,
            type_="Normal",
            reason=names.EventReason.POD_WAITS_FOR_RESERVATION,
            message=names.Message.pod_waits_for_reservation(pod.name, why),
        )


#: How many pod UIDs :func:`report_beyond` remembers having counted (the oldest are forgotten).
BEYOND_SEEN_MAX = 10_000


def report_beyond(
    events: EventRecorder, plan: podplan.PodPlan, job: kube.Obj, seen: MutableMapping[str, None]
) -> None:
    """A Warning ``PodsBeyondAdmission`` on the job per pod set with bound pods past its admission,
    and the counter ``koord_queue_pods_beyond_admission_total`` raised once per such pod (``seen``,
    the controller's memory, bounded by :data:`BEYOND_SEEN_MAX`). Reported, never charged
    (docs/compatibility.md#reclaim-and-usage-reports)."""
    by_set: dict[str, list[str]] = {}
    for pod in plan.beyond:
        by_set.setdefault(pod.pod_set, []).append(pod.name)
        if pod.uid not in seen:
            seen[pod.uid] = None
            metrics.PODS_BEYOND_ADMISSION.inc()
            while len(seen) > BEYOND_SEEN_MAX:
                del seen[next(iter(seen))]
    for pod_set, pods in sorted(by_set.items()):
        events.record(
            job,
            type_="Warning",
            reason=names.EventReason.PODS_BEYOND_ADMISSION,
            message=names.Message.pods_beyond_admission(pod_set, sorted(pods)),
        )


def parent_stores(clusters: Informer | None, child_jobs: Informer | None) -> Parents:
    """The stores of the owners that may stand between a job and its pods, by kind: RayClusters
    and ``batch/v1`` Jobs, where the controller watches them."""
    found: dict[str, Store] = {}
    if clusters is not None:
        found["RayCluster"] = clusters.objects
    if child_jobs is not None:
        found["Job"] = child_jobs.objects
    return found


def parent_lookup(pods: Store, parents: Parents, namespace: str) -> podlinks.ParentLookup:
    """Owners that stand between a job and its pods: a RayJob's RayCluster, a Spark driver pod, the
    ``batch/v1`` Job an MPIJob's launcher or a JobSet's replicated job runs in."""

    def parent(kind: str, name: str) -> Mapping[str, Any] | None:
        store = pods if kind == "Pod" else parents.get(kind)
        return store.get(f"{namespace}/{name}") if store is not None else None

    return parent


def orphaned_pods_run(pods: Store, pod_keys: Iterable[str], unit_key: str) -> bool:
    """Does a pod of an orphaned unit still run, or is it released to run? Pure.

    Its job is gone, so its pods are the ones naming the unit (``pod_keys``: the
    ``koord-queue/related-queueunit`` annotation, which nobody but the reconciler can change on a
    pod that exists, ``manifests/pod-links-policy.yaml``) in the unit's namespace, whatever owner
    they have now: a ReplicaSet whose selector matches their labels adopts them, a user may write
    owner references on them (even a controller reference to a new job of the same name, which
    the Job controller may keep with ``manualSelector``), and none of that stops them running on
    the quota. A pod being deleted counts while it is bound (it runs for its grace period); a pod
    still gated never ran and never will (docs/compatibility.md#jobs-deleted-with---cascadeorphan).
    """
    namespace = unit_key.partition("/")[0]
    for pod_key in sorted(pod_keys):
        pod = pods.get(pod_key)
        if pod is None or (pod.get("metadata") or {}).get("namespace") != namespace:
            continue
        view = podplan.pod_view(pod, "")
        if view.live and (view.bound or not view.gated):
            return True
    return False


# --- writes ---------------------------------------------------------------------------------------


async def delete_planned(
    client: kube.Kube,
    events: EventRecorder,
    pods: Store,
    plan: podplan.PodPlan,
    job: kube.Obj,
    unit_key: str,
) -> bool:
    """Delete the plan's pods: a reclaim's, then those that left the job, then those released
    beyond the admission (a Warning event on the job for each of the last two). True when one
    could not be deleted but is still in the store: it changed since the plan was made, so the
    caller plans again before reporting the reclaim."""
    stale = False
    for pod in plan.delete:
        if await reclaim_pod(client, pods, pod):
            metrics.RECLAIMED_PODS.inc()
            log.info("reclaim: deleted unbound pod %s/%s of %s", pod.namespace, pod.name, unit_key)
        elif pod_key_of(pod) in pods:
            stale = True
    for victims, reason, message, why, counted in (
        (
            plan.escaped,
            names.EventReason.ESCAPED_POD_DELETED,
            names.Message.escaped_pod_deleted,
            "its job does not own it",
            "escaped",
        ),
        (
            plan.unadmitted,
            names.EventReason.UNADMITTED_POD_DELETED,
            names.Message.unadmitted_pod_deleted,
            "released without admission",
            "unadmitted",
        ),
    ):
        for pod in victims:
            if await reclaim_pod(client, pods, pod):
                metrics.UNQUEUED_PODS_DELETED.labels(counted).inc()
                log.warning("deleted pod %s/%s of %s: %s", pod.namespace, pod.name, unit_key, why)
                events.record(job, type_="Warning", reason=reason, message=message(pod.name))
            elif pod_key_of(pod) in pods:
                stale = True
    return stale


async def reclaim_pod(client: kube.Kube, pods: Store, pod: podplan.PodView) -> bool:
    """Delete one unbound pod of a reclaim; False when it is gone or changed since we looked.

    Every write is conditional on the resourceVersion we saw unbound, so a pod the scheduler
    binds meanwhile is never deleted. A Job controller pod first loses its tracking finalizer:
    otherwise the Job controller counts the deletion as a pod failure, and a preempted Job with
    ``backoffLimit: 0`` would end Failed instead of waiting for its next admission. Without the
    finalizer the deletion is uncounted and the Job creates a replacement, gated like the first.
    """
    rv = pod.resource_version or None
    current = pods.get(pod_key_of(pod)) or {}
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
            updated = await client.patch(
                kube.PODS, pod.name, ops, namespace=pod.namespace, content_type=kube.JSON_PATCH
            )
        except (kube.NotFound, kube.Invalid, kube.Conflict):
            return False  # a failed test answers 422: the pod changed, plan again
        rv = str((updated.get("metadata") or {}).get("resourceVersion") or "") or None
        untracked = True
    try:
        await client.delete(
            kube.PODS, pod.name, namespace=pod.namespace, precondition_uid=pod.uid, precondition_rv=rv
        )
    except kube.NotFound:
        return False
    except kube.Conflict:
        if untracked:
            # Bound between our two writes: it runs, so the Job controller must count it again.
            with contextlib.suppress(kube.NotFound, kube.Invalid, kube.Conflict):
                await client.patch(
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


async def ungate(
    client: kube.Kube,
    pods: MutableMapping[str, kube.Obj],
    pod: podplan.PodView,
    placement: PoolPlacement | None = None,
) -> str | None:
    """Remove the admission gate of one pod, if it still has it; conditional on the gate's place.

    With a pool's ``placement`` (docs/pools.md#placement) the same JSON patch first adds the pool's
    node selector, affinity expressions and tolerations (``placement.release_ops`` on the spec the
    store holds, which ``podplan.slim_pod`` keeps for a gated pod), conditional on the version that
    spec was read at: a pod changed meanwhile answers 422 and stays gated for the next pass. One
    write, so no pod is ever out of its gate without its pool's placement. Answers why the pod
    cannot run on the pool (it is not written, and stays gated), else None."""
    current = pods.get(f"{pod.namespace}/{pod.name}")
    spec: Mapping[str, Any] = (current or {}).get("spec") or {}
    gates: list[Any] = spec.get("schedulingGates") or []
    index = next((i for i, g in enumerate(gates) if g.get("name") == names.ADMISSION_GATE), None)
    if index is None:
        return None
    ops: list[Any] = []
    if placement is not None:
        placed = release_ops(spec, placement)
        if isinstance(placed, str):
            return placed
        if placed:
            ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": _rv_of(current)}, *placed]
    ops += [
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": names.ADMISSION_GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    try:
        updated = await client.patch(
            kube.PODS, pod.name, ops, namespace=pod.namespace, content_type=kube.JSON_PATCH
        )
    except (kube.NotFound, kube.Invalid, kube.Conflict) as err:
        log.debug("ungate %s/%s: %s; left for the next pass", pod.namespace, pod.name, err)
        return None
    # Assume the write at once, so a reconcile before the watch catches up does not
    # pick another pod to release; but never over a newer version the watch delivered
    # meanwhile (a stale "unbound" copy could make a running pod look reclaimable).
    pod_key = f"{pod.namespace}/{pod.name}"
    latest = pods.get(pod_key)
    if latest is not None and _rv_of(latest) == _rv_of(current):
        pods[pod_key] = slim_pod(updated)
    return None


def pod_key_of(pod: podplan.PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def _rv_of(obj: kube.Obj | None) -> object:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def slim_pod(pod: kube.Obj) -> kube.Obj:
    """What the pod informer keeps (``shared.jobs.podplan.slim_pod``), and what an ungate assumes."""
    return podplan.slim_pod(slim(pod))


def slim_parent(obj: kube.Obj) -> kube.Obj:
    """What a store of parent objects needs to link a pod (``shared.jobs.podlinks``): the object's
    identity and its owner references. A Job watched only for that keeps nothing else."""
    meta = obj.get("metadata") or {}
    kept = ("name", "namespace", "uid", "resourceVersion", "ownerReferences")
    return {"metadata": {key: meta[key] for key in kept if key in meta}}
