"""Benchmark of the pure scheduling core: admission decisions and preemption planning.

Run: ``python bench/bench_core.py`` (``--quick`` for a smaller run). Writes ``bench/results/core.json``
and prints a table.

1. **Admission decisions.** 1,000 / 10,000 / 50,000 / 100,000 pending units spread over 100 queues (quotas in
   a two-level tree: 10 parents of 10 leaves). After the initial cycle has filled every quota, the
   steady state is simulated the way the reconciler drives the core: one admitted unit finishes
   (a watch event releasing quota), then one cycle runs and its admissions are assumed into the
   cache, and a new unit arrives so that the number pending stays constant. The decision sample
   is the wall time of ``schedule()`` divided by the admissions of that cycle (the cycle also
   parks the unit that failed next and the new arrival); the ``with_assume`` sample adds the
   time to fold those admissions into the cache (``Cache.assume``), i.e. everything the core
   does per admission. Reported: median and p99, and the ratio of each median to the 1,000
   baseline measured in the same run (target: median < 100 us at 10,000; growth no faster than
   logarithmic). The cost of feeding one watch event (``Cache.put_unit``) is reported separately,
   and so is the memory each size adds (resident set growth while its cache is built: MiB and
   bytes per pending unit, quotas and the admitted units included).
2. **Quota guarantees.** The same steady state over 10 queues whose quotas are the children of one
   *oversubscribed* parent (docs/compatibility.md#quota-guarantees): the children's ``min`` add up
   to the parent's ``min``, the parent's ``max`` is 1.5 times that (spare capacity the children
   share by weight, so every child borrows), each child's ``max`` is 4 times its ``min`` (the
   children's ``max`` add up to far more than the parent's), and every child has waiting units.
   Measured in the same run against the *flat* case: the same units and the same number of quotas
   (the parent quota exists but has no children), each queue's quota holding what its share of the
   parent gives it in the tree, with no parent above it. The ratio of the medians is the cost of
   computing shares and guarantees per admission (1,000 and 10,000 pending units; 1,000 with
   ``--quick``).
3. **Gangs.** The scaling run's layout at 10,000 pending (1,000 with ``--quick``) with units of one
   pod set of 8 and 64 pods (``minCount`` = the count: all or nothing) against single-pod units,
   each quota scaled by the pod count, in the same run (docs/compatibility.md#gangs-and-partial-admission).
5. **Usage history.** The cost of usage history (docs/compatibility.md#fair-over-time) per
   admission: the scaling run's layout at 50,000 pending (10,000 with ``--quick``) and the
   oversubscribed tree at 10,000 (1,000), each with history on (the product's default half-life,
   one hour: a fold every 28 steps, as each step advances the clock a second and admits about one
   unit, the fewest admissions a fold is shared by) against the same bench with history off,
   stepped in interleaved rounds. Reported: the ratio of the medians of the decision and of
   decision plus assume, and the ratio of the means, which carries the folds (target: under 1.05).
   In the oversubscribed tree history changes which queue is admitted, so there the two benches
   do different work as well.
4. **Preemption planning.** 1,000 / 10,000 assumed (admitted, not running) low-priority units fill
   one queue with ``wait-for-pods-running`` and preemption on; a high-priority unit arrives and the
   cycle plans the preempt path (target < 5 ms at 1,000). The reserve path, which marks every
   assumed unit sorting after the preemptor, is measured too.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import pathlib
import random
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from koord_queue.shared.api import names
from koord_queue.shared.api.model import Admission, PodSet, QueueConfig, Quota, Unit
from koord_queue.shared.core.scheduling import Admit, Cache

QUEUES = 100
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "core.json"


def _unit(i: int, queue: str, cpu: int, priority: int, pods: int = 1) -> Unit:
    """A waiting unit of ``pods`` pods of ``cpu`` each (a gang when ``pods > 1``: ``minCount`` =
    ``pods``, all or nothing)."""
    name = f"u{i:06d}"
    if pods > 1:
        gang = PodSet(name=name, count=pods, min_count=pods, per_pod={"cpu": cpu, "memory": cpu * 1000})
        return Unit(
            key=f"bench/{name}",
            namespace="bench",
            name=name,
            uid=f"uid-{i}",
            created=1_700_000_000.0 + i,
            priority=priority,
            quota=queue,
            labels={names.QUOTA_NAME_LABEL: queue},
            pod_sets=(gang,),
            phase=names.Phase.ENQUEUED.value,
            request={"cpu": cpu * pods},
        )
    return Unit(
        key=f"bench/{name}",
        namespace="bench",
        name=name,
        uid=f"uid-{i}",
        created=1_700_000_000.0 + i,
        priority=priority,
        quota=queue,
        labels={names.QUOTA_NAME_LABEL: queue},
        pod_sets=(PodSet(name=name, count=1, min_count=None, per_pod={"cpu": cpu, "memory": cpu * 1000}),),
        phase=names.Phase.ENQUEUED.value,
        request={"cpu": cpu},
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _limits(cpu: int) -> dict[str, int]:
    """A quota's limits for ``cpu`` milli-CPU (memory follows the units' per-pod ratio)."""
    return {"cpu": cpu, "memory": cpu * 1000}


class AdmissionBench:
    """One synthetic cluster of ``pending`` waiting units in ``queues`` queues, stepped in steady
    state. ``layout`` shapes the quotas: ``tree`` (10 parents of 10 leaves, each parent far larger
    than its leaves: the scaling run), ``borrowing`` (every queue's quota a child of one
    oversubscribed parent) or ``flat`` (the same queues and quota count, no parent above them)."""

    def __init__(
        self,
        pending: int,
        seed: int,
        *,
        queues: int = QUEUES,
        layout: str = "tree",
        pods: int = 1,
        half_life: float = 0.0,
    ) -> None:
        self.pending = pending
        self.queues = queues
        self.layout = layout
        self.pods = pods
        self.rng = rng = random.Random(seed)
        self.cache = cache = Cache(usage_half_life=half_life)
        self.sizes: dict[str, int] = {}
        for q in range(queues):
            self.sizes[f"queue-{q:03d}"] = rng.choice([250, 500, 1000, 2000])
        # Room for ~20% of the queue's units, so most stay pending.
        units = max(1, pending // queues // 5)
        if layout == "tree":
            for p in range(10):
                cache.put_quota(Quota(name=f"parent-{p}", namespace="bench", max={"cpu": 10**12}))
            for q, (name, size) in enumerate(self.sizes.items()):
                limits = _limits(units * size * pods)
                cache.put_quota(Quota(name=name, namespace="bench", parent=f"parent-{q // 10}", max=limits))
        else:
            # The tree: each child guaranteed ``units`` units, the parent half as much again to share.
            spare = units // 2
            total_min = sum(units * size for size in self.sizes.values())
            total_max = sum((units + spare) * size for size in self.sizes.values())
            borrowing = layout == "borrowing"
            parent = Quota(
                name="parent",
                namespace="bench",
                min=_limits(total_min if borrowing else total_max),
                max=_limits(total_max),
            )
            cache.put_quota(parent)
            for name, size in self.sizes.items():
                if borrowing:
                    child = Quota(
                        name=name,
                        namespace="bench",
                        parent="parent",
                        min=_limits(units * size),
                        max=_limits(4 * units * size),
                    )
                else:  # what its share of the parent gives it in the tree, and no parent
                    child = Quota(name=name, namespace="bench", max=_limits((units + spare) * size))
                cache.put_quota(child)
        for name in self.sizes:
            cache.put_queue(QueueConfig(name=name, priority=1000))
        start = time.perf_counter()
        for i in range(pending):
            self.arrive(i)
        self.feed_us = (time.perf_counter() - start) / pending * 1e6
        self.next_id = pending
        self.now = 1_700_100_000.0
        t0 = time.perf_counter()
        plan = cache.schedule(self.now)
        self.running = [d.key for d in plan.decisions if isinstance(d, Admit)]
        for d in plan.decisions:
            if isinstance(d, Admit):
                cache.assume(d, now=self.now)
        self.initial_ms = (time.perf_counter() - t0) * 1e3
        self.initial_admits = len(self.running)
        self.samples: list[float] = []
        self.with_assume: list[float] = []
        self.events: list[float] = []

    def arrive(self, ident: int) -> None:
        queue = f"queue-{self.rng.randrange(self.queues):03d}"
        self.cache.put_unit(_unit(ident, queue, self.sizes[queue], self.rng.randrange(10), self.pods))

    def step(self) -> None:
        """One unit finishes (releasing quota), one arrives, one cycle runs and is assumed."""
        cache = self.cache
        self.now += 1.0
        done = self.running.pop(self.rng.randrange(len(self.running)))
        finished = dataclasses.replace(cache.units[done], phase=names.Phase.SUCCEED.value, admissions=())
        t0 = time.perf_counter()
        cache.put_unit(finished)
        self.events.append(time.perf_counter() - t0)
        cache.delete_unit(done)
        self.arrive(self.next_id)  # keeps the number of pending units constant
        self.next_id += 1
        t0 = time.perf_counter()
        plan = cache.schedule(self.now)
        t1 = time.perf_counter()
        admitted = 0
        for d in plan.decisions:
            if isinstance(d, Admit):
                cache.assume(d, now=self.now)
                self.running.append(d.key)
                admitted += 1
        t2 = time.perf_counter()
        if admitted:
            self.samples.append((t1 - t0) / admitted)
            self.with_assume.append((t2 - t0) / admitted)

    def borrowed(self) -> int:
        """How many of the tree's children use more than their ``min`` (they borrow) now."""
        ledger = self.cache.ledger
        return sum(
            1
            for name, quota in ledger.quotas.items()
            if quota.parent and ledger.used(name).get("cpu", 0) > quota.min.get("cpu", 0)
        )

    def result(self) -> dict[str, float]:
        return {
            "pending": self.pending,
            "queues": self.queues,
            "initial_cycle_admits": self.initial_admits,
            "initial_cycle_ms": self.initial_ms,
            "median_us": statistics.median(self.samples) * 1e6,
            "mean_us": statistics.fmean(self.samples) * 1e6,
            "p99_us": _percentile(self.samples, 0.99) * 1e6,
            "with_assume_median_us": statistics.median(self.with_assume) * 1e6,
            "with_assume_p99_us": _percentile(self.with_assume, 0.99) * 1e6,
            "event_median_us": statistics.median(self.events) * 1e6,
            "feed_per_unit_us": self.feed_us,
            "samples": len(self.samples),
        }


