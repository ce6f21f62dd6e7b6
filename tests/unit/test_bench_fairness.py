"""bench/bench_fairness.py, its pure parts: the objects and configurations each system gets, and the
figures computed from a run's timeline of watch events (hand-made timelines here, so every figure
is checked against a story whose answer is known)."""

from __future__ import annotations

import math

import yaml

from bench import bench_fairness as bf
from koord_queue.shared.api.durations import parse_duration
from koord_queue.shared.core import config
from testenv import kwok

GPU = "nvidia.com/gpu"
BURST = bf.Story("burst", gpus=4, a_jobs=12, b_jobs=3, duration_s=60.0, b_after_s=60.0)
HISTORY = bf.Story("history", gpus=4, a_jobs=40, b_jobs=12, duration_s=60.0, half_life_s=30.0, k=4)


# --- objects and configurations -----------------------------------------------------------------------


def test_job_durations_are_seeded_per_job_and_within_the_jitter() -> None:
    story = bf.Story("burst", a_jobs=50, b_jobs=10, duration_s=60.0, jitter=0.25)
    durations = bf.job_durations(story)
    assert sorted(durations) == sorted(bf.job_names("a", 50) + bf.job_names("b", 10))
    assert all(45.0 <= d <= 75.0 for d in durations.values())
    assert len(set(durations.values())) > 50  # jittered, not one wave
    assert bf.job_durations(story) == durations  # the same jobs, the same times, in every system
    # a job's time does not depend on how many jobs the story has
    assert bf.job_durations(bf.Story("burst", a_jobs=5, b_jobs=1))["a-0003"] == durations["a-0003"]


def test_a_job_asks_for_one_gpu_and_carries_its_run_time_and_its_team() -> None:
    ours = bf.job_body("b-0007", 63.25, kueue=False)
    theirs = bf.job_body("b-0007", 63.25, kueue=True)
    for body in (ours, theirs):
        pod = body["spec"]["template"]
        assert pod["metadata"]["annotations"] == {kwok.COMPLETE_DELAY_ANNOTATION: "63250ms"}
        assert pod["spec"]["containers"][0]["resources"]["requests"][GPU] == "1"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    assert ours["metadata"]["labels"] == {"quota.scheduling.koordinator.sh/name": "team-b"}
    assert "suspend" not in ours["spec"]  # our webhook holds it
    assert theirs["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-b"}
    assert theirs["spec"]["suspend"] is True


def test_team_of_reads_the_load_s_job_names_only() -> None:
    assert bf.team_of("a-0001") == "a"
    assert bf.team_of("b-0300") == "b"
    assert bf.team_of("c-0001") is None
    assert bf.team_of("a") is None
    assert bf.team_of("") is None


def test_our_quotas_are_a_parent_of_n_and_two_borrowing_teams_of_equal_weight() -> None:
    parent, a, b = bf.our_quotas(20)
    assert parent["metadata"] == {"name": "fair-parent"}
    assert parent["spec"] == {"min": {GPU: "20"}, "max": {GPU: "20"}}
    for quota, name in ((a, "team-a"), (b, "team-b")):
        assert quota["metadata"]["name"] == name
        assert quota["metadata"]["labels"] == {"quota.scheduling.koordinator.sh/parent": "fair-parent"}
        assert quota["spec"] == {"min": {GPU: "0"}, "max": {GPU: "20"}}  # all borrowed, all of it
        assert "annotations" not in quota["metadata"]  # default shared-weight: max, equal


def test_our_configuration_parses_and_names_the_half_life_as_a_go_duration() -> None:
    assert config.parse(yaml.safe_dump(bf.our_config(None))).warnings == ()
    story = bf.Story("history", half_life_s=30.0)
    for system, seconds in (("ours", 30.0), ("ours-off", 0.0)):
        doc = bf.our_config(story.half_life(system))
        assert parse_duration(doc["usageHalfLife"]) == seconds
        warnings = config.parse(yaml.safe_dump(doc)).warnings
        # before the reconciler knew the key it warned about it, and about nothing else
        assert all("usageHalfLife" in w for w in warnings)
    burst = bf.Story("burst", burst_half_life_s=600.0)
    assert burst.half_life("kueue-afs") == "10m0s"
    assert burst.shown_half_life("ours") == "default"  # the burst story runs ours' default
    assert burst.shown_half_life("kueue-cohort") is None
    assert story.shown_half_life("ours-off") == "0s"


