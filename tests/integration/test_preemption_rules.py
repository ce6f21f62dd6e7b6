"""Queue-level preemption rules, black box against the real apiserver with the reconciler running.

One test per row of the troubleshooting table (docs/operations.md#preemption-not-happening), and the
scenarios of docs/compatibility.md#scenario-list S3 (filter-path preemption), S4 (reserve-path
preemption, Priority and Block) and S5 (the victim is admitted again after its reclaim), plus the dry
run's victim choice (the shortest lowest-priority-first prefix) and the one-round-per-queue rule. The
units are bare QueueUnits: the test plays the job extension by patching ``status.admissions``
(docs/compatibility.md#acceptance-scenarios: the scheduler must honour that).

"Never marked" is asserted on every recorded version of the victim (``tests.kube.Recorder``), after
a positive signal that the scheduler evaluated the preemptor (its parked message) and a barrier
that proves the recorder has caught up with that signal.

The reclaim protect time needs a reconciler started with ``--config``; the session's reconciler
runs without one, and two reconcilers on one cluster would fight, so those tests run on a control
plane of their own (class-scoped, stopped as soon as they are done).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from koord_queue.shared.api import names
from koord_queue.shared.api.names import ConditionType, EventReason, Message
from koord_queue.shared.core.preemption import INTELLIGENT_UNSUPPORTED
from testenv import scraping, system
from testenv.cluster import LocalCluster
from tests import kube
from tests.integration import preemption_helpers as h
from tests.integration.preemption_helpers import Bench

pytestmark = pytest.mark.integration

PROTECT_SECONDS = 4


def limited(quota: str) -> str:
    return Message.limited(quota, "cpu")


@pytest.fixture
async def pb(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> AsyncIterator[Bench]:
    async with h.bench(integration_cluster, namespace_in) as it:
        yield it


async def admit_victim(pb: Bench, quota: str, *, cpu: str) -> dict[str, object]:
    """The low-priority unit is admitted (S3 step 1): Dequeued, replicas 1, no reclaimState."""
    await pb.create("victim", quota=quota, cpu=cpu, priority=10)
    got = await pb.admitted("victim")
    assert h.admissions(got)[0].get("running", 0) == 0
    return got


# --- the troubleshooting table -------------------------------------------------------------------


async def test_without_wait_for_pods_running_no_victim_is_ever_marked(pb: Bench) -> None:
    q = await pb.make_quota("nowait", cpu="2", annotations={names.ENABLE_PREEMPTION_ANNOTATION: "true"})
    await admit_victim(pb, q, cpu="2")
    await pb.create("preemptor", quota=q, cpu="2", priority=100)

    got = await pb.parked("preemptor", lambda m: m.startswith(limited(q)), what="parked by the quota filter")
    assert h.message(got) == limited(q) + Message.PREEMPT_FAILED_SUFFIX
    await pb.caught_up()
    pb.assert_never_marked("victim")
    assert h.is_admitted(await pb.get("victim"))
    await pb.assert_waiting("preemptor")


async def test_without_enable_queueunit_preemption_the_preempt_path_never_runs(pb: Bench) -> None:
    q = await pb.make_quota("noenable", cpu="2", annotations={names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"})
    victim = await admit_victim(pb, q, cpu="2")
    await pb.create("preemptor", quota=q, cpu="2", priority=100)

    got = await pb.parked("preemptor", lambda m: m.startswith(limited(q)), what="parked by the quota filter")
    assert h.message(got) == limited(q) + Message.PREEMPT_FAILED_SUFFIX
    await pb.caught_up()
    pb.assert_never_marked("victim")
    now = await pb.get("victim")
    assert h.status(now)["admissions"] == h.status(victim)["admissions"]
    assert h.message(now) == Message.DEQUEUED
    await pb.assert_waiting("preemptor")


async def test_the_intelligent_policy_rejects_preemption_and_marks_nothing(pb: Bench) -> None:
    q = await pb.make_quota("intelligent", cpu="2", policy="Intelligent")
    await admit_victim(pb, q, cpu="2")
    await pb.create("preemptor", quota=q, cpu="2", priority=100)

    got = await pb.parked("preemptor", lambda m: m.startswith(limited(q)), what="parked by the quota filter")
    assert h.message(got) == limited(q) + Message.PREEMPT_FAILED_SUFFIX
    event = await pb.event("preemptor", EventReason.FAILED_SCHEDULING, type_="Warning")
    assert event.message == h.message(got)
    await pb.caught_up()
    pb.assert_never_marked("victim")
    await pb.assert_waiting("preemptor")
    queue = await pb.get_queue(q)
    assert queue is not None and queue["spec"]["queuePolicy"] == "Intelligent"


@pytest.mark.parametrize("path", ["preempt", "reserve"])
async def test_a_unit_whose_pods_all_run_is_never_reclaimed(pb: Bench, path: str) -> None:
    # preempt: the quota is full, the filter fails; reserve: the quota has room.
    q = await pb.make_quota(f"running-{path}", cpu="2" if path == "preempt" else "4")
    await admit_victim(pb, q, cpu="2")
    await pb.set_running("victim", 1)  # every admitted replica is bound and runs
    await pb.create("preemptor", quota=q, cpu="2", priority=100)

    if path == "preempt":
        got = await pb.parked("preemptor", lambda m: m.startswith(limited(q)), what="parked by the filter")
        assert h.message(got) == limited(q) + Message.PREEMPT_FAILED_SUFFIX
        await pb.assert_waiting("preemptor")
    else:
        await pb.admitted("preemptor")  # nothing to wait for: a running unit does not hold the queue
    await pb.caught_up()
    pb.assert_never_marked("victim")
    now = await pb.get("victim")
    assert h.admissions(now) == [{"name": "victim", "replicas": 1, "running": 1}]


async def test_the_preemptor_stays_enqueued_until_the_freed_quota_is_reported(pb: Bench) -> None:
    q = await pb.make_quota("async", cpu="2")
    await admit_victim(pb, q, cpu="2")
    await pb.create("preemptor", quota=q, cpu="2", priority=100)
    await pb.wait("victim", h.is_marked, what="marked for reclaim")

    # A positive signal that the scheduler ran on this queue while the victim was marked: a unit
    # created after the mark is parked (behind the preemptor, whose round is in progress).
    await pb.create("probe", quota=q, cpu="1", priority=50)
    probe = limited(q) + Message.PREEMPT_FAILED_SUFFIX
    await pb.parked("probe", lambda m: m == probe, what="parked behind the preemptor's round")
    await pb.caught_up()
    waiting = await pb.assert_waiting("preemptor")
    assert h.message(waiting) == limited(q) + Message.PREEMPT_SUCCEED_SUFFIX
    assert h.is_marked(await pb.get("victim")), "the victim is marked until the job extension acts"
    assert pb.index("preemptor", lambda u: h.phase(u) == "Dequeued") is None

    # The job extension deletes the unbound pod and reports the freed quota.
    await pb.reclaim("victim")
    got = await pb.admitted("preemptor")
    assert h.admissions(got) == [{"name": "preemptor", "replicas": 1, "running": 0}]
    event = await pb.event("victim", EventReason.RECLAIMED, type_="Normal")
    assert event.message == Message.reclaimed_event("victim")

    await pb.caught_up()
    shrunk = pb.index("victim", lambda u: h.replicas(u) == 0 and not h.any_reclaim(u))
    admitted = pb.index("preemptor", lambda u: h.phase(u) == "Dequeued")
    assert shrunk is not None and admitted is not None and shrunk < admitted, (shrunk, admitted)
    await pb.assert_waiting("probe")


async def test_the_queue_stops_admitting_while_no_assumed_unit_is_reclaimable(pb: Bench) -> None:
    # The holder sorts before the newcomer, so it can never be the newcomer's victim.
    q = await pb.make_quota("held", cpu="4")
    await pb.create("holder", quota=q, cpu="1", priority=100)
    await pb.admitted("holder")
    await pb.create("newcomer", quota=q, cpu="1", priority=10)

    await pb.parked("newcomer", lambda m: m == Message.NO_MORE_IN_QUEUE, what="held by wait-for-pods-running")
    await pb.caught_up()
    pb.assert_never_marked("holder")
    await pb.assert_waiting("newcomer")

    await pb.set_running("holder", 1)  # its pods start: the queue moves on
    await pb.admitted("newcomer")


# --- S3, S4, S5 (docs/compatibility.md#scenario-list) -------------------------------------------


async def test_s3_filter_path_preemption_marks_the_victim(pb: Bench) -> None:
    q = await pb.make_quota("s3", cpu="2")
    await admit_victim(pb, q, cpu="2")
    created = await pb.create("preemptor", quota=q, cpu="2", priority=100)

    victim = await pb.wait("victim", h.is_marked, what="reclaimState.replicas == 1")
    assert h.phase(victim) == "Dequeued" and h.replicas(victim) == 1
    evicted = h.condition(victim, ConditionType.EVICTED)
    assert evicted is not None and evicted["status"] == "True" and evicted["reason"] == "Preempted", evicted
    admitted = h.condition(victim, ConditionType.ADMITTED)
    assert admitted is not None and (admitted["status"], admitted["reason"]) == ("False", "Preempted"), (
        admitted
    )
    event = await pb.event("victim", EventReason.PREEMPTED, type_="Warning")
    assert "preemptor" in event.message

    expected = limited(q) + Message.PREEMPT_SUCCEED_SUFFIX
    got = await pb.parked("preemptor", lambda m: m == expected, what="'; preempt succeed'")
    before = int(h.status(created).get("attempts") or 0)
    assert int(h.status(got).get("attempts") or 0) > before, h.status(got)
    await pb.assert_waiting("preemptor")
    await pb.caught_up()
    # The mark was written once: one reclaimState per admission, never re-marked.
    marks = [v for v in pb.history("victim") if h.any_reclaim(v)]
    assert {h.reclaim(v) for v in marks} == {1}


async def test_the_dry_run_marks_the_shortest_lowest_first_prefix_and_one_round_at_a_time(pb: Bench) -> None:
    q = await pb.make_quota("round", cpu="2")
    # Two assumed units. Under wait-for-pods-running a newcomer would take the reserve path
    # against an assumed unit, so "low" runs while "lowest" is admitted, then its pod is lost.
    await pb.create("low", quota=q, cpu="1", priority=20)
    await pb.admitted("low")
    await pb.set_running("low", 1)
    await pb.create("lowest", quota=q, cpu="1", priority=10)
    await pb.admitted("lowest")
    await pb.set_running("low", 0)

    # One CPU is asked for: the lowest unit alone covers it.
    await pb.create("first", quota=q, cpu="1", priority=100)
    await pb.wait("lowest", h.is_marked, what="marked for reclaim")
    await pb.parked(
        "first", lambda m: m == limited(q) + Message.PREEMPT_SUCCEED_SUFFIX, what="preempt succeed"
    )

    # A second preemptor while the round is in progress marks nothing.
    await pb.create("second", quota=q, cpu="1", priority=90)
    await pb.parked(
        "second", lambda m: m == limited(q) + Message.PREEMPT_FAILED_SUFFIX, what="preempt failed"
    )
    await pb.caught_up()
    pb.assert_never_marked("low")
    await pb.assert_waiting("first")

    # The reclaim lands and the first preemptor is admitted. (It may mark "low" on the reserve path
    # then, as "low" still holds the queue; the second preemptor never marked it.)
    await pb.reclaim("lowest")
    await pb.admitted("first")
    await pb.caught_up()
    shrunk = pb.index("lowest", lambda u: h.replicas(u) == 0)
    low_marked = pb.index("low", h.any_reclaim)
    assert shrunk is not None and (low_marked is None or low_marked > shrunk), (shrunk, low_marked)


@pytest.mark.parametrize("policy", ["Priority", "Block"])
async def test_s4_reserve_path_preemption_admits_the_preemptor_in_a_later_cycle(
    pb: Bench, policy: str
) -> None:
    q = await pb.make_quota(f"s4-{policy.lower()}", cpu="4", policy=policy)
    await admit_victim(pb, q, cpu="1")
    await pb.create("preemptor", quota=q, cpu="1", priority=100)

    await pb.wait("victim", h.is_marked, what="reclaimState.replicas == 1")
    got = await pb.admitted("preemptor")
    assert h.admissions(got) == [{"name": "preemptor", "replicas": 1, "running": 0}]
    # No reclaim was performed: the victim still holds its replica and its mark.
    assert h.is_marked(await pb.get("victim"))
    await pb.caught_up()
    marked = pb.index("victim", h.is_marked)
    admitted = pb.index("preemptor", lambda u: h.phase(u) == "Dequeued")
    assert marked is not None and admitted is not None and marked < admitted, (marked, admitted)
    # The preemptor's "waiting for queueUnit preempted" message is not asserted: when the next
    # cycle admits it while that message is still being written, the stale message is dropped.
    queue = await pb.get_queue(q)
    assert queue is not None and queue["spec"]["queuePolicy"] == policy


async def test_s5_the_victim_is_admitted_again_after_its_reclaim(pb: Bench) -> None:
    q = await pb.make_quota("s5", cpu="4")
    await admit_victim(pb, q, cpu="1")
    await pb.create("preemptor", quota=q, cpu="1", priority=100)
    await pb.wait("victim", h.is_marked, what="reclaimState.replicas == 1")
    await pb.admitted("preemptor")

    await pb.set_running("preemptor", 1)
    await pb.reclaim("victim")
    got = await pb.admitted("victim")
    assert h.admissions(got) == [{"name": "victim", "replicas": 1, "running": 0}]
    event = await pb.event("victim", EventReason.RECLAIMED, type_="Normal")
    assert event.message == Message.reclaimed_event("victim")
    await pb.caught_up()
    shrunk = pb.index("victim", lambda u: h.replicas(u) == 0 and not h.any_reclaim(u))
    again = pb.index("victim", h.is_admitted, after=shrunk)
    assert shrunk is not None and again is not None, [h.status(v) for v in pb.history("victim")]


# --- the reclaim protect time (a control plane of its own) ---------------------------------------


@pytest.fixture(scope="class")
def protect_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(profile="integration", workdir=tmp_path_factory.mktemp("protect-cp"))
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


@dataclass(frozen=True)
class ProtectSystem:
    logdir: Path
    metrics_port: int

    def log(self) -> str:
        return (self.logdir / "reconciler.log").read_text(errors="replace")

    def metric(self, name: str, queue: str) -> float:
        text = scraping.metrics_text(self.metrics_port)  # docs/operations.md#metrics
        for line in text.splitlines():
            if line.startswith(name + "{") and f'queue="{queue}"' in line:
                return float(line.rpartition(" ")[2])
        return 0.0


@pytest.fixture(scope="class")
def protect_system(
    protect_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProtectSystem]:
    """The webhook and a reconciler with ``--config`` (protect time) and ``-v 2`` (decision logs)."""
    logdir = tmp_path_factory.mktemp("protect-system")
    config = logdir / "koord-queue-config.yaml"
    config.write_text(
        "apiVersion: scheduling.k8s.io/v1\n"
        "kind: KoordQueueConfiguration\n"
        f"defaultReclaimProtectTime: {PROTECT_SECONDS}s\n"
    )
    processes = system.Processes()
    try:
        webhook, port = system.start_webhook(protect_cluster, logdir=logdir)
        processes.components.append(webhook)
        processes.webhook_port = port
        reconciler = system.start_reconciler(
            protect_cluster, logdir=logdir, extra_args=["--config", str(config), "-v", "2"]
        )
        processes.components.append(reconciler)
        yield ProtectSystem(logdir, reconciler.ports["metrics"])
        processes.check()
    finally:
        processes.stop()
        log = logdir / "reconciler.log"
        if log.exists():
            print("--- reconciler (protect time) ---\n" + "\n".join(log.read_text().splitlines()[-60:]))


@pytest.fixture
async def protected(protect_cluster: LocalCluster, protect_system: ProtectSystem) -> AsyncIterator[Bench]:
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    async with kube.client(protect_cluster) as api:
        await kube.create_namespace(api, namespace)
        try:
            async with h.bench(protect_cluster, namespace) as it:
                yield it
        finally:
            await kube.delete_namespace(api, namespace)


class TestReclaimProtectTime:
    """``defaultReclaimProtectTime: 4s``: a fresh admission is skipped, then becomes a victim."""

    @staticmethod
    def assert_marked_after_protection(pb: Bench, parked: int | None) -> None:
        first = pb.index("victim", h.any_reclaim)
        assert parked is not None and first is not None and parked < first, (parked, first)
        versions = pb.history("victim")
        allocated = h.stamp(next(v for v in versions if h.is_admitted(v)), "lastAllocateTime")
        marked = h.stamp(pb.recorder.seen[first][1], "lastUpdateTime")
        # Both stamps are whole seconds (metav1.Time); the mark is written at or after the end.
        assert marked - allocated >= PROTECT_SECONDS, (allocated, marked)

    async def test_filter_path_skips_a_fresh_admission_then_marks_it(
        self, protected: Bench, protect_system: ProtectSystem
    ) -> None:
        pb = protected
        q = await pb.make_quota("protect-filter", cpu="2")
        await admit_victim(pb, q, cpu="2")
        await pb.create("preemptor", quota=q, cpu="2", priority=100)

        failed = limited(q) + Message.PREEMPT_FAILED_SUFFIX
        await pb.parked("preemptor", lambda m: m == failed, what="'; preempt failed' while protected")
        await pb.wait("victim", h.is_marked, what="marked once protection ends", timeout=PROTECT_SECONDS + 15)
        succeed = limited(q) + Message.PREEMPT_SUCCEED_SUFFIX
        await pb.parked("preemptor", lambda m: m == succeed, what="'; preempt succeed'")
        await pb.caught_up()
        self.assert_marked_after_protection(pb, pb.index("preemptor", lambda u: h.message(u) == failed))
        assert protect_system.metric("koord_queue_preemption_rounds_total", q) == 1
        assert protect_system.metric("koord_queue_preemption_victims_total", q) == 1
        # Victim selection is logged at -v 2 with the queue name and both unit references.
        assert re.search(rf"queue {q}: {pb.ns}/preemptor preempts .*{pb.ns}/victim", protect_system.log())

    async def test_reserve_path_skips_a_fresh_admission_then_marks_it(self, protected: Bench) -> None:
        pb = protected
        q = await pb.make_quota("protect-reserve", cpu="4")
        await admit_victim(pb, q, cpu="1")
        await pb.create("preemptor", quota=q, cpu="1", priority=100)

        held = Message.NO_MORE_IN_QUEUE
        await pb.parked("preemptor", lambda m: m == held, what="held while the victim is protected")
        await pb.wait("victim", h.is_marked, what="marked once protection ends", timeout=PROTECT_SECONDS + 15)
        await pb.admitted("preemptor")
        await pb.caught_up()
        self.assert_marked_after_protection(pb, pb.index("preemptor", lambda u: h.message(u) == held))

    async def test_a_protection_skip_is_logged_at_v2_and_counted(
        self, protected: Bench, protect_system: ProtectSystem
    ) -> None:
        pb = protected
        q = await pb.make_quota("protect-log", cpu="2")
        await admit_victim(pb, q, cpu="2")
        await pb.create("preemptor", quota=q, cpu="2", priority=100)
        failed = limited(q) + Message.PREEMPT_FAILED_SUFFIX
        await pb.parked("preemptor", lambda m: m == failed, what="'; preempt failed' while protected")

        async def observed() -> bool:
            counted = protect_system.metric("koord_queue_preemption_protected_skips_total", q) >= 1
            pattern = rf"(?i)queue {q}:.*{pb.ns}/victim.*protect"
            return counted and re.search(pattern, protect_system.log()) is not None

        await kube.eventually(observed, timeout=3, what="the protection skip logged and counted")

    async def test_the_intelligent_rejection_error_is_logged_at_v2(
        self, protected: Bench, protect_system: ProtectSystem
    ) -> None:
        pb = protected
        q = await pb.make_quota("intelligent-log", cpu="2", policy="Intelligent")
        await admit_victim(pb, q, cpu="2")
        await pb.create("preemptor", quota=q, cpu="2", priority=100)
        failed = limited(q) + Message.PREEMPT_FAILED_SUFFIX
        await pb.parked("preemptor", lambda m: m == failed, what="parked by the quota filter")

        async def logged() -> bool:
            pattern = rf"queue {q}:.*{pb.ns}/preemptor.*{re.escape(INTELLIGENT_UNSUPPORTED)}"
            return re.search(pattern, protect_system.log()) is not None

        await kube.eventually(logged, timeout=3, what="the rejection error in the -v 2 log")
