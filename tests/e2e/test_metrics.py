"""Every metric the reconciler and the webhook declare is exported and moves during real work.

The test scrapes both ``/metrics`` endpoints, runs a small story that exercises every path (an
admission, a job that waits for quota, a queue-level preemption whose victim's pod cannot be bound
— its nodeSelector matches no node — and is reclaimed), scrapes again and compares.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e

RECONCILER_METRICS = (
    "job_schedule_attempts",
    "queueunits_in_active_queue",
    "queueunits_in_backoff_queue",
    "dequeued_quota_usage_by_quota",
    "job_scheduling_algorithm_latency",
    "queueunits_by_job_type",
    "koord_queue_admission_wait_seconds",
    "koord_queue_preemption_rounds",
    "koord_queue_preemption_victims",
    "koord_queue_reclaimed_pods",
    "koord_queue_unqueued_pods_deleted",
    "koord_queue_api_requests",
    "koord_queue_scheduling_cycle_duration_seconds",
    "koord_queue_leader",
    "koord_queue_build_info",
    "koord_queue_certificate_expiry_timestamp_seconds",
    "process_resident_memory_bytes",
)
WEBHOOK_METRICS = (
    "koord_queue_webhook_request_duration_seconds",
    "koord_queue_webhook_requests",
    "koord_queue_build_info",
    "koord_queue_certificate_expiry_timestamp_seconds",
    "process_resident_memory_bytes",
)
#: Metrics that must have increased (counters, histogram counts) over the story.
MOVING = (
    "job_schedule_attempts",
    "job_scheduling_algorithm_latency",
    "koord_queue_scheduling_cycle_duration_seconds",
    "koord_queue_admission_wait_seconds",
    "koord_queue_preemption_rounds",
    "koord_queue_preemption_victims",
    "koord_queue_reclaimed_pods",
    "koord_queue_api_requests",
    "koord_queue_webhook_request_duration_seconds",
    "koord_queue_webhook_requests",
)


def scrape(port: int) -> dict[str, float]:
    """Family name -> sum of its samples (``_count`` only for histograms)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        samples = family.samples
        if family.type == "histogram":
            samples = [s for s in samples if s.name.endswith("_count")]
        elif family.type == "counter":
            samples = [s for s in samples if s.name.endswith("_total")]
        totals[family.name] = sum(s.value for s in samples) if samples else 0.0
        totals.setdefault(f"{family.name}#series", float(len(samples)))
    return totals


def job(ns: str, name: str, quota: str, priority_class: str, *, unschedulable: bool = False) -> str:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority_class,
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "2"}}}],
    }
    if unschedulable:
        spec["nodeSelector"] = {"no-such-node": "true"}
    return json.dumps(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {names.QUOTA_NAME_LABEL: quota}},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "10m"}},
                    "spec": spec,
                },
            },
        }
    )


async def test_every_metric_is_exported_and_moves(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> None:
    ns, quota = namespace_in, f"metrics-{namespace_in}"
    ports = {c.name: c.ports["metrics"] for c in system_e2e.components}
    before = {name: scrape(port) for name, port in ports.items()}

    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text="""
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: metrics-low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: metrics-high}
value: 1000
""",
    )
    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps(
            {
                "apiVersion": names.QUOTA_API_VERSION,
                "kind": "ElasticQuota",
                "metadata": {
                    "name": quota,
                    "namespace": ns,
                    "annotations": {
                        names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true",
                        names.ENABLE_PREEMPTION_ANNOTATION: "true",
                    },
                },
                "spec": {"max": {"cpu": "2"}, "min": {"cpu": "2"}},
            }
        ),
    )

    async def queue_ready() -> bool:
        out = kube.kubectl(
            e2e_cluster, "get", "queue", quota, "-n", names.COMPONENT_NAMESPACE, "-o", "json", check=False
        )
        return out.returncode == 0 and names.ENABLE_PREEMPTION_ANNOTATION in json.loads(out.stdout)[
            "metadata"
        ].get("annotations", {})

    await kube.eventually(queue_ready, what="queue with preemption enabled")
    kube.kubectl(
        e2e_cluster, "apply", "-f", "-", input_text=job(ns, "low", quota, "metrics-low", unschedulable=True)
    )

    async def phase(name: str) -> str:
        out = kube.kubectl(e2e_cluster, "get", "queueunit", name, "-n", ns, "-o", "json", check=False)
        return str(json.loads(out.stdout).get("status", {}).get("phase", "")) if out.returncode == 0 else ""

    await kube.eventually(lambda: _eq(phase("low"), "Dequeued"), what="low admitted")
    kube.kubectl(e2e_cluster, "apply", "-f", "-", input_text=job(ns, "high", quota, "metrics-high"))
    await kube.eventually(
        lambda: _in(phase("high"), ("Dequeued", "Running", "Succeed")),
        timeout=60,
        what="high admitted after preempting low",
    )

    async def moved() -> dict[str, dict[str, float]] | None:
        after = {name: scrape(port) for name, port in ports.items()}
        combined_before = {**before["reconciler"], **before["webhook"]}
        combined_after = {**after["reconciler"], **after["webhook"]}
        moving = all(combined_after.get(m, 0.0) > combined_before.get(m, 0.0) for m in MOVING)
        if moving and after["reconciler"].get("dequeued_quota_usage_by_quota", 0.0) > 0:
            return after
        return None

    after = await kube.eventually(moved, timeout=30, what="every moving metric increased")
    for name in RECONCILER_METRICS:
        assert after["reconciler"].get(f"{name}#series", 0) >= 1, f"{name} has no series"
    for name in WEBHOOK_METRICS:
        assert after["webhook"].get(f"{name}#series", 0) >= 1, f"{name} has no series"


async def _eq(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def _in(value: Any, expected: tuple[str, ...]) -> bool:
    return bool(await value in expected)
