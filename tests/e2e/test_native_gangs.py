"""Native gang hand-off to kube-scheduler, end to end (docs/compatibility.md#native-gang-hand-off).

The control plane runs with the alpha Workload API (``--runtime-config=scheduling.k8s.io/v1alpha1=true``)
and the feature gates ``GenericWorkload`` and ``GangScheduling``; the reconciler with
``nativeGangHandoff: true`` and a 20s running timeout for batch Jobs. One fake node has 3 CPU.

* ``fits``: a Job of 4 pods x 500m with ``koord-queue/job-min-parallelism: 4``: its template gets a
  ``workloadRef``, the reconciler creates the Workload (gang of 4) before ungating, all 4 pods bind;
* ``too-big``: the same gang at 1 CPU a pod, with 1 CPU left on the node: kube-scheduler binds none
  of its pods (all-or-nothing at Permit), and the running timeout takes the admission back
  (TimeoutBackoff, the job held again), as it would for any job that cannot run.

The webhook reads what the reconciler publishes from a file; here the test copies the ConfigMap
into that file, as the kubelet does for the Deployment's volume.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from koord_queue.shared.core import workloadref
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import wait_until
from tests import kube

pytestmark = pytest.mark.e2e

NAMESPACE = "native-gangs"
QUOTA_NAME = "gang-team"

CONFIG = """
apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
nativeGangHandoff: true
jobRunningTimeout:
  job:
    runningTimeout: 20s
    backoffTimeout: 10m
"""

QUOTA = f"""
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: {QUOTA_NAME}
  namespace: {NAMESPACE}
  labels:
    quota.scheduling.koordinator.sh/parent: ""
spec:
  min:
    cpu: "20"
  max:
    cpu: "20"
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {ns}
  labels:
    quota.scheduling.koordinator.sh/name: {quota}
  annotations:
    koord-queue/job-min-parallelism: "4"
