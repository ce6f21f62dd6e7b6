"""Users see why a sibling quota gets spare capacity first (docs/compatibility.md#fair-over-time,
docs/compatibility.md#what-users-see-of-the-usage-history), against the real apiserver and the
session's reconciler (usage history on, half-life ``1h``).

Alice's quota and a sibling quota of another namespace share a parent of that other namespace.
Both are created with a ``koord-queue/usage-history`` record (as a previous reconciler would have
left it): alice's quota held 1.5 of the parent's 2 CPU lately, the sibling 0.1. Alice's first job
fills the parent, so her second job waits; the sibling, having used less of its share, is
ahead of her quota for spare capacity.

* ``explain`` as the admin names the sibling ahead, with both quotas' decayed usage and shares;
  as alice (who can read neither the parent nor the sibling) it shows her quota's standing as the
  visibility API serves it to her namespace: second of two, one sibling ahead she cannot read;
* the visibility API, through the aggregation layer with alice's own RBAC, gives her quota's
  ``usageHistory`` and ``fairShare`` (second of two, one ahead) without naming the sibling she
  cannot see; the cluster-wide answer names it;
* ``quotas`` shows the ``USAGE(DECAYED)`` column, and the reconciler's ``/metrics`` the gauge.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from koord_queue.shared.api import durations, names
from testenv import scraping, system
from tests import kube
from tests import scenario as s
from tests.integration.test_cli import USER, Tenant, aggregated, apply, other_namespace, plugin, t

pytestmark = pytest.mark.integration

__all__ = ["aggregated", "t"]  # the fixtures of tests/integration/test_cli.py, used here too

PREFIX = "/apis/visibility.koord-queue.x-k8s.io/v1alpha1"


def shared_quota(name: str, namespace: str, *, parent: str, held: str, at: float) -> dict[str, Any]:
    """A child of ``parent`` with ``min`` 0 and a usage-history record saying it held ``held``."""
    body = s.quota(name, cpu="4", parent=parent)
    body["spec"]["min"] = {"cpu": "0"}
    record = {"at": durations.format_time(at), "halfLife": "1h0m0s", "usage": {"cpu": held}}
    body["metadata"].update(
        namespace=namespace, annotations={names.QUOTA_USAGE_HISTORY_ANNOTATION: json.dumps(record)}
    )
    return body


def raw(t: Tenant, path: str, *, admin: bool = False) -> dict[str, Any]:
    """``kubectl get --raw`` through the aggregation layer, as alice unless ``admin``."""
    args = ["get", "--raw", f"{PREFIX}{path}", *([] if admin else [f"--as={USER}"])]
    body: dict[str, Any] = json.loads(kube.kubectl(t.cluster, *args).stdout)
    return body


async def waiting(t: Tenant, unit: str, *, admin: bool = False) -> dict[str, Any]:
    """``explain -o json`` once the scheduler has written why ``unit`` waits (whichever quota
    reason: the order for spare capacity is shown with any of them)."""

    async def probe() -> dict[str, Any] | None:
        result = t.run("explain", unit, "-o", "json", admin=admin)
        assert result.returncode == 0, result.stderr
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer if answer["waiting"] and answer["recorded"] else None

    found: dict[str, Any] = await kube.eventually(probe, timeout=30, what=f"{unit} waiting with a reason")
    return found


async def counted(t: Tenant, quota: str) -> None:
    """Until the scheduler's history holds ``quota`` (the cluster-wide answer shows when it was
    counted). The scheduler folds history at most once a second, in a cycle: a quota created
    within a second of the last fold waits for a later cycle, so each probe wakes one by touching
    the waiting unit (an annotation nothing reads)."""
    pokes = 0

    async def probe() -> bool:
        nonlocal pokes
        items = {i["metadata"]["name"]: i for i in raw(t, "/quotas", admin=True)["items"]}
        if "at" in items.get(quota, {}).get("usageHistory", {}):
            return True
        pokes += 1
        await t.sc.patch_unit("waiter", {"metadata": {"annotations": {"test.koord-queue/poke": str(pokes)}}})
        return False

    await kube.eventually(probe, timeout=30, interval=0.5, what=f"the scheduler counting {quota}")


def cpu_milli(text: str) -> int:
    return round(float(text[:-1]) if text.endswith("m") else float(text) * 1000)


async def test_explain_quotas_visibility_and_metrics_show_who_gets_spare_capacity_first(
    t: Tenant, system_integration: system.Processes
) -> None:
    parent, mine_q, theirs_q = t.sc.name("fair-p"), t.sc.name("fair-a"), t.sc.name("fair-b")
    at = float(int(time.time()))
    async with other_namespace(t) as theirs:
        apply(t.cluster, {**s.quota(parent, cpu="2"), "metadata": {"name": parent, "namespace": theirs}})
        apply(t.cluster, shared_quota(theirs_q, theirs, parent=parent, held="100m", at=at))
        await t.sc.create_quota(shared_quota(mine_q, t.ns, parent=parent, held="1500m", at=at))
        await t.sc.wait_queue(theirs_q)
        await t.sc.create_unit(s.unit("holder", quota=mine_q, cpu="2"))
        await t.sc.wait_phase("holder", "Dequeued")
        await t.sc.create_unit(s.unit("waiter", quota=mine_q, cpu="1"))
        await counted(t, mine_q)

        admin = await waiting(t, "waiter", admin=True)
        [level] = admin["fairness"]
        assert (level["parent"], level["quota"]) == (parent, mine_q)
        siblings = {sib["name"]: sib for sib in level["siblings"]}
        assert [sib["name"] for sib in level["siblings"]] == [theirs_q, mine_q]
        assert siblings[theirs_q]["ahead"] and siblings[mine_q]["own"] and not siblings[mine_q]["ahead"]
        # Restored from the records and decayed to now: about what they say (1 h half-life).
        assert 1450 <= siblings[mine_q]["usage"]["cpu"] <= 1600
        assert 90 <= siblings[theirs_q]["usage"]["cpu"] <= 110
        assert siblings[mine_q]["share"] == {"cpu": 0.5}
        assert (
            f"ahead of it for spare capacity, because they used less of their share lately: {theirs_q}"
            in (level["text"])
        )
        text = t.text("waiter", admin=True)
        assert f"Spare capacity below {parent} (usage history):" in text and "yours" in text

        # Alice reads neither the parent nor the sibling: the level comes from the visibility API's
        # namespaced answer (the scheduler's figures), the sibling ahead counted, not named.
        mine = await waiting(t, "waiter")
        [served] = mine["fairness"]
        assert (served["parent"], served["quota"], served["served"], served["unseen_ahead"]) == (
            parent,
            mine_q,
            True,
            1,
        )
        assert [sib["name"] for sib in served["siblings"]] == [mine_q]
        assert "2nd of 2 sibling quotas" in served["text"] and "1 you cannot read" in served["text"]
        assert theirs_q not in json.dumps(mine)
        assert "you cannot read, ahead of" in t.text("waiter")

        seen = raw(t, f"/namespaces/{t.ns}/quotas")
        [item] = [i for i in seen["items"] if i["metadata"]["name"] == mine_q]
        assert 1450 <= cpu_milli(item["usageHistory"]["usage"]["cpu"]) <= 2000
        assert item["usageHistory"]["halfLife"] == "1h0m0s"
        share = item["fairShare"]
        assert (share["parent"], share["position"], share["siblings"], share["aheadCount"]) == (
            parent,
            2,
            2,
            1,
        )
        assert share["ahead"] == [] and share["share"] == {"cpu": 0.5}
        assert theirs_q not in json.dumps(seen)
        everything = {i["metadata"]["name"]: i for i in raw(t, "/quotas", admin=True)["items"]}
        assert everything[mine_q]["fairShare"]["ahead"] == [theirs_q]
        assert everything[theirs_q]["fairShare"]["position"] == 1

        quotas = t.run("quotas")
        assert quotas.returncode == 0 and "USAGE(DECAYED)" in quotas.stdout
        rows = {r["name"]: r for r in json.loads(t.run("quotas", "-o", "json").stdout)["items"]}
        assert rows[mine_q]["decayed"].startswith("cpu=")
        assert plugin(t.cluster, "quotas", "--tree", "-A").returncode == 0

        port = next(c.ports["metrics"] for c in system_integration.components if c.name == "reconciler")
        metrics = await asyncio.to_thread(scraping.metrics_text, port)  # docs/operations.md#metrics
        sample = next(
            line
            for line in metrics.splitlines()
            if line.startswith(f'koord_queue_quota_decayed_usage{{quota="{mine_q}",resource="cpu"}}')
        )
        assert 1.45 <= float(sample.split()[-1]) <= 2.0
