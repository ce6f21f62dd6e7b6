"""The judge of the hostile tenant's orphan attack (``chaos/tenant_orphans.py``): exact, so a
legitimate sequence never counts and a release while the orphaned pod is still there always does."""

from __future__ import annotations

from typing import Any

from chaos import tenant_orphans as orphans
from koord_queue.shared.api import names

REF = "chaos-mallory/mallory-orphan-0"


def unit(uid: str = "u1", *, admitted: bool = True, rv: str = "5") -> dict[str, Any]:
    status = {"phase": "Running", "admissions": [{"name": "x", "replicas": 1}]} if admitted else {}
    return {"metadata": {"name": "mallory-orphan-0", "uid": uid, "resourceVersion": rv}, "status": status}


def pod(
    uid: str = "p1", *, rv: str = "5", phase: str = "Running", deleting: bool = False, ref: str = REF
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "mallory-orphan-0-abcde",
        "uid": uid,
        "resourceVersion": rv,
        "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: ref},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T20:24:22Z"
    return {"metadata": meta, "spec": {"nodeName": "kwok-node-2"}, "status": {"phase": phase}}


def test_a_pod_still_there_counts_while_terminating_but_not_once_finished() -> None:
    pods = [pod(), pod("p2", deleting=True), pod("p3", phase="Succeeded"), pod("p4", ref="other/x")]
    found = orphans.orphans_present(pods, {"p1", "p2", "p3", "p4"}, REF)
    assert [p["metadata"]["uid"] for p in found] == ["p1", "p2"]
    assert orphans.orphans_present(pods, {"p9"}, REF) == []


def test_a_read_finds_a_release_only_while_the_pod_is_still_there() -> None:
    """The unit is listed first, then the pods: a pod the later list shows was there when the unit
    was listed. (The old judge listed the pods first and took a unit it could not read, as while a
    restarted apiserver answers 429 for custom resources but serves pods, for a gone one.)"""
    assert orphans.read_finding(unit(), "u1", 1, REF) is None
    gone = orphans.read_finding(None, "u1", 1, REF)
    assert gone is not None and "is gone while 1 orphaned pod(s)" in gone
    taken = orphans.read_finding(unit("u2"), "u1", 1, REF)
    assert taken is not None and "is u2 while" in taken
    unadmitted = orphans.read_finding(unit(admitted=False), "u1", 1, REF)
    assert unadmitted is not None and "holds no admission" in unadmitted
    # The pod gone by the later read: one read cannot order the two (the record does).
    assert orphans.read_finding(None, "u1", 0, REF) is None
    assert orphans.read_finding(unit("u2"), "u1", 0, REF) is None


def test_the_record_orders_the_release_and_the_pods_going() -> None:
    # The reconciler deleted the pod, it was gone, then the unit was released: legitimate.
    pods = [("MODIFIED", pod(rv="10", deleting=True)), ("DELETED", pod(rv="11", deleting=True))]
    units = [("DELETED", unit(rv="12")), ("ADDED", unit("u2", admitted=False, rv="13"))]
    assert orphans.released_before_gone(units, pods, "u1", {"p1"}) is False
    # Released while the pod was still there, terminating: a breach.
    units = [("DELETED", unit(rv="10")), ("ADDED", unit("u2", admitted=False, rv="11"))]
    pods = [("MODIFIED", pod(rv="12", deleting=True)), ("DELETED", pod(rv="13", deleting=True))]
    assert orphans.released_before_gone(units, pods, "u1", {"p1"}) is True
    # Released while the pod still ran, which was deleted next (the escaped-pod rule).
    assert orphans.released_before_gone(
        [("DELETED", unit(rv="10"))], [("DELETED", pod(rv="14"))], "u1", {"p1"}
    )
    # Not released at all within the record: no breach.
    assert orphans.released_before_gone([], [("DELETED", pod(rv="14"))], "u1", {"p1"}) is False
    # A pod whose deletion the record does not show: it cannot tell.
    assert orphans.released_before_gone([("DELETED", unit(rv="10"))], [], "u1", {"p1"}) is None
    two = [("DELETED", pod("p1", rv="9")), ("DELETED", pod("p2", rv="15"))]
    assert orphans.released_before_gone([("DELETED", unit(rv="10"))], two, "u1", {"p1", "p2"}) is True


def test_the_deleted_unit_s_owners_tell_the_garbage_collector_from_a_release() -> None:
    """Round 0 of the 2026-12-04 quick run: the unit went while her pod ran, and no reconciler
    replica released it; a unit still naming its deleted Job when deleted is the garbage
    collector's delete (it had not orphaned the unit), one with no owner left a release."""
    owned = unit(rv="10")
    owned["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "mallory-orphan-0", "uid": "j1"}]
    assert orphans.deleted_owners([("MODIFIED", unit()), ("DELETED", owned)], "u1") == [
        "Job/mallory-orphan-0/j1"
    ]
    assert orphans.deleted_owners([("DELETED", unit(rv="10"))], "u1") == []
    assert orphans.deleted_owners([("MODIFIED", unit())], "u1") is None
