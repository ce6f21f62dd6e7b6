"""Node pools under load (docs/pools.md): what routing through pools costs the admission rate, and
whether an admitted job can still end up unschedulable.

Run: ``python bench/bench_pools.py --jobs 1000 --quotas 9`` (default order ``one,three,fallback,
fallback,three,one``: interleaved, so a drift in what else the machine runs hits every variant
alike). Writes ``bench/results/pools-<jobs>x<quotas>[<suffix>].json`` after every run and prints the ratios.

**Admission rate** (``--order``): bench_admission's Kueue-comparable mode, as bench_kueue.py
measures ours: etcd + kube-apiserver, our webhook and our counted reconciler, no pods (the runner
finishes each Job ``runtime`` seconds after its unit is admitted and the Job resumed). The same
jobs in every variant (``bench_admission.Runner``: same names, same priorities, job ``i`` in quota
``i mod Q``), each one pod asking for 100m cpu and 1 ``nvidia.com/gpu``; every team quota holds the
same GPUs (``--fit-fraction`` of its jobs, so most jobs wait), and the pools together hold exactly
the team quotas' total:

* ``one``: one pool of all the GPUs; every team quota is a child of its root;
* ``three``: pools h100, a100 and l4 of a third of the GPUs each; team quota ``q`` is a child of
  pool ``q mod 3``'s root (the tree a job is labelled into decides its pool, one route);
* ``fallback``: the same three pools; team quota ``q`` is outside every tree with
  ``koord-queue/pool-quotas`` listing one quota per pool (h100, a100, l4 in that order, each as
  large as the team quota: the team's own ``max`` is the cap across pools, each pool's root the
  limit inside it), so every admission tries routes in turn;
* ``none`` (not in the default order): no pool at all, every team quota a root of its own, as
  before pools: what the quota trees themselves cost, apart from pools.

The pools are ElasticQuotaProfiles over Node objects that never run anything (no kwok here); the
reconciler keeps their root quotas. Figures per run: all admitted (s), overall and sustained
admissions/s, fit-at-once p50/p99 create→Dequeued, the reconciler's CPU ms and writes per
admission, every process's CPU during the load. Ratios: each variant's mean over the mean of ``one``.

**Mixed jobs on three pools** (``--mixed N``, 0 to skip): bench_admission's full mode: +
kube-controller-manager, kube-scheduler and kwok GPU nodes (8 GPUs each; h100 tainted), pods
created by the Job controller, ungated by the reconciler, bound by the scheduler, run for the run
time by kwok. N one-pod jobs: 40% labelled with a team quota inside a pool's tree, 30% with a
fallback quota, 10% fallback with a nodeSelector asking for A100s (h100 skipped), 10% fallback with
``koord-queue/pools: a100``, 10% fallback with ``koord-queue/pools: l4, a100``. A watch of the pods
counts, per pod, release (the admission gate gone) to binding: **unschedulable** = released and not
bound within 10 s (must be 0); also pods bound outside the pool their node selector names, and
released pods without a pool node selector.

Every wait has a deadline; all traffic is loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import signal
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Final

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_admission as ba
from bench_admission import NS, ROOT, RunConfig

from koord_queue.shared import kube
from koord_queue.shared.api import names
from testenv import pools

VARIANTS: Final = ("none", "one", "three", "fallback")
THREE: Final = ("h100", "a100", "l4")
GPUS_PER_NODE: Final = 8
BIND_WITHIN_S: Final = 10.0
#: the mixed run's shares of job shapes, by ``i mod 10``
MIXED_SHAPES: Final = (
    "direct",
    "direct",
    "direct",
    "direct",
    "fallback",
    "fallback",
    "fallback",
    "selector-a100",
    "pools-a100",
    "pools-l4-a100",
)


# --- the layout of a run: pools and quotas ------------------------------------------------------------


def split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def quota(name: str, gpus: int, *, parent: str = "", routes: tuple[str, ...] = ()) -> kube.Obj:
    room = {pools.GPU: str(gpus)}
    meta: dict[str, Any] = {"name": name, "labels": {names.QUOTA_PARENT_LABEL: parent} if parent else {}}
    if routes:
        meta["annotations"] = {names.POOL_QUOTAS_ANNOTATION: ", ".join(routes)}
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": meta,
        "spec": {"min": room, "max": room},
    }


def layout(variant: str, slots: list[int], *, one_node: bool) -> tuple[list[pools.Pool], list[kube.Obj]]:
    """The pools and the quotas of a variant (``none``: no pool, flat quotas). Team quota ``q`` is
    ``bench_admission.quota_name(q)`` with ``slots[q]`` GPUs. ``one_node``: each pool is one node
    holding all its GPUs (no pods run, so only the total counts); else nodes of ``GPUS_PER_NODE``,
    rounded up."""
    total = sum(slots)
    if variant == "none":
        return [], [quota(ba.quota_name(q), gpus) for q, gpus in enumerate(slots)]
    if variant == "one":
        sizes = {"gpu": total}
        home = ["gpu"] * len(slots)
    else:
        by_pool = [sum(s for q, s in enumerate(slots) if q % 3 == p) for p in range(3)]
        if variant == "fallback":
            by_pool = split(total, 3)
        sizes = dict(zip(THREE, by_pool, strict=True))
        home = [THREE[q % 3] for q in range(len(slots))]
    made = []
    for name, gpus in sizes.items():
        tainted = name == "h100"
        if one_node:
            made.append(pools.Pool(name, 1, max(1, gpus), tainted=tainted))
        else:
            nodes = max(1, math.ceil(gpus / GPUS_PER_NODE))
            made.append(pools.Pool(name, nodes, GPUS_PER_NODE, tainted=tainted))
    quotas: list[kube.Obj] = []
    for q, gpus in enumerate(slots):
        name = ba.quota_name(q)
        if variant != "fallback":
            quotas.append(quota(name, gpus, parent=f"{home[q]}-root"))
            continue
        routes = tuple(f"{name}-{p}" for p in THREE)
        quotas += [quota(r, gpus, parent=f"{p}-root") for r, p in zip(routes, THREE, strict=True)]
        quotas.append(quota(name, gpus, routes=routes))
    return made, quotas


def mixed_layout(cfg: RunConfig) -> tuple[list[pools.Pool], list[kube.Obj]]:
    """The mixed run: three pools of whole nodes; quota ``q`` (of ``cfg.quotas``, a multiple of 2)
    is a team quota inside pool ``q mod 3`` for even ``q`` and a fallback quota (routes h100, a100,
    l4) for odd ``q``; each holds ``cfg.slots[q]`` GPUs."""
    slots = cfg.slots
    per_pool = [0, 0, 0]
    quotas: list[kube.Obj] = []
    for q, gpus in enumerate(slots):
        name = ba.quota_name(q)
        if q % 2 == 0:
            per_pool[(q // 2) % 3] += gpus
            quotas.append(quota(name, gpus, parent=f"{THREE[(q // 2) % 3]}-root"))
            continue
        routes = tuple(f"{name}-{p}" for p in THREE)
        quotas += [quota(r, gpus, parent=f"{p}-root") for r, p in zip(routes, THREE, strict=True)]
        quotas.append(quota(name, gpus, routes=routes))
        for p in range(3):
            per_pool[p] += math.ceil(gpus / 3)
    made = [
        pools.Pool(p, max(1, math.ceil(n / GPUS_PER_NODE)), GPUS_PER_NODE, tainted=p == "h100")
        for p, n in zip(THREE, per_pool, strict=True)
    ]
    return made, quotas


# --- the runner ------------------------------------------------------------------------------------


class PoolRunner(ba.Runner):
    """bench_admission's runner with GPU jobs; in the mixed run, each job shaped by its index."""

    mixed = False

    def make_job(self, name: str, quota_name: str, priority: int) -> kube.Obj:
        body = ba.job_body(name, quota_name, priority)
        spec = body["spec"]["template"]["spec"]
        spec["containers"][0]["resources"] = {
            "requests": {"cpu": f"{ba.CPU_PER_JOB_MILLI}m", pools.GPU: "1"},
            "limits": {pools.GPU: "1"},
        }
        i = self.index(name)
        if not self.mixed or i is None:
            return body
        shape = MIXED_SHAPES[i % len(MIXED_SHAPES)]
        if shape == "selector-a100":
            spec["nodeSelector"] = {pools.PRODUCT_LABEL: pools.PRODUCTS["a100"]}
        elif shape == "pools-a100":
            body["metadata"]["annotations"][names.POOLS_ANNOTATION] = "a100"
        elif shape == "pools-l4-a100":
            body["metadata"]["annotations"][names.POOLS_ANNOTATION] = "l4, a100"
        return body


