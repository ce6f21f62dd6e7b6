"""The job extensions' I/O edge with a fake client: adoption's two writes and their convergence after
a restart, the RayCluster watch waking the RayJob, and the scheduler loop leaving a unit that awaits
its adoption status alone (docs/compatibility.md#adoption-of-released-jobs,
docs/compatibility.md#s27-rayjob-follows-its-live-raycluster)."""

from __future__ import annotations

from typing import Any

from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.core.config import Settings
from koord_queue.shared.jobs import adoption, jobext, podplan, registry
from koord_queue.shared.jobs.base import JobStatus

NOW = "2024-05-01T10:00:00Z"


class FakeClient:
    """Records writes; a create answers with the object as stored (metadata filled in)."""

    def __init__(self) -> None:
        self.creates: list[kube.Obj] = []
        self.patches: list[tuple[str, Any, str]] = []
        self.deletes: list[tuple[str, str | None, str | None]] = []

    async def delete(self, res: kube.Resource, name: str, **kwargs: Any) -> kube.Obj:
        self.deletes.append((name, kwargs.get("precondition_uid"), kwargs.get("precondition_rv")))
        return {}

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


async def test_an_exhausted_budget_deactivates_the_unit_before_writing_its_status() -> None:
    """The spec first: if the status write then fails, the inactive unit is still parked; in the
    other order a failed second write left the job running with its budget clock stopped."""
    job = released_job()
    job["metadata"]["annotations"][names.MAX_EXEC_TIME_ANNOTATION] = "1"
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {})
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    assert unit["spec"]["maximumExecutionTimeSeconds"] == 1
    unit["status"] = {
        "phase": "Running",
        "admissions": [{"name": "first", "replicas": 2, "running": 2}],
        "conditions": [
            {"type": "PodsReady", "status": "True", "reason": "PodsRunning", "lastTransitionTime": NOW}
        ],
    }
    jobs, client = extensions({"ns/first": unit})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns", "first"))
    assert [(sub, sorted(p)) for _, p, sub in client.patches[:2]] == [
        ("", ["spec"]),
        ("status", ["metadata", "status"]),
    ]
    assert client.patches[0][1] == {"spec": {"active": False}}


# --- orphaned units and the pod index -------------------------------------------------------------

FIRST = JobKey("batch/v1", "Job", "ns", "first")


def orphaned_unit(*, owner_uid: str | None = None, phase: str = "Running") -> kube.Obj:
    """The unit of ``released_job`` as the garbage collector leaves it after ``--cascade=orphan``
    (no owner reference), or still owned by the job with ``owner_uid``; admitted, holding 2 CPU."""
    job = released_job()
    if owner_uid is not None:
        job["metadata"]["uid"] = owner_uid
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {})
    unit["metadata"].update(resourceVersion="7", creationTimestamp=NOW, uid="qu-old")
    if owner_uid is None:
        del unit["metadata"]["ownerReferences"]
    unit["status"] = {"phase": phase, "admissions": [{"name": "first", "replicas": 2, "running": 2}]}
    return unit


def pod(name: str, unit: str = "ns/first", *, bound: bool = True, gated: bool = False) -> kube.Obj:
    obj: kube.Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"pod-{name}",
            "creationTimestamp": NOW,
            "annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: unit},
        },
        "spec": {"nodeName": "node-1" if bound else None},
        "status": {"phase": "Running" if bound else "Pending"},
    }
    if gated:
        obj["spec"]["schedulingGates"] = [{"name": names.ADMISSION_GATE}]
    return obj


def add_pod(jobs: JobExtensions, obj: kube.Obj) -> None:
    key = f"ns/{obj['metadata']['name']}"
    old = jobs.pods.objects.get(key)
    jobs.pods.objects[key] = obj
    jobs.pods.handler(old, obj)


def remove_pod(jobs: JobExtensions, name: str) -> None:
    old = jobs.pods.objects.pop(f"ns/{name}")
    jobs.pods.handler(old, None)


