"""The reconciler's quota side without a cluster: the binding ConfigMap it keeps for the admission
policy, what it tells same-named and unreadable quotas, and the priority cap reaching new units.

The API is a small in-memory fake; the real apiserver runs the same paths in
tests/integration/test_tenant_quotas.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from koord_queue.reconciler.job_units import JobKey
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.reconciler.quotas import QuotaBindingSync, QuotaQueueSync
from koord_queue.shared import kube
from koord_queue.shared.api import names, parsing
from koord_queue.shared.jobs import registry

NOW = "2026-01-01T00:00:00Z"


class FakeAPI:
    """ConfigMaps and ElasticQuotas by (namespace, name); the writes made, in order."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], kube.Obj] = {}
        self.writes: list[tuple[str, str, Any]] = []
        self.conflicts = 0
        self.version = 0

    def _key(self, res: kube.Resource, name: str, namespace: str | None) -> tuple[str, str, str]:
        return (res.plural, namespace or "", name)

    def _store(self, key: tuple[str, str, str], obj: kube.Obj) -> kube.Obj:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> kube.Obj:
        found = self.objects.get(self._key(res, name, namespace))
        if found is None:
            raise kube.NotFound(404, "NotFound", f"{name} not found")
        return copy.deepcopy(found)

    async def create(self, res: kube.Resource, obj: kube.Obj, *, namespace: str | None = None) -> kube.Obj:
        self.writes.append(("create", obj["metadata"]["name"], obj))
        return self._store(self._key(res, obj["metadata"]["name"], namespace), obj)

    async def replace(
        self, res: kube.Resource, name: str, obj: kube.Obj, *, namespace: str | None = None
    ) -> kube.Obj:
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
            self.objects[self._key(res, name, namespace)]["metadata"]["resourceVersion"] = str(self.version)
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        self.writes.append(("replace", name, obj))
        return self._store(self._key(res, name, namespace), obj)

    async def patch(self, res: kube.Resource, name: str, patch: Any, **kwargs: Any) -> kube.Obj:
        self.writes.append(("patch", f"{kwargs.get('namespace')}/{name}", patch))
        return {}


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, obj: kube.Obj, *, type_: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        self.recorded.append((f"{meta['namespace']}/{meta['name']}", reason, message))


def quota_obj(
    name: str, namespace: str, *, created: str = NOW, annotations: dict[str, str] | None = None
) -> kube.Obj:
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}",
            "creationTimestamp": created,
            "annotations": dict(annotations or {}),
        },
        "spec": {"max": {"cpu": "1"}},
    }


# --- the binding ConfigMap --------------------------------------------------------------------------


async def test_the_binding_configmap_is_created_then_replaced_only_when_its_data_changes() -> None:
    api = FakeAPI()
    quotas = [parsing.parse_quota(quota_obj("team-a", "ns-a"))]
    sync = QuotaBindingSync(api, quotas=lambda: quotas, enforce=True, namespace=names.COMPONENT_NAMESPACE)  # type: ignore[arg-type]
    await sync.sync()
    [(verb, name, body)] = api.writes
    assert (verb, name) == ("create", names.QUOTA_BINDINGS_CONFIGMAP)
    assert body["metadata"]["namespace"] == names.COMPONENT_NAMESPACE
    assert body["data"] == {
        "enforce": "true",
        "holder.team-a": "ns-a",
        "q.team-a": " ns-a ",
        "ns.ns-a": "team-a",
        "guarantees": "true",
    }
    await sync.sync()
    assert len(api.writes) == 1  # nothing changed: only read

    quotas.append(
        parsing.parse_quota(
            quota_obj("team-b", "ns-b", annotations={names.QUOTA_NAMESPACES_ANNOTATION: '["ns-a"]'})
        )
    )
    api.conflicts = 1  # someone wrote in between: read again and retry
    await sync.sync()
    verb, _, body = api.writes[-1]
    assert verb == "replace"
    assert body["data"]["ns.ns-a"] == "team-a, team-b"
    assert body["metadata"]["resourceVersion"] == str(api.version - 1)  # the version it read


async def test_a_hand_edited_or_deleted_configmap_is_put_back() -> None:
    api = FakeAPI()
    sync = QuotaBindingSync(
        api,  # type: ignore[arg-type]
        quotas=lambda: [],
        enforce=False,
        guarantees=False,
        namespace=names.COMPONENT_NAMESPACE,
    )
    await sync.sync()
    key = ("configmaps", names.COMPONENT_NAMESPACE, names.QUOTA_BINDINGS_CONFIGMAP)
    api.objects[key]["data"] = {"enforce": "true"}
    await sync.sync()
    assert api.objects[key]["data"] == {"enforce": "false", "guarantees": "false"}
    del api.objects[key]
    await sync.sync()
    assert api.objects[key]["data"] == {"enforce": "false", "guarantees": "false"}


