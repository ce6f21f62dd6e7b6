"""Fairness between two teams on a real control plane: our system next to Kueue, in one run.

Run: ``python bench/bench_fairness.py`` (both stories, every system; about 15 minutes) or
``--quick`` (times x 0.25, fewer jobs; about 5 minutes). Writes ``bench/results/fairness.json``
(``fairness-quick.json`` for ``--quick``) after every story and prints one table per story.

Every run is one system on a **fresh** control plane of its own (``LocalCluster`` profile ``e2e``:
etcd, kube-apiserver, kube-controller-manager with the Job controller, the real kube-scheduler, kwok)
with ``ceil(N/8)`` kwok nodes that together allocate exactly N ``nvidia.com/gpu``. The runs of a
story run **at the same time** (``--parallel``, default all of them; ``--parallel 1`` runs them one
after the other): their start-ups are serialized, then each drives its own story on its own clock.
The figures are seconds on a timescale of job durations of a minute, and concurrent runs see the
same machine, where sequential ones would see its drift. The machine's load is recorded per story.

Jobs are ``batch/v1`` Jobs of one pod asking for 100m cpu and one GPU. Each pod runs for its own
duration (the kwok annotation ``pod-complete.stage.kwok.x-k8s.io/delay``): the mean ``--duration``
times a seeded uniform factor in [1 - jitter, 1 + jitter], the same job the same time in every
system, so slots free one by one. The runner only creates Jobs and watches: the units (QueueUnits
or Workloads) for admission and release, the pods for Running and Succeeded, each stamped with the
monotonic clock when the watch delivered it.

**The systems** (team A and team B, equal weight, each may use the whole parent):

* ``ours`` / ``ours-off``: ElasticQuota ``fair-parent`` (``min = max = N`` GPUs) with children
  ``team-a`` and ``team-b``, each ``min 0``, ``max N``, default ``shared-weight`` (their ``max``:
  equal): every GPU either holds is borrowed, and the parent's spare capacity is divided by weight
  (docs/compatibility.md#quota-guarantees). The component configuration carries
  ``usageHalfLife`` for the history story (``0s`` in ``ours-off``); the burst story leaves the
  default. With min 0 nothing is ever reclaimed: B's jobs wait for slots that free.
* ``kueue-afs``: Kueue v0.17, one ClusterQueue of N GPUs with ``admissionScope.admissionMode:
  UsageBasedAdmissionFairSharing`` and two LocalQueues; the Configuration's
  ``admissionFairSharing`` (``usageHalfLifeTime``, ``usageSamplingInterval``, GPU usage only:
  ``resourceWeights {cpu: 0}``); the ``AdmissionFairSharing`` feature gate is beta, on by default.
* ``kueue-cohort``: two ClusterQueues in cohort ``fair``, each with a nominal quota of N/2 GPUs and
  no borrowing limit (so either may borrow the other's whole share), ``fairSharing.weight: 1``; the
  Configuration's ``fairSharing`` (preemption strategies as shipped commented out); no preemption
  (``reclaimWithinCohort: Never``), like ours.
* ``kueue-fifo`` (not in the default lists): the single ClusterQueue without admission fair
  sharing, the baseline that starves B.

**Burst** (``--stories burst``): team A submits ``--a-jobs`` (300) Jobs at once; ``--b-after``
(60 s) later team B submits ``--b-jobs`` (10). From B's submission (its first create sent): when
B's units all existed, when the next slot freed (a unit of either team released: its quota has the
GPU back; the first pod seen Succeeded is reported beside it), when B's first unit was admitted
and B's first pod ran, how many of A's units were admitted in between (0: B got the next slot) and
how many slots freed until then (1: B got the next one), and when B first held its weighted share
``min(b_jobs, N/2)`` running pods at once, which must be within one mean job duration.

**History** (``--stories history``): team A submits ``--a-jobs`` Jobs and uses the whole parent alone
for ``--alone-half-lives`` (3) half-lives of ``--half-life`` (60 s); then B submits ``3N`` Jobs, so
both have plenty waiting. Over the admissions after B's submission: B's fraction of the first K
(``--k``, default 2N), B's fraction of the K admitted after B first held its weighted share N/2
(what history adds beyond catching up to the share: about 50% without history), B's fraction per
window of N admissions, and the most B held at once. ``ours`` keeps usage history (the
configuration's ``usageHalfLife``), ``ours-off`` has ``usageHalfLife: 0s``; Kueue's admission fair
sharing keeps history of its own, its cohort fair sharing has none.

Every wait has a deadline: a run ends once its figures are complete, at the latest 3 mean durations
after B's submission (burst) or 5 (history); all traffic is loopback; a run that fails is reported
and the others go on.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final
from unittest import mock

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_admission as ba
import bench_kueue as bk
from bench_admission import NS, ROOT

from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import format_duration
from testenv import kwok, pools

GPU: Final = pools.GPU
PARENT: Final = "fair-parent"
COHORT: Final = "fair"
TEAMS: Final = ("a", "b")
GPUS_PER_NODE: Final = 8
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
SYSTEMS: Final = ("ours", "ours-off", "kueue-afs", "kueue-cohort", "kueue-fifo")
DEFAULT_SYSTEMS: Final = {
    "burst": ("ours", "kueue-afs", "kueue-cohort"),
    "history": ("ours", "ours-off", "kueue-afs", "kueue-cohort"),
}
#: (seconds since the run's start, kind, team, job): kinds ``queued`` (its unit first seen),
#: ``admitted`` and ``released`` (the unit), ``running`` and ``succeeded`` (the job's pod)
Event = tuple[float, str, str, str]


@dataclasses.dataclass(frozen=True)
class Story:
    """One story's load and clock; every duration in seconds, already scaled."""

    name: str
    gpus: int = 20
    a_jobs: int = 300
    b_jobs: int = 10
    duration_s: float = 60.0
    jitter: float = 0.25
    #: burst: from A's submission to B's; history: how long A runs alone
    b_after_s: float = 60.0
    #: the usage half-life of the systems that keep history (history story; burst: ``burst_half_life_s``)
    half_life_s: float = 60.0
    burst_half_life_s: float = 3600.0
    #: Kueue's ``usageSamplingInterval``
    sampling_s: float = 5.0
    #: admissions counted after B's submission (history)
    k: int = 40
    #: the run ends at the latest this many mean durations after B's submission
    deadline_durations: float = 3.0
    seed: int = 7

    @property
    def share(self) -> int:
        """B's weighted share in running jobs: half the parent (equal weights), at most its jobs."""
        return min(self.b_jobs, self.gpus // 2)

    def half_life(self, system: str) -> str:
        """The usage half-life a system runs this story with, as a Go duration."""
        if system == "ours-off":
            return "0s"
        return format_duration(self.half_life_s if self.name == "history" else self.burst_half_life_s)

    def shown_half_life(self, system: str) -> str | None:
        """The half-life a run reports: none for Kueue's cohort (no history), ours' default in the
        burst story (its configuration leaves it out)."""
        if system == "kueue-cohort":
            return None
        if self.name == "burst" and not system.startswith("kueue"):
            return "default"
        return self.half_life(system)


# --- objects and configurations (pure) ----------------------------------------------------------------


def team_of(job: str) -> str | None:
    """The team of a job by its name (``a-0001``), None for a job that is not the load's."""
    head = job.split("-", 1)[0]
    return head if head in TEAMS and "-" in job else None


def job_names(team: str, count: int) -> list[str]:
    return [f"{team}-{i:04d}" for i in range(count)]


def job_durations(story: Story) -> dict[str, float]:
    """Every job's run time: the mean x a uniform factor in [1 - jitter, 1 + jitter], seeded by the
    story's seed and the job's name, so every system runs the same job for the same time."""
    out: dict[str, float] = {}
    for team, count in (("a", story.a_jobs), ("b", story.b_jobs)):
        for name in job_names(team, count):
            rng = random.Random(f"{story.seed}-{name}")
            out[name] = round(story.duration_s * rng.uniform(1 - story.jitter, 1 + story.jitter), 3)
    return out


def job_body(name: str, duration_s: float, *, kueue: bool) -> kube.Obj:
    """A one-GPU Job whose pod kwok completes after ``duration_s``: labelled with its team's quota
    for ours (our webhook holds it), or suspended with its team's LocalQueue for Kueue (what Kueue's
    Job webhook, not registered here, would have made of it; as bench_kueue.py does)."""
    team = team_of(name)
    label = {names.QUOTA_NAME_LABEL: f"team-{team}"} if not kueue else {bk.QUEUE_LABEL: f"team-{team}"}
    container = {
        "name": "c",
        "image": "busybox",
        "resources": {"requests": {"cpu": f"{ba.CPU_PER_JOB_MILLI}m", GPU: "1"}, "limits": {GPU: "1"}},
    }
    spec: dict[str, Any] = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "template": {
            "metadata": {"annotations": {kwok.COMPLETE_DELAY_ANNOTATION: f"{round(duration_s * 1000)}ms"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [container]},
        },
    }
    if kueue:
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": label},
        "spec": spec,
    }


