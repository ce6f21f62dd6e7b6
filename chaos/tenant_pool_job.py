"""Hostile-tenant attacks on node pools that need her admitted pool job (docs/pools.md#placement):
its unit's ``status.pool`` written to the other pool, its released pod moved off the pool, a
contradicting node selector on a new gated pod of it before its release, and a pod bound to the
pool's node naming its unit. The pools, her quotas, the judges and the record of the run are in
:mod:`chaos.tenant_pools`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Final

from chaos import load
from chaos import tenant_pools as tp
from chaos.tenant_common import JOBS, NAMESPACE, UNDO_S, UNITS, WATCH_S, Attacker, _meta, gated
from chaos.tenant_pools import (
    BOUND_POD,
    CONTRADICT_GATED,
    MOVE_POD,
    OTHER,
    POD_CPU,
    POOL,
    POOL_QUOTA,
    WRITE_POOL_STATUS,
    admitted_replicas,
    conflict_named,
    judge_gated,
    pool_job_body,
    unit_pool,
)
from koord_queue.shared import kube
from koord_queue.shared.api import names
from testenv import pools


async def pool_job(tenant: Attacker, r: int) -> None:
    """Her admitted pool job, then, one after the other on it: its unit's pool status, its released
    pod moved off the pool, a contradicting selector on a new gated pod, a bound pod naming its unit."""
    m = tenant.mallory
    assert m is not None
    name = f"mallory-pool-{r}"
    target = f"{NAMESPACE}/{name}"
    try:
        job = await tenant._own_job_admitted(WRITE_POOL_STATUS, r, pool_job_body(name))
        if job is None:
            for attack in (MOVE_POD, CONTRADICT_GATED, BOUND_POD):
                tenant.record(attack, r, target, "skipped", "her pool job was not admitted in time")
            return
        await write_pool_status(tenant, r, name)
        pod: kube.Obj | None = None
        begun = time.monotonic()
        while pod is None and time.monotonic() - begun < UNDO_S:
            pod = next((p for p in await tenant._own_pods(name) if not gated(p.get("spec"))), None)
            if pod is None:
                await asyncio.sleep(0.5)
        await move_pod(tenant, r, pod)
        await contradict_gated(tenant, r, name)
        await bound_pod(tenant, r, job)
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")


async def write_pool_status(tenant: Attacker, r: int, name: str) -> None:
    m = tenant.mallory
    assert m is not None
    target = f"{NAMESPACE}/{name}"
    before = unit_pool(await tenant._own_unit(name)) or "none"
    patch = {"status": {"pool": OTHER.name, "poolQuota": POOL_QUOTA}}
    call = functools.partial(m.patch, UNITS, name, patch, namespace=NAMESPACE, subresource="status")
    sent = await tenant.send(call, rbac_allows=False)
    if not tp.judged_write(tenant, WRITE_POOL_STATUS, r, target, sent):
        return
    if unit_pool(sent.obj) != OTHER.name:
        tenant.record(
            WRITE_POOL_STATUS, r, target, "neutralised", f"accepted, stored pool {unit_pool(sent.obj)!r}"
        )
        return

    async def restored() -> bool:
        return unit_pool(await tenant.admin.get(UNITS, name, namespace=NAMESPACE)) == POOL.name

    seconds = await tp.until(restored, UNDO_S)
    detail = f"accepted: status.pool {before} -> {OTHER.name}"
    if seconds is not None:
        tenant.record(
            WRITE_POOL_STATUS, r, target, "undone", f"{detail}; written back by the reconciler", seconds
        )
    else:
        tenant.record(WRITE_POOL_STATUS, r, target, "SUCCEEDED", f"{detail}; never written back")


REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
#: Her two writes moving a released pod to the other pool.
MOVES: Final = {
    "nodeSelector": {"spec": {"nodeSelector": dict(OTHER.match_labels)}},
    "affinity": {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": pools.POOL_LABEL, "operator": "In", "values": [OTHER.name]}
                                ]
                            }
                        ]
                    }
                }
            }
        }
    },
}


async def move_pod(tenant: Attacker, r: int, pod: kube.Obj | None) -> None:
    """Her pool job's released pod narrowed to the other pool, by node selector then by affinity."""
    m = tenant.mallory
    assert m is not None
    if pod is None:
        tenant.record(MOVE_POD, r, "-", "skipped", "no released pod of her pool job in time")
        return
    name = str(_meta(pod).get("name"))
    for what, patch in MOVES.items():
        target = f"{NAMESPACE}/{name} ({what})"
        sent = await tenant.send(functools.partial(m.patch, kube.PODS, name, patch, namespace=NAMESPACE))
        if not tp.judged_write(tenant, MOVE_POD, r, target, sent):
            continue
        field_name = "nodeSelector" if what == "nodeSelector" else "affinity"
        was, now = (pod.get("spec") or {}).get(field_name), (sent.obj.get("spec") or {}).get(field_name)
        if was == now:
            tenant.record(MOVE_POD, r, target, "neutralised", f"accepted as a no-op: {field_name} unchanged")
        else:
            tenant.record(MOVE_POD, r, target, "SUCCEEDED", f"accepted: {field_name} {was} -> {now}")


