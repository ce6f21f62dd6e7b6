"""``kubectl koord-queue uninstall`` against a real kube-apiserver (docs/operations.md#uninstall).

A job the queue holds (suspended, stamped as enqueued, its template gated, its QueueUnit
``Enqueued``) with a gated pod, behind the install's webhook configurations and admission policies;
the command takes those away and releases or deletes the job, and takes the gate off the pod.
``--dry-run`` changes nothing, and a namespace user is refused with the plugin's RBAC error.

Jobs are found by the marks the queue leaves on them, not by their QueueUnits alone: a Job and a
TFJob the webhook held while no reconciler ran (no unit) are released too, the pod templates of a
job the queue had already released lose the gate, and a job suspended by its owner without the
queue's marks is left alone (docs/operations.md#uninstall).

The command deletes cluster-wide objects the shared integration cluster relies on, so these tests
run on a control plane of their own. No webhook serves here: the configurations point nowhere, so
only the command's own deletions let its writes through.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from koord_queue.cli import uninstall
from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.jobs import patches, registry
from testenv import binaries, system, webhooks
from testenv.cluster import LocalCluster
from tests import kube, tenancy

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
JOBS = kq.Resource("batch", "v1", "jobs", "Job")
PODS = kq.Resource("", "v1", "pods", "Pod")
NAMESPACES = kq.Resource("", "v1", "namespaces", "Namespace")
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
DEPLOYMENTS = kq.Resource("apps", "v1", "deployments", "Deployment")
TFJOBS = kq.Resource("kubeflow.org", "v1", "tfjobs", "TFJob")
GATE = {"name": names.ADMISSION_GATE}
NOW = "2026-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(profile="integration", workdir=tmp_path_factory.mktemp("uninstall")) as cluster:
        system.install_crds(cluster)
        yield cluster


def plugin(cluster: LocalCluster, *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl koord-queue ARGS`` with the package's console scripts on PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    command = [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={cluster.kubeconfig}"]
    if user:
        command.append(f"--as={user}")
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def held_job(name: str) -> dict[str, Any]:
    """A Job as the webhook leaves it: suspended, stamped, its template gated."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {names.QUOTA_NAME_LABEL: "team-a"},
            "annotations": {
                names.JOB_HAS_ENQUEUED_ANNOTATION: "true",
                names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION: "2026-01-01T00:00:00Z",
            },
        },
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "schedulingGates": [GATE],
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            },
        },
    }


def unit_of(name: str) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: "team-a"}},
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
            "priority": 0,
            "resource": {"cpu": "1"},
            "podSet": [
                {
                    "name": name,
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                }
            ],
        },
    }


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job['metadata']['name']}-0", "ownerReferences": [owner]},
        "spec": {"schedulingGates": [GATE], "containers": [{"name": "c", "image": "busybox"}]},
    }


def install_admission(cluster: LocalCluster) -> None:
    """The install's webhook configurations (pointing nowhere) and admission policies."""
    for config in webhooks.configurations(url="https://127.0.0.1:9", ca_pem=cluster.ca_pem):
        config["metadata"]["name"] = uninstall.WEBHOOK_CONFIG_NAME  # as manifests/ name them
        cluster.request("POST", f"/apis/admissionregistration.k8s.io/v1/{config['kind'].lower()}s", config)
    system.install_policies(cluster)


async def admission_left(api: kq.Kube) -> list[str]:
    left = []
    for res in (*uninstall.WEBHOOK_CONFIGS, *uninstall.POLICY_KINDS):
        items, _ = await api.list(res)
        left += [
            f"{res.kind}/{o['metadata']['name']}" for o in items if "koord-queue" in o["metadata"]["name"]
        ]
    return left


def reconciler_deployment() -> dict[str, Any]:
    """The reconciler's Deployment as the install names it (no controller runs it here, so it has no
    replicas to wait for: what counts is that the command scales it to 0)."""
    labels = {"app.kubernetes.io/name": uninstall.RECONCILER}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": uninstall.RECONCILER},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "reconciler", "image": "koord-queue-py:0.1.0"}]},
            },
        },
    }


