"""The admission webhook called by the real kube-apiserver over TLS.

A labelled job of every kind is stored suspended and gated; an unlabelled Job is stored unchanged; a
pod labelled ``koord-queue/gated-pod`` is stored gated, another pod unchanged; a user cannot
unsuspend a queued Job; invalid Queues and ElasticQuotas are denied with their field paths; and with
the webhook server stopped, unlabelled Jobs and pods and everything in kube-system are still created
(the configurations are scoped so an outage never blocks unrelated workloads) while labelled ones
are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import Component
from tests import kube

pytestmark = pytest.mark.integration

GATE = {"name": names.ADMISSION_GATE}
CONTAINER = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
TEMPLATE = {"spec": {"restartPolicy": "Never", "containers": [CONTAINER]}}


@pytest.fixture(scope="module")
def integration_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of this module's own: it registers, then stops, a webhook of its own, and
    no reconciler may admit (and so resume) the jobs whose hold it checks."""
    cluster = LocalCluster(profile="integration", workdir=tmp_path_factory.mktemp("webhook-cp"))
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def webhook(
    integration_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Component]:
    logdir = tmp_path_factory.mktemp("webhook")
    component, _ = system.start_webhook(integration_cluster, logdir=logdir)
    try:
        _wait_until_webhook_serves(integration_cluster)
        yield component
    finally:
        system.unregister_webhook(integration_cluster)
        component.stop()
        print(component.tail(50))


def _wait_until_webhook_serves(cluster: LocalCluster) -> None:
    """Configurations take effect asynchronously: dry-run a labelled Job until it comes back held."""
    from testenv.processes import wait_until

    probe = batch_job("probe", labelled=True)
    probe["metadata"]["namespace"] = "default"

    def held() -> bool:
        out = cluster.request("POST", "/apis/batch/v1/namespaces/default/jobs?dryRun=All", probe)
        return bool(json.loads(out)["spec"].get("suspend") is True)

    wait_until(held, timeout=30, what="webhook registered and serving")


def labels(labelled: bool) -> dict[str, str]:
    return {names.QUOTA_NAME_LABEL: "team-a"} if labelled else {}


def batch_job(name: str, *, labelled: bool) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels(labelled)},
        "spec": {"parallelism": 2, "completions": 2, "template": TEMPLATE},
    }


