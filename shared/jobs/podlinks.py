"""Which pods count for a QueueUnit: the unit's namespace and its job's own pods, nothing else.

A pod names its unit in the annotation ``koord-queue/related-queueunit`` (the webhook writes it
into the job's pod templates). That annotation is a claim, not a fact: a pod's owner can write any
value there, for a unit in any namespace. Counted as it stands, a pod in one namespace could raise
another team's ``running`` count (and, through the report, its admitted replicas), or a bare pod
could stand in for a job's pod. So a pod counts for a unit only when both hold
(docs/architecture.md#trust-boundaries):

* it lives in the unit's namespace; and
* it is owned by the unit's job: an owner reference carries the job's UID, directly (Job,
  a Kubeflow job, RayCluster, a Spark driver) or through one owner that the job itself owns
  (a RayJob's RayCluster, a Spark executor's driver pod, the ``batch/v1`` Job an MPIJob runs its
  launcher in, a JobSet's child Jobs). UIDs are assigned by the apiserver and checked against the
  parent object as it is stored, so a made-up reference matches nothing.

A pod that names its unit but has left its job (:func:`left_job`) is the other half of the rule:
its owner changed a label the job's controller selects pods by (the controller then lets go of the
pod) or removed the owner reference itself. Out of the gate, such a pod would run outside the
job's admission while the controller makes a gated replacement that the admission releases, so the
reconciler deletes it.

Pure: the caller passes the lookup of parent objects it has in its informers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shared.jobs import base
from shared.jobs.base import Job, dig, text

#: ``(kind, name)`` → the object of that kind and name in the pod's namespace, if known.
ParentLookup = Callable[[str, str], Mapping[str, Any] | None]

#: The kinds that may stand between a job and its pods (see :func:`owned_by`): a RayJob's
#: RayCluster, the ``batch/v1`` Job of an MPIJob launcher or a JobSet, a Spark executor's driver.
INTERMEDIATE_KINDS = frozenset({"RayCluster", "Job", "Pod"})


def owned_by(obj: Job, job_uid: str, parent: ParentLookup) -> bool:
    """``obj`` is owned by the job with ``job_uid``, directly or through one owner it owns."""
    if not job_uid:
        return False
    refs = base.owner_uids(obj)
    if any(uid == job_uid for _, _, uid in refs):
        return True
    for kind, name, uid in refs:
        owner = parent(kind, name)
        if owner is None or text(dig(owner, "metadata", "uid")) != uid:
            continue
        if any(grand == job_uid for _, _, grand in base.owner_uids(owner)):
            return True
    return False


def counts_for(pod: Job, *, unit_namespace: str, job_uid: str, parent: ParentLookup) -> bool:
    """The pod may be counted, gated, released or reclaimed for the unit of the job ``job_uid``."""
    return text(dig(pod, "metadata", "namespace")) == unit_namespace and owned_by(pod, job_uid, parent)


def left_job(pod: Job, job_uid: str, parent: ParentLookup) -> bool:
    """The pod provably does not belong to the job ``job_uid`` (whose unit it names).

    Not owned by it (:func:`owned_by`), and none of its owners is an object that could stand
    between (:data:`INTERMEDIATE_KINDS`) but is not known yet: a RayCluster or child Job whose
    watch event is behind its pod's, or one of a kind the caller does not watch, leaves the
    question open rather than wrongly condemning the job's own pod. A pod with no owner at all,
    which is what a job controller leaves when it lets go of a pod, is decided at once.
    """
    if not job_uid or owned_by(pod, job_uid, parent):
        return False
    return all(
        kind not in INTERMEDIATE_KINDS or parent(kind, name) is not None
        for kind, name, _ in base.owner_uids(pod)
    )
