"""End-to-end admission benchmark against a real control plane.

Run: ``python bench/bench_admission.py`` (the default matrix), or one run with
``--jobs N --quotas Q --mode comparable|full``; ``--quick`` is a 300-job smoke run (< 2 min).
Each run writes ``bench/results/admission-<mode>-<jobs>x<quotas>.json`` (``admission-quick-...`` for
``--quick``) and prints a table; ``bench/plot.py`` draws the PNGs from those files.

**Kueue-comparable mode** (``--mode comparable``): etcd + kube-apiserver (``LocalCluster`` profile
``integration``), our webhook and our reconciler, as Kueue's ``test/performance/scheduler`` runs
minimalkueue against envtest. There is no controller-manager, so no pod ever exists: the benchmark
is the runner. It creates N managed ``batch/v1`` Jobs (one pod, 100m cpu, the quota label, a
priority from the ``scheduling.x-k8s.io/priority`` annotation: 60% 10, 30% 50, 10% 100) spread
round-robin over Q ElasticQuotas. Each quota holds ``--fit-fraction`` (20%) of its jobs, so most
jobs wait until others finish. The runner watches the QueueUnits; when one becomes ``Dequeued`` it
marks the Job finished ``runtime`` seconds later, through the status subresource, as Kueue's
runner marks workloads finished. The apiserver (v1.35) accepts ``Complete=True`` only with
``startTime``, ``completionTime`` and a ``SuccessCriteriaMet=True`` condition (422 otherwise:
"completionTime is required for Complete jobs", "startTime is required for finished job",
"cannot set Complete=True condition without the SuccessCriteriaMet=true condition"); the patch
also sets ``succeeded: 1`` as the Job controller would. The runner also watches the Jobs and
finishes a job only once the reconciler has resumed it (``spec.suspend: false``): a real job
cannot finish before it starts, and finishing a suspended Job would spare the reconciler its
resume write. (The patch is a JSON patch whose first op tests ``/spec/suspend == false``.) The
reconciler observes the finished Job, moves the unit to ``Succeed`` and the quota is released.

The run time is ``slots / --quota-rate`` (default 100/s, the target): quotas and run times alone
would allow exactly the target rate, so a system meeting it keeps the quotas full and one below
it shows its own rate.

**Latency probe**: before the load, ``--probe-jobs`` (40) jobs are created open-loop at
``--probe-rate`` (5/s) into a quota with room for all of them: the create→Dequeued latency of the
admission path on an otherwise quiet system. The load's own "fit at once" latency (below) is
dominated by queueing behind the burst of creates.

**Full mode** (``--mode full``): profile ``e2e``: + kube-controller-manager (Job controller),
kube-scheduler and kwok nodes sized so every admitted pod fits. Jobs are resumed, their pods
created with our scheduling gate, ungated by the reconciler, bound by the scheduler, run by kwok
for ``runtime`` seconds and completed by the Job controller. The runner only creates and watches.

**Measured**, all from the runner's watch (monotonic clock) unless said otherwise:

* time from the first create until all N are admitted (QueueUnit ``Dequeued``) and the overall
  rate N / that time; *sustained* admissions/s = admissions between the 10th and 90th percentile
  of admission times / that time span;
* p50/p90/p99 create→Dequeued latency (from sending the create) for the jobs that *fit at once*:
  when the create was sent, fewer than ``slots`` jobs of its quota were created and not yet seen
  ``Succeed``; also for all jobs;
* API requests of the reconciler by verb and resource: the reconciler is started through this
  script (``--as-reconciler``), which wraps ``shared.kube.Kube.request`` to count each request in
  a Prometheus counter ``koord_queue_bench_requests_total{verb,resource,subresource}`` (the
  product's ``koord_queue_api_requests_total`` counts by verb only). Writes per
  admitted job = reconciler POST/PATCH/PUT/DELETE / admitted jobs, events included. Cross-checked
  against the apiserver's own ``apiserver_request_total`` (scraped from ``/metrics`` with the
  admin certificate) in comparable mode, where only the runner and the reconciler write;
* reconciler CPU seconds (utime + stime from ``/proc/<pid>/stat``) and peak RSS (``VmHWM`` from
  ``/proc/<pid>/status``), and the CPU seconds of every other process (apiserver, etcd, webhook,
  the runner itself, and in full mode the controller-manager, scheduler and kwok) to name the
  bottleneck on this machine;
* **the ceiling, in the same run**: the raw write throughput of the same apiserver for the same
  client: ``shared.kube.Kube`` impersonating the reconciler's ServiceAccount, 64 concurrent
  workers (the scheduler's ``WRITE_CONCURRENCY``) sending merge patches of QueueUnit status with
  the resourceVersion precondition, shaped like the scheduler's (phase, message, admissions, two
  conditions), without a client rate limit, to 64 QueueUnits built by the product's own
  ``jobext.build_queue_unit`` from the benchmark's Job as our webhook mutates it (a dry-run
  create). It is measured before the reconciler starts and again after it stopped; the mean is
  used. efficiency = sustained admissions/s * reconciler writes per admission / raw writes/s.
  Caveat: these patches cost the apiserver more CPU than the average write of the load (events
  and Job patches are cheaper), so a value near or above 1 means the apiserver is saturated;
* CPU milliseconds per admitted job of every process, and from them a CPU-bound rate estimate
  (cores x 1000 / total ms per job): the figure that does not depend on what else the machine ran
  (other processes' CPU during the load is recorded too).

* per unit, from the runner's watches (bench/bench_kueue.py reports them; see its docstring): status
  writes before admission of the units that waited, event writes per unit (with
  ``RunConfig.watch_events``: Events listed after the load, their ``count`` summed), and the slot
  refill time from each finish the runner wrote to the next admission in its quota.

Every loop is bounded in count and time (a run has a deadline; waits poll with deadlines) and all
traffic is loopback. ``--profile cprofile`` runs the reconciler under cProfile and writes
``admission-<...>.prof`` next to the JSON (slower: do not compare its figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import cProfile
import dataclasses
import json
import math
import os
import pathlib
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

ROOT: Final = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from koord_queue.shared import kube  # noqa: E402
from koord_queue.shared.api import names  # noqa: E402

RESULTS: Final = ROOT / "bench" / "results"
NS: Final = "bench"
CEILING_NS: Final = "bench-ceiling"
JOBS: Final = kube.Resource("batch", "v1", "jobs", "Job")
UNITS: Final = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
QUOTAS: Final = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")
QUEUES: Final = kube.Resource(names.GROUP, names.VERSION, names.QUEUE_PLURAL, "Queue")
CPU_PER_JOB_MILLI: Final = 100
#: (priority, weight): the mix of the ``scheduling.x-k8s.io/priority`` annotation
PRIORITIES: Final = ((10, 60), (50, 30), (100, 10))
ADMITTED_PHASES: Final = frozenset({"Dequeued", "Running", "SchedSucceed", "Succeed"})
WRITE_VERBS: Final = frozenset({"POST", "PATCH", "PUT", "DELETE"})
CEILING_CONCURRENCY: Final = 64  # reconciler.scheduler_writes.WRITE_CONCURRENCY
TICKS: Final = os.sysconf("SC_CLK_TCK")
#: The default matrix of ``make bench``: (mode, jobs, quotas, load deadline in s; 0 = derived).
#: 15,000 jobs get ten minutes, the budget set for this 2-core machine.
MATRIX: Final = (
    ("comparable", 1_000, 10, 0),
    ("comparable", 5_000, 10, 0),
    ("comparable", 15_000, 10, 900),
    ("comparable", 1_000, 1, 0),
    ("comparable", 1_000, 100, 0),
    ("full", 1_000, 10, 0),
)


# --- configuration ---------------------------------------------------------------------------------


@dataclasses.dataclass
class RunConfig:
    mode: str
    jobs: int
    quotas: int
    fit_fraction: float = 0.2
    quota_rate: float = 100.0
    runtime_s: float | None = None
    create_concurrency: int = 16
    finish_concurrency: int = 16
    seed: int = 7
    reconciler_args: tuple[str, ...] = ()
    profile: str = ""
    ceiling_s: float = 5.0
    timeout_s: float = 0.0
    quick: bool = False
    keep_logs: bool = False
    probe_jobs: int = 40
    probe_rate: float = 5.0
    #: seconds of idle CPU measured before the probe (0: none); see ``idle_cpu``
    idle_s: float = 0.0
    #: slots of every quota, in place of ``fit_fraction`` (0: derived); bench_kueue.py's saturated run
    slots_per_quota: int = 0
    #: each job's run time is ``runtime`` x a seeded uniform factor in [1 - j, 1 + j] (comparable
    #: mode): the mean and so the quotas' capacity stay the same, the finishes do not come in waves
    runtime_jitter: float = 0.0
    #: the runner counts the Events about each job and unit after the load (``Runner.count_events``)
    watch_events: bool = False

    @property
    def per_quota(self) -> list[int]:
        base, extra = divmod(self.jobs, self.quotas)
        return [base + (1 if q < extra else 0) for q in range(self.quotas)]

    @property
    def slots(self) -> list[int]:
        if self.slots_per_quota > 0:
            return [self.slots_per_quota] * self.quotas
        return [max(1, math.ceil(n * self.fit_fraction)) for n in self.per_quota]

    @property
    def runtime(self) -> float:
        if self.runtime_s is not None:
            return self.runtime_s
        return round(sum(self.slots) / self.quota_rate, 3)

    @property
    def deadline_s(self) -> float:
        if self.timeout_s > 0:
            return self.timeout_s
        # 8 admissions/s (a busy 2-core machine) or 80% of what the quotas allow if that is less,
        # plus the run time of the last wave; the smoke run stops after 75 s whatever happened, so
        # that it stays under two minutes in all
        rate = min(8.0, 0.8 * sum(self.slots) / self.runtime) if self.runtime > 0 else 8.0
        derived = 60.0 + self.jobs / rate + 2 * self.runtime
        return min(derived, 75.0) if self.quick else derived

    @property
    def tag(self) -> str:
        prefix = "quick-" if self.quick else ""
        return f"{prefix}{self.mode}-{self.jobs}x{self.quotas}"


def quota_name(q: int) -> str:
    return f"bench-q{q:03d}"


PROBE_QUOTA: Final = "bench-probe"


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --- process statistics ----------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process (its own threads; children are not ours to count)."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def proc_mem_mib(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def machine_cpu() -> dict[str, float]:
    """Busy and steal CPU seconds of the whole machine (``/proc/stat``), to see who else is busy."""
    fields = pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system_, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return {"busy": (user + nice + system_ + irq + softirq + steal) / TICKS, "steal": steal / TICKS}


def loadavg() -> float:
    return float(pathlib.Path("/proc/loadavg").read_text().split()[0])


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


# --- metrics scraping ------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}\s+([0-9.eE+-]+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_counter(text: str, metric: str, keys: tuple[str, ...]) -> Counter[tuple[str, ...]]:
    out: Counter[tuple[str, ...]] = Counter()
    prefix = metric + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        # a Counter of floats: the samples are floats, and Counter's arithmetic is what diff needs
        out[tuple(labels.get(k, "") for k in keys)] += float(m.group(3))  # type: ignore[assignment]
    return out


APISERVER_KEYS: Final = ("verb", "group", "resource", "subresource", "code")
BENCH_KEYS: Final = ("verb", "resource", "subresource")


def scrape_apiserver(cluster: Any) -> Counter[tuple[str, ...]]:
    text = cluster.request("GET", "/metrics", timeout=30.0)
    return parse_counter(text, "apiserver_request_total", APISERVER_KEYS)


def scrape_reconciler(port: int) -> Counter[tuple[str, ...]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return parse_counter(text, "koord_queue_bench_requests_total", BENCH_KEYS)


def diff(after: Counter[tuple[str, ...]], before: Counter[tuple[str, ...]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in sorted(set(after) | set(before)):
        value = after.get(key, 0.0) - before.get(key, 0.0)
        if value:
            out["|".join(key)] = value
    return out


def writes_of(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.split("|", 1)[0] in WRITE_VERBS)


# --- the reconciler, counted (``--as-reconciler``) -------------------------------------------------


def _split_path(path: str) -> tuple[str, str]:
    """``/apis/g/v/namespaces/ns/plural/name/sub`` → (plural, sub)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] if rest else ""
    sub = rest[2] if len(rest) > 2 else ""
    return resource, sub


