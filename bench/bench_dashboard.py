#!/usr/bin/env python3
"""The dashboard at 50,000 QueueUnits (docs/dashboard.md#what-it-costs; BENCHMARKS.md, "Dashboard").

The question is the issue's: with 50,000 units on this 2-core machine, does the queue page's first
render take under 1.5 s, and does the dashboard's process stay under 150 MiB? The baseline,
measured in the same run and interleaved with the dashboard, is the visibility API's own latency for
the same first page (the namespace's first ``--rows`` pending units), once over HTTP with the
admin's client certificate and once as ``kubectl get --raw`` (a process start included, as a user
pays it). KueueViz could not be built here (BENCHMARKS.md says why).

Set-up: a local control plane (etcd + kube-apiserver, the ``integration`` profile of testenv) with
the reconciler serving the visibility API (registered as an APIService), ``--namespaces``
namespaces with one ElasticQuota each (4 cpu: four units admitted, the rest wait), and ``--units``
QueueUnits created directly (no jobs: the dashboard needs none), spread evenly. The run waits until
the reconciler has parked them all (the cluster's QueueUnit resourceVersion stops moving).

Then ``kubectl koord-queue -n bench-0 dashboard --no-browser`` starts as the cluster admin, so the
page's replay reads every namespace's units (the widest, costliest case), and for ``--reps``
rounds, interleaved:

* ``render``: a fresh headless Chromium context (no cookie, no cache) opens the printed URL; the
  time from its navigation start (``performance.timeOrigin``, before the token's redirect) until
  the first ``tr[data-unit]`` is in the DOM. The first round is reported apart
  (``first_render_cold_s``, and ``first_render_after_start_s`` from the plugin's start): it is the
  early page, from the visibility API while every unit is still being listed; then the round waits
  until the full page replaced it (``full_page_after_start_s``); the other rounds are the page
  opened again;
* ``poll_304``/``poll_200``: one poll of the queue page's JSON with and without the page's ETag;
* ``visibility_http``/``visibility_kubectl``: the visibility API's first page, as said above.

For the first page the browser's own timings say where its time went (``first_page_timings``:
the navigation's redirect, the HTML, the script, ``/api/session`` and the queue page's JSON, each
from navigation start). Peak RSS of the dashboard's process is ``VmHWM`` from ``/proc``; its
``VmRSS`` and the machine's load average are sampled every second from the plugin's start to its
end (``timeline``), so a rise can be put next to what the dashboard did then and what else ran.
Writes ``bench/results/dashboard-<units>-<date>-<time>.json``; prints medians, p95s and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any, Final

import bench_admission as ba

from koord_queue.shared import kube
from koord_queue.shared.api import names

ROOT: Final = pathlib.Path(__file__).resolve().parents[1]
RESULTS: Final = ROOT / "bench" / "results"
QUEUE_UNITS: Final = kube.Resource(names.GROUP, names.VERSION, "queueunits", "QueueUnit")
QUOTAS: Final = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, "elasticquotas", "ElasticQuota")
VISIBILITY: Final = "/apis/visibility.koord-queue.x-k8s.io/v1alpha1"
#: docs/dashboard.md#what-it-costs: the issue's bounds.
RENDER_BOUND_S: Final = 1.5
RSS_BOUND_MIB: Final = 150.0


def unit_body(name: str, quota: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "priority": priority,
            "resource": {"cpu": "1"},
            "request": {"cpu": "1"},
            "podSet": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}
                            ]
                        }
                    },
                }
            ],
        },
    }


def namespace_of(i: int) -> str:
    return f"bench-{i}"


async def populate(client: kube.Kube, namespaces: int, units: int, concurrency: int = 48) -> float:
    """Namespaces, quotas and units; returns the seconds the units took to create."""
    for n in range(namespaces):
        ns = namespace_of(n)
        await ba.create_namespace(client, ns)
        quota = {
            "apiVersion": names.QUOTA_API_VERSION,
            "kind": "ElasticQuota",
            "metadata": {"name": f"{ns}-q"},
            "spec": {"min": {"cpu": "4"}, "max": {"cpu": "4"}},
        }
        with contextlib.suppress(kube.Conflict):
            await client.create(QUOTAS, quota, namespace=ns)
    todo = iter(range(units))
    started = time.monotonic()

    async def worker() -> None:
        for i in todo:
            ns = namespace_of(i % namespaces)
            body = unit_body(f"u{i:06}", f"{ns}-q", i % 10)
            with contextlib.suppress(kube.Conflict):
                await client.create(QUEUE_UNITS, body, namespace=ns)
            if i % 5000 == 0:
                print(f"  created {i} units", flush=True)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


async def settled(client: kube.Kube, units: int, timeout_s: float) -> float:
    """Seconds until the reconciler has given every unit a phase and then written nothing to any
    of them for one more poll (the resourceVersions of all units unchanged); polled with a
    deadline. (The list's own resourceVersion is etcd's, which every Lease renewal moves.)"""
    started = time.monotonic()
    last: int | None = None
    while time.monotonic() - started < timeout_s:
        items, _ = await client.list(QUEUE_UNITS, page_size=5000)
        phased = sum(1 for u in items if (u.get("status") or {}).get("phase"))
        stamp = sum(int(u["metadata"]["resourceVersion"]) for u in items)
        del items
        if phased >= units and stamp == last:
            return time.monotonic() - started
        last = stamp if phased >= units else None
        print(f"  {phased} of {units} units have a phase", flush=True)
        await asyncio.sleep(15.0)
    raise RuntimeError(f"the QueueUnits did not settle within {timeout_s}s")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "median_s": round(statistics.median(values), 4),
        "p95_s": round(pct(values, 95), 4),
        "min_s": round(min(values), 4),
        "max_s": round(max(values), 4),
    }


def busy_processes() -> list[str]:
    """What else used the CPU on the machine (``ps``, top ten): other helpers' tests, builds."""
    done = subprocess.run(
        ["ps", "-eo", "pcpu,etimes,comm", "--sort=-pcpu"], capture_output=True, text=True, check=False
    )
    return [line.strip() for line in done.stdout.splitlines()[1:11]]


