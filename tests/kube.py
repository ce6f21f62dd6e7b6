"""Test helpers that talk to the real apiserver: an async client, kubectl, polling with a deadline.

Tests wait for outcomes with :func:`eventually`, never with fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import binaries
from testenv.cluster import LocalCluster

T = TypeVar("T")


@contextlib.asynccontextmanager
async def client(cluster: LocalCluster) -> AsyncIterator[k8s.ApiClient]:
    api = await k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    async with api:
        yield api


async def create_namespace(api: k8s.ApiClient, name: str) -> None:
    await k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))


async def delete_namespace(api: k8s.ApiClient, name: str) -> None:
    with contextlib.suppress(k8s.ApiException):
        await k8s.CoreV1Api(api).delete_namespace(name)


def kubectl(
    cluster: LocalCluster, *args: str, input_text: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the real kubectl against the cluster; returns the completed process (text)."""
    return subprocess.run(
        [str(binaries.kubectl()), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=input_text,
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Await ``probe`` until it returns something truthy, or fail after ``timeout`` seconds.

    The last value (or exception) seen is put in the failure message, so a timeout says why.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = value
        except AssertionError as err:
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


async def get_custom(
    api: k8s.ApiClient, group: str, version: str, namespace: str, plural: str, name: str
) -> dict[str, Any]:
    result: dict[str, Any] = await custom(api).get_namespaced_custom_object(
        group, version, namespace, plural, name
    )
    return result


class Recorder:
    """Every version of every object of one resource, in etcd order, from a watch.

    The resourceVersion is taken before the caller creates anything, so the watch replays every
    change from then on, however late its request reaches the apiserver; per-object histories
    (``versions``) and global order (``seen``) are both kept.

    A watch trails the API, and a test that waited on something else (a GET, kubectl, another
    watch) has no reason to believe this one has caught up. So a test never reads the record
    after waiting elsewhere: it waits on the record itself (:meth:`until`), or on the versions the
    record must contain (:meth:`sync`). Leaving the ``async with`` block syncs before the watch
    stops, so a history read after the block holds everything up to the block's end.
    """

    def __init__(self, cluster: LocalCluster, resource: object, namespace: str | None = None) -> None:
        self.cluster = cluster
        self.resource = resource
        self.namespace = namespace
        self.seen: list[tuple[str, dict[str, Any]]] = []
        #: the objects of ``seen`` that are not deletions, in the same order (what ``unit_versions``
        #: hands out: a live list the caller may poll)
        self.objects: list[dict[str, Any]] = []
        self._versions: set[str] = set()
        self._last: dict[str, str] = {}  # uid -> the kind of the last event recorded for it
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None

    async def __aenter__(self) -> Recorder:
        from koord_queue.shared import kube as kq

        self._client = await kq.Kube.connect(kubeconfig=str(self.cluster.kubeconfig))
        present, rv = await self._client.list(self.resource, namespace=self.namespace)
        # What exists before the record starts is not a change to record, but it is a version the
        # record holds: ``sync`` must not wait for an object untouched since, and a deletion of
        # one must be awaited like any other.
        for obj in present:
            meta = obj.get("metadata") or {}
            self._versions.add(str(meta.get("resourceVersion", "")))
            self._last[str(meta.get("uid", ""))] = "LISTED"

        async def follow() -> None:
            nonlocal rv
            while True:
                async for kind, obj in self._client.watch(
                    self.resource, namespace=self.namespace, resource_version=rv
                ):
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion", rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._record(kind, obj)

        self._task = asyncio.create_task(follow())
        return self

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.seen.append((kind, obj))
        if kind != "DELETED":
            self.objects.append(obj)
        self._versions.add(str(meta.get("resourceVersion", "")))
        self._last[str(meta.get("uid", ""))] = kind
        self._changed.set()

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        assert self._task is not None
        try:
            if exc_type is None:
                await self.sync()
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._client.close()

    async def _wait(self, check: Callable[[], T | None], *, what: str, timeout: float) -> T:
        """Wake on every recorded event until ``check`` returns something truthy; fail on the
        deadline, or at once if the watch itself died (its error, not a timeout, is the cause)."""
        assert self._task is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._changed.clear()
            found = check()
            if found:
                return found
            if self._task.done():
                raise AssertionError(f"the watch of {what} stopped: {self._task.exception()!r}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what} in the watch")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def until(
        self,
        name: str,
        probe: Callable[[dict[str, Any]], bool],
        *,
        what: str = "a matching version",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """The first recorded version of ``name`` for which ``probe`` holds, waiting for it."""

        def check() -> dict[str, Any] | None:
            return next((o for o in self.versions(name) if probe(o)), None)

        try:
            return await self._wait(check, what=f"{name}: {what}", timeout=timeout)
        except AssertionError as err:
            history = [o.get("status") for o in self.versions(name)]
            raise AssertionError(f"{err}; recorded statuses of {name}: {history}") from None

    async def sync(self, *, timeout: float = 30.0) -> None:
        """Wait until the record holds the API's present: the exact current version of every
        object a fresh list returns, and the deletion of every recorded object it no longer has.

        Only versions are compared (resourceVersions are opaque); a watch delivers in etcd order,
        so holding the newest version of each listed object means holding everything before it.
        """
        items, _ = await self._client.list(self.resource, namespace=self.namespace)
        wanted = {str(o["metadata"]["resourceVersion"]) for o in items}
        live = {str(o["metadata"]["uid"]) for o in items}

        def caught_up() -> bool:
            gone = {uid for uid, kind in self._last.items() if kind != "DELETED" and uid not in live}
            return wanted <= self._versions and not gone

        await self._wait(caught_up, what=f"the {len(wanted)} current version(s)", timeout=timeout)

    def versions(self, name: str) -> list[dict[str, Any]]:
        return [obj for _, obj in self.seen if obj["metadata"]["name"] == name]


@contextlib.asynccontextmanager
async def unit_versions(cluster: LocalCluster, namespace: str) -> AsyncIterator[list[dict[str, Any]]]:
    """Every version of every QueueUnit in ``namespace``, in order, transient states included: a
    live list (a :class:`Recorder`'s ``objects``) that a test polls with :func:`eventually`.

    A poll could miss a reclaimState or a TimeoutBackoff that lasts a moment; the watch cannot.
    """
    units = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
    async with Recorder(cluster, units, namespace=namespace) as recorder:
        yield recorder.objects


@contextlib.contextmanager
def runtime_class(cluster: LocalCluster, name: str, pod_fixed: dict[str, str]) -> Iterator[str]:
    """A RuntimeClass (cluster-scoped, handler ``runc``) with ``pod_fixed`` overhead, applied as an
    admin would and deleted afterwards."""
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": "runc",
        "overhead": {"podFixed": pod_fixed},
    }
    kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(body))
    try:
        yield name
    finally:
        kubectl(cluster, "delete", "runtimeclass", name, "--ignore-not-found")


def limit_range(namespace: str, default_request: dict[str, str]) -> dict[str, Any]:
    """A LimitRange giving containers of ``namespace`` ``default_request`` and no default limit (a
    default limit would also cap containers that ask for more than it, and their pods be refused)."""
    item = {"type": "Container", "defaultRequest": dict(default_request)}
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "defaults", "namespace": namespace},
        "spec": {"limits": [item]},
    }


def events_of(cluster: LocalCluster, namespace: str, name: str, *, kind: str = "Job") -> list[dict[str, Any]]:
    """The events about one object (``kind``/``name`` in ``namespace``), through the real kubectl."""
    selector = f"involvedObject.name={name},involvedObject.kind={kind}"
    out = kubectl(cluster, "get", "events", "-n", namespace, "--field-selector", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def apply_quota(cluster: LocalCluster, name: str, namespace: str, *, cpu: str) -> None:
    """``kubectl apply`` an ElasticQuota with ``min == max == cpu`` (the shape most tests want)."""
    quota = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"max": {"cpu": cpu}, "min": {"cpu": cpu}},
    }
    kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(quota))
