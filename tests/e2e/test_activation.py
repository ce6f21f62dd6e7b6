"""Deactivation and the execution budget of running jobs
(docs/compatibility.md#activation-and-execution-budget; scenarios S24 and S25 of
docs/compatibility.md#scenario-list).

S24: a running job whose QueueUnit is deactivated (``spec.active: false``) is suspended, its unit
returns to Enqueued with ``Evicted=True/Deactivated`` and ``Admitted=False``, its quota is released,
and a Normal ``Deactivated`` event is recorded on the job. S25: a job annotated with a 3 s budget is
deactivated once its pods have run that long, with ``Evicted=True/MaximumExecutionTimeExceeded``
and a Warning event on the job.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e


def quota(ns: str, name: str) -> str:
    return json.dumps(
        {
            "apiVersion": names.QUOTA_API_VERSION,
            "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"max": {"cpu": "2"}, "min": {"cpu": "2"}},
        }
    )


def long_job(ns: str, name: str, quota_name: str, annotations: dict[str, str] | None = None) -> str:
    return json.dumps(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {names.QUOTA_NAME_LABEL: quota_name},
                "annotations": annotations or {},
            },
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "10m"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                        ],
                    },
                },
            },
        }
    )


def get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    out = kube.kubectl(cluster, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def condition(unit: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in unit.get("status", {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def job_events(cluster: LocalCluster, ns: str, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in kube.events_of(cluster, ns, name)]


async def running(cluster: LocalCluster, ns: str, name: str) -> None:
    async def phase_running() -> bool:
        return bool(get(cluster, "queueunit", name, "-n", ns).get("status", {}).get("phase") == "Running")

    await kube.eventually(phase_running, timeout=60, what=f"{name} Running")


async def test_deactivating_a_running_job_suspends_it_and_releases_its_quota(
    e2e_cluster: LocalCluster, system_e2e: object, namespace_in: str
) -> None:
    ns, q = namespace_in, f"deact-{namespace_in}"
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=quota(ns, q))
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=long_job(ns, "runner", q))
    await running(e2e_cluster, ns, "runner")
    assert condition(get(e2e_cluster, "queueunit", "runner", "-n", ns), "PodsReady").get("status") == "True"

    kube.kubectl(
        e2e_cluster,
        "patch",
        "queueunit",
        "runner",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"active":false}}',
    )

    async def parked() -> dict[str, Any] | None:
        unit = get(e2e_cluster, "queueunit", "runner", "-n", ns)
        return unit if unit.get("status", {}).get("message") == names.Message.DEACTIVATED else None

    unit = await kube.eventually(parked, timeout=30, what="unit parked as deactivated")
    assert unit["status"]["phase"] == "Enqueued"
    assert unit["status"].get("admissions", []) == []
    assert condition(unit, "Evicted")["status"] == "True"
    assert condition(unit, "Evicted")["reason"] == "Deactivated"
    assert condition(unit, "Admitted")["status"] == "False"
    assert get(e2e_cluster, "job", "runner", "-n", ns)["spec"]["suspend"] is True
    await kube.eventually(
        lambda: _async(("Normal", "Deactivated") in job_events(e2e_cluster, ns, "runner")),
        what="Deactivated event on the job",
    )

    # Another job now gets the whole quota.
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=long_job(ns, "next", q))
    await running(e2e_cluster, ns, "next")


async def test_a_job_past_its_execution_budget_is_deactivated(
    e2e_cluster: LocalCluster, system_e2e: object, namespace_in: str
) -> None:
    ns, q = namespace_in, f"budget-{namespace_in}"
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=quota(ns, q))
    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text=long_job(ns, "limited", q, {names.MAX_EXEC_TIME_ANNOTATION: "3"}),
    )
    await running(e2e_cluster, ns, "limited")
    assert get(e2e_cluster, "queueunit", "limited", "-n", ns)["spec"]["maximumExecutionTimeSeconds"] == 3

    async def exceeded() -> dict[str, Any] | None:
        unit = get(e2e_cluster, "queueunit", "limited", "-n", ns)
        evicted = condition(unit, "Evicted")
        return unit if evicted.get("reason") in ("MaximumExecutionTimeExceeded", "Deactivated") else None

    unit = await kube.eventually(exceeded, timeout=30, what="budget exceeded")
    assert unit["spec"]["active"] is False
    await kube.eventually(
        lambda: _async(("Warning", "MaximumExecutionTimeExceeded") in job_events(e2e_cluster, ns, "limited")),
        what="MaximumExecutionTimeExceeded event on the job",
    )

    async def suspended() -> bool:
        return bool(get(e2e_cluster, "job", "limited", "-n", ns)["spec"]["suspend"] is True)

    await kube.eventually(suspended, timeout=30, what="job suspended after the budget ran out")


async def _async(value: bool) -> bool:
    return value
