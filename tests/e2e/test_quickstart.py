"""The quick start of the Koord-Queue user guide (docs/operations.md#first-quota-and-job), end to end
with its own YAML.

Quota team-a holds 4 CPU and 8Gi; `my-job` runs; `my-job-blocked` stays Enqueued with a message
naming the limiting quota and resource, and is admitted automatically once `my-job` finishes. The
only change to the guide's YAML is a kwok annotation that keeps my-job's pod running for a few
seconds, so the blocked state can be observed without a race.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e

QUOTA = """
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  name: team-a
  namespace: {ns}
  labels:
    quota.scheduling.koordinator.sh/parent: ""
    quota.scheduling.koordinator.sh/is-parent: "false"
spec:
  max:
    cpu: "4"
    memory: 8Gi
  min:
    cpu: "4"
    memory: 8Gi
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {ns}
  labels:
    quota.scheduling.koordinator.sh/name: team-a
spec:
  suspend: true
  template:
    metadata:
      annotations:
        pod-complete.stage.kwok.x-k8s.io/delay: "8s"
    spec:
      containers:
      - name: test
        image: busybox:stable
        command: ["/bin/sh", "-c", "sleep 30"]
        resources:
          requests:
            cpu: "4"
            memory: 8Gi
          limits:
            cpu: "4"
            memory: 8Gi
      restartPolicy: Never
"""


def unit(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    out = kube.kubectl(cluster, "get", "queueunit", name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


async def test_quick_start_admits_one_job_and_queues_the_other_until_it_finishes(
    e2e_cluster: LocalCluster, system_e2e: object, namespace_in: str
) -> None:
    ns = namespace_in
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=QUOTA.format(ns=ns))
    await kube.eventually(
        lambda: _async(
            kube.kubectl(
                e2e_cluster, "get", "queue", "team-a", "-n", names.COMPONENT_NAMESPACE, check=False
            ).returncode
            == 0
        ),
        what="Queue team-a created from the quota",
    )
    jobs = JOB.format(name="my-job", ns=ns) + "---" + JOB.format(name="my-job-blocked", ns=ns)
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=jobs)

    async def running() -> bool:
        out = kube.kubectl(e2e_cluster, "get", "pods", "-n", ns, "-l", "job-name=my-job", "-o", "json").stdout
        pods = json.loads(out)["items"]
        return any(p["status"].get("phase") == "Running" for p in pods)

    await kube.eventually(running, timeout=60, what="my-job's pod Running")
    admitted = unit(e2e_cluster, ns, "my-job")
    assert admitted["status"]["phase"] in ("Dequeued", "Running")

    async def blocked_with_reason() -> dict[str, Any] | None:
        got = unit(e2e_cluster, ns, "my-job-blocked")
        message = got.get("status", {}).get("message", "")
        return got if "limited quotaName:team-a" in message else None

    blocked = await kube.eventually(
        blocked_with_reason, timeout=30, what="my-job-blocked parked with a reason"
    )
    assert blocked["status"].get("phase", "") in ("", "Enqueued")
    assert "resKey:cpu" in blocked["status"]["message"] or "resKey:memory" in blocked["status"]["message"]
    job = json.loads(kube.kubectl(e2e_cluster, "get", "job", "my-job-blocked", "-n", ns, "-o", "json").stdout)
    assert job["spec"]["suspend"] is True

    table = kube.kubectl(e2e_cluster, "get", "queueunit", "my-job-blocked", "-n", ns).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "PRIORITY", "ADMISSIONS", "JOBTYPE"]
    assert row.split()[0] == "my-job-blocked" and "Job" in row.split()

    async def dequeued() -> bool:
        got = unit(e2e_cluster, ns, "my-job-blocked")
        return got.get("status", {}).get("phase") in ("Dequeued", "Running", "Succeed")

    await kube.eventually(dequeued, timeout=90, what="my-job-blocked admitted after my-job finished")
    first = unit(e2e_cluster, ns, "my-job")
    assert first["status"]["phase"] == "Succeed"
    assert first["status"].get("admissions", []) == []


async def _async(value: bool) -> bool:
    return value