def _trace_memory(out: pathlib.Path, every_s: float = 20.0) -> None:
    """Diagnostics (``KQ_BENCH_TRACEMALLOC=<file>``): every ``every_s`` seconds, write the 30 source
    lines holding the most memory in the reconciler. Slows allocation; never for timed runs."""
    import threading
    import tracemalloc

    tracemalloc.start(1)

    def dump() -> None:
        while True:
            time.sleep(every_s)
            stats = tracemalloc.take_snapshot().statistics("lineno")
            total = sum(s.size for s in stats)
            lines = [f"total {total / 2**20:.1f} MiB"] + [
                f"{s.size / 2**20:8.1f} MiB {s.count:9d} {s.traceback}" for s in stats[:30]
            ]
            out.write_text("\n".join(lines) + "\n")

    threading.Thread(target=dump, daemon=True, name="tracemalloc").start()


def as_reconciler(argv: list[str]) -> None:
    """Run ``reconciler.main`` with a request counter (and optionally under cProfile)."""
    profile_out = ""
    if argv and argv[0].startswith("--profile-out="):
        profile_out = argv.pop(0).split("=", 1)[1]
    from prometheus_client import Counter as PromCounter

    from koord_queue.reconciler import main as reconciler_main
    from koord_queue.reconciler import metrics

    requests = PromCounter(
        "koord_queue_bench_requests_total",
        "Requests the reconciler sent, by verb, resource and subresource (benchmark instrumentation).",
        list(BENCH_KEYS),
        registry=metrics.REGISTRY,
    )
    original = kube.Kube.request

    async def counted(self: kube.Kube, method: str, path: str, **kwargs: Any) -> kube.Obj:
        resource, sub = _split_path(path)
        requests.labels(kwargs.get("verb") or method, resource, sub).inc()
        return await original(self, method, path, **kwargs)

    original_watch = kube.Kube.watch

    def watched(self: kube.Kube, res: kube.Resource, **kwargs: Any) -> Any:
        requests.labels("WATCH", res.plural, "").inc()
        return original_watch(self, res, **kwargs)

    kube.Kube.request = counted  # type: ignore[method-assign]
    kube.Kube.watch = watched  # type: ignore[method-assign]
    if os.environ.get("KQ_BENCH_TRACEMALLOC"):
        _trace_memory(pathlib.Path(os.environ["KQ_BENCH_TRACEMALLOC"]))
    if not profile_out:
        reconciler_main.main(argv)
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        reconciler_main.main(argv)
    finally:
        profiler.disable()
        profiler.dump_stats(profile_out)


def _accepts(flag: str) -> bool:
    """Does this checkout's reconciler know ``flag``? (Its servers default to fixed ports.)"""
    from koord_queue.reconciler import main as reconciler_main

    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            reconciler_main.parse_args([flag])
    except SystemExit:
        return False
    return True


