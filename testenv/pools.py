"""kwok GPU pools: fake GPU nodes and the ElasticQuotaProfiles that make them pools
(docs/pools.md#pools-are-elasticquotaprofiles).

One string describes every pool, as ``make run`` reads it from ``KWOK_GPU_POOLS``::

    h100:4x8:taint,a100:4x8,l4:4x4

is three pools: ``h100`` of 4 nodes with 8 GPUs each, its nodes tainted so that only pods the
queue places there (with the pool's toleration) run on them; ``a100`` of 4 x 8; ``l4`` of 4 x 4.
Each node carries the labels a GPU node of that kind carries in a real cluster
(``nvidia.com/gpu.product``) and ``koord-queue.io/pool: <name>``, and allocates
``nvidia.com/gpu`` (an extended resource) beside cpu, memory and pods, so the real kube-scheduler
counts GPUs exactly as on real nodes. Each pool gets one ElasticQuotaProfile (resource keys cpu,
memory and nvidia.com/gpu) whose root quota the reconciler keeps; team quotas join a pool by
naming that root (:attr:`Pool.root_quota`) as their parent.

The benchmarks and the e2e tests build pools with the same functions, so what ``make run`` shows
is what they measure.
"""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from testenv import kwok
from testenv.cluster import LocalCluster
from testenv.processes import wait_until

ENV_VAR: Final = "KWOK_GPU_POOLS"
GPU: Final = "nvidia.com/gpu"
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
POOL_LABEL: Final = "koord-queue.io/pool"
#: where ``make run`` and the tests keep the profiles (and so the pools' root quotas)
NAMESPACE: Final = "gpu-pools"
PROFILE_API_VERSION: Final = "quota.koordinator.sh/v1alpha1"
PROFILE_PLURAL: Final = "elasticquotaprofiles"
RESOURCE_KEYS_ANNOTATION: Final = "quota.scheduling.koordinator.sh/resource-keys"
RESOURCE_KEYS: Final = ("cpu", "memory", GPU)
#: the product label of the GPU names people write; any other name gets ``NVIDIA-<NAME>``
PRODUCTS: Final = {
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "a100": "NVIDIA-A100-SXM4-80GB",
    "l4": "NVIDIA-L4",
    "l40s": "NVIDIA-L40S",
    "t4": "Tesla-T4",
}


@dataclass(frozen=True)
class Pool:
    """One pool: ``nodes`` fake nodes of ``gpus`` GPUs each; ``tainted`` nodes keep out every pod
    that does not tolerate ``nvidia.com/gpu.product=<product>:NoSchedule``."""

    name: str
    nodes: int
    gpus: int
    tainted: bool = False

    @property
    def product(self) -> str:
        return PRODUCTS.get(self.name.lower(), f"NVIDIA-{self.name.upper()}")

    @property
    def root_quota(self) -> str:
        """The root quota of the pool's tree, kept by the reconciler (docs/pools.md#the-tree-of-a-pool)."""
        return f"{self.name}-root"

    @property
    def match_labels(self) -> dict[str, str]:
        """The profile's node selector: the product, and the pool label so that two pools of one
        product stay apart."""
        return {PRODUCT_LABEL: self.product, POOL_LABEL: self.name}

    @property
    def taints(self) -> list[dict[str, str]]:
        if not self.tainted:
            return []
        return [{"key": PRODUCT_LABEL, "value": self.product, "effect": "NoSchedule"}]

    def node_name(self, i: int) -> str:
        return f"kwok-{self.name}-{i}"

    @property
    def node_names(self) -> list[str]:
        return [self.node_name(i) for i in range(self.nodes)]

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus


def parse(text: str) -> tuple[Pool, ...]:
    """``name:NODESxGPUS[:taint]`` items, comma separated; a blank string is no pool. Raises
    ValueError naming the item that cannot be read, so ``make run`` stops before starting anything."""
    pools: list[Pool] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        parts = [p.strip() for p in item.split(":")]
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "taint"):
            raise ValueError(f"{ENV_VAR}: {item!r} is not name:NODESxGPUS[:taint]")
        name, shape = parts[0], parts[1]
        nodes_text, sep, gpus_text = shape.lower().partition("x")
        if not name or not sep or not nodes_text.isdigit() or not gpus_text.isdigit():
            raise ValueError(f"{ENV_VAR}: {item!r} is not name:NODESxGPUS[:taint]")
        if not all(c.isalnum() or c == "-" for c in name) or name != name.lower():
            raise ValueError(f"{ENV_VAR}: pool name {name!r} must be lower-case letters, digits and '-'")
        if any(p.name == name for p in pools):
            raise ValueError(f"{ENV_VAR}: pool {name!r} is given twice")
        pools.append(Pool(name, int(nodes_text), int(gpus_text), tainted=len(parts) == 3))
    return tuple(pools)


