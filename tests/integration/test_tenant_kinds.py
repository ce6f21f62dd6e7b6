"""A hostile namespace user against the Workflow, SparkApplication, MPIJob and JobSet holds, on the
real apiserver.

alice (``kubectl --as=alice``, the admin kubeconfig impersonating her) has only namespace rights:
create, get, list, patch and update on Workflows, SparkApplications, MPIJobs, JobSets, Jobs and pods
in her namespace. The webhook, the admission policies and the reconciler run as installed
(``system_integration``).

Workflow: its demand is declared by ``koord-queue/min-resources`` (its pods cannot be counted up
front), so a Workflow without it is refused with a message naming it, and its size is frozen once
queued. Argo's CRD has no status subresource, so alice can send a status with the object: a status
sent on CREATE is dropped and does not skip the hold, and a status change is refused, so a made-up
``Succeeded`` neither releases the hold nor the quota. As a control, the same status written by
Argo's controller (its ServiceAccount, trusted with Workflow status) does finish the unit.

SparkApplication: the stock Spark operator ignores the suspend annotation, so what holds the pods is
the pod webhook: a pod carrying ``koord-queue/gated-pod`` (copied from ``spec.driver.labels`` /
``spec.executor.labels``, as the operator and Spark copy them) is created gated. alice can neither
remove the label from her application nor the gate from her pod; once admitted, the reconciler
releases exactly the admitted pods. The test plays the operator (no Spark operator runs here).

MPIJob and JobSet (docs/compatibility.md#kubeflow-jobs, docs/compatibility.md#jobset): alice can
neither release a queued one (either hold of an MPIJob, a JobSet's ``spec.suspend``), nor take the
gate off one of its pod templates, nor strip the enqueue annotations or move it to another quota.
Their pods are owned by the ``batch/v1`` Jobs their controllers create (an MPIJob's launcher, every
pod of a JobSet): once admitted, the reconciler finds them through those Jobs and releases exactly
the admitted pods, while a pod alice makes to look like one of them (same annotations, owned by a
Job of hers) stays gated. The tests play the operators (none runs here).
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import wait_until
from tests import kube
from tests.integration.test_job_kinds import (
    KINDS,
    ROOM,
    TOO_SMALL,
    annotations_of,
    job_set,
    milli,
    mpi_job,
    spark_app,
    workflow,
)
from tests.scenario import Obj, Scenario, phase, status

pytestmark = pytest.mark.integration

USER = "alice"
#: Argo's workflow controller, the writer the webhook trusts with Workflow status by default.
ARGO = "system:serviceaccount:argo:argo"
GATE = {"name": names.ADMISSION_GATE}
WORKFLOWS = "workflows.argoproj.io"
SPARK_APPS = "sparkapplications.sparkoperator.k8s.io"
MIN_RESOURCES = names.MIN_RESOURCES_ANNOTATION


# --- alice ----------------------------------------------------------------------------------------


def rbac(namespace: str) -> list[Obj]:
    """alice's namespace rights, and Argo's controller's (status writes), nothing more."""
    verbs = ["create", "get", "list", "patch", "update"]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tenant", "namespace": namespace},
        "rules": [
            {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": verbs},
            {"apiGroups": ["sparkoperator.k8s.io"], "resources": ["sparkapplications"], "verbs": verbs},
            {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": verbs},
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": verbs},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": verbs},
            {"apiGroups": [""], "resources": ["pods"], "verbs": verbs},
        ],
    }
    subjects = {
        USER: {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER},
        "argo": {"kind": "ServiceAccount", "name": "argo", "namespace": "argo"},
    }
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"tenant-{who}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [subject],
        }
        for who, subject in subjects.items()
    ]
    return [role, *bindings]


