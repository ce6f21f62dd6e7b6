"""A tenant's copy of the quota-binding parameters in her own namespace binds nothing
(docs/operations.md#install-namespace).

The quota-binding admission policy reads its parameters, the ConfigMap
``koord-queue-quota-bindings``, from the install namespace only (its binding's ``paramRef``), and the
scheduler checks the binding itself from the quotas, never from a ConfigMap. alice (a namespace
user, ``kubectl --as=alice``) may write ConfigMaps in her namespace, so she makes one of that name
there: exactly what the reconciler would write were another team's quota bound to her namespace,
with enforcement off. Her Job naming that quota is still refused at the door with the usual text,
the install's ConfigMap still binds the quota to its own namespace only, and a unit naming it that
reaches the scheduler anyway (made by an admin) waits with the reason, never admitted. The chaos
run's hostile tenant makes the same plant against a loaded system (``chaos/tenant_plant.py``).
"""

from __future__ import annotations

import json

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.parsing import parse_quota
from koord_queue.shared.core import quotaqueues
from tests.integration.test_tenant_quotas import (  # noqa: F401  (w: the fixture)
    World,
    alice_may_submit,
    bare_unit,
    job,
    w,
)

pytestmark = pytest.mark.integration


def forged_bindings(quota: str, quota_namespace: str, hers: str) -> dict[str, object]:
    """The reconciler's own rendering of the bindings had ``quota`` also served ``hers``, with
    enforcement off."""
    raw = {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {
            "name": quota,
            "namespace": quota_namespace,
            "annotations": {names.QUOTA_NAMESPACES_ANNOTATION: json.dumps([hers])},
        },
        "spec": {"max": {"cpu": "4"}, "min": {"cpu": "4"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.QUOTA_BINDINGS_CONFIGMAP},
        "data": quotaqueues.binding_data([parse_quota(raw)], enforce=False),
    }


async def test_her_copy_of_the_quota_bindings_in_her_namespace_binds_nothing(w: World) -> None:  # noqa: F811
    theirs_ns = await w.namespace("b")
    mine, theirs = w.name("mine"), w.name("theirs")
    await w.create_quota(w.mine, mine)
    await w.create_quota(theirs_ns, theirs)
    await alice_may_submit(w, mine)

    planted = forged_bindings(theirs, theirs_ns, w.mine)
    assert planted["data"][f"q.{theirs}"] == " " + " ".join(sorted([theirs_ns, w.mine])) + " "  # type: ignore[index]
    done = w.alice("create", "-f", "-", obj=planted)
    assert done.returncode == 0, done.stderr  # her edit role lets her write ConfigMaps there

    # The door reads the install namespace's parameters only: still refused, with the usual text.
    expected = names.quota_not_bound_message(theirs, w.mine, [mine])
    for label in (names.QUOTA_NAME_LABEL, names.QUOTA_NAME_LABEL_FALLBACK):
        await w.refused(job("steal", theirs, label=label), expected)
    data = await w.bindings()
    assert data[f"q.{theirs}"] == f" {theirs_ns} " and data["enforce"] == "true"

    # The scheduler never reads a ConfigMap for the binding: a unit that got in anyway waits.
    await w.create_unit(w.mine, bare_unit("smuggled", theirs))
    await w.wait_message(w.mine, "smuggled", expected)
    await w.create_unit(theirs_ns, bare_unit("own", theirs))
    await w.wait_admitted(theirs_ns, "own")
    await w.assert_waiting(w.mine, "smuggled")
