"""Real job operators on the e2e control plane: KubeRay, the Kubeflow training operator and Argo's
workflow controller run the jobs that the queue holds and admits.

The other e2e tests play the job operator themselves; here the operators' own binaries (built from
their Go modules with their own CRDs, ``testenv/operators.py``,
docs/development.md#real-operators-in-e2e) create the clusters, pods, services and submitter Jobs,
so the contracts of docs/compatibility.md#rayjob, docs/compatibility.md#kubeflow-jobs and
docs/compatibility.md#argo-workflow are checked against the controllers they were written for:

* **Hold.** A labelled job is suspended on CREATE; the operator honours that (KubeRay reports
  ``Suspended``, the training operator the condition ``Suspended``, Argo runs no step) and creates
  no pod while the quota has no room.
* **Admission and ungating.** Once the quota has room the unit is admitted and the job released;
  the operator creates pods from the gated templates, every pod is born with the gate
  ``koord-queue/admission``, the reconciler lifts it, the scheduler binds the pods to kwok nodes, kwok
  runs them and the unit is ``Running`` (a Workflow's pods, gated through ``spec.podMetadata``, are
  released while their summed requests fit its ``koord-queue/min-resources``, so parallel steps larger
  in sum than it run one after another).
* **Reclaim** (docs/compatibility.md#queue-level-preemption), for KubeRay and the training
  operator: a higher-priority job takes back the quota of an admitted job whose pods cannot be
  placed; only those unbound pods are deleted, a running job in the same quota keeps its pods, and
  the operator's replacements wait gated. Deleting the preemptor frees its quota and the waiting job
  is admitted again.
* **Completion.** The job ends as its operator decides, the unit follows
  (docs/compatibility.md#job-finish-and-deletion) and the quota is free.
* **A RayJob KubeRay refuses once held** (no ``shutdownAfterJobFinishes: true``) ends ``Failed``
  instead of holding quota for a job that will never start a pod.

What stands in for the real world: kwok plays the kubelet (pods run, never execute anything). No
Ray runs, so KubeRay never hears from a Ray job: when the submitter pod completes (kwok completes
pods of a ``batch/v1`` Job, here when the test lowers its delay annotation), KubeRay ends the RayJob
``Failed`` with "Submitter completed but Ray job not found" — its real end-of-job path without a
Ray dashboard; ``Complete`` needs Ray itself. kwok completes no pod of a PyTorchJob or a Workflow,
so the test writes the master's or the step's exit (``Succeeded``, exit code 0) as the kubelet
would, and the operator does the rest.

The module runs its own control plane: the operators' CRDs replace the cut-down test CRDs of their
kinds and the operators act on every namespace, neither of which may leak into the shared e2e
cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names, podtemplates, quantities
from testenv import binaries, operators, system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube, tenancy

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
RAYCLUSTERS = kq.Resource("ray.io", "v1", "rayclusters", "RayCluster")
RAY_IMAGE = "rayproject/ray:2.46.0"
PYTORCH_IMAGE = "docker.io/pytorch/pytorch:2.1.0"
#: A label no kwok node carries: pods selecting it stay unbound (admitted but not running).
NOWHERE = {"koord-queue.test/nowhere": "true"}
#: How long one step may take: the operators requeue a job every few seconds while they wait.
STEP_S = 90.0


# --- the control plane, our system and the operators ------------------------------------------------


@pytest.fixture(scope="module")
def real_operators() -> list[binaries.Operator]:
    """Built on first use (a few minutes each, cold), then taken from the binary cache."""
    return [binaries.operator(name) for name in binaries.OPERATORS]


@pytest.fixture(scope="module")
def op_cluster(
    tmp_path_factory: pytest.TempPathFactory, real_operators: list[binaries.Operator]
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(profile="e2e", workdir=tmp_path_factory.mktemp("operators-cp"), nodes=2)
    cluster.start()
    try:
        system.install_crds(cluster)
        for operator in real_operators:  # before the reconciler starts watching the kinds
            operators.install_crds(cluster, operator)
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def running(
    op_cluster: LocalCluster,
    real_operators: list[binaries.Operator],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[system.Processes]:
    """The webhook and the reconciler, then the operators. Queueing is mandatory in namespaces
    labelled :data:`MANDATORY_LABEL` (docs/operations.md#mandatory-queueing), so KubeRay's
    unlabelled submitter Job reaches the webhook there; other namespaces are as by default."""
    logdir = tmp_path_factory.mktemp("operators-system")
    processes = system.Processes()
    try:
        webhook, port = system.start_webhook(op_cluster, logdir=logdir, register=False)
        processes.components.append(webhook)
        processes.webhook_port = port
        system.register_webhook(
            op_cluster, port=port, mandatory_namespaces={"matchLabels": {MANDATORY_LABEL: "true"}}
        )
        system.install_policies(op_cluster)
        config = logdir / "config.yaml"
        config.write_text(MANDATORY_CONFIG)
        extra = [*system.VISIBILITY_ARGS, "--config", str(config)]
        processes.components.append(system.start_reconciler(op_cluster, logdir=logdir, extra_args=extra))
        for operator in real_operators:
            processes.components.append(operators.start(op_cluster, operator, logdir=logdir))
        kube.kubectl(op_cluster, "apply", "-f", "-", input_text=json.dumps(PRIORITY_CLASSES))
        yield processes
    finally:
        processes.stop()
        for name in ("webhook", "reconciler", *(o.name for o in real_operators)):
            log = logdir / f"{name}.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-60:]
                print(f"--- {name} (tail) ---\n" + "\n".join(tail))


MANDATORY_LABEL = "koord-queue/mandatory"
#: The label KubeRay puts on the Jobs it makes, and the only Jobs its cache holds.
KUBERAY_CREATED_BY = "app.kubernetes.io/created-by"
MANDATORY_CONFIG = (
    "apiVersion: scheduling.k8s.io/v1\n"
    "kind: KoordQueueConfiguration\n"
    "manageJobsWithoutQuotaName: true\n"
    "managedJobsNamespaceSelector:\n"
    f"  matchLabels: {{{MANDATORY_LABEL}: 'true'}}\n"
)


PRIORITY_CLASSES: Obj = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"op-{level}"},
            "value": value,
        }
        for level, value in (("low", 100), ("high", 1000))
    ],
}


# --- objects ----------------------------------------------------------------------------------------


def pod_template(container: str, image: str, *, cpu: str, priority: str, node_selector: Obj | None) -> Obj:
    spec: Obj = {
        "priorityClassName": f"op-{priority}",
        "containers": [
            {"name": container, "image": image, "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"spec": spec}


def rayjob(
    name: str,
    namespace: str,
    quota: str,
    *,
    cpu: str,
    priority: str = "low",
    node_selector: Obj | None = None,
    shutdown: bool = True,
) -> Obj:
    """A RayJob with a head and one worker of ``cpu`` each, labelled with ``quota``, no ``suspend``.

    The submitter pod (KubeRay's ``ray job submit``) runs until the test tells kwok to complete it
    (:func:`finish_submitter`). It is the unit's pod set ``submitter`` (docs/compatibility.md#rayjob),
    charged what its declared template asks: memory only here, so the quotas' CPU is the cluster's."""
    head = pod_template("ray-head", RAY_IMAGE, cpu=cpu, priority=priority, node_selector=node_selector)
    worker = pod_template("ray-worker", RAY_IMAGE, cpu=cpu, priority=priority, node_selector=node_selector)
    submitter = {
        "metadata": {"annotations": {COMPLETE_DELAY_ANNOTATION: "1h"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "submitter",
                    "image": RAY_IMAGE,
                    "resources": {"requests": {"memory": "128Mi"}},
                }
            ],
        },
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "entrypoint": "python -c 'print(42)'",
            "shutdownAfterJobFinishes": shutdown,
            "submitterPodTemplate": submitter,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": head},
                "workerGroupSpecs": [
                    {
                        "groupName": "small",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": worker,
                    }
                ],
            },
        },
    }


def pytorchjob(
    name: str,
    namespace: str,
    quota: str,
    *,
    cpu: str,
    priority: str = "low",
    node_selector: Obj | None = None,
) -> Obj:
    """A PyTorchJob with one master and one worker of ``cpu`` each, labelled with ``quota``; the
    training operator deletes the pods still running when the job ends (``cleanPodPolicy``)."""

    def replicas() -> Obj:
        template = pod_template(
            "pytorch", PYTORCH_IMAGE, cpu=cpu, priority=priority, node_selector=node_selector
        )
        return {"replicas": 1, "restartPolicy": "Never", "template": template}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running"},
            "pytorchReplicaSpecs": {"Master": replicas(), "Worker": replicas()},
        },
    }


def workflow(name: str, namespace: str, quota: str, *, cpu: str) -> Obj:
    """An Argo Workflow of one container step, labelled with ``quota``, declaring ``cpu`` (the
    annotation the webhook requires of a queued Workflow)."""
    step = {"name": "main", "container": {"image": "busybox:stable", "command": ["echo", "hello"]}}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {names.QUOTA_NAME_LABEL: quota},
            "annotations": {names.MIN_RESOURCES_ANNOTATION: json.dumps({"cpu": cpu})},
        },
        "spec": {"entrypoint": "main", "templates": [step]},
    }


@dataclass(frozen=True)
class Kind:
    """A job kind run by a real operator: how to build one, and how the queue names its parts."""

    resource: str  # for kubectl
    build: Callable[..., Obj]
    unit_suffix: str
    pod_sets: tuple[str, ...]


RAY = Kind("rayjob", rayjob, "ray-qu", ("head", "small"))
PYTORCH = Kind("pytorchjob", pytorchjob, "py-qu", ("master", "worker"))


def quota(name: str, namespace: str, *, cpu: str, preemption: bool = False) -> Obj:
    annotations = (
        {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", names.ENABLE_PREEMPTION_ANNOTATION: "true"}
        if preemption
        else {}
    )
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {names.QUEUE_POLICY_LABEL: "Priority"},
            "annotations": annotations,
        },
        "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
    }


# --- reading the cluster ------------------------------------------------------------------------------


def apply(cluster: LocalCluster, obj: Obj) -> None:
    kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(obj))


def get(cluster: LocalCluster, *args: str) -> Obj | None:
    """``kubectl get ... -o json``; None when it is not there."""
    out = kube.kubectl(cluster, "get", *args, "-o", "json", check=False)
    if out.returncode != 0:
        assert "NotFound" in out.stderr, out.stderr
        return None
    found: Obj = json.loads(out.stdout)
    return found


def items(cluster: LocalCluster, *args: str) -> list[Obj]:
    listed = get(cluster, *args)
    return list((listed or {}).get("items") or [])


def unit_ref(namespace: str, kind: Kind, job: str) -> str:
    return f"{namespace}/{job}-{kind.unit_suffix}"


def pods_of(cluster: LocalCluster, namespace: str, kind: Kind, job: str) -> list[Obj]:
    """The live pods the operator made for ``job``'s pod sets: they carry the unit link of the
    webhook's template annotations. A RayJob's submitter pod (its pod set ``submitter``, which KubeRay
    makes only once the cluster runs, docs/compatibility.md#rayjob) is left out by the label the Job
    controller gives its pods."""
    ref = unit_ref(namespace, kind, job)
    return [
        p
        for p in items(cluster, "pods", "-n", namespace)
        if (p["metadata"].get("annotations") or {}).get(names.RELATED_QUEUEUNIT_ANNOTATION) == ref
        and not p["metadata"].get("deletionTimestamp")
        and "batch.kubernetes.io/job-name" not in (p["metadata"].get("labels") or {})
    ]


def gated(pod: Obj) -> bool:
    return any(g.get("name") == names.ADMISSION_GATE for g in pod["spec"].get("schedulingGates") or [])


def running_on_kwok(pod: Obj) -> bool:
    return (
        not gated(pod)
        and str(pod["spec"].get("nodeName", "")).startswith("kwok-node-")
        and pod["status"].get("phase") == "Running"
    )


def unit(cluster: LocalCluster, namespace: str, kind: Kind, job: str) -> Obj | None:
    return get(cluster, "queueunit", f"{job}-{kind.unit_suffix}", "-n", namespace)


def phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase", ""))


def admitted(obj: Obj | None) -> dict[str, int]:
    return {
        a["name"]: a.get("replicas", 0) for a in ((obj or {}).get("status") or {}).get("admissions") or []
    }


def used_cpu_milli(cluster: LocalCluster, name: str, namespace: str) -> int:
    found = get(cluster, "elasticquota", name, "-n", namespace) or {}
    return quantities.parse_milli(((found.get("status") or {}).get("used") or {}).get("cpu", "0"))


def deployment_status(cluster: LocalCluster, namespace: str, job: str) -> str:
    found = get(cluster, "rayjob", job, "-n", namespace) or {}
    return str((found.get("status") or {}).get("jobDeploymentStatus", ""))


def conditions(obj: Obj | None) -> dict[str, str]:
    return {c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def finish_submitter(cluster: LocalCluster, namespace: str, job: str) -> None:
    """Tell kwok to complete the submitter pod now (it reads the delay annotation again): what
    ``ray job submit`` exiting would do."""
    pods = items(cluster, "pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job}")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    kube.kubectl(
        cluster,
        "annotate",
        "pod",
        "-n",
        namespace,
        pods[0]["metadata"]["name"],
        f"{COMPLETE_DELAY_ANNOTATION}=0s",
        "--overwrite",
    )


def exit_zero(cluster: LocalCluster, pod: Obj) -> None:
    """Write what the kubelet reports when the pod's container exits 0 (kwok completes only pods of
    ``batch/v1`` Jobs)."""
    started = pod["status"].get("startTime")
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": started,
                    "finishedAt": started,
                }
            },
        }
        for c in pod["spec"]["containers"]
    ]
    patch = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
    kube.kubectl(
        cluster,
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        pod["metadata"]["namespace"],
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


def new_namespace(cluster: LocalCluster, name: str) -> str:
    kube.kubectl(cluster, "create", "namespace", name)
    return name


async def wait_used(cluster: LocalCluster, name: str, namespace: str, milli: int) -> None:
    """The quota's reported ``status.used`` cpu reaches ``milli`` (the report follows the units)."""

    async def check() -> bool:
        return used_cpu_milli(cluster, name, namespace) == milli

    await kube.eventually(check, timeout=STEP_S, what=f"quota {name} using {milli}m cpu")


async def wait_running(cluster: LocalCluster, namespace: str, kind: Kind, job: str) -> list[Obj]:
    """Every pod set's pod is ungated, bound to a kwok node and running, and the unit Running."""

    async def check() -> list[Obj] | None:
        pods = pods_of(cluster, namespace, kind, job)
        if len(pods) == len(kind.pod_sets) and all(running_on_kwok(p) for p in pods):
            return pods if phase(unit(cluster, namespace, kind, job)) == "Running" else None
        return None

    return await kube.eventually(check, timeout=STEP_S, what=f"{job}'s pods running and its unit Running")


def summary(pods: list[Obj]) -> list[tuple[str, str, bool, str]]:
    """Name, phase, gated and node of each pod: what a failed wait shows."""
    return [
        (p["metadata"]["name"], p["status"].get("phase", ""), gated(p), p["spec"].get("nodeName", ""))
        for p in pods
    ]


async def assert_born_gated(seen: list[tuple[str, Obj]], pods: list[Obj], kind: Kind) -> None:
    """Every pod the operator created carried the gate from its first version (only the reconciler
    lifts it), one per pod set. The watch may trail the polls, so its record is awaited."""
    assert sorted(p["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION] for p in pods) == sorted(
        kind.pod_sets
    )

    async def first_versions() -> list[Obj] | None:
        firsts = [
            next((o for _, o in seen if o["metadata"]["uid"] == p["metadata"]["uid"]), None) for p in pods
        ]
        return [f for f in firsts if f is not None] if all(firsts) else None

    for first in await kube.eventually(first_versions, what="the watch recording the pods' creation"):
        assert gated(first), first["spec"]


async def deletions(seen: list[tuple[str, Obj]], uids: set[str]) -> list[Obj]:
    """Every pod deletion the watch recorded, once it has recorded those of ``uids``."""

    async def check() -> list[Obj] | None:
        deleted = [o for k, o in seen if k == "DELETED"]
        return deleted if uids <= {o["metadata"]["uid"] for o in deleted} else None

    return await kube.eventually(check, what="the watch recording the reclaimed pods' deletion")


# --- the tests ----------------------------------------------------------------------------------------


async def test_rayjob_is_held_admitted_run_by_kuberay_and_ends(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    cluster = op_cluster
    ns = new_namespace(cluster, "ray-life")
    apply(cluster, quota("ray-life", ns, cpu="500m"))  # too small for the job's 1 CPU
    async with (
        kube.Recorder(cluster, kq.PODS, ns) as pods_seen,
        kube.Recorder(cluster, UNITS, ns) as units_seen,
        kube.Recorder(cluster, RAYCLUSTERS, ns) as clusters_seen,
    ):
        apply(cluster, rayjob("life", ns, "ray-life", cpu="500m"))

        # Held: suspended by the webhook, and KubeRay agrees: it creates nothing.
        async def suspended_by_kuberay() -> bool:
            return deployment_status(cluster, ns, "life") == "Suspended"

        await kube.eventually(
            suspended_by_kuberay, timeout=STEP_S, what="KubeRay reporting the RayJob Suspended"
        )
        job = get(cluster, "rayjob", "life", "-n", ns)
        assert job is not None and job["spec"]["suspend"] is True
        assert phase(unit(cluster, ns, RAY, "life")) in ("", "Enqueued")
        assert items(cluster, "rayclusters", "-n", ns) == []
        assert items(cluster, "pods", "-n", ns) == []

        # Room in the quota: admitted, released, KubeRay builds the cluster, the pods run.
        apply(cluster, quota("ray-life", ns, cpu="1"))
        pods = await wait_running(cluster, ns, RAY, "life")
        await assert_born_gated(pods_seen.seen, pods, RAY)
        raycluster = items(cluster, "rayclusters", "-n", ns)
        assert len(raycluster) == 1
        assert raycluster[0]["metadata"]["ownerReferences"][0]["kind"] == "RayJob"

        async def cluster_ready() -> bool:
            listed = items(cluster, "rayclusters", "-n", ns)
            return bool(listed) and (listed[0].get("status") or {}).get("state") == "ready"

        await kube.eventually(cluster_ready, timeout=STEP_S, what="KubeRay reporting the RayCluster ready")

        async def job_running() -> bool:
            return deployment_status(cluster, ns, "life") == "Running"

        await kube.eventually(job_running, timeout=STEP_S, what="KubeRay running the RayJob")
        assert admitted(unit(cluster, ns, RAY, "life")) == {"head": 1, "small": 1, "submitter": 1}
        await wait_used(cluster, "ray-life", ns, 1000)

        # The submitter finishes: KubeRay ends the RayJob and deletes its cluster; the unit ends
        # after that, and the quota is free.
        finish_submitter(cluster, ns, "life")

        async def unit_ended() -> Obj | None:
            found = unit(cluster, ns, RAY, "life")
            return found if phase(found) in ("Succeed", "Failed") else None

        ended = await kube.eventually(
            unit_ended, timeout=STEP_S, what="the unit of the finished RayJob ended"
        )
        job = get(cluster, "rayjob", "life", "-n", ns)
        assert job is not None
        assert job["status"]["jobDeploymentStatus"] == "Failed", job["status"]
        assert "Submitter completed" in job["status"].get("message", ""), job["status"]
        assert phase(ended) == "Failed" and admitted(ended) == {}

        async def pods_gone() -> bool:
            return not pods_of(cluster, ns, RAY, "life")

        await kube.eventually(pods_gone, timeout=STEP_S, what="the Ray pods gone")
        await wait_used(cluster, "ray-life", ns, 0)
        # The unit ended only once KubeRay had deleted the cluster: while it lived, its pods did.
        # Both were polled above, not read from the records: let those catch up first.
        await clusters_seen.sync()
        await units_seen.sync()
        deleted = [int(o["metadata"]["resourceVersion"]) for k, o in clusters_seen.seen if k == "DELETED"]
        first_end = next(
            int(o["metadata"]["resourceVersion"])
            for _, o in units_seen.seen
            if o["metadata"]["name"] == "life-ray-qu" and phase(o) == "Failed"
        )
        assert deleted and deleted[0] < first_end, (deleted, first_end)


async def test_pytorchjob_is_held_admitted_run_by_the_training_operator_and_succeeds(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    cluster = op_cluster
    ns = new_namespace(cluster, "torch-life")
    apply(cluster, quota("torch-life", ns, cpu="500m"))  # too small for the job's 1 CPU
    async with kube.Recorder(cluster, kq.PODS, ns) as pods_seen:
        apply(cluster, pytorchjob("train", ns, "torch-life", cpu="500m"))

        # Held: suspended by the webhook, and the training operator agrees: it creates nothing.
        async def suspended_by_operator() -> Obj | None:
            found = get(cluster, "pytorchjob", "train", "-n", ns)
            return found if conditions(found).get("Suspended") == "True" else None

        job = await kube.eventually(
            suspended_by_operator, timeout=STEP_S, what="the training operator reporting the job Suspended"
        )
        assert job["spec"]["runPolicy"]["suspend"] is True
        assert phase(unit(cluster, ns, PYTORCH, "train")) in ("", "Enqueued")
        assert items(cluster, "pods", "-n", ns) == []

        # Room in the quota: admitted, released, the operator creates the pods, they run.
        apply(cluster, quota("torch-life", ns, cpu="1"))
        pods = await wait_running(cluster, ns, PYTORCH, "train")
        await assert_born_gated(pods_seen.seen, pods, PYTORCH)
        assert admitted(unit(cluster, ns, PYTORCH, "train")) == {"master": 1, "worker": 1}
        await wait_used(cluster, "torch-life", ns, 1000)

        # The master exits 0: the operator marks the job Succeeded and deletes the running worker;
        # the unit is Succeed and the quota free.
        master = next(
            p for p in pods if p["metadata"]["annotations"][names.RELATED_PODSET_ANNOTATION] == "master"
        )
        exit_zero(cluster, master)

        async def succeeded() -> Obj | None:
            found = get(cluster, "pytorchjob", "train", "-n", ns)
            return found if conditions(found).get("Succeeded") == "True" else None

        await kube.eventually(
            succeeded, timeout=STEP_S, what="the training operator marking the job Succeeded"
        )

        async def unit_succeeded() -> Obj | None:
            found = unit(cluster, ns, PYTORCH, "train")
            return found if phase(found) == "Succeed" else None

        ended = await kube.eventually(unit_succeeded, timeout=STEP_S, what="the unit Succeed")
        assert admitted(ended) == {}
        await wait_used(cluster, "torch-life", ns, 0)

        async def worker_cleaned() -> bool:
            return not [
                p for p in pods_of(cluster, ns, PYTORCH, "train") if p["status"].get("phase") == "Running"
            ]

        await kube.eventually(worker_cleaned, timeout=STEP_S, what="the operator deleting the running worker")


@pytest.mark.parametrize("kind", [RAY, PYTORCH], ids=["RayJob", "PyTorchJob"])
async def test_reclaim_takes_only_unbound_pods_and_deletion_frees_quota(
    op_cluster: LocalCluster, running: system.Processes, kind: Kind
) -> None:
    cluster = op_cluster
    ns = new_namespace(cluster, f"{kind.resource}-reclaim")
    quota_name = f"{kind.resource}-reclaim"
    apply(cluster, quota(quota_name, ns, cpu="3", preemption=True))

    async def queue_configured() -> bool:
        found = get(cluster, "queue", quota_name, "-n", names.COMPONENT_NAMESPACE) or {}
        annotations = (found.get("metadata") or {}).get("annotations") or {}
        return annotations.get(names.ENABLE_PREEMPTION_ANNOTATION) == "true"

    await kube.eventually(queue_configured, what=f"Queue {quota_name} with the preemption annotations")

    # A running job (1 CPU) and an admitted one whose pods no node takes (1 CPU).
    apply(cluster, kind.build("steady", ns, quota_name, cpu="500m"))
    steady_pods = await wait_running(cluster, ns, kind, "steady")
    apply(cluster, kind.build("stuck", ns, quota_name, cpu="500m", node_selector=NOWHERE))

    async def stuck_released_unbound() -> list[Obj] | None:
        pods = pods_of(cluster, ns, kind, "stuck")
        ok = len(pods) == len(kind.pod_sets) and all(
            not gated(p) and not p["spec"].get("nodeName") for p in pods
        )
        return pods if ok else None

    stuck_pods = await kube.eventually(
        stuck_released_unbound, timeout=STEP_S, what="stuck's pods ungated and unbound"
    )
    assert phase(unit(cluster, ns, kind, "stuck")) == "Dequeued"

    # A higher-priority job (2 CPU) does not fit beside them: stuck's replicas are reclaimed.
    async with kube.Recorder(cluster, kq.PODS, ns) as pods_seen:
        apply(cluster, kind.build("urgent", ns, quota_name, cpu="1", priority="high"))
        await wait_running(cluster, ns, kind, "urgent")
        deleted = await deletions(pods_seen.seen, {p["metadata"]["uid"] for p in stuck_pods})

    # Reclaim deleted stuck's released pods, and nothing deleted a bound pod.
    for pod in deleted:
        assert pod["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION] == unit_ref(
            ns, kind, "stuck"
        )
        assert not pod["spec"].get("nodeName"), pod["metadata"]["name"]
    steady_now = pods_of(cluster, ns, kind, "steady")
    assert {p["metadata"]["uid"] for p in steady_now} == {p["metadata"]["uid"] for p in steady_pods}
    assert all(running_on_kwok(p) for p in steady_now)
    stuck_unit = unit(cluster, ns, kind, "stuck")
    assert phase(stuck_unit) == "Enqueued" and set(admitted(stuck_unit).values()) <= {0}
    await wait_used(cluster, quota_name, ns, 3000)

    async def replacements_gated() -> list[Obj]:
        pods = pods_of(cluster, ns, kind, "stuck")
        assert len(pods) == len(kind.pod_sets) and all(gated(p) for p in pods), summary(pods)
        return pods

    await kube.eventually(replacements_gated, timeout=STEP_S, what="the operator's replacement pods, gated")
    selector = f"involvedObject.name=stuck-{kind.unit_suffix}"

    # The events are written by the reconciler's event writer after the writes they tell of, in
    # no step with the operator's replacement pods: wait for them.
    async def told() -> set[str]:
        reasons = {e["reason"] for e in items(cluster, "events", "-n", ns, "--field-selector", selector)}
        assert {"Preempted", "Reclaimed"} <= reasons, reasons
        return reasons

    await kube.eventually(told, what="Preempted and Reclaimed events on stuck's unit")

    # Deleting the urgent job frees its quota: stuck is admitted again and its pods released.
    kube.kubectl(cluster, "delete", kind.resource, "urgent", "-n", ns, "--wait=true", "--timeout=60s")

    async def stuck_readmitted() -> bool:
        pods = pods_of(cluster, ns, kind, "stuck")
        return (
            phase(unit(cluster, ns, kind, "stuck")) == "Dequeued"
            and len(pods) == len(kind.pod_sets)
            and not any(gated(p) for p in pods)
            and unit(cluster, ns, kind, "urgent") is None
        )

    await kube.eventually(stuck_readmitted, timeout=STEP_S, what="stuck re-admitted after urgent was deleted")
    await wait_used(cluster, quota_name, ns, 2000)

    # The garbage collector deletes urgent's pods after urgent itself, in no step with its unit.
    async def urgent_pods_gone() -> bool:
        left = pods_of(cluster, ns, kind, "urgent")
        assert not left, summary(left)
        return True

    await kube.eventually(urgent_pods_gone, timeout=STEP_S, what="urgent's pods deleted")


async def test_workflow_is_held_admitted_run_by_argo_and_succeeds(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    cluster = op_cluster
    ns = new_namespace(cluster, "wf-life")
    apply(cluster, quota("wf-life", ns, cpu="500m"))  # too small for the declared 1 CPU
    apply(cluster, workflow("hello", ns, "wf-life", cpu="1"))

    # Held: Argo has taken the workflow in (a phase, the webhook's suspend template) and runs no step.
    async def seen_by_argo() -> Obj | None:
        found = get(cluster, "workflow", "hello", "-n", ns) or {}
        return found if (found.get("status") or {}).get("phase") else None

    held = await kube.eventually(seen_by_argo, timeout=STEP_S, what="Argo taking the held workflow in")
    assert held["spec"]["suspend"] is True
    assert not (held.get("status") or {}).get("nodes"), held["status"]
    assert names.WORKFLOW_SUSPEND_TEMPLATE in [t["name"] for t in held["spec"]["templates"]]
    assert phase(get(cluster, "queueunit", "hello", "-n", ns)) in ("", "Enqueued")
    assert items(cluster, "pods", "-n", ns) == []

    # Room in the quota: admitted and released; Argo starts the step's pod, born gated and released
    # within the reservation (docs/compatibility.md#argo-workflow), and the unit is Running.
    apply(cluster, quota("wf-life", ns, cpu="1"))

    async def step_running() -> Obj | None:
        pods = items(cluster, "pods", "-n", ns, "-l", "workflows.argoproj.io/workflow=hello")
        running_pods = [p for p in pods if running_on_kwok(p)]
        return running_pods[0] if running_pods else None

    pod = await kube.eventually(step_running, timeout=STEP_S, what="Argo's step pod running on a kwok node")

    async def unit_running() -> bool:
        return phase(get(cluster, "queueunit", "hello", "-n", ns)) == "Running"

    await kube.eventually(unit_running, timeout=STEP_S, what="the workflow's unit Running")
    await wait_used(cluster, "wf-life", ns, 1000)

    # The step exits 0: Argo writes the workflow Succeeded (as the status writer the webhook trusts),
    # the unit is Succeed and the quota free.
    exit_zero(cluster, pod)

    async def succeeded() -> bool:
        found = get(cluster, "workflow", "hello", "-n", ns) or {}
        return (found.get("status") or {}).get("phase") == "Succeeded"

    await kube.eventually(succeeded, timeout=STEP_S, what="Argo marking the workflow Succeeded")

    async def unit_succeeded() -> Obj | None:
        found = get(cluster, "queueunit", "hello", "-n", ns)
        return found if phase(found) == "Succeed" else None

    ended = await kube.eventually(unit_succeeded, timeout=STEP_S, what="the workflow's unit Succeed")
    assert admitted(ended) == {}
    await wait_used(cluster, "wf-life", ns, 0)


def parallel_workflow(name: str, namespace: str, quota: str, *, reserve: str, step_cpu: str) -> Obj:
    """An Argo Workflow whose entrypoint runs two steps in parallel (one step group), each asking
    ``step_cpu``, and that reserves ``reserve`` cpu by ``koord-queue/min-resources``."""
    work = {
        "name": "work",
        "container": {
            "image": "busybox:stable",
            "command": ["true"],
            "resources": {"requests": {"cpu": step_cpu}},
        },
    }
    pair = {"name": "main", "steps": [[{"name": "a", "template": "work"}, {"name": "b", "template": "work"}]]}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {names.QUOTA_NAME_LABEL: quota},
            "annotations": {names.MIN_RESOURCES_ANNOTATION: json.dumps({"cpu": reserve})},
        },
        "spec": {"entrypoint": "main", "templates": [pair, work]},
    }


def running_requests_over_time(seen: list[tuple[str, Obj]]) -> list[int]:
    """After each recorded pod event, the summed cpu requests (milli) of the pods then bound to a
    node and not terminated: what the workflow ran at that moment of the API's history."""
    current: dict[str, Obj] = {}
    sums = []
    for kind, obj in seen:
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            current.pop(uid, None)
        else:
            current[uid] = obj
        sums.append(
            sum(
                podtemplates.pod_requests(p["spec"]).get("cpu", 0)
                for p in current.values()
                if p["spec"].get("nodeName")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            )
        )
    return sums


async def test_workflow_steps_run_within_its_reservation_one_after_another_and_it_succeeds(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    """docs/compatibility.md#argo-workflow: ``koord-queue/min-resources`` is a reservation, not a
    ceiling the user sets on their own charge. Two parallel 1-CPU steps of a workflow reserving
    1 CPU (in a quota with room for both) are born gated, run one after the other, never at the
    same time, and the workflow Succeeds."""
    cluster = op_cluster
    ns = new_namespace(cluster, "wf-reserve")
    apply(cluster, quota("wf-reserve", ns, cpu="4"))  # the quota is not what limits the steps
    async with kube.Recorder(cluster, kq.PODS, namespace=ns) as record:
        apply(cluster, parallel_workflow("pair", ns, "wf-reserve", reserve="1", step_cpu="1"))
        await wait_used(cluster, "wf-reserve", ns, 1000)

        def steps() -> list[Obj]:
            return items(cluster, "pods", "-n", ns, "-l", "workflows.argoproj.io/workflow=pair")

        # Argo creates both step pods at once; one runs, the other waits behind the gate, and a
        # Normal event on the workflow says why. Each finished step lets the next one run.
        done: set[str] = set()
        for _ in range(2):

            async def one_running(done: set[str] = done) -> Obj | None:
                pods = [p for p in steps() if p["metadata"]["name"] not in done]
                running_pods = [p for p in pods if running_on_kwok(p)]
                if len(running_pods) > 1:
                    raise AssertionError(f"two steps run at once: {summary(pods)}")
                return running_pods[0] if running_pods else None

            pod = await kube.eventually(
                one_running, timeout=STEP_S, what="one step pod running on a kwok node"
            )
            if not done:
                others = [p for p in steps() if p["metadata"]["uid"] != pod["metadata"]["uid"]]
                assert len(others) == 1 and gated(others[0]), summary(others)

                async def waits_event() -> Obj | None:
                    listed = items(cluster, "events", "-n", ns)
                    found = [e for e in listed if e.get("reason") == "PodWaitsForReservation"]
                    return found[0] if found else None

                event = await kube.eventually(
                    waits_event, timeout=STEP_S, what="the PodWaitsForReservation event"
                )
                assert event["type"] == "Normal" and event["involvedObject"]["kind"] == "Workflow"
                assert others[0]["metadata"]["name"] in event["message"], event["message"]
            exit_zero(cluster, pod)
            done.add(pod["metadata"]["name"])

        async def succeeded() -> bool:
            found = get(cluster, "workflow", "pair", "-n", ns) or {}
            return (found.get("status") or {}).get("phase") == "Succeeded"

        await kube.eventually(succeeded, timeout=STEP_S, what="Argo marking the workflow Succeeded")
        await wait_used(cluster, "wf-reserve", ns, 0)

    # From the API's own record of every pod version: both step pods were born gated, and the
    # bound, unfinished step pods never asked for more than the 1 CPU reserved.
    created = {o["metadata"]["uid"]: o for k, o in reversed(record.seen) if k == "ADDED"}
    assert len(created) == 2, [o["metadata"]["name"] for o in created.values()]
    assert all(gated(first) for first in created.values()), [o["spec"] for o in created.values()]
    sums = running_requests_over_time(record.seen)
    assert max(sums) == 1000, sums


async def test_rayjob_kuberay_refuses_to_hold_fails_instead_of_holding_quota(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    cluster = op_cluster
    ns = new_namespace(cluster, "ray-strict")
    apply(cluster, quota("ray-strict", ns, cpu="500m"))  # no room: the job stays held
    apply(cluster, rayjob("keeps-cluster", ns, "ray-strict", cpu="500m", shutdown=False))

    async def refused() -> Obj | None:
        found = get(cluster, "rayjob", "keeps-cluster", "-n", ns) or {}
        return found if (found.get("status") or {}).get("jobDeploymentStatus") == "ValidationFailed" else None

    job = await kube.eventually(refused, timeout=STEP_S, what="KubeRay refusing the held RayJob")
    assert "shutdownAfterJobFinishes" in job["status"]["message"]

    # Finished for the queue: its unit is Failed, or it never got one when the reconciler first
    # saw it refused (a finished job gets none).
    async def unit_failed_or_none() -> bool:
        found = unit(cluster, ns, RAY, "keeps-cluster")
        return found is None or phase(found) == "Failed"

    await kube.eventually(unit_failed_or_none, timeout=STEP_S, what="the refused RayJob's unit Failed")

    # Its quota is not held: a job that needs all of it runs.
    apply(cluster, quota("ray-strict", ns, cpu="1"))
    apply(cluster, rayjob("follows", ns, "ray-strict", cpu="500m"))
    await wait_running(cluster, ns, RAY, "follows")
    assert admitted(unit(cluster, ns, RAY, "keeps-cluster")) == {}
    assert not pods_of(cluster, ns, RAY, "keeps-cluster")


async def mandatory_namespace(cluster: LocalCluster, prefix: str) -> str:
    """A new namespace where queueing is mandatory, once the webhook holds an unlabelled Job there
    (a server-side dry run: the registration's namespace selector has caught up)."""
    ns = new_namespace(cluster, prefix)
    kube.kubectl(cluster, "label", "namespace", ns, f"{MANDATORY_LABEL}=true")

    async def selected() -> bool:
        probe = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe"}}
        probe["spec"] = {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}
        }
        out = kube.kubectl(
            cluster,
            "create",
            "--dry-run=server",
            "-n",
            ns,
            "-o",
            "json",
            "-f",
            "-",
            input_text=json.dumps(probe),
        )
        return json.loads(out.stdout)["spec"].get("suspend") is True

    await kube.eventually(selected, timeout=30, what=f"namespace {ns} selected by the webhook")
    return ns


async def test_rayjob_submitter_where_queueing_is_mandatory_is_born_gated_and_released_once_admitted(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    """KubeRay's submitter Job carries no quota label, so only where queueing is mandatory does it
    reach the webhook: there it claims the RayJob as its parent, and the webhook, which cannot check
    the claim, gates its template (docs/architecture.md#trust-boundaries). The submitter is the
    RayJob's pod set ``submitter``; the reconciler releases its one pod within that admission because
    the Job is controlled by the RayJob and the pod fits the admitted size (docs/compatibility.md#rayjob),
    so KubeRay's run is not stranded: the submitter pod runs and its end ends the RayJob."""
    cluster = op_cluster
    ns = await mandatory_namespace(cluster, "ray-mandatory")
    apply(cluster, quota("ray-mandatory", ns, cpu="1"))
    async with kube.Recorder(cluster, kq.PODS, ns) as pods_seen:
        apply(cluster, rayjob("sub", ns, "ray-mandatory", cpu="500m"))
        await wait_running(cluster, ns, RAY, "sub")

        async def submitter_running() -> Obj | None:
            found = items(cluster, "pods", "-n", ns, "-l", "batch.kubernetes.io/job-name=sub")
            return next((p for p in found if running_on_kwok(p)), None)

        submitter = await kube.eventually(submitter_running, timeout=STEP_S, what="the submitter pod running")
        job = get(cluster, "job", "sub", "-n", ns)
        assert job is not None and job["spec"].get("suspend") is not True
        assert {"name": names.ADMISSION_GATE} in job["spec"]["template"]["spec"]["schedulingGates"]
        assert get(cluster, "queueunit", "sub", "-n", ns) is None  # its parent's, not queued itself
        held = unit(cluster, ns, RAY, "sub")
        assert admitted(held).get("submitter") == 1, (held or {}).get("status")
        first = await pods_seen.until(submitter["metadata"]["name"], lambda p: True, what="its first version")
        assert gated(first) and not first["spec"].get("nodeName"), first["spec"]

        finish_submitter(cluster, ns, "sub")

        async def unit_ended() -> Obj | None:
            found = unit(cluster, ns, RAY, "sub")
            return found if phase(found) in ("Succeed", "Failed") else None

        await kube.eventually(unit_ended, timeout=STEP_S, what="the unit of the finished RayJob ended")
        job = get(cluster, "rayjob", "sub", "-n", ns)
        assert job is not None, "the RayJob"
        assert "Submitter completed" in job["status"].get("message", ""), job["status"]


async def test_a_forged_submitter_job_runs_no_pod_larger_than_the_submitter_admitted(
    op_cluster: LocalCluster, running: system.Processes
) -> None:
    """The attack, by alice with a namespace user's rights (``tests/tenancy.py``) where queueing is
    mandatory: before KubeRay makes her RayJob's submitter, she makes the Job herself, named after
    the RayJob and controlled by it (its real UID), with one pod asking for 2 CPU. KubeRay takes that
    Job for its submitter. Its pod is the RayJob's pod set ``submitter`` and may run only within
    what that pod set was admitted with (docs/compatibility.md#rayjob): the declared submitter asks
    128Mi and no CPU, so the pod stays gated (a Warning ``PodKeptGated`` says why) though the quota
    has room for it, while the cluster runs. Every recorded version of the pod is gated and unbound.
    (Without KubeRay's own label on her Job, KubeRay does not see it and retries creating the
    submitter for ever: the same pod, and her RayJob never runs.)"""
    cluster = op_cluster
    ns = await mandatory_namespace(cluster, "ray-forged-submitter")
    tenancy.grant(cluster, ns, tenancy.ALICE)
    apply(cluster, quota("ray-forged-sub", ns, cpu="500m"))  # too small: the RayJob waits
    async with kube.Recorder(cluster, kq.PODS, ns) as pods_seen:
        await tenancy.create_as(cluster, ns, rayjob("fsub", ns, "ray-forged-sub", cpu="500m"))
        job = get(cluster, "rayjob", "fsub", "-n", ns) or {}
        owner = {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "name": "fsub",
            "uid": job["metadata"]["uid"],
            "controller": True,
        }
        container = {"name": "big", "image": RAY_IMAGE, "resources": {"requests": {"cpu": "2"}}}
        forged = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            # KubeRay caches only the Jobs labelled as its own: with the label it takes this one
            # for the submitter it would have made.
            "metadata": {
                "name": "fsub",
                "labels": {KUBERAY_CREATED_BY: "kuberay-operator"},
                "ownerReferences": [owner],
            },
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
        }
        await tenancy.create_as(cluster, ns, forged)
        apply(cluster, quota("ray-forged-sub", ns, cpu="8"))  # room for the pod: only its size stops it
        await wait_running(cluster, ns, RAY, "fsub")

        async def kept_gated() -> list[Obj]:
            return [
                e
                for e in kube.events_of(cluster, ns, "fsub", kind="RayJob")
                if e["reason"] == names.EventReason.POD_KEPT_GATED and "pod set submitter" in e["message"]
            ]

        [event] = await kube.eventually(kept_gated, timeout=STEP_S, what="PodKeptGated for the forged pod")
        assert "cpu 2 > 0" in event["message"], event["message"]
        pods = items(cluster, "pods", "-n", ns, "-l", "batch.kubernetes.io/job-name=fsub")
        assert pods, "the forged Job's pod"
    versions = [p for p in pods_seen.objects if p["metadata"]["uid"] in {q["metadata"]["uid"] for q in pods}]
    assert versions
    for version in versions:
        assert gated(version) and not version["spec"].get("nodeName"), version["spec"]
