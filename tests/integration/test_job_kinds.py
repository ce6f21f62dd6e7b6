"""Every job kind, submitted with plain kubectl, becomes the right QueueUnit and is released its way.

Black box against the real apiserver with the webhook and the reconciler running
(``system_integration``); no pods run in this profile. A job is submitted with only the quota label (no
suspend field: the webhook holds it), and the test checks the QueueUnit the job extension creates
(docs/compatibility.md#queueunit-construction, docs/compatibility.md#job-kinds): the name and its
per-kind suffix, the owner reference, copied labels and annotations, ``consumerRef``, pod sets and the
resource/request totals, and the JOBTYPE column of ``kubectl get qu``. While the quota is too small the
job stays held with a message naming the limiting quota and resource; once the quota has room the unit
is Dequeued and the job is released the way its kind is, with ``koord-queue/job-dequeue-timestamp`` set.

Also: S22 (priority from the PriorityClass value, and a class created after the job), S23 (the priority
annotation overrides, follows later changes and is validated by the webhook), a priority class change on
a Kubeflow template, S34 (Workflow ``min-resources``; a released Workflow counts as running, so
``wait-for-pods-running`` does not hold its queue), ``generateName`` jobs (the resume links their
templates to the unit), pod sets following a scaled queued job, S27 (a RayJob's pod sets follow its live
RayCluster), adoption of a running job whose unit was deleted
(docs/compatibility.md#adoption-of-released-jobs), and the activation / execution-budget annotations
(docs/compatibility.md#activation-and-execution-budget). Deletion of a job's unit needs the garbage
collector, so it is tested in ``tests/e2e/test_job_pods.py``.

Without a controller-manager a deleted namespace never empties, so every test deletes its jobs,
units, quotas and PriorityClasses itself (they would otherwise keep the reconciler busy).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.names import Message
from koord_queue.shared.jobs import registry
from testenv import system
from testenv.cluster import LocalCluster
from tests.scenario import Obj, Scenario, phase, scenario, status

pytestmark = pytest.mark.integration

ROOM = {"cpu": "20", "memory": "64Gi"}
TOO_SMALL = {"cpu": "1", "memory": "64Gi"}
OWNER_ANNOTATION = "example.com/owner"
ADMITTED = ("Dequeued", "Running")


# --- the kinds ------------------------------------------------------------------------------------


def container(cpu: str = "1", memory: str = "1Gi") -> Obj:
    return {
        "name": "main",
        "image": "busybox",
        "command": ["true"],
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }


def template(*, priority_class: str | None = None) -> Obj:
    spec: Obj = {"restartPolicy": "Never", "containers": [container()]}
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {"spec": spec}


def metadata(name: str, quota: str, *, annotations: Mapping[str, str] | None = None) -> Obj:
    return {
        "name": name,
        "labels": {names.QUOTA_NAME_LABEL: quota, "example.com/team": "vision"},
        "annotations": {OWNER_ANNOTATION: "alice", **(annotations or {})},
    }


def batch_job(name: str, quota: str, *, parallelism: int = 2, priority_class: str | None = None) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name, quota),
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": template(priority_class=priority_class),
        },
    }


def tf_job(name: str, quota: str) -> Obj:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata(name, quota),
        "spec": {
            "tfReplicaSpecs": {
                "PS": {"replicas": 1, "template": template()},
                "Worker": {"replicas": 2, "template": template()},
            }
        },
    }


def pytorch_job(name: str, quota: str) -> Obj:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata(name, quota),
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template()},
                "Worker": {"replicas": 3, "template": template()},
            }
        },
    }


def kubeflow_job(kind: str, field: str, replicas: Mapping[str, int]) -> Callable[[str, str], Obj]:
    """A builder for the other Kubeflow kinds, which share TFJob's run policy."""

    def build(name: str, quota: str) -> Obj:
        specs = {role: {"replicas": count, "template": template()} for role, count in replicas.items()}
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": kind,
            "metadata": metadata(name, quota),
            "spec": {field: specs},
        }

    return build


