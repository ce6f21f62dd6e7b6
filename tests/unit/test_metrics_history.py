"""``koord_queue_quota_decayed_usage``: each quota's decayed average usage, read from the
scheduler's usage history when Prometheus scrapes (docs/compatibility.md#metrics,
docs/compatibility.md#fair-over-time).

The collector reads ``cache.snapshot.history`` at scrape time (nothing per cycle), exports whole
units like ``dequeued_quota_usage_by_quota``, nothing while history is off, and is registered with
the store sizes whenever the components hold the scheduler.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from koord_queue.reconciler import metrics
from koord_queue.shared.api import parsing
from koord_queue.shared.core.scheduling import Admit, Cache
from tests.unit.test_model import queue, unit

NOW = 1_800_000_000.0
HOUR = 3600.0
ROOT = Path(__file__).resolve().parents[2]


def busy(half_life: float) -> Cache:
    """Quota ``q`` whose unit has held 2 CPU for one half-life: 1 CPU on average."""
    cache = Cache(usage_half_life=half_life)
    cache.put_quota(
        parsing.parse_quota({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"max": {"cpu": "4"}}})
    )
    cache.put_queue(queue("q").build())
    cache.put_unit(unit("u", "ns").quota("q").cpu("2").build())
    for decision in cache.schedule(NOW).decisions:
        if isinstance(decision, Admit):
            cache.assume(decision, now=NOW)
    cache.schedule(NOW + HOUR)
    return cache


def scraped(cache: Cache) -> str:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(metrics.DecayedUsage(lambda: cache))
    return generate_latest(registry).decode()


def test_the_decayed_average_is_exported_in_whole_units_per_quota_and_resource() -> None:
    cache = busy(HOUR)
    assert dict(cache.snapshot.history.usage("q")) == {"cpu": 1000.0}
    assert 'koord_queue_quota_decayed_usage{quota="q",resource="cpu"} 1.0' in scraped(cache)


def test_nothing_is_exported_while_history_is_off() -> None:
    text = scraped(busy(0.0))
    assert "# TYPE koord_queue_quota_decayed_usage gauge" in text
    assert "koord_queue_quota_decayed_usage{" not in text


def test_registered_with_the_store_sizes_over_the_schedulers_cache_once() -> None:
    cache = busy(HOUR)
    scheduler = SimpleNamespace(cache=cache)
    metrics.watch_stores([], {"scheduler": scheduler})
    metrics.watch_stores([], {"scheduler": scheduler})  # a second run in one process: no duplicate
    served = generate_latest(metrics.REGISTRY).decode()
    assert served.count('koord_queue_quota_decayed_usage{quota="q",resource="cpu"} 1.0') == 1


def test_the_metric_is_documented() -> None:
    for doc in ("docs/compatibility.md", "docs/operations.md"):
        assert metrics.DECAYED_USAGE in (ROOT / doc).read_text(), doc
