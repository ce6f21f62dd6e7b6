"""A namespace user cannot spend another team's quota, nor buy priority: the attacks, made for real.

alice (``kubectl --as=alice``) holds only a namespace user's rights in her namespace
(``tests/tenancy.py``); the real kube-apiserver runs the webhook, the admission policies of
``manifests/`` and the reconciler (docs/architecture.md#trust-boundaries: enforced at the door and again
by the reconciler):

* a Job labelled with a quota of another namespace is refused at the door with the quotas she may
  use (either quota label); once an admin lists her namespace on the quota
  (``quota.scheduling.koordinator.sh/namespaces``) it is accepted and admitted; with the switch off
  (``enforce=false`` in the policy's ConfigMap) the door lets it through; a job accepted earlier can
  still be updated after the binding is taken away;
* a QueueUnit naming another namespace's quota that reaches the scheduler anyway (created by an
  admin) waits with the same text and is never admitted, while that quota admits its own units;
* a second ElasticQuota of the same name in another namespace, with a bigger ``max``, that got
  past the door (tests/integration/test_quota_names.py covers the door and the same second)
  changes no admission, binds nothing and gets a Warning ``DuplicateQuotaName`` and the annotation
  ``koord-queue/ignored-reason``; when the holder goes, it takes over;
* a priority annotation above the cluster's cap is refused at the door (the webhook's
  ``--max-user-priority``), a quota's ``koord-queue/max-user-priority`` clamps the unit's
  ``spec.priority`` (and a changed cap is followed);
* the reconciler itself may change nothing of an ElasticQuota but its own annotations (the ignored
  reason and the published figures).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.integration.test_scenarios_queues import webhook_unregistered

pytestmark = pytest.mark.integration

ALICE = "alice"
MERGE = "application/merge-patch+json"
Obj = dict[str, Any]


def job(
    name: str,
    quota: str,
    *,
    label: str = names.QUOTA_NAME_LABEL,
    priority: str | None = None,
    cpu: str = "1",
) -> Obj:
    annotations = {names.PRIORITY_ANNOTATION: priority} if priority is not None else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {label: quota}, "annotations": annotations},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                    ],
                }
            }
        },
    }


def bare_unit(name: str, quota: str, *, cpu: str = "1") -> Obj:
    """A QueueUnit with no job behind it
    (docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own), as an admin may create
    one."""
    pod = {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": name},
            "resource": {"cpu": cpu},
            "request": {"cpu": cpu},
            "podSet": [{"name": "main", "count": 1, "template": {"spec": pod}}],
        },
    }


def status(obj: Obj) -> Obj:
    return dict(obj.get("status") or {})


@dataclass
class World:
    """alice's namespace ``mine`` (the test's), other namespaces on demand, and what was made."""

    api: k8s.ApiClient
    cluster: LocalCluster
    mine: str
    objects: k8s.CustomObjectsApi = field(init=False)
    core: k8s.CoreV1Api = field(init=False)
    namespaces: list[str] = field(default_factory=list)
    quotas: list[tuple[str, str]] = field(default_factory=list)
    units: list[tuple[str, str]] = field(default_factory=list)
    jobs: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.objects = k8s.CustomObjectsApi(self.api)
        self.core = k8s.CoreV1Api(self.api)

    def name(self, suffix: str) -> str:
        return f"{self.mine}-{suffix}"

    async def namespace(self, suffix: str) -> str:
        """Another namespace; its name sorts after alice's (same-named quota ties go to hers)."""
        name = self.name(suffix)
        await kube.create_namespace(self.api, name)
        self.namespaces.append(name)
        return name

    # --- as alice ----------------------------------------------------------------------------------

    def alice(self, *args: str, obj: Obj | None = None) -> subprocess.CompletedProcess[str]:
        text = yaml.safe_dump(obj) if obj is not None else None
        return tenancy.as_user(self.cluster, ALICE, "-n", self.mine, *args, input_text=text)

    def alice_creates(self, body: Obj) -> subprocess.CompletedProcess[str]:
        done = self.alice("create", "-f", "-", obj=body)
        if done.returncode == 0:
            self.jobs.append((self.mine, body["metadata"]["name"]))
        return done

    async def refused(self, body: Obj, text: str) -> str:
        """alice's server-side dry run of ``body`` is refused with ``text`` (policies load a moment
        after their parameters change); returns the refusal."""

        async def attempt() -> str | None:
            done = self.alice("create", "--dry-run=server", "-f", "-", obj=body)
            assert done.returncode != 0, f"accepted: {done.stdout}"
            assert text in done.stderr, done.stderr
            return done.stderr

        return await kube.eventually(attempt, what=f"alice refused with {text!r}")

    async def accepted(self, body: Obj) -> None:
        async def attempt() -> bool:
            done = self.alice("create", "--dry-run=server", "-f", "-", obj=body)
            assert done.returncode == 0, done.stderr
            return True

        await kube.eventually(attempt, what=f"alice's {body['metadata']['name']} accepted")

    # --- as admin ----------------------------------------------------------------------------------

    async def create_quota(
        self, namespace: str, name: str, *, cpu: str = "4", annotations: dict[str, str] | None = None
    ) -> Obj:
        body = {
            "apiVersion": names.QUOTA_API_VERSION,
            "kind": "ElasticQuota",
            "metadata": {"name": name, "annotations": dict(annotations or {})},
            "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
        }
        created: Obj = await self.objects.create_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, namespace, names.QUOTA_PLURAL, body
        )
        self.quotas.append((namespace, name))
        return created

    async def create_quota_past_the_door(
        self, namespace: str, name: str, *, cpu: str = "4", annotations: dict[str, str] | None = None
    ) -> Obj:
        """A quota whose name another namespace's quota holds, created as if it had slipped past the
        quota-name policy (made in the same moment as the holder, before the door knew the name):
        the name is taken out of the policy's ConfigMap until the create goes through. The
        reconciler puts it back on its next write, so this is tried until it lands."""

        async def attempt() -> Obj:
            await self.core.patch_namespaced_config_map(
                names.QUOTA_BINDINGS_CONFIGMAP,
                names.COMPONENT_NAMESPACE,
                {"data": {names.QUOTA_BINDING_HOLDER_PREFIX + name: None}},
            )
            try:
                return await self.create_quota(namespace, name, cpu=cpu, annotations=annotations)
            except k8s.ApiException as err:
                assert "is already held by" in str(err.body), err.body
                raise AssertionError("refused at the door") from err

        return await kube.eventually(attempt, what=f"ElasticQuota {namespace}/{name} past the door")

    async def get_quota(self, namespace: str, name: str) -> Obj:
        return await kube.get_custom(
            self.api, names.QUOTA_GROUP, names.QUOTA_VERSION, namespace, names.QUOTA_PLURAL, name
        )

    async def annotate_quota(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        await self.objects.patch_namespaced_custom_object(
            names.QUOTA_GROUP,
            names.QUOTA_VERSION,
            namespace,
            names.QUOTA_PLURAL,
            name,
            {"metadata": {"annotations": annotations}},
            _content_type=MERGE,
        )

    async def delete_quota(self, namespace: str, name: str) -> None:
        await self.objects.delete_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, namespace, names.QUOTA_PLURAL, name
        )

    async def create_unit(self, namespace: str, body: Obj) -> None:
        await self.objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.QUEUEUNIT_PLURAL, body
        )
        self.units.append((namespace, body["metadata"]["name"]))

    async def get_unit(self, namespace: str, name: str) -> Obj:
        return await kube.get_custom(
            self.api, names.GROUP, names.VERSION, namespace, names.QUEUEUNIT_PLURAL, name
        )

    async def wait_unit(self, namespace: str, name: str, what: str, probe: Any) -> Obj:
        async def check() -> Obj | None:
            try:
                got = await self.get_unit(namespace, name)
            except k8s.ApiException as err:
                assert err.status != 404, "no such QueueUnit yet"
                raise
            assert probe(got), f"status: {status(got)}, spec.priority: {got['spec'].get('priority')}"
            return got

        return await kube.eventually(check, what=f"QueueUnit {namespace}/{name}: {what}")

    async def wait_message(self, namespace: str, name: str, text: str) -> Obj:
        return await self.wait_unit(
            namespace, name, f"message {text!r}", lambda u: status(u).get("message") == text
        )

    async def wait_admitted(self, namespace: str, name: str) -> Obj:
        return await self.wait_unit(namespace, name, "admitted", lambda u: bool(status(u).get("admissions")))

    async def assert_waiting(self, namespace: str, name: str) -> None:
        got = status(await self.get_unit(namespace, name))
        assert got.get("phase") in ("", "Enqueued", None) and not got.get("admissions"), got

    async def wait_event(self, namespace: str, name: str, reason: str) -> Any:
        async def probe() -> Any:
            found = await self.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}"
            )
            return next((e for e in found.items if e.reason == reason and e.type == "Warning"), None)

        return await kube.eventually(probe, what=f"Warning {reason} on {namespace}/{name}")

    async def bindings(self) -> dict[str, str]:
        found = await self.core.read_namespaced_config_map(
            names.QUOTA_BINDINGS_CONFIGMAP, names.COMPONENT_NAMESPACE
        )
        return dict(found.data or {})

    async def cleanup(self) -> None:
        for namespace, name in self.jobs:
            kube.kubectl(
                self.cluster, "delete", "-n", namespace, "job", name, "--ignore-not-found", "--wait=false"
            )
        for namespace in {self.mine, *self.namespaces}:
            with contextlib.suppress(k8s.ApiException):
                await self.objects.delete_collection_namespaced_custom_object(
                    names.GROUP, names.VERSION, namespace, names.QUEUEUNIT_PLURAL
                )
        for namespace, name in self.quotas:
            with contextlib.suppress(k8s.ApiException):
                await self.delete_quota(namespace, name)
        for namespace in self.namespaces:
            await kube.delete_namespace(self.api, namespace)


