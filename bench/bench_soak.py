"""Churn soak: does the reconciler hold steady when jobs come and go for half an hour?

Run: ``python bench/bench_soak.py`` (30 minutes at 25 jobs/s), or ``--minutes 3 --rate 10`` for a
smoke run. Writes ``bench/results/soak-<minutes>m.json`` and prints a summary.

The admission benchmark (``bench_admission.py``) measures a burst that ends; a leak only shows when
the same work repeats long enough for per-job leftovers to add up. This run keeps the load steady
instead: Jobs are created open-loop at ``--rate`` per second for ``--minutes``; each is finished by
the runner its run time after admission (``bench_admission.Runner``, comparable mode: etcd +
kube-apiserver, our webhook and reconciler, the runner writes the Jobs' success), and once its
QueueUnit shows ``Succeed`` the Job is deleted (``propagationPolicy: Background``). Quotas are sized
so they are never the bottleneck (``--headroom`` times the slots the rate needs; the summary says how
many jobs ever found their quota full), so the rate measured is the system's own.

**The unit goes with its Job through garbage collection.** The reconciler creates each QueueUnit
owned by its Job and leaves its deletion to the garbage collector (``reconciler/jobs.py``: it
releases only units left behind by ``--cascade=orphan``). Comparable mode has no controller-manager,
so without one every unit would stay; this run starts ``kube-controller-manager`` with only the
garbage collector (``--controllers=garbage-collector-controller``), as a real cluster has it.

**Sampled every ``--sample-seconds`` (30)**: reconciler and webhook ``VmRSS``; admissions, finishes
and deletions in the window; the reconciler's ``koord_queue_store_objects`` gauges (every informer
store and every map, set, list and queue its components hold, scraped from its metrics endpoint);
the Jobs, QueueUnits and Events in the apiserver (a ``limit=1`` list each: ``remainingItemCount``).

**Before the load**, one job per quota goes through the whole cycle (create, admit, finish, delete)
so that what exists once per quota or queue (chains, members, published queue items) is in the
baseline, and the stores are sampled once the reconciler is quiet. **After the load**, once every
Job is deleted and the stores holding jobs and units are empty, the stores are sampled again
(waiting up to ``--drain-seconds`` for them to reach the baseline).

**Reported**: RSS growth from the first sample after the warm-up (``--warmup-minutes``, 5; at most
a third of the run) to the last sample of the load (target under 10%); the admission rate of the
first and the last ``--rate-window-minutes`` (5) after the warm-up, from whole sample windows (flat:
their ratio near 1); every store whose size after the drain is above its baseline (target: none).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import pathlib
import signal
import sys
import tempfile
import time
import urllib.request
from typing import Any, Final

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_admission as ba
from bench_admission import JOBS, NS, ROOT, UNITS, RunConfig

from koord_queue.shared import kube

STORE_METRIC: Final = "koord_queue_store_objects"
#: the stores that hold one entry per job or unit: empty once every Job is deleted (our namespace
#: is the only one with jobs), which is when the drain starts comparing the rest to the baseline
JOB_STORES: Final = ("informer:jobs.batch", "informer:queueunits.scheduling.x-k8s.io")
COUNTED: Final = {"jobs": JOBS, "queueunits": UNITS, "events": kube.EVENTS}
#: stores that keep entries of gone objects for a fixed time on purpose, with why: above their
#: baseline after the drain they are reported apart, not as leaks (their size is bounded by the
#: rate times the window, which the samples show)
WINDOWED: Final = {
    "events._seen": "event folding memory (reconciler/events.py): an entry lives window_s (600 s) "
    "after its last write, swept every window_s / 10",
}


@dataclasses.dataclass
class SoakConfig:
    minutes: float = 30.0
    rate: float = 25.0
    quotas: int = 10
    runtime_s: float = 2.0
    #: slots per quota = headroom x what the rate needs (rate x (run time + slack) / quotas)
    headroom: float = 2.0
    warmup_minutes: float = 5.0
    rate_window_minutes: float = 5.0
    sample_s: float = 30.0
    drain_s: float = 180.0
    propagation: str = "Background"
    create_concurrency: int = 16
    delete_concurrency: int = 8
    keep_logs: bool = False
    reconciler_args: tuple[str, ...] = ()

    @property
    def jobs(self) -> int:
        return math.ceil(self.rate * self.minutes * 60)

    @property
    def slots_per_quota(self) -> int:
        # in flight per job: the run time, plus admission, resume and finish (10 s is generous)
        return math.ceil(self.headroom * self.rate * (self.runtime_s + 10.0) / self.quotas)

    @property
    def warmup_s(self) -> float:
        return min(self.warmup_minutes * 60, self.minutes * 60 / 3)

    @property
    def tag(self) -> str:
        return f"{self.minutes:g}m"


@dataclasses.dataclass
class _Slotted(RunConfig):
    """A ``RunConfig`` whose quotas all hold ``fixed_slots`` jobs (the soak sizes them by rate)."""

    fixed_slots: int = 1

    @property
    def slots(self) -> list[int]:
        return [self.fixed_slots] * self.quotas


class SoakRunner(ba.Runner):
    """``bench_admission.Runner`` (paced creates, finishes after the run time) plus the deletion of
    each Job once its unit shows ``Succeed``: the reconciler has then seen the finish and released
    the quota, so the delete exercises the path of a job that is gone, not one that is running."""

    def __init__(self, cfg: RunConfig, client: kube.Kube, *, propagation: str, **kwargs: Any) -> None:
        super().__init__(cfg, client, **kwargs)
        self.propagation = propagation
        self.delete_queue: asyncio.Queue[int] = asyncio.Queue()
        self.deleting = bytearray(cfg.jobs)
        self.deleted = 0
        self.delete_errors = 0

    def observe(self, obj: kube.Obj) -> None:
        super().observe(obj)
        name, phase = self.unit_of(obj)
        i = self.index(name)
        if phase == "Succeed" and i is not None and i < len(self.tracks) and not self.deleting[i]:
            self.deleting[i] = 1
            self.delete_queue.put_nowait(i)

    async def deleter(self) -> None:
        while True:
            i = await self.delete_queue.get()
            for attempt in range(5):
                try:
                    await self.client.delete(JOBS, self.name(i), namespace=NS, propagation=self.propagation)
                    self.deleted += 1
                    break
                except kube.NotFound:
                    self.deleted += 1
                    break
                except kube.KubeError:
                    self.delete_errors += 1
                    await asyncio.sleep(0.2 * (attempt + 1))
            self.delete_queue.task_done()

    async def run_and_delete(self, deadline: float) -> None:
        """``run`` (until every job finished or the deadline), then until every finished job is
        deleted (bounded by the same deadline)."""
        deleters = [asyncio.create_task(self.deleter()) for _ in range(self.cfg.finish_concurrency // 2 or 1)]
        try:
            await self.run(deadline)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.delete_queue.join(), max(1.0, deadline - time.monotonic()))
        finally:
            for task in deleters:
                task.cancel()
            await asyncio.gather(*deleters, return_exceptions=True)


# --- sampling --------------------------------------------------------------------------------------


def scrape_stores(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {key[0]: int(v) for key, v in ba.parse_counter(text, STORE_METRIC, ("store",)).items()}


async def api_counts(client: kube.Kube) -> dict[str, int | None]:
    """Objects of each kind in the bench namespace: a ``limit=1`` list and its
    ``remainingItemCount`` (None where the apiserver does not give it)."""
    out: dict[str, int | None] = {}
    for label, res in COUNTED.items():
        try:
            page = await client.request("GET", res.path(NS), query={"limit": 1}, verb="LIST")
        except kube.KubeError:
            out[label] = None
            continue
        meta = page.get("metadata") or {}
        items = len(page.get("items") or [])
        remaining = meta.get("remainingItemCount")
        out[label] = (
            items + int(remaining) if remaining is not None else (None if meta.get("continue") else items)
        )
    return out


def rss_mib(component: Any) -> float:
    return round(ba.proc_mem_mib(component.process.pid).get("VmRSS", 0.0), 1)


@dataclasses.dataclass
class Sampler:
    """One sample every ``every`` seconds of the load: RSS, counts in the window, stores."""

    runner: SoakRunner
    client: kube.Kube
    reconciler: Any
    webhook: Any
    every: float
    #: every process of the run (control plane, garbage collector, webhook, reconciler), for CPU
    procs: list[Any] = dataclasses.field(default_factory=list)
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    async def take(self, t0: float, last: dict[str, Any] | None) -> dict[str, Any]:
        now = time.monotonic()
        r = self.runner
        stores = await asyncio.to_thread(scrape_stores, self.reconciler.ports["metrics"])
        sample: dict[str, Any] = {
            "t_s": round(now - t0, 1),
            "created": r.created,
            "admitted": r.admitted,
            "finished": r.finished,
            "deleted": r.deleted,
            "reconciler_rss_mib": rss_mib(self.reconciler),
            "webhook_rss_mib": rss_mib(self.webhook),
            "api_objects": await api_counts(self.client),
            "stores": stores,
            "cpu_s": {**ba.component_cpu(self.procs), "bench-runner": time.process_time()},
            "machine_busy_s": ba.machine_cpu()["busy"],
            "loadavg": ba.loadavg(),
        }
        if last is not None:
            dt = sample["t_s"] - last["t_s"]
            sample["window_s"] = round(dt, 1)
            sample["admitted_in_window"] = r.admitted - last["admitted"]
            sample["admission_rate"] = round((r.admitted - last["admitted"]) / dt, 2) if dt > 0 else None
            # the machine is shared: who used the cores in this window tells a slower window of
            # ours from a busy neighbour
            cores = {k: (v - last["cpu_s"].get(k, 0.0)) / dt for k, v in sample["cpu_s"].items()}
            busy = (sample["machine_busy_s"] - last["machine_busy_s"]) / dt
            sample["cores"] = {k: round(v, 2) for k, v in cores.items()}
            sample["other_cores"] = round(max(0.0, busy - sum(cores.values())), 2)
        return sample

    async def run(self, t0: float, until: float) -> None:
        """Samples at t0 + k * every while that is before ``until`` (the end of the creates)."""
        last = await self.take(t0, None)
        self.samples.append(last)
        k = 1
        while t0 + k * self.every <= until:
            await asyncio.sleep(max(0.0, t0 + k * self.every - time.monotonic()))
            last = await self.take(t0, last)
            self.samples.append(last)
            print(
                f"  t={last['t_s']:>6}s admitted {last['admitted']:>6} ({last['admission_rate']}/s)"
                f" rss rec {last['reconciler_rss_mib']} MiB webhook {last['webhook_rss_mib']} MiB"
                f" units {last['stores'].get(JOB_STORES[1])} api {last['api_objects']}"
                f" | reconciler {last['cores'].get('reconciler')} cores, others {last['other_cores']}",
                flush=True,
            )
            k += 1


async def wait_drained(port: int, baseline: dict[str, int], timeout: float) -> tuple[dict[str, int], float]:
    """Poll the stores until the job and unit stores are empty and every store is at most its
    baseline (but the ``WINDOWED`` ones), or ``timeout``; returns the last sizes and the seconds it
    took."""
    t0 = time.monotonic()
    sizes: dict[str, int] = {}
    while time.monotonic() - t0 < timeout:
        sizes = await asyncio.to_thread(scrape_stores, port)
        empty = all(sizes.get(s, 0) == 0 for s in JOB_STORES)
        if empty and not set(grown(baseline, sizes)) - set(WINDOWED):
            break
        await asyncio.sleep(2.0)
    return sizes, round(time.monotonic() - t0, 1)


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, list[int]]:
    """The stores above their baseline: name -> [before, after]. The event loop's own counts
    (``asyncio:*``) move with whatever is in flight at the instant of the scrape; they are
    compared too, since a per-job task or timer left behind is a leak like any other."""
    return {k: [before.get(k, 0), v] for k, v in sorted(after.items()) if v > before.get(k, 0)}


# --- figures ---------------------------------------------------------------------------------------


def figures(cfg: SoakConfig, samples: list[dict[str, Any]]) -> dict[str, Any]:
    post = [s for s in samples if s["t_s"] >= cfg.warmup_s - 1.0]
    out: dict[str, Any] = {"warmup_s": cfg.warmup_s, "post_warmup_samples": len(post)}
    if len(post) < 2:
        return out
    first, last = post[0], post[-1]
    for proc in ("reconciler", "webhook"):
        a, b = first[f"{proc}_rss_mib"], last[f"{proc}_rss_mib"]
        out[f"{proc}_rss_mib"] = {"first": a, "last": b, "max": max(s[f"{proc}_rss_mib"] for s in post)}
        out[f"{proc}_rss_growth_pct"] = round((b - a) / a * 100, 2) if a else None
    # rates from whole windows after the warm-up: the first and the last ``window`` seconds of them
    windows = [s for s in post[1:] if s.get("window_s")]
    span = sum(s["window_s"] for s in windows)
    window = min(cfg.rate_window_minutes * 60, span / 2)

    def rate(chosen: list[dict[str, Any]]) -> float | None:
        seconds = sum(s["window_s"] for s in chosen)
        return round(sum(s["admitted_in_window"] for s in chosen) / seconds, 2) if seconds else None

    head, tail, acc = [], [], 0.0
    for s in windows:
        if acc + s["window_s"] <= window + 1.0:
            head.append(s)
            acc += s["window_s"]
    acc = 0.0
    for s in reversed(windows):
        if acc + s["window_s"] <= window + 1.0:
            tail.insert(0, s)
            acc += s["window_s"]
    r_first, r_last = rate(head), rate(tail)

    def others(chosen: list[dict[str, Any]]) -> float | None:
        seconds = sum(s["window_s"] for s in chosen)
        return round(sum(s["other_cores"] * s["window_s"] for s in chosen) / seconds, 2) if seconds else None

    out["other_cores_first"], out["other_cores_last"] = others(head), others(tail)
    out["rate_window_s"] = round(window, 1)
    out["rate_first"] = r_first
    out["rate_last"] = r_last
    out["rate_last_over_first"] = round(r_last / r_first, 3) if r_first and r_last is not None else None
    out["rate_per_window"] = [[s["t_s"], s["admission_rate"]] for s in samples if "admission_rate" in s]
    out["peak_stores"] = {
        k: max(s["stores"].get(k, 0) for s in samples)
        for k in sorted({k for s in samples for k in s["stores"]})
    }
    return out


# --- one run ---------------------------------------------------------------------------------------


def start_garbage_collector(cluster: Any) -> Any:
    """kube-controller-manager with the garbage collector only: QueueUnits are owned by their
    Jobs, and deleting a Job deletes its unit only through it. Registered with the cluster, so
    ``cluster.stop()`` stops it."""
    from testenv import binaries
    from testenv.processes import free_port

    port = free_port()
    bins = binaries.resolve(("kube-controller-manager",))
    argv = [
        str(bins["kube-controller-manager"]),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cluster.workdir / 'gc-certs'}",
        "--controllers=garbage-collector-controller",
        "--use-service-account-credentials=false",
        "--kube-api-qps=200",
        "--kube-api-burst=300",
        "--profiling=false",
        "--v=1",
    ]
    component = cluster._spawn("kube-controller-manager", argv)
    cluster._await(component, lambda: _healthy(port), "kube-controller-manager (garbage collector) /healthz")
    return component


def _healthy(port: int) -> bool:
    from testenv.processes import https_ok

    return bool(https_ok(f"https://127.0.0.1:{port}/healthz"))


async def cycle_once(cfg: SoakConfig, run_cfg: RunConfig, client: kube.Kube) -> dict[str, Any]:
    """One job per quota through create, admit, finish and delete: the per-quota memory exists."""
    prime_cfg = dataclasses.replace(run_cfg, jobs=cfg.quotas, runtime_s=0.5)
    runner = SoakRunner(prime_cfg, client, prefix="prime", pace=5.0, propagation=cfg.propagation)
    await runner.run_and_delete(time.monotonic() + 120)
    return {"admitted": runner.admitted, "deleted": runner.deleted}


def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    from testenv import system

    run_cfg = _Slotted(
        mode="comparable",
        jobs=cfg.jobs,
        quotas=cfg.quotas,
        runtime_s=cfg.runtime_s,
        create_concurrency=cfg.create_concurrency,
        finish_concurrency=cfg.delete_concurrency * 2,
        reconciler_args=cfg.reconciler_args,
        probe_jobs=0,
        fixed_slots=cfg.slots_per_quota,
    )
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"kq-soak-{cfg.tag}-"))
    cluster, _ = ba.make_cluster(run_cfg, workdir)
    print(
        f"== soak {cfg.tag}: {cfg.jobs} jobs at {cfg.rate}/s over {cfg.quotas} quotas of"
        f" {cfg.slots_per_quota} slots, runtime {cfg.runtime_s}s, delete {cfg.propagation}",
        flush=True,
    )
    cluster.start()
    reconciler = webhook = None
    try:
        system.install_crds(cluster)
        gc = start_garbage_collector(cluster)
        logdir = workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        webhook, _ = system.start_webhook(cluster, logdir=logdir)

        async def prepare() -> None:
            admin = await kube.Kube.connect(kubeconfig=str(cluster.kubeconfig), qps=0, burst=1)
            try:
                await ba.setup_quotas(admin, run_cfg)
            finally:
                await admin.close()

        asyncio.run(prepare())
        reconciler = ba.start_reconciler(cluster, logdir, run_cfg, "")
        result: dict[str, Any] = {
            "config": {
                **dataclasses.asdict(cfg),
                "jobs": cfg.jobs,
                "slots_per_quota": cfg.slots_per_quota,
                "warmup_s": cfg.warmup_s,
                "garbage_collector": "kube-controller-manager --controllers=garbage-collector-controller",
            },
            "machine": ba.machine(),
            "versions": ba.versions(cluster),
        }
        assert reconciler is not None and webhook is not None
        port = reconciler.ports["metrics"]

        async def soak() -> None:
            assert reconciler is not None and webhook is not None
            client = await ba.runner_client(cluster)
            try:
                await ba.wait_queues(client, run_cfg)
                result["prime"] = await cycle_once(cfg, run_cfg, client)
                await wait_drained(port, {}, 60.0)
                await ba.settle(port, timeout=20, quiet=2.0)
                baseline = await asyncio.to_thread(scrape_stores, port)
                result["before"] = {
                    "stores": baseline,
                    "reconciler_rss_mib": rss_mib(reconciler),
                    "webhook_rss_mib": rss_mib(webhook),
                    "api_objects": await api_counts(client),
                }
                runner = SoakRunner(run_cfg, client, pace=cfg.rate, propagation=cfg.propagation)
                procs = [*cluster.components, webhook, reconciler]
                sampler = Sampler(runner, client, reconciler, webhook, cfg.sample_s, procs)
                create_s = cfg.jobs / cfg.rate
                t0 = time.monotonic()
                sampling = asyncio.create_task(sampler.run(t0, t0 + create_s))
                await runner.run_and_delete(t0 + create_s + 120 + 3 * cfg.runtime_s)
                load_s = time.monotonic() - t0
                await sampling
                print(f"  load done in {load_s:.0f}s; draining ...", flush=True)
                after, drain_s = await wait_drained(port, baseline, cfg.drain_s)
                result["samples"] = sampler.samples
                summary = runner.summary()
                result["run"] = {
                    "load_seconds": round(load_s, 1),
                    **{
                        k: summary.get(k)
                        for k in ("created", "admitted", "finished", "create_errors", "finish_errors")
                    },
                    "deleted": runner.deleted,
                    "delete_errors": runner.delete_errors,
                    "jobs_that_found_their_quota_full": sum(
                        1 for t in runner.tracks if t.created and not t.fits
                    ),
                    "latency_create_to_admitted": summary.get("latency_all"),
                    "watch_restarts": summary.get("watch_restarts"),
                }
                result["after"] = {
                    "drain_s": drain_s,
                    "stores": after,
                    "reconciler_rss_mib": rss_mib(reconciler),
                    "webhook_rss_mib": rss_mib(webhook),
                    "api_objects": await api_counts(client),
                }
                above = grown(baseline, after)
                result["after"]["grown"] = {k: v for k, v in above.items() if k not in WINDOWED}
                result["after"]["windowed"] = {k: v for k, v in above.items() if k in WINDOWED}
            finally:
                await client.close()

        asyncio.run(soak())
        result["figures"] = figures(cfg, result["samples"])
        result["reconciler_log_tail"] = reconciler.tail(10)
        result["gc_alive"] = gc.alive()
        return result
    except BaseException:
        ba.report_failure(cluster, (reconciler, webhook))
        raise
    finally:
        ba.tear_down(cluster, (reconciler, webhook), workdir, keep_logs=cfg.keep_logs)


def print_summary(result: dict[str, Any]) -> None:
    f, run, after = result["figures"], result["run"], result["after"]
    cfg = result["config"]
    print(
        f"  {run['admitted']}/{cfg['jobs']} admitted, {run['finished']} finished, {run['deleted']} deleted"
        f" in {run['load_seconds']}s; quota full for {run['jobs_that_found_their_quota_full']} jobs;"
        f" create->admitted p50 {run['latency_create_to_admitted']['p50_s']}s"
        f" p99 {run['latency_create_to_admitted']['p99_s']}s"
    )
    for proc in ("reconciler", "webhook"):
        rss = f.get(f"{proc}_rss_mib") or {}
        growth = f.get(f"{proc}_rss_growth_pct")
        verdict = "ok" if growth is not None and growth < 10 else "OVER 10%"
        print(
            f"  {proc} RSS after warm-up {rss.get('first')} -> {rss.get('last')} MiB"
            f" (max {rss.get('max')}): {growth}% [{verdict}]"
        )
    print(
        f"  admission rate first {f.get('rate_window_s')}s after warm-up {f.get('rate_first')}/s,"
        f" last {f.get('rate_last')}/s: ratio {f.get('rate_last_over_first')} (other processes on the"
        f" machine: {f.get('other_cores_first')} then {f.get('other_cores_last')} cores)"
    )
    print(
        f"  after the drain ({after['drain_s']}s): api objects {after['api_objects']};"
        f" stores above their baseline: {after['grown'] or 'none'}"
        f" (held for a time window by design: {after['windowed'] or 'none'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = SoakConfig()
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="load duration")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="Jobs created per second")
    parser.add_argument("--quotas", type=int, default=defaults.quotas)
    parser.add_argument("--runtime", type=float, default=defaults.runtime_s, help="each job's run time (s)")
    parser.add_argument(
        "--headroom", type=float, default=defaults.headroom, help="quota slots / slots needed"
    )
    parser.add_argument("--warmup-minutes", type=float, default=defaults.warmup_minutes)
    parser.add_argument("--rate-window-minutes", type=float, default=defaults.rate_window_minutes)
    parser.add_argument("--sample-seconds", type=float, default=defaults.sample_s)
    parser.add_argument("--drain-seconds", type=float, default=defaults.drain_s)
    parser.add_argument("--propagation", choices=("Background", "Foreground"), default=defaults.propagation)
    parser.add_argument("--keep-logs", action="store_true", help="keep the run's directory and print it")
    parser.add_argument("--reconciler-arg", action="append", default=[], help="extra reconciler flag")
    args = parser.parse_args()
    cfg = SoakConfig(
        minutes=args.minutes,
        rate=args.rate,
        quotas=args.quotas,
        runtime_s=args.runtime,
        headroom=args.headroom,
        warmup_minutes=args.warmup_minutes,
        rate_window_minutes=args.rate_window_minutes,
        sample_s=args.sample_seconds,
        drain_s=args.drain_seconds,
        propagation=args.propagation,
        keep_logs=args.keep_logs,
        reconciler_args=tuple(args.reconciler_arg),
    )
    ba.RESULTS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = run_soak(cfg)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    out = ba.RESULTS / f"soak-{cfg.tag}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_summary(result)
    print(f"  ({result['wall_s']}s) written to {out.relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        main()
