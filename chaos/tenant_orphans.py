"""Hostile-tenant attacks on the orphan rule: a unit keeps its charge until its own pods are gone,
whatever owner they get later (docs/compatibility.md#jobs-deleted-with---cascadeorphan).

Each attack is an async function taking the :class:`chaos.tenant.Tenant` (mallory, her clients
and her record of outcomes) and the round; ``chaos/tenant.py`` lists it in ``ATTACKS`` under
:data:`ATTACK` with :data:`DEFENCE` and calls it from ``Tenant.round``. ``chaos.tenant`` is imported
when an attack runs, not when this module is loaded, so ``chaos/tenant.py`` may import this module
at its top.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from chaos import load
from shared import kube
from shared.api import names, quantities
from testenv.kwok import COMPLETE_DELAY_ANNOTATION

if TYPE_CHECKING:
    from chaos.tenant import Tenant

ATTACK: Final = "orphan-admitted-job-and-recreate"
DEFENCE: Final = (
    "reconciler: a unit whose job was deleted with --cascade=orphan stays (charged) until every "
    "released pod naming it is gone, whatever owner the pods get later (even a controller "
    "reference to a new job of the same name); the new job gets a unit of its own only then "
    "(reconciler/job_pods.py orphaned_pods_run, reconciler/job_units.py orphaned)"
)
#: CPU of her orphaned Job's one pod, and so the least her quota's published usage must show while
#: that pod runs on (milli-CPU).
POD_CPU: Final = "500m"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _used_cpu_milli(quota: Mapping[str, Any]) -> int | None:
    """The quota's published ``status.used`` CPU (milli), None while unreadable or unpublished."""
    used = (quota.get("status") or {}).get("used") or {}
    try:
        return quantities.parse_milli(used["cpu"]) if "cpu" in used else 0
    except (quantities.QuantityError, TypeError):
        return None