async def start_dashboard(kubeconfig: pathlib.Path, namespace: str) -> tuple[asyncio.subprocess.Process, str]:
    plugin = pathlib.Path(sys.executable).parent / "kubectl-koord_queue"
    process = await asyncio.create_subprocess_exec(
        str(plugin),
        f"--kubeconfig={kubeconfig}",
        "-n",
        namespace,
        "dashboard",
        "--no-browser",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), timeout=60)).decode()
    if " at http://127.0.0.1:" not in line:
        raise RuntimeError(f"the dashboard did not start: {line!r}")
    return process, line.split(" at ", 1)[1].strip()


#: The browser's timings of the page's own requests (PerformanceResourceTiming), from navigation start.
TIMINGS_JS: Final = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const out = nav ? [{name: "document", start: 0, redirectEnd: nav.redirectEnd,
                      responseStart: nav.responseStart, end: nav.responseEnd,
                      domContentLoaded: nav.domContentLoadedEventEnd}] : [];
  for (const e of performance.getEntriesByType("resource")) {
    out.push({name: new URL(e.name).pathname, start: e.startTime, responseStart: e.responseStart,
              end: e.responseEnd});
  }
  return out;
}"""


async def sample(pid: int, t0: float, into: list[dict[str, float]], stop: asyncio.Event) -> None:
    """``VmRSS`` of the dashboard and the machine's load average, once a second (a pace, not a
    synchronisation), until ``stop``."""
    while not stop.is_set():
        into.append(
            {
                "t_s": round(time.monotonic() - t0, 1),
                "rss_mib": round(ba.proc_mem_mib(pid).get("VmRSS", 0.0), 1),
                "loadavg": ba.loadavg(),
            }
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def measure(args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    from testenv import binaries, browser

    ns = namespace_of(0)
    client = await kube.Kube.connect(kubeconfig=str(cluster.kubeconfig), qps=0, burst=1, pool_size=64)
    result: dict[str, Any] = {}
    try:
        result["create_s"] = round(await populate(client, args.namespaces, args.units), 1)
        print(
            f"  {args.units} units created in {result['create_s']}s; waiting for the reconciler", flush=True
        )
        result["settle_s"] = round(await settled(client, args.units, timeout_s=3600), 1)
        print(f"  settled after {result['settle_s']}s more", flush=True)
        vis_path = f"{VISIBILITY}/namespaces/{ns}/queueunits"
        result["loadavg_at_dashboard_start"] = ba.loadavg()
        t0 = time.monotonic()
        process, url = await start_dashboard(cluster.kubeconfig, ns)
        result["url_printed_after_start_s"] = round(time.monotonic() - t0, 3)
        base = url.split("/ns/")[0]
        pid = process.pid
        timeline: list[dict[str, float]] = []
        sampled = asyncio.Event()
        sampler = asyncio.create_task(sample(pid, t0, timeline, sampled))
        timings: list[dict[str, Any]] = []
        rss_at_full: dict[str, float] = {}
        series: dict[str, list[float]] = {
            k: [] for k in ("render", "poll_304", "poll_200", "visibility_http", "visibility_kubectl")
        }
        rows_seen: list[int] = []
        first_after_start: float | None = None
        first_render: float | None = None
        full_after_start: float | None = None
        rows_early = 0
        try:
            async with async_playwright() as p:
                chromium = await p.chromium.launch(executable_path=str(browser.chromium()), headless=True)
                try:
                    for rep in range(args.reps):
                        context = await chromium.new_context()
                        page = await context.new_page()
                        await page.goto(url)
                        await page.wait_for_selector("tr[data-unit]", timeout=120_000)
                        elapsed_ms = await page.evaluate("performance.now()")
                        render = float(elapsed_ms) / 1000
                        if rep == 0:  # the dashboard's first page: its units are still being listed
                            first_after_start = time.monotonic() - t0
                            first_render = render
                            rows_early = await page.locator("tr[data-unit]").count()
                            timings = await page.evaluate(TIMINGS_JS)
                            # the early page until every unit is read (docs/dashboard.md#the-first-page)
                            await page.wait_for_selector("p.loading", state="detached", timeout=600_000)
                            full_after_start = time.monotonic() - t0
                            rss_at_full = ba.proc_mem_mib(pid)
                        else:
                            series["render"].append(render)
                        rows_seen.append(await page.locator("tr[data-unit]").count())
                        api = f"{base}/api/ns/{ns}/units?limit={args.rows}"
                        full_t = time.monotonic()
                        answer = await page.request.get(api)
                        series["poll_200"].append(time.monotonic() - full_t)
                        etag = answer.headers.get("etag", "")
                        cond_t = time.monotonic()
                        again = await page.request.get(api, headers={"If-None-Match": etag})
                        series["poll_304"].append(time.monotonic() - cond_t)
                        if again.status != 304:
                            print(f"  round {rep}: the conditional poll got {again.status}", flush=True)
                        await context.close()
                        vis_t = time.monotonic()
                        await client.request("GET", vis_path, query={"limit": args.rows})
                        series["visibility_http"].append(time.monotonic() - vis_t)
                        kubectl_t = time.monotonic()
                        got = await asyncio.create_subprocess_exec(
                            str(binaries.kubectl()),
                            f"--kubeconfig={cluster.kubeconfig}",
                            "get",
                            "--raw",
                            f"{vis_path}?limit={args.rows}",
                            stdout=asyncio.subprocess.DEVNULL,
                        )
                        if await got.wait() != 0:
                            raise RuntimeError("kubectl get --raw of the visibility API failed")
                        series["visibility_kubectl"].append(time.monotonic() - kubectl_t)
                        print(
                            f"  round {rep}: render {render:.3f}s, visibility "
                            f"{series['visibility_http'][-1]:.3f}s (kubectl "
                            f"{series['visibility_kubectl'][-1]:.3f}s), poll 304 "
                            f"{series['poll_304'][-1] * 1000:.1f}ms / 200 "
                            f"{series['poll_200'][-1] * 1000:.1f}ms, RSS peak "
                            f"{ba.proc_mem_mib(pid).get('VmHWM', 0):.0f} MiB",
                            flush=True,
                        )
                finally:
                    await chromium.close()
            memory = ba.proc_mem_mib(pid)
        finally:
            sampled.set()
            await sampler
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), timeout=30)
        stats = {k: summary(v) for k, v in series.items()}
        result.update(
            {
                "series_s": {k: [round(x, 4) for x in v] for k, v in series.items()},
                "stats": stats,
                "first_render_after_start_s": round(first_after_start or 0.0, 3),
                "first_render_cold_s": round(first_render or 0.0, 3),
                "rows_on_early_page": rows_early,
                "full_page_after_start_s": round(full_after_start or 0.0, 3),
                "rows_on_first_page": rows_seen[0] if rows_seen else 0,
                "first_page_timings": [
                    {k: (round(v / 1000, 4) if isinstance(v, (int, float)) else v) for k, v in e.items()}
                    for e in timings
                ],
                "dashboard_rss_mib": {k: round(v, 1) for k, v in memory.items()},
                "dashboard_rss_at_full_page_mib": {k: round(v, 1) for k, v in rss_at_full.items()},
                "timeline": timeline,
                "ratios": {
                    "render_over_visibility_http": round(
                        stats["render"]["median_s"] / stats["visibility_http"]["median_s"], 2
                    ),
                    "render_over_visibility_kubectl": round(
                        stats["render"]["median_s"] / stats["visibility_kubectl"]["median_s"], 2
                    ),
                    "poll_304_over_visibility_http": round(
                        stats["poll_304"]["median_s"] / stats["visibility_http"]["median_s"], 2
                    ),
                },
                "bounds": {
                    "render_p95_under_1_5_s": stats["render"]["p95_s"] < RENDER_BOUND_S,
                    "rss_peak_under_150_mib": memory.get("VmHWM", 1e9) < RSS_BOUND_MIB,
                },
            }
        )
    finally:
        await client.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=50_000)
    parser.add_argument("--namespaces", type=int, default=5)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--rows", type=int, default=50, help="rows of each queue on the first page")
    args = parser.parse_args()

    from testenv import binaries, system
    from testenv.cluster import LocalCluster

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kq-bench-dashboard-"))
    cluster = LocalCluster(profile="integration", workdir=workdir / "cp", nodes=1)
    started = datetime.now(UTC)
    machine_before = {"loadavg": ba.loadavg(), "busy": busy_processes()}
    cluster.start()
    processes = None
    try:
        system.install_crds(cluster)
        logdir = workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        processes = system.start(cluster, logdir=logdir)
        port = next(c.ports["visibility"] for c in processes.components if c.name == "reconciler")
        system.register_visibility(cluster, port=port)
        deadline = time.monotonic() + 120
        while True:  # the aggregated API answers once the reconciler issued its certificate
            done = subprocess.run(
                [
                    str(binaries.kubectl()),
                    f"--kubeconfig={cluster.kubeconfig}",
                    "get",
                    "--raw",
                    f"{VISIBILITY}/namespaces/{namespace_of(0)}/queueunits",
                ],
                capture_output=True,
                check=False,
            )
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the visibility API did not answer: {done.stderr.decode()}")
            time.sleep(1.0)
        print(f"== dashboard bench: {args.units} units over {args.namespaces} namespaces", flush=True)
        result = asyncio.run(measure(args, cluster))
    finally:
        if processes is not None:
            processes.stop()
        cluster.stop()
    result = {
        "config": vars(args),
        "started": started.isoformat(timespec="seconds"),
        "machine": ba.machine(),
        "while_running": {
            "before": machine_before,
            "after": {"loadavg": ba.loadavg(), "busy": busy_processes()},
        },
        **result,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"dashboard-{args.units}-{started.strftime('%Y%m%d-%H%M')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    s = result["stats"]
    print(
        f"first page after start {result['first_render_after_start_s']}s (full page "
        f"{result['full_page_after_start_s']}s); "
        f"render median {s['render']['median_s']}s p95 {s['render']['p95_s']}s; visibility API "
        f"{s['visibility_http']['median_s']}s (kubectl {s['visibility_kubectl']['median_s']}s); ratio "
        f"{result['ratios']['render_over_visibility_http']}x; poll 304 "
        f"{s['poll_304']['median_s'] * 1000:.1f}ms; "
        f"RSS peak {result['dashboard_rss_mib'].get('VmHWM')} MiB -> {out}",
        flush=True,
    )
    if os.environ.get("KEEP_LOGS") is None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
