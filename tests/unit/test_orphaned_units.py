"""A unit left behind by a job deleted with ``--cascade=orphan`` keeps its charge while a pod that
names it runs, whatever owner that pod has now (docs/compatibility.md#jobs-deleted-with---cascadeorphan):
``reconciler.job_units.orphaned`` and ``reconciler.job_pods.orphaned_pods_run``."""

from __future__ import annotations

from typing import Any

import pytest

from koord_queue.reconciler import job_pods, job_units
from koord_queue.shared.api import names

KEY = job_units.JobKey("batch/v1", "Job", "ns", "train")
UNIT_KEY = "ns/train"


def unit(made: str = "2026-01-01T10:00:05Z", *, owner_uid: str | None = None) -> dict[str, Any]:
    """A stamped unit of the Job ``train``; owned by ``owner_uid`` unless it was orphaned."""
    refs = [{"kind": "Job", "name": "train", "uid": owner_uid}] if owner_uid else []
    return {
        "metadata": {
            "name": "train",
            "namespace": "ns",
            "creationTimestamp": made,
            "ownerReferences": refs,
            "annotations": {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"},
        },
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": "ns"}
        },
    }


def job(born: str, uid: str = "new-uid") -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ns", "uid": uid, "creationTimestamp": born}}


def test_an_ownerless_unit_of_a_gone_job_is_orphaned() -> None:
    assert job_units.orphaned(unit(), KEY, None)


def test_a_job_re_created_later_or_within_the_same_second_does_not_take_the_unit() -> None:
    assert job_units.orphaned(unit(), KEY, job("2026-01-01T10:00:09Z"))
    # Timestamps have whole seconds: the tie is the predecessor's unit, never the new job's own.
    assert job_units.orphaned(unit(), KEY, job("2026-01-01T10:00:05Z"))


def test_the_jobs_own_unit_is_never_orphaned() -> None:
    assert not job_units.orphaned(unit(owner_uid="new-uid"), KEY, job("2026-01-01T10:00:05Z"))
    assert not job_units.orphaned(unit(owner_uid="old-uid"), KEY, None)  # garbage collection's


def pod(
    name: str,
    *,
    controller: tuple[str, str] | None = None,
    bound: bool = True,
    gated: bool = False,
    phase: str = "Running",
    deleting: bool = False,
    namespace: str = "ns",
) -> dict[str, Any]:
    """A pod naming the unit ``ns/train``, with ``controller`` (kind, uid) as its owner now."""
    refs = (
        [{"kind": controller[0], "name": "x", "uid": controller[1], "controller": True}] if controller else []
    )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "ownerReferences": refs,
        "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: UNIT_KEY},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T10:01:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if bound:
        spec["nodeName"] = "node-1"
    if gated:
        spec["schedulingGates"] = [{"name": names.ADMISSION_GATE}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("the_pod", "holds"),
    [
        pytest.param(pod("p"), True, id="ownerless, running"),
        pytest.param(pod("p", controller=("ReplicaSet", "rs-uid")), True, id="adopted by a ReplicaSet"),
        pytest.param(pod("p", controller=("Job", "new-uid")), True, id="claimed by the new job of its name"),
        pytest.param(pod("p", deleting=True), True, id="terminating on its node"),
        pytest.param(pod("p", bound=False), True, id="released, not bound yet"),
        pytest.param(pod("p", bound=False, gated=True), False, id="still gated: never ran"),
        pytest.param(pod("p", bound=False, deleting=True), False, id="unbound and being deleted"),
        pytest.param(pod("p", phase="Succeeded"), False, id="finished"),
        pytest.param(pod("p", phase="Failed"), False, id="failed"),
        pytest.param(pod("p", namespace="elsewhere"), False, id="in another namespace"),
    ],
)
def test_a_pod_naming_the_orphaned_unit_holds_it_whatever_its_owner(
    the_pod: dict[str, Any], holds: bool
) -> None:
    key = f"{the_pod['metadata']['namespace']}/p"
    assert job_pods.orphaned_pods_run({key: the_pod}, [key], UNIT_KEY) is holds


def test_a_pod_index_entry_without_a_pod_holds_nothing() -> None:
    assert not job_pods.orphaned_pods_run({}, ["ns/gone"], UNIT_KEY)


def deleting(finalizers: list[str], uid: str = "old-uid") -> dict[str, Any]:
    """The Job ``train`` being deleted, holding ``finalizers``."""
    obj = job("2026-01-01T10:00:01Z", uid)
    obj["metadata"] |= {"deletionTimestamp": "2026-01-01T10:05:00Z", "finalizers": finalizers}
    return obj


def test_a_job_deleted_with_cascade_orphan_lets_go_of_its_unit_without_the_garbage_collector() -> None:
    """Round 0 of the 2026-12-04 quick chaos run: the garbage collector, not (yet) following
    QueueUnits after an apiserver restart, orphaned the pod but not the unit, and then deleted the
    unit as the dependent of a missing owner while the pod ran. The reconciler drops the owner
    reference itself, conditional on the unit's version."""
    owned = unit(owner_uid="old-uid")
    owned["metadata"]["resourceVersion"] = "41"
    patch = job_units.disown_patch(owned, KEY, deleting(["orphan"]))
    assert patch == {"metadata": {"ownerReferences": [], "resourceVersion": "41"}}
    # Another owner (none of ours, but kept) stays.
    owned["metadata"]["ownerReferences"].append({"kind": "Other", "name": "x", "uid": "x-uid"})
    patch = job_units.disown_patch(owned, KEY, deleting(["foregroundDeletion", "orphan"]))
    assert patch is not None
    assert patch["metadata"]["ownerReferences"] == [{"kind": "Other", "name": "x", "uid": "x-uid"}]


def test_only_an_orphaning_deletion_of_the_owner_lets_go_of_the_unit() -> None:
    owned = unit(owner_uid="old-uid")
    assert job_units.disown_patch(owned, KEY, job("2026-01-01T10:00:01Z", "old-uid")) is None
    assert job_units.disown_patch(owned, KEY, deleting([])) is None  # background: collected with it
    assert job_units.disown_patch(owned, KEY, deleting(["foregroundDeletion"])) is None
    assert job_units.disown_patch(owned, KEY, deleting(["orphan"], uid="new-uid")) is None  # not its own
    assert job_units.disown_patch(unit(), KEY, deleting(["orphan"])) is None  # already orphaned
