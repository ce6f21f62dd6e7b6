"""Gangs on the real apiserver (docs/compatibility.md#gangs-and-partial-admission), black box with
the reconciler running.

Partial admission: a unit whose pod set has ``minCount`` starts with the largest size that fits
and grows as quota frees; without ``minCount`` it waits for all of it. Gang-aware reclaim: a
preemptor never takes part of a half-bound gang, and among equal victims takes the one with no
bound pod. A ``batch/v1`` Job opts in with ``koord-queue/job-min-parallelism``, which the unit
carries as ``minCount``; a bad value is refused at the door as the namespace user alice. Bare
QueueUnits for the scheduling stories: the test plays the job extension through the status
subresource.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests import scenario as s
from tests.integration.test_tenant_quotas import ALICE
from tests.scenario import Scenario, admissions

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


@pytest.fixture
async def sc(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with s.scenario(integration_cluster, namespace_in) as it:
        yield it


def gang(name: str, quota: str, *, count: int, min_count: int | None, priority: int = 0) -> Obj:
    body = s.unit(name, quota=quota, cpu="1", priority=priority)
    pod_set = body["spec"]["podSet"][0]
    pod_set["count"] = count
    if min_count is not None:
        pod_set["minCount"] = min_count
    body["spec"]["resource"] = body["spec"]["request"] = {"cpu": str(count)}
    return body


def replicas(unit: Obj) -> int:
    return sum(a.get("replicas", 0) for a in admissions(unit))


async def test_partial_admission_starts_with_what_fits_and_grows(sc: Scenario) -> None:
    q = sc.name("q")
    await sc.add_quota(q, {"cpu": "6"})
    await sc.create_unit(s.unit("holder", quota=q, cpu="2"))
    await sc.wait_phase("holder")
    await sc.create_unit(gang("elastic", q, count=8, min_count=3))
    await sc.create_unit(gang("rigid", q, count=8, min_count=None))
    got = await sc.wait_unit("elastic", lambda u: replicas(u) == 4, what="4 of 8 admitted")
    assert admissions(got)[0]["name"] == "elastic"
    await sc.wait_message("rigid", "limited quotaName:")
    assert not admissions(await sc.get_unit("rigid"))
    await sc.finish("holder")
    await sc.wait_unit("elastic", lambda u: replicas(u) == 6, what="grown to 6 of 8")


async def test_below_min_count_nothing_is_admitted(sc: Scenario) -> None:
    q = sc.name("q")
    await sc.add_quota(q, {"cpu": "2"})
    await sc.create_unit(gang("g", q, count=8, min_count=3))
    await sc.wait_message("g", "limited quotaName:")
    assert not admissions(await sc.get_unit("g"))


async def test_reclaim_never_breaks_a_half_bound_gang_and_takes_an_unbound_one_whole(sc: Scenario) -> None:
    # Reclaim across quotas (it needs no queue annotation): a borrows b's idle min with two gangs.
    parent, a, b = sc.name("team"), sc.name("a"), sc.name("b")
    await sc.create_quota(s.quota(parent, cpu="8", labels={names.QUOTA_IS_PARENT_LABEL: "true"}))
    for name in (a, b):
        body = s.quota(name, cpu="8", parent=parent)
        body["spec"]["min"] = {"cpu": "4"}
        await sc.create_quota(body)
    await sc.create_unit(gang("half", a, count=4, min_count=4))
    await sc.wait_phase("half")
    await sc.set_running("half", 2)  # two of four workers bound: the others are its members
    await sc.create_unit(gang("idle", a, count=4, min_count=4))
    await sc.wait_phase("idle")
    await sc.create_unit(s.unit("guaranteed", quota=b, cpu="2"))
    await sc.wait_message("guaranteed", f"reclaiming borrowed quota from {a}")

    async def marked() -> Obj:
        idle = await sc.get_unit("idle")
        assert any("reclaimState" in x for x in admissions(idle)), admissions(idle)
        return idle

    idle = await kube.eventually(marked, what="the unbound gang marked whole")
    assert admissions(idle)[0]["reclaimState"]["replicas"] == 4
    assert not any("reclaimState" in x for x in admissions(await sc.get_unit("half")))


async def test_a_job_opts_in_with_job_min_parallelism(
    sc: Scenario, integration_cluster: LocalCluster
) -> None:
    q = sc.name("q")
    await sc.add_quota(q, {"cpu": "4"})
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "labels": {names.QUOTA_NAME_LABEL: q},
            "annotations": {names.JOB_MIN_PARALLELISM_ANNOTATION: "2"},
        },
        "spec": {
            "parallelism": 6,
            "completions": 6,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            },
        },
    }
    sc.submit(job)
    units = await kube.eventually(lambda: _one_unit(sc), what="the Job's QueueUnit")
    assert units["spec"]["podSet"][0]["minCount"] == 2
    await sc.wait_unit(units["metadata"]["name"], lambda u: replicas(u) == 4, what="4 of 6 admitted")
    tenancy.grant(integration_cluster, sc.ns)
    bad = json.loads(json.dumps(job))
    bad["metadata"]["name"] = "bad"
    bad["metadata"]["annotations"][names.JOB_MIN_PARALLELISM_ANNOTATION] = "lots"

    async def refused() -> str:
        done = tenancy.as_user(
            integration_cluster,
            ALICE,
            "-n",
            sc.ns,
            "create",
            "--dry-run=server",
            "-f",
            "-",
            input_text=json.dumps(bad),
        )
        assert done.returncode != 0 and names.JOB_MIN_PARALLELISM_ANNOTATION in done.stderr, done.stderr
        return str(done.stderr)

    await kube.eventually(refused, what="a bad min parallelism refused")


async def _one_unit(sc: Scenario) -> Obj | None:
    units = await sc.list_units()
    return units[0] if len(units) == 1 else None
