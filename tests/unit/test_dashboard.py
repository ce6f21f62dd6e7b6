"""The Grafana dashboard queries only metrics the processes export (upstream's dashboard queries one
that does not exist), and every metric the processes export is documented
(docs/compatibility.md#metrics, docs/operations.md#metrics-and-the-dashboard)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from koord_queue.reconciler import metrics as reconciler_metrics
from koord_queue.shared import kube
from koord_queue.webhook import metrics as webhook_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "manifests" / "dashboards" / "koord-queue.json"


#: The sample names a scrape shows for each metric type (a counter ``x`` is only ever ``x_total``:
#: upstream's dashboard queries the bare name, which the Python client never exports).
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum", ""),
    "gauge": ("",),
    "info": ("_info",),
}


def exported(registry: CollectorRegistry) -> set[str]:
    return {f"{family.name}{suffix}" for family in registry.collect() for suffix in SUFFIXES[family.type]}


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\b([a-z_]+(?:_[a-z]+)+)(?=[{\[ )]|$)", e)}
    queried -= {"histogram_quantile", "sum", "rate"}
    known = set().union(*(exported(registry) for registry in registries()))
    assert queried, exprs
    assert sorted(queried - known) == []


def section(path: Path, heading: str) -> str:
    """The text under a ``## heading`` up to the next heading of that level."""
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def registries() -> list[CollectorRegistry]:
    """Both processes' registries with every collector a running process adds (the store and
    decayed-usage collectors, the leader gauge) registered, so none escapes the check."""

    class Cache:  # the least a scheduler's cache offers the decayed-usage collector
        class snapshot:
            class history:
                enabled = False

    class Scheduler:
        cache = Cache()

    reconciler_metrics.watch_stores([], {"scheduler": Scheduler()})
    reconciler_metrics.watch_leadership(kube.Leadership())
    return [reconciler_metrics.REGISTRY, webhook_metrics.WebhookMetrics().registry]


def test_every_exported_metric_is_documented() -> None:
    docs = section(ROOT / "docs" / "compatibility.md", "Metrics") + section(
        ROOT / "docs" / "operations.md", "Metrics and the dashboard"
    )
    documented = set(re.findall(r"`([a-z_]+)(?:\*|\{[^`]*\})?`", docs))
    # the client library's own families are documented by prefix, in both tables
    wildcards = ("process_", "python_gc_")
    assert all(docs.count(f"`{prefix}*`") == 2 for prefix in wildcards)
    families = {family.name: family.type for reg in registries() for family in reg.collect()}
    assert "koord_queue_leader" in families and "process_resident_memory_bytes" in families
    missing = [
        name
        for name, kind in sorted(families.items())
        if not name.startswith(wildcards)
        and name not in documented
        and not (kind == "counter" and f"{name}_total" in documented)
    ]
    assert missing == []