class Tenant:
    """The test namespace's :class:`Scenario` (admin: quotas, reads, cleanup) plus alice's kubectl."""

    def __init__(self, env: Scenario) -> None:
        self.env = env
        self.cluster = env.cluster
        self.ns = env.ns
        self._pods: list[str] = []

    def run(
        self, *args: str, user: str = USER, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """kubectl in the namespace as ``user``; never raises (the tests read the outcome)."""
        return kube.kubectl(
            self.cluster, f"--as={user}", "-n", self.ns, *args, input_text=input_text, check=False
        )

    def create(self, obj: Obj, *, user: str = USER) -> subprocess.CompletedProcess[str]:
        """Create ``obj``; on success stdout is the object as stored by this write (JSON), before
        any later write (the reconciler's) changes it."""
        result = self.run("create", "-f", "-", "-o", "json", user=user, input_text=yaml.safe_dump(obj))
        if result.returncode == 0:
            if obj["kind"] == "Pod":
                self._pods.append(obj["metadata"]["name"])
            else:
                self.env.remember(obj)
        return result

    def as_controller(self, obj: Obj) -> Obj:
        """Create ``obj`` with the admin's rights, as a job kind's controller would (it is
        cleaned up like alice's objects); returns it as stored."""
        out = kube.kubectl(
            self.cluster, "create", "-n", self.ns, "-f", "-", "-o", "json", input_text=yaml.safe_dump(obj)
        )
        if obj["kind"] == "Pod":
            self._pods.append(obj["metadata"]["name"])
        else:
            self.env.remember(obj)
        stored: Obj = json.loads(out.stdout)
        return stored

    def patch(
        self, resource: str, name: str, body: object, *, kind: str = "merge", user: str = USER
    ) -> subprocess.CompletedProcess[str]:
        return self.run("patch", resource, name, f"--type={kind}", "-p", json.dumps(body), user=user)

    def get(self, resource: str, name: str) -> Obj:
        out = kube.kubectl(self.cluster, "get", "-n", self.ns, resource, name, "-o", "json")
        result: Obj = json.loads(out.stdout)
        return result

    def delete_pods(self) -> None:
        for name in self._pods:
            kube.kubectl(
                self.cluster, "delete", "-n", self.ns, "pod", name, "--ignore-not-found", "--wait=false"
            )


@pytest.fixture(scope="module")
def serving(integration_cluster: LocalCluster, system_integration: system.Processes) -> None:
    """Webhook configurations take effect asynchronously: dry-run, as the admin, what the tests
    rely on until the apiserver calls the webhooks (a sizeless Workflow refused, a labelled pod
    gated)."""
    sizeless = sizeless_workflow("probe", "probe-quota")
    labelled = spark_pod("probe", "driver", {})

    def workflow_refused() -> bool:
        try:
            dry_run(integration_cluster, "/apis/argoproj.io/v1alpha1/namespaces/default/workflows", sizeless)
        except urllib.error.HTTPError as err:
            return MIN_RESOURCES in err.read().decode(errors="replace")
        return False

    def pod_gated() -> bool:
        created = json.loads(dry_run(integration_cluster, "/api/v1/namespaces/default/pods", labelled))
        return GATE in (created["spec"].get("schedulingGates") or [])

    wait_until(workflow_refused, timeout=30, what="the job webhook refusing a sizeless Workflow")
    wait_until(pod_gated, timeout=30, what="the pod webhook gating a labelled pod")


def dry_run(cluster: LocalCluster, path: str, body: Obj) -> str:
    """POST ``body`` as the cluster admin without storing it; raises HTTPError on a refusal."""
    return cluster.request("POST", f"{path}?dryRun=All", body)


@pytest.fixture
async def tenant(
    integration_cluster: LocalCluster, system_integration: system.Processes, serving: None, namespace_in: str
) -> AsyncIterator[Tenant]:
    async with kube.client(integration_cluster) as api:
        env = Scenario(api, integration_cluster, namespace_in)
        it = Tenant(env)
        kube.kubectl(
            integration_cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(rbac(namespace_in))
        )

        async def allowed() -> bool:
            for user in (USER, ARGO):
                probe = it.run("auth", "can-i", "patch", WORKFLOWS, user=user)
                if probe.stdout.strip() != "yes":
                    return False
            return it.run("auth", "can-i", "create", "pods").stdout.strip() == "yes"

        await kube.eventually(allowed, what="alice's and Argo's RoleBindings in effect")
        # alice is a namespace user and nothing more.
        assert it.run("auth", "can-i", "patch", "queueunits.scheduling.x-k8s.io").stdout.strip() == "no"
        try:
            yield it
        finally:
            it.delete_pods()
            await env.cleanup()


def sizeless_workflow(name: str, quota: str) -> Obj:
    obj = workflow(name, quota)
    del obj["metadata"]["annotations"][MIN_RESOURCES]
    return obj


def refused(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, f"expected a refusal, got: {result.stdout}"
    assert "denied the request" in result.stderr or "ValidatingAdmissionPolicy" in result.stderr, (
        result.stderr
    )
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return result.stderr


# --- Workflow: min-resources ------------------------------------------------------------------------


async def test_a_workflow_without_min_resources_is_refused_with_a_message_naming_it(tenant: Tenant) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, ROOM)
    refused(
        tenant.create(sizeless_workflow("nosize", quota)),
        f"metadata.annotations[{MIN_RESOURCES}]: Required value",
        "cannot be counted up front",
        f"""{MIN_RESOURCES}: '{{"cpu": "4", "memory": "8Gi"}}'""",
    )
    assert tenant.run("get", WORKFLOWS, "nosize").returncode != 0, "a refused Workflow must not be stored"
    # The refusal is about the annotation, not alice's rights: with it, she may create it.
    created = tenant.create(workflow("sized", quota))
    assert created.returncode == 0, created.stderr


async def test_alice_cannot_resize_a_queued_workflow_to_fit(tenant: Tenant) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    assert tenant.create(workflow("big", quota)).returncode == 0
    await tenant.env.wait_unit(
        "big", lambda u: "limited quotaName:" in str(status(u).get("message")), what="parked for cpu"
    )
    for attempt in (
        tenant.run("annotate", WORKFLOWS, "big", f"{MIN_RESOURCES}=cpu: 1", "--overwrite"),
        tenant.run("annotate", WORKFLOWS, "big", f"{MIN_RESOURCES}-"),
        tenant.patch(WORKFLOWS, "big", {"metadata": {"annotations": {MIN_RESOURCES: '{"cpu": "500m"}'}}}),
    ):
        refused(attempt, f"metadata.annotations[{MIN_RESOURCES}]: Forbidden", MIN_RESOURCES)
    stored = tenant.get(WORKFLOWS, "big")
    assert annotations_of(stored)[MIN_RESOURCES] == "cpu: 5\nmemory: 5Gi"
    assert stored["spec"]["suspend"] is True
    unit = await tenant.env.wait_unit("big")
    assert milli(unit["spec"]["resource"]) == milli({"cpu": "5", "memory": "5Gi"}), unit["spec"]
    assert not status(unit).get("admissions"), status(unit)


# --- Workflow: status without a subresource ------------------------------------------------------------


@pytest.mark.parametrize(
    "forged",
    [
        {"phase": "Succeeded", "finishedAt": "2025-01-01T00:00:00Z"},
        {
            "phase": "Running",
            "startedAt": "2025-01-01T00:00:00Z",
            "conditions": [{"type": "Enqueued", "status": "True"}],
            "nodes": {"x": {"id": "x", "type": "Pod", "phase": "Running"}},
        },
    ],
    ids=["succeeded", "running"],
)
async def test_a_status_sent_on_create_is_dropped_and_the_workflow_stays_held(
    tenant: Tenant, forged: Obj
) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    obj = {**workflow("forged", quota), "status": forged}
    created = tenant.create(obj)
    assert created.returncode == 0, created.stderr
    stored = tenant.get(WORKFLOWS, "forged")
    assert "status" not in stored, f"the made-up status was stored: {stored.get('status')}"
    assert stored["spec"]["suspend"] is True
    assert annotations_of(stored).get(names.JOB_HAS_ENQUEUED_ANNOTATION) == "true"
    unit = await tenant.env.wait_unit(
        "forged", lambda u: "limited quotaName:" in str(status(u).get("message")), what="queued and parked"
    )
    assert phase(unit) not in (names.Phase.SUCCEED, names.Phase.RUNNING, names.Phase.DEQUEUED), status(unit)
    assert tenant.get(WORKFLOWS, "forged")["spec"]["suspend"] is True


async def test_alice_cannot_mark_a_held_workflow_finished_to_release_it(tenant: Tenant) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    assert tenant.create(workflow("held", quota)).returncode == 0
    await tenant.env.wait_unit("held", lambda u: "limited quotaName:" in str(status(u).get("message")))
    refused(tenant.patch(WORKFLOWS, "held", {"status": {"phase": "Failed"}}), "status: Forbidden")
    # Even a status and a release in one write: both refused.
    both = {"status": {"phase": "Succeeded"}, "spec": {"suspend": False}}
    refused(tenant.patch(WORKFLOWS, "held", both), "status: Forbidden", "spec.suspend: Forbidden")
    stored = tenant.get(WORKFLOWS, "held")
    assert stored["spec"]["suspend"] is True and "status" not in stored, stored


async def test_alice_cannot_mark_an_admitted_workflow_succeeded_and_its_unit_keeps_its_quota(
    tenant: Tenant,
) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, ROOM)
    obj = workflow("admitted", quota)
    assert tenant.create(obj).returncode == 0
    before = await tenant.env.wait_unit(
        "admitted", lambda u: phase(u) == names.Phase.RUNNING, what="admitted and running"
    )
    await tenant.env.wait_job(obj, lambda j: j["spec"].get("suspend") is False, what="released")
    admissions = status(before)["admissions"]
    assert admissions == [{"name": "default", "replicas": 1, "running": 1}], admissions

    refused(tenant.patch(WORKFLOWS, "admitted", {"status": {"phase": "Succeeded"}}), "status: Forbidden")
    refused(
        tenant.patch(
            WORKFLOWS,
            "admitted",
            [{"op": "add", "path": "/status", "value": {"phase": "Error"}}],
            kind="json",
        ),
        "status: Forbidden",
    )
    assert "status" not in tenant.get(WORKFLOWS, "admitted")
    unit = await tenant.env.wait_unit("admitted")
    assert (phase(unit), status(unit)["admissions"]) == (names.Phase.RUNNING, admissions), status(unit)

    # Control: the same write by Argo's controller is accepted and does finish the unit, releasing
    # its quota. So the refusal above is what kept alice's workflow charged.
    done = tenant.patch(WORKFLOWS, "admitted", {"status": {"phase": "Succeeded"}}, user=ARGO)
    assert done.returncode == 0, done.stderr
    finished = await tenant.env.wait_unit(
        "admitted", lambda u: phase(u) == names.Phase.SUCCEED, what="Succeed after Argo's status write"
    )
    assert status(finished)["admissions"] == [], status(finished)