@dataclass
class Stage:
    cluster: LocalCluster
    api: kq.Kube
    ns: str
    job: str = "held"

    def run(self, *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        return plugin(self.cluster, "uninstall", *args, user=user)

    async def stored_job(self) -> dict[str, Any] | None:
        try:
            return await self.api.get(JOBS, self.job, namespace=self.ns)
        except kq.NotFound:
            return None

    async def reconciler_replicas(self) -> int:
        dep = await self.api.get(DEPLOYMENTS, uninstall.RECONCILER, namespace=names.COMPONENT_NAMESPACE)
        return int(dep["spec"]["replicas"])

    async def pod_gates(self) -> list[Any]:
        pod = await self.api.get(PODS, f"{self.job}-0", namespace=self.ns)
        return list(pod["spec"].get("schedulingGates") or [])


def plain_job(name: str, *, quota: bool = True, suspend: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}
    }
    if suspend is not None:
        spec["suspend"] = suspend
    labels = {names.QUOTA_NAME_LABEL: "team-a"} if quota else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def tf_job(name: str) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "tensorflow", "image": "busybox"}]}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: "team-a"}},
        "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 2, "template": template}}},
    }


def as_webhook_holds(job: dict[str, Any], ns: str) -> dict[str, Any]:
    """``job`` as the webhook stores it: the kind's own hold patch applied."""
    adapter = registry.by_kind(job["apiVersion"], job["kind"])
    assert adapter is not None
    job["metadata"]["namespace"] = ns
    return patches.applied(job, adapter.suspend_patch(job, now_text=NOW))


async def marked_jobs(api: kq.Kube, ns: str) -> None:
    """Jobs with no QueueUnit: held by the webhook (a Job, a TFJob), released by the reconciler (its
    template still gated, as an admitted Job's is), and suspended by its owner outside the queue."""
    await api.create(JOBS, as_webhook_holds(plain_job("unitless"), ns), namespace=ns)
    await api.create(TFJOBS, as_webhook_holds(tf_job("tf"), ns), namespace=ns)
    released = as_webhook_holds(plain_job("admitted"), ns)
    adapter = registry.by_kind("batch/v1", "Job")
    assert adapter is not None
    released = patches.deep_merge(released, adapter.resume_patch(released, now_text=NOW))
    await api.create(JOBS, released, namespace=ns)
    await api.create(JOBS, plain_job("mine", quota=False, suspend=True), namespace=ns)


@contextlib.asynccontextmanager
async def staged(cluster: LocalCluster, ns: str, *, extra: bool = False) -> AsyncIterator[Stage]:
    """A held job with its Enqueued unit and a gated pod (and with ``extra`` the jobs of
    :func:`marked_jobs`), then the install's admission control. Afterwards every job of the
    namespace is deleted: the command looks at the whole cluster, and no namespace controller runs
    here to empty a namespace."""
    api = await kq.Kube.connect(kubeconfig=str(cluster.kubeconfig))
    try:
        await api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        tenancy.grant(cluster, ns, tenancy.ALICE)
        job = await api.create(JOBS, held_job("held"), namespace=ns)
        await api.create(UNITS, unit_of("held"), namespace=ns)
        await api.patch(UNITS, "held", {"status": {"phase": "Enqueued"}}, namespace=ns, subresource="status")
        await api.create(PODS, pod_of(job), namespace=ns)
        if extra:
            await marked_jobs(api, ns)
        with contextlib.suppress(kq.Conflict):
            await api.create(DEPLOYMENTS, reconciler_deployment(), namespace=names.COMPONENT_NAMESPACE)
        await api.patch(
            DEPLOYMENTS, uninstall.RECONCILER, {"spec": {"replicas": 2}}, namespace=names.COMPONENT_NAMESPACE
        )
        install_admission(cluster)
        yield Stage(cluster, api, ns)
    finally:
        for res in (*uninstall.WEBHOOK_CONFIGS, *uninstall.POLICY_KINDS):  # what a refused or dry run left
            items, _ = await api.list(res)
            for item in items:
                await api.delete(res, item["metadata"]["name"])
        # no garbage collector runs here: the pod of a deleted job would stay, gated, for the next test
        for res in (PODS, JOBS, TFJOBS):
            items, _ = await api.list(res, namespace=ns)
            for item in items:
                with contextlib.suppress(kq.NotFound):  # no orphan finalizer: no collector runs here
                    await api.delete(res, item["metadata"]["name"], namespace=ns, propagation="Background")
        await api.close()


