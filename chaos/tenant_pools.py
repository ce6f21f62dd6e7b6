"""Hostile-tenant attacks on node pools (docs/pools.md).

The harness, as a cluster admin, makes two small pools of one tainted kwok node each in the
namespace :data:`POOL_NAMESPACE` (an ElasticQuotaProfile per pool, ``testenv.pools``; the reconciler
keeps their root quotas): :data:`POOL`, hers, and :data:`OTHER`, one she has no quota in. In her
namespace it adds :data:`POOL_QUOTA` inside her pool's tree and :data:`FALLBACK_QUOTA` outside every
tree, whose ``koord-queue/pool-quotas`` lists only :data:`POOL_QUOTA`
(docs/pools.md#fallback-between-pools). Her pool jobs are labelled with the fallback quota.

Each round she tries (:data:`ATTACKS`): an ElasticQuotaProfile of her own selecting every node; a
write of her pool's root quota (its size, its root labels); her own quotas widened to the other
pool (the fallback's list, the pool quota's parent); with her admitted pool job, a write of
its unit's ``status.pool``, moving its released pod off the pool (node selector, node affinity), a
node selector contradicting the pool added to a gated pod of it before its release (she grows the
job by one pod and writes the selector as soon as the pod appears, before the scheduler has grown
the admission), and a pod bound with ``spec.nodeName`` to the pool's node that names the job's
unit; and a job asking with ``koord-queue/pools`` for the pool her quota does not list.

Over the whole run, :class:`PoolRecorder` keeps every version of her namespace's pods and units
that the apiserver shows; :func:`placement_breaches` then judges, independently of the product's
code, that every pod out of the gate for a unit with a ``status.pool`` carries that pool's node
selector and is bound, if at all, to a node of that pool (docs/pools.md#placement).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from chaos import load
from chaos.tenant_common import JOBS, NAMESPACE, UNDO_S, UNITS, WATCH_S, Attacker, Sent, _meta, gated
from koord_queue.shared import kube
from koord_queue.shared.api import names, quantities
from testenv import pools
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION

#: Where the harness keeps the pools' profiles (and so their root quotas): no right of hers there.
POOL_NAMESPACE: Final = "chaos-pools"
POOL: Final = pools.Pool("chaos-pool", 1, 4, tainted=True)
OTHER: Final = pools.Pool("chaos-pool-other", 1, 4, tainted=True)
POOLS: Final = {POOL.name: POOL, OTHER.name: OTHER}
#: Her quota inside her pool's tree, and her quota outside every tree that falls back to it.
POOL_QUOTA: Final = f"{NAMESPACE}-pool"
FALLBACK_QUOTA: Final = f"{NAMESPACE}-fallback"
QUOTA_CPU: Final = "2"
#: CPU of one pod of her pool jobs (two fit her pool quota).
POD_CPU: Final = "500m"
NODE_CPU: Final = "4"
PROFILES: Final = kube.Resource(
    "quota.koordinator.sh", "v1alpha1", "elasticquotaprofiles", "ElasticQuotaProfile"
)

CREATE_PROFILE: Final = "create-pool-profile"
PATCH_ROOT: Final = "patch-pool-root-quota"
WIDEN_OWN: Final = "widen-own-pool-quotas"
WRITE_POOL_STATUS: Final = "write-unit-pool-status"
UNLISTED_POOL: Final = "job-names-unlisted-pool"
MOVE_POD: Final = "move-released-pod-off-pool"
CONTRADICT_GATED: Final = "contradicting-selector-on-gated-pool-pod"
BOUND_POD: Final = "bound-pod-on-pool-node-naming-unit"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``).
ATTACKS: Final[dict[str, str]] = {
    CREATE_PROFILE: "RBAC: ElasticQuotaProfiles are cluster-admin objects (the user roles grant no "
    "verb on them)",
    PATCH_ROOT: "RBAC: ElasticQuotas, a pool's root included, are cluster-admin objects and the roots "
    "live in the admin's namespace; the reconciler keeps each root's size and labels from its "
    "profile (docs/pools.md#the-tree-of-a-pool)",
    WIDEN_OWN: "RBAC: quotas are the cluster admin's even in her namespace (the user roles read them "
    "only): neither her fallback quota's koord-queue/pool-quotas nor her pool quota's parent is hers",
    WRITE_POOL_STATUS: "RBAC: only the reconciler writes a QueueUnit's status (user roles read units)",
    UNLISTED_POOL: "scheduler: a job's koord-queue/pools only narrows and orders the pools its quota's "
    "koord-queue/pool-quotas lists; a pool the quota does not list is never tried, the unit waits "
    '("none of the job\'s pools", shared/core/pools.py)',
    MOVE_POD: "kube-apiserver: a pod's nodeSelector and affinity are immutable once its scheduling "
    "gates are gone; the reconciler writes the pool's placement in the write that removes the gate",
    CONTRADICT_GATED: "reconciler: the release is conditional on the pod's resourceVersion, and a pod "
    "whose own nodeSelector contradicts its pool stays gated (Warning PoolPlacementConflict, "
    "reconciler/job_pods.py ungate)",
    BOUND_POD: "ValidatingAdmissionPolicy koord-queue-pod-birth: a pod naming a unit is born gated, "
    "so none is created bound (spec.nodeName) to a pool's node",
}
CHECK: Final = "tenant: a pool unit's released pod carries its pool's selector and binds in the pool"


# --- pure: bodies and judges ---------------------------------------------------------------------


def quota_bodies() -> list[kube.Obj]:
    """Her pool quota (parent: her pool's root) and her fallback quota listing only it, in the
    order they must be created (a tree quota after its root exists, docs/pools.md#the-tree-of-a-pool)."""
    room = {"cpu": QUOTA_CPU, "memory": "8Gi", pools.GPU: "2"}
    inside = load.quota(POOL_QUOTA, QUOTA_CPU, POOL.root_quota, False, NAMESPACE)
    inside["spec"] = {"max": dict(room), "min": {"cpu": "0"}}
    fallback = load.quota(FALLBACK_QUOTA, QUOTA_CPU, "", False, NAMESPACE)
    fallback["spec"] = {"max": dict(room), "min": {"cpu": "0"}}
    fallback["metadata"]["annotations"][names.POOL_QUOTAS_ANNOTATION] = POOL_QUOTA
    return [inside, fallback]


def pool_job_body(name: str, *, wants: str | None = None) -> kube.Obj:
    """Her Job under :data:`FALLBACK_QUOTA`: one pod of :data:`POD_CPU` at a time (two completions,
    so she may raise ``parallelism`` to 2), each pod running 300 s once bound; ``wants`` is its
    ``koord-queue/pools``."""
    plan = load.JobPlan(name, FALLBACK_QUOTA, "single", None, False, cpu=POD_CPU, memory=False)
    body = load.job(plan, "mallory", namespace=NAMESPACE)
    body["spec"]["parallelism"], body["spec"]["completions"] = 1, 2
    template = body["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[COMPLETE_DELAY_ANNOTATION] = "300s"
    if wants is not None:
        body["metadata"]["annotations"][names.POOLS_ANNOTATION] = wants
    return body


def greedy_profile(name: str) -> kube.Obj:
    """A profile of hers in her namespace whose empty selector takes every node into its pool."""
    return {
        "apiVersion": pools.PROFILE_API_VERSION,
        "kind": "ElasticQuotaProfile",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"quotaName": f"{name}-root", "nodeSelector": {}},
    }


def unit_pool(unit: Mapping[str, Any]) -> str:
    return str((unit.get("status") or {}).get("pool") or "")


def admitted_replicas(unit: Mapping[str, Any]) -> int:
    return sum(
        int((a or {}).get("replicas") or 0) for a in (unit.get("status") or {}).get("admissions") or []
    )


def placement_breach(pod: Mapping[str, Any], pool: pools.Pool) -> str | None:
    """Why a pod out of the gate is not placed in ``pool`` (None: it is): a label of the pool's
    selector missing from its ``nodeSelector`` or set to another value, or bound to a node that is
    not one of the pool's. Judged on the pod alone."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    wrong = sorted(k for k, v in pool.match_labels.items() if selector.get(k) != v)
    if wrong:
        return f"its nodeSelector {dict(selector)} lacks pool {pool.name}'s {', '.join(wrong)}"
    node = spec.get("nodeName")
    if node and node not in pool.node_names:
        return f"it is bound to {node}, not a node of pool {pool.name} ({', '.join(pool.node_names)})"
    return None


def placement_breaches(
    versions: Iterable[Mapping[str, Any]], unit_pools: Mapping[str, set[str]], known: Mapping[str, pools.Pool]
) -> tuple[int, list[str]]:
    """Over every version of her namespace's pods seen: how many versions out of the gate named a
    unit that was admitted to a pool (``unit_pools``: unit name -> the pools its versions named),
    and the breaches among them (placed in none of those pools, or the unit's pool is none the
    harness made). A unit with a pool at some version and none at another (released, re-admitted)
    is held to any pool it named: with one pool quota listed, it is always the same one."""
    checked = 0
    breaches: list[str] = []
    for pod in versions:
        meta = _meta(pod)
        if gated(pod.get("spec")):
            continue
        ref = str((meta.get("annotations") or {}).get(names.RELATED_QUEUEUNIT_ANNOTATION) or "")
        namespace, _, unit = ref.partition("/")
        named = unit_pools.get(unit, set()) if namespace == NAMESPACE else set()
        if not named:
            continue
        checked += 1
        version = meta.get("resourceVersion")
        label = f"pod {NAMESPACE}/{meta.get('name')} (resourceVersion {version}) of unit {unit}"
        unknown = sorted(p for p in named if p not in known)
        if unknown:
            breaches.append(f"{label}: its unit was admitted to pool(s) {unknown} the harness never made")
            continue
        why = [placement_breach(pod, known[p]) for p in sorted(named)]
        if all(w is not None for w in why):
            breaches.append(f"{label} is out of the gate but {why[0]}")
    return checked, breaches


def judge_unlisted(admitted: int, released: list[str], message: str, seconds: float) -> tuple[str, str]:
    """Her job asking for the pool her quota does not list: admitted at any read, or a pod of it
    out of the gate or bound, is a bypass; else neutralised once its unit's message said why."""
    if admitted:
        return "SUCCEEDED", f"its unit was admitted ({admitted} replicas) to a pool its quota does not list"
    if released:
        return "SUCCEEDED", f"pod(s) {', '.join(released)} of the job left the gate without an admission"
    if "none of the job's pools" not in message:
        return "skipped", f"its unit did not say why it waits within {seconds:.0f}s (message {message!r})"
    return (
        "neutralised",
        f"accepted; never admitted nor released over {seconds:.0f}s; the unit says: {message[:160]}",
    )


def judge_gated(seen: Sequence[Mapping[str, Any]], *, grown: bool, conflict_seen: bool) -> tuple[str, str]:
    """The pod she narrowed to the other pool while it was gated: a version of it out of the gate
    or bound is a bypass; a gate kept while the unit's admission never covered it proves nothing;
    else neutralised (the Warning PoolPlacementConflict, when seen, is detail only)."""
    for pod in seen:
        meta = _meta(pod)
        where = (pod.get("spec") or {}).get("nodeName")
        if where or not gated(pod.get("spec")):
            state = f"bound to {where}" if where else "out of the gate"
            return (
                "SUCCEEDED",
                f"pod {meta.get('name')} (rv {meta.get('resourceVersion')}) with her selector was {state}",
            )
    if not seen:
        return "skipped", "the pod was not readable after her write"
    if not grown:
        return "skipped", "the unit's admission never grew to cover the pod, so its gate proves nothing"
    event = "a Warning PoolPlacementConflict named it" if conflict_seen else "no PoolPlacementConflict seen"
    return (
        "neutralised",
        f"accepted; it stayed gated and unbound in {len(seen)} reads with room admitted; {event}",
    )


def conflict_named(events: Iterable[Mapping[str, Any]], pod: str) -> bool:
    """A Warning PoolPlacementConflict among ``events`` names the pod ``pod``."""
    return any(
        e.get("reason") == "PoolPlacementConflict" and f"pod {pod} " in str(e.get("message") or "")
        for e in events
    )


# --- the record of the run -----------------------------------------------------------------------


@dataclass
class PoolRecorder:
    """Every version of her namespace's pods out of the gate, and each unit's pools, as watched
    through the apiserver from set-up to the final check. A watch broken by a fault is begun again
    from a fresh list (counted in :attr:`relists`: a version in between may be missed)."""

    admin: kube.Kube
    released: dict[tuple[str, str], kube.Obj] = field(default_factory=dict)
    unit_pools: dict[str, set[str]] = field(default_factory=dict)
    relists: int = 0
    #: why a watch or a list broke off (a fault's refusal, a 410, a dropped connection), by reason
    breaks: Counter[str] = field(default_factory=Counter)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._follow(kube.PODS), name="pool pods"),
            asyncio.create_task(self._follow(UNITS), name="pool units"),
        ]

    def note_unit(self, obj: kube.Obj) -> None:
        pool = unit_pool(obj)
        if pool:
            self.unit_pools.setdefault(str(_meta(obj).get("name")), set()).add(pool)

    def note_pod(self, obj: kube.Obj) -> None:
        meta = _meta(obj)
        if not gated(obj.get("spec")):
            slim = {
                "metadata": {k: meta.get(k) for k in ("name", "resourceVersion", "annotations")},
                "spec": {k: (obj.get("spec") or {}).get(k) for k in ("nodeSelector", "nodeName")},
            }
            self.released[(str(meta.get("uid")), str(meta.get("resourceVersion")))] = slim

    def note(self, res: kube.Resource, obj: kube.Obj) -> None:
        (self.note_unit if res is UNITS else self.note_pod)(obj)

    async def _follow(self, res: kube.Resource) -> None:
        revision = ""
        listed = False
        delay = 0.5  # doubled while the apiserver keeps refusing (429 after a restart), up to 4 s
        while True:
            try:
                if not revision:
                    objs, revision = await self.admin.list(res, namespace=NAMESPACE)
                    self.relists += listed  # a fresh list after a broken watch, not the first one
                    listed, delay = True, 0.5
                    for obj in objs:
                        self.note(res, obj)
                async for kind, obj in self.admin.watch(
                    res, resource_version=revision, namespace=NAMESPACE, timeout_seconds=60
                ):
                    revision = str(_meta(obj).get("resourceVersion") or revision)
                    if kind != "BOOKMARK":
                        self.note(res, obj)
            except kube.KubeError as err:
                self.breaks[f"{res.plural}: HTTP {err.status} {err.reason}"] += 1
                revision = ""
                await asyncio.sleep(delay)
                delay = min(delay * 2, 4.0)

    async def finish(self) -> None:
        """A last list of both (so the record reaches the end of the run), then stop watching."""
        for res in (kube.PODS, UNITS):
            with contextlib.suppress(kube.KubeError):
                for obj in (await self.admin.list(res, namespace=NAMESPACE))[0]:
                    self.note(res, obj)
        await self.stop()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks = []


async def setup(tenant: Attacker, cluster: LocalCluster) -> PoolRecorder:
    """The two pools (nodes Ready, profiles made, roots sized by the reconciler), her two quotas,
    and the record of her namespace begun."""
    await asyncio.to_thread(
        pools.create, cluster, [POOL, OTHER], cpu=NODE_CPU, memory="16Gi", namespace=POOL_NAMESPACE
    )
    await asyncio.to_thread(pools.wait_roots, cluster, [POOL, OTHER], namespace=POOL_NAMESPACE, timeout=90.0)
    for body in quota_bodies():
        await tenant.admin.create(load.QUOTA_RESOURCE, body, namespace=NAMESPACE)
    recorder = PoolRecorder(tenant.admin)
    recorder.start()
    return recorder


def attacks(tenant: Attacker, r: int) -> list[Awaitable[None]]:
    """This round's pool attacks that need no admitted job of hers (they run beside the others;
    ``chaos.tenant_pool_job.pool_job`` tries the rest)."""
    return [
        create_profile(tenant, r),
        patch_root(tenant, r),
        widen_own(tenant, r),
        unlisted_pool(tenant, r),
    ]


async def final_check(recorder: PoolRecorder | None, checks: Counter[str]) -> list[str]:
    """The placement of every released pod of a pool unit over the run (:func:`placement_breaches`);
    returns the breaches (each a ``tenant-bypass``)."""
    if recorder is None:
        return []
    await recorder.finish()
    checked, breaches = placement_breaches(recorder.released.values(), recorder.unit_pools, POOLS)
    checks[CHECK] += checked
    return breaches