def node(pool: Pool, i: int, *, cpu: str, memory: str, pods: str = "110") -> dict[str, Any]:
    """A kwok node of the pool: labelled, tainted when the pool is, with its GPUs allocatable."""
    body = kwok.node(pool.node_name(i), cpu=cpu, memory=memory, pods=pods)
    body["metadata"]["labels"].update(pool.match_labels)
    if pool.taints:
        body["spec"]["taints"] = pool.taints
    resources = {**body["status"]["allocatable"], GPU: str(pool.gpus)}
    body["status"] = {"capacity": resources, "allocatable": resources}
    return body


def profile(pool: Pool, *, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The pool's ElasticQuotaProfile, as docs/pools.md#pools-are-elasticquotaprofiles writes one."""
    return {
        "apiVersion": PROFILE_API_VERSION,
        "kind": "ElasticQuotaProfile",
        "metadata": {
            "name": pool.name,
            "namespace": namespace,
            "annotations": {RESOURCE_KEYS_ANNOTATION: json.dumps(list(RESOURCE_KEYS), separators=(",", ":"))},
        },
        "spec": {"quotaName": pool.root_quota, "nodeSelector": {"matchLabels": pool.match_labels}},
    }


def _create(cluster: LocalCluster, path: str, body: dict[str, Any]) -> None:
    """POST, taking an object that exists already as done (``make run`` restarts keep nothing,
    but a test may create the same pools twice)."""
    try:
        cluster.request("POST", path, body)
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise


def create(
    cluster: LocalCluster,
    pools: Sequence[Pool],
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: str = "110",
    namespace: str = NAMESPACE,
    kwok: bool = True,
    timeout: float = 120.0,
) -> None:
    """Create every pool's nodes (and wait until kwok has them Ready) and its profile.

    ``kwok=False`` is for a control plane without kwok (the integration profile, the comparable
    benchmarks): the nodes are API objects only, written Ready here since nothing else would, and
    never run a pod. The profiles need their CRD (``system.install_crds``); the root quotas come
    from the reconciler, so a caller that needs them waits with :func:`wait_roots` once it runs.
    """
    for pool in pools:
        for i in range(pool.nodes):
            body = node(pool, i, cpu=cpu, memory=memory, pods=pods)
            _create(cluster, "/api/v1/nodes", body)
            status = dict(body["status"])
            if not kwok:
                status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            # The create drops status; capacity goes through the status subresource.
            cluster.request(
                "PATCH",
                f"/api/v1/nodes/{pool.node_name(i)}/status",
                {"status": status},
                content_type="application/merge-patch+json",
            )
    names = [n for pool in pools for n in pool.node_names]
    wait_until(
        lambda: all(cluster.node_ready(n) for n in names),
        timeout=timeout,
        what=f"{len(names)} GPU nodes Ready",
    )
    if pools:
        _create(
            cluster,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    group_version = PROFILE_API_VERSION
    for pool in pools:
        _create(
            cluster,
            f"/apis/{group_version}/namespaces/{namespace}/{PROFILE_PLURAL}",
            profile(pool, namespace=namespace),
        )


def root_gpus(cluster: LocalCluster, pool: Pool, *, namespace: str = NAMESPACE) -> str | None:
    """The ``nvidia.com/gpu`` of the pool's root quota's ``min`` (None while there is no root)."""
    path = f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{namespace}/elasticquotas/{pool.root_quota}"
    try:
        quota = json.loads(cluster.request("GET", path))
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    value = ((quota.get("spec") or {}).get("min") or {}).get(GPU)
    return None if value is None else str(value)


def wait_roots(
    cluster: LocalCluster, pools: Sequence[Pool], *, namespace: str = NAMESPACE, timeout: float = 60.0
) -> None:
    """Wait until the reconciler keeps every pool's root quota with all its nodes' GPUs."""
    wait_until(
        lambda: all(root_gpus(cluster, p, namespace=namespace) == str(p.total_gpus) for p in pools),
        timeout=timeout,
        what=f"root quotas of {[p.name for p in pools]} holding their GPUs",
    )
