"""Reclaim of fair shares (docs/compatibility.md#reclaim-of-fair-shares): only a quota labelled
``koord-queue/reclaim-fair-share: "true"`` takes back its share from a sibling over its own, and
only admitted-but-not-running units; without the label shares only order who gets freed capacity."""

from __future__ import annotations

import dataclasses

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Quota
from koord_queue.shared.core.plan import Plan
from koord_queue.shared.core.preemption import MarkVictims
from tests.unit.test_guarantees import eq, jobs, tree
from tests.unit.test_scheduling import admits


def opted_in(name: str) -> Quota:
    quota = eq(name, max_cpu="10")
    return dataclasses.replace(quota, labels={**quota.labels, names.RECLAIM_FAIR_SHARE_LABEL: "true"})


def victims(plan: Plan) -> list[str]:
    return sorted(v.name for d in plan.decisions if isinstance(d, MarkVictims) for v in d.victims)


def test_without_the_label_a_sibling_over_its_share_keeps_what_it_was_admitted() -> None:
    w = tree(eq("a", max_cpu="10"), eq("b", max_cpu="10"))
    jobs(w, "b", 10)
    assert len(admits(w.cycle())) == 10  # b borrows the whole parent; nothing runs yet
    jobs(w, "a", 4, start=50)
    plan = w.cycle()
    assert victims(plan) == [] and admits(plan) == []


def test_with_the_label_the_share_is_taken_back_from_units_that_do_not_run() -> None:
    w = tree(opted_in("a"), eq("b", max_cpu="10"))
    jobs(w, "b", 10)
    assert len(admits(w.cycle())) == 10
    for name in ("b-00", "b-01", "b-02"):
        w.run(name)  # these run: never taken
    jobs(w, "a", 4, start=50)
    plan = w.cycle()
    taken = victims(plan)
    # a's share is its demand (4), b keeps 6: b's four newest units that do not run go
    assert taken == ["b-06", "b-07", "b-08", "b-09"]


def test_with_the_label_a_quota_within_its_share_claims_nothing_beyond_it() -> None:
    w = tree(opted_in("a"), eq("b", max_cpu="10"))
    jobs(w, "b", 5)
    jobs(w, "a", 5, start=50)
    assert len(admits(w.cycle())) == 10
    jobs(w, "a", 3, start=60)
    plan = w.cycle()
    assert victims(plan) == []  # a holds its share already: b is not over its own
