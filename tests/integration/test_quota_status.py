"""Quota figures published on the real apiserver (docs/compatibility.md#quota-guarantees,
"Published figures"), black box with the session's reconciler running (``publishQuotaStatus`` on,
its default):

* ``status.used`` and the runtime and request annotations appear on a new quota and follow its
  usage and waiting demand;
* a child borrowing from an oversubscribed parent shows the amount in ``koord-queue/borrowed``,
  which goes away once it no longer borrows; ``kubectl get elasticquota`` prints the figures in the
  CRD's columns (RUNTIME with ``-o wide``);
* the namespace user alice can write none of them: not the annotations, not the status;
* the visibility API answers the same figures, per namespace only for the quotas bound to it.

With ``publishQuotaStatus: false`` nothing is written: the session runs one reconciler with the
default configuration, so that is proved on the wiring in tests/unit/test_quota_status.py.
Bare QueueUnits: the test plays the job extension through the status subresource.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests import scenario as s
from tests.integration.test_scenarios_guarantees import admitted, submit, tree
from tests.integration.test_tenant_quotas import ALICE
from tests.integration.test_visibility import serving_visibility
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
RUNTIME, REQUEST, BORROWED = (
    names.QUOTA_RUNTIME_ANNOTATION,
    names.QUOTA_REQUEST_ANNOTATION,
    names.QUOTA_BORROWED_ANNOTATION,
)


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


async def get_quota(sc: Scenario, name: str) -> Obj:
    found: Obj = await sc.objects.get_namespaced_custom_object(
        names.QUOTA_GROUP, names.QUOTA_VERSION, sc.ns, names.QUOTA_PLURAL, name
    )
    return found


def figures(quota: Obj) -> dict[str, Any]:
    """What the quota shows: status.used and the three annotations (parsed; None when absent)."""
    annotations = quota["metadata"].get("annotations") or {}
    shown: dict[str, Any] = {"used": (quota.get("status") or {}).get("used")}
    for key, label in ((RUNTIME, "runtime"), (REQUEST, "request"), (BORROWED, "borrowed")):
        shown[label] = json.loads(annotations[key]) if key in annotations else None
    return shown


async def shows(sc: Scenario, name: str, want: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        shown = figures(await get_quota(sc, name))
        return shown if want(shown) else None

    # Writes are coalesced to one per quota every 5 s: allow a few intervals.
    result: dict[str, Any] = await kube.eventually(probe, timeout=40, what=f"{name}: {what}")
    return result


async def test_status_used_and_the_annotations_appear_and_follow_usage(sc: Scenario) -> None:
    q = sc.name("q")
    await sc.create_quota(s.quota(q, cpu="4"))
    await shows(
        sc,
        q,
        lambda f: (
            f == {"used": {"cpu": "0"}, "runtime": {"cpu": "0"}, "request": {"cpu": "0"}, "borrowed": None}
        ),
        "zero figures on a new quota",
    )
    await sc.create_unit(s.unit("a", quota=q, cpu="2"))
    await sc.wait_phase("a")
    await sc.create_unit(s.unit("b", quota=q, cpu="3"))
    await sc.wait_message("b", f"limited quotaName:{q}")
    # Used 2; asked 2 + 3, capped at max 4; a top-level quota may use what it asks for.
    await shows(
        sc,
        q,
        lambda f: f["used"] == {"cpu": "2"} and f["request"] == f["runtime"] == {"cpu": "4"},
        "usage and the waiting demand",
    )
    await sc.finish("a")
    await sc.wait_phase("b")
    # The figures converge: a write taken between b's admission and its leaving the queue's demand
    # counts b in both for one interval (request capped at 4), and the next write corrects it.
    shown = await shows(
        sc, q, lambda f: f["used"] == f["request"] == {"cpu": "3"}, "the second unit's usage, nothing waiting"
    )
    assert shown["borrowed"] is None, shown


async def test_a_borrowing_child_shows_what_it_borrows_also_in_kubectl_get(sc: Scenario) -> None:
    parent, a, b = await tree(sc, ("a", "5", {}), ("b", "5", {}))
    units = await submit(sc, a, 7)
    await admitted(sc, units)  # 7 of a's min 5: it borrows 2 of b's idle min
    shown = await shows(sc, a, lambda f: f["borrowed"] == {"cpu": "2"}, "2 cpu borrowed")
    assert shown["used"] == {"cpu": "7"}
    assert shown["runtime"] == shown["request"] == {"cpu": "7"}, shown  # b idle: a gets what it asks
    await shows(sc, b, lambda f: f["used"] == {"cpu": "0"} and f["borrowed"] is None, "b idle")
    await shows(sc, parent, lambda f: f["used"] == {"cpu": "7"}, "the parent counting its children")

    table = sc.kubectl("get", "elasticquota", "-n", sc.ns, a).stdout
    print(f"$ kubectl get elasticquota {a}\n{table}")
    header, row = table.splitlines()
    assert header.split() == ["NAME", "MIN", "MAX", "USED", "BORROWED", "AGE"], header
    assert row.split()[:5] == [a, '{"cpu":"5"}', '{"cpu":"10"}', '{"cpu":"7"}', '{"cpu":"2"}'], row
    wide = sc.kubectl("get", "elasticquota", "-n", sc.ns, a, "-o", "wide").stdout
    header, row = wide.splitlines()
    assert header.split()[:6] == ["NAME", "MIN", "MAX", "USED", "BORROWED", "RUNTIME"], header
    assert row.split()[5] == '{"cpu":"7"}', row

    await sc.finish(units[0])
    await sc.finish(units[1])
    await shows(sc, a, lambda f: f["used"] == {"cpu": "5"} and f["borrowed"] is None, "borrowing no more")
    header, row = sc.kubectl("get", "elasticquota", "-n", sc.ns, a).stdout.splitlines()
    start, end = header.index("BORROWED"), header.index("AGE")
    assert row.split()[3] == '{"cpu":"5"}' and row[start:end].strip() == "", row  # an empty cell


async def test_a_namespace_user_cannot_write_the_published_figures(
    sc: Scenario, integration_cluster: LocalCluster
) -> None:
    q = sc.name("q")
    await sc.create_quota(s.quota(q, cpu="4"))
    # status.used and the annotations are two writes: wait for both, or the second one lands
    # between ``before`` and the comparison below.
    await shows(
        sc,
        q,
        lambda f: f["used"] == f["runtime"] == f["request"] == {"cpu": "0"},
        "zero figures published in the status and the annotations",
    )
    tenancy.grant(integration_cluster, sc.ns)
    before = await get_quota(sc, q)
    fake = json.dumps({"cpu": "100"})
    for args in (
        ("annotate", "elasticquota", q, f"{BORROWED}={fake}", "--overwrite"),
        ("annotate", "elasticquota", q, f"{RUNTIME}={fake}", "--overwrite"),
        ("annotate", "elasticquota", q, f"{REQUEST}={fake}", "--overwrite"),
        ("patch", "elasticquota", q, "--subresource=status", "--type=merge", "-p", '{"status":{"used":{}}}'),
        ("patch", "elasticquota", q, "--type=merge", "-p", '{"status":{"used":{}}}'),
    ):
        done = tenancy.as_user(integration_cluster, ALICE, "-n", sc.ns, *args)
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), (args, done.stderr)
    assert figures(await get_quota(sc, q)) == figures(before)


async def test_the_visibility_api_answers_the_same_figures_per_namespace_only_for_its_quotas(
    sc: Scenario, integration_cluster: LocalCluster, system_integration: system.Processes
) -> None:
    mine, lent = sc.name("mine"), sc.name("lent")
    await sc.create_quota(s.quota(mine, cpu="4"))
    # A quota of the same namespace that lists another namespace: seen from there as well.
    other = f"{sc.ns}-other"
    await sc.create_quota(
        s.quota(lent, cpu="2", annotations={names.QUOTA_NAMESPACES_ANNOTATION: json.dumps([other])})
    )
    await sc.create_unit(s.unit("a", quota=mine, cpu="1"))
    await sc.wait_phase("a")
    # status.used and the annotations are two writes (the status subresource, then the metadata):
    # wait for both, or a reader between them sees the new usage beside the old request.
    published = await shows(
        sc,
        mine,
        lambda f: f["used"] == f["runtime"] == f["request"] == {"cpu": "1"},
        "usage published in the status and the annotations",
    )
    vis = await serving_visibility(integration_cluster, system_integration)

    status, body = await vis.get("/quotas")
    assert status == 200 and body["kind"] == "QuotaSummary", body
    item = next(i for i in body["items"] if i["metadata"]["name"] == mine)
    assert item["metadata"]["namespace"] == sc.ns
    assert (item["used"], item["runtime"], item["request"], item["borrowed"]) == (
        published["used"],
        published["runtime"],
        published["request"],
        {},
    )
    assert (item["min"], item["max"]) == ({"cpu": "4"}, {"cpu": "4"})

    status, body = await vis.get(f"/namespaces/{sc.ns}/quotas")
    assert status == 200 and [i["metadata"]["name"] for i in body["items"]] == sorted([mine, lent])
    status, body = await vis.get(f"/namespaces/{other}/quotas")
    assert status == 200 and [i["metadata"]["name"] for i in body["items"]] == [lent]
