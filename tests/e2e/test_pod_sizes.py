"""A unit is charged exactly what its real pods ask for (docs/compatibility.md#queueunit-construction,
docs/compatibility.md#requests-the-apiserver-fills-in), end to end.

The pods are made by the real Job controller and pass the real apiserver's admission plugins, so
LimitRanger fills in the namespace's default requests and the RuntimeClass plugin the overhead;
kube-scheduler binds them to kwok nodes. The test reads a bound pod as stored and computes its
requests with the same rule the kube-scheduler follows (``shared.api.podtemplates.pod_requests``:
containers, init containers, pod-level requests, overhead) and compares them with the per-pod
requests of the unit's pod set. A Job of every shape the queue must not under-charge: a container
without requests (the LimitRange's default), an init container larger than the main one, a
pod-level request above the containers' sum, and a RuntimeClass with overhead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.shared.api import names, podtemplates
from testenv import system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube
from tests.scenario import Obj, Scenario, phase

pytestmark = pytest.mark.e2e


@pytest.fixture
async def env(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with kube.client(e2e_cluster) as api:
        yield Scenario(api, e2e_cluster, namespace_in)


def job(name: str, quota: str, pod: Obj) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "template": {
                "metadata": {"annotations": {COMPLETE_DELAY_ANNOTATION: "60s"}},
                "spec": {"restartPolicy": "Never", **pod},
            },
        },
    }


def main(**resources: Any) -> Obj:
    return {"name": "main", "image": "busybox:stable", "command": ["sleep", "60"], "resources": resources}


async def test_each_unit_charges_what_its_real_pods_ask_for(env: Scenario) -> None:
    quota = env.name("q")
    await env.add_quota(quota, {"cpu": "40", "memory": "64Gi"})
    defaults = kube.limit_range(env.ns, {"cpu": "300m", "memory": "96Mi"})
    env.kubectl("apply", "-f", "-", input_text=json.dumps(defaults))
    with kube.runtime_class(env.cluster, env.name("sandbox"), {"cpu": "150m", "memory": "32Mi"}) as sandbox:
        shapes: dict[str, Obj] = {
            "bare": {"containers": [main()]},
            "init": {
                "initContainers": [{**main(requests={"cpu": "2"}), "name": "setup"}],
                "containers": [main(requests={"cpu": "500m"})],
            },
            "podlevel": {
                "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
                "containers": [main(requests={"cpu": "100m"}), {**main(), "name": "side"}],
            },
            "sandboxed": {"runtimeClassName": sandbox, "containers": [main(requests={"cpu": "1"})]},
        }
        for name, pod in shapes.items():
            env.apply(job(name, quota, pod))
        for name in shapes:
            unit = await env.wait_unit(name, lambda u: phase(u) in ("Dequeued", "Running"), what="admitted")
            per_pod = podtemplates.pod_requests(unit["spec"]["podSet"][0]["template"]["spec"])
            pods = await kube.eventually(
                lambda n=name: bound_pods(env, n), timeout=60, what=f"{name}: pods bound by kube-scheduler"
            )
            for pod in pods:
                stored = podtemplates.pod_requests(pod["spec"])
                assert stored == per_pod, (name, pod["spec"], unit["spec"]["podSet"][0]["template"])


async def bound_pods(env: Scenario, job_name: str) -> list[Obj] | None:
    out = env.kubectl(
        "get", "pods", "-n", env.ns, "-l", f"batch.kubernetes.io/job-name={job_name}", "-o", "json"
    ).stdout
    pods: list[Obj] = [p for p in json.loads(out)["items"] if (p.get("spec") or {}).get("nodeName")]
    return pods or None
