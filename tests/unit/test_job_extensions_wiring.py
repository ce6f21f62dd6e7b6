"""The job extensions' I/O edge with a fake client: adoption's two writes and their convergence after
a restart, the RayCluster watch waking the RayJob, and the scheduler loop leaving a unit that awaits
its adoption status alone (REFERENCE §2.3 step 4, §2.5 / S27)."""

from __future__ import annotations

from typing import Any

from reconciler.jobs import JobExtensions, JobKey
from reconciler.scheduler import SchedulerLoop
from shared import adoption, jobext, kube, names
from shared.config import Settings
from shared.jobs import registry
from shared.jobs.base import JobStatus

NOW = "2024-05-01T10:00:00Z"


class FakeClient:
    """Records writes; a create answers with the object as stored (metadata filled in)."""

    def __init__(self) -> None:
        self.creates: list[kube.Obj] = []
        self.patches: list[tuple[str, Any, str]] = []

    async def create(self, res: kube.Resource, obj: kube.Obj, *, namespace: str | None = None) -> kube.Obj:
        self.creates.append(obj)
        meta = {**obj["metadata"], "resourceVersion": "11", "creationTimestamp": NOW, "uid": "qu-2"}
        return {**obj, "metadata": meta}

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        self.patches.append((name, patch, kwargs.get("subresource", "")))
        return {}


class FakeEvents:
    def record(self, obj: kube.Obj, **kwargs: Any) -> None:
        pass


def released_job() -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "first",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": {
                names.JOB_HAS_ENQUEUED_ANNOTATION: "true",
                names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: NOW,
            },
        },
        "spec": {"parallelism": 2, "suspend": False, "template": {"spec": {"containers": [container]}}},
    }


def extensions(
    units: dict[str, kube.Obj], *, extensions: tuple[str, ...] = ("job",)
) -> tuple[JobExtensions, FakeClient]:
    client = FakeClient()
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(extensions),
        units=lambda: units,
        priority_classes=dict,
        events=FakeEvents(),  # type: ignore[arg-type]
    )
    return jobs, client


def status_writes(client: FakeClient) -> list[kube.Obj]:
    return [patch for _, patch, sub in client.patches if sub == "status"]


async def test_a_released_job_without_a_unit_gets_it_created_then_admitted() -> None:
    jobs, client = extensions({})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = released_job()
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns", "first"))
    [created] = client.creates
    assert created["metadata"]["annotations"][adoption.ADOPTED_ANNOTATION] == "true"
    [written] = status_writes(client)
    assert written["metadata"] == {"resourceVersion": "11"}  # the created version: nobody wrote between
    assert (written["status"]["phase"], written["status"]["message"]) == ("Dequeued", names.Message.ADOPTED)
    assert written["status"]["admissions"] == [{"name": "first", "replicas": 2, "running": 0}]


async def test_a_restart_between_the_create_and_the_status_write_converges() -> None:
    """The process died after the create: the marked unit without a status is finished when met."""
    job = released_job()
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {}, adopted=True)
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    jobs, client = extensions({"ns/first": unit})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns", "first"))
    assert client.creates == []
    [written] = status_writes(client)
    assert written["metadata"] == {"resourceVersion": "5"}
    assert written["status"]["phase"] == "Dequeued"


async def test_a_queuing_job_without_a_unit_gets_a_plain_one() -> None:
    job = released_job()
    job["metadata"]["annotations"].pop(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
    job["spec"]["suspend"] = True
    jobs, client = extensions({})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns", "first"))
    [created] = client.creates
    assert adoption.ADOPTED_ANNOTATION not in created["metadata"]["annotations"]
    assert status_writes(client) == []  # the scheduler queues it


async def test_a_held_job_whose_pods_still_count_is_queued_not_adopted() -> None:
    """Preempted: suspended again, its terminating pods still active. Adopting it would resume it."""
    job = released_job()
    job["metadata"]["annotations"].pop(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
    job["spec"]["suspend"] = True
    job["status"] = {"active": 2}
    jobs, client = extensions({})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns", "first"))
    [created] = client.creates
    assert adoption.ADOPTED_ANNOTATION not in created["metadata"]["annotations"]
    assert status_writes(client) == []


async def test_a_job_running_without_the_reconcilers_stamp_is_held_before_anything_else() -> None:
    """Released by someone else (or running before it was labelled): suspended, never adopted."""
    job = released_job()
    job["metadata"]["annotations"].pop(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
    job["metadata"]["resourceVersion"] = "42"
    job["status"] = {"active": 2}
    jobs, client = extensions({})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns", "first"))
    assert client.creates == []
    [(name, patch, sub)] = client.patches
    assert (name, sub) == ("first", "")
    assert patch["spec"] == {"suspend": True}
    assert patch["metadata"]["resourceVersion"] == "42"  # never over a newer version


def plurals(jobs: JobExtensions) -> list[str]:
    return sorted(i.resource.plural for i in jobs.informers())


def test_rayclusters_are_watched_once_and_only_when_rayjobs_are_managed() -> None:
    assert "rayclusters" not in plurals(extensions({}, extensions=("job",))[0])
    assert plurals(extensions({}, extensions=("rayjob",))[0]).count("rayclusters") == 1
    both, _ = extensions({}, extensions=("rayjob", "raycluster"))
    assert plurals(both).count("rayclusters") == 1
    assert both.clusters is both.job_informers[("ray.io/v1", "RayCluster")]


def test_a_scaled_raycluster_wakes_its_rayjob_and_status_churn_does_not() -> None:
    for enabled in (("rayjob",), ("rayjob", "raycluster")):
        jobs, _ = extensions({}, extensions=enabled)
        assert jobs.clusters is not None
        owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "auto", "uid": "u", "controller": True}
        cluster: kube.Obj = {
            "metadata": {"name": "auto-raycluster-x7k2p", "namespace": "ns", "ownerReferences": [owner]},
            "spec": {"headGroupSpec": {}, "workerGroupSpecs": [{"groupName": "worker", "replicas": 1}]},
        }
        scaled = {
            **cluster,
            "spec": {**cluster["spec"], "workerGroupSpecs": [{"groupName": "worker", "replicas": 2}]},
        }
        jobs.clusters.handler(cluster, {**cluster, "status": {"state": "ready"}})
        assert not jobs._dirty
        jobs.clusters.handler(cluster, scaled)
        assert list(jobs._dirty) == [JobKey("ray.io/v1", "RayJob", "ns", "auto")]


async def test_the_scheduler_neither_admits_nor_parks_a_unit_awaiting_its_adoption_status() -> None:
    loop = SchedulerLoop(FakeClient(), events=FakeEvents(), settings=Settings())  # type: ignore[arg-type]
    unit = jobext.build_queue_unit(released_job(), registry.by_extension("job"), {}, adopted=True)
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    loop.on_unit(None, unit)
    assert "ns/first" not in loop.cache.units
    patch = adoption.completion_status(unit, JobStatus.PENDING, suspended=False, stamped=True, now_text=NOW)
    assert patch is not None
    adopted = {**unit, "metadata": {**unit["metadata"], "resourceVersion": "6"}, "status": patch["status"]}
    loop.on_unit(unit, adopted)
    held = loop.cache.units["ns/first"]
    assert held.phase == "Dequeued" and sum(a.replicas for a in held.admissions) == 2