async def orphan_and_recreate(tenant: Tenant, r: int) -> None:
    """Her admitted one-pod Job (500m, its pod running on a kwok node): she deletes it with
    ``--cascade=orphan`` (the pod runs on, ownerless), re-creates a Job of the same name at once,
    and writes a controller reference to the new Job onto the orphaned pod, so that "its job's
    pods" no longer include it. Judged on the API alone, at every read while the orphaned pod runs:
    the unit of that name must still be the orphaned one (same UID, holding its admission), never
    released nor taken over by the new Job; and her quota's published usage must not stay below
    the running pod's CPU for the whole second half of the watch (it trails the units by a
    publication, so one low read proves nothing). The breach can fall between two reads (the
    reconciler releases the unit, creates the new Job's and deletes the pod in well under a read's
    interval), so an orphaned pod ended during the watch while the unit of its name changed is one
    too: nothing else ends it within the watch."""
    from chaos.tenant import JOBS, NAMESPACE, QUOTA, QUOTAS, UNDO_S, WATCH_S, is_admitted_unit, runs

    m = tenant.mallory
    assert m is not None
    name = f"mallory-orphan-{r}"
    target = f"{NAMESPACE}/{name}"
    unit_ref = f"{NAMESPACE}/{name}"
    plan = load.JobPlan(name, QUOTA, "single", None, False, cpu=POD_CPU, memory=False)
    body = load.job(plan, "mallory", namespace=NAMESPACE)
    template_meta = body["spec"]["template"].setdefault("metadata", {})
    template_meta.setdefault("annotations", {})[COMPLETE_DELAY_ANNOTATION] = "300s"
    orphaned: list[str] = []
    try:
        if await tenant._own_job_admitted(ATTACK, r, body) is None:
            return
        unit = await tenant._own_unit(name)
        unit_uid = str(_meta(unit).get("uid") or "")
        begun = time.monotonic()
        bound: list[kube.Obj] = []
        while not bound and time.monotonic() - begun < UNDO_S:
            bound = [p for p in await tenant._own_pods(name) if (p.get("spec") or {}).get("nodeName")]
            if not bound:
                await asyncio.sleep(0.5)
        if not bound or not unit_uid:
            tenant.record(ATTACK, r, target, "skipped", "her job's pod was not bound in time")
            return
        orphaned = [str(_meta(p).get("name")) for p in bound]
        orphaned_uids = {str(_meta(p).get("uid")) for p in bound}
        sent = await tenant.send(lambda: m.delete(JOBS, name, namespace=NAMESPACE, propagation="Orphan"))
        if sent.status != "accepted":
            tenant.record(
                ATTACK, r, target, "skipped", f"her orphaning delete was not accepted: {sent.message}"
            )
            return
        # The garbage collector holds the old Job (finalizer "orphan") until it has let go of its
        # dependents; the name is free again only then.
        begun = time.monotonic()
        recreated = await tenant.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        while recreated.status in ("exists", "changed") and time.monotonic() - begun < UNDO_S:
            await asyncio.sleep(0.3)
            recreated = await tenant.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        if recreated.status != "accepted":
            tenant.record(
                ATTACK, r, target, "skipped", f"her re-created job was not accepted: {recreated.message}"
            )
            return
        new_uid = str(_meta(recreated.obj).get("uid") or "")
        claim = {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": new_uid,
                        "controller": True,
                    }
                ]
            }
        }
        claimed = 0
        for pod in orphaned:

            async def claim_pod(pod: str = pod) -> kube.Obj:
                return await m.patch(kube.PODS, pod, claim, namespace=NAMESPACE)

            claimed += (await tenant.send(claim_pod)).status == "accepted"
        breaches: list[str] = []
        low_reads: list[bool] = []
        reads = 0
        begun = time.monotonic()
        while time.monotonic() - begun < 2 * WATCH_S:
            pods, _ = await tenant.admin.list(kube.PODS, namespace=NAMESPACE)
            running = [
                p
                for p in pods
                if str(_meta(p).get("uid")) in orphaned_uids
                and (_meta(p).get("annotations") or {}).get(names.RELATED_QUEUEUNIT_ANNOTATION) == unit_ref
                and runs(p)
            ]
            if not running:
                # Nobody here ends the orphaned pod within the watch (it runs for 300 s): if it
                # stopped, the reconciler deleted it as a pod its (new) job does not own, which
                # it does only once the new job's unit took the name, so after the orphaned unit
                # was released while the pod still ran, perhaps between two reads.
                now = await tenant._own_unit(name)
                if str(_meta(now).get("uid") or "") != unit_uid:
                    now_uid = _meta(now).get("uid") or "gone"
                    breaches.append(
                        f"her orphaned pod was ended during the watch and unit {unit_ref} is {now_uid}: "
                        "the orphaned unit was released before its pod was gone"
                    )
                break
            reads += 1
            now = await tenant._own_unit(name)
            if str(_meta(now).get("uid") or "") != unit_uid:
                now_uid = _meta(now).get("uid") or "gone"
                breaches.append(f"unit {unit_ref} is {now_uid} while {len(running)} orphaned pod(s) run")
            elif not is_admitted_unit(now):
                breaches.append(
                    f"unit {unit_ref} holds no admission while {len(running)} orphaned pod(s) run"
                )
            if time.monotonic() - begun >= WATCH_S:
                with contextlib.suppress(kube.KubeError):
                    used = _used_cpu_milli(await tenant.admin.get(QUOTAS, QUOTA, namespace=NAMESPACE))
                    if used is not None:
                        low_reads.append(used < quantities.parse_milli(POD_CPU))
            await asyncio.sleep(0.5)
        if breaches:
            detail = f"{breaches[0]} ({len(breaches)} finding(s) over {reads} reads)"
            tenant.record(ATTACK, r, target, "SUCCEEDED", detail)
        elif low_reads and all(low_reads):
            detail = f"quota {QUOTA}'s published usage stayed below {POD_CPU} CPU while her orphaned pod ran"
            tenant.record(ATTACK, r, target, "SUCCEEDED", detail)
        elif reads == 0:
            tenant.record(
                ATTACK, r, target, "skipped", "her orphaned pod stopped running before the first read"
            )
        else:
            detail = (
                f"accepted (re-created, {claimed} orphaned pod(s) claimed for it); over {reads} reads the "
                f"orphaned unit kept its admission and UID while its pod ran"
            )
            tenant.record(ATTACK, r, target, "neutralised", detail)
    finally:
        for pod in orphaned:
            with contextlib.suppress(kube.KubeError):
                await m.delete(kube.PODS, pod, namespace=NAMESPACE)
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")
