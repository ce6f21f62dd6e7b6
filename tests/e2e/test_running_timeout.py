"""The running timeout with backoff, end to end (docs/compatibility.md#running-timeout).

Quota rt-team holds 2 CPU. Job `stuck` (2 CPU) is admitted, but its pod selects a node label no node
has, so it can never be bound. Job `next` (2 CPU) waits behind it for the quota. With
``runningTimeout: 5s`` and ``backoffTimeout: 5s`` for the ``job`` extension, `stuck`'s unit goes to
``TimeoutBackoff`` ("Backoff due to running timeout"), the job is suspended and the quota freed;
`next` is admitted and its pod runs on the fake node; after the backoff `stuck`'s unit is queued
again ("Enqueued because backoff timeout") and waits for the quota `next` now holds.

This module runs its own control plane and its own reconciler with that component configuration,
so no other test's quotas, nodes or timeouts interfere.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import parse_time
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.e2e

NAMESPACE = "running-timeout"
QUOTA_NAME = "rt-team"
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")

CONFIG = """
apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
jobRunningTimeout:
  job:
    runningTimeout: 5s
    backoffTimeout: 5s
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
    cpu: "2"
  max:
    cpu: "2"
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {ns}
  labels:
    quota.scheduling.koordinator.sh/name: {quota}
spec:
  backoffLimit: 0
  template:
    spec:
      {node_selector}
      containers:
        - name: main
          image: busybox:stable
          command: ["/bin/sh", "-c", "sleep 3600"]
          resources:
            requests:
              cpu: "2"
      restartPolicy: Never
"""


def job_yaml(name: str, *, placeable: bool) -> str:
    selector = "nodeSelector: {koord-queue-test/nowhere: 'true'}" if not placeable else ""
    return JOB.format(name=name, ns=NAMESPACE, quota=QUOTA_NAME, node_selector=selector)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # One fake node with room for `next`; its pods run far longer than the test.
    cp = LocalCluster(
        profile="e2e", workdir=tmp_path_factory.mktemp("running-timeout-cp"), nodes=1, pod_duration_s=600
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
    """The webhook and a reconciler reading the short timeouts from its --config."""
    logdir = tmp_path_factory.mktemp("running-timeout-system")
    config = logdir / "config.yaml"
    config.write_text(CONFIG)
    processes = system.Processes()
    try:
        webhook, port = system.start_webhook(cluster, logdir=logdir)
        processes.components.append(webhook)
        processes.webhook_port = port
        system.install_policies(cluster)
        processes.components.append(
            system.start_reconciler(cluster, logdir=logdir, extra_args=[f"--config={config}"])
        )
        yield logdir
    finally:
        processes.stop()
        for name in ("reconciler", "webhook"):
            log = logdir / f"{name}.log"
            if log.exists():
                print(f"--- {name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:]))


@pytest.fixture
async def watched(cluster: LocalCluster) -> AsyncIterator[list[dict[str, Any]]]:
    """Every version of every QueueUnit in the test's namespace, in order."""
    async with kube.unit_versions(cluster, NAMESPACE) as seen:
        yield seen


def kubectl_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(kube.kubectl(cluster, *args, "-o", "json").stdout)
    return result


def phase_and_message(obj: dict[str, Any]) -> tuple[str, str]:
    status = obj.get("status") or {}
    return status.get("phase", ""), status.get("message", "")


def first_index(seen: list[dict[str, Any]], name: str, phase: str, message: str | None = None) -> int | None:
    for i, obj in enumerate(seen):
        if obj["metadata"]["name"] != name:
            continue
        got_phase, got_message = phase_and_message(obj)
        if got_phase == phase and (message is None or got_message == message):
            return i
    return None


