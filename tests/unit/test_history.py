"""Usage history (docs/compatibility.md#fair-over-time): decayed averages per quota, the fair-share
factor that scales sibling weights, the order queues are scanned in, the record stored on the quota
and read back after a restart, and the configuration."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_queue.shared.api import names, parsing
from koord_queue.shared.api.model import Quota
from koord_queue.shared.core import config, fairness, guarantees, history, quotastatus
from koord_queue.shared.core.history import Record, UsageHistory
from koord_queue.shared.core.quota import QuotaLedger
from koord_queue.shared.core.scheduling import Cache
from tests.unit.test_guarantees import eq, jobs, tree
from tests.unit.test_model import queue, unit
from tests.unit.test_scheduling import World, admits

H = 600.0  # the half-life of these tests, seconds


def fair_tree(*children: Quota, half_life: float = H, parent_cpu: str = "20") -> World:
    """A parent ``p`` with ``children`` below it, history on with ``half_life``."""
    return tree(*children, parent_cpu=parent_cpu, half_life=half_life)


def ledger_with(used_cpu: int) -> QuotaLedger:
    ledger = QuotaLedger()
    ledger.put_quota(eq("a", max_cpu="100"))
    if used_cpu:
        ledger.put_unit(unit("x").quota("a").cpu(str(used_cpu)).admitted().build())
    return ledger


# --- the decayed average --------------------------------------------------------------------------


def test_holding_a_constant_usage_for_one_half_life_reaches_half_of_it() -> None:
    ledger, h = ledger_with(10), UsageHistory(H)
    h.fold(ledger, 1000.0)
    h.fold(ledger, 1000.0 + H)
    assert h.usage("a")["cpu"] == pytest.approx(5000, rel=1e-9)
    h.fold(ledger, 1000.0 + 2 * H)
    assert h.usage("a")["cpu"] == pytest.approx(7500, rel=1e-9)


def test_folding_often_or_rarely_gives_the_same_average() -> None:
    ledger = ledger_with(10)
    often, rarely = UsageHistory(H), UsageHistory(H)
    for t in range(0, 1201, 3):
        often.fold(ledger, 1000.0 + t)
    rarely.fold(ledger, 1000.0)
    rarely.fold(ledger, 2200.0)
    assert often.usage("a")["cpu"] == pytest.approx(rarely.usage("a")["cpu"], rel=1e-9)


def test_usage_that_stops_decays_and_is_forgotten() -> None:
    ledger, h = ledger_with(10), UsageHistory(H)
    h.fold(ledger, 0.0)
    h.fold(ledger, H)
    ledger.delete_unit("default/x")
    h.fold(ledger, 2 * H)  # the interval is charged with what was held at its start
    h.fold(ledger, 3 * H)
    assert h.usage("a")["cpu"] == pytest.approx(7500 / 2, rel=1e-9)
    h.fold(ledger, 40 * H)
    assert h.usage("a") == {}


def test_folds_are_a_grain_apart_and_a_change_between_is_charged_at_the_next() -> None:
    """Between two folds the figures (and what is derived from them) stand; a change in between
    is charged from the next fold, so the average is late by one grain at most."""
    ledger, h = ledger_with(10), UsageHistory(H)
    assert h.grain == pytest.approx(H / 128)
    h.fold(ledger, 0.0)
    h.fold(ledger, H)
    version, before = h.version, dict(h.usage("a"))
    h.derived["x"] = 1
    ledger.delete_unit("default/x")
    assert h.fold(ledger, H + h.grain / 2)
    assert h.version == version and h.usage("a") == before and h.derived == {"x": 1}
    h.fold(ledger, H + h.grain)
    assert h.version > version and h.derived == {}
    exact = 5000 * 2 ** (-h.grain / H) + 10_000 * (1 - 2 ** (-h.grain / H))  # held 10 cpu to the fold
    assert h.usage("a")["cpu"] == pytest.approx(exact, rel=1e-9)
    assert h.usage("a")["cpu"] - 5000 < 10_000 * h.grain / H  # within one grain of the truth
    assert UsageHistory(24 * 3600.0).grain == history.FOLD_GRAIN_SECONDS


@given(
    st.lists(
        st.tuples(st.floats(min_value=0.1, max_value=400.0), st.integers(min_value=0, max_value=50)),
        min_size=1,
        max_size=40,
    )
)
def test_the_closed_form_matches_folding_step_by_step(steps: list[tuple[float, int]]) -> None:
    """Whatever the holdings and however far apart the folds (past the origin's move every 256
    half-lives too), the average equals ``a * d + u * (1 - d)`` applied step by step."""
    half_life = 10.0
    ledger, h = ledger_with(0), UsageHistory(half_life)
    now, expected, held = 1000.0, 0.0, 0
    h.fold(ledger, now)
    for dt, cpu in steps:
        ledger.delete_unit("default/x")
        if cpu:
            ledger.put_unit(unit("x").quota("a").cpu(str(cpu)).admitted().build())
        now += dt
        h.fold(ledger, now)  # the holding seen here is charged from here on
        d = 2.0 ** (-dt / half_life)
        expected = expected * d + held * 1000 * (1 - d)
        held = cpu
        assert h.usage("a").get("cpu", 0.0) == pytest.approx(expected, rel=1e-9, abs=0.5)


def test_history_off_folds_nothing() -> None:
    h = UsageHistory(0.0)
    assert not h.fold(ledger_with(10), 5.0)
    assert h.usage("a") == {} and h.record("a") is None


# --- the factor and the weights -------------------------------------------------------------------


def test_the_factor_is_one_without_usage_and_equal_for_equal_usage_per_share() -> None:
    assert history.factor(0.0, 20_000, 0.5) == 1.0
    assert history.factor(10_000, 20_000, 0.5) == pytest.approx(0.5)
    assert history.factor(5_000, 20_000, 0.25) == pytest.approx(history.factor(15_000, 20_000, 0.75))
    assert history.factor(20_000, 20_000, 0.5) == pytest.approx(0.25)
    assert history.factor(10**9, 1, 0.01) > 0  # never zero: a zero weight is a different rule


@given(weights=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 10**7), min_size=1))
def test_without_usage_the_weights_are_exactly_the_plain_ones(weights: dict[str, int]) -> None:
    h = UsageHistory(H)
    assert guarantees.fair_weights(h, sorted(weights), weights, 20_000, "cpu") == weights


# --- spare capacity over time ---------------------------------------------------------------------


def next_slots(w: World, count: int) -> list[str]:
    """Free ``count`` slots one at a time (the oldest unit of ``a`` still holding finishes), each
    followed by a cycle; the quotas that got each freed slot."""
    got: list[str] = []
    for _ in range(count):
        holders = sorted(
            (u.created, u.name) for u in w.cache.units.values() if u.quota == "a" and u.admissions
        )
        w.finish(holders[0][1])
        got.extend(w.u(name).quota or "" for name in admits(w.cycle()))
    return got


def burst(half_life: float) -> list[str]:
    """``a`` fills the parent alone for two half-lives (of ``H``), then ``b`` arrives with plenty
    waiting; who gets the next 20 slots."""
    w = fair_tree(eq("a", max_cpu="20"), eq("b", max_cpu="20"), half_life=half_life)
    jobs(w, "a", 80)
    assert len(admits(w.cycle())) == 20
    for _ in range(8):
        w.cycle(dt=H / 4)  # a holds the whole parent meanwhile
    jobs(w, "b", 40, start=100)
    w.cycle()
    return next_slots(w, 20)


def test_without_history_the_newcomer_gets_exactly_its_share_of_the_next_slots() -> None:
    assert burst(0.0).count("b") == 10


def test_with_history_the_newcomer_gets_more_than_its_share_until_usage_evens_out() -> None:
    got = burst(H)
    assert got.count("b") > 10
    assert "a" in got  # a is not starved: it gets the slots b's share leaves


def test_a_newcomer_gets_the_next_slot_that_frees() -> None:
    w = fair_tree(eq("a", max_cpu="20"), eq("b", max_cpu="20"))
    jobs(w, "a", 80)
    w.cycle()
    w.cycle(dt=60)
    jobs(w, "b", 10, start=100)
    assert admits(w.cycle()) == []  # the parent is full: nothing frees, nothing is taken
    assert next_slots(w, 1) == ["b"]


def test_queues_of_equal_priority_are_scanned_by_standing() -> None:
    w = fair_tree(eq("a", max_cpu="20"), eq("b", max_cpu="20"), parent_cpu="30")  # oversubscribed
    jobs(w, "a", 10)
    w.cycle()
    w.cycle(dt=H)
    jobs(w, "a", 2, start=20)
    jobs(w, "b", 2, start=30)
    order = [w.u(name).quota for name in admits(w.cycle())]
    assert order == ["b", "b", "a", "a"]  # by name a would go first; b used less lately
    levels = fairness.levels(w.cache.ledger, w.cache.snapshot.history, "a")
    assert [s.name for s in levels[0].order] == ["b", "a"]
    ranks = fairness.Ranks(w.cache.ledger, w.cache.snapshot.history)
    for s in levels[0].order:  # the scan order's lean figure is the standing users are shown
        assert ranks.score("p", s.name) == pytest.approx(s.score)
    assert ranks.score("p", "a") > 0
    text = fairness.describe_level(levels[0])
    assert (
        "ahead of it" in text
        and "b (held 0 cpu" in text
        and "a has held 5 cpu (17% of the parent)" in text  # the fold one grain before
    )


# --- stored and read back -------------------------------------------------------------------------


def annotated(quota: Quota, text: str) -> Quota:
    return dataclasses.replace(quota, annotations={names.QUOTA_USAGE_HISTORY_ANNOTATION: text})


def test_a_restart_reads_the_stored_average_and_decays_it_across_the_gap() -> None:
    stored = history.render_record(Record(at=10_000.0, usage={"cpu": 8000}), H)
    w = World(queues=(queue("a"),))
    w.cache = Cache(usage_half_life=H)
    w.cache.put_quota(annotated(eq("a", max_cpu="20"), stored))
    w.cache.put_queue(queue("a").build())
    w.now = 10_000.0 + H - 1
    w.cycle()  # nothing held during the gap: half of it is left after one half-life
    assert w.cache.snapshot.history.usage("a")["cpu"] == pytest.approx(4000, rel=1e-9)


def test_a_new_leader_counts_on_from_the_record_not_from_its_own_old_count() -> None:
    h = UsageHistory(H)
    ledger = ledger_with(0)
    h.fold(ledger, 0.0)
    later = history.render_record(Record(at=100.0, usage={"cpu": 6000}), H)
    h.remember(annotated(ledger.quotas["a"], later))
    h.fold(ledger, 200.0)
    assert h.usage("a") == {}  # still leading: its own count stands
    h.restart()
    h.fold(ledger, 200.0)
    assert h.usage("a")["cpu"] == pytest.approx(6000 * 2 ** (-100 / H))


def test_the_record_round_trips_and_bad_text_starts_from_zero() -> None:
    text = history.render_record(Record(at=1_700_000_000.0, usage={"cpu": 1500, "nvidia.com/gpu": 0}), H)
    doc = json.loads(text)
    assert doc == {"at": "2023-11-14T22:13:20Z", "halfLife": "10m0s", "usage": {"cpu": "1500m"}}
    assert history.parse_record(text) == Record(at=1_700_000_000.0, usage={"cpu": 1500})
    for bad in (
        "",
        "{",
        "[]",
        '{"at": "x", "usage": {}}',
        '{"at": "2023-11-14T22:13:20Z", "usage": {"cpu": "x"}}',
    ):
        assert history.parse_record(bad) is None


def test_the_record_is_written_when_missing_or_a_minute_old_and_changed() -> None:
    now = Record(at=1000.0, usage={"cpu": 1500})
    assert quotastatus.history_due(None, now)
    assert not quotastatus.history_due(history.render_record(Record(at=990.0, usage={"cpu": 1}), H), now)
    assert quotastatus.history_due(history.render_record(Record(at=940.0, usage={"cpu": 1}), H), now)
    assert not quotastatus.history_due(history.render_record(Record(at=0.0, usage={"cpu": 1500}), H), now)


def test_published_figures_carry_the_record() -> None:
    w = fair_tree(eq("a", max_cpu="20"), eq("b", max_cpu="20"))
    jobs(w, "a", 4)
    w.cycle()
    w.cycle(dt=H)
    figures = quotastatus.published(w.cache.ledger, w.cache.state, w.cache.snapshot.history)
    obj = {"metadata": {"name": "a", "annotations": {}}, "status": {}}
    writes = quotastatus.changes(obj, figures["a"])
    assert writes.annotations is not None
    record = history.parse_record(
        writes.annotations["metadata"]["annotations"][names.QUOTA_USAGE_HISTORY_ANNOTATION]
    )
    assert record is not None and record.usage["cpu"] == pytest.approx(2000, abs=1)


# --- configuration --------------------------------------------------------------------------------


def parse_config(extra: str) -> config.Settings:
    return config.parse(f"apiVersion: scheduling.k8s.io/v1\nkind: KoordQueueConfiguration\n{extra}")


def test_the_half_life_is_on_by_default_and_configurable() -> None:
    assert config.Settings().usage_half_life_seconds == 3600.0
    assert parse_config("").usage_half_life_seconds == 3600.0
    assert parse_config("usageHalfLife: 2m").usage_half_life_seconds == 120.0
    assert parse_config("usageHalfLife: 0s").usage_half_life_seconds == 0.0
    for bad in ("usageHalfLife: -1m", "usageHalfLife: soon", "usageHalfLife: true"):
        with pytest.raises(config.ConfigError, match="usageHalfLife"):
            parse_config(bad)


def test_a_quota_object_without_history_parses_as_before() -> None:
    quota = parsing.parse_quota({"metadata": {"name": "q", "namespace": "n"}, "spec": {"max": {"cpu": "1"}}})
    h = UsageHistory(H)
    h.remember(quota)
    h.fold(QuotaLedger(), 5.0)
    assert h.record("q") is None


def test_siblings_that_never_compete_keep_the_plain_order() -> None:
    """Below a parent that is not oversubscribed no sibling can take another's room, so history
    orders nothing there (and costs nothing)."""
    w = fair_tree(eq("a", max_cpu="20"), eq("b", max_cpu="20"), parent_cpu="40")
    jobs(w, "a", 10)
    w.cycle()
    w.cycle(dt=H)
    jobs(w, "a", 2, start=20)
    jobs(w, "b", 2, start=30)
    assert [w.u(name).quota for name in admits(w.cycle())] == ["a", "a", "b", "b"]


def test_the_flag_overrides_the_file_and_a_bad_value_is_refused_with_its_name() -> None:
    from koord_queue.reconciler import main

    assert main._settings(main.parse_args([])).usage_half_life_seconds == 3600.0
    assert main._settings(main.parse_args(["--usage-half-life=0s"])).usage_half_life_seconds == 0.0
    assert main._settings(main.parse_args(["--usage-half-life", "90m"])).usage_half_life_seconds == 5400.0
    with pytest.raises(config.ConfigError, match="--usage-half-life"):
        main._settings(main.parse_args(["--usage-half-life=soon"]))


def test_a_quota_added_just_after_a_fold_is_counted_by_the_next_cycle() -> None:
    ledger, h = ledger_with(10), UsageHistory(H)
    h.fold(ledger, 100.0)
    ledger.put_quota(eq("b", max_cpu="10"))
    assert h.fold(ledger, 100.5)  # within the fold step, but the tree changed
    assert h.record("b") is not None


def test_with_history_on_the_scheduler_wakes_even_when_nothing_happens() -> None:
    from koord_queue.shared.core.scheduling import HISTORY_TICK_SECONDS

    w = fair_tree(eq("a", max_cpu="20"), eq("b", max_cpu="20"))
    jobs(w, "a", 2)
    plan = w.cycle()
    assert plan.wake_at == w.now + HISTORY_TICK_SECONDS
    off = fair_tree(eq("a", max_cpu="20"), half_life=0.0)
    jobs(off, "a", 2)
    assert off.cycle().wake_at is None