def mixed_quota_of(i: int, quotas: int) -> int:
    """The mixed run's quota of job ``i``: a team quota (even) for the ``direct`` shape, a
    fallback quota (odd) for the others, round robin within each kind."""
    shape = MIXED_SHAPES[i % len(MIXED_SHAPES)]
    evens, odds = list(range(0, quotas, 2)), list(range(1, quotas, 2))
    kind = evens if shape == "direct" else odds
    return kind[(i // len(MIXED_SHAPES)) % len(kind)]


@dataclasses.dataclass
class PodWatch:
    """Release and binding of every pod of the load, stamped as the watch delivered them."""

    node_pool: dict[str, str]
    released: dict[str, float] = dataclasses.field(default_factory=dict)
    bound: dict[str, float] = dataclasses.field(default_factory=dict)
    selector_pool: dict[str, str] = dataclasses.field(default_factory=dict)
    node: dict[str, str] = dataclasses.field(default_factory=dict)

    def handle(self, obj: kube.Obj) -> None:
        name = str(obj["metadata"]["name"])
        spec = obj.get("spec") or {}
        gates = [g.get("name") for g in spec.get("schedulingGates") or []]
        now = time.monotonic()
        if names.ADMISSION_GATE not in gates and name not in self.released:
            self.released[name] = now
            self.selector_pool[name] = str((spec.get("nodeSelector") or {}).get(pools.POOL_LABEL, ""))
        if spec.get("nodeName") and name not in self.bound:
            self.bound[name] = now
            self.node[name] = str(spec["nodeName"])

    def figures(self) -> dict[str, Any]:
        waits = [self.bound[p] - t for p, t in self.released.items() if p in self.bound]
        late = [p for p, t in self.released.items() if p in self.bound and self.bound[p] - t > BIND_WITHIN_S]
        never = [p for p in self.released if p not in self.bound]
        outside = [p for p, n in self.node.items() if self.node_pool.get(n) != self.selector_pool.get(p)]
        return {
            "pods_released": len(self.released),
            "pods_bound": len(self.bound),
            "unschedulable": len(late) + len(never),
            "bound_late": sorted(late)[:20],
            "never_bound": sorted(never)[:20],
            "bound_outside_pool": sorted(outside)[:20],
            "released_without_pool_selector": sum(1 for v in self.selector_pool.values() if not v),
            "release_to_bind": ba._pcts(waits),
            "bound_by_pool": dict(Counter(self.node_pool.get(n, "?") for n in self.node.values())),
        }


async def follow_pods(client: kube.Kube, watch: PodWatch, stop: asyncio.Event) -> None:
    items, rv = await client.list(kube.PODS, namespace=NS)
    for item in items:
        watch.handle(item)
    while not stop.is_set():
        try:
            async for kind, obj in client.watch(kube.PODS, namespace=NS, resource_version=rv):
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED"):
                    watch.handle(obj)
        except kube.Gone:
            items, rv = await client.list(kube.PODS, namespace=NS)
            for item in items:
                watch.handle(item)
        except kube.KubeError:
            await asyncio.sleep(0.2)


# --- one run -----------------------------------------------------------------------------------------


def make_cluster(cfg: RunConfig, workdir: pathlib.Path) -> Any:
    from testenv.cluster import LocalCluster

    return LocalCluster(
        profile="e2e" if cfg.mode == "full" else "integration",
        workdir=workdir / "cp",
        nodes=0,
        pod_duration_s=cfg.runtime,
    )


async def prepare(cluster: Any, cfg: RunConfig, made: list[pools.Pool], quotas: list[kube.Obj]) -> None:
    """Root quotas kept, team quotas created, a Queue for each: the load may start."""
    await asyncio.to_thread(pools.wait_roots, cluster, made, timeout=120.0)
    client = await kube.Kube.connect(kubeconfig=str(cluster.kubeconfig), qps=0, burst=1)
    try:
        await ba.create_namespace(client, NS)
        for body in quotas:
            await client.create(ba.QUOTAS, body, namespace=NS)
        await ba.wait_queues(client, cfg)
    finally:
        await client.close()


async def load(
    cluster: Any, cfg: RunConfig, procs: list[Any], mixed: bool, node_pool: dict[str, str]
) -> dict[str, Any]:
    reconciler = next(p for p in procs if p.name == "reconciler")
    client = await ba.runner_client(cluster)
    try:
        await ba.settle(reconciler.ports["metrics"], timeout=ba.setup_settle_seconds(cfg.quotas), quiet=1.0)
        rec0 = await asyncio.to_thread(ba.scrape_reconciler, reconciler.ports["metrics"])
        cpu0 = ba.component_cpu(procs)
        machine0, load0 = ba.machine_cpu(), ba.loadavg()
        runner = PoolRunner(cfg, client)
        runner.mixed = mixed
        if mixed:
            for i, track in enumerate(runner.tracks):
                track.quota = mixed_quota_of(i, cfg.quotas)
        watch = PodWatch(node_pool)
        stop = asyncio.Event()
        pods_task = asyncio.create_task(follow_pods(client, watch, stop)) if cfg.mode == "full" else None
        wall0 = time.monotonic()
        await runner.run(time.monotonic() + cfg.deadline_s)
        load_s = time.monotonic() - wall0
        cpu1 = ba.component_cpu(procs)
        machine1 = ba.machine_cpu()
        stop.set()
        if pods_task is not None:
            pods_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pods_task
        await ba.settle(reconciler.ports["metrics"])
        rec1 = await asyncio.to_thread(ba.scrape_reconciler, reconciler.ports["metrics"])
        summary = runner.summary()
        summary.pop("timeline", None)
        cpu = {k: round(cpu1[k] - cpu0.get(k, 0.0), 2) for k in cpu1}
        busy = machine1["busy"] - machine0["busy"]
        summary["load_seconds"] = round(load_s, 3)
        summary["cpu_s_during_load"] = cpu
        summary["machine_during_load"] = {
            "loadavg_before": load0,
            "busy_cores": round(busy / load_s, 2),
            "other_cores": round(max(0.0, busy - sum(cpu.values())) / load_s, 2),
        }
        summary["reconciler_requests"] = ba.diff(rec1, rec0)
        if cfg.mode == "full":
            summary["pods"] = watch.figures()
        return summary
    finally:
        await client.close()


def run_variant(cfg: RunConfig, variant: str) -> dict[str, Any]:
    """One control plane, one system, one load; torn down whatever happens."""
    from testenv import system

    mixed = variant == "mixed"
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"kq-bench-pools-{variant}-"))
    made, quotas = mixed_layout(cfg) if mixed else layout(variant, cfg.slots, one_node=cfg.mode != "full")
    cluster = make_cluster(cfg, workdir)
    print(
        f"== {variant}: {cfg.jobs} jobs, {cfg.quotas} quotas, {sum(cfg.slots)} GPU slots,"
        f" pools {[(p.name, p.nodes, p.gpus) for p in made]}, runtime {cfg.runtime}s",
        flush=True,
    )
    cluster.start()
    reconciler = webhook = None
    try:
        system.install_crds(cluster)
        logdir = workdir / "logs"
        logdir.mkdir(parents=True, exist_ok=True)
        webhook, _ = system.start_webhook(cluster, logdir=logdir)
        system.install_rbac(cluster)
        pods_per_node = str(GPUS_PER_NODE * 4)
        pools.create(cluster, made, cpu="64", memory="512Gi", pods=pods_per_node, kwok=cfg.mode == "full")
        reconciler = ba.start_reconciler(cluster, logdir, cfg, "")
        asyncio.run(prepare(cluster, cfg, made, quotas))
        node_pool = {n: p.name for p in made for n in p.node_names}
        procs = [*cluster.components, webhook, reconciler]
        summary = asyncio.run(load(cluster, cfg, procs, mixed, node_pool))
        return {
            "variant": variant,
            "config": {**dataclasses.asdict(cfg), "runtime_s": cfg.runtime, "slots_total": sum(cfg.slots)},
            "pools": [dataclasses.asdict(p) for p in made],
            "machine": ba.machine(),
            "run": summary,
        }
    except BaseException:
        ba.report_failure(cluster, (reconciler, webhook))
        raise
    finally:
        ba.tear_down(cluster, (reconciler, webhook), workdir, keep_logs=cfg.keep_logs)