spec:
  parallelism: 4
  completions: 4
  backoffLimit: 0
  template:
    spec:
      containers:
        - name: main
          image: busybox:stable
          command: ["/bin/sh", "-c", "sleep 3600"]
          resources:
            requests:
              cpu: "{cpu}"
      restartPolicy: Never
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cp = LocalCluster(
        profile="e2e",
        workdir=tmp_path_factory.mktemp("native-gangs-cp"),
        nodes=1,
        node_cpu="3",
        pod_duration_s=600,
        feature_gates=tuple(f"{gate}=true" for gate in workloadref.FEATURE_GATES),
        runtime_config=(f"{workloadref.WORKLOAD_API_VERSION}=true",),
    )
    cp.start()
    try:
        system.install_crds(cp)
        yield cp
    except BaseException:
        print(cp.logs())
        raise
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def running_system(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    logdir = tmp_path_factory.mktemp("native-gangs-system")
    config = logdir / "config.yaml"
    config.write_text(CONFIG)
    published = logdir / "native-gangs" / workloadref.STATE_KEY
    published.parent.mkdir()
    processes = system.Processes()
    try:
        webhook, _ = system.start_webhook(
            cluster, logdir=logdir, extra_args=[f"--native-gang-handoff-file={published}"]
        )
        processes.components.append(webhook)
        system.install_policies(cluster)
        processes.components.append(
            system.start_reconciler(cluster, logdir=logdir, extra_args=[f"--config={config}"])
        )

        def project() -> bool:  # what the kubelet does for the webhook Deployment's volume
            path = f"/api/v1/namespaces/{names.COMPONENT_NAMESPACE}/configmaps/{workloadref.STATE_CONFIGMAP}"
            data = json.loads(cluster.request("GET", path)).get("data") or {}
            published.write_text(data.get(workloadref.STATE_KEY, ""))
            return bool(data.get(workloadref.STATE_KEY))

        wait_until(project, timeout=60, what="the reconciler publishing the Workload API as served")
        wait_until(lambda: stamps(cluster), timeout=60, what="the webhook reading it (at most every 10s)")
        yield logdir
    finally:
        processes.stop()
        for name in ("reconciler", "webhook"):
            log = logdir / f"{name}.log"
            if log.exists():
                print(f"--- {name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:]))


def stamps(cluster: LocalCluster) -> bool:
    """A dry-run gang Job (in ``default``: nothing is stored) comes back with a workloadRef."""
    job = yaml.safe_load(JOB.format(name="probe", ns="default", quota=QUOTA_NAME, cpu="1"))
    stored = json.loads(cluster.request("POST", "/apis/batch/v1/namespaces/default/jobs?dryRun=All", job))
    return "workloadRef" in stored["spec"]["template"]["spec"]


def get_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(kube.kubectl(cluster, "get", *args, "-o", "json").stdout)
    return result


def pods_of(cluster: LocalCluster, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        cluster, "pods", "-n", NAMESPACE, "-l", f"batch.kubernetes.io/job-name={job}"
    )["items"]
    return items


def unit_phase(cluster: LocalCluster, name: str) -> str:
    out = kube.kubectl(cluster, "get", "queueunit", name, "-n", NAMESPACE, "-o", "json", check=False)
    if out.returncode != 0:
        return ""
    return str((json.loads(out.stdout).get("status") or {}).get("phase", ""))


async def test_a_gang_binds_whole_or_not_at_all(cluster: LocalCluster, running_system: Path) -> None:
    kube.kubectl(cluster, "create", "namespace", NAMESPACE, check=False)
    kube.kubectl(cluster, "apply", "-f", "-", input_text=QUOTA)

    async def queue_exists() -> bool:
        out = kube.kubectl(cluster, "get", "queue", QUOTA_NAME, "-n", names.COMPONENT_NAMESPACE, check=False)
        return out.returncode == 0

    await kube.eventually(queue_exists, timeout=60, what=f"Queue {QUOTA_NAME}")

    # A gang that fits: stamped, described, and bound whole.
    kube.kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input_text=JOB.format(name="fits", ns=NAMESPACE, quota=QUOTA_NAME, cpu="500m"),
    )
    job = get_json(cluster, "job", "fits", "-n", NAMESPACE)
    assert job["spec"]["template"]["spec"]["workloadRef"] == {"name": "fits", "podGroup": "fits"}

    async def all_bound() -> bool:
        pods = pods_of(cluster, "fits")
        return len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods)

    await kube.eventually(all_bound, timeout=90, interval=0.5, what="the 4 pods of fits bound")
    workload = get_json(cluster, "workloads.scheduling.k8s.io", "fits", "-n", NAMESPACE)
    assert workload["spec"]["podGroups"] == [{"name": "fits", "policy": {"gang": {"minCount": 4}}}]
    assert [(o["kind"], o["name"]) for o in workload["metadata"]["ownerReferences"]] == [("Job", "fits")]
    assert all(
        p["spec"]["workloadRef"] == {"name": "fits", "podGroup": "fits"} for p in pods_of(cluster, "fits")
    )

    # A gang that cannot fit (4 x 1 CPU, 1 CPU left): released by the queue, bound by no one.
    kube.kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input_text=JOB.format(name="too-big", ns=NAMESPACE, quota=QUOTA_NAME, cpu="1"),
    )
    ever_bound: set[str] = set()

    async def watch_binds(until: str, timeout: float) -> None:
        async def reached() -> bool:
            for pod in pods_of(cluster, "too-big"):
                if pod["spec"].get("nodeName"):
                    ever_bound.add(pod["metadata"]["name"])
            return unit_phase(cluster, "too-big") == until

        await kube.eventually(reached, timeout=timeout, interval=0.5, what=f"too-big {until}")

    await watch_binds("Dequeued", 60)

    async def released() -> bool:
        pods = pods_of(cluster, "too-big")
        for pod in pods:
            if pod["spec"].get("nodeName"):
                ever_bound.add(pod["metadata"]["name"])
        return len(pods) == 4 and not any(p["spec"].get("schedulingGates") for p in pods)

    await kube.eventually(released, timeout=60, interval=0.5, what="the 4 pods of too-big ungated")
    assert get_json(cluster, "workloads.scheduling.k8s.io", "too-big", "-n", NAMESPACE)["spec"][
        "podGroups"
    ] == [{"name": "too-big", "policy": {"gang": {"minCount": 4}}}]
    # Sampled every 0.5 s until the running timeout (20 s) takes the admission back: the scheduler
    # has had every chance to bind a part of the gang, and a bound pod stays bound until then.
    await watch_binds("TimeoutBackoff", 90)
    assert ever_bound == set(), f"pods of a gang that cannot fit were bound: {sorted(ever_bound)}"
    assert get_json(cluster, "job", "too-big", "-n", NAMESPACE)["spec"]["suspend"] is True
    # The gang that fit is untouched.
    assert all(p["spec"].get("nodeName") for p in pods_of(cluster, "fits"))
