"""Quota guarantees on the real apiserver (docs/compatibility.md#quota-guarantees,
docs/compatibility.md#reclaim-across-quotas), black box with the reconciler running.

An oversubscribed parent (``max`` 10 CPU) with children whose ``max`` add up to more: a child
borrows while its sibling idles; the sibling returns and reclaims its ``min`` from borrowed units
that do not run; a sibling that does not lend keeps its ``min``; a running borrower is left alone
and the guarantee is met as it finishes; three siblings share spare capacity by weight; and the
tree rules at the door (a cycle, children's ``min`` beyond the parent's, a job labelled with a
parent quota, tried as the namespace user alice). Bare QueueUnits: the test plays the job
extension (``running``, and the reclaim of marked replicas) through the status subresource.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests import scenario as s
from tests.integration.test_tenant_quotas import ALICE
from tests.scenario import Scenario, admissions, message, phase

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


def child(
    name: str,
    parent: str,
    *,
    min_cpu: str,
    max_cpu: str = "10",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    body = s.quota(name, cpu=max_cpu, parent=parent, labels=labels, annotations=annotations)
    body["spec"]["min"] = {"cpu": min_cpu}
    return body


async def tree(sc: Scenario, *children: tuple[str, str, Mapping[str, str]], cpu: str = "10") -> list[str]:
    """A parent quota (``is-parent``, min = max = ``cpu``) and ``(suffix, min, labels)`` children."""
    parent = sc.name("team")
    await sc.create_quota(s.quota(parent, cpu=cpu, labels={names.QUOTA_IS_PARENT_LABEL: "true"}))
    made = []
    for suffix, min_cpu, labels in children:
        name = sc.name(suffix)
        await sc.create_quota(child(name, parent, min_cpu=min_cpu, labels=labels))
        made.append(name)
    return [parent, *made]


async def submit(sc: Scenario, quota: str, count: int, *, start: int = 0, priority: int = 0) -> list[str]:
    made = []
    for i in range(start, start + count):
        name = f"{quota}-{i:02}"
        await sc.create_unit(s.unit(name, quota=quota, cpu="1", priority=priority))
        made.append(name)
    return made


async def admitted(sc: Scenario, names_: list[str]) -> None:
    for name in names_:
        await sc.wait_phase(name)


async def reclaim_marked(sc: Scenario, name: str) -> None:
    """Play the job extension: the marked replicas' unbound pods are gone."""

    def change(st: Obj) -> None:
        for adm in st.get("admissions") or []:
            taken = (adm.pop("reclaimState", None) or {}).get("replicas", 0)
            adm["replicas"] = max(0, adm["replicas"] - taken)

    await sc.update_status(name, change)


def marked(unit: Obj) -> bool:
    return any("reclaimState" in a for a in admissions(unit))


async def test_a_child_borrows_while_its_sibling_idles_and_the_sibling_reclaims_its_min(sc: Scenario) -> None:
    _, a, b = await tree(sc, ("a", "5", {}), ("b", "5", {}))
    borrowed = await submit(sc, a, 10)
    await admitted(sc, borrowed)  # a borrows b's idle min: 10 of 10
    for name in borrowed[:6]:
        await sc.set_running(name, 1)
    back = await submit(sc, b, 3, start=50)
    await sc.wait_message(back[0], f"reclaiming borrowed quota from {a}")
    # The newest not-running borrowed units are marked; running ones never.

    async def three_marked() -> list[str]:
        found = [n for n in reversed(borrowed) if marked(await sc.get_unit(n))]
        assert found == [borrowed[9], borrowed[8], borrowed[7]], [
            (n, message(u), admissions(u)) for n in borrowed + back for u in [await sc.get_unit(n)]
        ]
        return found

    victims = await kube.eventually(three_marked, what="the three newest borrowed units marked")
    for name in borrowed[:6]:
        assert not marked(await sc.get_unit(name))
    for name in victims:
        await reclaim_marked(sc, name)
    await admitted(sc, back)
    assert not marked(await sc.get_unit(borrowed[6]))


async def test_a_sibling_that_does_not_lend_keeps_its_min(sc: Scenario) -> None:
    _, a, _ = await tree(sc, ("a", "5", {}), ("b", "5", {names.QUOTA_ALLOW_LENT_LABEL: "false"}))
    units = await submit(sc, a, 7)
    await admitted(sc, units[:5])
    await sc.wait_message(units[5], "held for sibling quotas")
    await sc.assert_waiting(units[6])


async def test_a_running_borrower_is_left_alone_and_the_guarantee_is_met_as_it_finishes(sc: Scenario) -> None:
    _, a, b = await tree(sc, ("a", "5", {}), ("b", "5", {}))
    borrowed = await submit(sc, a, 10)
    await admitted(sc, borrowed)
    for name in borrowed:
        await sc.set_running(name, 1)
    wanted = await submit(sc, b, 2, start=50)
    await sc.wait_message(wanted[0], f"waiting for {a} to return borrowed quota")
    for name in borrowed:
        assert not marked(await sc.get_unit(name))
    await sc.finish(borrowed[0])
    await sc.finish(borrowed[1])
    await admitted(sc, wanted)