# --- SparkApplication: pods held by the pod webhook ------------------------------------------------------


def spark_pod(
    app: str, role: str, spec_role: Mapping[str, Any], *, owner: Obj | None = None, index: int = 0
) -> Obj:
    """A pod as the Spark operator (driver) or the driver (executors) creates it: the role's labels
    and annotations from the SparkApplication, Spark's own labels, owned by the app (driver) or by
    the driver pod (executors)."""
    name = f"{app}-driver" if role == "driver" else f"{app}-exec-{index}"
    metadata: Obj = {
        "name": name,
        "labels": {
            **(spec_role.get("labels") or {names.GATED_POD_LABEL: "true"}),
            "spark-role": role,
            "sparkoperator.k8s.io/app-name": app,
        },
        "annotations": dict(spec_role.get("annotations") or {}),
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    container = {
        "name": f"spark-kubernetes-{role}",
        "image": "spark:3.5.0",
        "resources": {"requests": {"cpu": "1"}},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container]}}


def created(result: subprocess.CompletedProcess[str]) -> Obj:
    """The object a successful ``Tenant.create`` stored."""
    assert result.returncode == 0, result.stderr
    obj: Obj = json.loads(result.stdout)
    return obj


def gates(pod: Obj) -> list[Obj]:
    return list(pod["spec"].get("schedulingGates") or [])