# --- same-named and unreadable quotas ----------------------------------------------------------------


def queue_sync(api: FakeAPI, quotas: dict[str, kube.Obj], events: Events) -> QuotaQueueSync:
    return QuotaQueueSync(
        api,  # type: ignore[arg-type]
        quotas=lambda: quotas,
        queues=dict,
        events=events,  # type: ignore[arg-type]
        namespace=names.COMPONENT_NAMESPACE,
    )


async def test_an_ignored_same_named_quota_is_told_why_once_and_cleared_when_it_counts() -> None:
    api, events = FakeAPI(), Events()
    older = quota_obj("q", "ns-z", created="2026-01-01T00:00:00Z")
    younger = quota_obj("q", "ns-a", created="2026-01-01T00:00:05Z")  # sorts first by name, yet younger
    quotas = {"ns-z/q": older, "ns-a/q": younger}
    sync = queue_sync(api, quotas, events)
    await sync.sync("q")
    reason = names.duplicate_quota_message("ns-a", "q", "ns-z")
    assert events.recorded == [("ns-a/q", names.DUPLICATE_QUOTA_NAME_REASON, reason)]
    patches = [w for w in api.writes if w[0] == "patch"]
    assert patches == [
        ("patch", "ns-a/q", {"metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: reason}}})
    ]
    created_queue = next(w for w in api.writes if w[0] == "create")
    assert created_queue[2]["metadata"]["name"] == "q"

    younger["metadata"]["annotations"][names.IGNORED_REASON_ANNOTATION] = reason  # the patch landed
    await sync.sync("q")
    assert len(events.recorded) == 1  # said once
    assert len([w for w in api.writes if w[0] == "patch"]) == 1

    del quotas["ns-z/q"]  # the older one goes: the younger counts now
    await sync.sync("q")
    assert [w for w in api.writes if w[0] == "patch"][-1] == (
        "patch",
        "ns-a/q",
        {"metadata": {"annotations": {names.IGNORED_REASON_ANNOTATION: None}}},
    )


async def test_an_unreadable_annotation_is_reported_once_per_distinct_problem() -> None:
    api, events = FakeAPI(), Events()
    broken = quota_obj("q", "ns-a", annotations={names.QUOTA_NAMESPACES_ANNOTATION: "[ns-b"})
    quotas = {"ns-a/q": broken}
    sync = queue_sync(api, quotas, events)
    await sync.sync("q")
    await sync.sync("q")
    [(where, reason, message)] = events.recorded
    assert (where, reason) == ("ns-a/q", names.INVALID_QUOTA_ANNOTATION_REASON)
    assert "not valid JSON" in message
    broken["metadata"]["annotations"][names.MAX_USER_PRIORITY_ANNOTATION] = "lots"
    await sync.sync("q")
    assert len(events.recorded) == 2 and names.MAX_USER_PRIORITY_ANNOTATION in events.recorded[-1][2]


# --- the cap reaches the job extensions ------------------------------------------------------------


async def test_a_new_unit_gets_the_capped_priority() -> None:
    api = FakeAPI()
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "pushy",
            "namespace": "ns-a",
            "uid": "u-1",
            "creationTimestamp": NOW,
            "labels": {names.QUOTA_NAME_LABEL: "q"},
            "annotations": {names.PRIORITY_ANNOTATION: "1000000"},
        },
        "spec": {
            "parallelism": 1,
            "suspend": True,
            "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
        },
    }
    asked: list[str] = []

    def cap(j: Any) -> int | None:
        asked.append(json.dumps(j["metadata"]["labels"]))
        return 10

    jobs = JobExtensions(
        api,  # type: ignore[arg-type]
        adapters=registry.enabled_adapters(("job",)),
        units=dict,
        priority_classes=dict,
        events=Events(),  # type: ignore[arg-type]
        priority_cap=cap,
    )
    jobs.job_informers[("batch/v1", "Job")].objects["ns-a/pushy"] = job
    await jobs.reconcile(JobKey("batch/v1", "Job", "ns-a", "pushy"))
    created = [body for verb, _, body in api.writes if verb == "create"]
    assert [u["spec"]["priority"] for u in created] == [10]
    assert asked
