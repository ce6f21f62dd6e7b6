"""Jobs, their pods and their QueueUnits end to end: gating, reporting, finishing and deletion.

Real controller-manager (Job controller, garbage collector), scheduler and kwok fake nodes with the
webhook and the reconciler running (``system_e2e``). Jobs are submitted with plain kubectl, with
the quota label and no suspend field (the webhook holds them).

* Admission is per unit: a Job whose whole demand does not fit is not admitted at all (no pod is
  ever created for it), while a smaller one in the same quota runs.
* S26-style gating with a real Job: only ``admissions[i].replicas`` pods are ungated; pods beyond
  that (the Job scaled up after admission) keep the gate ``koord-queue/admission``.
* ``podState`` and ``admissions[].running`` report bound pods while they run; a finished Job's unit
  goes Succeed with ``admissions: []`` and its quota admits the next job.
* Deleting a Job deletes its QueueUnit (owner reference + garbage collection) and frees its quota.

Pods finish after ``KWOK_POD_DURATION`` (3s) unless the template sets the kwok annotation
``pod-complete.stage.kwok.x-k8s.io/delay``, used here to keep pods running while they are observed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s

from shared import kube as kq
from shared import names
from shared.names import Message
from testenv import system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
QUEUE_UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")


def quota(name: str, cpu: str) -> Obj:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name},
        "spec": {"min": {"cpu": cpu, "memory": "64Gi"}, "max": {"cpu": cpu, "memory": "64Gi"}},
    }


def job(
    name: str,
    quota_name: str,
    *,
    parallelism: int,
    completions: int | None = None,
    run_for: str | None = None,
) -> Obj:
    """A batch Job of ``parallelism`` pods asking for 1 CPU each; ``run_for`` keeps each pod running."""
    template: Obj = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:stable",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
                }
            ],
        }
    }
    if run_for is not None:
        template["metadata"] = {"annotations": {COMPLETE_DELAY_ANNOTATION: run_for}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota_name}},
        "spec": {
            "parallelism": parallelism,
            "completions": completions if completions is not None else parallelism,
            "template": template,
        },
    }


def status(obj: Mapping[str, Any]) -> Obj:
    return dict(obj.get("status") or {})


def phase(unit: Mapping[str, Any]) -> str:
    return str(status(unit).get("phase", ""))


def gated(pod: Any) -> bool:
    return any(g.name == names.ADMISSION_GATE for g in pod.spec.scheduling_gates or [])


class Env:
    """An API client bound to the test namespace."""

    def __init__(self, api: k8s.ApiClient, cluster: LocalCluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.objects = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self.batch = k8s.BatchV1Api(api)

    def name(self, suffix: str) -> str:
        """A cluster-wide unique quota name (quotas are keyed by name)."""
        return f"{self.ns}-{suffix}"

    def kubectl(self, *args: str, input_text: str | None = None) -> Any:
        return kube.kubectl(self.cluster, *args, input_text=input_text)

    async def create_quota(self, name: str, cpu: str) -> None:
        await self.objects.create_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, self.ns, names.QUOTA_PLURAL, quota(name, cpu)
        )

        async def queue() -> bool:
            try:
                await self.objects.get_namespaced_custom_object(
                    names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, name
                )
            except k8s.ApiException:
                return False
            return True

        await kube.eventually(queue, what=f"Queue {name} created from its quota")

    async def resize_quota(self, name: str, cpu: str) -> None:
        body = {"spec": quota(name, cpu)["spec"]}
        await self.objects.patch_namespaced_custom_object(
            names.QUOTA_GROUP,
            names.QUOTA_VERSION,
            self.ns,
            names.QUOTA_PLURAL,
            name,
            body,
            _content_type=MERGE,
        )

    def submit(self, obj: Obj) -> None:
        self.kubectl("apply", "-n", self.ns, "-f", "-", input_text=yaml.safe_dump(obj))

    async def get_job(self, name: str) -> Obj:
        got: Obj = await self.objects.get_namespaced_custom_object("batch", "v1", self.ns, "jobs", name)
        return got

    async def wait_job(self, name: str, probe: Callable[[Obj], bool], *, what: str) -> Obj:
        async def check() -> Obj | None:
            got = await self.get_job(name)
            return got if probe(got) else None

        return await kube.eventually(check, what=f"Job {self.ns}/{name}: {what}")

    async def get_unit(self, name: str) -> Obj | None:
        try:
            got: Obj = await self.objects.get_namespaced_custom_object(
                names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, name
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        return got

    async def wait_unit(
        self, name: str, probe: Callable[[Obj], bool], *, what: str, timeout: float = 30.0
    ) -> Obj:
        async def check() -> Obj | None:
            got = await self.get_unit(name)
            assert got is not None, "no such QueueUnit"
            if not probe(got):
                # A batch Job's unit has the Job's name: show its pods too, so a timeout says why.
                pods = [
                    (p.metadata.name, p.spec.node_name, gated(p), p.status.phase)
                    for p in await self.pods(name)
                ]
                raise AssertionError(f"status: {got.get('status')}; pods (name, node, gated, phase): {pods}")
            return got

        return await kube.eventually(check, timeout=timeout, what=f"QueueUnit {self.ns}/{name}: {what}")

    async def pods(self, job_name: str) -> list[Any]:
        found = await self.core.list_namespaced_pod(
            self.ns, label_selector=f"batch.kubernetes.io/job-name={job_name}"
        )
        return list(found.items)

    async def live_pods(self, job_name: str) -> list[Any]:
        return [
            p
            for p in await self.pods(job_name)
            if p.status.phase not in ("Succeeded", "Failed") and p.metadata.deletion_timestamp is None
        ]


@pytest.fixture
async def env(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> AsyncIterator[Env]:
    async with kube.client(e2e_cluster) as api:
        yield Env(api, e2e_cluster, namespace_in)


async def test_a_job_larger_than_its_quota_is_never_partly_admitted_while_a_smaller_one_runs(
    env: Env,
) -> None:
    q = env.name("two")
    await env.create_quota(q, "2")
    async with kube.Recorder(env.cluster, QUEUE_UNITS, namespace=env.ns) as units:
        env.submit(job("big", q, parallelism=3))
        parked = await env.wait_unit(
            "big", lambda u: Message.limited(q, "cpu") in str(status(u).get("message")), what="parked on cpu"
        )
        assert not status(parked).get("admissions")

        env.submit(job("small", q, parallelism=2))
        await env.wait_unit(
            "small", lambda u: phase(u) == "Succeed", what="small ran and finished", timeout=60
        )
        assert (await env.get_job("small"))["status"].get("succeeded") == 2

        # The finished job's 2 CPU went back; big still does not fit and was never partly run.
        big_unit = await env.get_unit("big")
        assert big_unit is not None
        assert phase(big_unit) in ("", "Enqueued"), status(big_unit)
        assert not status(big_unit).get("admissions")
        assert (await env.get_job("big"))["spec"]["suspend"] is True
        assert await env.pods("big") == []

        await env.resize_quota(q, "3")
        done = await env.wait_unit(
            "big", lambda u: phase(u) == "Succeed", what="big admitted whole", timeout=60
        )
        assert status(done)["admissions"] == []
        assert (await env.get_job("big"))["status"].get("succeeded") == 3
    granted = [
        [(a["name"], a["replicas"]) for a in status(v).get("admissions") or []] for v in units.versions("big")
    ]
    assert all(g in ([], [("big", 3)]) for g in granted), granted


async def test_s26_only_the_admitted_number_of_pods_is_ungated(env: Env) -> None:
    q = env.name("gate")
    await env.create_quota(q, "2")
    env.submit(job("scaled", q, parallelism=2, completions=5, run_for="60s"))
    await env.wait_unit(
        "scaled",
        lambda u: status(u).get("admissions") == [{"name": "scaled", "replicas": 2, "running": 2}],
        what="2 replicas admitted and running",
        timeout=60,
    )

    # Scale the admitted Job to 5: the Job controller creates 3 more pods from the gated template,
    # and the unit's pod set follows, but only the 2 admitted replicas may be scheduled.
    env.kubectl("patch", "-n", env.ns, "job", "scaled", "--type=merge", "-p", '{"spec":{"parallelism":5}}')
    unit = await env.wait_unit(
        "scaled",
        lambda u: (
            [p["count"] for p in u["spec"]["podSet"]] == [5]
            and status(u).get("podState") == {"running": 2, "pending": 3}
        ),
        what="pod set count 5, podState 2 running + 3 pending",
    )
    assert [(a["name"], a["replicas"]) for a in status(unit)["admissions"]] == [("scaled", 2)]
    pods = await env.live_pods("scaled")
    assert len(pods) == 5
    assert sorted(gated(p) for p in pods) == [False, False, True, True, True], [
        (p.metadata.name, p.spec.node_name, p.spec.scheduling_gates) for p in pods
    ]
    assert all(p.spec.node_name for p in pods if not gated(p))
    assert not any(p.spec.node_name for p in pods if gated(p))


async def test_running_pods_are_reported_and_a_finished_job_releases_its_quota(env: Env) -> None:
    q = env.name("five")
    await env.create_quota(q, "5")
    async with kube.Recorder(env.cluster, QUEUE_UNITS, namespace=env.ns) as units:
        env.submit(job("first", q, parallelism=5, run_for="20s"))
        await env.wait_unit("first", lambda u: phase(u) == "Running", what="Running", timeout=60)
        pods = await env.live_pods("first")
        assert len(pods) == 5 and not any(gated(p) for p in pods)

        env.submit(job("second", q, parallelism=1))
        await env.wait_unit(
            "second",
            lambda u: Message.limited(q, "cpu") in str(status(u).get("message")),
            what="second parked",
        )
        assert (await env.get_job("second"))["spec"]["suspend"] is True

        finished = await env.wait_unit(
            "first", lambda u: phase(u) == "Succeed", what="first Succeed", timeout=60
        )
    assert status(finished)["admissions"] == []
    assert status(finished)["message"] == Message.SUCCEEDED
    # While the pods ran, every one of them was reported (a watch sees every version; a poll may not).
    history = [
        (phase(v), status(v).get("podState"), status(v).get("admissions")) for v in units.versions("first")
    ]
    assert (
        "Running",
        {"running": 5, "pending": 0},
        [{"name": "first", "replicas": 5, "running": 5}],
    ) in history, history

    await env.wait_unit(
        "second", lambda u: phase(u) in ("Dequeued", "Running", "Succeed"), what="second admitted"
    )
    second = await env.wait_job("second", lambda j: j["spec"]["suspend"] is False, what="second resumed")
    assert second["metadata"]["annotations"].get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)


async def test_deleting_a_job_deletes_its_unit_and_frees_its_quota(env: Env) -> None:
    q = env.name("one")
    await env.create_quota(q, "1")
    env.submit(job("holder", q, parallelism=1, run_for="600s"))
    holder = await env.wait_unit("holder", lambda u: phase(u) == "Running", what="holder Running", timeout=60)
    assert holder["metadata"]["ownerReferences"][0]["uid"] == (await env.get_job("holder"))["metadata"]["uid"]
    env.submit(job("waiter", q, parallelism=1))
    await env.wait_unit(
        "waiter", lambda u: Message.limited(q, "cpu") in str(status(u).get("message")), what="waiter parked"
    )

    env.kubectl("delete", "-n", env.ns, "job", "holder", "--wait=false")

    async def unit_gone() -> bool:
        return await env.get_unit("holder") is None

    await kube.eventually(unit_gone, what="holder's QueueUnit garbage-collected")
    await env.wait_unit(
        "waiter", lambda u: phase(u) in ("Dequeued", "Running", "Succeed"), what="waiter admitted"
    )
    await env.wait_job("waiter", lambda j: j["spec"]["suspend"] is False, what="waiter resumed")


async def test_a_job_created_with_generate_name_is_admitted_and_its_pods_run(env: Env) -> None:
    """Under ``generateName`` the webhook cannot know the job's name, so its pod template carries
    the gate but no related-QueueUnit annotation; the pods must still be found and ungated."""
    q = env.name("gen")
    await env.create_quota(q, "2")
    obj = job("ignored", q, parallelism=2)
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "gen-"
    out = env.kubectl("create", "-n", env.ns, "-f", "-", "-o", "name", input_text=yaml.safe_dump(obj))
    name = out.stdout.strip().split("/")[-1]
    await env.wait_unit(name, lambda u: phase(u) in ("Dequeued", "Running", "Succeed"), what="admitted")
    await env.wait_job(
        name,
        lambda j: (j.get("status") or {}).get("succeeded") == 2,
        what="both pods ungated, run and succeed",
    )
    await env.wait_unit(name, lambda u: phase(u) == "Succeed", what="Succeed")