def foreign_jobs() -> list[dict[str, Any]]:
    meta = {"labels": labels(True)}
    return [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "tf", **meta},
            "spec": {
                "tfReplicaSpecs": {
                    "PS": {"replicas": 1, "template": TEMPLATE},
                    "Worker": {"replicas": 2, "template": TEMPLATE},
                }
            },
        },
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "pt", **meta},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": TEMPLATE},
                    "Worker": {"replicas": 1, "template": TEMPLATE},
                }
            },
        },
        {
            "apiVersion": "kubeflow.org/v2beta1",
            "kind": "MPIJob",
            "metadata": {"name": "mpi", **meta},
            "spec": {
                "mpiReplicaSpecs": {
                    "Launcher": {"replicas": 1, "template": TEMPLATE},
                    "Worker": {"replicas": 2, "template": TEMPLATE},
                }
            },
        },
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "js", **meta},
            "spec": {
                "replicatedJobs": [
                    {"name": "driver", "template": {"spec": {"template": TEMPLATE}}},
                    {
                        "name": "workers",
                        "replicas": 2,
                        "template": {"spec": {"parallelism": 2, "template": TEMPLATE}},
                    },
                ]
            },
        },
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": "ray", **meta},
            "spec": {
                "entrypoint": "python x.py",
                "rayClusterSpec": {
                    "headGroupSpec": {"template": TEMPLATE},
                    "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": TEMPLATE}],
                },
            },
        },
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {
                "name": "wf",
                "annotations": {names.MIN_RESOURCES_ANNOTATION: "cpu: 5\nmemory: 5Gi"},
                **meta,
            },
            "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": CONTAINER}]},
        },
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {"name": "spark", **meta},
            "spec": {
                "type": "Python",
                "mode": "cluster",
                "sparkVersion": "3.5.0",
                "driver": {"cores": 1, "memory": "1g"},
                "executor": {"instances": 2, "cores": 1, "memory": "2g"},
            },
        },
    ]


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    kind = obj["kind"]
    if kind == "Job":
        return [spec["template"]]
    if kind == "TFJob":
        return [r["template"] for r in spec["tfReplicaSpecs"].values()]
    if kind == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if kind == "MPIJob":
        return [r["template"] for r in spec["mpiReplicaSpecs"].values()]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    if kind == "RayJob":
        cluster = spec["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return []


def is_held(obj: dict[str, Any]) -> bool:
    kind = obj["kind"]
    spec = obj["spec"]
    annotations = obj["metadata"].get("annotations") or {}
    if kind in ("Job", "RayJob", "JobSet"):
        return spec.get("suspend") is True
    if kind in ("TFJob", "PyTorchJob", "MPIJob"):
        return (
            spec.get("runPolicy", {}).get("suspend") is True
            and annotations.get(names.SUSPEND_ANNOTATION) == "true"
        )
    if kind == "Workflow":
        return spec.get("suspend") is True and any(
            t.get("name") == names.WORKFLOW_SUSPEND_TEMPLATE for t in spec["templates"]
        )
    if kind == "SparkApplication":
        # The annotation holds only a patched operator; the labels make the pod webhook gate the
        # driver and executor pods whatever the operator does.
        return annotations.get(names.SUSPEND_ANNOTATION) == "true" and all(
            spec[role]["labels"].get(names.GATED_POD_LABEL) == "true" for role in ("driver", "executor")
        )
    raise AssertionError(kind)


def kubectl_apply(cluster: LocalCluster, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    kube.kubectl(cluster, "apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(obj))
    group = obj["apiVersion"].rpartition("/")[0]
    resource = f"{obj['kind'].lower()}s.{group}" if group else f"{obj['kind'].lower()}s"
    out = kube.kubectl(
        cluster, "get", "-n", namespace, resource, obj["metadata"]["name"], "-o", "json"
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_a_labelled_job_of_every_kind_is_stored_suspended_and_gated(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    for obj in [batch_job("job", labelled=True), *foreign_jobs()]:
        stored = kubectl_apply(integration_cluster, namespace_in, obj)
        assert is_held(stored), (obj["kind"], stored["spec"])
        annotations = stored["metadata"].get("annotations") or {}
        assert annotations.get(names.JOB_HAS_ENQUEUED_ANNOTATION) == "true", obj["kind"]
        assert annotations.get(names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION), obj["kind"]
        for template in pod_templates(stored):
            assert GATE in template["spec"]["schedulingGates"], (obj["kind"], template)
            assert template["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION]


def test_an_unlabelled_job_is_stored_unchanged(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    stored = kubectl_apply(integration_cluster, namespace_in, batch_job("plain", labelled=False))
    assert stored["spec"]["suspend"] is False  # the apiserver's default, not ours
    assert "schedulingGates" not in stored["spec"]["template"]["spec"]
    annotations = stored["metadata"].get("annotations") or {}
    assert not any(key.startswith("koord-queue/") for key in annotations)


def test_a_user_cannot_unsuspend_a_queued_job(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    kubectl_apply(integration_cluster, namespace_in, batch_job("held", labelled=True))
    result = kube.kubectl(
        integration_cluster,
        "patch",
        "job",
        "held",
        "-n",
        namespace_in,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":false}}',
        check=False,
    )
    assert result.returncode != 0
    assert "denied" in result.stderr
    assert "spec.suspend" in result.stderr
    assert "queue" in result.stderr.lower()
    stored = json.loads(
        kube.kubectl(integration_cluster, "get", "job", "held", "-n", namespace_in, "-o", "json").stdout
    )
    assert stored["spec"]["suspend"] is True


def test_an_unsupported_queue_policy_is_denied_with_its_field_path(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    queue = {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "fifo"},
        "spec": {"queuePolicy": "FIFO"},
    }
    result = kube.kubectl(
        integration_cluster,
        "apply",
        "-n",
        namespace_in,
        "-f",
        "-",
        input_text=yaml.safe_dump(queue),
        check=False,
    )
    assert result.returncode != 0
    assert "spec.queuePolicy" in result.stderr
    for policy in ("Priority", "Block", "Intelligent"):
        assert policy in result.stderr


def test_an_elastic_quota_with_min_above_max_is_denied_with_its_field_path(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    quota = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": "q"},
        "spec": {"min": {"cpu": "8"}, "max": {"cpu": "4"}},
    }
    result = kube.kubectl(
        integration_cluster,
        "apply",
        "-n",
        namespace_in,
        "-f",
        "-",
        input_text=yaml.safe_dump(quota),
        check=False,
    )
    assert result.returncode != 0
    assert "spec.min" in result.stderr and "cpu" in result.stderr


def pod(name: str, *, gated_label: bool) -> dict[str, Any]:
    labels = {names.GATED_POD_LABEL: "true"} if gated_label else {"app": name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": TEMPLATE["spec"],
    }


def test_a_pod_labelled_for_the_gate_is_stored_gated_and_another_pod_unchanged(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    stored = kubectl_apply(integration_cluster, namespace_in, pod("gated", gated_label=True))
    assert stored["spec"]["schedulingGates"] == [GATE]
    plain = kubectl_apply(integration_cluster, namespace_in, pod("plain", gated_label=False))
    assert "schedulingGates" not in plain["spec"]


def test_with_the_webhook_down_unrelated_workloads_are_still_created(
    integration_cluster: LocalCluster, webhook: Component, namespace_in: str
) -> None:
    webhook.stop()
    try:
        stored = kubectl_apply(integration_cluster, namespace_in, batch_job("unrelated", labelled=False))
        assert stored["metadata"]["name"] == "unrelated"
        assert kubectl_apply(integration_cluster, namespace_in, pod("unrelated-pod", gated_label=False))
        # ...while a pod that must be gated is refused rather than created without its gate.
        refused = kube.kubectl(
            integration_cluster,
            "apply",
            "-n",
            namespace_in,
            "-f",
            "-",
            input_text=yaml.safe_dump(pod("must-wait", gated_label=True)),
            check=False,
        )
        assert refused.returncode != 0 and "pods.mutate.koord-queue.x-k8s.io" in refused.stderr, (
            refused.stderr
        )
        system_job = batch_job(f"sys-{namespace_in}", labelled=True)
        kube.kubectl(
            integration_cluster,
            "apply",
            "-n",
            "kube-system",
            "-f",
            "-",
            input_text=yaml.safe_dump(system_job),
        )
        # ...while a managed job is refused rather than slipping past the queue.
        result = kube.kubectl(
            integration_cluster,
            "apply",
            "-n",
            namespace_in,
            "-f",
            "-",
            input_text=yaml.safe_dump(batch_job("managed", labelled=True)),
            check=False,
        )
        assert result.returncode != 0
    finally:
        kube.kubectl(
            integration_cluster,
            "delete",
            "job",
            "-n",
            "kube-system",
            f"sys-{namespace_in}",
            "--ignore-not-found",
        )
