"""Which pods the reconciler deletes for having left their job (``reconciler.job_pods.escaped_of``):
released, unfinished, in the unit's namespace, naming the unit, and provably not the live job's
(docs/architecture.md#trust-boundaries). The ownership rule itself is ``tests/unit/test_podlinks.py``;
this is what the reconciler adds around it, read from its stores."""

from __future__ import annotations

from typing import Any

from koord_queue.reconciler import job_pods
from koord_queue.shared.api import names

UNIT = "team/train"
JOB: dict[str, Any] = {"metadata": {"name": "train", "namespace": "team", "uid": "job-uid"}}


def pod(
    name: str,
    *,
    owner: str | None = None,
    namespace: str = "team",
    gated: bool = False,
    phase: str = "Pending",
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: UNIT},
    }
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "Job", "name": "train", "uid": owner, "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    spec: dict[str, Any] = {"schedulingGates": [{"name": names.ADMISSION_GATE}]} if gated else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def escaped(pods: list[dict[str, Any]], job: dict[str, Any] = JOB) -> list[str]:
    store = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    return [v.name for v in job_pods.escaped_of(store, sorted(store), {}, UNIT, job)]


def test_only_released_unfinished_pods_of_the_units_namespace_that_left_the_job_are_taken() -> None:
    pods = [
        pod("own", owner="job-uid"),  # the job's own released pod
        pod("left"),  # its controller let go of it
        pod("bare-running", phase="Running"),  # bound or not: released and not the job's
        pod("gated", gated=True),  # never runs while gated
        pod("done", phase="Succeeded"),
        pod("leaving", deleting=True),
        pod("elsewhere", namespace="other"),  # another namespace's pod naming the unit
    ]
    assert escaped(pods) == ["bare-running", "left"]


def test_a_job_being_deleted_lets_go_of_its_pods_on_purpose() -> None:
    deleting = {"metadata": {**JOB["metadata"], "deletionTimestamp": "2026-12-02T00:00:00Z"}}
    assert escaped([pod("left")], deleting) == []


def test_a_job_without_a_uid_condemns_nothing() -> None:
    assert escaped([pod("left")], {"metadata": {"name": "train", "namespace": "team"}}) == []


def test_a_pod_under_an_owner_not_yet_seen_is_left_alone() -> None:
    child = pod("through-child")
    child["metadata"]["ownerReferences"] = [
        {"kind": "Job", "name": "train-launcher", "uid": "c", "controller": True}
    ]
    assert escaped([child]) == []
