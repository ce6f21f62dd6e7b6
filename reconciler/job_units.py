"""A job's QueueUnit: the names the job extension's modules share, which unit is whose, creating
it (adoption included) and releasing a unit whose job was orphaned.

* :class:`JobKey` is the controller's unit of work (``reconciler.jobs``), :data:`QUEUE_UNITS` the
  resource every writer of units uses (the scheduler too);
* a released job whose unit was deleted gets it back admitted
  (docs/compatibility.md#adoption-of-released-jobs): the unit is created marked for adoption and
  its status written right after (``shared.jobs.adoption``);
* :func:`orphaned` / :func:`owned_by_another` tell a unit left behind by a deleted job from the
  job's own, and :func:`release_orphan` deletes the former once none of the pods naming it runs,
  whatever their owner; :func:`disown` orphans a job's unit itself when the job is deleted with
  ``--cascade=orphan``, so a garbage collector that has not seen the unit cannot delete it later.

Functions take the client and what they read, so the controller keeps all state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared import kube
from koord_queue.shared.api import durations, names
from koord_queue.shared.jobs import adoption, base, jobext, poddefaults
from koord_queue.shared.jobs.base import Job, JobAdapter, JobSpecError, JobStatus, is_dequeued, is_enqueued

log = logging.getLogger(__name__)

QUEUE_UNITS = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


def now_text() -> str:
    """The time to stamp a write with; asked for about a dozen times per job, and the text
    changes once a second (``durations.format_time`` remembers it)."""
    return durations.format_time(time.time())


def resource_of(adapter: JobAdapter) -> kube.Resource:
    group, _, version = adapter.api_version.rpartition("/")
    return kube.Resource(group, version, adapter.plural, adapter.kind)


@dataclass(frozen=True, slots=True)
class JobKey:
    api_version: str
    kind: str
    namespace: str
    name: str


async def create_unit(
    client: kube.Kube,
    events: EventRecorder,
    job: kube.Obj,
    adapter: JobAdapter,
    *,
    priority_classes: Mapping[str, int],
    max_user_priority: int | None,
    allowed_classes: frozenset[str] | None = None,
    default_class: str | None = None,
    live_cluster: Job | None,
    adopt: bool,
    defaults: poddefaults.PodDefaults | None = None,
) -> None:
    """Create the job's unit; for a released job (``adopt``) finish its adoption at once."""
    meta = job.get("metadata") or {}
    try:
        unit = jobext.build_queue_unit(
            job,
            adapter,
            priority_classes,
            live_cluster=live_cluster,
            adopted=adopt,
            max_user_priority=max_user_priority,
            allowed_classes=allowed_classes,
            default_class=default_class,
            defaults=defaults,
        )
    except JobSpecError as err:
        events.record(
            job, type_="Warning", reason="InvalidJob", message=f"cannot queue this {adapter.kind}: {err}"
        )
        return
    try:
        created = await client.create(QUEUE_UNITS, unit, namespace=str(meta.get("namespace", "")))
    except kube.Conflict as err:
        if err.reason != "AlreadyExists":
            raise
        return  # our store lagged; the unit's event brings us back
    except kube.Invalid as err:
        events.record(
            job,
            type_="Warning",
            reason="InvalidJob",
            message=f"cannot create the QueueUnit for this {adapter.kind}: {err.message}",
        )
        return
    warn_refused_class(events, job, adapter, allowed_classes)
    if adopt:
        log.info(
            "adopted %s/%s: its unit was missing while the job runs",
            meta.get("namespace"),
            meta.get("name"),
        )
        await finish_adoption(
            client,
            created,
            adapter.job_status(job),
            suspended=adapter.is_suspended(job),
            stamped=is_dequeued(job),
        )


def warn_refused_class(
    events: EventRecorder, job: kube.Obj, adapter: JobAdapter, allowed_classes: frozenset[str] | None
) -> None:
    """A Warning ``PriorityClassNotAllowed`` on a job naming a class its quota does not allow
    (docs/compatibility.md#priority-cap): its unit is queued as if it named none."""
    refused = jobext.refused_priority_class(job, adapter, allowed_classes)
    if refused is not None and allowed_classes is not None:
        message = jobext.refused_class_message(refused, adapter.quota_name(job) or "", allowed_classes)
        events.record(job, type_="Warning", reason="PriorityClassNotAllowed", message=message)