# --- figures -----------------------------------------------------------------------------------------


def row(result: dict[str, Any]) -> dict[str, Any]:
    run = result["run"]
    admitted = run["admitted"] or 1
    writes = ba.writes_of(run["reconciler_requests"])
    cpu = run["cpu_s_during_load"]
    out = {
        "variant": result["variant"],
        "admitted": run["admitted"],
        "all_admitted_s": run.get("all_admitted_s"),
        "overall_rate": run.get("overall_rate"),
        "sustained_rate": run.get("sustained_rate"),
        "fit_p50_s": run["latency_fit"]["p50_s"],
        "fit_p99_s": run["latency_fit"]["p99_s"],
        "reconciler_cpu_ms_per_job": round(cpu.get("reconciler", 0.0) * 1e3 / admitted, 2),
        "apiserver_etcd_cpu_ms_per_job": round(
            (cpu.get("kube-apiserver", 0.0) + cpu.get("etcd", 0.0)) * 1e3 / admitted, 2
        ),
        "reconciler_writes_per_job": round(writes / admitted, 2),
        "other_cores": run["machine_during_load"]["other_cores"],
        "task_errors": run.get("task_errors"),
    }
    if "pods" in run:
        out["pods"] = {k: v for k, v in run["pods"].items() if k != "release_to_bind"}
        out["release_to_bind"] = run["pods"]["release_to_bind"]
    return out


