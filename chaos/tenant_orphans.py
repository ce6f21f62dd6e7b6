"""Hostile-tenant attacks on the orphan rule: a unit keeps its charge until its own pods are gone,
whatever owner they get later (docs/compatibility.md#jobs-deleted-with---cascadeorphan).

Each attack is an async function taking the tenant (``chaos.tenant_common.Attacker``: mallory, her
clients and her record of outcomes) and the round; ``chaos/tenant.py`` lists it in ``ATTACKS`` under
:data:`ATTACK` with :data:`DEFENCE` and calls it from ``Tenant.round``. This module never imports
``chaos.tenant``, which imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any, Final

from chaos import load
from chaos.tenant_common import (
    JOBS,
    NAMESPACE,
    QUOTA,
    QUOTAS,
    UNDO_S,
    UNITS,
    WATCH_S,
    Attacker,
    is_admitted_unit,
)
from koord_queue.shared import kube
from koord_queue.shared.api import names, quantities
from testenv.kwok import COMPLETE_DELAY_ANNOTATION

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


#: How long the record since the last good read is replayed (seconds): the apiserver sends every
#: event since that revision at once, then closes the watch after this long.
RECORD_S: Final = 3


def orphans_present(pods: list[kube.Obj], uids: set[str], unit_ref: str) -> list[kube.Obj]:
    """Her orphaned pods (by UID) still there in ``pods``, naming the unit and not finished: a
    terminating pod counts, since it runs on until it is gone."""
    found = []
    for pod in pods:
        meta = _meta(pod)
        if str(meta.get("uid")) not in uids:
            continue
        if (meta.get("annotations") or {}).get(names.RELATED_QUEUEUNIT_ANNOTATION) != unit_ref:
            continue
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            found.append(pod)
    return found


def read_finding(unit: Mapping[str, Any] | None, unit_uid: str, present: int, unit_ref: str) -> str | None:
    """A breach shown by one read, or None: ``unit`` is the unit of her Job's name as a list of the
    namespace's units showed it (None: not there), ``present`` how many of her orphaned pods a list
    of pods taken after it still showed. Exact: a pod shown by the later list was there at the
    earlier one too, so a unit gone, re-created or without admission at the earlier one was
    released while the pod was there. An unreadable unit is no read at all (the caller skips it)."""

    if not present:
        return None
    now_uid = str(_meta(unit or {}).get("uid") or "")
    if now_uid != unit_uid:
        return f"unit {unit_ref} is {now_uid or 'gone'} while {present} orphaned pod(s) are still there"
    if not is_admitted_unit(unit or {}):
        return f"unit {unit_ref} holds no admission while {present} orphaned pod(s) are still there"
    return None


def deleted_at(events: list[tuple[str, kube.Obj]], uids: set[str]) -> dict[str, int]:
    """The revision each object of ``uids`` was deleted at, from a watch's events (a DELETED
    event carries the object at the revision of its deletion)."""
    found: dict[str, int] = {}
    for kind, obj in events:
        uid = str(_meta(obj).get("uid") or "")
        if kind == "DELETED" and uid in uids:
            with contextlib.suppress(ValueError):
                found[uid] = int(str(_meta(obj).get("resourceVersion") or ""))
    return found


def released_before_gone(
    unit_events: list[tuple[str, kube.Obj]],
    pod_events: list[tuple[str, kube.Obj]],
    unit_uid: str,
    pod_uids: set[str],
) -> bool | None:
    """From the record since a revision at which the unit held its admission and the pods were
    there, up to after they were all gone: was the unit deleted before the last of them was gone
    (a breach, terminating pods counting), or not (False)? None when the record does not show
    every pod's deletion, so it cannot tell."""
    pods_gone = deleted_at(pod_events, pod_uids)
    if set(pods_gone) != pod_uids:
        return None
    unit_gone = deleted_at(unit_events, {unit_uid}).get(unit_uid)
    return unit_gone is not None and unit_gone < max(pods_gone.values())


def deleted_owners(events: list[tuple[str, kube.Obj]], uid: str) -> list[str] | None:
    """The owner references (``Kind/name/uid``) the object ``uid`` still had when it was deleted,
    from a watch's events; None when the events do not show its deletion. A released orphaned unit
    has none left (the garbage collector dropped them when it orphaned it); one still naming its
    deleted Job was deleted by the garbage collector, which had not orphaned it."""
    for kind, obj in events:
        meta = _meta(obj)
        if kind == "DELETED" and str(meta.get("uid") or "") == uid:
            refs = meta.get("ownerReferences") or []
            return [f"{r.get('kind')}/{r.get('name')}/{r.get('uid')}" for r in refs if isinstance(r, Mapping)]
    return None


async def _listed(tenant: Attacker, res: kube.Resource) -> tuple[list[kube.Obj], str] | None:
    """Her namespace's objects of ``res`` as the admin lists them, with the list's revision; None
    while unreadable (a fault: no finding either way)."""

    try:
        return await tenant.admin.list(res, namespace=NAMESPACE)
    except kube.KubeError:
        return None


