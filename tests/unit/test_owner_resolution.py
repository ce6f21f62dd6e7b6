"""Ownership is resolved, not read (docs/architecture.md#trust-boundaries): a queued job's owner
references are frozen for namespace users, and a Job claiming a managed parent by its controller
reference is its parent's child only when the reconciler finds that owner, with that UID, managed.
A forged claim (no such owner, another UID, an unmanaged owner) leaves the Job queued."""

from __future__ import annotations

import copy
from typing import Any

from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.shared import kube
from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.admission.decisions import Operation
from koord_queue.shared.api import names
from koord_queue.shared.jobs import batch_job, registry
from tests.unit.test_admission import CONFIG, NOW, review_body
from tests.unit.test_job_extensions_wiring import FakeClient, FakeEvents

TFJOB_UID = "11111111-2222-4333-8444-555555555555"
OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "TFJob",
    "name": "parent",
    "uid": TFJOB_UID,
    "controller": True,
}
KEY = JobKey("batch/v1", "Job", "ns", "child")


def labelled_job(*, suspended: bool, owners: list[dict[str, Any]] | None = None) -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    meta: dict[str, Any] = {
        "name": "child",
        "namespace": "ns",
        "uid": "job-uid",
        "resourceVersion": "3",
        "labels": {names.QUOTA_NAME_LABEL: "q"},
        "annotations": {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"},
    }
    if owners is not None:
        meta["ownerReferences"] = owners
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"suspend": suspended, "template": {"spec": {"containers": [container]}}},
    }


def tfjob(*, uid: str = TFJOB_UID, labelled: bool = True) -> kube.Obj:
    labels = {names.QUOTA_NAME_LABEL: "q"} if labelled else {}
    replica = {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "parent", "namespace": "ns", "uid": uid, "labels": labels},
        "spec": {"tfReplicaSpecs": {"Worker": replica}},
    }


# --- at the door ----------------------------------------------------------------------------------


def update(new: kube.Obj, old: kube.Obj, user: str) -> dict[str, Any]:
    body = review_body(new, old=old, operation="UPDATE", user=user)
    response: dict[str, Any] = admission.review(
        body, operation=Operation.VALIDATE, config=CONFIG, now_text=NOW
    )["response"]
    return response


def test_a_user_cannot_change_the_owner_references_of_a_queued_job() -> None:
    old = labelled_job(suspended=True)
    plain = {**OWNER, "controller": False}
    for owners in ([plain], [OWNER]):
        new = copy.deepcopy(old)
        new["metadata"]["ownerReferences"] = owners
        response = update(new, old, "alice")
        assert response["allowed"] is False and "metadata.ownerReferences" in response["status"]["message"]


def test_the_garbage_collector_may_drop_owner_references_when_it_orphans() -> None:
    old = labelled_job(suspended=True, owners=[{**OWNER, "controller": False}])
    new = copy.deepcopy(old)
    del new["metadata"]["ownerReferences"]
    assert update(new, old, "system:serviceaccount:kube-system:generic-garbage-collector")["allowed"] is True
    assert update(new, old, "alice")["allowed"] is False


def test_a_finished_job_is_free_to_change_owners() -> None:
    old = labelled_job(suspended=True)
    old["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    new = copy.deepcopy(old)
    new["metadata"]["ownerReferences"] = [{**OWNER, "controller": False}]
    assert update(new, old, "alice")["allowed"] is True


def test_the_claim_is_the_first_controller_reference_into_a_queued_group() -> None:
    job = labelled_job(suspended=True, owners=[{**OWNER, "controller": False}, {**OWNER, "name": "other"}])
    assert batch_job.claimed_parent(job, registry.PARENT_GROUPS) == batch_job.ParentClaim(
        "kubeflow.org/v1", "TFJob", "other", TFJOB_UID
    )
    foreign = {"apiVersion": "example.com/v1", "kind": "Thing", "name": "x", "uid": "u", "controller": True}
    assert (
        batch_job.claimed_parent(labelled_job(suspended=True, owners=[foreign]), registry.PARENT_GROUPS)
        is None
    )


# --- in the reconciler ----------------------------------------------------------------------------


class ResolvingClient(FakeClient):
    """``get`` answers from ``objects`` (``NotFound`` otherwise)."""

    def __init__(self, objects: dict[str, kube.Obj]) -> None:
        super().__init__()
        self.objects = objects
        self.gets: list[str] = []

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> kube.Obj:
        self.gets.append(name)
        found = self.objects.get(f"{namespace}/{name}")
        if found is None:
            raise kube.NotFound(404, "NotFound", name)
        return found


def extensions(client: ResolvingClient) -> JobExtensions:
    return JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job", "tfjob")),
        units=dict,
        priority_classes=dict,
        events=FakeEvents(),  # type: ignore[arg-type]
    )