def our_quotas(gpus: int) -> list[kube.Obj]:
    """The parent of N GPUs and the two team quotas: min 0, max N, default (equal) weights."""

    def quota(name: str, low: int, parent: str = "") -> kube.Obj:
        meta: dict[str, Any] = {"name": name}
        if parent:
            meta["labels"] = {names.QUOTA_PARENT_LABEL: parent}
        spec = {"min": {GPU: str(low)}, "max": {GPU: str(gpus)}}
        return {"apiVersion": names.QUOTA_API_VERSION, "kind": "ElasticQuota", "metadata": meta, "spec": spec}

    return [quota(PARENT, gpus), quota("team-a", 0, PARENT), quota("team-b", 0, PARENT)]


def our_config(half_life: str | None) -> kube.Obj:
    """The component configuration: ``usageHalfLife`` when given, else every default."""
    cfg: kube.Obj = {"apiVersion": "scheduling.k8s.io/v1", "kind": "KoordQueueConfiguration"}
    if half_life is not None:
        cfg["usageHalfLife"] = half_life
    return cfg


def kueue_settings(system: str, half_life: str, sampling: str) -> kube.Obj:
    """What a Kueue variant adds to Kueue's Configuration (bench_kueue.kueue_config's)."""
    if system == "kueue-afs":
        return {
            "admissionFairSharing": {
                "usageHalfLifeTime": half_life,
                "usageSamplingInterval": sampling,
                "resourceWeights": {"cpu": 0, GPU: 1},
            }
        }
    if system == "kueue-cohort":
        return {
            "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
        }
    return {}


