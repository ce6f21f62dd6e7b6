"""Which pods count for a QueueUnit: the unit's namespace and its job's own pods, nothing else.

A pod names its unit in the annotation ``koord-queue/related-queueunit`` (the webhook writes it
into the job's pod templates). That annotation is a claim, not a fact: a pod's owner can write any
value there, for a unit in any namespace. Counted as it stands, a pod in one namespace could raise
another team's ``running`` count (and, through the report, its admitted replicas), or a bare pod
could stand in for a job's pod. So a pod counts for a unit only when both hold
(docs/architecture.md#trust-boundaries):

* it lives in the unit's namespace; and
* it is controlled by the unit's job: its *controller* reference carries the job's UID, directly
  (Job, a Kubeflow job, RayCluster, a Spark driver) or through one intermediate that the job
  itself controls (a RayJob's RayCluster, a Spark executor's driver pod, the ``batch/v1`` Job an
  MPIJob runs its launcher in, a JobSet's child Jobs). UIDs are assigned by the apiserver and
  checked against the parent object as it is stored, so a made-up reference matches nothing. A
  plain (non-controller) owner reference proves nothing: the job's UID is readable by anyone who
  may read the job, and its owner can put a real reference to it on a pod of their own making.

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

from koord_queue.shared.jobs.base import Job, dig, text

#: ``(kind, name)`` → the object of that kind and name in the pod's namespace, if known.
ParentLookup = Callable[[str, str], Mapping[str, Any] | None]

#: The kinds that may stand between a job and its pods (see :func:`owned_by`): a RayJob's
#: RayCluster, the ``batch/v1`` Job of an MPIJob launcher or a JobSet, a Spark executor's driver.
INTERMEDIATE_KINDS = frozenset({"RayCluster", "Job", "Pod"})


def controller_of(obj: Job) -> tuple[str, str, str] | None:
    """``(kind, name, uid)`` of the object's controller reference (``controller: true``), if any.

    The apiserver allows at most one; a reference without kind, name or UID is no reference."""
    refs = dig(obj, "metadata", "ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if dig(ref, "controller") is not True:
            continue
        kind, name, uid = text(dig(ref, "kind")), text(dig(ref, "name")), text(dig(ref, "uid"))
        return (kind, name, uid) if kind and name and uid else None
    return None


def ownership_problem(obj: Job, job_uid: str, parent: ParentLookup) -> str | None:
    """Why ``obj`` is not provably the job ``job_uid``'s, or None when it is.

    Proof is the *controller* reference (docs/compatibility.md#pod-gating): it names the job, or
    an intermediate (:data:`INTERMEDIATE_KINDS`) that is known, has the UID the reference names and
    is itself controlled by the job. Any other owner reference, even one carrying the job's UID, is
    something a pod's author can write and proves nothing.
    """
    if not job_uid:
        return "its job has no UID yet"
    ref = controller_of(obj)
    if ref is None:
        return "it has no controller reference"
    kind, name, uid = ref
    if uid == job_uid:
        return None
    if kind not in INTERMEDIATE_KINDS:
        return f"its controller {kind} {name} is not its job"
    owner = parent(kind, name)
    if owner is None:
        return f"its controller {kind} {name} is not known (yet)"
    if text(dig(owner, "metadata", "uid")) != uid:
        return f"its controller reference names {kind} {name} with a UID that object does not have"
    grand = controller_of(owner)
    if grand is None or grand[2] != job_uid:
        return f"its controller {kind} {name} is not controlled by its job"
    return None


def owned_by(obj: Job, job_uid: str, parent: ParentLookup) -> bool:
    """``obj`` is controlled by the job with ``job_uid``, directly or through one intermediate it
    controls (:func:`ownership_problem`)."""
    return ownership_problem(obj, job_uid, parent) is None


def counts_for(pod: Job, *, unit_namespace: str, job_uid: str, parent: ParentLookup) -> bool:
    """The pod may be counted, gated, released or reclaimed for the unit of the job ``job_uid``."""
    return text(dig(pod, "metadata", "namespace")) == unit_namespace and owned_by(pod, job_uid, parent)


def left_job(pod: Job, job_uid: str, parent: ParentLookup) -> bool:
    """The pod provably does not belong to the job ``job_uid`` (whose unit it names).

    Not owned by it (:func:`owned_by`), and its controller is not an object that could stand
    between (:data:`INTERMEDIATE_KINDS`) but is not known yet: a RayCluster or child Job whose
    watch event is behind its pod's, or one of a kind the caller does not watch, leaves the
    question open rather than wrongly condemning the job's own pod. A pod with no controller,
    which is what a job controller leaves when it lets go of a pod, is decided at once.
    """
    if not job_uid or owned_by(pod, job_uid, parent):
        return False
    ref = controller_of(pod)
    return ref is None or ref[0] not in INTERMEDIATE_KINDS or parent(ref[0], ref[1]) is not None