async def test_a_spark_driver_created_for_alice_is_gated_and_she_cannot_ungate_it(tenant: Tenant) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    app = spark_app("etl", quota)
    assert tenant.create(app).returncode == 0
    stored = tenant.get(SPARK_APPS, "etl")
    for role in ("driver", "executor"):
        assert stored["spec"][role]["labels"][names.GATED_POD_LABEL] == "true", stored["spec"][role]
    await tenant.env.wait_unit(
        "etl-spark-qu", lambda u: "limited quotaName:" in str(status(u).get("message"))
    )

    # The stock operator ignores the suspend annotation and creates the driver right away.
    driver = spark_pod("etl", "driver", stored["spec"]["driver"], owner=stored)
    assert GATE in gates(created(tenant.create(driver)))
    pod = tenant.get("pod", "etl-driver")
    assert GATE in gates(pod) and "nodeName" not in pod["spec"], pod["spec"]

    # alice may not take the gate off: the admission policy refuses it (it takes effect a moment
    # after it is installed, so dry runs until it answers, then the real write).
    remove = [{"op": "remove", "path": "/spec/schedulingGates"}]

    async def policy_active() -> bool:
        probe = tenant.run(
            "patch", "pod", "etl-driver", "--type=json", "-p", json.dumps(remove), "--dry-run=server"
        )
        return probe.returncode != 0

    await kube.eventually(policy_active, what="the admission-gate policy refuses a gate removal")
    refused(tenant.patch("pod", "etl-driver", remove, kind="json"), names.ADMISSION_GATE)
    assert GATE in gates(tenant.get("pod", "etl-driver"))

    # Nor the label from her application, which would let the next run's pods through.
    label_path = f"spec.driver.labels[{names.GATED_POD_LABEL}]: Forbidden"
    refused(
        tenant.patch(SPARK_APPS, "etl", {"spec": {"driver": {"labels": {names.GATED_POD_LABEL: None}}}}),
        label_path,
    )
    refused(
        tenant.patch(SPARK_APPS, "etl", {"spec": {"driver": {"labels": {names.GATED_POD_LABEL: "false"}}}}),
        label_path,
    )
    assert tenant.get(SPARK_APPS, "etl")["spec"]["driver"]["labels"][names.GATED_POD_LABEL] == "true"

    # Control: a pod without the label is not the pod webhook's business.
    plain = spark_pod("other", "driver", {"labels": {"app": "plain"}})
    assert gates(created(tenant.create(plain))) == []


