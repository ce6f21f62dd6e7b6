"""A job's QueueUnit: the names the job extension's modules share, and the writes on units that
the job path's executor (``reconciler.job_actions``, docs/architecture.md#the-job-path-view-decide-act)
makes: creating a unit (adoption included), finishing an adoption, releasing a unit whose job was
orphaned, and orphaning a job's unit itself.

* :data:`QUEUE_UNITS` is the resource every writer of units uses (the scheduler too);
  :class:`JobKey` (the controller's unit of work) and the predicates telling whose a unit is
  (:func:`orphaned`, :func:`owned_by_another`, :func:`owns`, :func:`disown_patch`) are pure and live
  in ``shared.jobs.unitowners``; they are re-exported here;
* a released job whose unit was deleted gets it back admitted
  (docs/compatibility.md#adoption-of-released-jobs): the unit is created marked for adoption and
  its status written right after (``shared.jobs.adoption``);
* :func:`release_orphan` deletes a unit left behind by a deleted job once none of the pods naming
  it runs, whatever their owner; :func:`disown` orphans a job's unit itself when the job is deleted
  with ``--cascade=orphan``, so a garbage collector that has not seen the unit cannot delete it later.

Functions take the client and what they read, so the controller keeps all state.
"""

from __future__ import annotations

import logging
import time

from koord_queue.reconciler.events import EventRecorder
from koord_queue.shared import kube
from koord_queue.shared.api import durations, names
from koord_queue.shared.jobs import adoption
from koord_queue.shared.jobs.base import JobAdapter, JobStatus
from koord_queue.shared.jobs.unitowners import (
    ORPHAN_FINALIZER,
    JobKey,
    disown_patch,
    orphaned,
    owned_by_another,
    owns,
    uid_of,
)

__all__ = [
    "ORPHAN_FINALIZER",
    "QUEUE_UNITS",
    "JobKey",
    "create_built",
    "disown",
    "disown_patch",
    "finish_adoption",
    "now_text",
    "orphaned",
    "owned_by_another",
    "owns",
    "release_orphan",
    "resource_of",
    "uid_of",
]

log = logging.getLogger(__name__)

QUEUE_UNITS = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


def now_text() -> str:
    """The time to stamp a write with; asked for about a dozen times per job, and the text
    changes once a second (``durations.format_time`` remembers it)."""
    return durations.format_time(time.time())


def resource_of(adapter: JobAdapter) -> kube.Resource:
    group, _, version = adapter.api_version.rpartition("/")
    return kube.Resource(group, version, adapter.plural, adapter.kind)


async def create_built(
    client: kube.Kube, events: EventRecorder, unit: kube.Obj, job: kube.Obj, adapter: JobAdapter
) -> kube.Obj | None:
    """Create the unit the job path built for ``job`` (``shared.jobs.jobext.build_queue_unit``);
    the created unit, or None when it was not created.

    AlreadyExists means our store lagged: the unit's event brings the job back. Invalid (the
    apiserver refused the unit) is told on the job as a Warning ``InvalidJob``.
    """
    meta = job.get("metadata") or {}
    try:
        created: kube.Obj = await client.create(QUEUE_UNITS, unit, namespace=str(meta.get("namespace", "")))
    except kube.Conflict as err:
        if err.reason != "AlreadyExists":
            raise
        return None  # our store lagged; the unit's event brings us back
    except kube.Invalid as err:
        events.record(
            job,
            type_="Warning",
            reason="InvalidJob",
            message=f"cannot create the QueueUnit for this {adapter.kind}: {err.message}",
        )
        return None
    return created


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


async def disown(client: kube.Kube, patch: kube.Obj, unit_key: str, key: JobKey) -> None:
    """Orphan the unit of a job deleted with ``--cascade=orphan`` with ``patch``
    (:func:`disown_patch`) before the garbage collector may miss it; the unit's update brings the
    job back (a unit already gone: its deletion does)."""
    namespace, _, name = unit_key.partition("/")
    try:
        await client.patch(QUEUE_UNITS, name, patch, namespace=namespace)
    except kube.NotFound:
        return
    log.info(
        "orphaned QueueUnit %s: its %s %s is deleted with --cascade=orphan", unit_key, key.kind, key.name
    )
