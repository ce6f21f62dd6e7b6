"""Queue-level preemption, the preemption example (docs/compatibility.md#preemption-example),
reproduced literally.

Quota team-a holds 2 CPU; `low-priority-job` is admitted first, but no fake node has room, so its
pod stays unbound and the unit stays in the queue's assumed set. `high-priority-job` then cannot be
admitted: the low unit is marked for reclaim, the job extension deletes its unbound pod and reports
the freed quota, and a later cycle admits the high unit. The four states of the example are observed
in order from a watch on the QueueUnits (the reclaimState is transient, so polling could miss it).
Finally a node with room appears: the high job's pod is bound and runs, and the low job's
replacement pod stays gated.

This module runs its own control plane with no fake nodes at the start (KWOK_NODES=0 in the example's
terms), so no other test's nodes or quota names interfere.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import story, system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e

UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(profile="e2e", workdir=tmp_path_factory.mktemp("preemption-cp"), nodes=0)
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def running_system(bare_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    logdir = tmp_path_factory.mktemp("preemption-system")
    processes = system.start(bare_cluster, logdir=logdir)
    try:
        yield logdir
    finally:
        processes.stop()
        for name in ("reconciler", "webhook"):
            print(f"--- {name} ---\n" + "\n".join((logdir / f"{name}.log").read_text().splitlines()[-60:]))


@pytest.fixture
async def watched(bare_cluster: LocalCluster) -> AsyncIterator[list[dict[str, Any]]]:
    """Every version of every QueueUnit in the test's namespace, in order."""
    async with kube.unit_versions(bare_cluster, NAMESPACE) as seen:
        yield seen


NAMESPACE = "preemption-story"


def state(obj: dict[str, Any]) -> tuple[str, int | None, int | None, str]:
    status = obj.get("status") or {}
    admissions = status.get("admissions") or []
    first = admissions[0] if admissions else {}
    reclaim = (first.get("reclaimState") or {}).get("replicas")
    return status.get("phase", ""), first.get("replicas"), reclaim, status.get("message", "")


def versions_of(seen: list[dict[str, Any]], name: str) -> list[tuple[str, int | None, int | None, str]]:
    return [state(o) for o in seen if o["metadata"]["name"] == name]


def kubectl_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(kube.kubectl(cluster, *args, "-o", "json").stdout)
    return result


def first_index(items: list[Any], predicate: Any, start: int = 0) -> int:
    for i in range(start, len(items)):
        if predicate(items[i]):
            return i
    raise AssertionError(f"no matching state after index {start} in {items}")