def mpi_job(name: str, quota: str) -> Obj:
    """The MPI operator's MPIJob (``kubeflow.org/v2beta1``): one launcher and two workers."""
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": metadata(name, quota),
        "spec": {
            "slotsPerWorker": 1,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template()},
                "Worker": {"replicas": 2, "template": template()},
            },
        },
    }


def job_set(name: str, quota: str) -> Obj:
    """A JobSet of a driver Job and two worker Jobs of two pods each
    (docs/compatibility.md#jobset)."""

    def replicated(job_name: str, replicas: int, parallelism: int) -> Obj:
        job_spec = {"parallelism": parallelism, "completions": parallelism, "template": template()}
        return {"name": job_name, "replicas": replicas, "template": {"spec": job_spec}}

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata(name, quota),
        "spec": {"replicatedJobs": [replicated("driver", 1, 1), replicated("workers", 2, 2)]},
    }


def ray_job(version: str) -> Callable[[str, str], Obj]:
    def build(name: str, quota: str) -> Obj:
        return {
            "apiVersion": f"ray.io/{version}",
            "kind": "RayJob",
            "metadata": metadata(name, quota),
            "spec": {
                "entrypoint": "python train.py",
                "rayClusterSpec": {
                    "headGroupSpec": {"rayStartParams": {}, "template": template()},
                    "workerGroupSpecs": [
                        {"groupName": "GPU", "replicas": 2, "rayStartParams": {}, "template": template()}
                    ],
                },
            },
        }

    return build


def workflow(name: str, quota: str) -> Obj:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": metadata(
            name, quota, annotations={names.MIN_RESOURCES_ANNOTATION: "cpu: 5\nmemory: 5Gi"}
        ),
        "spec": {
            "entrypoint": "main",
            "templates": [{"name": "main", "container": container()}],
        },
    }


def spark_app(name: str, quota: str) -> Obj:
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": metadata(name, quota),
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "sparkVersion": "3.5.0",
            "mainApplicationFile": "local:///opt/app.py",
            "driver": {"cores": 1, "memory": "1g"},
            "executor": {"instances": 2, "cores": 1, "memory": "2g", "memoryOverhead": "512m"},
        },
    }


def _dequeued(job: Obj) -> bool:
    return bool(annotations_of(job).get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION))


def _spec_suspend(job: Obj) -> bool | None:
    value = (job.get("spec") or {}).get("suspend")
    return value if isinstance(value, bool) else None


def _kubeflow_suspend(job: Obj) -> tuple[bool | None, str | None]:
    return (
        ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"),
        annotations_of(job).get(names.SUSPEND_ANNOTATION),
    )


@dataclass(frozen=True)
class Kind:
    """One job kind: how to build it, what its unit must look like, how it is held and released."""

    id: str
    build: Callable[[str, str], Obj]
    pod_sets: list[tuple[str, int]]
    resource: dict[str, str]
    held: Callable[[Obj], bool]
    released: Callable[[Obj], bool]
    #: The version named by ``consumerRef`` and the owner reference (default: as submitted).
    owner_version: str | None = None


def unit_name_of(job: Obj) -> str:
    """The QueueUnit name the job's adapter gives it (``<name>`` plus the kind's suffix), the one
    declaration of a kind's unit name; tests/unit/test_kind_registry.py checks it against
    docs/compatibility.md#unit-names-and-pod-sets."""
    adapter = registry.by_kind(job["apiVersion"], job["kind"])
    assert adapter is not None, f"no adapter for {job['apiVersion']} {job['kind']}"
    return adapter.queue_unit_name(job)


