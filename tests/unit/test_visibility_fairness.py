"""The visibility API's quota summaries carry the usage history the scheduler orders spare capacity
by (docs/compatibility.md#visibility-api, docs/compatibility.md#fair-over-time).

``usageHistory`` is each quota's decayed average from the scheduler's own ``UsageHistory``, and
``fairShare`` (below a parent) its share, factor, standing and place among its siblings from
``fairness.Ranks``, the figures the cycle orders queues by. A replica that never led (it folds
nothing) answers from the quotas' records as a reconciler taking over would count on from them.
A namespaced answer names no sibling its namespace cannot see, and still counts those ahead.
"""

from __future__ import annotations

import json
import time
from typing import Any

from koord_queue.shared.api import durations, model, names, parsing
from koord_queue.shared.core import fairness
from koord_queue.shared.core import visibility as answers
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_model import queue, unit
from tests.unit.test_visibility_server import get_json, served

NOW = 1_800_000_000.0
HOUR = 3600.0


def quota(name: str, ns: str, *, parent: str = "", used_cpu: str = "", at: float = NOW) -> model.Quota:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    ann = {}
    if used_cpu:
        ann[names.QUOTA_USAGE_HISTORY_ANNOTATION] = json.dumps(
            {"at": durations.format_time(at), "halfLife": "1h0m0s", "usage": {"cpu": used_cpu}}
        )
    return parsing.parse_quota(
        {
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": ann},
            "spec": {"min": {"cpu": "0"}, "max": {"cpu": "4"}},
        }
    )


def siblings(*, at: float = NOW, half_life: float = HOUR, fold: bool = True) -> Cache:
    """Parent ``p`` (4 CPU) over ``a`` (team-a, 3 CPU on average lately), ``b`` (team-b, 1 CPU)
    and ``c`` (team-c, nothing): order c, b, a. ``fold``: the cache has run a cycle (a leader)."""
    cache = Cache(usage_half_life=half_life)
    cache.put_quota(quota("p", "admin"))
    cache.put_quota(quota("a", "team-a", parent="p", used_cpu="3", at=at))
    cache.put_quota(quota("b", "team-b", parent="p", used_cpu="1", at=at))
    cache.put_quota(quota("c", "team-c", parent="p"))
    for name in ("a", "b", "c"):
        cache.put_queue(queue(name).build())
    if fold:
        cache.schedule(at)
    return cache


def items(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["metadata"]["name"]: i for i in body["items"]}


def test_every_quota_shows_its_decayed_usage_and_below_a_parent_its_standing() -> None:
    cache = siblings()
    history = cache.snapshot.history
    got = items(answers.quotas(cache.ledger, cache.state, {}, history=history, now=NOW))
    assert got["a"]["usageHistory"] == {
        "halfLife": "1h0m0s",
        "usage": {"cpu": "3"},
        "at": durations.format_time(NOW),
    }
    assert got["c"]["usageHistory"]["usage"] == {}
    assert "fairShare" not in got["p"]
    a = got["a"]["fairShare"]
    assert (a["parent"], a["position"], a["siblings"], a["aheadCount"], a["ahead"]) == (
        "p",
        3,
        3,
        2,
        ["c", "b"],
    )
    assert a["share"] == {"cpu": round(1 / 3, 6)}
    # The very figures the scheduler orders queues by.
    standing = fairness.Ranks(cache.ledger, history).standing("p")
    assert a["score"] == round(standing["a"].score, 6) and a["factor"] == {
        "cpu": round(standing["a"].factor["cpu"], 6)
    }
    assert (got["b"]["fairShare"]["position"], got["b"]["fairShare"]["ahead"]) == (2, ["c"])
    assert (got["c"]["fairShare"]["position"], got["c"]["fairShare"]["ahead"]) == (1, [])


def test_a_namespace_sees_its_quotas_standing_but_not_the_names_of_siblings_it_cannot_see() -> None:
    cache = siblings()
    body = answers.quotas(cache.ledger, cache.state, {}, namespace="team-a", history=cache.snapshot.history)
    assert [i["metadata"]["name"] for i in body["items"]] == ["a"]
    share = body["items"][0]["fairShare"]
    assert (share["position"], share["aheadCount"], share["ahead"]) == (3, 2, [])
    assert share["parent"] == "p"  # already shown as the item's parent


def test_history_off_adds_nothing() -> None:
    cache = siblings(half_life=0.0)
    for history in (cache.snapshot.history, None):
        for item in answers.quotas(cache.ledger, cache.state, {}, history=history, now=NOW)["items"]:
            assert "usageHistory" not in item and "fairShare" not in item


def test_a_replica_that_never_counted_answers_from_the_records_decayed_to_now() -> None:
    follower = siblings(at=NOW - HOUR, fold=False)
    got = items(
        answers.quotas(follower.ledger, follower.state, {}, history=follower.snapshot.history, now=NOW)
    )
    # One half-life since the records, nothing held meanwhile: half is left.
    assert got["a"]["usageHistory"]["usage"] == {"cpu": "1500m"}
    assert got["b"]["usageHistory"]["usage"] == {"cpu": "500m"}
    assert got["a"]["fairShare"]["ahead"] == ["c", "b"]
    # Without a clock it shows what the cache holds: nothing counted yet.
    bare = items(answers.quotas(follower.ledger, follower.state, {}, history=follower.snapshot.history))
    assert bare["a"]["usageHistory"]["usage"] == {}


async def test_the_server_answers_with_the_schedulers_history() -> None:
    now = float(int(time.time()))  # the records hold whole seconds: no decay between them and the fold
    cache = siblings(at=now)
    cache.put_unit(unit("job", "team-a").quota("a").cpu("1").build())
    async with served(None, cache=lambda: cache) as port:
        status, body = await get_json(port, "/quotas")
        assert status == 200 and isinstance(body, dict)
        assert items(body)["a"]["usageHistory"]["usage"] == {"cpu": "3"}
        status, body = await get_json(port, "/namespaces/team-b/quotas")
        assert status == 200 and isinstance(body, dict)
        share = body["items"][0]["fairShare"]
        assert (share["position"], share["aheadCount"], share["ahead"]) == (2, 1, [])