async def test_pending_counts_wait_then_are_written_and_a_deleted_job_leaves_no_timer() -> None:
    """docs/compatibility.md#coalesced-pod-reports: a report of pending pods alone is not written
    at once; the re-check writes it once it has waited long enough; a deleted job's wait is dropped."""
    job = released_job()
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {})
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    unit["status"] = {"phase": "Dequeued", "admissions": [{"name": "first", "replicas": 2, "running": 0}]}
    jobs, client = extensions({"ns/first": unit})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job

    def job_pod(name: str) -> kube.Obj:
        """Released (no gate), not bound yet, owned by the job."""
        obj = pod(name, bound=False)
        obj["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION] = "first"
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "first", "uid": "u-1", "controller": True}
        ]
        return obj

    add_pod(jobs, job_pod("first-a"))
    await jobs.reconcile(FIRST)
    assert status_writes(client) == [] and FIRST in jobs._report_checks
    await jobs.reconcile(FIRST)  # another look before it is due: still waiting, one re-check
    assert status_writes(client) == [] and len(jobs._report_checks) == 1

    jobs._report_since[FIRST] -= podplan.COALESCE_SECONDS  # the re-check is due
    await jobs.reconcile(FIRST)
    [report] = status_writes(client)
    assert report["status"]["podState"] == {"running": 0, "pending": 1}
    assert not jobs._report_checks and not jobs._report_since

    add_pod(jobs, job_pod("first-b"))
    await jobs.reconcile(FIRST)
    assert FIRST in jobs._report_checks
    del jobs.job_informers[("batch/v1", "Job")].objects["ns/first"]
    await jobs.reconcile(FIRST)
    assert not jobs._report_checks and not jobs._report_since


async def test_a_unit_whose_job_was_orphan_deleted_is_released_once_its_pods_are_gone() -> None:
    units = {"ns/first": orphaned_unit()}
    jobs, client = extensions(units)
    add_pod(jobs, pod("first-a"))  # orphaned with its job: it keeps running on its node
    add_pod(jobs, pod("first-b", gated=True, bound=False))  # never released: it does not hold anything
    await jobs.reconcile(FIRST)
    assert client.deletes == []  # still charged: a pod of it still runs

    remove_pod(jobs, "first-a")
    await jobs.reconcile(FIRST)
    assert client.deletes == [("first", "qu-old", "7")]  # conditional on the unit seen
    assert client.creates == [] and client.patches == []


async def test_a_unit_created_directly_without_a_job_is_left_alone() -> None:
    """Decision 8: a unit with no owner and no enqueue stamp copied from a job stands on its own."""
    unit = orphaned_unit()
    del unit["metadata"]["annotations"][names.JOB_HAS_ENQUEUED_ANNOTATION]
    jobs, client = extensions({"ns/first": unit})
    await jobs.reconcile(FIRST)
    assert client.deletes == []


async def test_a_unit_still_owned_by_its_deleted_job_is_left_to_the_garbage_collector() -> None:
    """An ordinary deletion: the owner reference stays and the garbage collector deletes the unit
    (the reconciler deletes only what nothing else ever will). So a job store lagging behind the
    unit store can never make the reconciler delete a live job's unit either."""
    jobs, client = extensions({"ns/first": orphaned_unit(owner_uid="u-1")})
    await jobs.reconcile(FIRST)
    assert client.deletes == [] and client.patches == [] and client.creates == []


