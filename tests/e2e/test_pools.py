"""Three GPU pools on kwok nodes, end to end with the real kube-scheduler and controller-manager
(docs/pools.md).

Pools (testenv/pools.py): ``h100`` 2 nodes x 4 GPUs, tainted; ``a100`` 2 x 4; ``l4`` 2 x 2. Quotas in
one namespace: ``team-h100``, ``team-a100``, ``team-l4`` inside each pool's tree (4 GPUs each), and
``team-fb`` outside every tree (6 GPUs in all) with ``koord-queue/pool-quotas: fb-h100, fb-a100``
(4 GPUs each, inside the h100 and a100 trees). Every pod asks for 1 ``nvidia.com/gpu``; the jobs:

* labelled with a tree quota directly (some of two pods): they run in that quota's pool;
* labelled ``team-fb``: h100 first, a100 when h100's route has no room;
* ``team-fb`` with a nodeSelector asking for A100s: h100 contradicts it and is skipped;
* ``team-fb`` with ``koord-queue/pools: a100``: never h100; with ``a100, h100``: either.

Watched from the start (pods and units, each version stamped on arrival):

* every pod is released (its admission gate gone) in one write that also carries its pool's node
  selector and, on the tainted pool, the pool's toleration; it is bound within 10 s of that
  release, to a node of the pool its unit's ``status.pool`` names;
* at every change, the GPUs of released, unfinished pods and the GPUs admitted to units stay within
  every cap: each team quota, ``team-fb`` across pools, each of its pool routes, each pool;
* ``kubectl get queueunit -o wide`` shows a running unit's pool.

The module runs its own control plane (no nodes but the pools'), so no other test's nodes or
quotas interfere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from testenv import pools, system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube

pytestmark = pytest.mark.e2e

NAMESPACE = "gpu-teams"
POOLS = pools.parse("h100:2x4:taint,a100:2x4,l4:2x2")
BY_NAME = {p.name: p for p in POOLS}
BIND_WITHIN_S = 10.0
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
JOBS = kq.Resource("batch", "v1", "jobs", "Job")
FALLBACK = "team-fb"
#: quota -> (parent, GPUs); a parent "" is no tree
QUOTAS: dict[str, tuple[str, int]] = {
    "team-h100": ("h100-root", 4),
    "team-a100": ("a100-root", 4),
    "team-l4": ("l4-root", 4),
    "fb-h100": ("h100-root", 4),
    "fb-a100": ("a100-root", 4),
    FALLBACK: ("", 6),
}
#: the pool each tree quota belongs to
QUOTA_POOL = {"team-h100": "h100", "team-a100": "a100", "team-l4": "l4", "fb-h100": "h100", "fb-a100": "a100"}
SENTINEL = "l4-hold"


@dataclass(frozen=True)
class JobCase:
    name: str
    quota: str
    #: the pools it may land in
    allowed: frozenset[str]
    pods: int = 1
    node_selector: dict[str, str] | None = None
    pools_annotation: str | None = None
    run_for: str | None = None


def _cases() -> list[JobCase]:
    a100_product = BY_NAME["a100"].product
    cases = [JobCase(f"h-{i}", "team-h100", frozenset({"h100"})) for i in range(6)]
    cases += [JobCase(f"a-{i}", "team-a100", frozenset({"a100"}), pods=2 if i < 3 else 1) for i in range(6)]
    cases += [JobCase(f"l-{i}", "team-l4", frozenset({"l4"})) for i in range(4)]
    cases.append(JobCase(SENTINEL, "team-l4", frozenset({"l4"}), run_for="1h"))
    cases += [JobCase(f"f-{i}", FALLBACK, frozenset({"h100", "a100"})) for i in range(8)]
    cases += [
        JobCase(f"fs-{i}", FALLBACK, frozenset({"a100"}), node_selector={pools.PRODUCT_LABEL: a100_product})
        for i in range(3)
    ]
    cases += [JobCase(f"fp-{i}", FALLBACK, frozenset({"a100"}), pools_annotation="a100") for i in range(3)]
    cases += [
        JobCase(f"fr-{i}", FALLBACK, frozenset({"a100", "h100"}), pools_annotation="a100, h100")
        for i in range(2)
    ]
    return cases


CASES = _cases()
BY_JOB = {c.name: c for c in CASES}


def quota_body(name: str, parent: str, gpus: int) -> dict[str, Any]:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    annotations = {names.POOL_QUOTAS_ANNOTATION: "fb-h100, fb-a100"} if name == FALLBACK else {}
    room = {pools.GPU: str(gpus)}
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels, "annotations": annotations},
        "spec": {"min": room, "max": room},
    }


def job_body(case: JobCase) -> dict[str, Any]:
    gpu = {"cpu": "100m", "memory": "64Mi", pools.GPU: "1"}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "busybox:stable",
                "command": ["sleep", "5"],
                "resources": {"requests": gpu, "limits": {pools.GPU: "1"}},
            }
        ],
    }
    if case.node_selector:
        spec["nodeSelector"] = dict(case.node_selector)
    template: dict[str, Any] = {"spec": spec}
    if case.run_for:
        template["metadata"] = {"annotations": {COMPLETE_DELAY_ANNOTATION: case.run_for}}
    meta: dict[str, Any] = {"name": case.name, "labels": {names.QUOTA_NAME_LABEL: case.quota}}
    if case.pools_annotation:
        meta["annotations"] = {names.POOLS_ANNOTATION: case.pools_annotation}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"parallelism": case.pods, "completions": case.pods, "backoffLimit": 0, "template": template},
    }


def node_pool(node_name: str) -> str:
    return next((p.name for p in POOLS if node_name in p.node_names), "")


def gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == names.ADMISSION_GATE for g in pod["spec"].get("schedulingGates") or [])


def job_of(pod: dict[str, Any]) -> str:
    labels = pod["metadata"].get("labels") or {}
    return str(labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or "")


def caps() -> dict[str, int]:
    """Every cap the GPUs in use must stay within, by the key :meth:`Observer.usage` counts under."""
    out = {f"quota {q}": gpus for q, (_, gpus) in QUOTAS.items()}
    out.update({f"pool {p.name}": p.total_gpus for p in POOLS})
    return out


@dataclass
class Observer:
    """Pods and units of the namespace from two watches, each version stamped when it arrived; the
    GPUs in use are recomputed at every event and their peaks kept."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    units: dict[str, dict[str, Any]] = field(default_factory=dict)
    released_at: dict[str, float] = field(default_factory=dict)
    first_released: dict[str, dict[str, Any]] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)
    unit_pools: dict[str, set[str]] = field(default_factory=dict)
    peaks_pods: Counter[str] = field(default_factory=Counter)
    peaks_units: Counter[str] = field(default_factory=Counter)

    def pod(self, obj: dict[str, Any], kind: str) -> None:
        name = obj["metadata"]["name"]
        now = time.monotonic()
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = obj
        if not gated(obj) and name not in self.released_at:
            self.released_at[name] = now
            self.first_released[name] = obj
        if obj["spec"].get("nodeName") and name not in self.bound_at:
            self.bound_at[name] = now
        self._peak(self.peaks_pods, self.pod_usage())

    def unit(self, obj: dict[str, Any], kind: str) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.units.pop(name, None)
        else:
            self.units[name] = obj
        pool = (obj.get("status") or {}).get("pool")
        if pool:
            self.unit_pools.setdefault(name, set()).add(str(pool))
        self._peak(self.peaks_units, self.unit_usage())

    @staticmethod
    def _peak(peaks: Counter[str], usage: Counter[str]) -> None:
        for key, value in usage.items():
            peaks[key] = max(peaks[key], value)

    @staticmethod
    def _charge(usage: Counter[str], quota: str, pool: str, gpus: int) -> None:
        usage[f"quota {quota}"] += gpus
        usage[f"pool {pool}"] += gpus
        if quota == FALLBACK:
            usage[f"quota fb-{pool}"] += gpus

    def pod_usage(self) -> Counter[str]:
        """GPUs of released pods that have not finished, by quota and by pool (a pool read from
        the node selector the release wrote)."""
        usage: Counter[str] = Counter()
        for pod in self.pods.values():
            case = BY_JOB.get(job_of(pod))
            phase = (pod.get("status") or {}).get("phase")
            if case is None or gated(pod) or phase in ("Succeeded", "Failed"):
                continue
            pool = (pod["spec"].get("nodeSelector") or {}).get(pools.POOL_LABEL, "?")
            self._charge(usage, case.quota, pool, 1)
        return usage

    def unit_usage(self) -> Counter[str]:
        """GPUs admitted to units (one per admitted replica), by quota and by ``status.pool``."""
        usage: Counter[str] = Counter()
        for name, unit in self.units.items():
            case = BY_JOB.get(name)
            status = unit.get("status") or {}
            replicas = sum(int(a.get("replicas") or 0) for a in status.get("admissions") or [])
            if case is None or not replicas:
                continue
            self._charge(usage, case.quota, str(status.get("pool") or "?"), replicas)
        return usage


