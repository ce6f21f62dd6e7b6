"""A released pod stays tied to its job's admission: its links cannot be cut, it cannot grow in
place, and a pod that leaves its job anyway is deleted (docs/architecture.md#trust-boundaries).

``alice`` holds only a namespace user's rights (``tests/tenancy.py``); the attacks go through the
real kube-apiserver with the admission policies, the webhook and the reconciler running. There is
no Job controller in this tier: the test creates the job's pods as it would (owned, from the
gated template) and, where the Job controller would let go of a relabelled pod, removes the owner
reference itself (the e2e tier has the real Job controller do it:
``tests/e2e/test_tenant_pods.py``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from testenv import scraping, system
from tests import kube
from tests.integration.test_tenant_hold import ALICE, ROOM, alice, batch_job, owned_pod
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

POLICY = "koord-queue-pod-links"


@pytest.fixture
def env(alice_in: Scenario) -> Scenario:
    return alice_in


def get_pod(env: Scenario, name: str) -> dict[str, Any] | None:
    found = kube.kubectl(env.cluster, "get", "pod", "-n", env.ns, name, "--ignore-not-found", "-o", "json")
    return json.loads(found.stdout) if found.stdout.strip() else None


def create_pod(env: Scenario, pod: dict[str, Any]) -> None:
    kube.kubectl(env.cluster, "create", "-n", env.ns, "-f", "-", input_text=yaml.safe_dump(pod))


async def admitted_with_released_pod(env: Scenario, name: str = "admitted") -> tuple[dict[str, Any], str]:
    """A one-pod Job alice submitted into a quota with room: admitted, resumed, and its pod (made
    as the Job controller would, gated) released by the reconciler."""
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    job = batch_job(name, quota)
    code, out = alice(env, "create", "-f", "-", obj=job)
    assert code == 0, out
    env.remember(job)
    stored = await env.wait_job(job, lambda j: j["spec"].get("suspend") is False, what="job resumed")
    pod = f"{name}-pod"
    create_pod(env, owned_pod(pod, stored, gate=True))

    async def released() -> bool:
        found = get_pod(env, pod)
        return found is not None and not found["spec"].get("schedulingGates")

    await kube.eventually(released, what=f"pod {pod} released by the reconciler")
    return stored, pod


async def test_a_released_pods_unit_annotations_cannot_be_changed_or_removed(env: Scenario) -> None:
    job, pod = await admitted_with_released_pod(env)
    links = {
        k: job["spec"]["template"]["metadata"]["annotations"][k]
        for k in (names.RELATED_QUEUEUNIT_ANNOTATION, names.RELATED_PODSET_ANNOTATION)
    }
    assert links[names.RELATED_QUEUEUNIT_ANNOTATION] == f"{env.ns}/admitted"
    for attack in (
        [f"{names.RELATED_QUEUEUNIT_ANNOTATION}-"],
        ["--overwrite", f"{names.RELATED_QUEUEUNIT_ANNOTATION}={env.ns}/someone-else"],
        [f"{names.RELATED_PODSET_ANNOTATION}-"],
        ["--overwrite", f"{names.RELATED_PODSET_ANNOTATION}=other"],
    ):
        code, out = alice(env, "annotate", "pod", pod, *attack)
        assert code != 0 and POLICY in out and "cannot be changed or removed" in out, (attack, out)
    # The same through a plain update of the whole object.
    stored = get_pod(env, pod)
    assert stored is not None
    del stored["metadata"]["annotations"][names.RELATED_QUEUEUNIT_ANNOTATION]
    code, out = alice(env, "replace", "-f", "-", obj=stored)
    assert code != 0 and POLICY in out, out

    after = get_pod(env, pod)
    assert after is not None
    assert {k: after["metadata"]["annotations"].get(k) for k in links} == links
    # Her own annotations are hers to change.
    code, out = alice(env, "annotate", "pod", pod, "example.com/note=mine")
    assert code == 0, out


async def test_a_released_pod_may_shrink_in_place_but_not_grow(env: Scenario) -> None:
    _, pod = await admitted_with_released_pod(env)
    # An admin granted alice in-place resize (the built-in edit role does not include it).
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "alice-resize", "namespace": env.ns},
        "rules": [{"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["get", "patch", "update"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "alice-resize", "namespace": env.ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "alice-resize"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ALICE}],
    }
    kube.kubectl(env.cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all([role, binding]))

    def resize(cpu: str) -> tuple[int, str]:
        body = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}}
        return alice(
            env, "patch", "pod", pod, "--subresource=resize", "--type=strategic", "-p", json.dumps(body)
        )

    async def resize_allowed_by_rbac() -> bool:
        code, out = resize("2")
        assert code != 0, f"alice grew an admitted pod in place: {out}"
        return "forbidden: User" not in out  # the RoleBinding has reached the authorizer cache

    await kube.eventually(resize_allowed_by_rbac, what="alice's resize right in effect")
    code, out = resize("2")
    assert code != 0 and POLICY in out and "may shrink in place but not grow" in out, out
    stored = get_pod(env, pod)
    assert stored is not None
    assert stored["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"

    code, out = resize("500m")
    assert code == 0, out
    stored = get_pod(env, pod)
    assert stored is not None
    assert stored["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"
    # Back to the admitted size is growth from where it stands now: refused too.
    code, out = resize("1")
    assert code != 0 and POLICY in out, out


async def test_a_released_pod_that_leaves_its_job_is_deleted(
    env: Scenario, system_integration: system.Processes
) -> None:
    metrics_port = next(c.ports["metrics"] for c in system_integration.components if c.name == "reconciler")
    escaped_total = ("koord_queue_unqueued_pods_deleted_total", {"reason": "escaped"})
    before = env.metric(metrics_port, *escaped_total)
    job, pod = await admitted_with_released_pod(env)
    # A gated pod naming the unit that the job does not own stays: it never runs.
    stray_gated = owned_pod("stray-gated", job, gate=True)
    stray_gated["metadata"]["ownerReferences"] = []
    code, out = alice(env, "create", "-f", "-", obj=stray_gated)
    assert code == 0, out
    # alice's own pod naming no unit is none of the queue's business.
    own = owned_pod("own", job, gate=False)
    own["metadata"]["ownerReferences"] = []
    own["metadata"]["annotations"] = {}
    code, out = alice(env, "create", "-f", "-", obj=own)
    assert code == 0, out

    # What the Job controller does when alice changes a label it selects pods by: it lets go.
    kube.kubectl(
        env.cluster,
        "patch",
        "pod",
        pod,
        "-n",
        env.ns,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/ownerReferences"}]',
    )

    async def deleted() -> bool:
        return get_pod(env, pod) is None

    await kube.eventually(deleted, what=f"the escaped pod {pod} deleted")
    event = await env.wait_event(
        "admitted", names.EventReason.ESCAPED_POD_DELETED, kind="Job", type_="Warning"
    )
    assert pod in event.message, event.message

    # A bare pod that claims the unit out of the gate (alice cannot create one: see below; the
    # admin stands for a way past the door) goes the same way.
    bare = owned_pod("bare", job, gate=False)
    bare["metadata"]["ownerReferences"] = []
    create_pod(env, bare)

    async def bare_deleted() -> bool:
        return get_pod(env, "bare") is None

    await kube.eventually(bare_deleted, what="a bare pod naming the unit deleted")
    assert get_pod(env, "stray-gated") is not None
    assert get_pod(env, "own") is not None

    # The counter goes up after the delete call returns: wait on it, not on the pods' absence.
    async def counted() -> bool:
        return env.metric(metrics_port, *escaped_total) >= before + 2  # the pod let go of, and the bare one

    await kube.eventually(counted, what="both escaped pods counted")
    unit = await env.get_unit("admitted")
    assert [a.get("replicas") for a in unit["status"]["admissions"]] == [1], unit["status"]


async def test_a_pod_naming_a_unit_is_born_behind_the_gate(env: Scenario) -> None:
    """Created by alice already released (or bound to a node) and owned by her admitted job, a pod
    would run beside the ones the admission counts; the door refuses it. Born gated, as the job's
    controller makes it, it is accepted and waits for the reconciler like any other."""
    job, _ = await admitted_with_released_pod(env)
    for name, node in (("released", None), ("bound", "node-x")):
        code, out = alice(env, "create", "-f", "-", obj=owned_pod(name, job, gate=False, node=node))
        assert code != 0 and "koord-queue-pod-birth" in out and names.ADMISSION_GATE in out, out
        assert get_pod(env, name) is None
    code, out = alice(env, "create", "-f", "-", obj=owned_pod("gated", job, gate=True))
    assert code == 0, out
    stored = get_pod(env, "gated")
    assert stored is not None and stored["spec"]["schedulingGates"] == [{"name": names.ADMISSION_GATE}]


async def admitted_without_pods(env: Scenario, name: str) -> dict[str, Any]:
    """A one-pod Job alice submitted into a quota with room, admitted and resumed; no pod made yet
    (there is no Job controller in this tier)."""
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    job = batch_job(name, quota)
    code, out = alice(env, "create", "-f", "-", obj=job)
    assert code == 0, out
    env.remember(job)
    return await env.wait_job(job, lambda j: j["spec"].get("suspend") is False, what="job resumed")


async def kept_gated_because(env: Scenario, job: str, pod: str) -> str:
    """The message of the ``PodKeptGated`` event about ``pod`` on the job, once recorded."""

    async def probe() -> str | None:
        for event in await env.events(job, kind="Job"):
            if event.reason == names.EventReason.POD_KEPT_GATED and f"pod {pod} " in event.message:
                assert event.type == "Warning", event
                return str(event.message)
        return None

    found: str = await kube.eventually(probe, what=f"PodKeptGated about {pod}")
    return found


async def test_only_a_pod_the_job_controls_and_that_fits_its_admission_is_released(env: Scenario) -> None:
    """alice can read her job's UID and write it into an owner reference of a pod she makes, and
    can make that pod ask for more than was admitted. Neither is proof: such a pod stays gated,
    with an event saying why, while the admission keeps its room for a pod that is proven
    (docs/compatibility.md#pod-gating)."""
    job = await admitted_without_pods(env, "proof")
    # A real reference to the job, but not as its controller.
    loose = owned_pod("loose", job, gate=True)
    loose["metadata"]["ownerReferences"][0]["controller"] = False
    # Controlled by the job, but asking for twice what the pod set was admitted with per pod.
    large = owned_pod("large", job, gate=True)
    large["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    for pod in (loose, large):
        code, out = alice(env, "create", "-f", "-", obj=pod)
        assert code == 0, out
    assert "it has no controller reference" in await kept_gated_because(env, "proof", "loose")
    assert "cpu 2 > 1" in await kept_gated_because(env, "proof", "large")
    for name in ("loose", "large"):
        stored = get_pod(env, name)
        assert stored is not None and stored["spec"].get("schedulingGates"), stored

    # The admission still has its room: the job's own pod, made as the Job controller makes it,
    # is released.
    code, out = alice(env, "create", "-f", "-", obj=owned_pod("own", job, gate=True))
    assert code == 0, out

    async def released() -> bool:
        found = get_pod(env, "own")
        return found is not None and not found["spec"].get("schedulingGates")

    await kube.eventually(released, what="the proven pod released")
    for name in ("loose", "large"):
        stored = get_pod(env, name)
        assert stored is not None and stored["spec"].get("schedulingGates"), stored


async def test_a_unit_annotation_cannot_be_added_to_a_pod_that_exists(env: Scenario) -> None:
    """alice may run pods of her own outside the queue (naming no unit, out of any gate, bound
    even); she may not make one of them join her job's unit afterwards, by either annotation."""
    job = await admitted_without_pods(env, "joined")
    mine = owned_pod("mine", job, gate=False, node="node-x")
    mine["metadata"]["annotations"] = {}
    code, out = alice(env, "create", "-f", "-", obj=mine)
    assert code == 0, out
    for link in (
        f"{names.RELATED_QUEUEUNIT_ANNOTATION}={env.ns}/joined",
        f"{names.RELATED_PODSET_ANNOTATION}=main",
    ):
        code, out = alice(env, "annotate", "pod", "mine", link)
        assert code != 0 and POLICY in out and "nor added to a pod that exists" in out, (link, out)
    stored = get_pod(env, "mine")
    assert stored is not None
    stored["metadata"]["annotations"] = dict(job["spec"]["template"]["metadata"]["annotations"])
    code, out = alice(env, "replace", "-f", "-", obj=stored)
    assert code != 0 and POLICY in out, out
    after = get_pod(env, "mine")
    assert after is not None and not after["metadata"].get("annotations"), after


def unlabelled_metric(port: int, name: str) -> float:
    """A sample of a series without labels from the reconciler's /metrics (0 when absent)."""
    for line in scraping.metrics_text(port).splitlines():  # docs/operations.md#metrics
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return 0.0


async def test_pods_beyond_the_admission_are_reported_and_the_admission_is_not_grown(
    env: Scenario, system_integration: system.Processes
) -> None:
    """Only the scheduler changes what a unit holds (docs/compatibility.md#reclaim-and-usage-reports).
    alice cannot add a running pod to her admitted job's unit (born bound, or joined afterwards);
    where one gets there anyway (the admin stands for a way past the door), it is reported, and
    the unit goes on holding exactly what was admitted."""
    metrics_port = next(c.ports["metrics"] for c in system_integration.components if c.name == "reconciler")
    before = unlabelled_metric(metrics_port, "koord_queue_pods_beyond_admission_total")
    job = await admitted_without_pods(env, "held-to-it")
    code, out = alice(env, "create", "-f", "-", obj=owned_pod("extra", job, gate=False, node="node-x"))
    assert code != 0 and "koord-queue-pod-birth" in out, out
    for name in ("first", "second"):
        create_pod(env, owned_pod(name, job, gate=False, node="node-x"))

    async def reported() -> dict[str, Any] | None:
        unit = await env.get_unit("held-to-it")
        admissions = (unit.get("status") or {}).get("admissions") or []
        return unit if admissions and admissions[0].get("running") == 2 else None

    unit = await kube.eventually(reported, what="both bound pods reported running")
    assert [a.get("replicas") for a in unit["status"]["admissions"]] == [1], unit["status"]
    event = await env.wait_event(
        "held-to-it", names.EventReason.PODS_BEYOND_ADMISSION, kind="Job", type_="Warning"
    )
    assert "second" in event.message and "not charged" in event.message, event.message
    assert unlabelled_metric(metrics_port, "koord_queue_pods_beyond_admission_total") >= before + 1


async def test_a_pod_alice_deletes_counts_until_it_is_gone(env: Scenario) -> None:
    """A bound pod being deleted runs on for its grace period (docs/compatibility.md#pod-gating):
    while it terminates, the replacement stays gated; once it is gone, the replacement is
    released. There is no kubelet in this tier, so a bound pod alice deletes stays terminating
    until the admin removes it for good."""
    job = await admitted_without_pods(env, "replaced")
    # Bound, as its controller and the scheduler would have made it.
    create_pod(env, owned_pod("running", job, gate=False, node="node-x"))
    code, out = alice(env, "delete", "pod", "running", "--wait=false")
    assert code == 0, out
    terminating = get_pod(env, "running")
    assert terminating is not None and terminating["metadata"].get("deletionTimestamp"), terminating
    code, out = alice(env, "create", "-f", "-", obj=owned_pod("replacement", job, gate=True))
    assert code == 0, out
    for _ in range(10):  # the reconciler looks at the job on every pod event; give it time to err
        await asyncio.sleep(0.5)
        replacement = get_pod(env, "replacement")
        assert replacement is not None and replacement["spec"].get("schedulingGates"), replacement
    unit = await env.get_unit("replaced")
    assert [a.get("running") for a in unit["status"]["admissions"]] == [1], unit["status"]

    kube.kubectl(env.cluster, "delete", "pod", "running", "-n", env.ns, "--grace-period=0", "--force")

    async def released() -> bool:
        found = get_pod(env, "replacement")
        return found is not None and not found["spec"].get("schedulingGates")

    await kube.eventually(released, what="the replacement released once the terminating pod is gone")