def test_kueue_settings_are_valid_for_kueue_s_configuration() -> None:
    afs = bf.kueue_settings("kueue-afs", "30s", "1.25s")["admissionFairSharing"]
    assert afs == {
        "usageHalfLifeTime": "30s",
        "usageSamplingInterval": "1.25s",
        "resourceWeights": {"cpu": 0, GPU: 1},
    }
    strategies = bf.kueue_settings("kueue-cohort", "30s", "5s")["fairSharing"]["preemptionStrategies"]
    # Kueue v0.17 accepts exactly these sets (pkg/config/validation.go validStrategySets)
    assert strategies in (
        ["LessThanOrEqualToFinalShare"],
        ["LessThanInitialShare"],
        ["LessThanOrEqualToFinalShare", "LessThanInitialShare"],
    )
    assert bf.kueue_settings("kueue-fifo", "30s", "5s") == {}


def by_kind(system: str, gpus: int) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for res, body in bf.kueue_objects(system, gpus):
        assert res.kind == body["kind"]
        out.setdefault(str(body["kind"]), []).append(body)
    return out


def gpu_quota(cq: dict[str, object]) -> int:
    spec = cq["spec"]
    assert isinstance(spec, dict)
    (group,) = spec["resourceGroups"]
    assert group["coveredResources"] == ["cpu", GPU]  # Kueue admits only what its groups cover
    (flavor,) = group["flavors"]
    return int(next(r["nominalQuota"] for r in flavor["resources"] if r["name"] == GPU))


def test_kueue_afs_is_one_cluster_queue_of_n_with_two_local_queues() -> None:
    objs = by_kind("kueue-afs", 20)
    (cq,) = objs["ClusterQueue"]
    assert gpu_quota(cq) == 20
    assert cq["spec"]["admissionScope"] == {"admissionMode": "UsageBasedAdmissionFairSharing"}  # type: ignore[index]
    assert [(q["metadata"]["name"], q["spec"]["clusterQueue"]) for q in objs["LocalQueue"]] == [  # type: ignore[index]
        ("team-a", "fair"),
        ("team-b", "fair"),
    ]
    (fifo,) = by_kind("kueue-fifo", 20)["ClusterQueue"]
    assert "admissionScope" not in fifo["spec"]  # type: ignore[operator]