KINDS = [
    Kind(
        "Job",
        lambda n, q: batch_job(n, q, parallelism=2),
        [("<name>", 2)],
        {"cpu": "2", "memory": "2Gi"},
        held=lambda j: _spec_suspend(j) is True,
        released=lambda j: _spec_suspend(j) is False,
    ),
    Kind(
        "TFJob",
        tf_job,
        [("ps", 1), ("worker", 2)],
        {"cpu": "3", "memory": "3Gi"},
        held=lambda j: _kubeflow_suspend(j) == (True, "true"),
        released=lambda j: _kubeflow_suspend(j)[0] is False and _kubeflow_suspend(j)[1] != "true",
    ),
    Kind(
        "PyTorchJob",
        pytorch_job,
        [("master", 1), ("worker", 3)],
        {"cpu": "4", "memory": "4Gi"},
        held=lambda j: _kubeflow_suspend(j) == (True, "true"),
        released=lambda j: _kubeflow_suspend(j)[0] is False and _kubeflow_suspend(j)[1] != "true",
    ),
    Kind(
        "PaddleJob",
        kubeflow_job("PaddleJob", "paddleReplicaSpecs", {"Master": 1, "Worker": 2}),
        [("master", 1), ("worker", 2)],
        {"cpu": "3", "memory": "3Gi"},
        held=lambda j: _kubeflow_suspend(j) == (True, "true"),
        released=lambda j: _kubeflow_suspend(j)[0] is False and _kubeflow_suspend(j)[1] != "true",
    ),
    Kind(
        "XGBoostJob",
        kubeflow_job("XGBoostJob", "xgbReplicaSpecs", {"Master": 1, "Worker": 1}),
        [("master", 1), ("worker", 1)],
        {"cpu": "2", "memory": "2Gi"},
        held=lambda j: _kubeflow_suspend(j) == (True, "true"),
        released=lambda j: _kubeflow_suspend(j)[0] is False and _kubeflow_suspend(j)[1] != "true",
    ),
    Kind(
        "JAXJob",
        kubeflow_job("JAXJob", "jaxReplicaSpecs", {"Worker": 2}),
        [("worker", 2)],
        {"cpu": "2", "memory": "2Gi"},
        held=lambda j: _kubeflow_suspend(j) == (True, "true"),
        released=lambda j: _kubeflow_suspend(j)[0] is False and _kubeflow_suspend(j)[1] != "true",
    ),
    Kind(
        "MPIJob",
        mpi_job,
        [("launcher", 1), ("worker", 2)],
        {"cpu": "3", "memory": "3Gi"},
        held=lambda j: _kubeflow_suspend(j) == (True, "true"),
        released=lambda j: _kubeflow_suspend(j)[0] is False and _kubeflow_suspend(j)[1] != "true",
    ),
    Kind(
        "JobSet",
        job_set,
        # workers: 2 Jobs x 2 pods
        [("driver", 1), ("workers", 4)],
        {"cpu": "5", "memory": "5Gi"},
        held=lambda j: _spec_suspend(j) is True,
        released=lambda j: _spec_suspend(j) is False,
    ),
    Kind(
        "RayJob-v1",
        ray_job("v1"),
        # and KubeRay's default submitter, 500m and 200Mi (docs/compatibility.md#rayjob)
        [("head", 1), ("gpu", 2), ("submitter", 1)],
        {"cpu": "3500m", "memory": "3272Mi"},
        held=lambda j: _spec_suspend(j) is True,
        released=lambda j: _spec_suspend(j) is False,
    ),
    Kind(
        "RayJob-v1alpha1",
        ray_job("v1alpha1"),
        # and KubeRay's default submitter, 500m and 200Mi (docs/compatibility.md#rayjob)
        [("head", 1), ("gpu", 2), ("submitter", 1)],
        {"cpu": "3500m", "memory": "3272Mi"},
        held=lambda j: _spec_suspend(j) is True,
        released=lambda j: _spec_suspend(j) is False,
        # v1 and v1alpha1 are two views of one stored RayJob; the reconciler watches one, ray.io/v1.
        owner_version="ray.io/v1",
    ),
    Kind(
        "Workflow",
        workflow,
        [("default", 1)],
        {"cpu": "5", "memory": "5Gi"},
        held=lambda j: _spec_suspend(j) is True,
        released=lambda j: _spec_suspend(j) is False,
    ),
    Kind(
        "SparkApplication",
        spark_app,
        # driver 1 cpu 1Gi; executors 2 x (1 cpu, 2Gi + 512Mi overhead)
        [("driver", 1), ("executor", 2)],
        {"cpu": "3", "memory": "6Gi"},
        held=lambda j: annotations_of(j).get(names.SUSPEND_ANNOTATION) == "true",
        released=lambda j: annotations_of(j).get(names.SUSPEND_ANNOTATION) != "true",
    ),
]


