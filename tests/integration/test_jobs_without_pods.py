"""An admitted Job that never gets a pod is requeued, against a real kube-apiserver
(docs/compatibility.md#jobs-without-pods).

The integration control plane runs no Job controller, so a Job admitted and resumed there never gets
a pod: exactly the stranded state of a Job whose controller lost it. On a control plane of its own,
with ``noPodsTimeout: 3s`` and ``backoffTimeout: 3s`` for the ``job`` extension, and a 1-CPU quota
that waits for pods to run: Job ``lost`` is admitted and resumed and holds the queue; ``next`` waits
behind it. Within the bound ``lost`` is suspended, its unit goes to ``TimeoutBackoff`` ("Backoff due
to no pods after admission", admissions cleared) with a Warning ``NoPodsAfterAdmission`` on the Job
and on the unit, and ``next`` is admitted in the freed quota. ``next`` is then stranded in turn, and
``lost`` comes back: admitted again and resumed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube

pytestmark = pytest.mark.integration

NAMESPACE = "no-pods"
TIMEOUT = 3.0
CONFIG = f"""
apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
jobRunningTimeout:
  job:
    noPodsTimeout: {TIMEOUT:g}s
    backoffTimeout: 3s
"""
Obj = dict[str, Any]


def job(name: str) -> Obj:
    container = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {names.QUOTA_NAME_LABEL: NAMESPACE}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def get(cluster: LocalCluster, kind: str, name: str) -> Obj:
    out = kube.kubectl(cluster, "get", kind, name, "-n", NAMESPACE, "-o", "json")
    found: Obj = json.loads(out.stdout)
    return found


def status_of(cluster: LocalCluster, name: str) -> Obj:
    out = kube.kubectl(cluster, "get", "queueunit", name, "-n", NAMESPACE, "-o", "json", check=False)
    return (json.loads(out.stdout).get("status") or {}) if out.returncode == 0 else {}


def admitted_and_resumed(cluster: LocalCluster, name: str) -> bool:
    released = get(cluster, "job", name)["spec"].get("suspend") is False
    return status_of(cluster, name).get("phase") in ("Dequeued", "Running") and released


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    logdir = tmp_path_factory.mktemp("no-pods")
    cp = LocalCluster(profile="integration", workdir=logdir / "cp")
    cp.start()
    processes = system.Processes()
    try:
        system.install_crds(cp)
        config = logdir / "config.yaml"
        config.write_text(CONFIG)
        webhook, port = system.start_webhook(cp, logdir=logdir)
        processes.components.append(webhook)
        processes.webhook_port = port
        system.install_policies(cp)
        processes.components.append(
            system.start_reconciler(cp, logdir=logdir, extra_args=[f"--config={config}"])
        )
        yield cp
        processes.check()
    finally:
        processes.stop()
        log = Path(logdir / "reconciler.log")
        if log.exists():
            print(
                "--- reconciler (no pods) ---\n"
                + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
            )
        cp.stop()


async def test_an_admitted_job_without_pods_is_requeued_within_the_bound_and_frees_its_queue(
    cluster: LocalCluster,
) -> None:
    kube.kubectl(cluster, "create", "namespace", NAMESPACE)
    quota = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": NAMESPACE,
            "namespace": NAMESPACE,
            "annotations": {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"},
        },
        "spec": {"max": {"cpu": "1"}, "min": {"cpu": "1"}},
    }
    kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(quota))

    async def created(name: str) -> bool:
        out = kube.kubectl(cluster, "create", "-f", "-", input_text=json.dumps(job(name)), check=False)
        return out.returncode == 0 or "AlreadyExists" in out.stderr

    await kube.eventually(lambda: created("lost"), timeout=60, what="lost created (its queue exists)")

    async def lost_admitted() -> bool:
        return admitted_and_resumed(cluster, "lost")

    await kube.eventually(lost_admitted, timeout=60, what="lost admitted and resumed")
    admitted_at = time.monotonic()
    await kube.eventually(lambda: created("next"), what="next created")

    # lost has no pod (no Job controller here): within the bound it is held and its quota freed.
    async def lost_requeued() -> Obj | None:
        status = status_of(cluster, "lost")
        return status if status.get("message") == names.Message.BACKOFF_NO_PODS else None

    status = await kube.eventually(
        lost_requeued, timeout=TIMEOUT + 15, what="lost requeued for having no pods"
    )
    assert time.monotonic() - admitted_at < TIMEOUT + 15
    assert status["phase"] in ("TimeoutBackoff", "Enqueued")
    assert not status.get("admissions")
    assert get(cluster, "job", "lost")["spec"]["suspend"] is True

    async def warned() -> bool:
        for kind in ("Job", "QueueUnit"):
            reasons = [e["reason"] for e in kube.events_of(cluster, NAMESPACE, "lost", kind=kind)]
            if names.NO_PODS_AFTER_ADMISSION_REASON not in reasons:
                return False
        return True

    await kube.eventually(warned, what="NoPodsAfterAdmission on lost and its unit")

    # The freed quota goes to next, which the held queue had kept waiting.
    async def next_admitted() -> bool:
        return admitted_and_resumed(cluster, "next")

    await kube.eventually(next_admitted, timeout=30, what="next admitted in the freed quota")

    # next has no pod either and is requeued in turn; lost comes back, admitted and resumed again.
    await kube.eventually(lost_admitted, timeout=60, what="lost admitted and resumed again")


REPLACED = "no-pods-replaced"
JOBS = kq.Resource("batch", "v1", "jobs", "Job")
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


def requeued_for_no_pods(unit: Obj) -> bool:
    return (unit.get("status") or {}).get("message") == names.Message.BACKOFF_NO_PODS


async def test_a_job_whose_pods_name_no_unit_is_not_podless_and_its_requeue_holds_it_before_freeing(
    cluster: LocalCluster,
) -> None:
    """The two causes of the full chaos run of 2026-12-04 (RELIABILITY.md), on the real apiserver:
    every pod the Job controls stops the clock, whether or not it names the unit (here the test plays
    the Job controller with a pod that names none), and when the Job does lose its pods, the recorded
    history shows it suspended before its unit gives the admission back, and never resumed until the
    unit is admitted again (docs/compatibility.md#jobs-without-pods)."""
    kube.kubectl(cluster, "create", "namespace", REPLACED)
    quota = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": REPLACED, "namespace": REPLACED},
        "spec": {"max": {"cpu": "1"}, "min": {"cpu": "1"}},
    }
    kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(quota))
    body = job("replaced")
    body["metadata"]["namespace"] = REPLACED
    body["metadata"]["labels"] = {names.QUOTA_NAME_LABEL: REPLACED}
    api = await kq.Kube.connect(kubeconfig=str(cluster.kubeconfig))
    try:
        async with (
            kube.Recorder(cluster, JOBS, namespace=REPLACED) as jobs,
            kube.Recorder(cluster, UNITS, namespace=REPLACED) as units,
        ):

            async def created() -> Obj | None:
                try:
                    made: Obj = await api.create(JOBS, body, namespace=REPLACED)
                    return made
                except kq.KubeError:
                    return None  # its queue may not exist yet

            made = await kube.eventually(created, timeout=60, what="replaced created")
            uid = made["metadata"]["uid"]
            # The Job's controller made a pod that names no unit: the clock must count it all the same.
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "replaced", "uid": uid}
            owner["controller"] = True
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "replaced-own", "ownerReferences": [owner]},
                "spec": {
                    "schedulingGates": [{"name": names.ADMISSION_GATE}],
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            }
            await api.create(kq.PODS, pod, namespace=REPLACED)
            await jobs.until(
                "replaced", lambda j: j["spec"].get("suspend") is False, what="resumed", timeout=60
            )
            # Three times the bound with its pod in place: the unit is never requeued (the record is what
            # is waited on; it must not hold a requeue by the deadline).
            with pytest.raises(AssertionError, match="timed out"):
                await units.until(
                    "replaced", requeued_for_no_pods, what="a no-pods requeue", timeout=3 * TIMEOUT
                )
            # Its pod gone for good (its controller lost the Job): requeued within the bound.
            await api.delete(kq.PODS, "replaced-own", namespace=REPLACED)
            requeue = await units.until(
                "replaced", requeued_for_no_pods, what="a no-pods requeue", timeout=TIMEOUT + 15
            )
            assert not (requeue.get("status") or {}).get("admissions")
            # Backed off for 3 s, admitted again and resumed.
            await units.until(
                "replaced",
                lambda u: (
                    int(u["metadata"]["resourceVersion"]) > int(requeue["metadata"]["resourceVersion"])
                    and bool((u.get("status") or {}).get("admissions"))
                ),
                what="admitted again",
                timeout=60,
            )
            await jobs.until(
                "replaced",
                lambda j: (
                    int(j["metadata"]["resourceVersion"]) > int(requeue["metadata"]["resourceVersion"])
                    and j["spec"].get("suspend") is False
                ),
                what="resumed again",
                timeout=60,
            )
    finally:
        await api.close()
    # One history in etcd order (both records are complete: leaving the block synced them). Between
    # the requeue and the next admission the Job stays suspended, and it was suspended before it.
    merged = sorted(
        [("job", o) for o in jobs.versions("replaced")] + [("unit", o) for o in units.versions("replaced")],
        key=lambda e: int(e[1]["metadata"]["resourceVersion"]),
    )
    suspended, unit_holds = False, True
    for kind, obj in merged:
        if kind == "job":
            suspended = obj["spec"].get("suspend") is True
        else:
            unit_holds = bool((obj.get("status") or {}).get("admissions"))
        assert suspended or unit_holds, f"the Job ran while its unit held nothing at {obj['metadata']}"
