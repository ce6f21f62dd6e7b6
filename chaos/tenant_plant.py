"""Hostile-tenant attacks on where the system keeps its state (docs/operations.md#install-namespace).

The reconciler reads its Queues only in its install namespace, and the quota-binding policy reads
its parameters (the ConfigMap ``koord-queue-quota-bindings`` the reconciler keeps) only there. A
tenant who could make either read a copy of hers would stop another team's queue or spend another
team's quota. Mallory (``chaos.tenant``) plants both in her own namespace, each round:

``plant-a-queue-in-own-namespace``
    a Queue named after a load quota (``chaos-a``), stopped and with the Block policy. RBAC should
    refuse it (the user roles give Queues read-only); accepted, the reconciler must leave it as she
    wrote it (no status of its, no change): it never reads a Queue outside its namespace;
``plant-quota-bindings-in-own-namespace``
    a ConfigMap ``koord-queue-quota-bindings`` in her namespace (her ``edit`` role lets her) that
    binds ``chaos-a`` to her namespace and turns enforcement off, then a Job of hers under
    ``chaos-a``. The policy reads only the install namespace's ConfigMap, so the Job is refused; if
    it were accepted, its unit must never be admitted (the scheduler checks the binding itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Final

from chaos import load
from chaos.tenant_common import NAMESPACE, WATCH_S, Attacker, is_admitted_unit
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.parsing import parse_quota
from koord_queue.shared.core import quotaqueues

QUEUE: Final = "plant-a-queue-in-own-namespace"
BINDINGS: Final = "plant-quota-bindings-in-own-namespace"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``).
ATTACKS: Final[dict[str, str]] = {
    QUEUE: "RBAC: Queues are read-only for namespace users; the reconciler watches Queues in its "
    "install namespace only (--namespace), so one elsewhere never configures or stops a queue",
    BINDINGS: "ValidatingAdmissionPolicy koord-queue-quota-binding reads its parameters from the "
    "install namespace only (paramRef); the scheduler refuses a unit whose quota is not bound to "
    "its namespace (QuotaLedger.binding_problem)",
}
#: The load quota she tries to take over (bound to the load's namespace only).
VICTIM_QUOTA: Final = "chaos-a"
QUEUES: Final = kube.Resource(names.GROUP, names.VERSION, names.QUEUE_PLURAL, "Queue")
CONFIGMAPS: Final = kube.Resource("", "v1", "configmaps", "ConfigMap")


def planted_queue(quota: str) -> kube.Obj:
    """Her Queue: named after ``quota``, stopped, Block (a queue that admits nothing)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": quota, "annotations": {names.STOPPED_ANNOTATION: "true"}},
        "spec": {"queuePolicy": "Block", "priority": 1},
    }


def planted_bindings(quota: str, namespace: str) -> kube.Obj:
    """Her copy of the policy's parameters, exactly what the reconciler would write
    (``quotaqueues.binding_data``) were the load's ``quota`` to serve ``namespace`` too, with
    enforcement off."""
    raw = load.quota(quota, "1", "", False)
    raw["metadata"]["annotations"][names.QUOTA_NAMESPACES_ANNOTATION] = json.dumps([namespace])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.QUOTA_BINDINGS_CONFIGMAP},
        "data": quotaqueues.binding_data([parse_quota(raw)], enforce=False),
    }


def untouched(written: kube.Obj, now: kube.Obj) -> bool:
    """The stored Queue is as she wrote it: same resourceVersion, no status."""
    meta_w: dict[str, Any] = written.get("metadata") or {}
    meta_n: dict[str, Any] = now.get("metadata") or {}
    return meta_w.get("resourceVersion") == meta_n.get("resourceVersion") and not now.get("status")


async def plant_attacks(t: Attacker, r: int) -> None:
    """The module's attacks for round ``r``."""
    await _queue(t, r)
    await _bindings(t, r)


async def _queue(t: Attacker, r: int) -> None:
    m = t.mallory
    assert m is not None
    target = f"Queue {NAMESPACE}/{VICTIM_QUOTA}"
    sent = await t.send(
        lambda: m.create(QUEUES, planted_queue(VICTIM_QUOTA), namespace=NAMESPACE), rbac_allows=False
    )
    if sent.status == "refused":
        t.record(QUEUE, r, target, "refused", sent.message)
        return
    if sent.status != "accepted":
        t.record(QUEUE, r, target, "skipped", sent.message)
        return
    try:
        begun = time.monotonic()
        while time.monotonic() - begun < WATCH_S:
            now = await t._read(lambda: t.admin.get(QUEUES, VICTIM_QUOTA, namespace=NAMESPACE))
            if now is not None and not untouched(sent.obj, now):
                t.record(
                    QUEUE, r, target, "SUCCEEDED", f"the reconciler took her Queue up: {now.get('status')!r}"
                )
                return
            await asyncio.sleep(0.5)
        t.record(QUEUE, r, target, "neutralised", "accepted; the reconciler left it as she wrote it")
    finally:
        with contextlib.suppress(kube.KubeError):
            await t.admin.delete(QUEUES, VICTIM_QUOTA, namespace=NAMESPACE)


async def _bindings(t: Attacker, r: int) -> None:
    m = t.mallory
    assert m is not None
    name = f"mallory-planted-{r}"
    target = f"{NAMESPACE}/{name} (quota {VICTIM_QUOTA}, ConfigMap {names.QUOTA_BINDINGS_CONFIGMAP} planted)"
    planted = await t.send(
        lambda: m.create(CONFIGMAPS, planted_bindings(VICTIM_QUOTA, NAMESPACE), namespace=NAMESPACE)
    )
    if planted.status not in ("accepted", "exists"):
        t.record(BINDINGS, r, target, "refused", f"the ConfigMap: {planted.message}")
        return
    body = load.job(load.JobPlan(name, VICTIM_QUOTA, "single", None, False), "mallory", namespace=NAMESPACE)
    body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
    try:
        sent = await t.send(lambda: m.create(load.JOBS, body, namespace=NAMESPACE))
        if sent.status == "refused":
            t.record(BINDINGS, r, target, "refused", sent.message)
            return
        if sent.status != "accepted":
            t.record(BINDINGS, r, target, "skipped", sent.message)
            return
        message = ""
        begun = time.monotonic()
        while time.monotonic() - begun < WATCH_S:
            unit = await t._own_unit(name)
            if unit and is_admitted_unit(unit):
                detail = f"admitted under {VICTIM_QUOTA}: {unit.get('status')}"
                t.record(BINDINGS, r, target, "SUCCEEDED", detail)
                return
            message = str((unit.get("status") or {}).get("message") or message)
            await asyncio.sleep(0.5)
        t.record(
            BINDINGS, r, target, "neutralised", f"the Job was accepted; never admitted, waits: {message!r}"
        )
    finally:
        with contextlib.suppress(kube.KubeError):
            await t.admin.delete(load.JOBS, name, namespace=NAMESPACE, propagation="Background")
        with contextlib.suppress(kube.KubeError):
            await t.admin.delete(CONFIGMAPS, names.QUOTA_BINDINGS_CONFIGMAP, namespace=NAMESPACE)