def new_first_job() -> kube.Obj:
    """A job re-created under the name ``first`` an hour after its predecessor's unit was made."""
    job = released_job()
    job["metadata"]["annotations"].pop(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
    job["metadata"]["creationTimestamp"] = "2024-05-01T11:00:00Z"
    job["spec"]["suspend"] = True
    return job


async def test_a_new_job_of_the_same_name_never_inherits_an_orphaned_predecessors_unit() -> None:
    units = {"ns/first": orphaned_unit()}  # admitted, ownerless, made before the new job
    jobs, client = extensions(units)
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = new_first_job()
    add_pod(jobs, pod("new-gated", gated=True, bound=False))  # the new job's pod: held, not counted
    await jobs.reconcile(FIRST)
    assert client.deletes == [("first", "qu-old", "7")]
    assert client.patches == []  # not resumed on the old admission

    del units["ns/first"]  # the deletion's watch event
    await jobs.reconcile(FIRST)
    [created] = client.creates
    assert [r["uid"] for r in created["metadata"]["ownerReferences"]] == ["u-1"]


async def test_a_new_job_of_the_same_name_waits_for_the_garbage_collector_to_delete_the_old_unit() -> None:
    units = {"ns/first": orphaned_unit(owner_uid="u-0")}  # still owned by the deleted predecessor
    jobs, client = extensions(units)
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = new_first_job()
    await jobs.reconcile(FIRST)
    assert client.deletes == [] and client.patches == [] and client.creates == []

    del units["ns/first"]
    await jobs.reconcile(FIRST)
    [created] = client.creates
    assert [r["uid"] for r in created["metadata"]["ownerReferences"]] == ["u-1"]


async def test_the_unit_of_a_job_being_orphan_deleted_is_released_only_once_the_job_is_gone() -> None:
    """While the deletion runs, the job is still there and its unit already lost the owner
    reference: the unit is younger than the job, so it is still the job's."""
    unit = orphaned_unit()
    unit["metadata"]["creationTimestamp"] = "2024-05-01T10:00:01Z"
    job = released_job()
    job["metadata"].update(creationTimestamp=NOW, deletionTimestamp="2024-05-01T12:00:00Z")
    jobs, client = extensions({"ns/first": unit})
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    await jobs.reconcile(FIRST)
    assert client.deletes == []

    del jobs.job_informers[("batch/v1", "Job")].objects["ns/first"]
    await jobs.reconcile(FIRST)
    assert client.deletes == [("first", "qu-old", "7")]


def test_the_pod_index_forgets_pods_and_units_that_are_gone() -> None:
    units: dict[str, kube.Obj] = {}
    jobs, _ = extensions(units)
    add_pod(jobs, pod("a"))
    add_pod(jobs, pod("b"))
    add_pod(jobs, pod("c", unit="ns/other"))
    assert jobs._pods_by_unit == {"ns/first": {"ns/a", "ns/b"}, "ns/other": {"ns/c"}}

    add_pod(jobs, pod("b", unit="ns/other"))  # its annotation now names another unit
    assert jobs._pods_by_unit == {"ns/first": {"ns/a"}, "ns/other": {"ns/b", "ns/c"}}
    remove_pod(jobs, "a")
    assert jobs._pods_by_unit == {"ns/other": {"ns/b", "ns/c"}}  # no empty set left behind

    # A unit that goes away keeps only the pods that still exist (a unit re-created under the same
    # key, for adoption, must find them); pods missed by the informer are dropped.
    jobs._pods_by_unit["ns/other"].add("ns/ghost")
    other = {"metadata": {"name": "other", "namespace": "ns"}, "spec": {}}
    jobs.on_unit(other, None)
    assert jobs._pods_by_unit == {"ns/other": {"ns/b", "ns/c"}}
    remove_pod(jobs, "b")
    remove_pod(jobs, "c")
    assert jobs._pods_by_unit == {}
    jobs._pods_by_unit["ns/gone"] = {"ns/ghost"}
    jobs.on_unit({"metadata": {"name": "gone", "namespace": "ns"}, "spec": {}}, None)
    assert jobs._pods_by_unit == {}


# --- pods owned through child Jobs: an MPIJob's launcher, a JobSet's replicated jobs ------------------
# (docs/compatibility.md#pod-gating, docs/compatibility.md#jobset)

JOBSET = JobKey("jobset.x-k8s.io/v1alpha2", "JobSet", "ns", "js")


def test_jobs_are_watched_once_and_only_when_a_kind_owns_pods_through_them() -> None:
    alone, _ = extensions({}, extensions=("job", "tfjob"))
    assert alone.child_jobs is None and plurals(alone).count("jobs") == 1
    for enabled in (("jobset",), ("mpijob",), ("mpijob", "jobset")):
        own, _ = extensions({}, extensions=enabled)
        assert own.child_jobs is not None and plurals(own).count("jobs") == 1, enabled
        # Watched only to link pods: a Job is kept as its identity and owners.
        assert own.child_jobs.transform is not None
        assert own.child_jobs.transform(child_job("x", "JobSet", "js", spec=True)) == child_job(
            "x", "JobSet", "js"
        )
    both, _ = extensions({}, extensions=("job", "jobset"))
    assert both.child_jobs is both.job_informers[("batch/v1", "Job")]
    assert plurals(both).count("jobs") == 1


def child_job(name: str, kind: str, parent: str, *, spec: bool = False) -> kube.Obj:
    api_version = "kubeflow.org/v2beta1" if kind == "MPIJob" else "jobset.x-k8s.io/v1alpha2"
    owner = {
        "apiVersion": api_version,
        "kind": kind,
        "name": parent,
        "uid": f"{parent}-uid",
        "controller": True,
    }
    job: kube.Obj = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid", "ownerReferences": [owner]}
    }
    if spec:
        job["spec"] = {"parallelism": 2, "template": {"spec": {"containers": []}}}
    return job


