"""Hostile-tenant attacks on preemption priority and the preemption policy
(docs/compatibility.md#preemption-priority, docs/compatibility.md#non-preempting-jobs).

A job's ``koord-queue/preemption-priority`` is the priority its unit is preempted at: capped like the
priority, and fixed once the job exists; ``koord-queue/preemption-policy: Never`` makes it wait for
room instead of preempting, fixed as well. Mallory, a namespace user (``chaos.tenant``), attacks
both from her own namespace, each round:

``preemption-priority-above-cap``
    a job asking to be preempted only above ``int32`` max, far above the run's ``maxUserPriority``:
    the webhook must refuse it, or (had it passed) her unit's preemption priority must stay within
    what her priority may be;
``raise-preemption-priority``
    a job created with a low preemption priority whose annotation she then raises to the cap: the
    webhook must refuse the change, or her unit must keep the value it had;
``flip-preemption-policy``
    a job created with ``preemption-policy: Never`` whose annotation she flips to
    ``PreemptLowerPriority``: refused, or her unit must stay ``Never``;
``write-queueunit-preemption``
    her own unit's ``spec.preemptionPriority`` and ``spec.preemptionPolicy`` written directly: RBAC
    must refuse it (units are not hers to write).

Her jobs are the load's "victim" shape (their pods land nowhere) and are deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Final

from chaos import load
from chaos.tenant_common import JOBS, NAMESPACE, QUOTA, UNITS, WATCH_S, Attacker, Sent
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.goparse import INT32_MAX

ABOVE_CAP: Final = "preemption-priority-above-cap"
RAISE: Final = "raise-preemption-priority"
FLIP: Final = "flip-preemption-policy"
WRITE_UNIT: Final = "write-queueunit-preemption"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``, the report's table).
ATTACKS: Final[dict[str, str]] = {
    ABOVE_CAP: "validating webhook: koord-queue/preemption-priority <= maxUserPriority; reconciler clamps "
    "the unit's spec.preemptionPriority to the smallest cap (docs/compatibility.md#preemption-priority)",
    RAISE: "validating webhook: koord-queue/preemption-priority is immutable once the job exists",
    FLIP: "validating webhook: koord-queue/preemption-policy is immutable once the job exists",
    WRITE_UNIT: "RBAC: QueueUnits are read-only for namespace users",
}
#: The preemption priority her job is created with (below any cap).
LOW_PREEMPTION_PRIORITY: Final = 1
#: How long her unit is waited for before an attack on it is skipped.
UNIT_S: Final = 30.0


def _job(name: str, annotations: dict[str, str]) -> kube.Obj:
    body = load.job(load.JobPlan(name, QUOTA, "victim", None, False), "mallory", namespace=NAMESPACE)
    body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
    body["metadata"]["annotations"].update(annotations)
    return body


def _spec(unit: kube.Obj) -> dict[str, Any]:
    spec = unit.get("spec")
    return spec if isinstance(spec, dict) else {}


async def preemption_attacks(t: Attacker, r: int, *, bound: int) -> None:
    """The module's attacks for round ``r``; ``bound`` is the highest priority a unit of her
    namespace may carry under the run's settings (``chaos.tenant.OWN_PRIORITY_BOUND``), so the
    highest preemption priority it may carry too."""
    await asyncio.gather(_above_cap(t, r, bound), _raise(t, r), _flip(t, r))


async def _watch_unit(t: Attacker, name: str, harmed: Callable[[kube.Obj], str | None]) -> str | None:
    """Read her unit for :data:`WATCH_S`; the first harm ``harmed`` names, else None."""
    begun = time.monotonic()
    while time.monotonic() - begun < WATCH_S:
        unit = await t._own_unit(name)
        found = harmed(unit) if unit else None
        if found is not None:
            return found
        await asyncio.sleep(0.5)
    return None


async def _wait_unit(t: Attacker, name: str, ready: Callable[[kube.Obj], bool]) -> kube.Obj | None:
    begun = time.monotonic()
    while time.monotonic() - begun < UNIT_S:
        unit = await t._own_unit(name)
        if unit and ready(unit):
            return unit
        await asyncio.sleep(0.5)
    return None


async def _above_cap(t: Attacker, r: int, bound: int) -> None:
    m = t.mallory
    assert m is not None
    name = f"mallory-ppcap-{r}"
    target = f"{NAMESPACE}/{name}"
    body = _job(name, {names.PREEMPTION_PRIORITY_ANNOTATION: str(INT32_MAX)})
    sent = await t.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
    if sent.status != "accepted":
        t.record(ABOVE_CAP, r, target, "refused" if sent.status == "refused" else "skipped", sent.message)
        return
    try:

        def harmed(unit: kube.Obj) -> str | None:
            value = _spec(unit).get("preemptionPriority")
            return (
                f"her unit's preemption priority became {value}"
                if isinstance(value, int) and value > bound
                else None
            )

        found = await _watch_unit(t, name, harmed)
        if found is not None:
            t.record(ABOVE_CAP, r, target, "SUCCEEDED", f"{found} (allowed at most {bound})")
        else:
            t.record(
                ABOVE_CAP,
                r,
                target,
                "neutralised",
                f"accepted; the unit's preemption priority stayed <= {bound}",
            )
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")


async def _raise(t: Attacker, r: int) -> None:
    """Create with a low preemption priority, then raise it; then write her unit's fields directly."""
    m = t.mallory
    assert m is not None
    name = f"mallory-ppraise-{r}"
    target = f"{NAMESPACE}/{name}"
    key = names.PREEMPTION_PRIORITY_ANNOTATION
    body = _job(name, {key: str(LOW_PREEMPTION_PRIORITY)})
    sent = await t.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
    if sent.status != "accepted":
        for attack in (RAISE, WRITE_UNIT):
            t.record(attack, r, target, "skipped", f"her job was not accepted: {sent.message}")
        return
    try:
        unit = await _wait_unit(
            t, name, lambda u: _spec(u).get("preemptionPriority") == LOW_PREEMPTION_PRIORITY
        )
        if unit is None:
            for attack in (RAISE, WRITE_UNIT):
                t.record(attack, r, target, "skipped", "her unit did not show up in time")
            return
        patch = {"metadata": {"annotations": {key: str(INT32_MAX)}}}
        sent = await t.send(lambda: m.patch(JOBS, name, patch, namespace=NAMESPACE))
        await _judge(
            t,
            RAISE,
            r,
            name,
            sent,
            lambda u: _spec(u).get("preemptionPriority") not in (LOW_PREEMPTION_PRIORITY, None),
            "her unit's preemption priority was raised",
        )
        await _write_unit(t, r, name)
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")


