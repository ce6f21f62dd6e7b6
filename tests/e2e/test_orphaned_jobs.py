"""A Job deleted with ``kubectl delete --cascade=orphan`` gives its quota back.

Orphan deletion makes the garbage collector remove the Job's owner reference from its dependents
instead of deleting them: the QueueUnit stays (admitted, holding quota) and so do the pods, which
keep running on their nodes. The job extension notices a unit whose job is gone and releases it by
deleting it once none of its pods runs any more: while an orphaned pod still runs it uses the
quota, so the unit keeps it charged. A new Job of the same name gets a unit of its own, owned by
it, instead of inheriting the admission of its predecessor.

The pods that hold an orphaned unit are the ones naming it (``koord-queue/related-queueunit``,
which nobody can change on a pod that exists), whatever owner they get later: the hostile-tenant
tests below play ``alice``, bound to the built-in ``edit`` role in her namespace
(``tests/tenancy.py``), who orphans her admitted Job and then has its still-running pod adopted by a
ReplicaSet, or claims it for a new Job of the same name by writing a controller reference to it.
Neither frees the quota while the pod runs (docs/compatibility.md#jobs-deleted-with---cascadeorphan).

Real controller-manager (garbage collector, Job controller), scheduler and kwok (pods that no Job
owns run until deleted), with the webhook and the reconciler running (``system_e2e``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.e2e.test_job_pods import job, room
from tests.scenario import Scenario, phase, status

pytestmark = pytest.mark.e2e

#: A pod set as small as the QueueUnit schema allows.
POD_SET = [
    {"name": "main", "count": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
]

ADMITTED = ("Dequeued", "Running", "Succeed")


@pytest.fixture
async def env(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with kube.client(e2e_cluster) as api:
        yield Scenario(api, e2e_cluster, namespace_in, explain_with_pods=True)


async def garbage_collector_follows_queueunits(env: Scenario) -> None:
    """Wait until the garbage collector watches QueueUnits: it discovers a new CRD on its next
    resync (up to 30 s), and until then it cannot orphan a unit (the owner reference would stay,
    and the unit be deleted later as a dependent of a missing owner). The probe is a unit whose
    owner does not exist; the collector deletes it once it watches the resource."""
    probe = {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": "gc-probe",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "gc-probe", "uid": str(uuid.uuid4())}
            ],
        },
        "spec": {
            "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": "gc-probe"},
            "resource": {"cpu": "1"},
            "podSet": POD_SET,
        },
    }
    await env.objects.create_namespaced_custom_object(
        names.GROUP, names.VERSION, env.ns, names.QUEUEUNIT_PLURAL, probe
    )

    async def collected() -> bool:
        return await env.find_unit("gc-probe") is None

    await kube.eventually(
        collected, timeout=90, interval=0.5, what="the garbage collector watching QueueUnits"
    )


async def orphan(env: Scenario, name: str) -> str:
    """Delete the Job ``name`` with ``--cascade=orphan``; the name of its (still running) pod."""
    [pod] = await env.live_pods(name)
    env.kubectl("delete", "-n", env.ns, "job", name, "--cascade=orphan")

    async def owner_gone() -> bool:
        unit = await env.find_unit(name)
        return unit is not None and not unit["metadata"].get("ownerReferences")

    await kube.eventually(owner_gone, what=f"the garbage collector orphaning {name}'s unit")
    return str(pod.metadata.name)


async def test_an_orphaned_unit_releases_its_quota_once_its_pods_are_gone(env: Scenario) -> None:
    await garbage_collector_follows_queueunits(env)
    q = env.name("orphan")
    await env.add_quota(q, room("1"))
    env.apply(job("orphaned", q, parallelism=1, run_for="600s"))
    await env.wait_unit("orphaned", lambda u: phase(u) == "Running", what="Running", timeout=60)
    pod = await orphan(env, "orphaned")

    env.apply(job("next", q, parallelism=1))
    # The orphaned pod still runs on its node: its unit keeps the quota charged meanwhile.
    await env.wait_unit(
        "next", lambda u: Message.limited(q, "cpu") in str(status(u).get("message")), what="next parked"
    )
    held = await env.find_unit("orphaned")
    assert held is not None and phase(held) == "Running", held

    env.kubectl("delete", "-n", env.ns, "pod", pod, "--wait=false")

    async def released() -> bool:
        return await env.find_unit("orphaned") is None

    await kube.eventually(released, timeout=30, what="the orphaned unit released (deleted)")
    await env.wait_unit("next", lambda u: phase(u) in ADMITTED, what="next admitted", timeout=30)
    await env.wait_job("next", lambda j: j["spec"]["suspend"] is False, what="next resumed")


async def test_a_new_job_of_the_same_name_gets_its_own_unit(env: Scenario) -> None:
    await garbage_collector_follows_queueunits(env)
    q = env.name("again")
    await env.add_quota(q, room("1"))
    env.apply(job("again", q, parallelism=1, run_for="600s"))
    await env.wait_unit("again", lambda u: phase(u) == "Running", what="Running", timeout=60)
    pod = await orphan(env, "again")
    env.kubectl("delete", "-n", env.ns, "pod", pod, "--wait=false")

    env.apply(job("again", q, parallelism=1))
    uid = (await env.get_job("again"))["metadata"]["uid"]
    await env.wait_unit(
        "again",
        lambda u: [r.get("uid") for r in u["metadata"].get("ownerReferences") or []] == [uid],
        what="a unit owned by the new job",
        timeout=30,
    )

    async def succeeded() -> bool:
        return ((await env.get_job("again")).get("status") or {}).get("succeeded") == 1

    await kube.eventually(succeeded, timeout=60, what="the new job admitted and run to the end")


ALICE = tenancy.ALICE


def alice(env: Scenario, *args: str, body: Any = None) -> str:
    """kubectl as alice (``edit`` in the test's namespace); fails the test on a refusal."""
    text = yaml.safe_dump(body) if body is not None else None
    done = tenancy.as_user(env.cluster, ALICE, "-n", env.ns, *args, input_text=text)
    assert done.returncode == 0, done.stderr
    return str(done.stdout)


async def alice_orphans(env: Scenario, name: str, q: str) -> tuple[str, str]:
    """alice runs the Job ``name`` until its unit is Running, then deletes it with
    ``--cascade=orphan``: the pod's name and the unit's UID, once the garbage collector let go."""
    tenancy.grant(env.cluster, env.ns, ALICE)
    alice(env, "create", "-f", "-", body=job(name, q, parallelism=1, run_for="600s"))
    unit = await env.wait_unit(name, lambda u: phase(u) == "Running", what="Running", timeout=60)
    [pod] = await env.live_pods(name)
    alice(env, "delete", "job", name, "--cascade=orphan", "--wait=false")

    async def owner_gone() -> bool:
        found = await env.find_unit(name)
        return found is not None and not found["metadata"].get("ownerReferences")

    await kube.eventually(owner_gone, what=f"the garbage collector orphaning {name}'s unit")

    # The unit lets go first; the Job itself is gone only once the garbage collector has also taken
    # its orphan finalizer off. A test that re-creates the name waits for that, not for the unit.
    async def job_gone() -> bool:
        try:
            await env.get_job(name)
        except k8s.ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    await kube.eventually(job_gone, what=f"the garbage collector deleting the Job {name}")
    return str(pod.metadata.name), str(unit["metadata"]["uid"])


def pod_json(env: Scenario, name: str) -> dict[str, Any]:
    out = env.kubectl("get", "pod", "-n", env.ns, name, "-o", "json")
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def controller_kind(pod: dict[str, Any]) -> str | None:
    refs = pod["metadata"].get("ownerReferences") or []
    return next((str(r.get("kind")) for r in refs if r.get("controller")), None)


async def test_a_pod_adopted_by_a_replicaset_keeps_its_orphaned_unit_charged(env: Scenario) -> None:
    await garbage_collector_follows_queueunits(env)
    q = env.name("adopted")
    await env.add_quota(q, room("1"))
    pod, _ = await alice_orphans(env, "orphaned", q)
    labels = pod_json(env, pod)["metadata"]["labels"]
    selector = {"batch.kubernetes.io/controller-uid": labels["batch.kubernetes.io/controller-uid"]}
    replica_set = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "adopter"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    alice(env, "create", "-f", "-", body=replica_set)

    async def adopted() -> bool:
        return controller_kind(pod_json(env, pod)) == "ReplicaSet"

    await kube.eventually(adopted, what="the ReplicaSet adopting the orphaned pod")
    # A pod of another owner is still the orphaned unit's: it runs on the quota, so the unit
    # stays and a newcomer waits.
    alice(env, "create", "-f", "-", body=job("next", q, parallelism=1))
    await env.wait_unit(
        "next", lambda u: Message.limited(q, "cpu") in str(status(u).get("message")), what="next parked"
    )
    held = await env.find_unit("orphaned")
    assert held is not None and phase(held) == "Running", held

    alice(env, "scale", "replicaset", "adopter", "--replicas=0")

    async def released() -> bool:
        return await env.find_unit("orphaned") is None

    await kube.eventually(released, timeout=60, what="the orphaned unit released once its pod is gone")
    await env.wait_unit("next", lambda u: phase(u) in ADMITTED, what="next admitted", timeout=30)


async def test_a_new_job_of_the_same_name_cannot_claim_the_orphaned_pods(env: Scenario) -> None:
    await garbage_collector_follows_queueunits(env)
    q = env.name("claim")
    await env.add_quota(q, room("1"))
    pod, old_unit = await alice_orphans(env, "again", q)
    alice(env, "create", "-f", "-", body=job("again", q, parallelism=1))
    new_uid = (await env.get_job("again"))["metadata"]["uid"]
    claim = {
        "metadata": {
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "again", "uid": new_uid, "controller": True}
            ]
        }
    }
    alice(env, "patch", "pod", pod, "--type=merge", "-p", json.dumps(claim))

    # The Job controller lets go of a pod its selector does not match (the old controller-uid
    # label): once it has, the reconciler has long seen the claim, and the orphaned unit must
    # still be the one charged for the running pod.
    async def let_go() -> bool:
        return controller_kind(pod_json(env, pod)) is None

    await kube.eventually(let_go, timeout=30, what="the Job controller letting go of the claimed pod")
    held = await env.find_unit("again")
    assert held is not None and held["metadata"]["uid"] == old_unit and phase(held) == "Running", held

    env.kubectl("delete", "-n", env.ns, "pod", pod, "--wait=false")
    await env.wait_unit(
        "again",
        lambda u: [r.get("uid") for r in u["metadata"].get("ownerReferences") or []] == [new_uid],
        what="a unit owned by the new job once the orphaned pod is gone",
        timeout=60,
    )