def test_a_child_job_that_appears_or_goes_wakes_its_parent_and_status_churn_does_not() -> None:
    def parents(jobs: JobExtensions) -> list[JobKey]:
        """Marked keys other than Jobs (the ``job`` extension looks at a deleted Job itself)."""
        return [key for key in jobs._dirty if key.kind != "Job"]

    for enabled in (("jobset", "mpijob"), ("job", "jobset", "mpijob", "tfjob")):
        jobs, _ = extensions({}, extensions=enabled)
        assert jobs.child_jobs is not None
        launcher = child_job("train-launcher", "MPIJob", "train")
        jobs.child_jobs.handler(None, launcher)
        assert parents(jobs) == [JobKey("kubeflow.org/v2beta1", "MPIJob", "ns", "train")], enabled
        jobs._dirty.clear()
        workers = child_job("js-workers-0", "JobSet", "js")
        jobs.child_jobs.handler(workers, {**workers, "status": {"active": 2}})
        assert not jobs._dirty
        jobs.child_jobs.handler(workers, None)
        assert parents(jobs) == [JOBSET]
        jobs._dirty.clear()
        # A Job of a kind whose pods it does not own wakes nothing.
        tf_owner = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "name": "tf",
            "uid": "u",
            "controller": True,
        }
        jobs.child_jobs.handler(None, {"metadata": {**workers["metadata"], "ownerReferences": [tf_owner]}})
        assert not parents(jobs)


def released_jobset(*, active: int) -> kube.Obj:
    container = {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    pod_template = {
        "metadata": {
            "annotations": {
                names.RELATED_QUEUEUNIT_ANNOTATION: "ns/js-jobset-qu",
                names.RELATED_PODSET_ANNOTATION: "workers",
            }
        },
        "spec": {"containers": [container], "schedulingGates": [{"name": names.ADMISSION_GATE}]},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "js",
            "namespace": "ns",
            "uid": "js-uid",
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": {
                names.JOB_HAS_ENQUEUED_ANNOTATION: "true",
                names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: NOW,
            },
        },
        "spec": {
            "suspend": False,
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {"spec": {"parallelism": 2, "template": pod_template}},
                }
            ],
        },
        "status": {"replicatedJobsStatus": [{"name": "workers", "active": active}]},
    }


def jobset_pod(name: str, owner: str, *, bound: bool = False) -> kube.Obj:
    """A pod the Job controller made from the child Job's (gated) template."""
    obj = pod(name, "ns/js-jobset-qu", bound=bound, gated=not bound)
    obj["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION] = "workers"
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": f"{owner}-uid", "controller": True}
    ]
    return obj


def admitted_jobset_unit(job: kube.Obj) -> kube.Obj:
    unit = jobext.build_queue_unit(job, registry.by_extension("jobset"), {})
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    unit["status"] = {"phase": "Dequeued", "admissions": [{"name": "workers", "replicas": 2, "running": 0}]}
    return unit