async def _follow(client: kq.Kube, res: kq.Resource, handle: Any) -> None:
    """One watch of the namespace from a fresh list, relisting when the server says Gone."""
    items, rv = await client.list(res, namespace=NAMESPACE)
    for item in items:
        handle(item, "ADDED")
    while True:
        try:
            async for kind, obj in client.watch(res, namespace=NAMESPACE, resource_version=rv):
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    handle(obj, kind)
        except kq.Gone:
            items, rv = await client.list(res, namespace=NAMESPACE)
            for item in items:
                handle(item, "MODIFIED")


@contextlib.asynccontextmanager
async def observing(cluster: LocalCluster) -> AsyncIterator[Observer]:
    observer = Observer()
    client = await kq.Kube.connect(kubeconfig=str(cluster.kubeconfig))
    tasks = [
        asyncio.create_task(_follow(client, kq.PODS, observer.pod)),
        asyncio.create_task(_follow(client, UNITS, observer.unit)),
    ]
    try:
        yield observer
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await client.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cp = LocalCluster(profile="e2e", workdir=tmp_path_factory.mktemp("pools-cp"), nodes=0, pod_duration_s=3)
    cp.start()
    try:
        system.install_crds(cp)
        pools.create(cp, POOLS, cpu="16", memory="64Gi")
        yield cp
    except BaseException:
        print(cp.logs())
        raise
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def running_system(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    logdir = tmp_path_factory.mktemp("pools-system")
    processes = system.start(cluster, logdir=logdir)
    try:
        pools.wait_roots(cluster, POOLS)
        yield logdir
    finally:
        processes.stop()
        for name in ("reconciler", "webhook"):
            log = logdir / f"{name}.log"
            if log.exists():
                print(f"--- {name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-80:]))


def apply(cluster: LocalCluster, objects: list[dict[str, Any]]) -> None:
    body = {"apiVersion": "v1", "kind": "List", "items": objects}
    kube.kubectl(cluster, "apply", "-n", NAMESPACE, "-f", "-", input_text=json.dumps(body))


async def setup_quotas(cluster: LocalCluster) -> None:
    kube.kubectl(cluster, "create", "namespace", NAMESPACE, check=False)
    apply(cluster, [quota_body(q, parent, gpus) for q, (parent, gpus) in QUOTAS.items()])

    async def queues() -> bool:
        out = kube.kubectl(
            cluster, "get", "queue", "-n", names.COMPONENT_NAMESPACE, "-o", "name", check=False
        )
        return all(f"queue.scheduling.x-k8s.io/{q}" in out.stdout for q in QUOTAS)

    await kube.eventually(queues, timeout=60, what="a Queue for every quota")


async def finished(cluster: LocalCluster) -> bool:
    out = kube.kubectl(cluster, "get", "jobs", "-n", NAMESPACE, "-o", "json").stdout
    jobs = {j["metadata"]["name"]: j for j in json.loads(out)["items"]}
    return all(
        (jobs.get(c.name, {}).get("status") or {}).get("succeeded") == c.pods for c in CASES if not c.run_for
    )


def wide_pool(cluster: LocalCluster, unit: str) -> str:
    """The POOL cell of ``kubectl get queueunit <unit> -o wide`` (read under the header's column)."""
    out = kube.kubectl(cluster, "get", "queueunit", unit, "-n", NAMESPACE, "-o", "wide", check=False)
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) < 2:
        return ""
    header, row = lines[:2]
    assert " POOL " in f" {header} ", header
    start = f" {header} ".index(" POOL ")
    return row[start:].split()[0] if len(row) > start else ""


def check_releases(seen: Observer) -> list[str]:
    """Every pod of the load released with its pool's placement and bound in its pool in time."""
    problems: list[str] = []
    for name, first in seen.first_released.items():
        case = BY_JOB.get(job_of(first))
        if case is None:
            continue
        unit_pools = seen.unit_pools.get(case.name, set())
        if len(unit_pools) != 1 or not unit_pools <= case.allowed:
            problems.append(f"{name}: unit {case.name} in pools {unit_pools}, allowed {set(case.allowed)}")
            continue
        pool = BY_NAME[next(iter(unit_pools))]
        selector = first["spec"].get("nodeSelector") or {}
        if not pool.match_labels.items() <= selector.items():
            problems.append(f"{name}: released with nodeSelector {selector}, pool {pool.name}")
        tolerations = first["spec"].get("tolerations") or []
        for taint in pool.taints:
            if not any(
                t.get("key") == taint["key"]
                and t.get("effect") == taint["effect"]
                and (t.get("operator") == "Exists" or t.get("value") == taint["value"])
                for t in tolerations
            ):
                problems.append(f"{name}: released without a toleration of {taint}: {tolerations}")
        node = (seen.pods.get(name) or first)["spec"].get("nodeName", "")
        if name not in seen.bound_at:
            problems.append(f"{name}: released, never bound")
        elif seen.bound_at[name] - seen.released_at[name] > BIND_WITHIN_S:
            problems.append(
                f"{name}: bound {seen.bound_at[name] - seen.released_at[name]:.1f}s after release"
            )
        elif node and node_pool(node) != pool.name:
            problems.append(f"{name}: bound to {node}, not in pool {pool.name}")
    return problems


async def test_jobs_on_three_pools_run_in_their_pools_within_every_cap(
    cluster: LocalCluster, running_system: Path
) -> None:
    await setup_quotas(cluster)
    async with observing(cluster) as seen:
        apply(cluster, [job_body(c) for c in CASES])

        async def sentinel_shows_its_pool() -> bool:
            return wide_pool(cluster, SENTINEL) == "l4"

        await kube.eventually(
            sentinel_shows_its_pool,
            timeout=60,
            what="kubectl get queueunit -o wide showing the sentinel's pool",
        )
        await kube.eventually(
            lambda: finished(cluster), timeout=240, interval=1.0, what="every job succeeded"
        )
        sentinel_pods = [n for n, p in seen.pods.items() if job_of(p) == SENTINEL]
        assert sentinel_pods and all(n in seen.bound_at for n in sentinel_pods)

    expected_pods = sum(c.pods for c in CASES)
    assert len(seen.first_released) >= expected_pods, sorted(seen.first_released)
    assert check_releases(seen) == []
    limits = caps()
    over_pods = {k: v for k, v in seen.peaks_pods.items() if v > limits.get(k, 0)}
    over_units = {k: v for k, v in seen.peaks_units.items() if v > limits.get(k, 0)}
    assert over_pods == {} and over_units == {}, (seen.peaks_pods, seen.peaks_units)
    # The load did fill the caps it was sized against (so "within" was tested, not just idle).
    assert seen.peaks_units["quota team-fb"] == 6 and seen.peaks_units["quota team-h100"] == 4
    # The fallback quota used both routes; h100's route filled first.
    assert {"h100", "a100"} <= set().union(
        *(seen.unit_pools.get(c.name, set()) for c in CASES if c.name[:2] == "f-")
    )
    kube.kubectl(cluster, "delete", "job", SENTINEL, "-n", NAMESPACE, "--wait=false")
