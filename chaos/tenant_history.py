"""Hostile-tenant attacks on the usage history (docs/compatibility.md#fair-over-time).

Each quota's decayed usage orders spare capacity among siblings: a tenant who could lower her
quota's would be served ahead of teams that used less. The reconciler's leader keeps it in the
quota's annotation ``koord-queue/usage-history`` (the average and when it was taken), rewritten at
most once a minute. Mallory (``chaos.tenant``) tries, each round:

``annotate-quota-usage-history``
    her quota's record overwritten with a zero one, removed, and her quota deleted (a new quota
    would start at zero; a server-side dry run, so the run is not harmed should it pass): RBAC must
    refuse all three;
``recreate-jobs-to-reset-usage``
    her admitted job deleted and created again under the same name, and another under a new name,
    as if the quota's history were the jobs';
``move-jobs-to-another-quota``
    her admitted job relabelled to her pool quota (the webhook must refuse it while it runs), then
    deleted and created again (under a new name) under that quota.

What the queue guarantees, judged on the records alone (never with the product's code): the next
record of her quota is at or above the one read before the attack decayed across the gap
(``a·2^(-Δ/H)``: whatever was held meanwhile, the average falls no faster), and the next record of
the quota she moved to grows by no more than that quota can hold (``a·d + max·(1-d)``), so it does
not take her history. An attack whose quota shows no newer record in time is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from chaos import load
from chaos.tenant_common import JOBS, NAMESPACE, QUOTA, QUOTAS, UNDO_S, Attacker, _meta
from chaos.tenant_pools import POOL_QUOTA
from koord_queue.shared import kube
from koord_queue.shared.api import durations, names, quantities

ANNOTATE: Final = "annotate-quota-usage-history"
RECREATE: Final = "recreate-jobs-to-reset-usage"
MOVE: Final = "move-jobs-to-another-quota"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``, the report's table).
ATTACKS: Final[dict[str, str]] = {
    ANNOTATE: "RBAC: ElasticQuotas are read-only for namespace users (user roles), so neither her "
    "quota's koord-queue/usage-history nor the quota itself is hers to write or delete",
    RECREATE: "the usage history belongs to the quota, not to jobs: her quota's next record is at or "
    "above the last one decayed across the gap (docs/compatibility.md#fair-over-time)",
    MOVE: "validating webhook: the quota label is frozen while the job runs; moved by a re-create, it "
    "takes no history along: her quota's record only decays, the other quota's grows by no more than "
    "it can hold",
}
#: The record is rewritten once it is this old (``shared.core.quotastatus.HISTORY_WRITE_SECONDS``)...
REWRITE_S: Final = 60.0
#: ... and an attack waits this much longer for it (a fold, the publication's coalescing, faults).
RECORD_GRACE_S: Final = 30.0
#: Records are written to the second and in whole milli units.
SLACK_S: Final = 1.0
SLACK_MILLI: Final = 2
#: What her jobs here ask for: small, so the other attacks sharing her 2-CPU quotas keep their room.
JOB_CPU: Final = "200m"
DRY_RUN: Final = {"dryRun": "All"}


@dataclass(frozen=True)
class Record:
    """``koord-queue/usage-history`` as stored: when (epoch seconds), the half-life (seconds) and the
    decayed usage per resource (milli units)."""

    at: float
    half_life: float
    usage: dict[str, int]


def parse_record(text: object) -> Record | None:
    """The stored record (None when absent or unreadable: an unreadable one is judged as absent)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        doc = json.loads(text)
        at = datetime.fromisoformat(str(doc["at"]).replace("Z", "+00:00")).timestamp()
        half_life = durations.parse_duration(str(doc["halfLife"]))
        usage = {str(r): quantities.parse_milli(v) for r, v in (doc.get("usage") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError, quantities.QuantityError):
        return None
    return Record(at=at, half_life=half_life, usage=usage)


def _decayed(value: float, seconds: float, half_life: float) -> float:
    return float(value * 2.0 ** (-max(0.0, seconds) / half_life)) if half_life > 0 else float(value)


def lowered(before: Record, after: Record) -> list[str]:
    """Resources whose figure in ``after`` fell below ``before``'s decayed across the gap (sorted);
    empty when the history was kept."""
    gap = after.at - before.at + SLACK_S
    return [
        f"{r}: {after.usage.get(r, 0)}m < {value}m decayed over {gap:.0f}s"
        for r, value in sorted(before.usage.items())
        if after.usage.get(r, 0) < _decayed(value, gap, after.half_life) - SLACK_MILLI
    ]


def gained(before: Record, after: Record, limit: Mapping[str, int]) -> list[str]:
    """Resources of ``limit`` whose figure in ``after`` grew beyond what holding the whole limit
    over the gap explains (``a·d + max·(1-d)``, sorted): history that came from elsewhere."""
    gap = after.at - before.at
    out = []
    for r, cap in sorted(limit.items()):
        kept = _decayed(before.usage.get(r, 0), gap - SLACK_S, after.half_life)
        bound = kept + cap - _decayed(cap, gap + SLACK_S, after.half_life) + SLACK_MILLI
        if after.usage.get(r, 0) > bound:
            out.append(f"{r}: {after.usage.get(r, 0)}m > {bound:.0f}m (at most {cap}m held over {gap:.0f}s)")
    return out


def _max_milli(quota: Mapping[str, object]) -> dict[str, int]:
    spec = quota.get("spec")
    raw = spec.get("max") if isinstance(spec, Mapping) else None
    out: dict[str, int] = {}
    for r, v in (raw if isinstance(raw, Mapping) else {}).items():
        with contextlib.suppress(quantities.QuantityError, TypeError):
            out[str(r)] = quantities.parse_milli(v)
    return out


async def _quota(t: Attacker, name: str) -> kube.Obj | None:
    found: kube.Obj | None = await t._read(lambda: t.admin.get(QUOTAS, name, namespace=NAMESPACE))
    return found


async def _record(t: Attacker, name: str) -> Record | None:
    quota = await _quota(t, name)
    return (
        parse_record((_meta(quota).get("annotations") or {}).get(names.QUOTA_USAGE_HISTORY_ANNOTATION))
        if quota
        else None
    )


async def _newer(t: Attacker, name: str, before: Record) -> Record | None:
    """The quota's first record taken after ``before``, waited for until it is due and a little
    longer; None if none came."""
    deadline = time.monotonic() + max(10.0, before.at + REWRITE_S + RECORD_GRACE_S - time.time())
    while time.monotonic() < deadline:
        found = await _record(t, name)
        if found is not None and found.at > before.at:
            return found
        await asyncio.sleep(1.0)
    return None


def _annotation(value: object) -> kube.Obj:
    return {"metadata": {"annotations": {names.QUOTA_USAGE_HISTORY_ANNOTATION: value}}}


def _job(name: str, quota: str) -> kube.Obj:
    """Her job: the load's "victim" shape (admitted, its pod lands nowhere, so it holds its quota)."""
    body = load.job(load.JobPlan(name, quota, "victim", None, False), "mallory", namespace=NAMESPACE)
    body["spec"]["template"]["spec"]["containers"] = [load.container(JOB_CPU)]
    return body


async def history_attacks(t: Attacker, r: int) -> None:
    """The module's attacks for round ``r``."""
    await asyncio.gather(_annotate(t, r), _recreate(t, r), _move(t, r))


async def _annotate(t: Attacker, r: int) -> None:
    m = t.mallory
    assert m is not None
    target = f"{NAMESPACE}/{QUOTA}"
    quota = await _quota(t, QUOTA)
    before = (_meta(quota or {}).get("annotations") or {}).get(names.QUOTA_USAGE_HISTORY_ANNOTATION)
    zero = json.dumps({"at": durations.format_time(time.time()), "halfLife": "1h0m0s", "usage": {}})
    tries: list[tuple[str, Callable[[], Awaitable[kube.Obj]]]] = [
        ("overwrite", functools.partial(m.patch, QUOTAS, QUOTA, _annotation(zero), namespace=NAMESPACE)),
        ("remove", functools.partial(m.patch, QUOTAS, QUOTA, _annotation(None), namespace=NAMESPACE)),
        # A dry run: should RBAC let it through, the run keeps her quota.
        ("delete", functools.partial(m.request, "DELETE", QUOTAS.path(NAMESPACE, QUOTA), query=DRY_RUN)),
    ]
    for what, call in tries:
        sent = await t.send(call, rbac_allows=False)
        if sent.status == "refused":
            t.record(ANNOTATE, r, target, "refused", f"{what}: {sent.message}")
        elif sent.status == "accepted":
            t.record(ANNOTATE, r, target, "SUCCEEDED", f"{what}: accepted, a namespace user wrote her quota")
            if before is not None and what != "delete":  # put it back for the rest of the run
                with contextlib.suppress(kube.KubeError):
                    await t.admin.patch(QUOTAS, QUOTA, _annotation(before), namespace=NAMESPACE)
        else:
            t.record(ANNOTATE, r, target, "skipped", f"{what}: {sent.message}")


async def _gone(t: Attacker, name: str) -> bool:
    """Her job ``name`` is gone (waited for up to :data:`UNDO_S`)."""
    deadline = time.monotonic() + UNDO_S
    while time.monotonic() < deadline:
        try:
            await t.admin.get(JOBS, name, namespace=NAMESPACE)
        except kube.NotFound:
            return True
        except kube.KubeError:
            pass
        await asyncio.sleep(0.5)
    return False


async def _delete(t: Attacker, *jobs: str) -> None:
    m = t.mallory
    assert m is not None
    for name in jobs:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")


async def _recreate(t: Attacker, r: int) -> None:
    m = t.mallory
    assert m is not None
    name, renamed = f"mallory-hist-{r}", f"mallory-hist-{r}-renamed"
    target = f"{NAMESPACE}/{QUOTA}"
    try:
        if await t._own_job_admitted(RECREATE, r, _job(name, QUOTA)) is None:
            return
        before = await _record(t, QUOTA)
        if before is None:
            t.record(RECREATE, r, target, "skipped", "her quota shows no usage record yet")
            return
        await _delete(t, name)
        if not await _gone(t, name):
            t.record(RECREATE, r, target, "skipped", "her deleted job did not go in time")
            return
        for again in (name, renamed):
            await t.send(functools.partial(m.create, JOBS, _job(again, QUOTA), namespace=NAMESPACE))
        await _judge_own(t, RECREATE, r, before, "deleted and recreated her job (same name, new name)")
    finally:
        await _delete(t, name, renamed)


async def _move(t: Attacker, r: int) -> None:
    m = t.mallory
    assert m is not None
    # The job comes back under a new name: the old job's pods linger a while (the garbage collector),
    # and the pool judge (``chaos.tenant_pools``) knows a pod's unit by name only.
    name, moved = f"mallory-move-{r}", f"mallory-move-{r}-moved"
    target = f"{NAMESPACE}/{QUOTA}"
    try:
        if await t._own_job_admitted(MOVE, r, _job(name, QUOTA)) is None:
            return
        before, other_before = await _record(t, QUOTA), await _record(t, POOL_QUOTA)
        if before is None or other_before is None:
            t.record(MOVE, r, target, "skipped", "her quotas show no usage record yet")
            return
        relabel = {"metadata": {"labels": {names.QUOTA_NAME_LABEL: POOL_QUOTA}}}
        sent = await t.send(lambda: m.patch(JOBS, name, relabel, namespace=NAMESPACE))
        if sent.status == "refused":
            t.record(MOVE, r, f"{NAMESPACE}/{name}", "refused", f"relabel: {sent.message}")
        elif sent.status == "accepted":
            detail = f"relabel of her running job to {POOL_QUOTA} accepted"
            t.record(MOVE, r, f"{NAMESPACE}/{name}", "SUCCEEDED", detail)
        await _delete(t, name)
        if not await _gone(t, name):
            t.record(MOVE, r, target, "skipped", "her deleted job did not go in time")
            return
        await t.send(lambda: m.create(JOBS, _job(moved, POOL_QUOTA), namespace=NAMESPACE))
        other_quota = await _quota(t, POOL_QUOTA)
        other_after = await _newer(t, POOL_QUOTA, other_before)
        if other_after is not None:
            found = gained(other_before, other_after, _max_milli(other_quota or {}))
            if found:
                detail = f"{POOL_QUOTA} took history from elsewhere: {'; '.join(found)}"
                t.record(MOVE, r, f"{NAMESPACE}/{POOL_QUOTA}", "SUCCEEDED", detail)
                return
        await _judge_own(t, MOVE, r, before, f"moved her job to {POOL_QUOTA} by a re-create")
    finally:
        await _delete(t, name, moved)


async def _judge_own(t: Attacker, attack: str, r: int, before: Record, what: str) -> None:
    """Her quota's next record against ``before``: lowered beyond the decay is a breach."""
    target = f"{NAMESPACE}/{QUOTA}"
    after = await _newer(t, QUOTA, before)
    if after is None:
        t.record(attack, r, target, "skipped", f"{what}; no newer record of her quota in time")
        return
    found = lowered(before, after)
    if found:
        t.record(attack, r, target, "SUCCEEDED", f"{what}; her quota's usage fell: {'; '.join(found)}")
        return
    detail = (
        f"{what}; record {before.usage} -> {after.usage} over {after.at - before.at:.0f}s, not below decay"
    )
    t.record(attack, r, target, "neutralised", detail)