# --- reading objects ------------------------------------------------------------------------------


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def milli(resources: Mapping[str, Any]) -> dict[str, int]:
    return {key: quantities.parse_milli(value) for key, value in resources.items()}


def column(table: str, header: str, row_name: str) -> str:
    """The value of one column of a ``kubectl get`` table (columns start where their header does)."""
    lines = table.splitlines()
    start = lines[0].index(header)
    row = next(line for line in lines[1:] if line.split()[0] == row_name)
    return row[start:].split()[0]


@pytest.fixture
async def env(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with scenario(integration_cluster, namespace_in) as it:
        yield it


# --- every kind -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])
async def test_a_job_of_every_kind_gets_its_queue_unit_waits_for_room_and_is_released(
    env: Scenario, kind: Kind
) -> None:
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    name = "job-" + kind.id.lower()
    obj = kind.build(name, quota)
    assert "suspend" not in obj["spec"]
    stored = env.submit(obj)
    assert kind.held(stored), f"the webhook did not hold the {kind.id}: {stored}"
    unit_name = unit_name_of(stored)

    # The unit: name, owner, labels and annotations, consumer, pod sets, totals.
    unit = await env.wait_unit(unit_name)
    meta = unit["metadata"]
    api_version = kind.owner_version or stored["apiVersion"]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": api_version,
            "kind": stored["kind"],
            "name": name,
            "uid": stored["metadata"]["uid"],
        }
    ], meta["ownerReferences"]
    assert meta["labels"] == stored["metadata"]["labels"]
    unit_annotations = meta.get("annotations") or {}
    assert unit_annotations.get(OWNER_ANNOTATION) == "alice"
    assert unit_annotations.get(names.JOB_HAS_ENQUEUED_ANNOTATION) == "true"
    assert "kubectl.kubernetes.io/last-applied-configuration" not in unit_annotations
    spec = unit["spec"]
    ref = spec["consumerRef"]
    assert ref == {
        "apiVersion": api_version,
        "kind": stored["kind"],
        "name": name,
        "namespace": env.ns,
    }
    expected_sets = [(name if n == "<name>" else n, c) for n, c in kind.pod_sets]
    assert [(p["name"], p["count"]) for p in spec["podSet"]] == expected_sets
    assert milli(spec["resource"]) == milli(kind.resource), spec["resource"]
    assert milli(spec["request"]) == milli(kind.resource), spec["request"]
    assert "priority" not in spec and "priorityClassName" not in spec
    if kind.id == "Workflow":  # S34
        (default,) = spec["podSet"]
        requests = default["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert milli(requests) == milli({"cpu": "5", "memory": "5Gi"})

    table = env.kubectl("get", "qu", unit_name, "-n", env.ns).stdout
    assert column(table, "JOBTYPE", unit_name) == stored["kind"], table

    # Too small a quota: the unit waits with the reason, the job stays held.
    limited = Message.limited(quota, "cpu")
    parked = await env.wait_unit(
        unit_name, lambda u: limited in str(status(u).get("message")), what=f"message {limited!r}"
    )
    assert phase(parked) in ("", "Enqueued"), status(parked)
    assert not status(parked).get("admissions"), status(parked)
    job = await env.get_job(obj)
    assert kind.held(job) and not _dequeued(job), job

    # Room: Dequeued, and the job is released the way its kind is.
    await env.resize_quota(quota, ROOM)
    # No pods run in this profile, so only a Workflow (Running once released,
    # docs/compatibility.md#argo-workflow) moves on.
    admitted = await env.wait_unit(unit_name, lambda u: phase(u) in ADMITTED, what=f"phase in {ADMITTED}")
    admissions = {a["name"]: a["replicas"] for a in status(admitted)["admissions"]}
    assert admissions == dict(expected_sets), status(admitted)
    released = await env.wait_job(obj, lambda j: kind.released(j) and _dequeued(j), what="released")
    assert not kind.held(released)
    if kind.id == "Workflow":
        # Upstream's synthetic pod on "mocked-node": a released workflow reports running=1.
        running = await env.wait_unit(unit_name, lambda u: phase(u) == "Running", what="phase Running")
        assert status(running)["admissions"] == [{"name": "default", "replicas": 1, "running": 1}]
        assert status(running)["podState"] == {"running": 1, "pending": 0}
    assert len(await env.list_units()) == 1


async def test_a_released_workflow_counts_as_running_so_wait_for_pods_running_does_not_hold_the_queue(
    env: Scenario,
) -> None:
    quota = env.name("block")
    await env.add_quota(
        quota,
        ROOM,
        labels={names.QUEUE_POLICY_LABEL: "Block"},
        annotations={names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"},
    )
    env.submit(workflow("wf", quota))
    await env.wait_unit("wf", lambda u: phase(u) == "Running", what="workflow Running")
    after = batch_job("after", quota, parallelism=1)
    env.submit(after)
    await env.wait_unit("after", lambda u: phase(u) == "Dequeued", what="the next job admitted")
    await env.wait_job(after, lambda j: _spec_suspend(j) is False, what="released")


@pytest.mark.parametrize(
    "kind", [k for k in KINDS if k.id in ("TFJob", "RayJob-v1", "JobSet")], ids=lambda k: k.id
)
async def test_a_job_created_with_generate_name_has_its_templates_linked_when_released(
    env: Scenario, kind: Kind
) -> None:
    """The webhook cannot name the QueueUnit of a ``generateName`` job; the resume does, so the
    pods (created gated) can be found and ungated. E2e covers the same for a batch Job's pods."""
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    obj = kind.build("ignored", quota)
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "gen-"
    out = env.kubectl("create", "-n", env.ns, "-f", "-", "-o", "name", input_text=yaml.safe_dump(obj))
    name = out.stdout.strip().split("/")[-1]
    obj["metadata"]["name"] = name
    env.remember(obj)
    await env.wait_unit(unit_name_of(obj), lambda u: phase(u) == "Dequeued", what="Dequeued")
    released = await env.wait_job(obj, kind.released, what="released")
    templates = pod_templates(released)
    assert templates
    for template in templates:
        found = template["metadata"]["annotations"]
        assert found[names.RELATED_QUEUEUNIT_ANNOTATION] == f"{env.ns}/{unit_name_of(obj)}", found
        assert found[names.RELATED_PODSET_ANNOTATION], found
        assert {"name": names.ADMISSION_GATE} in template["spec"]["schedulingGates"]


def pod_templates(job: Obj) -> list[Obj]:
    spec = job["spec"]
    if job["kind"] == "TFJob":
        return [r["template"] for r in spec["tfReplicaSpecs"].values()]
    if job["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    cluster = spec["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


# --- priority -------------------------------------------------------------------------------------


async def test_s22_a_jobs_unit_takes_the_priority_class_value_and_kubectl_shows_it(env: Scenario) -> None:
    high = env.name("high")
    env.create_priority_class(high, 100)
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    obj = batch_job("s22", quota, parallelism=2, priority_class=high)
    stored = env.submit(obj)
    assert annotations_of(stored)[names.JOB_HAS_ENQUEUED_ANNOTATION] == "true"

    unit = await env.wait_unit("s22")
    assert unit["spec"]["priority"] == 100
    assert unit["spec"]["priorityClassName"] == high
    assert [(p["name"], p["count"]) for p in unit["spec"]["podSet"]] == [("s22", 2)]
    assert unit["spec"]["consumerRef"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "s22",
        "namespace": env.ns,
    }
    await env.wait_unit("s22", lambda u: phase(u) == "Dequeued", what="phase Dequeued")
    job = await env.wait_job(obj, lambda j: _spec_suspend(j) is False, what="spec.suspend false")
    assert _dequeued(job)

    table = env.kubectl("get", "qu", "-n", env.ns).stdout
    assert table.split("\n")[0].split()[:5] == ["NAME", "PHASE", "PRIORITY", "ADMISSIONS", "JOBTYPE"]
    assert column(table, "PRIORITY", "s22") == "100"
    assert column(table, "JOBTYPE", "s22") == "Job"
    assert column(table, "PHASE", "s22") == "Dequeued"


async def test_s23_the_priority_annotation_overrides_follows_changes_and_is_validated(env: Scenario) -> None:
    mid = env.name("mid")
    env.create_priority_class(mid, 20)
    quota = env.name("q")
    await env.add_quota(quota, ROOM)

    bad = batch_job("bad", quota, priority_class=mid)
    bad["metadata"]["annotations"][names.PRIORITY_ANNOTATION] = "not-a-number"
    denied = env.kubectl("apply", "-n", env.ns, "-f", "-", input_text=yaml.safe_dump(bad), check=False)
    assert denied.returncode != 0 and names.PRIORITY_ANNOTATION in denied.stderr, denied.stderr

    obj = batch_job("s23", quota, priority_class=mid)
    obj["metadata"]["annotations"][names.PRIORITY_ANNOTATION] = "99"
    env.submit(obj)
    unit = await env.wait_unit("s23")
    assert (unit["spec"]["priority"], unit["spec"]["priorityClassName"]) == (99, mid)

    env.kubectl("annotate", "-n", env.ns, "job", "s23", f"{names.PRIORITY_ANNOTATION}=-5", "--overwrite")
    await env.wait_unit("s23", lambda u: u["spec"].get("priority") == -5, what="spec.priority -5")

    refused = env.kubectl(
        "annotate",
        "-n",
        env.ns,
        "job",
        "s23",
        f"{names.PRIORITY_ANNOTATION}=high",
        "--overwrite",
        check=False,
    )
    assert refused.returncode != 0 and names.PRIORITY_ANNOTATION in refused.stderr, refused.stderr

    env.kubectl("annotate", "-n", env.ns, "job", "s23", f"{names.PRIORITY_ANNOTATION}-")
    unit = await env.wait_unit("s23", lambda u: u["spec"].get("priority") == 20, what="class value 20")
    assert unit["spec"]["priorityClassName"] == mid


async def test_a_priority_class_created_after_the_job_gives_the_unit_its_value(env: Scenario) -> None:
    """A NotFound class is ignored at creation (docs/compatibility.md#queueunit-construction);
    upstream's periodic resync then picks the value up once the class exists. The class name is on the
    unit from the start."""
    late = env.name("late")
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    env.submit(batch_job("early", quota, priority_class=late))
    unit = await env.wait_unit("early")
    assert unit["spec"]["priorityClassName"] == late and "priority" not in unit["spec"], unit["spec"]
    env.create_priority_class(late, 42)
    await env.wait_unit(
        "early", lambda u: u["spec"].get("priority") == 42, what="priority 42 from the new class", timeout=10
    )


async def test_changing_a_kubeflow_templates_priority_class_updates_the_unit(env: Scenario) -> None:
    high, low = env.name("high"), env.name("low")
    env.create_priority_class(high, 100)
    env.create_priority_class(low, 5)
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    obj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata("prio", quota),
        "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template(priority_class=high)}}},
    }
    env.submit(obj)
    unit = await env.wait_unit("prio-tf-qu")
    assert (unit["spec"]["priority"], unit["spec"]["priorityClassName"]) == (100, high)

    patch = {"spec": {"tfReplicaSpecs": {"Worker": {"template": {"spec": {"priorityClassName": low}}}}}}
    env.kubectl("patch", "-n", env.ns, "tfjobs.kubeflow.org", "prio", "--type=merge", "-p", json.dumps(patch))
    unit = await env.wait_unit(
        "prio-tf-qu", lambda u: u["spec"].get("priorityClassName") == low, what=f"class {low}"
    )
    assert unit["spec"]["priority"] == 5


# --- pod sets follow the job ------------------------------------------------------------------------


async def test_scaling_a_queued_job_updates_its_units_pod_sets_and_totals(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, TOO_SMALL)
    obj = tf_job("scale", quota)
    env.submit(obj)
    await env.wait_unit(
        "scale-tf-qu", lambda u: "limited quotaName:" in str(status(u).get("message")), what="parked"
    )

    patch = {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 4}}}}
    env.kubectl(
        "patch", "-n", env.ns, "tfjobs.kubeflow.org", "scale", "--type=merge", "-p", json.dumps(patch)
    )
    unit = await env.wait_unit(
        "scale-tf-qu",
        lambda u: [(p["name"], p["count"]) for p in u["spec"]["podSet"]] == [("ps", 1), ("worker", 4)],
        what="pod sets ps:1 worker:4",
    )
    assert milli(unit["spec"]["resource"]) == milli({"cpu": "5", "memory": "5Gi"}), unit["spec"]

    await env.resize_quota(quota, ROOM)
    admitted = await env.wait_unit("scale-tf-qu", lambda u: phase(u) == "Dequeued", what="Dequeued")
    assert {a["name"]: a["replicas"] for a in status(admitted)["admissions"]} == {"ps": 1, "worker": 4}


