"""``explain`` and ``quotas`` show the usage history the scheduler orders spare capacity by
(docs/compatibility.md#fair-over-time).

The replay restores each quota's decayed usage from its ``koord-queue/usage-history`` record (with
the record's half-life, decayed to now), and a waiting unit whose quota has siblings gets, per
level, the siblings in the order they get spare capacity with their decayed usage, share and
standing, plus the sentence ``fairness.describe_level`` words. What the reader cannot read (no
record, an unreadable parent, quotas outside their namespace) is listed as unknown, not guessed.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import time
from typing import Any

from koord_queue.cli import client, commands, render
from koord_queue.shared.api import durations, model, names, parsing
from koord_queue.shared.core import explain, replay
from koord_queue.shared.core import visibility as answers
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_explain import NOW, T0, queue, unit, view

HOUR = 3600.0


def record(cpu: str, *, at: float = NOW, half_life: str = "1h0m0s") -> str:
    """A usage-history annotation as the reconciler writes it."""
    return json.dumps({"at": durations.format_time(at), "halfLife": half_life, "usage": {"cpu": cpu}})


def quota(name: str, cpu: str, *, parent: str = "", history: str = "", ns: str = "ns") -> model.Quota:
    """A quota with ``min`` 0 (so siblings share the parent's spare capacity) and a history record."""
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    ann = {names.QUOTA_USAGE_HISTORY_ANNOTATION: history} if history else {}
    return parsing.parse_quota(
        {
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "annotations": ann,
                "creationTimestamp": T0,
            },
            "spec": {"max": {"cpu": cpu}, "min": {"cpu": "0"}},
        }
    )


def tree(a_history: str = "", b_history: str = "", p_history: str = "") -> list[model.Quota]:
    return [
        quota("p", "4", history=p_history),
        quota("a", "4", parent="p", history=a_history),
        quota("b", "4", parent="p", history=b_history),
    ]


def waiting_in_a() -> list[model.Unit]:
    """``a`` holds 2 of its parent's 4 CPU; ``w`` in ``a`` asks for 4 and waits."""
    return [unit("held", "a", phase="Dequeued", admitted=1, running=1, cpu="2"), unit("w", "a", cpu="4")]


def test_a_sibling_that_used_less_of_its_share_lately_is_shown_ahead_with_its_figures() -> None:
    quotas = tree(a_history=record("3"), b_history=record("500m"))
    e = explain.explain(view(waiting_in_a(), quotas, [queue("a"), queue("b")]), "ns/w", NOW)
    assert e.waiting_now
    assert len(e.fairness) == 1
    level = e.fairness[0]
    assert (level.parent, level.quota, level.limit) == ("p", "a", {"cpu": 4000})
    assert [(s.name, s.usage, s.share, s.ahead, s.own) for s in level.siblings] == [
        ("b", {"cpu": 500}, {"cpu": 0.5}, True, False),
        ("a", {"cpu": 3000}, {"cpu": 0.5}, False, True),
    ]
    assert [round(s.score, 3) for s in level.siblings] == [0.25, 1.5]
    assert "ahead of it for spare capacity" in level.text and "b (held" in level.text
    assert any(step.startswith("spare capacity below p: a has held") for step in e.next_steps)


def test_a_record_is_decayed_to_now_with_its_own_half_life() -> None:
    # Written an hour ago (one half-life) with 4 CPU; ``a`` held nothing since: half is left.
    quotas = tree(a_history=record("4", at=NOW - HOUR), b_history=record("1", at=NOW - HOUR))
    rows = {r.name: r for r in replay.quota_rows(view([], quotas, []), NOW)}
    assert rows["a"].decayed == {"cpu": 2000}
    assert rows["b"].decayed == {"cpu": 500}
    assert rows["p"].decayed == {}
    # A two-hour half-life (from the record) leaves 2^-0.5 of it.
    slow = tree(a_history=record("4", at=NOW - HOUR, half_life="2h0m0s"))
    assert {r.name: r.decayed for r in replay.quota_rows(view([], slow, []), NOW)}["a"] == {"cpu": 2828}
    # The component configuration's half-life wins over the record's; 0 turns history off.
    off = replay.quota_rows(view([], quotas, [], usage_half_life=0.0), NOW)
    assert all(r.decayed is None for r in off)