async def _record_since(tenant: Attacker, res: kube.Resource, revision: str) -> list[tuple[str, kube.Obj]]:
    """Every event of ``res`` in her namespace since ``revision`` up to now; raises KubeError when
    the record is gone (410) or the watch broke off before its end."""

    events: list[tuple[str, kube.Obj]] = []
    begun = time.monotonic()
    try:
        async with asyncio.timeout(RECORD_S + 15):
            async for kind, obj in tenant.admin.watch(
                res, resource_version=revision, namespace=NAMESPACE, timeout_seconds=RECORD_S
            ):
                events.append((kind, obj))
    except TimeoutError as err:
        raise kube.KubeError(0, "Timeout", "the watch did not end") from err
    if time.monotonic() - begun < RECORD_S - 0.5:
        raise kube.KubeError(0, "WatchEnded", "the watch ended before its time")
    return events


async def _released_before_gone(
    tenant: Attacker, revision: str, unit_uid: str, pod_uids: set[str], units: kube.Resource
) -> tuple[bool | None, list[str] | None]:
    """:func:`released_before_gone` over the record since ``revision`` (read after the pods were
    seen gone, so it reaches past their deletion), and the unit's owners when it was deleted
    (:func:`deleted_owners`)."""
    unit_events, pod_events = await asyncio.gather(
        _record_since(tenant, units, revision), _record_since(tenant, kube.PODS, revision)
    )
    order = released_before_gone(unit_events, pod_events, unit_uid, pod_uids)
    return order, deleted_owners(unit_events, unit_uid)


async def _who_deleted(tenant: Attacker, revision: str, unit_uid: str, units: kube.Resource) -> str:
    """Best effort, for a breach's detail: the owner references the unit had when it was deleted,
    from the record since ``revision``; they tell the garbage collector's delete from a release."""
    if not revision:
        return ""
    try:
        owners = deleted_owners(await _record_since(tenant, units, revision), unit_uid)
    except kube.KubeError:
        return ""
    return "" if owners is None else _owners_note(owners)


def _owners_note(owners: list[str]) -> str:
    if owners:
        return f"; it still had owner(s) {', '.join(owners)} when deleted (the garbage collector's delete)"
    return "; it had no owner left when deleted (a release)"


async def orphan_and_recreate(tenant: Attacker, r: int) -> None:
    """Her admitted one-pod Job (500m, its pod running on a kwok node): she deletes it with
    ``--cascade=orphan`` (the pod runs on, ownerless), re-creates a Job of the same name at once,
    and writes a controller reference to the new Job onto the orphaned pod, so that "its job's
    pods" no longer include it. Judged on the API alone, exactly: each read lists her namespace's
    units, then its pods, and while the orphaned pod is still there (terminating or not) the unit of
    that name must be the orphaned one (same UID, holding its admission), never released nor taken
    over by the new Job (:func:`read_finding`); a read the apiserver does not answer (a fault) proves
    nothing. Her quota's published usage must not stay below the running pod's CPU for the whole
    second half of the watch (it trails the units by a publication, so one low read proves
    nothing). If the pod ends during the watch (nothing here ends it: it runs for 300 s), the order
    of the two deletions is read from the record since the last read that saw the unit hold its
    admission with the pod there (:func:`released_before_gone`): the unit deleted before the pod
    was gone is a breach, the pod gone first (say the reconciler deleted it as a pod the new Job
    does not own) is not."""

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
        undecided = ""
        same_at = ""  # the last revision at which the unit was hers and her pod still there
        begun = time.monotonic()
        while time.monotonic() - begun < 2 * WATCH_S:
            # The unit first, then the pods, each read with the revision it shows: a pod seen at
            # the later revision was there at the earlier one too (it was created long before).
            units = await _listed(tenant, UNITS)
            pods = await _listed(tenant, kube.PODS) if units is not None else None
            if units is None or pods is None:
                await asyncio.sleep(0.5)  # unreadable (a fault): proves nothing either way
                continue
            now = next((u for u in units[0] if _meta(u).get("name") == name), None)
            present = orphans_present(pods[0], orphaned_uids, unit_ref)
            if not present:
                # Her pod ended during the watch (nothing here ends it: it runs for 300 s). Whether
                # the unit was released before it was gone is read from the record since the last
                # read that saw both, never guessed from two reads taken one after the other.
                if same_at:
                    owners: list[str] | None = None
                    try:
                        order, owners = await _released_before_gone(
                            tenant, same_at, unit_uid, orphaned_uids, UNITS
                        )
                    except kube.KubeError as err:
                        order = None
                        undecided = f"its record since revision {same_at} is unreadable: {err.message}"
                    if order is None and not undecided:
                        undecided = f"its record since revision {same_at} does not show it gone"
                    if order:
                        breaches.append(
                            f"unit {unit_ref} ({unit_uid}) was deleted before her orphaned pod was "
                            "gone (the record since the last read orders the two deletions)"
                            + ("" if owners is None else _owners_note(owners))
                        )
                break
            reads += 1
            finding = read_finding(now, unit_uid, len(present), unit_ref)
            if finding is not None:
                if not breaches and str(_meta(now or {}).get("uid") or "") != unit_uid:
                    finding += await _who_deleted(tenant, same_at, unit_uid, UNITS)
                breaches.append(finding)
            else:
                same_at = units[1]
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
        elif undecided:
            detail = (
                "her orphaned pod ended during the watch; whether its unit outlived it is unknown: "
                f"{undecided}"
            )
            tenant.record(ATTACK, r, target, "skipped", detail)
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