@pytest.fixture
async def w(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[World]:
    tenancy.grant(integration_cluster, namespace_in, ALICE)
    async with kube.client(integration_cluster) as api:
        it = World(api, integration_cluster, namespace_in)
        try:
            yield it
        finally:
            await it.cleanup()


async def alice_may_submit(w: World, quota: str) -> None:
    """alice's rights are in effect (RBAC takes a moment): a job charged to her own quota passes."""
    await w.accepted(job("probe", quota))


# --- another namespace's quota, at the door ---------------------------------------------------------


async def test_a_job_naming_another_namespaces_quota_is_refused_until_the_quota_lists_her_namespace(
    w: World,
) -> None:
    theirs_ns = await w.namespace("b")
    mine, theirs = w.name("mine"), w.name("theirs")
    await w.create_quota(w.mine, mine)
    await w.create_quota(theirs_ns, theirs)
    await alice_may_submit(w, mine)

    expected = names.quota_not_bound_message(theirs, w.mine, [mine])
    for label in (names.QUOTA_NAME_LABEL, names.QUOTA_NAME_LABEL_FALLBACK):
        refusal = await w.refused(job("steal", theirs, label=label), expected)
        assert "denied request" in refusal and "Forbidden" in refusal, refusal
    done = w.alice_creates(job("steal", theirs))
    assert done.returncode != 0 and expected in done.stderr, done.stderr
    assert w.alice("get", "job", "steal").returncode != 0  # nothing was stored
    # A quota nobody has created yet is not the door's business: its jobs wait for it.
    await w.accepted(job("early", w.name("not-yet")))

    await w.annotate_quota(theirs_ns, theirs, {names.QUOTA_NAMESPACES_ANNOTATION: json.dumps([w.mine])})
    await w.accepted(job("shared", theirs))
    assert w.alice_creates(job("shared", theirs)).returncode == 0
    await w.wait_admitted(w.mine, "shared")
    data = await w.bindings()
    assert data[f"q.{theirs}"] == " " + " ".join(sorted([theirs_ns, w.mine])) + " "
    assert data[f"ns.{w.mine}"] == ", ".join(sorted([mine, theirs]))
    assert data["enforce"] == "true"

    # Taken away again: new jobs are refused, the one accepted before can still be updated.
    await w.annotate_quota(theirs_ns, theirs, {names.QUOTA_NAMESPACES_ANNOTATION: None})
    await w.refused(job("again", theirs), names.quota_not_bound_message(theirs, w.mine, [mine]))
    done = w.alice("annotate", "job", "shared", "example.com/note=still-mine")
    assert done.returncode == 0, done.stderr


async def test_with_the_switch_off_the_door_lets_any_quota_through(w: World) -> None:
    theirs_ns = await w.namespace("b")
    mine, theirs = w.name("mine"), w.name("theirs")
    await w.create_quota(w.mine, mine)
    await w.create_quota(theirs_ns, theirs)
    await alice_may_submit(w, mine)
    await w.refused(job("steal", theirs), f'quota "{theirs}" is not bound')

    async def switched_off() -> bool:
        # The reconciler puts its own value back on its next sync: set it again until the
        # policy has been seen to allow.
        await w.core.patch_namespaced_config_map(
            names.QUOTA_BINDINGS_CONFIGMAP, names.COMPONENT_NAMESPACE, {"data": {"enforce": "false"}}
        )
        done = w.alice("create", "--dry-run=server", "-f", "-", obj=job("steal", theirs))
        assert done.returncode == 0, done.stderr
        return True

    try:
        await kube.eventually(switched_off, what="the door open with enforce=false")
    finally:
        await w.core.patch_namespaced_config_map(
            names.QUOTA_BINDINGS_CONFIGMAP, names.COMPONENT_NAMESPACE, {"data": {"enforce": "true"}}
        )
    await w.refused(job("steal", theirs), f'quota "{theirs}" is not bound')


# --- another namespace's quota, at the scheduler ------------------------------------------------------


async def test_a_unit_that_reaches_the_scheduler_anyway_waits_with_the_reason_and_is_never_admitted(
    w: World,
) -> None:
    theirs_ns = await w.namespace("b")
    mine, theirs = w.name("mine"), w.name("theirs")
    await w.create_quota(w.mine, mine)
    await w.create_quota(theirs_ns, theirs, cpu="4")
    await w.create_unit(w.mine, bare_unit("smuggled", theirs))
    await w.wait_message(w.mine, "smuggled", names.quota_not_bound_message(theirs, w.mine, [mine]))
    # The quota has room and admits its own namespace's units meanwhile; the smuggled one still waits.
    await w.create_unit(theirs_ns, bare_unit("own", theirs))
    await w.wait_admitted(theirs_ns, "own")
    await w.assert_waiting(w.mine, "smuggled")

    # The event is written after the message, by the asynchronous event writer: wait for it.
    async def told() -> bool:
        events = await w.core.list_namespaced_event(w.mine, field_selector="involvedObject.name=smuggled")
        assert any(
            e.reason == names.EventReason.FAILED_SCHEDULING and f'quota "{theirs}" is not bound' in e.message
            for e in events.items
        ), [(e.reason, e.message) for e in events.items]
        return True

    await kube.eventually(told, what="FailedScheduling on smuggled naming the unbound quota")

    await w.annotate_quota(theirs_ns, theirs, {names.QUOTA_NAMESPACES_ANNOTATION: json.dumps([w.mine])})
    await w.wait_admitted(w.mine, "smuggled")


# --- same-named quotas --------------------------------------------------------------------------------


async def test_a_younger_same_named_quota_elsewhere_changes_no_admission_and_is_told_why(w: World) -> None:
    other = await w.namespace("z")  # sorts after alice's namespace: hers counts even in the same second
    shared = w.name("shared")
    await w.create_quota(w.mine, shared, cpu="1")
    await w.create_unit(w.mine, bare_unit("first", shared))
    await w.wait_admitted(w.mine, "first")
    await w.create_unit(w.mine, bare_unit("second", shared))
    await w.wait_message(w.mine, "second", f"limited quotaName:{shared}, limited resKey:cpu,; preempt failed")

    await w.create_quota_past_the_door(other, shared, cpu="10", annotations={names.MAX_DEPTH_ANNOTATION: "7"})
    reason = names.duplicate_quota_message(other, shared, w.mine)
    event = await w.wait_event(other, shared, names.DUPLICATE_QUOTA_NAME_REASON)
    assert event.message == reason
    assert event.involved_object.kind == "ElasticQuota"

    async def annotated() -> bool:
        got = await w.get_quota(other, shared)
        return (got["metadata"].get("annotations") or {}).get(names.IGNORED_REASON_ANNOTATION) == reason

    await kube.eventually(annotated, what="the ignored quota's annotation")
    # Its bigger max counts for nothing: a newcomer waits for the same reason as before.
    await w.create_unit(w.mine, bare_unit("third", shared))
    await w.wait_message(w.mine, "third", f"limited quotaName:{shared}, limited resKey:cpu,; preempt failed")
    await w.assert_waiting(w.mine, "second")
    # ... and it binds nothing: a unit of its own namespace may not use the name.
    await w.create_unit(other, bare_unit("elsewhere", shared))
    await w.wait_message(other, "elsewhere", names.quota_not_bound_message(shared, other, []))
    winner = await w.get_quota(w.mine, shared)
    assert names.IGNORED_REASON_ANNOTATION not in (winner["metadata"].get("annotations") or {})
    queue = await kube.get_custom(
        w.api, names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, shared
    )
    assert names.MAX_DEPTH_ANNOTATION not in (
        queue["metadata"].get("annotations") or {}
    )  # the winner's Queue

    # The older one goes: the other takes over, with its limits, its Queue and its namespace.
    await w.delete_quota(w.mine, shared)
    await w.wait_admitted(other, "elsewhere")

    async def cleared() -> bool:
        got = await w.get_quota(other, shared)
        return names.IGNORED_REASON_ANNOTATION not in (got["metadata"].get("annotations") or {})

    await kube.eventually(cleared, what="the annotation removed once the quota counts")

    async def rebound() -> bool:
        return (await w.bindings()).get(f"q.{shared}") == f" {other} "

    await kube.eventually(rebound, what="the door follows the quota that counts now")


# --- priority ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def webhook_with_cap(
    cluster: LocalCluster, processes: system.Processes, logdir: Any, cap: int
) -> Iterator[None]:
    """The shared webhook replaced by one started with ``--max-user-priority`` (then restored)."""
    component, port = system.start_webhook(
        cluster, logdir=logdir, register=False, extra_args=[f"--max-user-priority={cap}"]
    )
    try:
        system.register_webhook(cluster, port=port)
        yield
    finally:
        system.register_webhook(cluster, port=processes.webhook_port)
        component.stop()