# --- the attacks ---------------------------------------------------------------------------------


async def until(probe: Callable[[], Awaitable[bool]], timeout: float) -> float | None:
    """Seconds until ``probe`` holds (a read a fault refuses counts as not yet), None if never."""
    begun = time.monotonic()
    while time.monotonic() - begun < timeout:
        with contextlib.suppress(kube.KubeError):
            if await probe():
                return time.monotonic() - begun
        await asyncio.sleep(0.5)
    return None


def judged_write(tenant: Attacker, attack: str, r: int, target: str, sent: Sent) -> bool:
    """Record a refusal or a write that was never judged; True when accepted (the caller judges)."""
    if sent.status == "refused":
        tenant.record(attack, r, target, "refused", sent.message)
    elif sent.status != "accepted":
        tenant.record(attack, r, target, "skipped", f"{sent.status}: {sent.message}")
    return sent.status == "accepted"


async def create_profile(tenant: Attacker, r: int) -> None:
    """A profile of hers whose empty selector makes every node one pool under a root of hers."""
    m = tenant.mallory
    assert m is not None
    name = f"mallory-everything-{r}"
    target = f"{NAMESPACE}/{name}"
    sent = await tenant.send(
        lambda: m.create(PROFILES, greedy_profile(name), namespace=NAMESPACE), rbac_allows=False
    )
    if not judged_write(tenant, CREATE_PROFILE, r, target, sent):
        return
    tenant.record(
        CREATE_PROFILE, r, target, "SUCCEEDED", "accepted: a namespace user made a pool of every node"
    )
    with contextlib.suppress(kube.KubeError):  # put things back so the rest of the run stays meaningful
        await tenant.admin.delete(PROFILES, name, namespace=NAMESPACE)
    with contextlib.suppress(kube.KubeError):
        await tenant.admin.delete(load.QUOTA_RESOURCE, f"{name}-root", namespace=NAMESPACE)