async def finish_adoption(
    client: kube.Kube, unit: kube.Obj, status: JobStatus, *, suspended: bool, stamped: bool
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
    await client.patch(
        QUEUE_UNITS,
        str(meta.get("name", "")),
        body,
        namespace=str(meta.get("namespace", "")),
        subresource="status",
    )
    return True


async def release_orphan(client: kube.Kube, unit: kube.Obj, unit_key: str, *, pods_run: bool) -> None:
    """Release an orphaned unit (:func:`orphaned`) by deleting it, once none of its pods runs
    (``pods_run``: ``reconciler.job_pods.orphaned_pods_run``).

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
    if pods_run:
        return  # the pods' events bring us back
    meta = unit.get("metadata") or {}
    namespace, _, name = unit_key.partition("/")
    try:
        await client.delete(
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


#: The finalizer the apiserver puts on an object deleted with ``propagationPolicy: Orphan``: the
#: garbage collector removes the object's owner reference from its dependents, then the finalizer.
ORPHAN_FINALIZER = "orphan"


def disown_patch(unit: kube.Obj, key: JobKey, job: kube.Obj) -> kube.Obj | None:
    """The merge patch that drops ``job``'s owner reference from its own ``unit`` when the job is
    being deleted with ``--cascade=orphan`` (deletion timestamp and the ``orphan`` finalizer), or
    None. Conditional on the unit's version.

    The garbage collector does this too, but only for the dependents it has seen: one that does
    not watch QueueUnits yet (it discovers a CRD on its next resync), or whose QueueUnit watch is
    behind (relisting after an apiserver restart), leaves the owner reference on the unit, and
    once the job is gone deletes the unit as the dependent of a missing owner while the orphaned
    pods still run on its quota (docs/compatibility.md#jobs-deleted-with---cascadeorphan). Dropped
    by us, the unit is orphaned whatever the collector has seen, and stays until its pods are gone
    (:func:`release_orphan`)."""
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp") is None or ORPHAN_FINALIZER not in (meta.get("finalizers") or []):
        return None
    uid = uid_of(job)
    if uid is None or not owns(unit, key, job):
        return None
    unit_meta = unit.get("metadata") or {}
    kept = [ref for ref in unit_meta.get("ownerReferences") or [] if ref.get("uid") != uid]
    return {"metadata": {"ownerReferences": kept, "resourceVersion": unit_meta.get("resourceVersion")}}


async def disown(client: kube.Kube, unit: kube.Obj, unit_key: str, key: JobKey, job: kube.Obj) -> bool:
    """Orphan the unit of a job deleted with ``--cascade=orphan`` (:func:`disown_patch`) before the
    garbage collector may miss it; True if written (the unit's update brings the job back)."""
    patch = disown_patch(unit, key, job)
    if patch is None:
        return False
    namespace, _, name = unit_key.partition("/")
    try:
        await client.patch(QUEUE_UNITS, name, patch, namespace=namespace)
    except kube.NotFound:
        return False
    log.info(
        "orphaned QueueUnit %s: its %s %s is deleted with --cascade=orphan", unit_key, key.kind, key.name
    )
    return True


def _names_consumer(unit: kube.Obj, key: JobKey) -> bool:
    ref = (unit.get("spec") or {}).get("consumerRef") or {}
    namespace = ref.get("namespace") or (unit.get("metadata") or {}).get("namespace")
    return (ref.get("kind"), ref.get("name"), namespace) == (key.kind, key.name, key.namespace)


def _owners(unit: kube.Obj, key: JobKey) -> list[str]:
    """UIDs of the unit's owner references to a job of ``key``'s kind and name."""
    return [uid for kind, name, uid in base.owner_uids(unit) if (kind, name) == (key.kind, key.name)]


def orphaned(unit: kube.Obj, key: JobKey, job: kube.Obj | None) -> bool:
    """``unit`` was made for a job called like ``key`` that was deleted with ``--cascade=orphan``.

    The job extension creates every unit owned by its job; the garbage collector removes that
    owner reference only when the job is deleted with orphan propagation. So a unit naming the job
    as its consumer, without an owner reference to it, carrying the webhook's enqueue stamp
    (copied from the job it was made from) is orphaned when no such job exists, or when the job
    of that name (``job``) is not older than the unit: a unit is never made before its job, and
    timestamps have whole seconds, so a job re-created within the second its predecessor's unit
    was made ties with it; the tie is an orphan too, since every unit the job extension makes
    carries its job's owner reference, and taking it for the new job's own would hand that job
    its predecessor's admission while the orphaned pods still run on it
    (docs/compatibility.md#jobs-deleted-with---cascadeorphan). A unit
    without the stamp was created directly and stands on its own
    (docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own), never ours to release.
    """
    if not _names_consumer(unit, key) or _owners(unit, key) or not is_enqueued(unit):
        return False
    if job is None:
        return True
    made = str((unit.get("metadata") or {}).get("creationTimestamp") or "")
    born = str((job.get("metadata") or {}).get("creationTimestamp") or "")
    return bool(made and born and made <= born)  # RFC 3339 in UTC: ordered as text


def owned_by_another(unit: kube.Obj, key: JobKey, job: kube.Obj) -> bool:
    """``unit`` still belongs to an earlier job of ``job``'s name, deleted (only one job has a name
    at a time): garbage collection deletes it, and ``job`` must neither use its admission nor
    take it for its own."""
    owners = _owners(unit, key)
    return _names_consumer(unit, key) and bool(owners) and uid_of(job) not in owners


def owns(unit: kube.Obj, key: JobKey, job: kube.Obj) -> bool:
    """``unit`` is ``job``'s own: it names the job as its consumer and is owned by the job's UID."""
    uid = uid_of(job)
    return uid is not None and _names_consumer(unit, key) and uid in _owners(unit, key)


def uid_of(obj: kube.Obj | None) -> str | None:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "") or None