def kueue_objects(system: str, gpus: int) -> list[tuple[kube.Resource, kube.Obj]]:
    """The flavor, ClusterQueue(s) and LocalQueues ``team-a`` and ``team-b`` of a Kueue variant."""
    head = {"apiVersion": f"{bk.GROUP}/v1beta2"}

    def cluster_queue(name: str, nominal: int, **extra: Any) -> kube.Obj:
        resources = [{"name": "cpu", "nominalQuota": "1000"}, {"name": GPU, "nominalQuota": str(nominal)}]
        group = {"coveredResources": ["cpu", GPU], "flavors": [{"name": bk.FLAVOR, "resources": resources}]}
        spec = {"namespaceSelector": {}, "resourceGroups": [group], **extra}
        return {**head, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}

    out: list[tuple[kube.Resource, kube.Obj]] = [
        (bk.FLAVORS, {**head, "kind": "ResourceFlavor", "metadata": {"name": bk.FLAVOR}})
    ]
    if system == "kueue-cohort":
        never = {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never"}
        for team, nominal in zip(TEAMS, (gpus - gpus // 2, gpus // 2), strict=True):
            cq = cluster_queue(
                f"team-{team}", nominal, cohortName=COHORT, fairSharing={"weight": "1"}, preemption=never
            )
            out.append((bk.CLUSTER_QUEUES, cq))
    else:
        scope = {"admissionScope": {"admissionMode": "UsageBasedAdmissionFairSharing"}}
        out.append(
            (bk.CLUSTER_QUEUES, cluster_queue(COHORT, gpus, **(scope if system == "kueue-afs" else {})))
        )
    for team in TEAMS:
        target = f"team-{team}" if system == "kueue-cohort" else COHORT
        lq = {
            **head,
            "kind": "LocalQueue",
            "metadata": {"name": f"team-{team}"},
            "spec": {"clusterQueue": target},
        }
        out.append((bk.LOCAL_QUEUES, lq))
    return out


def gpu_nodes(gpus: int) -> list[kube.Obj]:
    """kwok nodes that together allocate exactly ``gpus`` GPUs, at most 8 each, so the scheduler
    could not run more than the parent holds even if a queue admitted more."""
    count = max(1, math.ceil(gpus / GPUS_PER_NODE))
    base, extra = divmod(gpus, count)
    out = []
    for i in range(count):
        body = kwok.node(f"kwok-gpu-{i}", cpu="32", memory="256Gi", pods="110")
        resources = {**body["status"]["allocatable"], GPU: str(base + (1 if i < extra else 0))}
        body["status"] = {"capacity": resources, "allocatable": resources}
        out.append(body)
    return out


# --- figures from a timeline (pure) ----------------------------------------------------------------


def after(events: Sequence[Event], kind: str, t: float, team: str | None = None) -> list[Event]:
    """The events of a kind (and team) at or after ``t``, in time order."""
    return sorted(e for e in events if e[1] == kind and e[0] >= t and (team is None or e[2] == team))


def first_holding(
    events: Sequence[Event], team: str, target: int, up: str, down: str, t: float
) -> float | None:
    """The first time at or after ``t`` at which ``team`` holds ``target`` at once (``up`` events
    less ``down`` events), None if it never does."""
    held = 0
    for when, kind, _team, _ in sorted(e for e in events if e[2] == team and e[1] in (up, down)):
        held += 1 if kind == up else -1
        if held >= target and when >= t:
            return when
    return None


def peak_held(events: Sequence[Event], team: str, up: str = "admitted", down: str = "released") -> int:
    held = peak = 0
    for _, kind, _, _ in sorted(e for e in events if e[2] == team and e[1] in (up, down)):
        held += 1 if kind == up else -1
        peak = max(peak, held)
    return peak


def since(t: float | None, t_b: float) -> float | None:
    return None if t is None else round(t - t_b, 2)


def burst_figures(events: Sequence[Event], t_b: float, story: Story) -> dict[str, Any]:
    """The burst story's figures, seconds from B's submission ``t_b`` (its first create sent). A
    slot frees when a unit is released (its quota takes the GPU back: the pod finished, the Job
    controller and the queue saw it); the pod's own end is reported beside it."""
    freed = after(events, "released", t_b)
    pods_done = after(events, "succeeded", t_b)
    b_queued = after(events, "queued", t_b, "b")
    b_admitted = after(events, "admitted", t_b, "b")
    b_running = after(events, "running", t_b, "b")
    first_b = b_admitted[0][0] if b_admitted else None
    share_at = first_holding(events, "b", story.share, "running", "succeeded", t_b)
    admitted = after(events, "admitted", t_b)
    held = sum(
        1 if e[1] == "admitted" else -1 for e in events if e[1] in ("admitted", "released") and e[0] < t_b
    )
    return {
        # GPUs no unit held when B came, as the watch saw it (a refill of A's under way): A may take them
        "free_at_b": story.gpus - held,
        # B's units all exist (the system has taken in every job of B)
        "b_queued_s": since(b_queued[-1][0] if len(b_queued) == story.b_jobs else None, t_b),
        "next_slot_freed_s": since(freed[0][0] if freed else None, t_b),
        "next_pod_done_s": since(pods_done[0][0] if pods_done else None, t_b),
        "b_first_admitted_s": since(first_b, t_b),
        "b_first_running_s": since(b_running[0][0] if b_running else None, t_b),
        # A's admissions after B's submission before B's first: 0 means B took the next slot
        "a_admitted_before_b": None if first_b is None else sum(1 for e in admitted if e[0] < first_b),
        # slots freed after B's submission up to B's first admission: 1 = the next slot that freed
        "slots_freed_until_b_admitted": None if first_b is None else sum(1 for e in freed if e[0] <= first_b),
        "b_share": story.share,
        "b_share_running_s": since(share_at, t_b),
        "b_share_within_one_duration": None if share_at is None else share_at - t_b <= story.duration_s,
        "order_after_b": "".join(e[2].upper() for e in admitted[: 2 * story.gpus]),
    }


def fraction_b(teams: Sequence[str], k: int) -> float | None:
    """B's fraction of the first ``k`` admissions, None when fewer than ``k`` were seen."""
    return round(teams[:k].count("b") / k, 3) if k and len(teams) >= k else None


def history_figures(events: Sequence[Event], t_b: float, story: Story) -> dict[str, Any]:
    """The history story's figures over the admissions after B's submission ``t_b``."""
    admitted = after(events, "admitted", t_b)
    teams = [e[2] for e in admitted]
    half = math.ceil(story.gpus / 2)
    share_at = first_holding(events, "b", half, "admitted", "released", t_b)
    later = [e[2] for e in admitted if share_at is not None and e[0] > share_at]
    windows = [teams[i : i + story.gpus] for i in range(0, len(teams), story.gpus)]
    return {
        "k": story.k,
        "admitted_after_b": len(teams),
        "b_fraction_first_k": fraction_b(teams, story.k),
        "b_holds_half_s": since(share_at, t_b),
        "b_fraction_k_after_half": fraction_b(later, story.k),
        "b_fraction_by_window": [round(w.count("b") / len(w), 3) for w in windows if len(w) == story.gpus],
        "b_peak_held": peak_held(events, "b"),
        "b_peak_running": peak_held(events, "b", "running", "succeeded"),
        "order_after_b": "".join(t.upper() for t in teams[: 3 * story.gpus]),
    }


def figures(events: Sequence[Event], t_b: float, story: Story) -> dict[str, Any]:
    return (burst_figures if story.name == "burst" else history_figures)(events, t_b, story)


def complete(fig: dict[str, Any], story: Story) -> bool:
    """Has the run seen everything its figures need (so it may stop before its deadline)?"""
    if story.name == "burst":
        return fig["b_share_running_s"] is not None
    return fig["b_fraction_first_k"] is not None and fig["b_fraction_k_after_half"] is not None


# --- the live run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Timeline:
    """What the runner's watches delivered, stamped with the monotonic clock since ``t0``; each
    (kind, job) once, the first time it was seen."""

    kueue: bool
    t0: float = dataclasses.field(default_factory=time.monotonic)
    events: list[Event] = dataclasses.field(default_factory=list)
    seen: set[tuple[str, str]] = dataclasses.field(default_factory=set)

    def add(self, kind: str, job: str) -> None:
        team = team_of(job)
        if team is None or (kind, job) in self.seen:
            return
        self.seen.add((kind, job))
        self.events.append((round(time.monotonic() - self.t0, 3), kind, team, job))

    def unit(self, obj: kube.Obj) -> None:
        """A QueueUnit (phase) or a Workload (conditions ``Admitted``, ``Finished``), by its Job."""
        meta = obj.get("metadata") or {}
        owner: dict[str, Any] = next(
            (r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Job"), {}
        )
        job = str(owner.get("name") or meta.get("name") or "")
        status = obj.get("status") or {}
        if self.kueue:
            state = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
            admitted, done = state.get("Admitted") == "True", state.get("Finished") == "True"
        else:
            phase = str(status.get("phase") or "")
            admitted, done = phase in ba.ADMITTED_PHASES, phase in ("Succeed", "Failed")
        self.add("queued", job)
        if admitted or done:
            self.add("admitted", job)
        if done:
            self.add("released", job)

    def pod(self, obj: kube.Obj) -> None:
        job = str(((obj.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL, ""))
        phase = (obj.get("status") or {}).get("phase")
        if phase in ("Running", "Succeeded", "Failed"):
            self.add("running", job)
        if phase in ("Succeeded", "Failed"):
            self.add("succeeded", job)


async def follow(
    client: kube.Kube, res: kube.Resource, handle: Callable[[kube.Obj], None], listed: asyncio.Event
) -> None:
    """List, then watch ``res`` in the bench namespace until cancelled; relist on 410 Gone."""
    while True:
        items, rv = await client.list(res, namespace=NS)
        for item in items:
            handle(item)
        listed.set()
        with contextlib.suppress(kube.Gone):
            while True:
                try:
                    async for kind, obj in client.watch(res, namespace=NS, resource_version=rv):
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if kind in ("ADDED", "MODIFIED"):
                            handle(obj)
                except kube.Gone:
                    raise
                except kube.KubeError:
                    await asyncio.sleep(0.2)


async def create_jobs(client: kube.Kube, jobs: list[str], durations: dict[str, float], kueue: bool) -> int:
    """Create the jobs, 16 at a time; returns how many creates failed."""
    gate = asyncio.Semaphore(16)
    failed = 0

    async def one(name: str) -> None:
        nonlocal failed
        async with gate:
            try:
                await client.create(ba.JOBS, job_body(name, durations[name], kueue=kueue), namespace=NS)
            except kube.KubeError:
                failed += 1

    await asyncio.gather(*(one(n) for n in jobs))
    return failed


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{what} not within {timeout}s")


async def set_up(client: kube.Kube, system: str, gpus: int) -> None:
    """The quotas or queues of the system, and wait until it can admit."""
    await ba.create_namespace(client, NS)
    if system.startswith("kueue"):
        for res, body in kueue_objects(system, gpus):
            await client.create(res, body, namespace=NS if res is bk.LOCAL_QUEUES else None)
        await bk.wait_active(client, len(TEAMS))
        return
    for body in our_quotas(gpus):
        await client.create(ba.QUOTAS, body, namespace=NS)

    from testenv import system  # the system runs installed where the harness installs it

    async def queues() -> bool:
        items, _ = await client.list(ba.QUEUES, namespace=system.NAMESPACE)
        return {"team-a", "team-b"} <= {str(i["metadata"]["name"]) for i in items}

    await wait_for(queues, 60.0, "the teams' Queues")


async def drive(
    cluster: Any, system: str, story: Story, abort: threading.Event, keep_events: bool = False
) -> dict[str, Any]:
    """One story on a started system: A's jobs, then B's, watched until the figures are complete or
    the deadline."""
    kueue = system.startswith("kueue")
    client = await ba.runner_client(cluster)
    tasks: list[asyncio.Task[None]] = []
    try:
        await set_up(client, system, story.gpus)
        timeline = Timeline(kueue)
        units = bk.WORKLOADS if kueue else ba.UNITS
        for res, handle in ((units, timeline.unit), (kube.PODS, timeline.pod)):
            listed = asyncio.Event()
            tasks.append(asyncio.create_task(follow(client, res, handle, listed)))
            await asyncio.wait_for(listed.wait(), 30)
        durations = job_durations(story)
        timeline.t0 = time.monotonic()
        failed = await create_jobs(client, job_names("a", story.a_jobs), durations, kueue)
        a_created_s = round(time.monotonic() - timeline.t0, 2)
        # the story's own clock: B arrives this long after A (sooner only when the run is aborted)
        await asyncio.to_thread(abort.wait, max(0.0, timeline.t0 + story.b_after_s - time.monotonic()))
        t_b = round(time.monotonic() - timeline.t0, 3)  # B's submission: its first create goes out now
        failed += await create_jobs(client, job_names("b", story.b_jobs), durations, kueue)
        b_created_s = round(time.monotonic() - timeline.t0 - t_b, 3)
        deadline = time.monotonic() + story.deadline_durations * story.duration_s
        while time.monotonic() < deadline and not abort.is_set():
            if complete(figures(timeline.events, t_b, story), story):
                break
            await asyncio.sleep(0.5)
        fig = figures(timeline.events, t_b, story)
        return {
            "figures": fig,
            "complete": complete(fig, story),
            "a_created_s": a_created_s,
            "b_submitted_s": t_b,
            "b_creates_took_s": b_created_s,
            "create_errors": failed,
            "ended_s": round(time.monotonic() - timeline.t0, 1),
            "events": len(timeline.events),
            "timeline": sorted(timeline.events) if keep_events else None,
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


def create_nodes(cluster: Any, gpus: int) -> None:
    """The GPU nodes, made Ready by kwok (as testenv.pools.create does, without a pool profile)."""
    from testenv.processes import wait_until

    bodies = gpu_nodes(gpus)
    for body in bodies:
        cluster.request("POST", "/api/v1/nodes", body)
        path = f"/api/v1/nodes/{body['metadata']['name']}/status"
        cluster.request(
            "PATCH", path, {"status": body["status"]}, content_type="application/merge-patch+json"
        )
    node_names = [b["metadata"]["name"] for b in bodies]
    wait_until(lambda: all(cluster.node_ready(n) for n in node_names), timeout=120, what="GPU nodes Ready")


def start_system(cluster: Any, system: str, story: Story, workdir: pathlib.Path, build: Any) -> list[Any]:
    """Our webhook and reconciler (with the story's configuration file), or Kueue's manager with
    its variant's settings merged into bench_kueue's configuration."""
    from testenv import system as ours

    logdir = workdir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    if system.startswith("kueue"):
        bk.install_crds(cluster, build / "crds")
        sampling = format_duration(story.sampling_s)
        extra = kueue_settings(system, story.half_life(system), sampling)
        shipped = bk.kueue_config

        def configured(*args: Any, **kwargs: Any) -> Any:
            return {**shipped(*args, **kwargs), **extra}

        with mock.patch.object(bk, "kueue_config", configured):  # start-ups are serialized (START_LOCK)
            return [bk.start_kueue(cluster, build, workdir, 50.0, 100)]
    ours.install_crds(cluster)
    webhook, _ = ours.start_webhook(cluster, logdir=logdir)
    half_life = story.half_life(system) if story.name == "history" else None
    config = workdir / "koord-queue-config.yaml"
    config.write_text(yaml.safe_dump(our_config(half_life)))
    try:
        reconciler = ours.start_reconciler(cluster, logdir=logdir, extra_args=[f"--config={config}"])
    except BaseException:
        webhook.stop()
        raise
    return [webhook, reconciler]


START_LOCK: Final = threading.Lock()
#: set by ``--events``: every run's whole timeline goes into the results
KEEP_EVENTS: Final = threading.Event()


def log_notes(procs: list[Any]) -> dict[str, Any]:
    """What the controllers' logs say that bears on the figures: Kueue's error lines, our
    configuration warnings (an unknown ``usageHalfLife`` before usage history existed)."""
    out: dict[str, Any] = {}
    for proc in procs:
        text = proc.log.read_text(errors="replace") if proc.log.is_file() else ""
        if proc.name == "kueue":
            errors = [line for line in text.splitlines() if '"level":"error"' in line]
            out["kueue_errors"] = len(errors)
            # as in bench_kueue.py: the cert rotator finds no webhook configuration to inject into
            out["kueue_error_messages"] = sorted(
                {json.loads(line).get("msg", "") for line in errors if line.startswith("{")}
            )
        elif proc.name == "reconciler":
            out["config_notes"] = [line[-200:] for line in text.splitlines() if "usageHalfLife" in line][:5]
    return out


def run_one(system: str, story: Story, build: Any, abort: threading.Event) -> dict[str, Any]:
    """One system, one story, one fresh control plane; torn down whatever happens."""
    from testenv.cluster import LocalCluster

    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"kq-bench-fair-{story.name}-{system}-"))
    cluster = LocalCluster(profile="e2e", workdir=workdir / "cp", nodes=0, pod_duration_s=story.duration_s)
    procs: list[Any] = []
    t0 = time.monotonic()
    try:
        with START_LOCK:
            if abort.is_set():
                raise KeyboardInterrupt
            cluster.start()
            create_nodes(cluster, story.gpus)
            procs = start_system(cluster, system, story, workdir, build)
        started_s = round(time.monotonic() - t0, 1)
        print(f"  [{story.name}/{system}] up in {started_s}s; A submits {story.a_jobs} jobs", flush=True)
        run = asyncio.run(drive(cluster, system, story, abort, KEEP_EVENTS.is_set()))
        return {
            "system": system,
            "half_life": story.shown_half_life(system),
            "start_s": started_s,
            "versions": ba.versions(cluster),
            **run,
            **log_notes(procs),
        }
    except BaseException as err:
        print(f"  [{story.name}/{system}] failed: {err!r}\n{cluster.logs()[-3000:]}", flush=True)
        for proc in procs:
            print(f"--- {proc.name} ---\n{proc.tail(30)}", flush=True)
        return {"system": system, "error": repr(err)}
    finally:
        for proc in reversed(procs):
            proc.stop()
        cluster.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


# --- the machine ------------------------------------------------------------------------------------


def cpu_snapshot() -> dict[int, tuple[str, int, float]]:
    """Every process: (command, parent pid, CPU seconds so far), from ``/proc``."""
    out: dict[int, tuple[str, int, float]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            out[int(entry.name)] = (comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / ba.TICKS)
    return out


def own_cpu_s() -> float:
    """CPU seconds of this process and of every child it has waited for: the control planes and
    the systems it started and stopped (each spawned by this process)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def machine_load(
    before: dict[int, tuple[str, int, float]], busy0: float, own0: float, seconds: float
) -> dict[str, Any]:
    """CPU cores used during a story by this invocation (itself and the processes it started, all
    stopped by now) and by everything else on the machine; the others' busiest commands among the
    processes that lived through the whole story."""
    now = cpu_snapshot()
    mine = own_cpu_s() - own0
    busy = ba.machine_cpu()["busy"] - busy0
    others: dict[str, float] = {}
    for pid, (comm, _, cpu) in now.items():
        if pid in before and pid != os.getpid() and cpu > before[pid][2]:
            others[comm] = others.get(comm, 0.0) + cpu - before[pid][2]
    top = sorted(others.items(), key=lambda kv: -kv[1])[:8]
    return {
        "seconds": round(seconds, 1),
        "busy_cores": round(busy / seconds, 2),
        "this_run_cores": round(mine / seconds, 2),
        "other_cores": round(max(0.0, busy - mine) / seconds, 2),
        "other_top_cores": {k: round(v / seconds, 3) for k, v in top if v / seconds >= 0.005},
        "loadavg_after": ba.loadavg(),
    }


def git(*argv: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=False)
    return done.stdout.rstrip()


def history_supported() -> bool:
    """Does this checkout's reconciler know usage history (its ``--usage-half-life`` flag)?"""
    return ba._accepts("--usage-half-life=1m")


# --- the comparison ---------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


BURST_COLUMNS: Final = (
    ("B queued s", "b_queued_s"),
    ("next slot freed s", "next_slot_freed_s"),
    ("next pod done s", "next_pod_done_s"),
    ("B 1st admitted s", "b_first_admitted_s"),
    ("B 1st running s", "b_first_running_s"),
    ("free at B", "free_at_b"),
    ("A admitted before", "a_admitted_before_b"),
    ("slots freed until", "slots_freed_until_b_admitted"),
    ("B share running s", "b_share_running_s"),
    ("within D", "b_share_within_one_duration"),
)
HISTORY_COLUMNS: Final = (
    ("B of first K", "b_fraction_first_k"),
    ("B holds N/2 s", "b_holds_half_s"),
    ("B of K after", "b_fraction_k_after_half"),
    ("B peak held", "b_peak_held"),
    ("B by window of N", "b_fraction_by_window"),
)


def table(story: Story, rows: list[dict[str, Any]]) -> str:
    """One printed table: a row per system, the story's figures as columns, then each order."""
    columns = BURST_COLUMNS if story.name == "burst" else HISTORY_COLUMNS
    head = ["system", "half-life", *(c for c, _ in columns)]
    body = []
    for row in rows:
        fig = row.get("figures") or {}
        body.append([row["system"], cell(row.get("half_life")), *(cell(fig.get(k)) for _, k in columns)])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in [head, *body]]
    for row in rows:
        order = (row.get("figures") or {}).get("order_after_b")
        lines.append(f"  {row['system']}: {row.get('error') or 'admissions after B: ' + str(order)}")
    return "\n".join(lines)


def stories(args: argparse.Namespace) -> list[Story]:
    scale = args.scale
    common = {
        "gpus": args.gpus,
        "a_jobs": args.a_jobs,
        "duration_s": args.duration * scale,
        "jitter": args.jitter,
        "sampling_s": args.sampling * scale,
        "seed": args.seed,
    }
    out = []
    for name in args.stories.split(","):
        if name == "burst":
            burst = {
                "b_jobs": args.b_jobs,
                "b_after_s": args.b_after * scale,
                "burst_half_life_s": args.burst_half_life,
            }
            out.append(Story("burst", **burst, **common))
        elif name == "history":
            half = args.half_life * scale
            out.append(
                Story(
                    "history",
                    b_jobs=3 * args.gpus,
                    b_after_s=args.alone_half_lives * half,
                    half_life_s=half,
                    k=args.k or 2 * args.gpus,
                    deadline_durations=5.0,
                    **common,
                )
            )
    return out


def run_story(story: Story, systems: list[str], build: Any, parallel: int) -> list[dict[str, Any]]:
    """Every system's run of a story, ``parallel`` at a time; Ctrl-C ends them all, torn down."""
    abort = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel or len(systems)) as pool:
        futures = [pool.submit(run_one, s, story, build, abort) for s in systems]
        try:
            while not all(f.done() for f in futures):
                concurrent.futures.wait(futures, timeout=1.0)
        except KeyboardInterrupt:
            abort.set()
            concurrent.futures.wait(futures)
            raise
    return [f.result() for f in futures]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stories", default="burst,history", help="burst, history, comma separated")
    parser.add_argument("--burst-systems", default=",".join(DEFAULT_SYSTEMS["burst"]))
    parser.add_argument("--history-systems", default=",".join(DEFAULT_SYSTEMS["history"]))
    parser.add_argument("--gpus", type=int, default=20, help="N: the parent's GPUs (default %(default)s)")
    parser.add_argument("--a-jobs", type=int, default=300, help="team A's jobs (default %(default)s)")
    parser.add_argument("--b-jobs", type=int, default=10, help="team B's jobs, burst (default %(default)s)")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="mean job run time, s (default %(default)s)"
    )
    parser.add_argument("--jitter", type=float, default=0.25, help="run time x uniform [1-j, 1+j]")
    parser.add_argument("--b-after", type=float, default=60.0, help="burst: B submits this long after A, s")
    parser.add_argument("--half-life", type=float, default=60.0, help="history: usage half-life, s")
    parser.add_argument(
        "--burst-half-life", type=float, default=3600.0, help="burst: Kueue's half-life, s (ours' default 1h)"
    )
    parser.add_argument("--alone-half-lives", type=float, default=3.0, help="history: A alone this long")
    parser.add_argument("--sampling", type=float, default=5.0, help="Kueue's usageSamplingInterval, s")
    parser.add_argument("--k", type=int, default=0, help="history: admissions counted (default 2N)")
    parser.add_argument("--scale", type=float, default=1.0, help="every time above x this")
    parser.add_argument("--parallel", type=int, default=0, help="runs at once (0: all of a story)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="times x 0.25, 150 jobs of A")
    parser.add_argument(
        "--out", default="", help="results file (default bench/results/fairness[-quick].json)"
    )
    parser.add_argument("--events", action="store_true", help="keep every run's timeline in the results")
    args = parser.parse_args()
    if args.events:
        KEEP_EVENTS.set()
    if args.quick:
        args.scale, args.a_jobs = 0.25 * args.scale, min(args.a_jobs, 150)
    chosen = {"burst": args.burst_systems.split(","), "history": args.history_systems.split(",")}
    if set(chosen["burst"] + chosen["history"]) - set(SYSTEMS) or args.gpus < 2:
        parser.error(f"systems are {', '.join(SYSTEMS)}; --gpus at least 2")
    plan = stories(args)
    out_path = (
        pathlib.Path(args.out).resolve()
        if args.out
        else ba.RESULTS / ("fairness-quick.json" if args.quick else "fairness.json")
    )
    build = bk.build_kueue() if any(s.startswith("kueue") for st in plan for s in chosen[st.name]) else None
    os.chdir(tempfile.mkdtemp(prefix="kq-bench-fair-cwd-"))  # a neutral working directory for every process
    summary: dict[str, Any] = {
        "commit": git("rev-parse", "HEAD"),
        "commit_subject": git("log", "-1", "--format=%s")[:200],
        # tracked files that differ from the commit: what ran was the working tree
        "uncommitted_changes": [line[3:] for line in git("status", "--porcelain", "-uno").splitlines()],
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "history_supported": history_supported(),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "machine": ba.machine(),
        "kueue": {"version": bk.KUEUE_VERSION, "qps": 50.0, "burst": 100},
        "parallel": args.parallel or "all runs of a story at once",
        "stories": {},
    }
    for story in plan:
        systems = chosen[story.name]
        print(f"== {story.name}: {dataclasses.asdict(story)}; systems {systems}", flush=True)
        before, busy0, own0, t0 = cpu_snapshot(), ba.machine_cpu()["busy"], own_cpu_s(), time.monotonic()
        rows = run_story(story, systems, build, args.parallel)
        load = machine_load(before, busy0, own0, time.monotonic() - t0)
        print(table(story, rows), flush=True)
        print(f"  machine during the story: {load}", flush=True)
        summary["stories"][story.name] = {
            "story": dataclasses.asdict(story),
            "machine_load": load,
            "runs": rows,
        }
        out_path.write_text(
            json.dumps(summary, indent=1) + "\n"
        )  # after every story: partial results survive
    print(f"  written to {out_path}", flush=True)


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C: every run's control plane and controllers are torn down.
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        main()
