"""Builders and probes for the queue-level preemption tests (docs/compatibility.md#queue-level-preemption,
scenarios S3-S5 of docs/compatibility.md#scenario-list).

The tests drive the running reconciler only through the API, with bare QueueUnits: the consumer is
a kind no job extension handles, so the test plays the job extension itself by writing
``status.admissions`` through the status subresource (``running`` to report bound pods, shrunk
``replicas`` and no ``reclaimState`` to report a finished reclaim), as upstream's suites do.

:class:`Bench` binds an API client and a :class:`tests.kube.Recorder` (every version of every
QueueUnit of the namespace, in etcd order) to one test namespace. "Never marked" is asserted on
the recorded history, after a positive signal that the scheduler evaluated the preemptor and a
barrier that proves the recorder has caught up with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client as k8s

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import parse_time
from testenv.cluster import LocalCluster
from tests import kube
from tests.scenario import Scenario, admissions, condition, message, phase, status

Obj = dict[str, Any]
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
#: The phases a waiting (not admitted) unit may show.
WAITING = ("", names.Phase.ENQUEUED.value)
BOTH = {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", names.ENABLE_PREEMPTION_ANNOTATION: "true"}


# --- builders -------------------------------------------------------------------------------------


def unit(name: str, *, quota: str | None, cpu: str, priority: int) -> Obj:
    """A bare QueueUnit like upstream's fixture: one pod set named after the unit, count 1, a
    container requesting ``cpu``; ``spec.resource = spec.request = {cpu}``."""
    labels = {names.QUOTA_NAME_LABEL: quota} if quota is not None else {}
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "consumerRef": {"apiVersion": "example.com/v1", "kind": "BareJob", "name": name},
            "priority": priority,
            "resource": {"cpu": cpu},
            "request": {"cpu": cpu},
            "podSet": [
                {
                    "name": name,
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                            ]
                        }
                    },
                }
            ],
        },
    }


def quota(name: str, *, cpu: str, policy: str, annotations: Mapping[str, str]) -> Obj:
    """An ElasticQuota with min = max = ``cpu``, the policy label and ``koord-queue/*`` annotations."""
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": name,
            "labels": {
                names.QUOTA_PARENT_LABEL: "",
                "quota.scheduling.koordinator.sh/is-parent": "false",
                names.QUEUE_POLICY_LABEL: policy,
            },
            "annotations": dict(annotations),
        },
        "spec": {"min": {"cpu": cpu, "memory": "8Gi"}, "max": {"cpu": cpu, "memory": "8Gi"}},
    }


# --- reading a QueueUnit --------------------------------------------------------------------------


def replicas(obj: Mapping[str, Any]) -> int | None:
    adm = admissions(obj)
    return int(adm[0].get("replicas", 0)) if adm else None


def reclaim(obj: Mapping[str, Any]) -> int | None:
    """``status.admissions[0].reclaimState.replicas`` (``None``: absent)."""
    adm = admissions(obj)
    state = adm[0].get("reclaimState") if adm else None
    return None if state is None else int(state.get("replicas", 0))


def any_reclaim(obj: Mapping[str, Any]) -> bool:
    return any(a.get("reclaimState") is not None for a in admissions(obj))


def stamp(obj: Mapping[str, Any], field: str) -> float:
    value = parse_time(status(obj).get(field))
    assert value is not None, f"no {field} in {status(obj)}"
    return value


def is_admitted(obj: Mapping[str, Any]) -> bool:
    return phase(obj) == names.Phase.DEQUEUED and replicas(obj) == 1 and reclaim(obj) is None


def is_marked(obj: Mapping[str, Any]) -> bool:
    return reclaim(obj) == 1 and message(obj) == names.Message.RECLAIMING


# --- the bench ------------------------------------------------------------------------------------


class Bench(Scenario):
    """A :class:`Scenario` (one test namespace) plus the QueueUnit history of that namespace and the
    probes of the preemption tests."""

    def __init__(
        self, api: k8s.ApiClient, cluster: LocalCluster, recorder: kube.Recorder, namespace: str
    ) -> None:
        super().__init__(api, cluster, namespace)
        self.recorder = recorder

    # --- quotas and their Queues ---------------------------------------------------------------

    async def make_quota(
        self, suffix: str, *, cpu: str, policy: str = "Priority", annotations: Mapping[str, str] = BOTH
    ) -> str:
        """Create the ElasticQuota; wait until its Queue carries the policy and the annotations."""
        name = self.name(suffix)
        body = quota(name, cpu=cpu, policy=policy, annotations=annotations)
        await self.objects.create_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, self.ns, names.QUOTA_PLURAL, body
        )
        self._quotas.append(name)

        async def configured() -> Obj | None:
            got = await self.get_queue(name)
            if got is None or got["spec"].get("queuePolicy") != policy:
                return None
            have = got["metadata"].get("annotations") or {}
            return got if all(have.get(k) == v for k, v in annotations.items()) else None

        await kube.eventually(configured, what=f"Queue {name} ({policy}, {dict(annotations)})")
        return name

    # --- QueueUnits ------------------------------------------------------------------------------

    async def create(self, name: str, *, quota: str | None, cpu: str, priority: int) -> Obj:
        created: Obj = await self.objects.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            self.ns,
            names.QUEUEUNIT_PLURAL,
            unit(name, quota=quota, cpu=cpu, priority=priority),
        )
        return created

    async def get(self, name: str) -> Obj:
        return await self.get_unit(name)

    async def reclaim(self, name: str) -> Obj:
        """Play the job extension settling a reclaim: delete ``reclaimState.replicas`` unbound pods,
        report the reduced ``replicas`` and clear the reclaimState and the message (upstream's
        ``reclaim_reschedule_test``)."""

        def change(st: Obj) -> None:
            marked = [a for a in st.get("admissions") or [] if a.get("reclaimState") is not None]
            assert marked, f"{name} carries no reclaimState: {st}"
            for adm in marked:
                adm["replicas"] = max(0, adm["replicas"] - adm["reclaimState"]["replicas"])
                adm["running"] = min(adm.get("running", 0), adm["replicas"])
                adm.pop("reclaimState")
            st["message"] = ""

        return await self.update_status(name, change)

    async def wait(self, name: str, probe: Callable[[Obj], bool], *, what: str, timeout: float = 30.0) -> Obj:
        async def check() -> Obj | None:
            got = await self.get(name)
            return got if probe(got) else None

        return await kube.eventually(check, timeout=timeout, what=f"{self.ns}/{name}: {what}")

    async def admitted(self, name: str, *, timeout: float = 30.0) -> Obj:
        return await self.wait(name, is_admitted, what="Dequeued with replicas 1", timeout=timeout)

    async def parked(
        self, name: str, probe: Callable[[str], bool], *, what: str, timeout: float = 30.0
    ) -> Obj:
        """Wait for the scheduler's positive "I evaluated you": a waiting unit with that message."""
        return await self.wait(
            name, lambda u: phase(u) in WAITING and probe(message(u)), what=what, timeout=timeout
        )

    # --- events ----------------------------------------------------------------------------------

    async def events(
        self, name: str, *, namespace: str | None = None, kind: str | None = "QueueUnit"
    ) -> list[Any]:
        return await super().events(name, namespace=namespace, kind=kind)

    async def event(self, name: str, reason: str, *, type_: str, timeout: float = 30.0) -> Any:
        return await self.wait_event(name, reason, type_=type_, kind="QueueUnit", timeout=timeout)

    # --- the recorded history --------------------------------------------------------------------

    def history(self, name: str) -> list[Obj]:
        return self.recorder.versions(name)

    def index(self, name: str, probe: Callable[[Obj], bool], *, after: int | None = None) -> int | None:
        """Position in the global etcd order of the first recorded version of ``name`` matching
        ``probe`` (after position ``after``, if given)."""
        for i, (_, obj) in enumerate(self.recorder.seen):
            if after is not None and i <= after:
                continue
            if obj["metadata"]["name"] == name and probe(obj):
                return i
        return None

    async def caught_up(self) -> None:
        """Barrier: every QueueUnit change made before this call is in the recorder afterwards
        (the recorder holds the current version of every unit; etcd order does the rest)."""
        await self.recorder.sync()

    def assert_never_marked(self, name: str) -> None:
        versions = self.history(name)
        assert versions, f"nothing recorded for {name}"
        marked = [status(v) for v in versions if any_reclaim(v)]
        assert not marked, f"{name} was marked for reclaim: {marked}"
        assert all(message(v) != names.Message.RECLAIMING for v in versions), versions
        assert all(condition(v, names.ConditionType.EVICTED) is None for v in versions), versions

    # --- cleanup ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def bench(cluster: LocalCluster, namespace: str) -> AsyncIterator[Bench]:
    async with kube.client(cluster) as api, kube.Recorder(cluster, UNITS, namespace) as recorder:
        it = Bench(api, cluster, recorder, namespace)
        try:
            yield it
        finally:
            await it.cleanup()