async def test_s27_a_rayjobs_pod_sets_follow_its_live_raycluster(env: Scenario) -> None:
    """KubeRay's autoscaler grows the RayCluster a RayJob created; upstream raises each pod set count to
    the live cluster's replicas (docs/compatibility.md#s27-rayjob-follows-its-live-raycluster). The test
    plays KubeRay."""
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    obj = ray_job("v1")("auto", quota)
    worker = obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    worker.update(groupName="worker", replicas=0, minReplicas=0, maxReplicas=4)
    stored = env.submit(obj)
    unit = await env.wait_unit("auto-ray-qu", lambda u: phase(u) == "Dequeued", what="Dequeued")
    expected = [("head", 1), ("worker", 0), ("submitter", 1)]
    assert [(p["name"], p["count"]) for p in unit["spec"]["podSet"]] == expected
    await env.wait_job(obj, lambda j: _spec_suspend(j) is False, what="released")

    cluster_name = "auto-raycluster-x7k2p"
    cluster_spec = json.loads(json.dumps(obj["spec"]["rayClusterSpec"]))
    cluster_spec["workerGroupSpecs"][0]["replicas"] = 2
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": cluster_name,
            "labels": {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "auto"},
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayJob",
                    "name": "auto",
                    "uid": stored["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": cluster_spec,
    }
    env.submit(cluster)
    job_status = {"status": {"rayClusterName": cluster_name, "jobDeploymentStatus": "Initializing"}}
    env.kubectl(
        "patch", "-n", env.ns, "rayjobs.v1.ray.io", "auto", "--subresource=status", "--type=merge",
        "-p", json.dumps(job_status),
    )  # fmt: skip
    await env.wait_unit(
        "auto-ray-qu",
        lambda u: (
            [(p["name"], p["count"]) for p in u["spec"]["podSet"]]
            == [("head", 1), ("worker", 2), ("submitter", 1)]
        ),
        what="pod sets head:1 worker:2 from the live RayCluster",
        timeout=15,
    )