async def _root_intact(tenant: Attacker) -> bool:
    root = await tenant.admin.get(load.QUOTA_RESOURCE, POOL.root_quota, namespace=POOL_NAMESPACE)
    labels = _meta(root).get("labels") or {}
    size = str(((root.get("spec") or {}).get("min") or {}).get("cpu") or "0")
    with contextlib.suppress(quantities.QuantityError):
        if quantities.parse_milli(size) != quantities.parse_milli(NODE_CPU):
            return False
    return (
        labels.get(names.QUOTA_IS_ROOT_LABEL) == "true" and labels.get(names.QUOTA_PROFILE_LABEL) == POOL.name
    )


async def patch_root(tenant: Attacker, r: int) -> None:
    """Her pool's root quota sized to 1000 CPU, then stripped of its root labels (read as a root,
    its ``min`` is the pool's limit: docs/pools.md#a-tree-roots-limit)."""
    m = tenant.mallory
    assert m is not None
    writes = {
        "size": {"spec": {"min": {"cpu": "1000"}, "max": {"cpu": "1000"}}},
        "labels": {
            "metadata": {"labels": {names.QUOTA_IS_ROOT_LABEL: None, names.QUOTA_PROFILE_LABEL: None}}
        },
    }
    for what, patch in writes.items():
        target = f"{POOL_NAMESPACE}/{POOL.root_quota} ({what})"
        call = functools.partial(
            m.patch, load.QUOTA_RESOURCE, POOL.root_quota, patch, namespace=POOL_NAMESPACE
        )
        sent = await tenant.send(call, rbac_allows=False)
        if not judged_write(tenant, PATCH_ROOT, r, target, sent):
            continue
        seconds = await until(lambda: _root_intact(tenant), UNDO_S)
        if seconds is not None:
            tenant.record(
                PATCH_ROOT, r, target, "undone", "accepted; the reconciler kept the root again", seconds
            )
        else:
            tenant.record(PATCH_ROOT, r, target, "SUCCEEDED", f"accepted and not repaired in {UNDO_S:.0f}s")


