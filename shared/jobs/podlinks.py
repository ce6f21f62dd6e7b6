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

Pure: the caller passes the lookup of parent objects it has in its informers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shared.jobs import base
from shared.jobs.base import Job, dig, text

#: ``(kind, name)`` → the object of that kind and name in the pod's namespace, if known.
ParentLookup = Callable[[str, str], Mapping[str, Any] | None]


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
