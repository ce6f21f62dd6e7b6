"""The chaos run's borrowing load (``chaos.load``): the tree is oversubscribed yet its guarantees fit,
and the waves make children borrow with pods that never run while their siblings claim their
``min``, so the observer's guarantee invariants have something to judge
(docs/compatibility.md#quota-guarantees)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from chaos import load
from chaos.views import milli
from koord_queue.shared import kube
from koord_queue.shared.api import names


def test_the_borrowing_tree_is_oversubscribed_and_its_guarantees_fit_the_parent() -> None:
    parent, *children = load.borrow_quotas()
    assert parent["metadata"]["labels"][names.QUOTA_IS_PARENT_LABEL] == "true"
    parent_min = milli(parent["spec"]["min"]["cpu"])
    parent_max = milli(parent["spec"]["max"]["cpu"])
    assert parent_min is not None and parent_max is not None
    mins = [milli(c["spec"]["min"]["cpu"]) or 0 for c in children]
    maxes = [milli(c["spec"]["max"]["cpu"]) or 0 for c in children]
    assert sum(mins) <= parent_min <= parent_max  # the tree rules at the door
    assert sum(maxes) > parent_max  # oversubscribed: children can borrow
    assert all(0 < lo < hi for lo, hi in zip(mins, maxes, strict=True))
    assert all(c["metadata"]["labels"][names.QUOTA_PARENT_LABEL] == load.BORROW_PARENT for c in children)
    keeping = [c for c in children if c["metadata"]["labels"].get(names.QUOTA_ALLOW_LENT_LABEL) == "false"]
    assert len(keeping) == 1


def test_each_wave_a_hot_child_borrows_with_hogs_while_the_others_claim_their_min() -> None:
    waves, length = 4, 15.0
    schedule = load.borrow_schedule(waves, length)
    times = [at for at, _ in schedule]
    assert times == sorted(times) and times[0] >= 0.0 and times[-1] < waves * length
    assert len({p.name for _, p in schedule}) == len(schedule)
    assert all(p.namespace == load.BORROW_NAMESPACE for _, p in schedule)
    for w, hot in enumerate(load.BORROW_CHILDREN):
        in_wave = [(at, p) for at, p in schedule if w * length <= at < (w + 1) * length]
        hogs = [p for _, p in in_wave if p.shape == "hog"]
        assert {p.quota for p in hogs} == {hot.name}
        assert len(hogs) == int(hot.max_cpu)  # all it may take, never running
        assert all(at < w * length + 2.0 for at, p in in_wave if p.quota == hot.name)
        per_child = Counter(p.quota for _, p in in_wave if p.shape != "hog")
        assert per_child[hot.name] == len(load.BURST)
        assert all(per_child[c.name] == 2 * load.TRICKLE for c in load.BORROW_CHILDREN if c is not hot)
    assert load.hog_lifetime(length) > length  # the next hot child finds them still there


def test_borrowing_jobs_follow_their_child_and_hogs_never_run() -> None:
    plans = {p.quota: p for _, p in load.borrow_schedule(4, 15.0) if p.shape == "single"}
    for child in load.BORROW_CHILDREN:
        spec = load.job(plans[child.name], "s")["spec"]["template"]["spec"]
        requests = spec["containers"][0]["resources"]["requests"]
        assert ("memory" in requests) is child.memory
    hog = next(p for _, p in load.borrow_schedule(4, 15.0) if p.shape == "hog")
    body = load.job(hog, "s")
    assert body["metadata"]["namespace"] == load.BORROW_NAMESPACE
    assert "nodeSelector" in body["spec"]["template"]["spec"]
    assert body["metadata"]["annotations"][names.PRIORITY_ANNOTATION] == "0"


class FakeClient:
    """Records creates and deletes; the first delete of each job fails as during an outage."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.failed: set[str] = set()

    async def create(self, resource: kube.Resource, obj: dict[str, Any], *, namespace: str) -> None:
        self.created.append(f"{namespace}/{obj['metadata']['name']}")

    async def delete(self, resource: kube.Resource, name: str, *, namespace: str, propagation: str) -> None:
        key = f"{namespace}/{name}"
        if key not in self.failed:
            self.failed.add(key)
            raise kube.KubeError(0, "ClientOSError", "connection refused")
        self.deleted.append(key)


def test_the_borrowing_load_runs_until_the_faults_end_and_deletes_its_hogs() -> None:
    client = FakeClient()
    workload = load.Load(client, "s")  # type: ignore[arg-type]

    async def scenario() -> None:
        until = asyncio.Event()
        running = asyncio.create_task(workload.submit_borrowing(0.2, waves=2, until=until))
        await asyncio.sleep(0.5)  # more than the two waves asked for: the faults go on
        until.set()
        await running  # the hogs' deletions (one retried after a second) included

    asyncio.run(scenario())
    waves = workload.counters["borrowing waves"]
    assert 3 <= waves <= 4
    expected = load.borrow_schedule(waves, 0.2)
    assert sorted(client.created) == sorted(f"{p.namespace}/{p.name}" for _, p in expected)
    hogs = {f"{p.namespace}/{p.name}" for _, p in expected if p.shape == "hog"}
    assert set(client.deleted) == hogs == workload.deleted
    assert workload.counters["borrowing jobs submitted"] == len(expected) == len(workload.submitted)