async def _flip(t: Attacker, r: int) -> None:
    m = t.mallory
    assert m is not None
    name = f"mallory-ppflip-{r}"
    target = f"{NAMESPACE}/{name}"
    key = names.PREEMPTION_POLICY_ANNOTATION
    body = _job(name, {key: names.PREEMPTION_POLICY_NEVER})
    sent = await t.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
    if sent.status != "accepted":
        t.record(FLIP, r, target, "skipped", f"her job was not accepted: {sent.message}")
        return
    try:
        never = names.PREEMPTION_POLICY_NEVER
        if await _wait_unit(t, name, lambda u: _spec(u).get("preemptionPolicy") == never) is None:
            t.record(FLIP, r, target, "skipped", "her unit did not show up in time")
            return
        patch = {"metadata": {"annotations": {key: names.PREEMPTION_POLICY_PREEMPT}}}
        sent = await t.send(lambda: m.patch(JOBS, name, patch, namespace=NAMESPACE))
        await _judge(
            t,
            FLIP,
            r,
            name,
            sent,
            lambda u: _spec(u).get("preemptionPolicy") != never,
            "her unit may preempt now",
        )
    finally:
        with contextlib.suppress(kube.KubeError):
            await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")


async def _judge(
    t: Attacker, attack: str, r: int, name: str, sent: Sent, harm: Callable[[kube.Obj], bool], what: str
) -> None:
    """A change of her job's annotation: refused, or accepted and then watched on her unit."""
    target = f"{NAMESPACE}/{name}"
    if sent.status == "refused":
        t.record(attack, r, target, "refused", sent.message)
        return
    if sent.status != "accepted":
        t.record(attack, r, target, "skipped", sent.message)
        return
    found = await _watch_unit(t, name, lambda u: what if harm(u) else None)
    if found is not None:
        t.record(attack, r, target, "SUCCEEDED", found)
    else:
        t.record(attack, r, target, "neutralised", "accepted; her unit kept its value")


async def _write_unit(t: Attacker, r: int, name: str) -> None:
    m = t.mallory
    assert m is not None
    target = f"{NAMESPACE}/{name}"
    patch = {"spec": {"preemptionPriority": INT32_MAX, "preemptionPolicy": names.PREEMPTION_POLICY_PREEMPT}}
    sent = await t.send(lambda: m.patch(UNITS, name, patch, namespace=NAMESPACE), rbac_allows=False)
    if sent.status == "refused":
        t.record(WRITE_UNIT, r, target, "refused", sent.message)
    elif sent.status == "accepted":
        t.record(
            WRITE_UNIT,
            r,
            target,
            "SUCCEEDED",
            "accepted: a namespace user wrote her unit's preemption fields",
        )
    else:
        t.record(WRITE_UNIT, r, target, "skipped", sent.message)