async def test_a_released_job_whose_unit_is_deleted_is_adopted_and_keeps_its_quota(env: Scenario) -> None:
    """Adoption (docs/compatibility.md#adoption-of-released-jobs): a job that is no longer Queuing gets
    its unit back as Dequeued ("Deuqueued", sic), still charged to the quota, rather than queued again
    as a new job."""
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "2", "memory": "64Gi"})
    first = batch_job("first", quota, parallelism=2)
    env.submit(first)
    old = await env.wait_unit("first", lambda u: phase(u) == "Dequeued", what="Dequeued")
    await env.wait_job(first, lambda j: _spec_suspend(j) is False, what="released")

    env.kubectl("delete", "qu", "first", "-n", env.ns)
    adopted = await env.wait_unit(
        "first",
        lambda u: u["metadata"]["uid"] != old["metadata"]["uid"] and phase(u) != "",
        what="re-created with a phase",
    )
    assert (phase(adopted), status(adopted).get("message")) == ("Dequeued", Message.ADOPTED), status(adopted)

    second = batch_job("second", quota, parallelism=2)
    env.submit(second)
    await env.wait_unit(
        "second", lambda u: Message.limited(quota, "cpu") in str(status(u).get("message")), what="parked"
    )
    assert _spec_suspend(await env.get_job(second)) is True