def test_equal_standing_puts_nobody_ahead() -> None:
    quotas = tree(a_history=record("1"), b_history=record("1"))
    e = explain.explain(view(waiting_in_a(), quotas, [queue("a"), queue("b")]), "ns/w", NOW)
    assert [s.ahead for s in e.fairness[0].siblings] == [False, False]
    assert "no sibling is ahead of it" in e.fairness[0].text


def test_without_any_readable_record_the_order_is_not_guessed() -> None:
    e = explain.explain(view(waiting_in_a(), tree(), [queue("a"), queue("b")]), "ns/w", NOW)
    assert e.fairness == ()
    assert any("no usage history" in u for u in e.unknowns)
    # A top-level quota has no siblings to be ordered against: nothing to say.
    alone = [quota("solo", "1")]
    units = [unit("h", "solo", phase="Dequeued", admitted=1, running=1), unit("w", "solo")]
    e = explain.explain(view(units, alone, [queue("solo")]), "ns/w", NOW)
    assert e.fairness == () and not any("usage history" in u for u in e.unknowns)


def test_an_unreadable_parent_or_unread_quotas_are_listed_as_unknown() -> None:
    mine = [quota("a", "4", parent="p", history=record("3"))]
    v = view(
        waiting_in_a(),
        mine,
        [queue("a")],
        complete=False,
        unreadable_quotas=frozenset({"p"}),
        quotas_complete=False,
        usage_half_life=HOUR,
    )
    e = explain.explain(v, "ns/w", NOW)
    assert e.fairness == ()
    assert any("ElasticQuota p cannot be read" in u for u in e.unknowns)
    readable_parent = [*tree(a_history=record("3"))[:2]]
    v = view(waiting_in_a(), readable_parent, [queue("a")], quotas_complete=False, usage_half_life=HOUR)
    e = explain.explain(v, "ns/w", NOW)
    assert [s.name for s in e.fairness[0].siblings] == ["a"]
    assert any("outside your namespace" in u for u in e.unknowns)


def test_the_plugin_prints_the_levels_and_json_carries_them() -> None:
    quotas = tree(a_history=record("3"), b_history=record("500m"))
    units = waiting_in_a()
    e = explain.explain(view(units, quotas, [queue("a"), queue("b")]), "ns/w", NOW)
    text = commands.render_explanation(e, units[1], {}, render.Style(False), NOW)
    assert "Spare capacity below p (usage history):" in text
    lines = text.splitlines()
    b_row = next(line for line in lines if line.split()[:2] == ["1", "b"])
    assert b_row.split()[2:] == ["cpu=500m", "cpu=50%", "0.25", "ahead"]
    a_row = next(line for line in lines if line.split()[:2] == ["2", "a"])
    assert a_row.split()[2:] == ["cpu=3", "cpu=50%", "1.50", "yours"]
    data: dict[str, Any] = dataclasses.asdict(e)
    assert data["fairness"][0]["siblings"][0]["name"] == "b"
    assert json.loads(json.dumps(data, default=str))["fairness"][0]["parent"] == "p"