#: Her writes of her own quotas, each with the value the harness gave it (put back if accepted):
#: the fallback quota listing the other pool's root too, her pool quota moved under that root.
WIDENINGS: Final = {
    FALLBACK_QUOTA: (
        names.POOL_QUOTAS_ANNOTATION,
        f"{POOL_QUOTA}, {OTHER.root_quota}",
        POOL_QUOTA,
    ),
    POOL_QUOTA: (names.QUOTA_PARENT_LABEL, OTHER.root_quota, POOL.root_quota),
}


async def widen_own(tenant: Attacker, r: int) -> None:
    """Her own quotas widened to the other pool: the fallback's list, the pool quota's parent."""
    m = tenant.mallory
    assert m is not None
    for quota, (key, wanted, given) in WIDENINGS.items():
        where = "annotations" if key == names.POOL_QUOTAS_ANNOTATION else "labels"
        target = f"{NAMESPACE}/{quota} ({key})"
        call = functools.partial(
            m.patch, load.QUOTA_RESOURCE, quota, {"metadata": {where: {key: wanted}}}, namespace=NAMESPACE
        )
        sent = await tenant.send(call, rbac_allows=False)
        if not judged_write(tenant, WIDEN_OWN, r, target, sent):
            continue
        tenant.record(WIDEN_OWN, r, target, "SUCCEEDED", f"accepted: a namespace user set {key}: {wanted}")
        with contextlib.suppress(kube.KubeError):  # put it back so the rest of the run stays meaningful
            back = {"metadata": {where: {key: given}}}
            await tenant.admin.patch(load.QUOTA_RESOURCE, quota, back, namespace=NAMESPACE)


