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

from shared import kube as kq
from shared.api import names
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
    """

    def __init__(self, cluster: LocalCluster, resource: object, namespace: str | None = None) -> None:
        self.cluster = cluster
        self.resource = resource
        self.namespace = namespace
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None

    async def __aenter__(self) -> Recorder:
        from shared import kube as kq

        self._client = await kq.Kube.connect(kubeconfig=str(self.cluster.kubeconfig))
        _, rv = await self._client.list(self.resource, namespace=self.namespace)

        async def follow() -> None:
            while True:
                nonlocal rv
                async for kind, obj in self._client.watch(
                    self.resource, namespace=self.namespace, resource_version=rv
                ):
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.seen.append((kind, obj))

        self._task = asyncio.create_task(follow())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._client.close()

    def versions(self, name: str) -> list[dict[str, Any]]:
        return [obj for _, obj in self.seen if obj["metadata"]["name"] == name]


@contextlib.asynccontextmanager
async def unit_versions(cluster: LocalCluster, namespace: str) -> AsyncIterator[list[dict[str, Any]]]:
    """Every version of every QueueUnit in ``namespace``, in order, transient states included.

    The resourceVersion is taken before the caller creates anything, so the watch replays every
    change from then on, however late its request reaches the apiserver (a poll could miss a
    reclaimState or a TimeoutBackoff that lasts a moment).
    """
    units = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
    seen: list[dict[str, Any]] = []
    api = await kq.Kube.connect(kubeconfig=str(cluster.kubeconfig))
    _, rv = await api.list(units, namespace=namespace)

    async def follow() -> None:
        async for kind, obj in api.watch(units, namespace=namespace, resource_version=rv):
            if kind in ("ADDED", "MODIFIED"):
                seen.append(obj)

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


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