def bench_admission(sizes: tuple[int, ...], steps: int, seed: int) -> list[dict[str, float]]:
    """Step all sizes in interleaved rounds so that machine noise hits them alike."""
    benches, memory = [], []
    for n in sizes:
        gc.collect()
        before = _rss_bytes()
        benches.append(AdmissionBench(n, seed))
        gc.collect()
        memory.append(_rss_bytes() - before)
    gc.collect()
    gc.freeze()  # the caches are long-lived: keep collector pauses of the setup out of the samples
    rounds = 10
    for _ in range(rounds):
        for bench in benches:
            for _ in range(steps // rounds):
                bench.step()
    results = [bench.result() for bench in benches]
    for row, grown in zip(results, memory, strict=True):
        row["rss_mib"] = grown / 2**20
        row["bytes_per_pending"] = grown / row["pending"]
    return results


def _rss_bytes() -> int:
    """Resident memory of this process now (``VmRSS``): what a core of ``n`` pending units adds."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _step_pairs(pairs: list[tuple[AdmissionBench, AdmissionBench]], steps: int) -> None:
    """Step every bench of ``pairs`` in interleaved rounds, so that machine noise hits them alike."""
    gc.collect()
    gc.freeze()
    rounds = 10
    for _ in range(rounds):
        for pair in pairs:
            for bench in pair:
                for _ in range(steps // rounds):
                    bench.step()


def bench_guarantees(sizes: tuple[int, ...], steps: int, seed: int) -> list[dict[str, object]]:
    """The oversubscribed tree against the flat case, stepped in interleaved rounds (see the module
    docstring, item 2); per size, both results and the ratio of their medians."""
    pairs = [
        (
            AdmissionBench(n, seed, queues=10, layout="borrowing"),
            AdmissionBench(n, seed, queues=10, layout="flat"),
        )
        for n in sizes
    ]
    _step_pairs(pairs, steps)
    out: list[dict[str, object]] = []
    for tree, flat in pairs:
        borrowing, baseline = tree.result(), flat.result()
        out.append(
            {
                "pending": tree.pending,
                "queues": tree.queues,
                "quotas": len(tree.cache.ledger.quotas),
                "borrowing": borrowing,
                "flat": baseline,
                "median_ratio": borrowing["median_us"] / baseline["median_us"],
                "p99_ratio": borrowing["p99_us"] / baseline["p99_us"],
                "with_assume_median_ratio": borrowing["with_assume_median_us"]
                / baseline["with_assume_median_us"],
                "borrowed_at_end": tree.borrowed(),
            }
        )
    return out


def bench_history(runs: tuple[tuple[str, int], ...], steps: int, seed: int) -> list[dict[str, object]]:
    """History on against off, per ``(layout, pending)``, stepped in interleaved rounds (see the
    module docstring, item 5)."""
    queues = {"tree": QUEUES, "borrowing": 10}
    pairs = [
        (
            AdmissionBench(n, seed, queues=queues[layout], layout=layout, half_life=3600.0),
            AdmissionBench(n, seed, queues=queues[layout], layout=layout),
        )
        for layout, n in runs
    ]
    _step_pairs(pairs, steps)
    out: list[dict[str, object]] = []
    for (layout, n), (on, off) in zip(runs, pairs, strict=True):
        with_history, without = on.result(), off.result()
        out.append(
            {
                "layout": layout,
                "pending": n,
                "history": with_history,
                "no_history": without,
                "median_ratio": with_history["median_us"] / without["median_us"],
                # the folds are a grain apart: the mean carries their cost, the median may not
                "mean_ratio": with_history["mean_us"] / without["mean_us"],
                "with_assume_median_ratio": with_history["with_assume_median_us"]
                / without["with_assume_median_us"],
            }
        )
    return out


def bench_gangs(pending: int, steps: int, seed: int, pods: tuple[int, ...]) -> list[dict[str, float]]:
    """Gang units (one pod set of ``p`` pods, ``minCount`` = ``p``) against single-pod units, the
    scaling run's layout with every quota scaled by ``p``, stepped in interleaved rounds; per size
    the result and the ratio of its median to the single-pod one
    (docs/compatibility.md#gangs-and-partial-admission)."""
    benches = [AdmissionBench(pending, seed, pods=p) for p in pods]
    gc.collect()
    gc.freeze()
    rounds = 10
    for _ in range(rounds):
        for bench in benches:
            for _ in range(steps // rounds):
                bench.step()
    out = []
    base = benches[0].result()["median_us"]
    for p, bench in zip(pods, benches, strict=True):
        row = bench.result() | {"pods_per_set": p}
        row["ratio_vs_single_pod"] = row["median_us"] / base
        out.append(row)
    return out


def bench_preemption(assumed: int, reps: int, *, reserve: bool) -> dict[str, float | str]:
    cache = Cache()
    cpu = 1000
    extra = 3 * cpu if reserve else 0  # reserve path: the preemptor fits the quota
    cache.put_quota(Quota(name="q", namespace="bench", max={"cpu": assumed * cpu + extra}))
    cache.put_queue(QueueConfig(name="q", wait_for_pods_running=True, enable_preemption=True))
    for i in range(assumed):
        u = _unit(i, "q", cpu, priority=i % 50)
        cache.put_unit(dataclasses.replace(u, admissions=(Admission(u.name, 1, 0),), phase="Dequeued"))
    cache.put_unit(dataclasses.replace(_unit(assumed, "q", 3 * cpu, priority=1000)))
    state = cache.state.queues["q"]
    timings: list[float] = []
    victims = 0
    now = 1_700_100_000.0
    for _ in range(reps):
        now += 1
        t0 = time.perf_counter()
        plan = cache.schedule(now)
        timings.append(time.perf_counter() - t0)
        marks = plan.marks
        assert marks, "no preemption planned"
        victims = len(marks[0].victims)
        cache.forget_marks("q", {v.key for m in marks for v in m.victims})
        state.round = None
    return {
        "assumed": assumed,
        "path": "reserve" if reserve else "preempt",
        "victims": victims,
        "median_ms": statistics.median(timings) * 1e3,
        "p99_ms": _percentile(timings, 0.99) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and sizes (CI smoke run)")
    args = parser.parse_args()
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 50_000, 100_000)
    steps = 300 if args.quick else 5_000
    admission = bench_admission(sizes, steps, seed=7)
    base = admission[0]["median_us"]
    for row in admission:
        row["ratio_vs_1k"] = row["median_us"] / base
        row["log_ratio_bound"] = math.log(row["pending"]) / math.log(admission[0]["pending"])
    guaranteed = bench_guarantees(sizes[:1] if args.quick else (1_000, 10_000), steps, seed=7)
    gangs = bench_gangs(1_000 if args.quick else 10_000, steps, seed=7, pods=(1, 8, 64))
    history_runs = (
        (("tree", 10_000), ("borrowing", 1_000)) if args.quick else (("tree", 50_000), ("borrowing", 10_000))
    )
    history = bench_history(history_runs, steps, seed=7)
    preemption = [
        bench_preemption(n, 20 if n <= 1_000 else 5, reserve=reserve)
        for n in (1_000, 10_000)
        for reserve in (False, True)
    ]
    result = {
        "python": sys.version.split()[0],
        "admission": admission,
        "guarantees": guaranteed,
        "gangs": gangs,
        "preemption": preemption,
        "history": history,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'pending':>8} {'median us':>10} {'p99 us':>9} {'x 1k':>6} {'log bound':>9}"
        f" {'+assume med':>12} {'+assume p99':>12} {'event us':>9} {'MiB':>6} {'B/unit':>7}"
    )
    for row in admission:
        print(
            f"{row['pending']:>8} {row['median_us']:>10.1f} {row['p99_us']:>9.1f} {row['ratio_vs_1k']:>6.2f}"
            f" {row['log_ratio_bound']:>9.2f} {row['with_assume_median_us']:>12.1f}"
            f" {row['with_assume_p99_us']:>12.1f} {row['event_median_us']:>9.1f}"
            f" {row['rss_mib']:>6.1f} {row['bytes_per_pending']:>7.0f}"
        )
    print(
        f"\n{'pending':>8} {'flat med us':>12} {'tree med us':>12} {'ratio':>6} {'flat p99':>9}"
        f" {'tree p99':>9} {'+assume ratio':>14} {'borrowing':>10}"
    )
    for pair in guaranteed:
        flat, tree = pair["flat"], pair["borrowing"]
        assert isinstance(flat, dict) and isinstance(tree, dict)
        print(
            f"{pair['pending']:>8} {flat['median_us']:>12.1f} {tree['median_us']:>12.1f}"
            f" {pair['median_ratio']:>6.2f} {flat['p99_us']:>9.1f} {tree['p99_us']:>9.1f}"
            f" {pair['with_assume_median_ratio']:>14.2f} {pair['borrowed_at_end']:>7}/10"
        )
    print(f"\n{'pods/set':>8} {'pending':>8} {'median us':>10} {'p99 us':>9} {'x 1 pod':>8}")
    for row in gangs:
        print(
            f"{row['pods_per_set']:>8} {row['pending']:>8} {row['median_us']:>10.1f} {row['p99_us']:>9.1f}"
            f" {row['ratio_vs_single_pod']:>8.2f}"
        )
    print(f"\n{'assumed':>8} {'path':>8} {'victims':>8} {'median ms':>10} {'p99 ms':>8}")
    for plan in preemption:
        print(
            f"{plan['assumed']:>8} {plan['path']:>8} {plan['victims']:>8}"
            f" {plan['median_ms']:>10.2f} {plan['p99_ms']:>8.2f}"
        )
    print(
        f"\n{'layout':>10} {'pending':>8} {'off med us':>11} {'on med us':>10} {'ratio':>6}"
        f" {'+assume ratio':>14} {'mean ratio':>11}"
    )
    for pair in history:
        off, on = pair["no_history"], pair["history"]
        assert isinstance(off, dict) and isinstance(on, dict)
        print(
            f"{pair['layout']:>10} {pair['pending']:>8} {off['median_us']:>11.1f} {on['median_us']:>10.1f}"
            f" {pair['median_ratio']:>6.3f} {pair['with_assume_median_ratio']:>14.3f}"
            f" {pair['mean_ratio']:>11.3f}"
        )
    print(f"\nwritten to {RESULTS}")


if __name__ == "__main__":
    main()
