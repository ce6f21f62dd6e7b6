"""Builders and probes for the REFERENCE §8 scenario tests against the real apiserver.

The scenario suites drive the running system (webhook + reconciler, fixture ``system_integration``)
only through the API, with bare QueueUnits (ARCHITECTURE decision 8): a test plays the job extension
by patching ``status.admissions`` through the status subresource.

* :func:`unit`, :func:`quota` and :func:`queue` build objects (fluent keyword builders);
* :class:`Scenario` binds an API client to the test namespace: create, read, patch, wait for a
  phase or a message, look up events, read a Queue; on exit it deletes what the test made
  (without a controller-manager a deleted namespace never empties, so quotas and hand-made Queues
  would otherwise outlive the test and keep the reconciler busy).

Quotas are keyed by name cluster-wide, so :meth:`Scenario.name` derives names from the namespace.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s

from shared import names
from testenv.cluster import LocalCluster
from tests import kube

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
#: Phases that mean "admitted" for a bare unit (no job extension moves it further).
ADMITTED = ("Dequeued",)
#: The phases a waiting unit may show.
WAITING = ("", "Enqueued")


# --- builders -------------------------------------------------------------------------------------


def pod_set(name: str, *, cpu: str = "1", count: int = 1) -> Obj:
    return {
        "name": name,
        "count": count,
        "template": {
            "spec": {
                "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]
            }
        },
    }


def unit(
    name: str,
    *,
    quota: str | None,
    cpu: str = "1",
    priority: int | None = None,
    active: bool | None = None,
    labels: Mapping[str, str] | None = None,
    extra_pod_sets: Iterable[Obj] = (),
) -> Obj:
    """A bare QueueUnit: one pod set named after the unit (count 1, ``cpu``), like upstream's
    fixture, with ``spec.resource = spec.request = {cpu}``. ``quota=None`` leaves the label off.

    The consumer is a kind no adapter handles, so the job extensions leave the unit alone.
    """
    all_labels = dict(labels or {})
    if quota is not None:
        all_labels[names.QUOTA_NAME_LABEL] = quota
    spec: Obj = {
        "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": name},
        "resource": {"cpu": cpu},
        "request": {"cpu": cpu},
        "podSet": [pod_set(name, cpu=cpu), *extra_pod_sets],
    }
    if priority is not None:
        spec["priority"] = priority
    if active is not None:
        spec["active"] = active
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
    }


def quota(
    name: str,
    *,
    cpu: str = "4",
    parent: str | None = None,
    policy: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """An ElasticQuota with min = max = ``cpu`` (the common fixture of REFERENCE §8.1)."""
    all_labels = dict(labels or {})
    if parent is not None:
        all_labels[names.QUOTA_PARENT_LABEL] = parent
    if policy is not None:
        all_labels[names.QUEUE_POLICY_LABEL] = policy
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "labels": all_labels, "annotations": dict(annotations or {})},
        "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
    }


def queue(
    name: str,
    *,
    policy: str = "Priority",
    annotations: Mapping[str, str] | None = None,
    admission_checks: Iterable[Obj] = (),
) -> Obj:
    """A hand-made Queue in namespace ``koord-queue``."""
    spec: Obj = {"queuePolicy": policy, "priority": 1000}
    checks = list(admission_checks)
    if checks:
        spec["admissionChecks"] = checks
    return {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {
            "name": name,
            "namespace": names.COMPONENT_NAMESPACE,
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


# --- reading objects ------------------------------------------------------------------------------


def status(obj: Mapping[str, Any]) -> Obj:
    return dict(obj.get("status") or {})


def phase(obj: Mapping[str, Any]) -> str:
    return str(status(obj).get("phase", ""))


def message(obj: Mapping[str, Any]) -> str:
    return str(status(obj).get("message", ""))


def condition(obj: Mapping[str, Any], type_: str) -> Obj | None:
    for cond in status(obj).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def admissions(obj: Mapping[str, Any]) -> list[Obj]:
    return list(status(obj).get("admissions") or [])


def check_states(obj: Mapping[str, Any]) -> dict[str, str]:
    return {c["name"]: c["state"] for c in status(obj).get("admissionChecks") or []}


# --- the scenario ---------------------------------------------------------------------------------


class Scenario:
    """An API client bound to one test namespace, with the operations the scenarios need."""

    def __init__(self, api: k8s.ApiClient, cluster: LocalCluster, namespace: str) -> None:
        self.api = api
        self.cluster = cluster
        self.ns = namespace
        self.objects = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self._quotas: list[str] = []
        self._queues: list[str] = []

    def name(self, suffix: str) -> str:
        """A cluster-wide unique name for this test (quotas and Queues are keyed by name)."""
        return f"{self.ns}-{suffix}"

    # --- QueueUnits --------------------------------------------------------------------------

    async def create_unit(self, body: Obj) -> Obj:
        created: Obj = await self.objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, body
        )
        return created

    async def get_unit(self, name: str) -> Obj:
        got: Obj = await self.objects.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, name
        )
        return got

    async def delete_unit(self, name: str) -> None:
        await self.objects.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, name
        )

    async def patch_unit(self, name: str, patch: Obj) -> Obj:
        """A merge patch of the unit's spec or metadata (what a user or a job controller does)."""
        out: Obj = await self.objects.patch_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, name, patch, _content_type=MERGE
        )
        return out

    async def update_status(self, name: str, change: Callable[[Obj], None]) -> Obj:
        """Read-modify-write of ``status`` through the status subresource, retried on conflict.

        This is how a test plays the job extension (or an admission-check controller).
        """
        for _ in range(20):
            current = await self.get_unit(name)
            new_status = status(current)
            change(new_status)
            body = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "status": new_status,
            }
            try:
                out: Obj = await self.objects.patch_namespaced_custom_object_status(
                    names.GROUP,
                    names.VERSION,
                    self.ns,
                    names.QUEUEUNIT_PLURAL,
                    name,
                    body,
                    _content_type=MERGE,
                )
                return out
            except k8s.ApiException as err:
                if err.status != 409:
                    raise
        raise AssertionError(f"status of {name} kept conflicting")

    async def set_running(self, name: str, running: int) -> Obj:
        """Play the job extension: report ``running`` bound pods on every admission."""

        def change(st: Obj) -> None:
            assert st.get("admissions"), f"{name} has no admissions to run: {st}"
            for adm in st["admissions"]:
                adm["running"] = running

        return await self.update_status(name, change)

    async def finish(self, name: str) -> Obj:
        """Play the job extension when the job succeeds: phase Succeed, quota released."""

        def change(st: Obj) -> None:
            st.update(phase="Succeed", message="Succeeded", admissions=[])

        return await self.update_status(name, change)

    async def set_checks(self, name: str, states: Mapping[str, str], *, text: str = "") -> Obj:
        """Play an admission-check controller: set the named checks' states (others unchanged)."""
        stamp = _now_text()

        def change(st: Obj) -> None:
            checks = st.get("admissionChecks") or []
            known = {c["name"] for c in checks}
            missing = set(states) - known
            assert not missing, f"{name} does not carry checks {missing}: {checks}"
            for c in checks:
                if c["name"] in states and c["state"] != states[c["name"]]:
                    c.update(state=states[c["name"]], message=text, lastTransitionTime=stamp)

        return await self.update_status(name, change)

    async def wait_unit(
        self, name: str, probe: Callable[[Obj], bool], *, what: str, timeout: float = 30.0
    ) -> Obj:
        async def check() -> Obj | None:
            got = await self.get_unit(name)
            return got if probe(got) else None

        return await kube.eventually(check, timeout=timeout, what=f"{self.ns}/{name}: {what}")

    async def wait_phase(self, name: str, *phases: str, timeout: float = 30.0) -> Obj:
        """Wait until the unit's phase is one of ``phases``; returns the unit."""
        wanted = phases or ADMITTED
        return await self.wait_unit(
            name, lambda u: phase(u) in wanted, what=f"phase in {wanted}", timeout=timeout
        )

    async def wait_message(self, name: str, text: str, *, timeout: float = 30.0) -> Obj:
        """Wait until ``status.message`` contains ``text`` (the scheduler's positive "I looked")."""
        return await self.wait_unit(
            name, lambda u: text in message(u), what=f"message containing {text!r}", timeout=timeout
        )

    async def assert_waiting(self, name: str) -> Obj:
        """The unit is not admitted (call after a positive signal that the scheduler has looked)."""
        got = await self.get_unit(name)
        assert phase(got) in WAITING, f"{name} should still wait: {status(got)}"
        assert not admissions(got), f"{name} should hold nothing: {status(got)}"
        return got

    # --- events ------------------------------------------------------------------------------

    async def events(self, name: str, *, namespace: str | None = None, kind: str | None = None) -> list[Any]:
        ns = namespace or self.ns
        found = await self.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        return [e for e in found.items if kind is None or e.involved_object.kind == kind]

    async def wait_event(
        self,
        name: str,
        reason: str,
        *,
        type_: str | None = None,
        namespace: str | None = None,
        kind: str | None = None,
        timeout: float = 30.0,
    ) -> Any:
        async def probe() -> Any:
            for event in await self.events(name, namespace=namespace, kind=kind):
                if event.reason == reason and (type_ is None or event.type == type_):
                    return event
            return None

        return await kube.eventually(
            probe, timeout=timeout, what=f"event {reason} on {namespace or self.ns}/{name}"
        )

    # --- quotas and Queues -------------------------------------------------------------------

    async def create_quota(self, body: Obj, *, wait_queue: bool = True) -> Obj:
        """Create an ElasticQuota in the test namespace; by default wait for its Queue."""
        created: Obj = await self.objects.create_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, self.ns, names.QUOTA_PLURAL, body
        )
        self._quotas.append(body["metadata"]["name"])
        if wait_queue:
            await self.wait_queue(body["metadata"]["name"])
        return created

    async def patch_quota(self, name: str, patch: Obj) -> Obj:
        out: Obj = await self.objects.patch_namespaced_custom_object(
            names.QUOTA_GROUP,
            names.QUOTA_VERSION,
            self.ns,
            names.QUOTA_PLURAL,
            name,
            patch,
            _content_type=MERGE,
        )
        return out

    async def delete_quota(self, name: str) -> None:
        await self.objects.delete_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, self.ns, names.QUOTA_PLURAL, name
        )

    async def create_queue(self, body: Obj) -> Obj:
        """Create a hand-made Queue (deleted when the scenario ends)."""
        created: Obj = await self.objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, body
        )
        self._queues.append(body["metadata"]["name"])
        return created

    async def patch_queue(self, name: str, patch: Obj) -> Obj:
        out: Obj = await self.objects.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            names.COMPONENT_NAMESPACE,
            names.QUEUE_PLURAL,
            name,
            patch,
            _content_type=MERGE,
        )
        return out

    async def delete_queue(self, name: str) -> None:
        await self.objects.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, name
        )

    async def get_queue(self, name: str) -> Obj | None:
        try:
            got: Obj = await self.objects.get_namespaced_custom_object(
                names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, name
            )
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        return got

    async def wait_queue(
        self, name: str, probe: Callable[[Obj], bool] = lambda _: True, *, what: str = "exists"
    ) -> Obj:
        async def check() -> Obj | None:
            got = await self.get_queue(name)
            return got if got is not None and probe(got) else None

        return await kube.eventually(check, what=f"Queue {names.COMPONENT_NAMESPACE}/{name} {what}")

    async def list_queues(self) -> list[Obj]:
        out = await self.objects.list_namespaced_custom_object(
            names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL
        )
        return list(out["items"])

    # --- metrics -----------------------------------------------------------------------------

    def metric(self, port: int, name: str, labels: Mapping[str, str]) -> float:
        """A sample from the reconciler's /metrics (0 when the series does not exist yet)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if not line.startswith(name + "{"):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
        return 0.0

    # --- cleanup -----------------------------------------------------------------------------

    async def cleanup(self) -> None:
        with contextlib.suppress(k8s.ApiException):
            await self.objects.delete_collection_namespaced_custom_object(
                names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL
            )
        for name in self._quotas:
            with contextlib.suppress(k8s.ApiException):
                await self.delete_quota(name)
        for name in self._queues:
            with contextlib.suppress(k8s.ApiException):
                await self.delete_queue(name)


@contextlib.asynccontextmanager
async def scenario(cluster: LocalCluster, namespace: str) -> AsyncIterator[Scenario]:
    async with kube.client(cluster) as api:
        sc = Scenario(api, cluster, namespace)
        try:
            yield sc
        finally:
            await sc.cleanup()


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