def events_of(cluster: LocalCluster, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    items: list[dict[str, Any]] = kubectl_json(
        cluster, "get", "events", "-n", NAMESPACE, "--field-selector", selector
    )["items"]
    return items


async def test_a_job_that_cannot_be_placed_times_out_frees_its_quota_and_comes_back(
    cluster: LocalCluster, running_system: Path, watched: list[dict[str, Any]]
) -> None:
    kube.kubectl(cluster, "create", "namespace", NAMESPACE, check=False)
    kube.kubectl(cluster, "apply", "-f", "-", input_text=QUOTA)

    async def queue_exists() -> bool:
        out = kube.kubectl(cluster, "get", "queue", QUOTA_NAME, "-n", names.COMPONENT_NAMESPACE, check=False)
        return out.returncode == 0

    await kube.eventually(queue_exists, timeout=60, what=f"Queue {QUOTA_NAME}")

    # `stuck` is admitted and released; its pod is ungated but no node matches its selector.
    kube.kubectl(cluster, "apply", "-f", "-", input_text=job_yaml("stuck", placeable=False))

    async def stuck_admitted() -> bool:
        return first_index(watched, "stuck", "Dequeued") is not None

    await kube.eventually(stuck_admitted, timeout=60, what="stuck Dequeued")

    # `next` waits: the 2 CPU of the quota are held by `stuck`.
    kube.kubectl(cluster, "apply", "-f", "-", input_text=job_yaml("next", placeable=True))

    async def next_waits() -> bool:
        return any(
            o["metadata"]["name"] == "next"
            and phase_and_message(o)[0] == "Enqueued"
            and phase_and_message(o)[1].startswith(f"limited quotaName:{QUOTA_NAME}")
            for o in watched
        )

    await kube.eventually(next_waits, timeout=60, what="next waiting for the quota")

    # The running timeout: TimeoutBackoff with upstream's message, quota released, job held.
    async def stuck_backed_off() -> dict[str, Any] | None:
        index = first_index(watched, "stuck", "TimeoutBackoff", names.Message.BACKOFF_RUNNING_TIMEOUT)
        return watched[index] if index is not None else None

    backed_off = await kube.eventually(stuck_backed_off, timeout=60, what="stuck TimeoutBackoff")
    status = backed_off["status"]
    assert status["admissions"] == []
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Evicted"]["status"], conditions["Evicted"]["reason"]) == ("True", "BackoffTimeout")
    assert conditions["QuotaReserved"]["status"] == "False"
    assert conditions["Admitted"]["status"] == "False"
    assert status["requeueState"]["count"] == 1
    delay = (parse_time(status["requeueState"]["requeueAt"]) or 0) - (
        parse_time(status["lastUpdateTime"]) or 0
    )
    assert delay == pytest.approx(5, abs=1)  # backoffTimeout, not the doubling from 10 s
    # Timed from the admission: about runningTimeout after lastAllocateTime.
    allocated = parse_time(status["lastAllocateTime"]) or 0
    assert 4 <= (parse_time(status["lastUpdateTime"]) or 0) - allocated <= 15

    stuck_job = kubectl_json(cluster, "get", "job", "stuck", "-n", NAMESPACE)
    assert stuck_job["spec"]["suspend"] is True
    dequeue_stamp = (stuck_job["metadata"].get("annotations") or {}).get(
        names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION
    )
    assert not dequeue_stamp

    # The freed quota lets `next` in, and its pod runs on the fake node.
    async def next_running() -> bool:
        pods = kubectl_json(cluster, "get", "pods", "-n", NAMESPACE, "-l", "job-name=next")["items"]
        return any(p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in pods)

    await kube.eventually(next_running, timeout=60, what="next's pod Running")

    async def next_admitted_seen() -> int | None:
        # kubectl blocks the event loop: give the watch its turn to catch up.
        return first_index(watched, "next", "Dequeued")

    next_admitted = await kube.eventually(next_admitted_seen, timeout=30, what="next Dequeued in the watch")
    timed_out = first_index(watched, "stuck", "TimeoutBackoff")
    assert timed_out is not None and timed_out < next_admitted

    # After the backoff `stuck` is queued again, and waits for the quota `next` holds now.
    async def stuck_requeued() -> bool:
        return first_index(watched, "stuck", "Enqueued", names.Message.ENQUEUED_AFTER_BACKOFF) is not None

    await kube.eventually(stuck_requeued, timeout=60, what="stuck Enqueued because backoff timeout")
    requeued = first_index(watched, "stuck", "Enqueued", names.Message.ENQUEUED_AFTER_BACKOFF)
    assert requeued is not None and requeued > timed_out

    async def stuck_waits_for_quota() -> bool:
        unit = kubectl_json(cluster, "get", "queueunit", "stuck", "-n", NAMESPACE)
        phase, message = phase_and_message(unit)
        return phase == "Enqueued" and message.startswith(f"limited quotaName:{QUOTA_NAME}")

    await kube.eventually(stuck_waits_for_quota, timeout=60, what="stuck waiting for the quota again")
    assert kubectl_json(cluster, "get", "job", "stuck", "-n", NAMESPACE)["spec"]["suspend"] is True

    # Warning events on the job and on its unit.
    async def warned() -> bool:
        return all(
            any(
                e["reason"] == names.RUNNING_TIMEOUT_REASON and e["type"] == "Warning"
                for e in events_of(cluster, kind, "stuck")
            )
            for kind in ("Job", "QueueUnit")
        )

    await kube.eventually(warned, timeout=30, what="RunningTimeout events on the job and its unit")