async def test_three_siblings_share_spare_capacity_by_weight(sc: Scenario) -> None:
    parent = sc.name("team")
    await sc.create_quota(s.quota(parent, cpu="8", labels={names.QUOTA_IS_PARENT_LABEL: "true"}))
    kids = [sc.name(x) for x in ("a", "b", "c")]
    for name, weight in zip(kids, ("2", "1", "1"), strict=True):
        annotations = {names.QUOTA_SHARED_WEIGHT_ANNOTATION: json.dumps({"cpu": weight})}
        await sc.create_quota(child(name, parent, min_cpu="0", annotations=annotations))
    # A blocker holds the whole parent while the three siblings' demand arrives, so that they
    # compete for the same freed capacity (shares divide spare capacity; they take nothing back).
    blocker = sc.name("d")
    await sc.create_quota(child(blocker, parent, min_cpu="0"))
    await sc.create_unit(s.unit("blocker", quota=blocker, cpu="8"))
    await sc.wait_phase("blocker")
    made = {k: await submit(sc, k, 8) for k in kids}
    await sc.wait_message(made[kids[2]][7], "limited quotaName:")
    await sc.finish("blocker")

    async def shares() -> tuple[int, ...] | None:
        got = []
        for k in kids:
            units = [await sc.get_unit(n) for n in made[k]]
            got.append(sum(1 for u in units if phase(u) in s.ADMITTED))
        assert tuple(got) == (4, 2, 2), f"admitted per quota {got}"
        return tuple(got)

    await kube.eventually(shares, what="spare capacity shared 2:1:1")


async def refused(
    sc: Scenario, args: tuple[str, ...], text: str, *, body: Obj | None = None, user: str = ""
) -> str:
    """A server-side dry run of ``kubectl args`` is refused with ``text`` (the policies read the
    ConfigMap the reconciler keeps, so they may need a moment); as ``user`` when given."""
    who = (f"--as={user}",) if user else ()
    stdin = json.dumps(body) if body is not None else None

    async def attempt() -> str:
        done = sc.kubectl(*who, "-n", sc.ns, *args, "--dry-run=server", input_text=stdin, check=False)
        assert done.returncode != 0, f"accepted: {done.stdout}"
        assert text in done.stderr, done.stderr
        return str(done.stderr)

    return await kube.eventually(attempt, what=f"refused with {text!r}")


def merge(min_cpu: str) -> tuple[str, ...]:
    return ("--type=merge", "-p", json.dumps({"spec": {"min": {"cpu": min_cpu}}}))


async def test_tree_rules_are_checked_at_the_door(sc: Scenario) -> None:
    parent, a, _ = await tree(sc, ("a", "5", {}), ("b", "4", {}))
    more = f"the min of the children of {parent} would add up to more than"
    # A third child whose min makes them add up to 11 > 10.
    await refused(sc, ("create", "-f", "-"), more, body=child(sc.name("c"), parent, min_cpu="2"))
    # Raising an existing child's min past the parent's.
    await refused(sc, ("patch", "elasticquota", a, *merge("7")), more)
    # Lowering the parent's min below its children's.
    await refused(
        sc,
        ("patch", "elasticquota", parent, *merge("8")),
        f"the min of the children of {parent} add up to more than",
    )
    # A cycle: the parent labelled as a child of its own child.
    await refused(
        sc, ("label", "elasticquota", parent, f"{names.QUOTA_PARENT_LABEL}={a}", "--overwrite"), "a cycle"
    )
    # Within the parent's min a new child is fine, and so is resizing a child within it.
    await sc.create_quota(child(sc.name("d"), parent, min_cpu="1"))
    done = sc.kubectl("-n", sc.ns, "patch", "elasticquota", a, *merge("4"))
    assert done.returncode == 0


async def test_children_with_min_equal_to_max_may_oversubscribe_as_upstream_trees_do(sc: Scenario) -> None:
    parent = sc.name("org")
    await sc.create_quota(s.quota(parent, cpu="4"))
    for suffix in ("x", "y", "z"):  # 3 x 4 > 4, each min == max: nobody borrows, upstream's set-up
        await sc.create_quota(s.quota(sc.name(suffix), cpu="4", parent=parent))
    # A child that could borrow may not join such a family beyond the parent's min.
    await refused(
        sc,
        ("create", "-f", "-"),
        f"the min of the children of {parent} would add up to more than",
        body=child(sc.name("w"), parent, min_cpu="1", max_cpu="4"),
    )


async def test_a_namespace_user_cannot_submit_to_a_parent_quota_nor_change_quotas(
    sc: Scenario, integration_cluster: LocalCluster
) -> None:
    parent, a, _ = await tree(sc, ("a", "5", {}), ("b", "5", {}))
    tenancy.grant(integration_cluster, sc.ns)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sneaky", "labels": {names.QUOTA_NAME_LABEL: parent}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            }
        },
    }
    await refused(sc, ("create", "-f", "-"), "is a parent quota", body=job, user=ALICE)
    # A bare QueueUnit labelled with the parent (units are not guarded by the door) waits with
    # the same text and never holds quota.
    await sc.create_unit(s.unit("direct", quota=parent, cpu="1"))
    await sc.wait_message("direct", "is a parent quota")
    assert not admissions(await sc.get_unit("direct"))
    # alice may not raise her quota's min or weight, nor stop her sibling from lending.
    for args in (
        ("patch", "elasticquota", a, *merge("10")),
        ("annotate", "elasticquota", a, f'{names.QUOTA_SHARED_WEIGHT_ANNOTATION}={{"cpu":"100"}}'),
        ("label", "elasticquota", a, f"{names.QUOTA_ALLOW_LENT_LABEL}=false"),
    ):
        done = tenancy.as_user(integration_cluster, ALICE, "-n", sc.ns, *args)
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
