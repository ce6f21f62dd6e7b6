"""``shared.core.explain``: why a unit waits, read from the scheduler's own cycle over what a reader sees.

Each waiting reason the scheduler produces is set up as a table of units, quotas and Queues, and the
explanation must name it with the scheduler's own text and the structured facts behind it; a
partial view (a namespace user's) must say what it does not know and fall back on the reason the
scheduler recorded instead of guessing. Also: the per-level quota figures come from
``UsageView.check``, ``position`` numbers Intelligent's sub-queues like ``queue_item_details``, and
``quota_rows`` gives the tree with usage and waiting work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from koord_queue.cli import client, commands, completion, render
from koord_queue.shared.api import durations, model, names, parsing
from koord_queue.shared.api.names import Message
from koord_queue.shared.core import explain, reasons, replay
from koord_queue.shared.core.reasons import Reason
from koord_queue.shared.jobs.running_timeout import RunningTimeout

NOW = 1_800_000_000.0
T0 = "2027-01-01T00:00:00Z"


def unit(
    name: str,
    quota: str | None,
    *,
    priority: int = 0,
    phase: str = "",
    admitted: int = 0,
    running: int = 0,
    reclaim: int | None = None,
    ns: str = "ns",
    active: bool = True,
    created: str = T0,
    cpu: str = "1",
    message: str = "",
    checks: list[dict[str, str]] | None = None,
) -> model.Unit:
    raw: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{ns}-{name}",
            "creationTimestamp": created,
            "labels": {names.QUOTA_NAME_LABEL: quota} if quota else {},
        },
        "spec": {
            "priority": priority,
            "active": active,
            "podSet": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
                    },
                }
            ],
        },
        "status": {"phase": phase, "message": message, "admissionChecks": checks or []},
    }
    if admitted:
        adm: dict[str, Any] = {"name": "main", "replicas": admitted, "running": running}
        if reclaim is not None:
            adm["reclaimState"] = {"replicas": reclaim}
        raw["status"]["admissions"] = [adm]
        raw["status"]["lastAllocateTime"] = created
    return parsing.parse_unit(raw)


def quota(
    name: str,
    cpu: str,
    *,
    parent: str = "",
    ns: str = "ns",
    policy: str = "",
    ann: dict[str, str] | None = None,
) -> model.Quota:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    if policy:
        labels[names.QUEUE_POLICY_LABEL] = policy
    return parsing.parse_quota(
        {
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "annotations": ann or {},
                "creationTimestamp": T0,
            },
            "spec": {"max": {"cpu": cpu}, "min": {"cpu": cpu}},
        }
    )


def queue(
    name: str, policy: str = "Priority", ann: dict[str, str] | None = None, checks: list[str] = ()
) -> model.QueueConfig:  # type: ignore[assignment]
    spec: dict[str, Any] = {"queuePolicy": policy}
    if checks:
        spec["admissionChecks"] = [{"name": c} for c in checks]
    return parsing.parse_queue({"metadata": {"name": name, "annotations": ann or {}}, "spec": spec})


def view(
    units: list[model.Unit], quotas: list[model.Quota], queues: list[model.QueueConfig], **kw: Any
) -> replay.View:
    kw.setdefault("complete", True)
    kw.setdefault("running_timeout", RunningTimeout())
    return replay.View(units={u.key: u for u in units}, quotas=quotas, queues=queues, **kw)


PREEMPT = {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", names.ENABLE_PREEMPTION_ANNOTATION: "true"}


def test_quota_full_at_its_own_level_with_the_chain_figures_and_holders() -> None:
    units = [unit("holder", "q", priority=5, phase="Dequeued", admitted=1, running=1), unit("w", "q")]
    e = explain.explain(view(units, [quota("q", "1")], [queue("q")]), "ns/w", NOW)
    assert (e.reason, e.refusing_quota, e.refusing_resource) == (Reason.QUOTA, "q", "cpu")
    assert e.message == Message.limited("q", "cpu") + Message.PREEMPT_FAILED_SUFFIX
    (level,) = e.levels
    assert (level.max, level.used, level.free, level.refuses) == (
        {"cpu": 1000},
        {"cpu": 1000},
        {"cpu": 0},
        True,
    )
    assert [h.key for h in e.holders] == ["ns/holder"]
    assert e.position == 1 and e.waiting == 1
    assert "q has max 1 and 1 in use" in e.summary
    assert e.preemption == "preemption is disabled because wait-for-pods-running is disabled"


def test_quota_full_at_a_parent_names_the_level_that_refuses() -> None:
    units = [unit("holder", "c1", phase="Dequeued", admitted=1, running=1), unit("w", "c2")]
    quotas = [quota("p", "1"), quota("c1", "1", parent="p"), quota("c2", "4", parent="p")]
    e = explain.explain(view(units, quotas, [queue("c1"), queue("c2")]), "ns/w", NOW)
    assert (e.reason, e.refusing_quota) == (Reason.PARENT_QUOTA, "p")
    assert [(lv.name, lv.refuses) for lv in e.levels] == [("c2", False), ("p", True)]
    assert [h.key for h in e.holders] == ["ns/holder"]


def test_a_parent_the_reader_cannot_read_is_a_placeholder_and_the_recorded_reason_wins() -> None:
    recorded = Message.limited("p", "cpu") + Message.PREEMPT_FAILED_SUFFIX
    units = [unit("w", "c2", message=recorded)]
    v = view(
        units,
        [quota("c2", "4", parent="p")],
        [],
        complete=False,
        unreadable_quotas=frozenset({"p"}),
        queues_known=False,
    )
    e = explain.explain(v, "ns/w", NOW)
    assert (e.reason, e.refusing_quota) == (Reason.PARENT_QUOTA, "p")
    assert [(lv.name, lv.readable, lv.refuses) for lv in e.levels] == [
        ("c2", True, False),
        ("p", False, None),
    ]
    assert any("other namespaces" in u for u in e.unknowns)
    assert any("could not be read" in u for u in e.unknowns)


def test_a_blocked_queue_names_the_unit_at_its_head() -> None:
    units = [
        unit("holder", "q", priority=9, phase="Dequeued", admitted=1, running=1),
        unit("big", "q", priority=5, cpu="2"),
        unit("small", "q", priority=1),
    ]
    e = explain.explain(view(units, [quota("q", "2")], [queue("q", "Block")]), "ns/small", NOW)
    assert e.reason is Reason.BLOCKED and e.message == Message.BLOCKED_BY_HIGHER
    assert [a.key for a in e.ahead] == ["ns/big"] and "big is at the head" in e.summary


def test_wait_for_pods_running_holds_the_queue() -> None:
    units = [unit("a", "q", priority=9, phase="Dequeued", admitted=1, running=0), unit("b", "q", priority=1)]
    hold = {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true"}
    e = explain.explain(view(units, [quota("q", "4")], [queue("q", ann=hold)]), "ns/b", NOW)
    assert e.reason is Reason.HELD and "a" in e.summary


def test_a_reserved_unit_waits_for_its_admission_checks() -> None:
    checks = [{"name": "budget", "state": "Pending"}, {"name": "ok", "state": "Ready"}]
    u = unit("c", "q", phase="Reserved", admitted=1, checks=checks)
    e = explain.explain(view([u], [quota("q", "4")], [queue("q", checks=["budget", "ok"])]), "ns/c", NOW)
    assert e.reason is Reason.ADMISSION_CHECK and "budget (Pending)" in e.summary and "ok" not in e.summary
    assert e.checks == (("budget", "Pending", ""), ("ok", "Ready", ""))


def test_a_preemption_in_progress_is_seen_from_the_victims_reclaim_state() -> None:
    units = [
        unit("low", "q", priority=1, phase="Dequeued", admitted=1, reclaim=1),
        unit("high", "q", priority=10, message=Message.limited("q", "cpu") + Message.PREEMPT_SUCCEED_SUFFIX),
    ]
    e = explain.explain(
        view(units, [quota("q", "1", ann=PREEMPT)], [queue("q", ann=PREEMPT)]), "ns/high", NOW
    )
    assert e.reason is Reason.PREEMPTOR
    assert e.round is not None and e.round.victims == (("ns/low", 1),)
    assert e.message.endswith(Message.PREEMPT_SUCCEED_SUFFIX) and "low (1 replica(s))" in e.summary
    victim = explain.explain(
        view(units, [quota("q", "1", ann=PREEMPT)], [queue("q", ann=PREEMPT)]), "ns/low", NOW
    )
    assert victim.reason is Reason.RECLAIMING


def test_a_unit_behind_a_preemptor_waits_for_its_round() -> None:
    recorded = Message.queue_preempting("q")
    e = explain.explain(
        view([unit("w", "q", message=recorded)], [quota("q", "1")], [queue("q")], complete=False), "ns/w", NOW
    )
    # The replay alone says it fits; the scheduler's recorded word is kept for a partial view.
    assert e.reason is Reason.PREEMPTING and e.replay_agrees is False


def test_inactive_not_bound_invalid_and_queue_not_found() -> None:
    inactive = explain.explain(
        view([unit("w", "q", active=False)], [quota("q", "4")], [queue("q")]), "ns/w", NOW
    )
    assert inactive.reason is Reason.INACTIVE and names.ACTIVE_ANNOTATION in inactive.next_steps[0]
    other = explain.explain(
        view([unit("w", "q", ns="elsewhere")], [quota("q", "4")], [queue("q")]), "elsewhere/w", NOW
    )
    assert other.reason is Reason.NOT_BOUND and other.message.startswith('quota "q" is not bound')
    lost = explain.explain(view([unit("w", "nope")], [quota("q", "4")], [queue("q")]), "ns/w", NOW)
    assert lost.reason is Reason.QUEUE_NOT_FOUND and lost.message == Message.queue_not_exist("nope")
    missing = view(
        [unit("w", "x")], [], [], complete=False, queue_missing=frozenset({"x"}), queues_known=False
    )
    assert explain.explain(missing, "ns/w", NOW).reason is Reason.QUEUE_NOT_FOUND


def test_beyond_max_depth_fits_next_cycle_and_not_waiting_states() -> None:
    depth = {names.MAX_DEPTH_ANNOTATION: "1"}
    units = [unit("a", "q", priority=9, cpu="8"), unit("b", "q", priority=1)]
    e = explain.explain(view(units, [quota("q", "4")], [queue("q", ann=depth)]), "ns/b", NOW)
    assert e.reason is Reason.BEYOND_DEPTH
    fits = explain.explain(view([unit("w", "q")], [quota("q", "4")], [queue("q")]), "ns/w", NOW)
    assert fits.reason is Reason.NEXT_CYCLE
    timeout = RunningTimeout(running_timeout=600.0)
    admitted = [unit("r", "q", phase="Dequeued", admitted=1, running=0)]
    e = explain.explain(view(admitted, [quota("q", "4")], [queue("q")], running_timeout=timeout), "ns/r", NOW)
    assert e.reason is Reason.ADMITTED and e.timeout_at == durations.parse_time(T0) + 600.0  # type: ignore[operator]
    done = [unit("d", "q", phase="Succeed")]
    assert explain.explain(view(done, [quota("q", "4")], [queue("q")]), "ns/d", NOW).reason is Reason.FINISHED
    bare = [unit("n", None)]
    assert explain.explain(view(bare, [], []), "ns/n", NOW).reason is Reason.NO_QUOTA_LABEL


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (Message.limited("q", "cpu"), Reason.QUOTA),
        (Message.limited("p", "memory") + Message.PREEMPT_FAILED_SUFFIX, Reason.PARENT_QUOTA),
        (Message.limited("q", "cpu") + Message.PREEMPT_SUCCEED_SUFFIX, Reason.PREEMPTOR),
        (Message.quota_spec_empty("q"), Reason.QUOTA_STRUCTURE),
        (Message.quota_missing("ns/w", "p", ["q"]), Reason.QUOTA_STRUCTURE),
        (Message.waiting_for_victims(["a", "b"]), Reason.PREEMPTOR),
        (Message.queue_preempting("q"), Reason.PREEMPTING),
        (Message.queue_not_exist("q"), Reason.QUEUE_NOT_FOUND),
        (Message.BLOCKED_BY_HIGHER, Reason.BLOCKED),
        (Message.NO_MORE_IN_QUEUE, Reason.HELD),
        (Message.NO_QUOTA_LABEL, Reason.NO_QUOTA_LABEL),
        ("waiting in queue q: position is beyond the queue's max-depth 3", Reason.BEYOND_DEPTH),
        (names.quota_not_bound_message("q", "ns", ["a"]), Reason.NOT_BOUND),
    ],
)
def test_classify_maps_every_scheduler_text(text: str, reason: Reason) -> None:
    found = reasons.classify(text, "q")
    assert found is not None and found.reason is reason
    assert reasons.classify("", "q") is None and reasons.classify("Enqueued", "q") is None


def test_position_numbers_the_high_sub_queue_first() -> None:
    intelligent = queue("q", "Intelligent")
    units = [unit("lo", "q", priority=1), unit("hi", "q", priority=9), unit("hold", "q", priority=9, cpu="8")]
    cache, _ = replay.replay(view(units, [quota("q", "4")], [intelligent]), NOW)
    state = cache.state.queues["q"]
    assert explain.position(state, "ns/hi") == (1, 3)
    assert explain.position(state, "ns/hold") == (2, 3)
    assert explain.position(state, "ns/lo") == (3, 3)
    assert explain.position(state, "ns/absent") is None


def test_quota_rows_give_the_tree_with_usage_borrowing_and_waiting_work() -> None:
    units = [
        unit("a", "leaf", phase="Dequeued", admitted=1, running=1, cpu="2"),
        unit("b", "leaf"),
        unit("c", "leaf", cpu="2"),
    ]
    quotas = [quota("root", "4"), quota("leaf", "2", parent="root")]
    rows = replay.quota_rows(view(units, quotas, []))
    assert [(r.name, r.depth, r.used, r.waiting, r.waiting_request, r.admitted) for r in rows] == [
        ("root", 0, {"cpu": 2000}, 0, {}, 0),
        ("leaf", 1, {"cpu": 2000}, 2, {"cpu": 3000}, 1),
    ]
    over = replay.quota_rows(
        view([unit("x", "small", phase="Dequeued", admitted=1, cpu="3")], [quota("small", "4")], [])
    )
    assert over[0].over_min == {}


# --- the plugin's pure parts -------------------------------------------------------------------------


def test_short_reason_and_age_and_table() -> None:
    waiting = unit("w", "q", message=Message.limited("p", "cpu"))
    assert commands.short_reason(waiting) == "no room in parent quota p for cpu"
    assert (
        commands.short_reason(unit("h", "q", active=False))
        == "inactive: held (scheduling.x-k8s.io/active=false)"
    )
    assert [render.age(s) for s in (5, 192, 3700, 90000, None)] == ["5s", "3m12s", "1h1m", "1d1h", "-"]
    assert render.table(["A", "BB"], [["xyz", "1"]]) == "A     BB\nxyz   1"
    assert render.Style(False)("x", "red") == "x" and render.Style(True)("x", "red") == "\033[31mx\033[0m"


def test_find_unit_by_unit_name_job_name_or_kind_and_name() -> None:
    def raw(name: str, kind: str, job: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"consumerRef": {"kind": kind, "name": job}},
        }

    units = {
        "ns/a": raw("a", "Job", "a"),
        "ns/b-tfjob": raw("b-tfjob", "TFJob", "b"),
        "ns/b": raw("b", "Job", "b"),
    }
    assert client.find_unit(units, "ns", "a") is units["ns/a"]
    assert client.find_unit(units, "ns", "tfjob/b") is units["ns/b-tfjob"]
    assert client.find_unit(units, "ns", "job/b") is units["ns/b"]
    with pytest.raises(client.CliError, match="ambiguous"):
        client.find_unit(units, "ns", "b")
    with pytest.raises(client.NotFoundError):
        client.find_unit(units, "ns", "zzz")


def test_rbac_refusals_name_the_missing_permission() -> None:
    from koord_queue.shared import kube

    err = kube.KubeError(403, "Forbidden", 'User "alice" cannot list resource "queueunits" in API group "x"')
    failure = client.denied(err, "list", client.QUEUE_UNITS, "team")
    assert isinstance(failure, client.Denied) and failure.code == 4
    assert (
        'verb "list" on resource "queueunits" in API group "scheduling.x-k8s.io" in namespace "team"'
        in str(failure)
    )
    webhook = kube.KubeError(403, "Forbidden", 'admission webhook "x" denied the request: too high')
    assert isinstance(client.denied(webhook, "patch", client.QUEUE_UNITS, "team"), client.Refused)


def test_completion_candidates() -> None:
    assert completion.answer(["qu"]) == "quotas\n:4\n"
    assert completion.answer(["list", "--phase", "En"]) == "Enqueued\n:4\n"
    assert completion.answer(["completion", ""]) == "bash\nzsh\n:4\n"
    assert completion.answer(["-n", ""]) == ":4\n"


def test_the_krew_manifest_names_the_installed_plugin() -> None:
    import tomllib
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    manifest = yaml.safe_load((root / "plugins" / "krew" / "koord-queue.yaml").read_text())
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "koord-queue"
    (platform,) = manifest["spec"]["platforms"]
    # kubectl maps `kubectl koord-queue` to the executable kubectl-koord_queue (dashes -> underscores).
    assert platform["bin"] == "kubectl-" + manifest["metadata"]["name"].replace("-", "_")
    assert platform["bin"] in scripts and "kubectl_complete-koord_queue" in scripts
    assert len(platform["sha256"]) == 64


def test_a_non_preempting_unit_is_told_it_waits_for_room_not_that_preemption_failed() -> None:
    units = [
        unit("holder", "q", priority=0, phase="Dequeued", admitted=1, running=0),
        dataclasses.replace(unit("w", "q", priority=5), preemption_policy="Never"),
    ]
    e = explain.explain(view(units, [quota("q", "1")], [queue("q", ann=PREEMPT)]), "ns/w", NOW)
    assert e.message.endswith(names.NON_PREEMPTING_SUFFIX)
    assert e.reason is Reason.QUOTA
    assert any("it does not preempt (preemptionPolicy Never)" in step for step in e.next_steps)
    assert reasons.classify(e.message, "q") == reasons.Classified(
        Reason.QUOTA, quota="q", resource="cpu", preempt="never"
    )