async def test_a_spark_applications_pods_wait_for_admission_then_exactly_the_admitted_run(
    tenant: Tenant,
) -> None:
    """The stock operator's order: the driver is created at once from the application as stored at
    CREATE (so the pod carries what the webhook wrote then) and waits gated while the application
    is queued; once admitted, the reconciler finds it (owned by the application, linked by its
    annotations) and releases it; the running driver then creates its executors (owned by it),
    one more than admitted (dynamic allocation asking for more): exactly two are released."""
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    app = created(tenant.create(spark_app("pi", quota)))
    driver_pod = created(tenant.create(spark_pod("pi", "driver", app["spec"]["driver"], owner=app)))
    assert GATE in gates(driver_pod)
    await tenant.env.wait_unit("pi-spark-qu", lambda u: "limited quotaName:" in str(status(u).get("message")))
    assert GATE in gates(tenant.get("pod", "pi-driver")), "released while the application is queued"

    await tenant.env.resize_quota(quota, ROOM)
    unit = await tenant.env.wait_unit(
        "pi-spark-qu", lambda u: phase(u) == names.Phase.DEQUEUED, what="admitted"
    )
    assert {a["name"]: a["replicas"] for a in status(unit)["admissions"]} == {"driver": 1, "executor": 2}

    async def driver_released() -> bool:
        return GATE not in gates(tenant.get("pod", "pi-driver"))

    await kube.eventually(driver_released, what="the driver released")
    executors = [f"pi-exec-{i}" for i in range(1, 4)]
    for i, name in enumerate(executors, start=1):
        executor = spark_pod("pi", "executor", app["spec"]["executor"], owner=driver_pod, index=i)
        assert GATE in gates(created(tenant.create(executor))), name

    async def released() -> dict[str, bool] | None:
        found = {name: GATE in gates(tenant.get("pod", name)) for name in executors}
        return found if sum(not gated for gated in found.values()) == 2 else None

    found = await kube.eventually(released, what="two executors released")
    assert found == {"pi-exec-1": False, "pi-exec-2": False, "pi-exec-3": True}


# --- MPIJob and JobSet: the holds, and pods linked through the controllers' Jobs --------------------

MPIJOBS = "mpijobs.kubeflow.org"
JOBSETS = "jobsets.jobset.x-k8s.io"
HELD = {kind.id: kind for kind in KINDS}


def _remove(path: str) -> list[Obj]:
    return [{"op": "remove", "path": path}]


def _replace(path: str, value: object) -> list[Obj]:
    return [{"op": "replace", "path": path, "value": value}]


QUOTA_LABEL_POINTER = "/metadata/labels/" + names.QUOTA_NAME_LABEL.replace("/", "~1")
SUSPEND_POINTER = "/metadata/annotations/" + names.SUSPEND_ANNOTATION.replace("/", "~1")
ENQUEUED_POINTER = "/metadata/annotations/" + names.JOB_HAS_ENQUEUED_ANNOTATION.replace("/", "~1")