# --- activation and execution budget (docs/compatibility.md#activation-and-execution-budget) ------------


async def test_the_active_annotation_holds_releases_and_evicts_a_job(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    sleeper = batch_job("sleeper", quota)
    sleeper["metadata"]["annotations"].update(
        {names.ACTIVE_ANNOTATION: "false", names.MAX_EXEC_TIME_ANNOTATION: "3600"}
    )
    env.submit(sleeper)
    env.submit(batch_job("marker", quota))
    await env.wait_unit("marker", lambda u: phase(u) == "Dequeued", what="marker admitted")
    unit = await env.wait_unit("sleeper")
    assert unit["spec"]["active"] is False
    assert unit["spec"]["maximumExecutionTimeSeconds"] == 3600
    assert phase(unit) in ("", "Enqueued") and not status(unit).get("admissions"), status(unit)
    assert _spec_suspend(await env.get_job(sleeper)) is True

    env.kubectl("annotate", "-n", env.ns, "job", "sleeper", f"{names.ACTIVE_ANNOTATION}=true", "--overwrite")
    await env.wait_unit("sleeper", lambda u: phase(u) == "Dequeued", what="admitted once active")
    await env.wait_job(sleeper, lambda j: _spec_suspend(j) is False and _dequeued(j), what="released")

    env.kubectl("annotate", "-n", env.ns, "job", "sleeper", f"{names.ACTIVE_ANNOTATION}=false", "--overwrite")
    await env.wait_job(
        sleeper, lambda j: _spec_suspend(j) is True and not _dequeued(j), what="suspended again"
    )
    evicted = await env.wait_unit(
        "sleeper", lambda u: status(u).get("message") == Message.DEACTIVATED, what="deactivated"
    )
    assert phase(evicted) == "Enqueued" and status(evicted).get("admissions") == [], status(evicted)
    conds = {c["type"]: c for c in status(evicted).get("conditions") or []}
    assert (conds["Evicted"]["status"], conds["Evicted"]["reason"]) == ("True", "Deactivated"), conds
    await env.wait_event("sleeper", names.EventReason.DEACTIVATED, kind="Job", type_="Normal")


async def test_a_workflow_past_its_execution_budget_is_deactivated_and_suspended(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    obj = workflow("budget", quota)
    obj["metadata"]["annotations"][names.MAX_EXEC_TIME_ANNOTATION] = "2"
    env.submit(obj)
    unit = await env.wait_unit("budget", lambda u: phase(u) == "Running", what="Running")
    assert unit["spec"]["maximumExecutionTimeSeconds"] == 2
    await env.wait_event("budget", names.EventReason.MAX_EXEC_TIME_EXCEEDED, kind="Workflow", type_="Warning")
    await env.wait_job(obj, lambda j: _spec_suspend(j) is True, what="suspended again")
    parked = await env.wait_unit(
        "budget",
        lambda u: phase(u) == "Enqueued" and not status(u).get("admissions"),
        what="back in the queue",
    )
    assert parked["spec"]["active"] is False