def namespace_for(request: pytest.FixtureRequest) -> str:
    return f"u-{request.node.name[5:20].replace('_', '-').strip('-')}"


@pytest.fixture
async def stage(own_cluster: LocalCluster, request: pytest.FixtureRequest) -> AsyncIterator[Stage]:
    async with staged(own_cluster, namespace_for(request)) as it:
        yield it


@pytest.fixture
async def marked(own_cluster: LocalCluster, request: pytest.FixtureRequest) -> AsyncIterator[Stage]:
    async with staged(own_cluster, namespace_for(request), extra=True) as it:
        yield it


async def test_uninstall_releases_the_held_job_and_ungates_its_pod(stage: Stage) -> None:
    result = stage.run("--held=release", "--yes")
    assert result.returncode == 0, result.stderr
    assert await admission_left(stage.api) == []
    job = await stage.stored_job()
    assert job is not None and job["spec"]["suspend"] is False
    assert job["metadata"]["annotations"].get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
    assert GATE not in (job["spec"]["template"]["spec"].get("schedulingGates") or [])
    assert await stage.pod_gates() == []
    assert await stage.api.get(UNITS, "held", namespace=stage.ns)  # QueueUnits stay
    assert f"released 1 held jobs: {stage.ns}/job/held" in result.stdout
    assert f"ungated 1 pods: {stage.ns}/held-0" in result.stdout
    assert "deleted 1 MutatingWebhookConfigurations: koord-queue" in result.stdout
    assert await stage.reconciler_replicas() == 0


async def test_uninstall_deletes_the_held_job_when_asked(stage: Stage) -> None:
    result = stage.run("--held=delete", "--yes")
    assert result.returncode == 0, result.stderr
    assert await admission_left(stage.api) == []
    assert await stage.stored_job() is None
    assert await stage.pod_gates() == [GATE]  # the pod of a deleted job is left to its collector
    assert f"deleted 1 held jobs: {stage.ns}/job/held" in result.stdout