@pytest.mark.parametrize(
    ("kind", "attack", "field"),
    [
        ("MPIJob", _replace("/spec/runPolicy/suspend", False), "spec.runPolicy.suspend"),
        ("MPIJob", _replace(SUSPEND_POINTER, "false"), f"metadata.annotations[{names.SUSPEND_ANNOTATION}]"),
        (
            "MPIJob",
            _remove("/spec/mpiReplicaSpecs/Launcher/template/spec/schedulingGates/0"),
            "spec.mpiReplicaSpecs.Launcher.template.spec.schedulingGates",
        ),
        ("MPIJob", _replace(QUOTA_LABEL_POINTER, "elsewhere"), names.QUOTA_NAME_LABEL),
        ("JobSet", _replace("/spec/suspend", False), "spec.suspend"),
        (
            "JobSet",
            _remove("/spec/replicatedJobs/1/template/spec/template/spec/schedulingGates/0"),
            "spec.replicatedJobs[1].template.spec.template.spec.schedulingGates",
        ),
        ("JobSet", _remove(ENQUEUED_POINTER), names.JOB_HAS_ENQUEUED_ANNOTATION),
        ("JobSet", _remove(QUOTA_LABEL_POINTER), names.QUOTA_NAME_LABEL),
    ],
    ids=[
        "mpijob-run-policy",
        "mpijob-annotation",
        "mpijob-ungate-launcher",
        "mpijob-relabel",
        "jobset-unsuspend",
        "jobset-ungate-workers",
        "jobset-strip-enqueued",
        "jobset-unlabel",
    ],
)
async def test_alice_cannot_release_a_queued_mpijob_or_jobset(
    tenant: Tenant, kind: str, attack: list[Obj], field: str
) -> None:
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    build, resource, suffix = (
        (mpi_job, MPIJOBS, "-mpi-qu") if kind == "MPIJob" else (job_set, JOBSETS, "-jobset-qu")
    )
    stored = created(tenant.create(build("held", quota)))
    assert HELD[kind].held(stored), stored
    await tenant.env.wait_unit(
        "held" + suffix, lambda u: "limited quotaName:" in str(status(u).get("message")), what="parked"
    )
    refused(tenant.patch(resource, "held", attack, kind="json"), field)
    after = tenant.get(resource, "held")
    assert HELD[kind].held(after), after
    assert annotations_of(after).get(names.JOB_HAS_ENQUEUED_ANNOTATION) == "true"
    assert after["metadata"]["labels"][names.QUOTA_NAME_LABEL] == quota


def owner_ref(obj: Obj) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
    }


def child_job(name: str, pod_template: Obj, *, owner: Obj | None) -> Obj:
    """A ``batch/v1`` Job made from a (gated) pod template; suspended, and no controller-manager
    runs here anyway, so the test makes its pods itself."""
    metadata: Obj = {"name": name}
    if owner is not None:
        metadata["ownerReferences"] = [owner_ref(owner)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"suspend": True, "template": json.loads(json.dumps(pod_template))},
    }


def pod_of(name: str, pod_template: Obj, owner: Obj, labels: Mapping[str, str]) -> Obj:
    """A pod as a controller makes it from ``pod_template``: its annotations and gate, owned by
    ``owner`` (a Job, or the MPIJob for a worker)."""
    meta = pod_template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": json.loads(json.dumps(pod_template["spec"])),
    }


@dataclass(frozen=True)
class Controller:
    """How one kind's controller makes its pods, played by the test: ``make`` creates the child
    Jobs and pods of the stored job and returns the pod names by pod set; ``admitted`` is how many
    of each the unit admits; ``first_template`` is the pod template of the first pod set."""

    kind: str
    build: Callable[[str, str], Obj]
    suffix: str
    make: Callable[[Tenant, Obj], dict[str, list[str]]]
    admitted: dict[str, int]
    first_template: Callable[[Obj], Obj]


