"""The Grafana dashboard queries only metrics the processes export (upstream's dashboard queries one
that does not exist)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from koord_queue.reconciler import metrics as reconciler_metrics
from koord_queue.webhook import metrics as webhook_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "manifests" / "dashboards" / "koord-queue.json"


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
    known = exported(reconciler_metrics.REGISTRY) | exported(webhook_metrics.WebhookMetrics().registry)
    assert queried, exprs
    assert sorted(queried - known) == []
