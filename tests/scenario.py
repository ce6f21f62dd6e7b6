"""One helper for the integration and e2e tests that drive the running system through the API.

:class:`Scenario` binds an API client to the test's namespace and does what the tests do as an
admin or as a controller: submit jobs with kubectl as a user would (``submit``/``apply``) and read
them back, create bare QueueUnits and play the job extension or an admission-check controller by
patching ``status`` through the status subresource (the scenario tests,
docs/compatibility.md#acceptance-scenarios, with bare QueueUnits as
docs/architecture.md#decision-8-the-queueunit-api-stands-on-its-own allows), wait for a unit's phase
or message, find events, create and resize quotas (waiting for the Queue each gets), hand-made
Queues and PriorityClasses, read the reconciler's metrics, and list a job's pods.

:func:`scenario` yields one that deletes on exit what the test made: without a controller-manager
(integration) a deleted namespace never empties, so jobs, units, quotas, Queues and PriorityClasses
would otherwise outlive the test and keep the reconciler busy. Quotas, Queues and PriorityClasses
are keyed by name cluster-wide, so :meth:`Scenario.name` derives names from the namespace.

* :func:`unit`, :func:`quota` and :func:`queue` build objects (fluent keyword builders);
* :func:`status`, :func:`phase`, :func:`message`, :func:`condition`, :func:`admissions` and
  :func:`check_states` read them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s

from koord_queue.shared.api import names
from testenv import scraping
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
    resources: Mapping[str, str] | None = None,
    parent: str | None = None,
    policy: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """An ElasticQuota with min = max = ``cpu`` (docs/compatibility.md#common-fixture), or min = max
    = ``resources`` when given."""
    limits = dict(resources) if resources is not None else {"cpu": cpu}
    all_labels = dict(labels or {})
    if parent is not None:
        all_labels[names.QUOTA_PARENT_LABEL] = parent
    if policy is not None:
        all_labels[names.QUEUE_POLICY_LABEL] = policy
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "labels": all_labels, "annotations": dict(annotations or {})},
        "spec": {"min": limits, "max": dict(limits)},
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


def gated(pod: Any) -> bool:
    """The pod (a kubernetes_asyncio ``V1Pod``) still carries koord-queue's scheduling gate."""
    return any(g.name == names.ADMISSION_GATE for g in pod.spec.scheduling_gates or [])


class Scenario:
    """An API client bound to one test namespace, with the operations the tests need.

    ``explain_with_pods``: where pods run (e2e), a unit that does not reach the state waited for is
    reported with its job's pods (a batch Job's unit has the Job's name).
    """

    def __init__(
        self, api: k8s.ApiClient, cluster: LocalCluster, namespace: str, *, explain_with_pods: bool = False
    ) -> None:
        self.api = api
        self.cluster = cluster
        self.ns = namespace
        self.explain_with_pods = explain_with_pods
        self.objects = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self._jobs: list[tuple[str, str]] = []  # (kubectl resource, name)
        self._quotas: list[str] = []
        self._queues: list[str] = []
        self._priority_classes: list[str] = []

    def name(self, suffix: str) -> str:
        """A cluster-wide unique name for this test (quotas, Queues and PriorityClasses are keyed by
        name)."""
        return f"{self.ns}-{suffix}"

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> Any:
        return kube.kubectl(self.cluster, *args, input_text=input_text, check=check)

    # --- jobs --------------------------------------------------------------------------------

    @staticmethod
    def resource(obj: Mapping[str, Any]) -> str:
        """kubectl's fully qualified resource of a job object (``jobs.v1.batch``)."""
        group, _, version = obj["apiVersion"].rpartition("/")
        return f"{obj['kind'].lower()}s.{version}.{group or 'batch'}"

    def apply(self, obj: Obj) -> None:
        """``kubectl apply`` exactly as a user would; the job is deleted when the scenario ends."""
        self.kubectl("apply", "-n", self.ns, "-f", "-", input_text=yaml.safe_dump(obj))
        self.remember(obj)

    def submit(self, obj: Obj) -> Obj:
        """:meth:`apply`, then return the job as stored (held by the webhook)."""
        self.apply(obj)
        return self.get_job_sync(obj)

    def remember(self, obj: Obj) -> None:
        """Delete ``obj`` when the scenario ends."""
        self._jobs.append((self.resource(obj), obj["metadata"]["name"]))

    def get_job_sync(self, obj: Mapping[str, Any]) -> Obj:
        out = self.kubectl("get", "-n", self.ns, self.resource(obj), obj["metadata"]["name"], "-o", "json")
        result: Obj = json.loads(out.stdout)
        return result

    async def get_job(self, job: Mapping[str, Any] | str) -> Obj:
        """The job as stored; ``job`` is the object submitted, or the name of a ``batch/v1`` Job."""
        if isinstance(job, str):
            group, version, plural, name = "batch", "v1", "jobs", job
        else:
            group, _, version = job["apiVersion"].rpartition("/")
            group, plural, name = group or "batch", job["kind"].lower() + "s", job["metadata"]["name"]
        got: Obj = await self.objects.get_namespaced_custom_object(group, version, self.ns, plural, name)
        return got

    async def wait_job(self, job: Mapping[str, Any] | str, probe: Callable[[Obj], bool], *, what: str) -> Obj:
        async def check() -> Obj | None:
            got = await self.get_job(job)
            return got if probe(got) else None

        shown = f"Job {job}" if isinstance(job, str) else f"{job['kind']} {job['metadata']['name']}"
        return await kube.eventually(check, what=f"{shown} in {self.ns}: {what}")

    async def pods(self, job_name: str) -> list[Any]:
        """The pods of the ``batch/v1`` Job ``job_name``."""
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

    async def find_unit(self, name: str) -> Obj | None:
        """The unit, or None when it does not exist."""
        try:
            return await self.get_unit(name)
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise

    async def list_units(self) -> list[Obj]:
        out = await self.objects.list_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL
        )
        return list(out["items"])

    async def delete_unit(self, name: str) -> None:
        await self.objects.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, name
        )

    async def _merge_patch(
        self, group: str, version: str, namespace: str, plural: str, name: str, patch: Obj
    ) -> Obj:
        out: Obj = await self.objects.patch_namespaced_custom_object(
            group, version, namespace, plural, name, patch, _content_type=MERGE
        )
        return out

    async def patch_unit(self, name: str, patch: Obj) -> Obj:
        """A merge patch of the unit's spec or metadata (what a user or a job controller does)."""
        return await self._merge_patch(
            names.GROUP, names.VERSION, self.ns, names.QUEUEUNIT_PLURAL, name, patch
        )

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
        self,
        name: str,
        probe: Callable[[Obj], bool] = lambda _: True,
        *,
        what: str = "exists",
        timeout: float = 30.0,
    ) -> Obj:
        """Wait until the unit exists and ``probe`` holds; a timeout shows its last status."""

        async def check() -> Obj | None:
            got = await self.find_unit(name)
            assert got is not None, "no such QueueUnit"
            if not probe(got):
                if self.explain_with_pods:
                    pods = [
                        (p.metadata.name, p.spec.node_name, gated(p), p.status.phase)
                        for p in await self.pods(name)
                    ]
                    raise AssertionError(
                        f"status: {got.get('status')}; pods (name, node, gated, phase): {pods}"
                    )
                raise AssertionError(f"status: {got.get('status')}")
            return got

        return await kube.eventually(check, timeout=timeout, what=f"QueueUnit {self.ns}/{name}: {what}")

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
        return await self._merge_patch(
            names.QUOTA_GROUP, names.QUOTA_VERSION, self.ns, names.QUOTA_PLURAL, name, patch
        )

    async def delete_quota(self, name: str) -> None:
        await self.objects.delete_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, self.ns, names.QUOTA_PLURAL, name
        )

    async def add_quota(
        self,
        name: str,
        resources: Mapping[str, str],
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Obj:
        """Create the ElasticQuota ``name`` with min = max = ``resources`` and wait for its Queue."""
        body = quota(name, resources=resources, labels=labels, annotations=annotations)
        return await self.create_quota(body)

    async def resize_quota(self, name: str, resources: Mapping[str, str]) -> Obj:
        """Set min = max = ``resources``."""
        return await self.patch_quota(name, {"spec": {"min": dict(resources), "max": dict(resources)}})

    async def create_queue(self, body: Obj) -> Obj:
        """Create a hand-made Queue (deleted when the scenario ends)."""
        created: Obj = await self.objects.create_namespaced_custom_object(
            names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, body
        )
        self._queues.append(body["metadata"]["name"])
        return created

    async def patch_queue(self, name: str, patch: Obj) -> Obj:
        return await self._merge_patch(
            names.GROUP, names.VERSION, names.COMPONENT_NAMESPACE, names.QUEUE_PLURAL, name, patch
        )

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

    # --- PriorityClasses --------------------------------------------------------------------

    def create_priority_class(self, name: str, value: int) -> None:
        """Create a PriorityClass (deleted when the scenario ends)."""
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        self.kubectl("create", "-f", "-", input_text=yaml.safe_dump(body))
        self._priority_classes.append(name)

    # --- metrics -----------------------------------------------------------------------------

    def metric(self, port: int, name: str, labels: Mapping[str, str]) -> float:
        """A sample from the reconciler's /metrics (0 when the series does not exist yet)."""
        text = scraping.metrics_text(port)  # as the local system's scraper (docs/operations.md#metrics)
        for line in text.splitlines():
            if not line.startswith(name + "{"):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
        return 0.0

    # --- cleanup -----------------------------------------------------------------------------

    async def cleanup(self) -> None:
        # Jobs first: while a job exists the reconciler would re-create its unit.
        for resource, name in self._jobs:
            self.kubectl("delete", "-n", self.ns, resource, name, "--ignore-not-found", "--wait=false")
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
        for name in self._priority_classes:
            self.kubectl("delete", "priorityclass", name, "--ignore-not-found", "--wait=false")


@contextlib.asynccontextmanager
async def scenario(cluster: LocalCluster, namespace: str) -> AsyncIterator[Scenario]:
    """A :class:`Scenario` that deletes what the test made when it ends."""
    async with kube.client(cluster) as api:
        sc = Scenario(api, cluster, namespace)
        try:
            yield sc
        finally:
            await sc.cleanup()


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