async def _first_new_pod(
    tenant: Attacker, selector: str, known: set[str], revision: str, timeout: float
) -> kube.Obj | None:
    """The first pod matching ``selector`` not in ``known`` to appear since ``revision``, as soon
    as the watch shows it; None when none did within ``timeout`` (or the watch broke)."""
    try:
        async with asyncio.timeout(timeout):
            async for kind, obj in tenant.admin.watch(
                kube.PODS,
                resource_version=revision,
                namespace=NAMESPACE,
                label_selector=selector,
                timeout_seconds=int(timeout) + 1,
            ):
                if kind in ("ADDED", "MODIFIED") and str(_meta(obj).get("name")) not in known:
                    return obj
    except (TimeoutError, kube.KubeError):
        return None
    return None


async def contradict_gated(tenant: Attacker, r: int, name: str) -> None:
    """Her admitted pool job grown by one pod; the moment the Job controller makes it (gated, the
    admission not grown yet) she narrows it to the other pool. Then, for twice :data:`WATCH_S`,
    the pod must stay gated and unbound while the admission grows to cover it (:func:`judge_gated`)."""
    m = tenant.mallory
    assert m is not None
    target = f"{NAMESPACE}/{name}"
    selector = f"batch.kubernetes.io/job-name={name}"
    try:
        listed, revision = await tenant.admin.list(kube.PODS, namespace=NAMESPACE, label_selector=selector)
    except kube.KubeError as err:
        tenant.record(CONTRADICT_GATED, r, target, "skipped", f"her pods were unreadable: {err.message}")
        return
    known = {str(_meta(p).get("name")) for p in listed}
    grow = await tenant.send(lambda: m.patch(JOBS, name, {"spec": {"parallelism": 2}}, namespace=NAMESPACE))
    if grow.status != "accepted":
        tenant.record(CONTRADICT_GATED, r, target, "skipped", f"her job was not grown: {grow.message}")
        return
    new = await _first_new_pod(tenant, selector, known, revision, UNDO_S)
    if new is None or not gated(new.get("spec")):
        why = "no new pod appeared" if new is None else "the new pod was out of the gate when she saw it"
        tenant.record(CONTRADICT_GATED, r, target, "skipped", why)
        return
    pod = str(_meta(new).get("name"))
    target = f"{NAMESPACE}/{pod}"
    patch = {"spec": {"nodeSelector": {pools.POOL_LABEL: OTHER.name}}}
    sent = await tenant.send(functools.partial(m.patch, kube.PODS, pod, patch, namespace=NAMESPACE))
    if sent.status == "refused":
        now = await tenant._read(lambda: tenant.admin.get(kube.PODS, pod, namespace=NAMESPACE))
        if now is not None and not gated(now.get("spec")):  # the reconciler released it first
            tenant.record(
                CONTRADICT_GATED, r, target, "skipped", f"released before her write: {sent.message}"
            )
            return
    if not tp.judged_write(tenant, CONTRADICT_GATED, r, target, sent):
        return
    seen: list[kube.Obj] = []
    grown = False
    begun = time.monotonic()
    while time.monotonic() - begun < 2 * WATCH_S:
        with contextlib.suppress(kube.KubeError):
            seen.append(await tenant.admin.get(kube.PODS, pod, namespace=NAMESPACE))
        grown = grown or admitted_replicas(await tenant._own_unit(name)) >= 2
        await asyncio.sleep(0.5)
    events = await tenant._read(lambda: tenant.admin.list(kube.EVENTS, namespace=NAMESPACE)) or []
    outcome, detail = judge_gated(seen, grown=grown, conflict_seen=conflict_named(events, pod))
    tenant.record(CONTRADICT_GATED, r, target, outcome, detail)


async def bound_pod(tenant: Attacker, r: int, job: kube.Obj) -> None:
    """A pod she creates bound to her pool's node, controlled by her admitted pool job (its real
    UID) and naming its unit, as the job's own pods do: past the queue and the pool's taint at once."""
    m = tenant.mallory
    assert m is not None
    meta = _meta(job)
    job_name = str(meta.get("name"))
    name = f"{job_name}-bound"
    target = f"{NAMESPACE}/{name} -> {POOL.node_name(0)}"
    template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
    annotations = {
        **(template.get("annotations") or {}),
        names.RELATED_QUEUEUNIT_ANNOTATION: f"{NAMESPACE}/{job_name}",
    }
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job_name,
        "uid": str(meta.get("uid")),
        "controller": True,
    }
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": {"batch.kubernetes.io/job-name": job_name, "job-name": job_name},
            "ownerReferences": [owner],
        },
        "spec": {
            "nodeName": POOL.node_name(0),
            "restartPolicy": "Never",
            "containers": [load.container(POD_CPU, memory=False)],
        },
    }
    sent = await tenant.send(lambda: m.create(kube.PODS, body, namespace=NAMESPACE))
    if not tp.judged_write(tenant, BOUND_POD, r, target, sent):
        return
    try:

        async def gone() -> bool:
            try:
                await tenant.admin.get(kube.PODS, name, namespace=NAMESPACE)
            except kube.NotFound:
                return True
            return False

        seconds = await tp.until(gone, UNDO_S)
        if seconds is not None:
            tenant.record(BOUND_POD, r, target, "undone", "accepted; the pod was deleted", seconds)
        else:
            tenant.record(
                BOUND_POD, r, target, "SUCCEEDED", f"accepted; bound on the pool's node for {UNDO_S:.0f}s"
            )
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.request(
                "DELETE",
                kube.PODS.path(NAMESPACE, name),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
