"""The judges of the hostile tenant's usage-history attacks (``chaos/tenant_history.py``): a record
below the last one decayed across the gap is a breach, one at or above it is not; another quota's
record may grow by no more than holding its whole ``max`` explains
(docs/compatibility.md#fair-over-time)."""

from __future__ import annotations

import json

from chaos import tenant_history as history

HOUR = 3600.0


def record(at: float, **usage: int) -> history.Record:
    return history.Record(at=at, half_life=HOUR, usage=dict(usage))


def test_the_stored_record_is_read_from_its_wire_form_and_garbage_is_absent() -> None:
    text = json.dumps(
        {"at": "2026-12-05T08:00:00Z", "halfLife": "1h0m0s", "usage": {"cpu": "1500m", "memory": "1Ki"}}
    )
    found = history.parse_record(text)
    assert found is not None
    assert found.half_life == HOUR and found.usage == {"cpu": 1500, "memory": 1024_000}
    assert found.at == 1796457600.0
    for bad in (None, "", "not json", json.dumps({"at": "yesterday", "halfLife": "1h", "usage": {}})):
        assert history.parse_record(bad) is None


def test_a_record_at_or_above_the_decay_is_kept_and_one_below_is_lowered() -> None:
    before = record(0.0, cpu=1500)
    # One half-life later, with nothing held: exactly half is what decay explains.
    assert history.lowered(before, record(HOUR, cpu=750)) == []
    assert history.lowered(before, record(HOUR, cpu=2000)) == []  # held more meanwhile
    found = history.lowered(before, record(HOUR, cpu=700))
    assert len(found) == 1 and found[0].startswith("cpu: 700m < 1500m")
    # A resource gone from the record counts as zero.
    assert history.lowered(before, record(60.0)) != []


def test_another_quota_grows_by_no_more_than_holding_its_max_explains() -> None:
    before = record(0.0)
    # Holding its whole 2 CPU for a half-life gives 1000m; more came from elsewhere.
    assert history.gained(before, record(HOUR, cpu=1000), {"cpu": 2000}) == []
    found = history.gained(before, record(HOUR, cpu=1200), {"cpu": 2000})
    assert len(found) == 1 and found[0].startswith("cpu: 1200m >")
    # What it had before decays too, and only the limited resources are judged.
    assert history.gained(record(0.0, cpu=2000), record(HOUR, cpu=2000), {"cpu": 2000}) == []
    assert history.gained(before, record(HOUR, memory=5), {"cpu": 2000}) == []


def test_the_attacks_are_in_the_report() -> None:
    from chaos.tenant import ATTACKS

    assert set(history.ATTACKS) <= set(ATTACKS)