def start_reconciler(cluster: Any, logdir: pathlib.Path, cfg: RunConfig, profile_out: str) -> Any:
    """Like ``testenv.system.start_reconciler`` (its ServiceAccount, impersonated), but counted."""
    from testenv import system
    from testenv.processes import free_port, spawn, wait_until

    system.install_rbac(cluster)
    health, metrics_port = free_port(), free_port()
    optional = [f"--visibility-port={free_port()}"] if _accepts("--visibility-port=0") else []
    # The benchmarks scrape their own counters in the clear; a cluster never does
    # (docs/operations.md#metrics).
    optional += ["--metrics-secure=false"] if _accepts("--metrics-secure=false") else []
    argv = [sys.executable, str(pathlib.Path(__file__).resolve()), "--as-reconciler"]
    if profile_out:
        argv.append(f"--profile-out={profile_out}")
    argv += [
        f"--kubeconfig={cluster.kubeconfig}",
        f"--as={system.RECONCILER_USER}",
        f"--health-port={health}",
        f"--metrics-port={metrics_port}",
        "--bind-address=127.0.0.1",
        *optional,
        *cfg.reconciler_args,
    ]
    log = logdir / "reconciler.log"
    ports = {"health": health, "metrics": metrics_port}
    env = {"PYTHONUNBUFFERED": "1"}
    component = spawn("reconciler", argv, log, env=env, cwd=ROOT, ports=ports)

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)

    wait_until(ready, timeout=60, what="reconciler /readyz", process=component)
    return component


# --- objects ---------------------------------------------------------------------------------------


def job_body(name: str, quota: str, priority: int) -> kube.Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {names.QUOTA_NAME_LABEL: quota},
            "annotations": {names.PRIORITY_ANNOTATION: str(priority)},
        },
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": f"{CPU_PER_JOB_MILLI}m"}},
                        }
                    ],
                }
            },
        },
    }


def finish_patch() -> list[dict[str, Any]]:
    """The Job controller's success, as the 1.35 apiserver requires it (see the module doc)."""
    stamp = now_text()
    status = {
        "startTime": stamp,
        "completionTime": stamp,
        "succeeded": 1,
        "ready": 0,
        "conditions": [
            {
                "type": "SuccessCriteriaMet",
                "status": "True",
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastProbeTime": stamp,
                "lastTransitionTime": stamp,
            },
            {
                "type": "Complete",
                "status": "True",
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastProbeTime": stamp,
                "lastTransitionTime": stamp,
            },
        ],
    }
    return [
        {"op": "test", "path": "/spec/suspend", "value": False},
        {"op": "add", "path": "/status", "value": status},
    ]


# --- the ceiling -----------------------------------------------------------------------------------


async def realistic_unit(admin: kube.Kube) -> kube.Obj:
    """A QueueUnit shaped like the benchmark's: the Job mutated by our webhook (a dry-run create),
    turned into a unit by the reconciler's own ``jobext.build_queue_unit``; no owner (nothing to
    garbage-collect it), in the ceiling namespace."""
    from koord_queue.shared.jobs import jobext
    from koord_queue.shared.jobs.batch_job import BatchJobAdapter

    probe = job_body("job-ceiling", quota_name(0), 10)
    job = await admin.request("POST", JOBS.path(NS), query={"dryRun": "All"}, body=probe)
    unit = jobext.build_queue_unit(job, BatchJobAdapter(), {})
    unit["metadata"].pop("ownerReferences", None)
    unit["metadata"]["namespace"] = CEILING_NS
    return unit


def admission_like_status(name: str, i: int) -> kube.Obj:
    """Alternately an admission (Dequeued, admissions, conditions) and a park, as the scheduler writes."""
    stamp = now_text()
    admitted = i % 2 == 0
    reason = "Admitted" if admitted else "Pending"
    state = "True" if admitted else "False"
    return {
        "phase": "Dequeued" if admitted else "Enqueued",
        "message": f"ceiling write {i}",
        "admissions": [{"name": name, "replicas": 1, "running": 0}] if admitted else [],
        "lastAllocateTime": stamp,
        "lastUpdateTime": stamp,
        "attempts": i,
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": state,
                "reason": "QuotaReserved" if admitted else reason,
                "message": "Quota is reserved in the queue",
                "lastTransitionTime": stamp,
            },
            {
                "type": "Admitted",
                "status": state,
                "reason": reason,
                "message": "The queue unit is admitted and the job is released",
                "lastTransitionTime": stamp,
            },
        ],
    }


async def ceiling(cluster: Any, seconds: float, concurrency: int = CEILING_CONCURRENCY) -> dict[str, Any]:
    """Raw status-patch throughput of this apiserver for the reconciler's client and identity."""
    from testenv import system

    admin = await kube.Kube.connect(kubeconfig=str(cluster.kubeconfig), qps=0, burst=1, pool_size=8)
    client = await kube.Kube.connect(
        kubeconfig=str(cluster.kubeconfig),
        qps=0,
        burst=1,
        impersonate=system.RECONCILER_USER,
        pool_size=max(64, concurrency),
        user_agent="koord-queue-bench-ceiling",
    )
    try:
        await create_namespace(admin, CEILING_NS)
        await create_namespace(admin, NS)
        template = await realistic_unit(admin)
        rvs: list[str] = []
        for w in range(concurrency):
            body = copy.deepcopy(template)
            body["metadata"]["name"] = f"ceiling-{w:03d}"
            created = await admin.create(UNITS, body, namespace=CEILING_NS)
            rvs.append(str(created["metadata"]["resourceVersion"]))
        stop_at = time.monotonic() + seconds
        latencies: list[float] = []
        errors = 0

        async def worker(w: int) -> int:
            nonlocal errors
            done = 0
            rv = rvs[w]
            name = f"ceiling-{w:03d}"
            while time.monotonic() < stop_at:
                body = {"metadata": {"resourceVersion": rv}, "status": admission_like_status(name, done)}
                t0 = time.monotonic()
                try:
                    out = await client.patch(UNITS, name, body, namespace=CEILING_NS, subresource="status")
                    rv = str(out["metadata"]["resourceVersion"])
                    done += 1
                    latencies.append(time.monotonic() - t0)
                except kube.KubeError:
                    errors += 1
                    got = await admin.get(UNITS, name, namespace=CEILING_NS)
                    rv = str(got["metadata"]["resourceVersion"])
            return done

        cpu0 = time.process_time()
        server0 = component_cpu(cluster.components)
        t0 = time.monotonic()
        counts = await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.monotonic() - t0
        client_cpu = time.process_time() - cpu0
        server1 = component_cpu(cluster.components)
        total = sum(counts)
        for w in range(concurrency):
            with contextlib.suppress(kube.KubeError):
                await admin.delete(UNITS, f"ceiling-{w:03d}", namespace=CEILING_NS)
        return {
            "writes": total,
            "seconds": round(elapsed, 3),
            "writes_per_s": round(total / elapsed, 1),
            "concurrency": concurrency,
            "errors": errors,
            "p50_ms": round((percentile(latencies, 0.5) or 0) * 1e3, 2),
            "p99_ms": round((percentile(latencies, 0.99) or 0) * 1e3, 2),
            "client_cpu_ms_per_write": round(client_cpu / max(1, total) * 1e3, 3),
            "server_cpu_ms_per_write": {
                k: round((server1[k] - server0.get(k, 0.0)) / max(1, total) * 1e3, 3) for k in server1
            },
        }
    finally:
        await client.close()
        await admin.close()


# --- the load --------------------------------------------------------------------------------------


async def runner_client(cluster: Any) -> kube.Kube:
    """The runner's client: no client-side rate limit (the apiserver and the systems under test
    are what is measured), a large pool, and :func:`lighten`."""
    client = await kube.Kube.connect(
        kubeconfig=str(cluster.kubeconfig), qps=0, burst=1, pool_size=64, user_agent="koord-queue-bench"
    )
    lighten(client)
    return client


def report_failure(cluster: Any, components: Sequence[Any]) -> None:
    """A run failed: print the control plane's logs and the end of each component's."""
    print(cluster.logs())
    for comp in components:
        if comp is not None:
            print(f"--- {comp.name} ---\n{comp.tail(40)}")


def tear_down(cluster: Any, components: Sequence[Any], workdir: pathlib.Path, *, keep_logs: bool) -> None:
    """Stop the components and the control plane; remove the run's directory unless kept."""
    for comp in components:
        if comp is not None:
            comp.stop()
    cluster.stop()
    if not keep_logs:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    else:
        print(f"  logs kept in {workdir}")