def test_a_parent_the_reader_cannot_read_shows_the_standing_the_visibility_api_served() -> None:
    # The namespaced visibility answer for team-a's quota ``a`` (parent ``p`` and sibling ``b``
    # live elsewhere), as the scheduler's cache serves it, read back as the plugin reads it.
    cache = Cache(usage_half_life=HOUR)
    for q in tree(a_history=record("3"), b_history=record("500m")):
        cache.put_quota(dataclasses.replace(q, namespace="team-a" if q.name == "a" else "admin"))
    cache.schedule(NOW)
    body = answers.quotas(cache.ledger, cache.state, {}, namespace="team-a", history=cache.snapshot.history)
    [item] = body["items"]
    served = client.served_standing(item)
    assert served == replay.ServedStanding(
        parent="p",
        position=2,
        siblings=2,
        ahead_count=1,
        ahead=(),
        share={"cpu": 0.5},
        score=1.5,
        usage={"cpu": 3000},
    )
    assert client.served_standing({"metadata": {"name": "x"}}) is None
    assert client.served_standing({"fairShare": {"parent": "p"}}) is None

    mine = [quota("a", "4", parent="p", history=record("3"))]
    v = view(
        waiting_in_a(),
        mine,
        [queue("a")],
        complete=False,
        unreadable_quotas=frozenset({"p"}),
        quotas_complete=False,
        standings={"a": served},
    )
    e = explain.explain(v, "ns/w", NOW)
    [level] = e.fairness
    assert (level.parent, level.quota, level.served, level.unseen_ahead) == ("p", "a", True, 1)
    assert [(s.name, s.own, s.usage) for s in level.siblings] == [("a", True, {"cpu": 3000})]
    assert level.text == (
        "below p: a has held cpu=3 lately against a cpu 50% share, 2nd of 2 sibling quotas; ahead of it "
        "for spare capacity, because they used less of their share lately: 1 you cannot read"
    )
    assert not any("cannot be read: how its spare capacity" in u for u in e.unknowns)
    text = commands.render_explanation(e, v.units["ns/w"], {}, render.Style(False), NOW)
    assert "and 1 sibling quota(s) you cannot read, ahead of a" in text
    own_row = next(line for line in text.splitlines() if line.split()[:2] == ["2", "a"])
    assert own_row.split()[2:] == ["cpu=3", "cpu=50%", "1.50", "yours"]


class _Reader:
    """The reads ``quotas`` makes, answered from objects in memory (an admin's complete view)."""

    def __init__(self, quotas: list[dict[str, Any]]) -> None:
        self.raw_quotas = quotas

    async def units(self, namespace: str | None, got: client.Gathered, *, want_all: bool) -> None:
        got.units, got.complete = {}, True

    async def quotas(self, namespace: str | None, got: client.Gathered) -> None:
        got.quotas = self.raw_quotas


def raw_quota(name: str, *, parent: str = "", history: str = "") -> dict[str, Any]:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    ann = {names.QUOTA_USAGE_HISTORY_ANNOTATION: history} if history else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "annotations": ann},
        "spec": {"max": {"cpu": "4"}, "min": {"cpu": "0"}},
    }


async def test_quotas_shows_the_decayed_usage_column_only_with_history_and_keeps_the_tree() -> None:
    at = time.time() - HOUR  # the plugin decays to its own clock: about half is left
    quotas = [raw_quota("p"), raw_quota("a", parent="p", history=record("4", at=at))]
    args = argparse.Namespace(all_namespaces=True, namespace=None, tree=True, output="")
    out = io.StringIO()
    assert await commands.cmd_quotas(_Reader(quotas), args, out, render.Style(False)) == 0  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert "USAGE(DECAYED)" in lines[0].split()
    column = lines[0].index("USAGE(DECAYED)")
    child = next(line for line in lines if "└─ a" in line)
    assert child[column:].split()[0] in ("cpu=2", "cpu=1999m")
    assert any(line.startswith("USAGE(DECAYED) = ") for line in lines)

    args.output = "json"
    out = io.StringIO()
    await commands.cmd_quotas(_Reader(quotas), args, out, render.Style(False))  # type: ignore[arg-type]
    rows = {r["name"]: r for r in json.loads(out.getvalue())["items"]}
    assert rows["a"]["decayed"] in ("cpu=2", "cpu=1999m") and rows["p"]["decayed"] == ""

    args.output = ""
    out = io.StringIO()
    plain = [raw_quota("p"), raw_quota("a", parent="p")]  # no record: history not known, no column
    await commands.cmd_quotas(_Reader(plain), args, out, render.Style(False))  # type: ignore[arg-type]
    assert "USAGE(DECAYED)" not in out.getvalue()