async def unlisted_pool(tenant: Attacker, r: int) -> None:
    """Her job under the fallback quota asking (``koord-queue/pools``) for the pool it does not list."""
    m = tenant.mallory
    assert m is not None
    name = f"mallory-elsewhere-{r}"
    target = f"{NAMESPACE}/{name}"
    body = pool_job_body(name, wants=OTHER.name)
    sent = await tenant.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
    if not judged_write(tenant, UNLISTED_POOL, r, target, sent):
        return
    try:
        begun = time.monotonic()
        said_at: float | None = None
        admitted, message, released = 0, "", set()
        while time.monotonic() - begun < UNDO_S + WATCH_S:
            unit = await tenant._own_unit(name)
            admitted = max(admitted, admitted_replicas(unit))
            message = str((unit.get("status") or {}).get("message") or "") or message
            for pod in await tenant._own_pods(name):
                if (pod.get("spec") or {}).get("nodeName") or not gated(pod.get("spec")):
                    released.add(str(_meta(pod).get("name")))
            if said_at is None and "none of the job's pools" in message:
                said_at = time.monotonic()
            if admitted or released or (said_at is not None and time.monotonic() - said_at >= WATCH_S):
                break
            await asyncio.sleep(0.5)
        outcome, detail = judge_unlisted(admitted, sorted(released), message, time.monotonic() - begun)
        tenant.record(UNLISTED_POOL, r, target, outcome, detail)
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")