def lighten(client: kube.Kube) -> None:
    """The runner is not under test: spare the machine the ~0.8 ms of CPU per request that the
    session's ``trust_env=True`` costs (kubernetes-asyncio sets it; aiohttp then looks up netrc and
    the proxy environment in a worker thread on every request). The reconciler and the ceiling
    keep the product's client as it is."""
    session = client.api_client.rest_client.pool_manager
    session._trust_env = False


@dataclasses.dataclass
class Track:
    quota: int
    priority: int
    fits: bool = False
    sent: float = 0.0
    created: float = 0.0
    unit_seen: float = 0.0
    admitted: float = 0.0
    resumed: float = 0.0
    due: bool = False
    finishing: bool = False
    finished: float = 0.0
    #: when the runner's finish (Job status) write returned
    finish_done: float = 0.0
    #: the last status of its unit the watch saw, and how many times it changed before admission
    last_status: Any = None
    status_writes_before_admission: int = 0
    #: event writes (creates and count updates) on its unit or Job, by "<kind>/<reason>"
    events: Counter[str] | None = None


class Runner:
    """Creates the jobs, watches their units, finishes admitted jobs after the run time.

    ``units``, :meth:`unit_of` and :meth:`make_job` are what another queueing system's run changes
    (bench/bench_kueue.py watches Kueue's Workloads and labels its Jobs for Kueue): the load, the
    finishing and the figures stay the same code for both.

    Per unit it also counts, from its watch, the versions whose ``status`` differed from the
    previous version seen while the unit was not yet admitted (each is one status write that
    changed something: a write that changes nothing makes no watch event; exact while the watch
    is never cut off with 410 Gone, ``watch_gone``), and with ``cfg.watch_events``, by
    :meth:`count_events` after the load, the event writes whose ``involvedObject`` is the unit or
    its Job."""

    #: what the runner watches for admissions: one object per job, named or owned by it
    units: kube.Resource = UNITS

    def __init__(
        self,
        cfg: RunConfig,
        client: kube.Kube,
        *,
        prefix: str = "job",
        quota_names: list[str] | None = None,
        pace: float = 0.0,
    ) -> None:
        self.cfg = cfg
        self.client = client
        self.prefix = prefix + "-"
        self.quota_names = quota_names or [quota_name(q) for q in range(cfg.quotas)]
        self.pace = pace
        rng = random.Random(cfg.seed)
        weights = [w for _, w in PRIORITIES]
        values = [p for p, _ in PRIORITIES]
        self.tracks = [
            Track(quota=i % cfg.quotas, priority=rng.choices(values, weights)[0]) for i in range(cfg.jobs)
        ]
        self.slots = cfg.slots
        self.occupancy = [0] * cfg.quotas
        self.admitted = 0
        self.finished = 0
        self.created = 0
        self.create_errors = 0
        self.finish_errors = 0
        self.job_events = 0
        self.finish_queue: asyncio.Queue[int] = asyncio.Queue()
        self.all_admitted = asyncio.Event()
        self.all_finished = asyncio.Event()
        self.watch_events = 0
        self.watch_restarts = 0
        self.t0 = 0.0
        self.max_backlog = 0
        self.watch_gone = 0
        self.task_errors: list[str] = []
        #: unit name -> job index, for events on units not named after their job (Kueue's Workloads)
        self.unit_index: dict[str, int] = {}
        #: event writes about the load's jobs and units, by "<reporting component>|<kind>/<reason>"
        self.event_writes: Counter[str] = Counter()
        jitter = random.Random(cfg.seed + 1)
        self.runtimes = [
            cfg.runtime * (1 + cfg.runtime_jitter * (2 * jitter.random() - 1)) for _ in range(cfg.jobs)
        ]

    def index(self, name: str) -> int | None:
        if not name.startswith(self.prefix):
            return None
        try:
            return int(name[len(self.prefix) :])
        except ValueError:
            return None

    def name(self, i: int) -> str:
        return f"{self.prefix}{i:05d}"

    def unit_of(self, obj: kube.Obj) -> tuple[str, str]:
        """(the job's name, the unit's phase) of a unit version: a QueueUnit is named after its job."""
        return str((obj.get("metadata") or {}).get("name", "")), (obj.get("status") or {}).get("phase") or ""

    def make_job(self, name: str, quota: str, priority: int) -> kube.Obj:
        return job_body(name, quota, priority)

    def observe(self, obj: kube.Obj) -> None:
        """A unit version from the watch."""
        self.watch_events += 1
        job_name, phase = self.unit_of(obj)
        i = self.index(job_name)
        if i is None or i >= len(self.tracks):
            return
        track = self.tracks[i]
        now = time.monotonic()
        if not track.unit_seen:
            track.unit_seen = now
            self.unit_index[str((obj.get("metadata") or {}).get("name", ""))] = i
        status = obj.get("status") or {}
        changed = track.last_status is not None and status != track.last_status
        if changed and not track.admitted and phase not in ADMITTED_PHASES:
            track.status_writes_before_admission += 1
        track.last_status = status
        if phase in ADMITTED_PHASES and not track.admitted:
            track.admitted = now
            self.admitted += 1
            if self.cfg.mode == "comparable":
                asyncio.get_running_loop().call_later(self.runtimes[i], self._due, i)
            if self.admitted == self.cfg.jobs:
                self.all_admitted.set()
        if phase == "Succeed" and not track.finished:
            track.finished = now
            self.finished += 1
            self.occupancy[track.quota] -= 1
            if self.finished == self.cfg.jobs:
                self.all_finished.set()

    async def count_events(self) -> None:
        """After the load (``cfg.watch_events``): every Event in the cluster about a job of the
        load or its unit, listed once. An Event's ``count`` is the number of times it was
        written (its create, then one update per repetition), so the sum is the event writes."""
        items, _ = await self.client.list(kube.EVENTS)
        for obj in items:
            involved = obj.get("involvedObject") or {}
            kind, name = str(involved.get("kind", "")), str(involved.get("name", ""))
            if kind == JOBS.kind:
                i = self.index(name)
            elif kind == self.units.kind:
                i = self.unit_index.get(name)
            else:
                continue
            if i is None or i >= len(self.tracks):
                continue
            writes = max(1, int(obj.get("count") or (obj.get("series") or {}).get("count") or 1))
            reason = f"{kind}/{obj.get('reason', '')}"
            source = obj.get("reportingComponent") or (obj.get("source") or {}).get("component") or ""
            self.event_writes[f"{source}|{reason}"] += writes
            self._count_event(i, reason, writes)

    def _count_event(self, i: int, key: str, n: int = 1) -> None:
        if i >= len(self.tracks):
            return
        track = self.tracks[i]
        if track.events is None:
            track.events = Counter()
        track.events[key] += n

    def observe_job(self, obj: kube.Obj) -> None:
        """A Job version from the watch: note when the reconciler resumed it."""
        self.job_events += 1
        i = self.index(str((obj.get("metadata") or {}).get("name", "")))
        if i is None or i >= len(self.tracks):
            return
        track = self.tracks[i]
        if not track.resumed and (obj.get("spec") or {}).get("suspend") is False:
            track.resumed = time.monotonic()
            self._maybe_finish(i)

    def _due(self, i: int) -> None:
        self.tracks[i].due = True
        self._maybe_finish(i)

    def _maybe_finish(self, i: int) -> None:
        """Comparable mode: finish a job once its run time has passed *and* it was resumed."""
        track = self.tracks[i]
        if track.due and track.resumed and not track.finishing:
            track.finishing = True
            self.finish_queue.put_nowait(i)

    async def follow(
        self, res: kube.Resource, rv: str, deadline: float, handle: Any, namespace: str | None = NS
    ) -> None:
        """Watch ``res`` in the bench namespace (``None``: all) until the deadline or until every
        job finished."""
        while time.monotonic() < deadline and not self.all_finished.is_set():
            try:
                remaining = max(1, int(deadline - time.monotonic()))
                async for kind, obj in self.client.watch(
                    res, namespace=namespace, resource_version=rv, timeout_seconds=min(300, remaining)
                ):
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if kind in ("ADDED", "MODIFIED"):
                        handle(obj)
                    if self.all_finished.is_set():
                        return
            except kube.Gone:
                self.watch_gone += 1
                items, rv = await self.client.list(res, namespace=namespace)
                for item in items:
                    handle(item)
            except kube.KubeError:
                await asyncio.sleep(0.2)
            self.watch_restarts += 1

    async def create(self, next_index: Any) -> None:
        for i in next_index:
            if self.pace > 0:
                # open loop: job i is due at t0 + i / pace, whatever happened to the others
                await asyncio.sleep(max(0.0, self.t0 + i / self.pace - time.monotonic()))
            track = self.tracks[i]
            quota = track.quota
            track.fits = self.occupancy[quota] < self.slots[quota]
            self.occupancy[quota] += 1
            body = self.make_job(self.name(i), self.quota_names[quota], track.priority)
            for attempt in range(5):
                track.sent = time.monotonic()
                try:
                    await self.client.create(JOBS, body, namespace=NS)
                    break
                except kube.Conflict as err:
                    if err.reason == "AlreadyExists":
                        break
                    self.create_errors += 1
                except kube.KubeError:
                    self.create_errors += 1
                await asyncio.sleep(0.1 * (attempt + 1))
            track.created = time.monotonic()
            self.created += 1
            self.max_backlog = max(self.max_backlog, self.created - self.admitted)

    async def finisher(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            i = await self.finish_queue.get()
            name = self.name(i)
            for attempt in range(3):
                try:
                    await self.client.patch(
                        JOBS,
                        name,
                        finish_patch(),
                        namespace=NS,
                        subresource="status",
                        content_type=kube.JSON_PATCH,
                    )
                    self.tracks[i].finish_done = time.monotonic()
                    break
                except kube.KubeError:
                    self.finish_errors += 1
                    await asyncio.sleep(0.2 * (attempt + 1))

    async def run(self, deadline: float) -> None:
        _, rv = await self.client.list(self.units, namespace=NS)
        _, job_rv = await self.client.list(JOBS, namespace=NS)
        tasks: list[asyncio.Task[Any]] = []
        self.t0 = time.monotonic()
        tasks.append(
            asyncio.create_task(self.follow(self.units, rv, deadline, self.observe), name="watch-units")
        )
        tasks.append(
            asyncio.create_task(self.follow(JOBS, job_rv, deadline, self.observe_job), name="watch-jobs")
        )
        order = iter(range(self.cfg.jobs))
        creators = [
            asyncio.create_task(self.create(order), name=f"create-{c}")
            for c in range(self.cfg.create_concurrency)
        ]
        if self.cfg.mode == "comparable":
            tasks += [
                asyncio.create_task(self.finisher(deadline), name=f"finish-{c}")
                for c in range(self.cfg.finish_concurrency)
            ]
        try:
            await asyncio.wait_for(asyncio.gather(*creators), timeout=max(1.0, deadline - time.monotonic()))
            await asyncio.wait_for(self.all_finished.wait(), timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            print(
                f"  !! deadline reached: {self.admitted}/{self.cfg.jobs} admitted, {self.finished} finished"
            )
        finally:
            for t in [*creators, *tasks]:
                t.cancel()
            outcomes = await asyncio.gather(*creators, *tasks, return_exceptions=True)
            for task, outcome in zip([*creators, *tasks], outcomes, strict=True):
                if isinstance(outcome, Exception):  # a watch or finisher that died is not silent
                    self.task_errors.append(f"{task.get_name()}: {outcome!r}")
                    print(f"  !! {task.get_name()} failed: {outcome!r}", flush=True)

    # --- figures -------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        t0 = self.t0
        admitted = sorted(t.admitted - t0 for t in self.tracks if t.admitted)
        created = sorted(t.created - t0 for t in self.tracks if t.created)
        finished = sorted(t.finished - t0 for t in self.tracks if t.finished)
        fit_lat = [t.admitted - t.sent for t in self.tracks if t.fits and t.admitted]
        all_lat = [t.admitted - t.sent for t in self.tracks if t.admitted]
        wait_lat = [t.admitted - t.sent for t in self.tracks if not t.fits and t.admitted]
        unit_lat = [t.unit_seen - t.sent for t in self.tracks if t.unit_seen]
        fit_resume = [t.resumed - t.sent for t in self.tracks if t.fits and t.resumed]
        resume_lag = [t.resumed - t.admitted for t in self.tracks if t.resumed and t.admitted]
        n = len(admitted)
        out: dict[str, Any] = {
            "created": self.created,
            "admitted": n,
            "finished": len(finished),
            "create_errors": self.create_errors,
            "job_events": self.job_events,
            "finish_errors": self.finish_errors,
            "watch_events": self.watch_events,
            "watch_restarts": self.watch_restarts,
            "watch_gone": self.watch_gone,
            "task_errors": self.task_errors,
            "max_backlog": self.max_backlog,
            "create_seconds": round(created[-1], 3) if created else None,
            "create_rate": round(len(created) / created[-1], 1) if created and created[-1] > 0 else None,
        }
        if n:
            out["all_admitted_s"] = round(admitted[-1], 3) if n == self.cfg.jobs else None
            out["last_admission_s"] = round(admitted[-1], 3)
            out["overall_rate"] = round(n / admitted[-1], 1) if admitted[-1] > 0 else None
            lo, hi = admitted[int(0.1 * (n - 1))], admitted[int(0.9 * (n - 1))]
            out["sustained_rate"] = (
                round((int(0.9 * (n - 1)) - int(0.1 * (n - 1))) / (hi - lo), 1) if hi > lo else None
            )
            # the rate once the fit-at-once wave is over: admissions that waited for a release
            waited = sorted(t.admitted - t0 for t in self.tracks if t.admitted and not t.fits)
            if len(waited) > 10:
                a, b = waited[int(0.1 * (len(waited) - 1))], waited[int(0.9 * (len(waited) - 1))]
                span = int(0.9 * (len(waited) - 1)) - int(0.1 * (len(waited) - 1))
                out["steady_rate"] = round(span / (b - a), 1) if b > a else None
        if finished:
            out["all_finished_s"] = round(finished[-1], 3) if len(finished) == self.cfg.jobs else None

        out["latency_fit"] = _pcts(fit_lat)
        out["latency_waited"] = _pcts(wait_lat)
        out["latency_all"] = _pcts(all_lat)
        out["latency_create_to_unit"] = _pcts(unit_lat)
        out["latency_fit_create_to_resumed"] = _pcts(fit_resume)
        out["latency_dequeued_to_resumed"] = _pcts(resume_lag)
        by_priority: dict[str, Any] = {}
        for prio, _ in PRIORITIES:
            values = [t.admitted - t.sent for t in self.tracks if t.priority == prio and t.admitted]
            by_priority[str(prio)] = _pcts(values)
        out["latency_by_priority"] = by_priority
        out["slot_refill"] = self.slot_refill()
        out["waiting_units"] = self.waiting_units()
        out["timeline"] = {
            "admitted": _downsample(admitted),
            "created": _downsample(created),
            "finished": _downsample(finished),
        }
        return out

    def slot_refill(self) -> dict[str, Any]:
        """For each finish the runner wrote (from when its write returned), the time until the next
        admission into the same quota seen by the watch. Per quota, in time order, each finish is
        paired with the earliest admission after it that no earlier finish took: one admission
        fills one freed slot. Admissions with no finish before them (the first wave) and
        finishes with no admission after them (nothing left waiting) are not paired."""
        gaps: list[float] = []
        unpaired = 0
        for q in range(self.cfg.quotas):
            finishes = sorted(t.finish_done for t in self.tracks if t.quota == q and t.finish_done)
            admissions = sorted(t.admitted for t in self.tracks if t.quota == q and t.admitted)
            a = 0
            for f in finishes:
                while a < len(admissions) and admissions[a] <= f:
                    a += 1
                if a == len(admissions):
                    unpaired += 1
                    continue
                gaps.append(admissions[a] - f)
                a += 1
        return {**_pcts(gaps), "finishes_unpaired": unpaired}

    def waiting_units(self) -> dict[str, Any]:
        """Status writes before admission and event writes, per unit that had to wait (its quota was
        full when its Job was created) and per unit that fit at once (see the class doc)."""
        out: dict[str, Any] = {
            "events_watched": self.cfg.watch_events,
            "event_writes_by_source": dict(self.event_writes.most_common()),
        }
        for label, fits in (("waited", False), ("fit", True)):
            group = [t for t in self.tracks if t.fits == fits and t.admitted]
            writes = [t.status_writes_before_admission for t in group]
            events = [sum((t.events or Counter()).values()) for t in group]
            by_reason: Counter[str] = Counter()
            for t in group:
                by_reason.update(t.events or Counter())
            n = len(group) or 1
            out[label] = {
                "units": len(group),
                "status_writes_before_admission": {
                    "mean": round(sum(writes) / n, 3),
                    "max": max(writes, default=0),
                    "histogram": dict(sorted(Counter(writes).items())),
                },
                "events": {
                    "mean": round(sum(events) / n, 3),
                    "max": max(events, default=0),
                    "histogram": dict(sorted(Counter(events).items())),
                    "mean_by_reason": {k: round(v / n, 3) for k, v in by_reason.most_common()},
                },
            }
        return out


def _pcts(values: list[float]) -> dict[str, float | int | None]:
    return {
        "count": len(values),
        "p50_s": _round(percentile(values, 0.5)),
        "p90_s": _round(percentile(values, 0.9)),
        "p99_s": _round(percentile(values, 0.99)),
        "max_s": _round(max(values) if values else None),
    }


def _round(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def _downsample(times: list[float], points: int = 400) -> list[list[float]]:
    """(t, count) pairs of a cumulative curve, at most ``points`` of them."""
    if not times:
        return []
    step = max(1, len(times) // points)
    out = [[round(times[i], 3), i + 1] for i in range(0, len(times), step)]
    if out[-1][1] != len(times):
        out.append([round(times[-1], 3), len(times)])
    return out


# --- one run ---------------------------------------------------------------------------------------


async def run_probe(
    cfg: RunConfig, client: kube.Kube, runner_class: type[Runner] | None = None
) -> dict[str, Any]:
    """Latency of the admission path on a quiet system: ``probe_jobs`` paced at ``probe_rate``/s
    into a quota with room for all of them, before the load (each fits at once). ``runner_class``
    lets another system's run (bench/bench_kueue.py) probe its own units the same way."""
    runtime = cfg.runtime if cfg.mode == "full" else min(cfg.runtime, 1.0)  # kwok's is cluster-wide
    probe_cfg = dataclasses.replace(
        cfg,
        jobs=cfg.probe_jobs,
        quotas=1,
        fit_fraction=1.0,
        slots_per_quota=0,
        runtime_s=runtime,
        runtime_jitter=0.0,
        watch_events=False,
        timeout_s=0.0,
    )
    runner = (runner_class or Runner)(
        probe_cfg, client, prefix="probe", quota_names=[PROBE_QUOTA], pace=cfg.probe_rate
    )
    await runner.run(time.monotonic() + 60 + cfg.probe_jobs / cfg.probe_rate + 2 * runtime)
    summary = runner.summary()
    keep = ("admitted", "latency_fit", "latency_create_to_unit", "latency_fit_create_to_resumed")
    return {"jobs": cfg.probe_jobs, "rate": cfg.probe_rate, **{k: summary[k] for k in keep}}


def component_cpu(components: list[Any]) -> dict[str, float]:
    return {c.name: proc_cpu_s(c.process.pid) for c in components if c.alive()}


def peak_rss(components: list[Any]) -> dict[str, float]:
    """``VmHWM`` of every process, in MiB: the apiserver's and etcd's grow with what is watched."""
    return {c.name: round(proc_mem_mib(c.process.pid).get("VmHWM", 0.0), 1) for c in components if c.alive()}


async def idle_cpu(components: list[Any], seconds: float) -> dict[str, float]:
    """Cores each process uses with nothing to do (its informers, leases, timers): a system that
    admits more slowly carries this cost over more seconds per job, so comparisons of CPU per job
    between systems of different rates subtract it (bench/bench_kueue.py)."""
    if seconds <= 0:
        return {}
    cpu0 = component_cpu(components)
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    cpu1 = component_cpu(components)
    elapsed = time.monotonic() - t0
    return {k: round((cpu1[k] - cpu0.get(k, 0.0)) / elapsed, 4) for k in cpu1}


async def create_namespace(client: kube.Kube, name: str) -> None:
    with contextlib.suppress(kube.Conflict):
        await client.create(
            kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )


async def setup_quotas(client: kube.Kube, cfg: RunConfig) -> None:
    await create_namespace(client, NS)
    quotas = [(quota_name(q), slots) for q, slots in enumerate(cfg.slots)]
    if cfg.probe_jobs:
        quotas.append((PROBE_QUOTA, cfg.probe_jobs))
    for name, slots in quotas:
        cpu = f"{slots * CPU_PER_JOB_MILLI}m"
        body = {
            "apiVersion": names.QUOTA_API_VERSION,
            "kind": "ElasticQuota",
            "metadata": {"name": name},
            "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
        }
        await client.create(QUOTAS, body, namespace=NS)


async def wait_queues(client: kube.Kube, cfg: RunConfig, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    wanted = {quota_name(q) for q in range(cfg.quotas)} | ({PROBE_QUOTA} if cfg.probe_jobs else set())
    from testenv import system  # the system runs installed where the harness installs it

    while time.monotonic() < deadline:
        items, _ = await client.list(QUEUES, namespace=system.NAMESPACE)
        have = {str(i["metadata"]["name"]) for i in items}
        if wanted <= have:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"Queues not created from the quotas within {timeout}s")


async def until_quiet(
    count: Callable[[], float], timeout: float, quiet: float, interval: float = 0.25
) -> bool:
    """Wait (bounded) until ``count`` (a blocking scrape of a write counter) has not moved for
    ``quiet`` seconds; False if the deadline came first."""
    deadline = time.monotonic() + timeout
    last = -1.0
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        writes = await asyncio.to_thread(count)
        if writes != last:
            last, last_change = writes, time.monotonic()
        elif time.monotonic() - last_change >= quiet:
            return True
        await asyncio.sleep(interval)
    return False


async def settle(port: int, timeout: float = 15.0, quiet: float = 1.5) -> bool:
    """Wait (bounded) until the reconciler has written nothing for ``quiet`` seconds; False if the
    deadline came first."""
    return await until_quiet(lambda: writes_of(diff(scrape_reconciler(port), Counter())), timeout, quiet)


def setup_settle_seconds(quotas: int) -> float:
    """How long the set-up may take to go quiet before the idle window: each quota costs a Queue
    and its first figures (a few writes), so 1,000 quotas took more than the flat 10 s used before
    (session 7: the idle window then caught the set-up's tail)."""
    return 10.0 + 0.06 * quotas


def versions(cluster: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    with contextlib.suppress(Exception):
        out["kube"] = json.loads(cluster.request("GET", "/version"))["gitVersion"]
    with (
        contextlib.suppress(Exception),
        urllib.request.urlopen(f"{cluster.etcd_url}/version", timeout=5) as resp,
    ):
        out["etcd"] = json.loads(resp.read())["etcdserver"]
    return out


def make_cluster(cfg: RunConfig, workdir: pathlib.Path) -> tuple[Any, int]:
    """The control plane of a run (not started) and its number of kwok nodes: comparable mode is
    etcd + kube-apiserver; full mode adds the controller-manager, the scheduler and kwok nodes
    sized so that every admitted pod fits, whose pods run for the run time. Shared with
    bench/bench_kueue.py, whose Kueue runs use the same control plane."""
    from testenv.cluster import LocalCluster

    nodes = 0
    if cfg.mode == "full":
        nodes = math.ceil(sum(cfg.slots) * 1.2 / 100) + 1  # 110 pods per node; room to spare
    cluster = LocalCluster(
        profile="e2e" if cfg.mode == "full" else "integration",
        workdir=workdir / "cp",
        nodes=nodes or 1,
        node_cpu="64",
        node_memory="256Gi",
        pod_duration_s=cfg.runtime,
    )
    return cluster, nodes


def run_once(cfg: RunConfig) -> dict[str, Any]:
    from testenv import system

    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"kq-bench-{cfg.tag}-"))
    total_slots = sum(cfg.slots)
    cluster, nodes = make_cluster(cfg, workdir)
    print(
        f"== {cfg.tag}: {cfg.jobs} jobs over {cfg.quotas} quotas, {total_slots} slots "
        f"({cfg.fit_fraction:.0%}), runtime {cfg.runtime}s (quota bound {total_slots / cfg.runtime:.0f}/s)"
        + (f", {nodes} kwok nodes" if nodes else ""),
        flush=True,
    )
    started = time.monotonic()
    cluster.start()
    reconciler = None
    webhook = None
    profile_out = str(RESULTS / f"admission-{cfg.tag}.prof") if cfg.profile else ""
    try:
        system.install_crds(cluster)
        logdir = workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        webhook, _ = system.start_webhook(cluster, logdir=logdir)
        system.install_rbac(cluster)  # the ceiling writes as the reconciler's ServiceAccount
        result: dict[str, Any] = {
            "config": {
                **{k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("keep_logs",)},
                "runtime_s": cfg.runtime,
                "slots_total": total_slots,
                "quota_bound_rate": round(total_slots / cfg.runtime, 1),
                "cpu_per_job": f"{CPU_PER_JOB_MILLI}m",
                "priorities": PRIORITIES,
                "kwok_nodes": nodes,
            },
            "machine": machine(),
            "versions": versions(cluster),
            "cluster_start_s": round(time.monotonic() - started, 1),
        }
        print(f"  control plane up in {result['cluster_start_s']}s; ceiling ...", flush=True)
        ceiling_before = asyncio.run(ceiling(cluster, cfg.ceiling_s))
        print(f"  ceiling before: {ceiling_before['writes_per_s']} writes/s", flush=True)

        async def prepare() -> None:
            client = await kube.Kube.connect(kubeconfig=str(cluster.kubeconfig), qps=0, burst=1)
            try:
                await setup_quotas(client, cfg)
            finally:
                await client.close()

        asyncio.run(prepare())
        reconciler = start_reconciler(cluster, logdir, cfg, profile_out)

        async def load() -> dict[str, Any]:
            assert reconciler is not None  # started above; stopped only after the load
            client = await runner_client(cluster)
            try:
                await wait_queues(client, cfg)
                settled = await settle(
                    reconciler.ports["metrics"], timeout=setup_settle_seconds(cfg.quotas), quiet=1.0
                )
                idle = await idle_cpu([*cluster.components, webhook, reconciler], cfg.idle_s)
                probe: dict[str, Any] = {}
                if cfg.probe_jobs:
                    probe = await run_probe(cfg, client)
                    f = probe["latency_fit"]
                    print(
                        f"  probe: {cfg.probe_jobs} jobs at {cfg.probe_rate}/s, create->Dequeued"
                        f" p50 {f['p50_s']}s p99 {f['p99_s']}s",
                        flush=True,
                    )
                    await settle(reconciler.ports["metrics"], timeout=10, quiet=1.0)
                procs = [*cluster.components, webhook, reconciler]
                api0 = await asyncio.to_thread(scrape_apiserver, cluster)
                rec0 = await asyncio.to_thread(scrape_reconciler, reconciler.ports["metrics"])
                cpu0 = component_cpu(procs)
                self_cpu0 = time.process_time()
                machine0 = machine_cpu()
                load0 = loadavg()
                requests0 = Counter(client.requests)
                runner = Runner(cfg, client)
                wall0 = time.monotonic()
                await runner.run(time.monotonic() + cfg.deadline_s)
                load_s = time.monotonic() - wall0
                cpu_load = component_cpu(procs)
                self_cpu_load = time.process_time() - self_cpu0
                machine1 = machine_cpu()
                if cfg.watch_events:
                    await runner.count_events()
                await settle(reconciler.ports["metrics"])
                cpu1 = component_cpu(procs)
                api1 = await asyncio.to_thread(scrape_apiserver, cluster)
                rec1 = await asyncio.to_thread(scrape_reconciler, reconciler.ports["metrics"])
                mem = proc_mem_mib(reconciler.process.pid)
                summary = runner.summary()
                summary["load_seconds"] = round(load_s, 3)
                summary["cpu_s"] = {k: round(cpu1[k] - cpu0.get(k, 0.0), 2) for k in cpu1}
                summary["cpu_s_during_load"] = {k: round(cpu_load[k] - cpu0.get(k, 0.0), 2) for k in cpu_load}
                summary["cpu_s_during_load"]["bench-runner"] = round(self_cpu_load, 2)
                ours = sum(summary["cpu_s_during_load"].values())
                busy = machine1["busy"] - machine0["busy"]
                summary["machine_during_load"] = {
                    "loadavg_before": load0,
                    "loadavg_after": loadavg(),
                    "busy_cores": round(busy / load_s, 2),
                    "our_cores": round(ours / load_s, 2),
                    "other_cores": round(max(0.0, busy - ours) / load_s, 2),
                    "steal_cores": round((machine1["steal"] - machine0["steal"]) / load_s, 2),
                }
                summary["reconciler_rss_mib"] = {k: round(v, 1) for k, v in mem.items()}
                summary["webhook_rss_mib"] = {
                    k: round(v, 1) for k, v in proc_mem_mib(webhook.process.pid).items()
                }
                summary["peak_rss_mib"] = peak_rss(procs)
                summary["reconciler_requests"] = diff(rec1, rec0)
                summary["apiserver_requests"] = diff(api1, api0)
                # the load's own requests: the probe's creates and finishes came before the scrape
                summary["runner_requests"] = dict(client.requests - requests0)
                summary["probe"] = probe
                summary["idle_cpu_cores"] = idle
                summary["idle_after_quiet_setup"] = settled  # False: the idle figures include set-up
                return summary
            finally:
                await client.close()

        summary = asyncio.run(load())
        result["run"] = summary
        reconciler.stop(timeout=30)
        if profile_out:
            result["profile"] = profile_out
        reconciler_log = reconciler.tail(5)
        reconciler = None
        ceiling_after = asyncio.run(ceiling(cluster, cfg.ceiling_s))
        print(f"  ceiling after: {ceiling_after['writes_per_s']} writes/s", flush=True)
        result["ceiling"] = {
            "before": ceiling_before,
            "after": ceiling_after,
            "writes_per_s": round((ceiling_before["writes_per_s"] + ceiling_after["writes_per_s"]) / 2, 1),
        }
        result["figures"] = figures(result)
        result["reconciler_log_tail"] = reconciler_log
        return result
    except BaseException:
        report_failure(cluster, (reconciler, webhook))
        raise
    finally:
        tear_down(cluster, (reconciler, webhook), workdir, keep_logs=cfg.keep_logs)


def figures(result: dict[str, Any]) -> dict[str, Any]:
    run = result["run"]
    cfg = result["config"]
    admitted = run["admitted"] or 1
    rec = run["reconciler_requests"]
    writes = writes_of(rec)
    by_resource: Counter[str] = Counter()
    for key, value in rec.items():
        verb, resource, sub = key.split("|")
        if verb in WRITE_VERBS:
            by_resource[f"{verb} {resource}{'/' + sub if sub else ''}"] += value
    api = run["apiserver_requests"]
    api_writes = writes_of(api)
    runner_writes = sum(v for k, v in run["runner_requests"].items() if k in WRITE_VERBS)
    sustained = run.get("sustained_rate") or 0.0
    cpu_ms = {k: round(v / admitted * 1e3, 2) for k, v in run["cpu_s_during_load"].items()}
    total_ms = sum(cpu_ms.values())
    nproc = result["machine"]["nproc"] or 1
    raw = result["ceiling"]["writes_per_s"]
    wpa = writes / admitted
    out = {
        "admitted": run["admitted"],
        "all_admitted_s": run.get("all_admitted_s"),
        "overall_rate": run.get("overall_rate"),
        "sustained_rate": run.get("sustained_rate"),
        "steady_rate": run.get("steady_rate"),
        "fit_p50_s": run["latency_fit"]["p50_s"],
        "fit_p99_s": run["latency_fit"]["p99_s"],
        "fit_count": run["latency_fit"]["count"],
        "probe_p50_s": (run.get("probe") or {}).get("latency_fit", {}).get("p50_s"),
        "probe_p99_s": (run.get("probe") or {}).get("latency_fit", {}).get("p99_s"),
        "writes_per_admission": round(wpa, 2),
        "writes_per_admission_by_kind": {k: round(v / admitted, 3) for k, v in by_resource.most_common()},
        "requests_per_admission": round(sum(rec.values()) / admitted, 2),
        "apiserver_writes_per_admission_excluding_runner": round((api_writes - runner_writes) / admitted, 2),
        "raw_writes_per_s": raw,
        "efficiency": round(sustained * wpa / raw, 3) if raw else None,
        "apiserver_write_share": round(api_writes / run["load_seconds"] / raw, 3) if raw else None,
        "reconciler_cpu_s": run["cpu_s"].get("reconciler"),
        "reconciler_cpu_ms_per_admission": round(run["cpu_s"].get("reconciler", 0) / admitted * 1e3, 2),
        "reconciler_peak_rss_mib": run["reconciler_rss_mib"].get("VmHWM"),
        "cpu_ms_per_admission": cpu_ms,
        "apiserver_cpu_ms_per_write": round(
            run["cpu_s_during_load"].get("kube-apiserver", 0) * 1e3 / max(1.0, api_writes), 2
        ),
        # jobs/s this machine would sustain if these processes had all its cores and CPU were the
        # only limit: an estimate that does not depend on what else ran during the measurement
        "cpu_bound_rate_estimate": round(nproc * 1e3 / total_ms, 1) if total_ms else None,
        "quota_bound_rate": cfg["quota_bound_rate"],
    }
    return out


def print_row(result: dict[str, Any]) -> None:
    f = result["figures"]
    cfg = result["config"]
    cpu = result["run"]["cpu_s_during_load"]
    load = result["run"]["load_seconds"] or 1
    busy = ", ".join(f"{k} {v / load:.2f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
    print(
        f"  {cfg['mode']:>10} {cfg['jobs']:>6} x {cfg['quotas']:<4}"
        f" all admitted {f['all_admitted_s']}s | overall {f['overall_rate']}/s"
        f" sustained {f['sustained_rate']}/s"
        f" steady {f['steady_rate']}/s | fit p50 {f['fit_p50_s']}s p99 {f['fit_p99_s']}s (n={f['fit_count']})"
        f" | writes/adm {f['writes_per_admission']} | raw {f['raw_writes_per_s']}/s eff {f['efficiency']}"
        f" | rec cpu {f['reconciler_cpu_s']}s rss {f['reconciler_peak_rss_mib']}MiB"
    )
    print(f"    writes/admission by kind: {f['writes_per_admission_by_kind']}")
    print(
        f"    CPU ms per admission: {f['cpu_ms_per_admission']} -> CPU-bound estimate"
        f" {f['cpu_bound_rate_estimate']}/s on {result['machine']['nproc']} cores;"
        f" apiserver {f['apiserver_cpu_ms_per_write']} ms per write"
    )
    m = result["run"]["machine_during_load"]
    print(
        f"    cores busy during load: {busy}; other processes on the machine {m['other_cores']},"
        f" steal {m['steal_cores']}, loadavg {m['loadavg_before']}"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-reconciler":
        as_reconciler(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, help="jobs per run (default: the matrix)")
    parser.add_argument("--quotas", type=int, default=10, help="ElasticQuotas (default %(default)s)")
    parser.add_argument(
        "--runs",
        default="",
        help="several runs, e.g. comparable:1000x10,full:1000x10,comparable:15000x10:600 (deadline)",
    )
    parser.add_argument("--mode", choices=("comparable", "full"), default="comparable")
    parser.add_argument(
        "--quick", action="store_true", help="one small run (300 jobs, 10 quotas), < 2 minutes"
    )
    parser.add_argument("--fit-fraction", type=float, default=0.2, help="share of each quota's jobs it holds")
    parser.add_argument(
        "--quota-rate", type=float, default=100.0, help="admissions/s the quotas and run times allow"
    )
    parser.add_argument("--runtime", type=float, default=None, help="simulated run time (s); default derived")
    parser.add_argument("--create-concurrency", type=int, default=16)
    parser.add_argument("--ceiling-seconds", type=float, default=5.0)
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="deadline of the load (s); default derived"
    )
    parser.add_argument(
        "--profile", choices=("", "cprofile"), default="", help="run the reconciler under cProfile"
    )
    parser.add_argument("--probe-jobs", type=int, default=40, help="latency probe size (0: none)")
    parser.add_argument("--probe-rate", type=float, default=5.0, help="latency probe jobs per second")
    parser.add_argument("--keep-logs", action="store_true", help="keep the run's directory and print it")
    parser.add_argument(
        "--reconciler-arg",
        action="append",
        default=[],
        help="extra reconciler flag, e.g. --reconciler-arg=--qps=500 (repeatable)",
    )
    args = parser.parse_args()
    common = {
        "fit_fraction": args.fit_fraction,
        "quota_rate": args.quota_rate,
        "runtime_s": args.runtime,
        "create_concurrency": args.create_concurrency,
        "ceiling_s": args.ceiling_seconds,
        "timeout_s": args.timeout,
        "profile": args.profile,
        "keep_logs": args.keep_logs,
        "reconciler_args": tuple(args.reconciler_arg),
        "probe_jobs": args.probe_jobs,
        "probe_rate": args.probe_rate,
    }
    if args.quick:
        quick = {"ceiling_s": min(args.ceiling_seconds, 3.0), "probe_jobs": min(20, args.probe_jobs)}
        size = {"jobs": args.jobs or 300, "quotas": args.quotas}
        runs = [RunConfig(mode=args.mode, quick=True, **size, **{**common, **quick})]
    elif args.runs:
        runs = []
        for spec in args.runs.split(","):
            mode, _, rest = spec.partition(":")
            size, _, timeout = rest.partition(":")
            n, _, q = size.partition("x")
            extra = {"timeout_s": float(timeout)} if timeout else {}
            runs.append(RunConfig(mode=mode, jobs=int(n), quotas=int(q), **{**common, **extra}))
    elif args.jobs:
        runs = [RunConfig(mode=args.mode, jobs=args.jobs, quotas=args.quotas, **common)]
    else:
        runs = [
            RunConfig(mode=m, jobs=n, quotas=q, **{**common, "timeout_s": args.timeout or t})
            for m, n, q, t in MATRIX
        ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = []
    for cfg in runs:
        t0 = time.monotonic()
        result = run_once(cfg)
        result["wall_s"] = round(time.monotonic() - t0, 1)
        out = RESULTS / f"admission-{cfg.tag}.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print_row(result)
        print(f"  ({result['wall_s']}s) written to {out.relative_to(ROOT)}", flush=True)
        results.append(result)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        main()