async def test_dry_run_changes_nothing(stage: Stage) -> None:
    before = await admission_left(stage.api)
    result = stage.run("--held=release", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"would release 1 held jobs: {stage.ns}/job/held" in result.stdout
    assert f"would ungate 1 pods: {stage.ns}/held-0" in result.stdout
    assert await admission_left(stage.api) == before and len(before) >= 4
    job = await stage.stored_job()
    assert job is not None and job["spec"]["suspend"] is True
    assert await stage.pod_gates() == [GATE]
    assert await stage.reconciler_replicas() == 2


async def test_without_yes_nothing_happens(stage: Stage) -> None:
    result = stage.run("--held=release")
    assert result.returncode == 2 and "--yes" in result.stderr
    assert len(await admission_left(stage.api)) >= 4


async def test_a_namespace_user_is_refused(stage: Stage) -> None:
    before = await admission_left(stage.api)
    result = stage.run("--held=release", "--yes", user=tenancy.ALICE)
    assert result.returncode == 4, result.stderr
    assert "permission denied" in result.stderr
    assert await admission_left(stage.api) == before
    assert await stage.reconciler_replicas() == 2
    job = await stage.stored_job()
    assert job is not None and job["spec"]["suspend"] is True
    assert await stage.pod_gates() == [GATE]


async def test_held_jobs_without_units_are_found_by_their_marks_and_released(marked: Stage) -> None:
    ns, api = marked.ns, marked.api
    dry = marked.run("--held=release", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would release 3 held jobs: {ns}/job/held, {ns}/job/unitless, {ns}/tfjob/tf" in dry.stdout
    # an admitted Job's template cannot change (a Job's template may only while it is suspended)
    assert "would ungate the pod templates of 0 jobs the queue had released" in dry.stdout
    assert f"kept the gate in the pod templates of 1 started Jobs: {ns}/job/admitted" in dry.stdout

    result = marked.run("--held=release", "--yes")
    assert result.returncode == 0, result.stderr
    assert f"released 3 held jobs: {ns}/job/held, {ns}/job/unitless, {ns}/tfjob/tf" in result.stdout
    assert f"kept the gate in the pod templates of 1 started Jobs: {ns}/job/admitted" in result.stdout
    assert "--follow" in result.stdout
    unitless = await api.get(JOBS, "unitless", namespace=ns)
    assert unitless["spec"]["suspend"] is False
    assert GATE not in (unitless["spec"]["template"]["spec"].get("schedulingGates") or [])
    admitted = await api.get(JOBS, "admitted", namespace=ns)
    assert admitted["spec"]["suspend"] is False
    assert GATE in admitted["spec"]["template"]["spec"]["schedulingGates"]
    tf = await api.get(TFJOBS, "tf", namespace=ns)
    assert tf["spec"]["runPolicy"]["suspend"] is False
    assert tf["metadata"]["annotations"][names.SUSPEND_ANNOTATION] == "false"
    worker = tf["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert GATE not in (worker.get("schedulingGates") or [])
    mine = await api.get(JOBS, "mine", namespace=ns)
    assert mine["spec"]["suspend"] is True  # its owner's, not the queue's
    assert not (mine["metadata"].get("annotations") or {}).get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)


async def test_unitless_held_jobs_are_deleted_when_asked(marked: Stage) -> None:
    ns = marked.ns
    result = marked.run("--held=delete", "--yes")
    assert result.returncode == 0, result.stderr
    assert f"deleted 3 held jobs: {ns}/job/held, {ns}/job/unitless, {ns}/tfjob/tf" in result.stdout
    with pytest.raises(kq.NotFound):
        await marked.api.get(TFJOBS, "tf", namespace=ns)
    with pytest.raises(kq.NotFound):
        await marked.api.get(JOBS, "unitless", namespace=ns)
    assert (await marked.api.get(JOBS, "mine", namespace=ns))["spec"]["suspend"] is True
    assert (await marked.api.get(JOBS, "admitted", namespace=ns))["spec"]["suspend"] is False


def freeze_policy(ns: str, job: str) -> list[dict[str, Any]]:
    """An admission policy that is not the install's (another team's), refusing every update of
    Job ``job`` in ``ns``: the command must not delete it, and must go on with the other jobs."""
    name = f"freeze-{ns}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["batch"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["jobs"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": (
                            f"!(object.metadata.namespace == '{ns}' && object.metadata.name == '{job}')"
                        ),
                        "message": "frozen by another team",
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]


async def test_a_job_the_api_refuses_is_reported_and_the_others_are_still_released(marked: Stage) -> None:
    ns, api = marked.ns, marked.api
    for obj in freeze_policy(ns, "unitless"):
        res = next(r for r in uninstall.POLICY_KINDS if r.kind == obj["kind"])
        await api.create(res, obj)

    async def frozen() -> bool:
        patch = {"metadata": {"labels": {"probe": "1"}}}
        try:
            await api.request(
                "PATCH",
                JOBS.path(ns, "unitless"),
                body=patch,
                query={"dryRun": "All"},
                content_type=kq.MERGE_PATCH,
            )
        except kq.KubeError as err:
            return "frozen by another team" in err.message
        return False

    await kube.eventually(frozen, what="the other team's policy in force")
    result = marked.run("--held=release", "--yes")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert f"released 2 held jobs: {ns}/job/held, {ns}/tfjob/tf" in result.stdout
    assert f"could not release, delete or ungate 1 jobs: {ns}/job/unitless (" in result.stdout
    assert "frozen by another team" in result.stdout
    assert (await api.get(JOBS, "held", namespace=ns))["spec"]["suspend"] is False
    assert (await api.get(TFJOBS, "tf", namespace=ns))["spec"]["runPolicy"]["suspend"] is False
    assert (await api.get(JOBS, "unitless", namespace=ns))["spec"]["suspend"] is True
    assert await api.get(uninstall.POLICY_KINDS[1], f"freeze-{ns}")  # not the install's: kept
