"""Which QueueUnit is whose: the job extension's unit of work (:class:`JobKey`) and the pure
predicates that tell a job's own unit from one left behind by a deleted job
(docs/compatibility.md#jobs-deleted-with---cascadeorphan).

Pure: the job path's decision (``shared.jobs.jobpath``, docs/architecture.md#the-job-path-view-decide-act)
and the controller's event handlers (``reconciler.jobs``) both ask them; ``reconciler.job_units``
re-exports them for its writers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from koord_queue.shared.jobs import base
from koord_queue.shared.jobs.base import Job, is_enqueued


@dataclass(frozen=True, slots=True)
class JobKey:
    """The job extension's unit of work: one job, by its kind, namespace and name."""

    api_version: str
    kind: str
    namespace: str
    name: str


#: The finalizer the apiserver puts on an object deleted with ``propagationPolicy: Orphan``: the
#: garbage collector removes the object's owner reference from its dependents, then the finalizer.
ORPHAN_FINALIZER = "orphan"


def disown_patch(unit: Job, key: JobKey, job: Job) -> dict[str, Any] | None:
    """The merge patch that drops ``job``'s owner reference from its own ``unit`` when the job is
    being deleted with ``--cascade=orphan`` (deletion timestamp and the ``orphan`` finalizer), or
    None. Conditional on the unit's version.

    The garbage collector does this too, but only for the dependents it has seen: one that does
    not watch QueueUnits yet (it discovers a CRD on its next resync), or whose QueueUnit watch is
    behind (relisting after an apiserver restart), leaves the owner reference on the unit, and
    once the job is gone deletes the unit as the dependent of a missing owner while the orphaned
    pods still run on its quota (docs/compatibility.md#jobs-deleted-with---cascadeorphan). Dropped
    by us, the unit is orphaned whatever the collector has seen, and stays until its pods are gone
    (``reconciler.job_units.release_orphan``)."""
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp") is None or ORPHAN_FINALIZER not in (meta.get("finalizers") or []):
        return None
    uid = uid_of(job)
    if uid is None or not owns(unit, key, job):
        return None
    unit_meta = unit.get("metadata") or {}
    kept = [ref for ref in unit_meta.get("ownerReferences") or [] if ref.get("uid") != uid]
    return {"metadata": {"ownerReferences": kept, "resourceVersion": unit_meta.get("resourceVersion")}}


def _names_consumer(unit: Job, key: JobKey) -> bool:
    ref = (unit.get("spec") or {}).get("consumerRef") or {}
    namespace = ref.get("namespace") or (unit.get("metadata") or {}).get("namespace")
    return (ref.get("kind"), ref.get("name"), namespace) == (key.kind, key.name, key.namespace)


def _owners(unit: Job, key: JobKey) -> list[str]:
    """UIDs of the unit's owner references to a job of ``key``'s kind and name."""
    return [uid for kind, name, uid in base.owner_uids(unit) if (kind, name) == (key.kind, key.name)]


def orphaned(unit: Job, key: JobKey, job: Job | None) -> bool:
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


def owned_by_another(unit: Job, key: JobKey, job: Job) -> bool:
    """``unit`` still belongs to an earlier job of ``job``'s name, deleted (only one job has a name
    at a time): garbage collection deletes it, and ``job`` must neither use its admission nor
    take it for its own."""
    owners = _owners(unit, key)
    return _names_consumer(unit, key) and bool(owners) and uid_of(job) not in owners


def owns(unit: Job, key: JobKey, job: Job) -> bool:
    """``unit`` is ``job``'s own: it names the job as its consumer and is owned by the job's UID."""
    uid = uid_of(job)
    return uid is not None and _names_consumer(unit, key) and uid in _owners(unit, key)


def uid_of(obj: Job | None) -> str | None:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "") or None