async def reconcile(jobs: JobExtensions, job: kube.Obj, cached_parent: kube.Obj | None = None) -> None:
    jobs.job_informers[("batch/v1", "Job")].objects["ns/child"] = job
    if cached_parent is not None:
        jobs.job_informers[("kubeflow.org/v1", "TFJob")].objects["ns/parent"] = cached_parent
    await jobs.reconcile(KEY)


def suspended_by(client: FakeClient) -> bool:
    return any((patch.get("spec") or {}).get("suspend") is True for _, patch, _ in client.patches)


async def test_a_child_of_a_managed_parent_is_left_to_its_parent() -> None:
    client = ResolvingClient({})
    jobs = extensions(client)
    await reconcile(jobs, labelled_job(suspended=False, owners=[OWNER]), cached_parent=tfjob())
    assert client.patches == [] and client.creates == []


async def test_the_parent_missing_from_the_cache_is_read_from_the_api() -> None:
    client = ResolvingClient({"ns/parent": tfjob()})
    jobs = extensions(client)
    await reconcile(jobs, labelled_job(suspended=False, owners=[OWNER]))
    assert client.gets == ["parent"] and client.patches == []


async def test_a_forged_parent_that_does_not_exist_leaves_the_job_queued() -> None:
    client = ResolvingClient({})
    jobs = extensions(client)
    await reconcile(jobs, labelled_job(suspended=False, owners=[OWNER]))
    assert suspended_by(client)  # it ran past the queue: held again (HeldUnadmitted)


async def test_a_parent_with_another_uid_is_not_the_claimed_one() -> None:
    client = ResolvingClient({})
    jobs = extensions(client)
    await reconcile(jobs, labelled_job(suspended=False, owners=[OWNER]), cached_parent=tfjob(uid="other"))
    assert suspended_by(client)


async def test_an_unmanaged_parent_makes_no_exception() -> None:
    client = ResolvingClient({})
    jobs = extensions(client)
    await reconcile(jobs, labelled_job(suspended=True, owners=[OWNER]), cached_parent=tfjob(labelled=False))
    assert [c["kind"] for c in client.creates] == ["QueueUnit"]  # queued on its own label


async def test_a_parent_of_a_kind_not_enabled_makes_no_exception() -> None:
    client = ResolvingClient({})
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=dict,
        priority_classes=dict,
        events=FakeEvents(),  # type: ignore[arg-type]
    )
    await reconcile(jobs, labelled_job(suspended=True, owners=[OWNER]))
    assert [c["kind"] for c in client.creates] == ["QueueUnit"]


# --- a job that stops being managed keeps its unit ------------------------------------------------


def own_unit(job: kube.Obj) -> kube.Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": "child",
            "namespace": "ns",
            "resourceVersion": "7",
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": {names.JOB_HAS_ENQUEUED_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "child", "uid": "job-uid"}],
        },
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "child", "namespace": "ns"},
            "queue": "q",
            "podSet": [{"name": "child", "count": 1, "template": job["spec"]["template"]}],
        },
        "status": {"phase": "Enqueued"},
    }


def unlabelled(job: kube.Obj) -> kube.Obj:
    job["metadata"]["labels"] = {}
    return job


async def test_a_queued_job_that_lost_its_label_past_the_door_stays_held() -> None:
    client = ResolvingClient({})
    job = unlabelled(labelled_job(suspended=False))
    units = {"ns/child": own_unit(job)}
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: units,
        priority_classes=dict,
        events=FakeEvents(),  # type: ignore[arg-type]
    )
    await reconcile(jobs, job)
    assert suspended_by(client)  # released without admission: held again, its unit kept


async def test_an_unlabelled_job_without_a_unit_of_its_own_is_not_ours() -> None:
    client = ResolvingClient({})
    job = unlabelled(labelled_job(suspended=False))
    foreign = own_unit(job)
    foreign["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-job"
    units = {"ns/child": foreign}
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: units,
        priority_classes=dict,
        events=FakeEvents(),  # type: ignore[arg-type]
    )
    await reconcile(jobs, job)
    assert client.patches == [] and client.creates == []
    assert jobs.has_own_unit(jobs.adapters[("batch/v1", "Job")], job, KEY) is False