def test_kueue_cohort_splits_n_into_two_equal_nominal_quotas_without_preemption() -> None:
    for gpus in (20, 7):
        objs = by_kind("kueue-cohort", gpus)
        cqs = objs["ClusterQueue"]
        assert [c["metadata"]["name"] for c in cqs] == ["team-a", "team-b"]  # type: ignore[index]
        assert sum(gpu_quota(c) for c in cqs) == gpus
        assert abs(gpu_quota(cqs[0]) - gpu_quota(cqs[1])) <= 1
        for cq in cqs:
            spec = cq["spec"]
            assert isinstance(spec, dict)
            assert spec["cohortName"] == "fair"
            assert spec["fairSharing"] == {"weight": "1"}
            assert spec["preemption"] == {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never"}
            assert "borrowingLimit" not in str(spec)  # either may borrow the other's whole share
        assert [q["spec"]["clusterQueue"] for q in objs["LocalQueue"]] == ["team-a", "team-b"]  # type: ignore[index]


def test_gpu_nodes_allocate_exactly_n_gpus_at_most_8_each() -> None:
    for gpus in (2, 8, 9, 20, 33):
        nodes = bf.gpu_nodes(gpus)
        counts = [int(n["status"]["allocatable"][GPU]) for n in nodes]
        assert sum(counts) == gpus
        assert max(counts) <= 8
        assert len(nodes) == math.ceil(gpus / 8)
        assert all(n["metadata"]["annotations"][kwok.FAKE_NODE_ANNOTATION] == "fake" for n in nodes)


# --- figures --------------------------------------------------------------------------------------------


def ev(t: float, kind: str, job: str) -> bf.Event:
    team = bf.team_of(job)
    assert team is not None
    return (t, kind, team, job)


def burst_timeline() -> list[bf.Event]:
    """4 GPUs, all A's from t=0; B submits 3 at t=60. A's a-0004 takes the slot that freed before B
    came (a-0003's, at 59); the next slot frees at 65.2 (a-0000's pod ended at 65) and B is admitted
    then, the one after at 70.1 goes to B too, and B runs 2 at once (its share: min(3, 4/2)) from
    75 s."""
    out = [ev(0.5 + i / 10, "admitted", f"a-{i:04d}") for i in range(4)]
    out += [ev(1.0 + i / 10, "running", f"a-{i:04d}") for i in range(4)]
    out += [ev(59.0, "succeeded", "a-0003"), ev(59.1, "released", "a-0003")]
    out += [ev(60.1 + i / 10, "queued", f"b-{i:04d}") for i in range(3)]
    out += [ev(60.5, "admitted", "a-0004")]  # the refill of the slot freed at 59
    out += [ev(65.0, "succeeded", "a-0000"), ev(65.2, "released", "a-0000"), ev(65.3, "admitted", "b-0001")]
    out += [ev(66.0, "running", "b-0001")]
    out += [ev(70.0, "succeeded", "a-0001"), ev(70.1, "released", "a-0001"), ev(70.2, "admitted", "b-0000")]
    out += [ev(75.0, "running", "b-0000")]
    return out


def test_burst_figures_from_a_known_timeline() -> None:
    fig = bf.burst_figures(burst_timeline(), 60.0, BURST)
    assert fig["free_at_b"] == 1  # a-0003's slot, refilled after B came
    assert fig["b_queued_s"] == 0.3  # the last of B's three units seen
    assert fig["next_slot_freed_s"] == 5.2  # a-0000's unit released: its GPU is back in the quota
    assert fig["next_pod_done_s"] == 5.0
    assert fig["b_first_admitted_s"] == 5.3
    assert fig["b_first_running_s"] == 6.0
    assert fig["a_admitted_before_b"] == 1
    assert fig["slots_freed_until_b_admitted"] == 1  # B was admitted at the next slot that freed
    assert fig["b_share"] == 2
    assert fig["b_share_running_s"] == 15.0
    assert fig["b_share_within_one_duration"] is True
    assert fig["order_after_b"] == "ABB"
    assert bf.complete(fig, BURST)


def test_burst_figures_before_b_got_anything() -> None:
    events = [e for e in burst_timeline() if e[2] == "a"]
    fig = bf.burst_figures(events, 60.0, BURST)
    assert fig["b_queued_s"] is None
    assert fig["b_first_admitted_s"] is None
    assert fig["a_admitted_before_b"] is None
    assert fig["b_share_running_s"] is None
    assert fig["b_share_within_one_duration"] is None
    assert not bf.complete(fig, BURST)


def test_b_holds_its_share_only_when_both_run_at_once() -> None:
    """B's first pod finishes before its second runs: it never holds 2 at once."""
    events = [*burst_timeline(), ev(74.0, "succeeded", "b-0001")]
    assert bf.burst_figures(events, 60.0, BURST)["b_share_running_s"] is None
    late = bf.Story("burst", gpus=4, b_jobs=3, duration_s=10.0)
    assert bf.burst_figures(burst_timeline(), 60.0, late)["b_share_within_one_duration"] is False


def history_timeline(order: str, t_b: float = 100.0) -> list[bf.Event]:
    """A holds all 4 GPUs; after ``t_b`` one slot frees every second (A's and B's alike, oldest
    first) and goes to the team of the next letter of ``order``."""
    out = [ev(float(i), "admitted", f"a-{i:04d}") for i in range(4)]
    held = [f"a-{i:04d}" for i in range(4)]
    counts = {"a": 4, "b": 0}
    for i, team in enumerate(order):
        t = t_b + 1.0 + i
        out.append(ev(t, "released", held.pop(0)))
        job = f"{team}-{counts[team.lower()]:04d}"
        counts[team.lower()] += 1
        out.append(ev(t + 0.1, "admitted", job.lower()))
        held.append(job.lower())
    return out


def test_history_figures_from_a_known_timeline() -> None:
    order = "BBBABBAB" + "ABAB"
    fig = bf.history_figures(history_timeline(order), 100.0, HISTORY)
    assert fig["admitted_after_b"] == 12
    assert fig["b_fraction_first_k"] == 0.75  # BBBA
    assert fig["b_holds_half_s"] == 2.1  # its second admission
    assert fig["b_fraction_k_after_half"] == 0.75  # BABB
    assert fig["b_fraction_by_window"] == [0.75, 0.75, 0.5]
    assert fig["b_peak_held"] == 3  # b-0000..b-0002 at once, before b-0000 is released
    assert fig["order_after_b"] == order
    assert bf.complete(fig, HISTORY)


def test_history_figures_count_after_the_catch_up_apart() -> None:
    """B catching up to half the parent is not history: the fraction after it is counted apart."""
    fig = bf.history_figures(history_timeline("BBABABAB"), 100.0, HISTORY)
    assert fig["b_fraction_first_k"] == 0.75
    assert fig["b_fraction_k_after_half"] == 0.5
    assert fig["b_peak_held"] == 3


def test_history_figures_stay_open_until_k_admissions_were_seen() -> None:
    fig = bf.history_figures(history_timeline("BBA"), 100.0, HISTORY)
    assert fig["b_fraction_first_k"] is None
    assert fig["b_fraction_k_after_half"] is None
    assert fig["b_fraction_by_window"] == []
    assert not bf.complete(fig, HISTORY)


def test_first_holding_and_peak_count_at_once_not_in_total() -> None:
    events = [ev(1, "running", "b-0000"), ev(2, "succeeded", "b-0000"), ev(3, "running", "b-0001")]
    assert bf.first_holding(events, "b", 2, "running", "succeeded", 0.0) is None
    assert bf.first_holding(events, "b", 1, "running", "succeeded", 2.5) == 3
    assert bf.peak_held(events, "b", "running", "succeeded") == 1


# --- the timeline from watch objects --------------------------------------------------------------------


def test_timeline_reads_queue_units_and_pods_once_per_kind() -> None:
    timeline = bf.Timeline(kueue=False)
    owner = {"ownerReferences": [{"kind": "Job", "name": "a-0001"}], "name": "a-0001"}
    timeline.unit({"metadata": owner, "status": {"phase": "Enqueued"}})
    assert [k for _, k, _, _ in timeline.events] == ["queued"]
    timeline.unit({"metadata": owner, "status": {"phase": "Dequeued"}})
    timeline.unit({"metadata": owner, "status": {"phase": "Running"}})
    timeline.unit({"metadata": owner, "status": {"phase": "Succeed"}})
    pod = {"metadata": {"labels": {bf.JOB_NAME_LABEL: "a-0001"}}, "status": {"phase": "Running"}}
    timeline.pod(pod)
    timeline.pod({**pod, "status": {"phase": "Succeeded"}})
    timeline.pod({"metadata": {"labels": {bf.JOB_NAME_LABEL: "other"}}, "status": {"phase": "Running"}})
    assert [(k, team, job) for _, k, team, job in timeline.events] == [
        ("queued", "a", "a-0001"),
        ("admitted", "a", "a-0001"),
        ("released", "a", "a-0001"),
        ("running", "a", "a-0001"),
        ("succeeded", "a", "a-0001"),
    ]


def test_timeline_reads_kueue_workloads_by_their_job() -> None:
    timeline = bf.Timeline(kueue=True)
    meta = {"name": "job-b-0002-1a2b3", "ownerReferences": [{"kind": "Job", "name": "b-0002"}]}
    reserved = {"conditions": [{"type": "QuotaReserved", "status": "True"}]}
    timeline.unit({"metadata": meta, "status": reserved})
    assert [(k, job) for _, k, _, job in timeline.events] == [("queued", "b-0002")]
    admitted = {"conditions": [*reserved["conditions"], {"type": "Admitted", "status": "True"}]}
    timeline.unit({"metadata": meta, "status": admitted})
    # a finished workload seen first counts as admitted too
    finished = {"conditions": [{"type": "Finished", "status": "True"}]}
    other = {"name": "job-b-0003-x", "ownerReferences": [{"kind": "Job", "name": "b-0003"}]}
    timeline.unit({"metadata": other, "status": finished})
    assert [(k, job) for _, k, _, job in timeline.events] == [
        ("queued", "b-0002"),
        ("admitted", "b-0002"),
        ("queued", "b-0003"),
        ("admitted", "b-0003"),
        ("released", "b-0003"),
    ]


def test_the_table_has_a_row_and_an_order_per_system() -> None:
    fig = bf.burst_figures(burst_timeline(), 60.0, BURST)
    rows = [
        {"system": "ours", "half_life": "default", "figures": fig},
        {"system": "kueue-afs", "error": "RuntimeError('boom')"},
    ]
    text = bf.table(BURST, rows)
    lines = text.splitlines()
    assert "B 1st admitted s" in lines[0]
    assert lines[1].split()[:5] == ["ours", "default", "0.3", "5.2", "5"]
    assert lines[2].split() == ["kueue-afs", *["-"] * (len(bf.BURST_COLUMNS) + 1)]
    assert lines[3] == "  ours: admissions after B: ABB"
    assert lines[4] == "  kueue-afs: RuntimeError('boom')"