async def test_a_jobsets_pods_are_released_through_its_child_job_and_no_other() -> None:
    """The pods are owned by the child Job, which the JobSet owns: both links are checked by UID.
    A pod naming the unit but owned by a Job the JobSet does not own stays gated; the unit is not
    Running while its pods are active but unbound (a JobSet counts gated pods as active)."""
    job = released_jobset(active=1)
    jobs, client = extensions({"ns/js-jobset-qu": admitted_jobset_unit(job)}, extensions=("jobset",))
    assert jobs.child_jobs is not None
    jobs.job_informers[(JOBSET.api_version, JOBSET.kind)].objects["ns/js"] = job
    jobs.child_jobs.objects["ns/js-workers-0"] = child_job("js-workers-0", "JobSet", "js")
    stranger = child_job("other-0", "JobSet", "other")  # another JobSet's Job, same namespace
    jobs.child_jobs.objects["ns/other-0"] = stranger
    for name, owner in (
        ("w-a", "js-workers-0"),
        ("w-b", "js-workers-0"),
        ("fake", "other-0"),
        ("early", "late"),
    ):
        add_pod(jobs, jobset_pod(name, owner))
    await jobs.reconcile(JOBSET)
    ungated = sorted(name for name, ops, sub in client.patches if sub == "" and isinstance(ops, list))
    assert ungated == ["w-a", "w-b"]
    # Active but unbound: still Dequeued, still reclaimable; the pending counts alone wait for a
    # write that matters (docs/compatibility.md#coalesced-pod-reports).
    assert status_writes(client) == [] and JOBSET in jobs._report_checks

    # The Job of a pod seen first appears: the JobSet is woken and the pod counts from then on.
    jobs._dirty.clear()
    jobs.child_jobs.handler(None, child_job("late", "JobSet", "js"))
    jobs.child_jobs.objects["ns/late"] = child_job("late", "JobSet", "js")
    assert list(jobs._dirty) == [JOBSET]
    add_pod(jobs, jobset_pod("w-a", "js-workers-0", bound=True))
    client.patches.clear()
    await jobs.reconcile(JOBSET)
    ungated = sorted(name for name, ops, sub in client.patches if sub == "" and isinstance(ops, list))
    assert "early" in ungated  # counted now, and released into the admission's free replica
    [report] = status_writes(client)
    assert report["status"]["phase"] == "Running" and report["status"]["podState"]["running"] == 1


class VersioningClient(FakeClient):
    """Answers each status write with the unit at the next resourceVersion, as the apiserver does."""

    def __init__(self, rv: int) -> None:
        super().__init__()
        self.rv = rv

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        await super().patch(res, name, patch, **kwargs)
        self.rv += 1
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(self.rv)}}


async def test_a_report_waits_for_the_watch_to_deliver_our_own_write() -> None:
    """A pod event right after our report (kwok or the kubelet marking the bound pod Running) finds
    the store still holding the unit before that report; planning on it would write the same report
    again, conditional on the old resourceVersion: a 409. The job waits for the watch instead."""
    job = released_job()
    unit = jobext.build_queue_unit(job, registry.by_extension("job"), {})
    unit["metadata"].update(resourceVersion="5", creationTimestamp=NOW)
    unit["status"] = {"phase": "Dequeued", "admissions": [{"name": "first", "replicas": 2, "running": 0}]}
    units = {"ns/first": unit}
    client = VersioningClient(rv=5)
    jobs = JobExtensions(
        client,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=lambda: units,
        priority_classes=dict,
        events=FakeEvents(),  # type: ignore[arg-type]
    )
    job["status"] = {"active": 2}
    jobs.job_informers[("batch/v1", "Job")].objects["ns/first"] = job
    for name in ("first-a", "first-b"):
        obj = pod(name)
        obj["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION] = "first"
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "first", "uid": "u-1", "controller": True}
        ]
        add_pod(jobs, obj)

    await jobs.reconcile(FIRST)
    [report] = status_writes(client)
    assert report["status"]["phase"] == "Running" and report["metadata"]["resourceVersion"] == "5"
    assert jobs._unit_written.versions == {"ns/first": 6}

    await jobs.reconcile(FIRST)  # a pod event; the unit's watch has not delivered rv 6 yet
    assert len(status_writes(client)) == 1, "a report planned on the unit before our own write"

    delivered = {**unit, "metadata": {**unit["metadata"], "resourceVersion": "6"}}
    delivered["status"] = {**unit["status"], **report["status"]}
    units["ns/first"] = delivered
    jobs.on_unit(unit, delivered)
    assert jobs._unit_written.versions == {}, "forgotten once the watch delivered it"
    await jobs.reconcile(FIRST)
    assert len(status_writes(client)) == 1, "nothing new to report"