RATIO_KEYS: Final = (
    "overall_rate",
    "sustained_rate",
    "fit_p50_s",
    "reconciler_cpu_ms_per_job",
    "apiserver_etcd_cpu_ms_per_job",
    "reconciler_writes_per_job",
)


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each variant's mean of each figure over the mean of ``one``."""

    def mean(variant: str, key: str) -> float | None:
        values = [r[key] for r in rows if r["variant"] == variant and r.get(key) is not None]
        return round(sum(values) / len(values), 3) if values else None

    out: dict[str, Any] = {}
    for key in RATIO_KEYS:
        base = mean("one", key)
        entry: dict[str, Any] = {"one": base}
        for variant in ("none", "three", "fallback"):
            value = mean(variant, key)
            entry[variant] = value
            entry[f"{variant}_over_one"] = round(value / base, 3) if value is not None and base else None
        out[key] = entry
    return out


def print_row(r: dict[str, Any]) -> None:
    print(
        f"  {r['variant']:>8}: all admitted {r['all_admitted_s']}s, overall {r['overall_rate']}/s,"
        f" sustained {r['sustained_rate']}/s | fit p50 {r['fit_p50_s']}s p99 {r['fit_p99_s']}s"
        f" | reconciler {r['reconciler_cpu_ms_per_job']} ms/job, {r['reconciler_writes_per_job']} writes/job"
        f" | apiserver+etcd {r['apiserver_etcd_cpu_ms_per_job']} ms/job"
        f" | other load {r['other_cores']} cores",
        flush=True,
    )
    if "pods" in r:
        print(f"           pods: {r['pods']}; release->bind {r['release_to_bind']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--quotas", type=int, default=9, help="team quotas (default %(default)s)")
    parser.add_argument("--order", default="one,three,fallback,fallback,three,one", help="the runs, in order")
    parser.add_argument("--fit-fraction", type=float, default=0.2, help="share of each quota's jobs it holds")
    parser.add_argument("--mixed", type=int, default=1000, help="jobs of the mixed full-mode run (0: none)")
    parser.add_argument("--mixed-quotas", type=int, default=12, help="quotas of the mixed run (even)")
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="deadline of each load (s); default derived"
    )
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--suffix", default="", help="appended to the results file's name, e.g. --suffix=-b")
    args = parser.parse_args()
    order = [s.strip() for s in args.order.split(",") if s.strip()]
    if set(order) - set(VARIANTS):
        parser.error(f"--order takes {', '.join(VARIANTS)}")
    if args.mixed_quotas % 2:
        parser.error("--mixed-quotas must be even: team and fallback quotas alternate")
    common = {"probe_jobs": 0, "fit_fraction": args.fit_fraction, "keep_logs": args.keep_logs}
    cfg = RunConfig(mode="comparable", jobs=args.jobs, quotas=args.quotas, **common)
    cfg = dataclasses.replace(cfg, timeout_s=args.timeout or round(60 + args.jobs / 4 + 2 * cfg.runtime))
    runs: list[tuple[str, RunConfig]] = [(v, cfg) for v in order]
    if args.mixed:
        mixed = RunConfig(mode="full", jobs=args.mixed, quotas=args.mixed_quotas, **common)
        mixed = dataclasses.replace(
            mixed, timeout_s=args.timeout or round(60 + args.mixed / 3 + 3 * mixed.runtime)
        )
        runs.append(("mixed", mixed))
    ba.RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = ba.RESULTS / f"pools-{args.jobs}x{args.quotas}{args.suffix}.json"
    rows: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for variant, run_cfg in runs:
        t0 = time.monotonic()
        result = run_variant(run_cfg, variant)
        result["wall_s"] = round(time.monotonic() - t0, 1)
        r = row(result)
        print_row(r)
        rows.append(r)
        results.append(result)
        summary = {
            "order": order,
            "jobs": args.jobs,
            "quotas": args.quotas,
            "mixed_jobs": args.mixed,
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
            "rows": rows,
            "ratios": ratios([x for x in rows if x["variant"] != "mixed"]),
            "runs": results,
        }
        out_path.write_text(json.dumps(summary, indent=1) + "\n")  # after every run: partial results survive
    for key, value in ratios([x for x in rows if x["variant"] != "mixed"]).items():
        print(f"  {key:>30}: {value}")
    print(f"  written to {out_path.relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so each run's control plane and processes are torn down.
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        main()