async def test_a_priority_above_the_cluster_cap_is_refused_at_the_door(
    w: World, system_integration: system.Processes, tmp_path: Any
) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine)
    await alice_may_submit(w, mine)
    with webhook_with_cap(w.cluster, system_integration, tmp_path, 100):
        refusal = await w.refused(job("pushy", mine, priority="101"), "must be at most 100")
        assert f"metadata.annotations[{names.PRIORITY_ANNOTATION}]" in refusal
        assert "maxUserPriority" in refusal
        await w.accepted(job("fair", mine, priority="100"))
    await w.accepted(job("pushy", mine, priority="101"))  # the shared webhook has no cap, as upstream


async def test_a_quotas_cap_clamps_the_units_priority_and_is_followed_when_it_changes(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1", annotations={names.MAX_USER_PRIORITY_ANNOTATION: "10"})
    await alice_may_submit(w, mine)
    assert w.alice_creates(job("pushy", mine, priority="1000000")).returncode == 0
    assert w.alice_creates(job("modest", mine, priority="5")).returncode == 0
    await w.wait_unit(w.mine, "pushy", "priority 10", lambda u: u["spec"].get("priority") == 10)
    await w.wait_unit(w.mine, "modest", "priority 5", lambda u: u["spec"].get("priority") == 5)
    await w.annotate_quota(w.mine, mine, {names.MAX_USER_PRIORITY_ANNOTATION: "3"})
    await w.wait_unit(w.mine, "pushy", "priority 3", lambda u: u["spec"].get("priority") == 3)
    await w.wait_unit(w.mine, "modest", "priority 3", lambda u: u["spec"].get("priority") == 3)
    await w.annotate_quota(w.mine, mine, {names.MAX_USER_PRIORITY_ANNOTATION: None})
    await w.wait_unit(w.mine, "pushy", "priority back", lambda u: u["spec"].get("priority") == 1000000)


# --- what the reconciler may do to quotas, and unreadable annotations --------------------------------


async def test_the_reconciler_may_change_only_its_own_annotations_of_a_quota(w: World) -> None:
    mine = w.name("mine")
    await w.create_quota(w.mine, mine, cpu="1")

    def as_reconciler(patch: Obj) -> subprocess.CompletedProcess[str]:
        return kube.kubectl(
            w.cluster,
            f"--as={system.RECONCILER_USER}",
            "-n",
            w.mine,
            "patch",
            "elasticquota",
            mine,
            "--type=merge",
            "-p",
            json.dumps(patch),
            check=False,
        )

    async def refused() -> bool:
        done = as_reconciler({"spec": {"max": {"cpu": "100"}}})
        assert done.returncode != 0, "the reconciler raised a quota's max"
        assert "may change only the annotations koord-queue/ignored-reason" in done.stderr, done.stderr
        return True

    await kube.eventually(refused, what="the reconciler refused a spec change")
    for patch in (
        {"metadata": {"labels": {names.QUOTA_PARENT_LABEL: "elsewhere"}}},
        {"metadata": {"annotations": {names.QUOTA_NAMESPACES_ANNOTATION: '["kube-system"]'}}},
    ):
        done = as_reconciler(patch)
        assert done.returncode != 0 and "ignored-reason" in done.stderr, (patch, done.stderr)
    # Its own annotations: the ignored reason and the published figures.
    for key in (
        names.IGNORED_REASON_ANNOTATION,
        names.QUOTA_RUNTIME_ANNOTATION,
        names.QUOTA_REQUEST_ANNOTATION,
        names.QUOTA_BORROWED_ANNOTATION,
    ):
        done = as_reconciler({"metadata": {"annotations": {key: '{"cpu":"1"}'}}})
        assert done.returncode == 0, (key, done.stderr)
    assert (await w.get_quota(w.mine, mine))["spec"]["max"] == {"cpu": "1"}


async def test_an_unreadable_namespaces_annotation_binds_only_the_own_namespace_and_is_reported(
    w: World, integration_cluster: LocalCluster, system_integration: system.Processes
) -> None:
    """The webhook refuses such a value; one written while it was away is read leniently."""
    mine = w.name("mine")
    with webhook_unregistered(integration_cluster, system_integration, w.mine):
        await w.create_quota(w.mine, mine, annotations={names.QUOTA_NAMESPACES_ANNOTATION: "[not json"})
    event = await w.wait_event(w.mine, mine, names.INVALID_QUOTA_ANNOTATION_REASON)
    assert names.QUOTA_NAMESPACES_ANNOTATION in event.message and "not valid JSON" in event.message

    async def own_namespace_only() -> bool:
        return (await w.bindings()).get(f"q.{mine}") == f" {w.mine} "

    await kube.eventually(own_namespace_only, what="bound to its own namespace")