async def test_the_preemption_example_preempts_the_unbound_low_priority_job(
    bare_cluster: LocalCluster, running_system: Path, watched: list[dict[str, Any]]
) -> None:
    cluster = bare_cluster
    kube.kubectl(cluster, "create", "namespace", NAMESPACE, check=False)
    kube.kubectl(cluster, "apply", "-f", "-", input_text=story.PRIORITY_CLASSES)
    kube.kubectl(cluster, "apply", "-f", "-", input_text=story.quota(NAMESPACE))

    async def queue_configured() -> bool:
        out = kube.kubectl(
            cluster, "get", "queue", "team-a", "-n", names.COMPONENT_NAMESPACE, "-o", "json", check=False
        )
        if out.returncode != 0:
            return False
        annotations = json.loads(out.stdout)["metadata"].get("annotations") or {}
        return annotations.get(names.ENABLE_PREEMPTION_ANNOTATION) == "true"

    await kube.eventually(queue_configured, what="Queue team-a with the preemption annotations")

    # Step 1: the low job is admitted, resumed, and its pod is released but cannot be bound.
    kube.kubectl(cluster, "apply", "-f", "-", input_text=story.job("low", NAMESPACE))

    async def low_pod_released() -> bool:
        pods = kubectl_json(cluster, "get", "pods", "-n", NAMESPACE, "-l", "job-name=low-priority-job")[
            "items"
        ]
        return any(not p["spec"].get("schedulingGates") for p in pods)

    await kube.eventually(low_pod_released, timeout=60, what="low job's pod ungated")
    low_job = kubectl_json(cluster, "get", "job", "low-priority-job", "-n", NAMESPACE)
    assert low_job["spec"]["suspend"] is False

    # Steps 2-4: the high job arrives; the low unit is marked, reclaimed, and the high unit admitted.
    kube.kubectl(cluster, "apply", "-f", "-", input_text=story.job("high", NAMESPACE))

    async def high_dequeued() -> bool:
        return any(
            o["metadata"]["name"] == "high-priority-job" and state(o)[0] == "Dequeued" for o in watched
        )

    await kube.eventually(high_dequeued, timeout=60, what="high-priority-job Dequeued")
    low = versions_of(watched, "low-priority-job")
    step1 = first_index(low, lambda s: s[0] == "Dequeued" and s[1] == 1 and s[2] is None)
    step2 = first_index(low, lambda s: s[2] == 1 and s[3] == names.Message.RECLAIMING, step1)
    step3 = first_index(low, lambda s: s[1] == 0 and s[2] is None, step2)
    high = versions_of(watched, "high-priority-job")
    assert any(s[0] == "Dequeued" and s[1] == 1 for s in high)
    assert step1 < step2 < step3

    # The preemptor waited with the filter result and the outcome of its preemption attempt.
    high_messages = [s[3] for s in high]
    assert any("limited quotaName:team-a" in m and m.endswith("; preempt succeed") for m in high_messages)

    # The high job's pod is released; the example's two kubectl commands.
    async def high_pod_released() -> bool:
        pods = kubectl_json(cluster, "get", "pods", "-n", NAMESPACE, "-l", "job-name=high-priority-job")[
            "items"
        ]
        return any(not p["spec"].get("schedulingGates") for p in pods)

    await kube.eventually(high_pod_released, timeout=60, what="high job's pod ungated")
    line = kube.kubectl(
        cluster,
        "get",
        "queueunit",
        "low-priority-job",
        "-n",
        NAMESPACE,
        "-o",
        'jsonpath={.status.phase}{"\\t"}{.status.admissions[0].replicas}'
        '{"\\t"}{.status.admissions[0].reclaimState.replicas}{"\\n"}',
    ).stdout
    phase, replicas, reclaim = [*line.rstrip("\n").split("\t"), "", "", ""][:3]
    assert phase in ("Dequeued", "Enqueued") and replicas == "0" and reclaim == "", line

    async def events_in_order() -> list[list[str]] | None:
        out = kube.kubectl(
            cluster,
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            "involvedObject.name=low-priority-job,involvedObject.kind=QueueUnit",
            "--sort-by=.eventTime",
            "-o",
            "custom-columns=REASON:.reason,TYPE:.type,MESSAGE:.message",
        ).stdout
        rows = [r.split(None, 2) for r in out.splitlines()[1:]]
        reasons = [r[0] for r in rows]
        if "Preempted" in reasons and "Reclaimed" in reasons:
            return rows
        return None

    rows = await kube.eventually(events_in_order, timeout=30, what="Preempted and Reclaimed events")
    reasons = [r[0] for r in rows]
    assert reasons.index("Preempted") < reasons.index("Reclaimed")
    assert rows[reasons.index("Preempted")][1] == "Warning"
    assert rows[reasons.index("Reclaimed")][1] == "Normal"

    # A node with room appears: the high pod is bound and runs; the low pod stays gated.
    cluster.add_node("roomy", cpu="4", memory="16Gi")

    async def high_running() -> bool:
        pods = kubectl_json(cluster, "get", "pods", "-n", NAMESPACE, "-l", "job-name=high-priority-job")[
            "items"
        ]
        return any(
            p["spec"].get("nodeName") == "roomy" and p["status"].get("phase") == "Running" for p in pods
        )

    await kube.eventually(high_running, timeout=60, what="high job's pod Running on the new node")

    async def low_replacement() -> list[dict[str, Any]]:
        # Reclaim took the pod's job-tracking finalizer first, so the Job controller does not count
        # a failure and replaces the pod at once (no failure backoff).
        pods = kubectl_json(cluster, "get", "pods", "-n", NAMESPACE, "-l", "job-name=low-priority-job")[
            "items"
        ]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    live = await kube.eventually(low_replacement, timeout=60, what="the low job's replacement pod")
    assert all(p["spec"].get("schedulingGates") and not p["spec"].get("nodeName") for p in live)
    # Preemption is no failure of the job: with backoffLimit 0 it would otherwise end Failed.
    low_job = kubectl_json(cluster, "get", "job", "low-priority-job", "-n", NAMESPACE)
    assert not low_job["status"].get("failed"), low_job["status"]
    assert not any(c.get("type") == "Failed" for c in low_job["status"].get("conditions") or [])
    unit = kubectl_json(cluster, "get", "queueunit", "low-priority-job", "-n", NAMESPACE)
    assert unit["status"]["phase"] != "Running"
    assert sum(a["replicas"] for a in unit["status"].get("admissions") or []) == 0
