"""A Job deleted with ``kubectl delete --cascade=orphan`` lets go of its QueueUnit even where no
garbage collector does it (docs/compatibility.md#jobs-deleted-with---cascadeorphan).

The garbage collector orphans only the dependents it has seen: one that does not follow QueueUnits
yet, or whose QueueUnit watch is behind after an apiserver restart, leaves the Job's owner reference
on the unit and, once the Job is gone, deletes the unit as the dependent of a missing owner while
the orphaned pods still run on its quota (round 0 of the 2026-12-04 quick chaos run). The reconciler
drops the owner reference itself. The integration control plane runs no garbage collector at all,
so a Job deleted with orphan propagation keeps the ``orphan`` finalizer: whatever happens to its
unit is the reconciler's doing. The test then plays the collector's last step (the finalizer
removed, the Job gone) and the unit, with no pod naming it, is released.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from testenv import system
from testenv.cluster import LocalCluster
from tests import kube
from tests.integration.test_job_kinds import ROOM
from tests.integration.test_tenant_hold import batch_job
from tests.scenario import Scenario, scenario

pytestmark = pytest.mark.integration


@pytest.fixture
async def env(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Scenario]:
    async with scenario(integration_cluster, namespace_in) as it:
        yield it


async def test_a_job_deleted_with_cascade_orphan_lets_go_of_its_unit_without_a_garbage_collector(
    env: Scenario,
) -> None:
    quota = env.name("q")
    await env.add_quota(quota, ROOM)
    job = env.submit(batch_job("orphaned", quota))
    uid = job["metadata"]["uid"]
    unit = await env.wait_unit(
        "orphaned",
        lambda u: any(r.get("uid") == uid for r in u["metadata"].get("ownerReferences") or []),
        what="owned by its Job",
    )
    env.kubectl("delete", "-n", env.ns, "job", "orphaned", "--cascade=orphan", "--wait=false")

    async def let_go() -> Any:
        found = await env.find_unit("orphaned")
        if found is None:
            return "released"  # a unit made within its Job's second is the orphan's at once
        owners = [r.get("uid") for r in found["metadata"].get("ownerReferences") or []]
        return (
            "ownerless" if uid not in owners and found["metadata"]["uid"] == unit["metadata"]["uid"] else None
        )

    outcome = await kube.eventually(let_go, what="the reconciler letting go of the orphaned unit")
    deleting = env.get_job_sync(job)["metadata"]
    assert deleting.get("deletionTimestamp") and "orphan" in deleting.get("finalizers", []), deleting
    # Play the garbage collector's last step: the finalizer off, the Job goes; no pod names the
    # unit, so it is released (if it was not already).
    unfinalize = '{"metadata":{"finalizers":null}}'
    env.kubectl("patch", "job", "orphaned", "-n", env.ns, "--type=merge", "-p", unfinalize)

    async def released() -> bool:
        return await env.find_unit("orphaned") is None

    await kube.eventually(
        released, what=f"the orphaned unit released once its Job is gone ({outcome} before)"
    )