def mpi_operator(tenant: Tenant, mpijob: Obj) -> dict[str, list[str]]:
    """The MPI operator: the launcher runs in a Job it owns; the workers are its own pods (one more
    than the MPIJob asks for, as if a worker were being replaced)."""
    specs = mpijob["spec"]["mpiReplicaSpecs"]
    name = mpijob["metadata"]["name"]
    launcher = tenant.as_controller(
        child_job(f"{name}-launcher", specs["Launcher"]["template"], owner=mpijob)
    )
    role = "training.kubeflow.org/job-role"
    tenant.as_controller(
        pod_of(f"{name}-launcher-x1", launcher["spec"]["template"], launcher, {role: "launcher"})
    )
    workers = [f"{name}-worker-{i}" for i in range(3)]
    for worker in workers:
        tenant.as_controller(pod_of(worker, specs["Worker"]["template"], mpijob, {role: "worker"}))
    return {"launcher": [f"{name}-launcher-x1"], "worker": workers}


def jobset_controller(tenant: Tenant, jobset: Obj) -> dict[str, list[str]]:
    """The JobSet controller: one Job per replica of each replicated job, each Job's pods owned by
    it; the second workers Job has one pod more than its parallelism."""
    name = jobset["metadata"]["name"]
    made: dict[str, list[str]] = {}
    for entry in jobset["spec"]["replicatedJobs"]:
        for index in range(entry["replicas"]):
            job = tenant.as_controller(
                child_job(
                    f"{name}-{entry['name']}-{index}", entry["template"]["spec"]["template"], owner=jobset
                )
            )
            pods = entry["template"]["spec"]["parallelism"] + (
                1 if entry["name"] == "workers" and index else 0
            )
            for i in range(pods):
                pod_name = f"{job['metadata']['name']}-{i}"
                labels = {"jobset.sigs.k8s.io/replicatedjob-name": entry["name"]}
                tenant.as_controller(pod_of(pod_name, job["spec"]["template"], job, labels))
                made.setdefault(entry["name"], []).append(pod_name)
    return made


CONTROLLERS = [
    Controller(
        "MPIJob",
        mpi_job,
        "-mpi-qu",
        mpi_operator,
        {"launcher": 1, "worker": 2},
        lambda job: job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"],
    ),
    Controller(
        "JobSet",
        job_set,
        "-jobset-qu",
        jobset_controller,
        {"driver": 1, "workers": 4},
        lambda job: job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
    ),
]


@pytest.mark.parametrize("controller", CONTROLLERS, ids=[c.kind for c in CONTROLLERS])
async def test_pods_made_through_the_controllers_jobs_wait_then_exactly_the_admitted_run_not_a_lookalike(
    tenant: Tenant, controller: Controller
) -> None:
    """The pods are born gated (the gate is in the template the controller copies) and wait while the
    job is queued; once admitted, the reconciler finds them through the Jobs the job owns and
    releases exactly the admitted number per pod set. alice's lookalike, a gated pod with the same
    annotations owned by a Job of hers that the job does not own, is not the job's and stays gated:
    it is made first and its name sorts first, so were it counted it would be released before the
    job's own pod of that set (the oldest gated pods go first), and the count would be off."""
    quota = tenant.env.name("q")
    await tenant.env.add_quota(quota, TOO_SMALL)
    job = created(tenant.create(controller.build("train", quota)))
    unit_name = "train" + controller.suffix
    await tenant.env.wait_unit(
        unit_name, lambda u: "limited quotaName:" in str(status(u).get("message")), what="parked"
    )
    # alice's lookalike of the first pod set's pod, owned by a Job of her own.
    template = controller.first_template(job)
    decoy = created(tenant.create(child_job("decoy", template, owner=None)))
    assert GATE in gates(created(tenant.create(pod_of("a-lookalike", template, decoy, {}))))
    made = controller.make(tenant, job)
    for names_of_set in made.values():
        for pod_name in names_of_set:
            assert GATE in gates(tenant.get("pod", pod_name)), pod_name

    await tenant.env.resize_quota(quota, ROOM)
    unit = await tenant.env.wait_unit(unit_name, lambda u: phase(u) == names.Phase.DEQUEUED, what="admitted")
    assert {a["name"]: a["replicas"] for a in status(unit)["admissions"]} == controller.admitted
    await tenant.env.wait_job(job, lambda j: not HELD[controller.kind].held(j), what="released")

    async def released() -> dict[str, int] | None:
        found = {
            pod_set: sum(GATE not in gates(tenant.get("pod", pod_name)) for pod_name in pod_names)
            for pod_set, pod_names in made.items()
        }
        return found if found == controller.admitted else None

    await kube.eventually(released, what=f"exactly {controller.admitted} released")
    assert GATE in gates(tenant.get("pod", "a-lookalike")), "a pod not owned through the job was released"
