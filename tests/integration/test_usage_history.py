"""Usage history on the real apiserver (docs/compatibility.md#fair-over-time), black box: what the
reconciler writes in ``koord-queue/usage-history``, judged with the decay formula alone.

On a control plane of its own, with the webhook, the admission policies of ``manifests/`` and a
reconciler started with ``--usage-half-life=30s`` (and ``noPodsTimeout: 0s``: no Job controller runs
here, so an admitted Job keeps its admission):

* the record appears on a quota and, while the quota holds 2 CPU, each new record is the previous
  one decayed plus what was held: ``a' = a·d + u·(1-d)``, ``d = 2^(-Δ/H)``, growing toward 2 CPU;
* a restart does not reset it: with the reconciler stopped, an admin stores a known record (``U``
  at ``T``) on a quota that holds nothing; the first record the new reconciler writes shows
  ``U·2^(-(T2-T)/H)`` at its time ``T2``;
* the reconciler's own admission policy lets it write ``koord-queue/usage-history`` and no other
  new key;
* the namespace user alice (``edit`` in her namespace) can neither write nor remove the record, nor
  delete her quota; deleting her jobs and recreating them (same names and new ones), trying to
  relabel one to her other quota and moving it there by a re-create leave her quota's record at or
  above its decay, and her other quota does not take her history.

The record is rewritten only once a minute (``HISTORY_WRITE_SECONDS``): to see the next one sooner
the test, as an admin, removes the annotation, which the reconciler writes again at once from the
average it keeps in memory (removing it changes nothing it counts).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names, quantities
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import Component
from tests import kube, tenancy
from tests import scenario as s
from tests.integration.test_tenant_quotas import job
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
HISTORY = names.QUOTA_USAGE_HISTORY_ANNOTATION
#: The half-life the test's reconciler runs with (seconds): short, so the figures move in seconds.
HALF_LIFE = 30.0
CONFIG = """apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
jobRunningTimeout:
  job:
    noPodsTimeout: 0s
"""
#: The record's time is written to the second: a gap read from two records is off by up to 1 s.
SLACK_S = 1.0
#: Figures are rounded to whole milli units.
SLACK_MILLI = 2


@dataclass(frozen=True)
class Record:
    """The annotation as stored: when (epoch seconds), the half-life text and usage (milli)."""

    at: float
    half_life: str
    usage: dict[str, int]


def parse(text: str | None) -> Record | None:
    """The stored record, read without the product's code (None when absent)."""
    if not text:
        return None
    doc = json.loads(text)
    at = datetime.fromisoformat(doc["at"].replace("Z", "+00:00")).timestamp()
    usage = {r: quantities.parse_milli(v) for r, v in (doc.get("usage") or {}).items()}
    return Record(at=at, half_life=doc["halfLife"], usage=usage)


def render(at: float, usage: dict[str, str]) -> str:
    stamp = datetime.fromtimestamp(int(at), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps({"at": stamp, "halfLife": "30s", "usage": usage})


def decayed(value: float, seconds: float) -> float:
    return float(value * 2.0 ** (-seconds / HALF_LIFE))


def step_bounds(before: Record, after: Record, resource: str, held_milli: int) -> tuple[float, float]:
    """The range ``after`` may show for ``resource`` when the quota held ``held_milli`` all along
    between the two records: ``a·d + u·(1-d)`` over the gap, widened by the second precision."""
    gap = after.at - before.at
    a = before.usage.get(resource, 0)
    values = [decayed(a, g) + held_milli - decayed(held_milli, g) for g in (gap - SLACK_S, gap + SLACK_S)]
    return min(values) - SLACK_MILLI, max(values) + SLACK_MILLI


def not_lowered(before: Record, after: Record) -> list[str]:
    """Resources whose figure in ``after`` is below ``before``'s decayed across the gap (whatever
    was held meanwhile, the figure never falls faster than the decay): the queue's guarantee."""
    gap = after.at - before.at + SLACK_S
    return [
        f"{r}: {after.usage.get(r, 0)}m < {before.usage[r]}m decayed over {gap:.0f}s"
        for r in before.usage
        if after.usage.get(r, 0) < decayed(before.usage[r], gap) - SLACK_MILLI
    ]


@dataclass
class HistorySystem:
    """The control plane, the webhook and the reconciler, which a test may restart."""

    cluster: LocalCluster
    logdir: Path
    args: list[str]
    webhook: Component
    reconciler: Component | None = None
    restarts: int = field(default=0)

    def start_reconciler(self) -> None:
        self.restarts += 1
        self.reconciler = system.start_reconciler(
            self.cluster, logdir=self.logdir, extra_args=self.args, name=f"reconciler-{self.restarts}"
        )

    def stop_reconciler(self) -> None:
        if self.reconciler is not None:
            self.reconciler.stop()
            self.reconciler = None


@pytest.fixture(scope="module")
def history_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistorySystem]:
    logdir = tmp_path_factory.mktemp("usage-history")
    cluster = LocalCluster(profile="integration", workdir=logdir / "cp")
    cluster.start()
    it: HistorySystem | None = None
    try:
        system.install_crds(cluster)
        config = logdir / "config.yaml"
        config.write_text(CONFIG)
        webhook, _ = system.start_webhook(cluster, logdir=logdir)
        system.install_policies(cluster)
        it = HistorySystem(
            cluster, logdir, [f"--config={config}", f"--usage-half-life={HALF_LIFE:g}s"], webhook
        )
        it.start_reconciler()
        yield it
    finally:
        if it is not None:
            it.stop_reconciler()
            it.webhook.stop()
        for log in sorted(logdir.glob("reconciler*.log")):
            print(
                f"--- {log.name} (tail) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            )
        cluster.stop()


@pytest.fixture
async def sc(history_system: HistorySystem) -> AsyncIterator[Scenario]:
    if history_system.reconciler is None:  # a test that failed while it was stopped
        history_system.start_reconciler()
    namespace = f"h-{int(time.time() * 1000) % 10**9}"
    async with kube.client(history_system.cluster) as api:
        await kube.create_namespace(api, namespace)
    async with s.scenario(history_system.cluster, namespace) as it:
        yield it


async def stored(sc: Scenario, quota: str) -> Record | None:
    obj: Obj = await sc.objects.get_namespaced_custom_object(
        names.QUOTA_GROUP, names.QUOTA_VERSION, sc.ns, names.QUOTA_PLURAL, quota
    )
    return parse((obj["metadata"].get("annotations") or {}).get(HISTORY))


async def next_record(
    sc: Scenario, quota: str, after: Record | None = None, *, timeout: float = 40
) -> Record:
    """A record taken after ``after`` (any record when None).

    With ``after`` given, the admin removes the annotation until one comes back taken later: the
    reconciler writes a missing record at once, with its figures as of its last fold, and folds in
    each scheduling cycle only, which the removal (a quota event) wakes. So a removal brings back
    the fold the previous removal woke: a record as the reconciler keeps it, at its own time."""

    async def shown() -> Record:
        found = await stored(sc, quota)
        assert found is not None, "no record"
        return found

    if after is None:
        return await kube.eventually(shown, timeout=timeout, interval=0.3, what=f"a usage record on {quota}")
    deadline = time.monotonic() + timeout
    while True:
        await sc.patch_quota(quota, {"metadata": {"annotations": {HISTORY: None}}})
        found = await kube.eventually(shown, timeout=20, interval=0.3, what=f"the record back on {quota}")
        if found.at > after.at:
            return found
        assert time.monotonic() < deadline, f"no record on {quota} newer than {after}: {found}"


async def holding(sc: Scenario, quota: str, at_least: int) -> Record:
    """Records forced one after another until the quota's cpu figure reaches ``at_least`` milli."""
    record = await next_record(sc, quota)
    deadline = time.monotonic() + 90
    while record.usage.get("cpu", 0) < at_least:
        assert time.monotonic() < deadline, f"{quota}'s usage stays at {record}"
        record = await next_record(sc, quota, record)
    return record


# --- what the reconciler writes ------------------------------------------------------------------------


async def test_the_record_follows_the_decay_formula_toward_what_the_quota_holds(sc: Scenario) -> None:
    q = sc.name("q")
    await sc.create_quota(s.quota(q, cpu="4"))
    first = await next_record(sc, q)
    assert first.half_life == "30s" and first.usage.get("cpu", 0) == 0, first
    await sc.create_unit(s.unit("a", quota=q, cpu="2"))
    await sc.wait_phase("a")
    # From a record taken while the unit held its 2 CPU, every next one is a·d + 2000·(1-d).
    record = await holding(sc, q, 1)
    seen = [record]
    while len(seen) < 4:
        newer = await next_record(sc, q, seen[-1])
        low, high = step_bounds(seen[-1], newer, "cpu", 2000)
        assert low <= newer.usage["cpu"] <= high, (seen[-1], newer, low, high)
        assert seen[-1].usage["cpu"] <= newer.usage["cpu"] <= 2000, (seen[-1], newer)
        seen.append(newer)
    print("records:", [(r.at - seen[0].at, r.usage) for r in seen])
    # Toward 2 CPU: after a half-life or more, at least half of it.
    if seen[-1].at - seen[0].at < HALF_LIFE:
        seen.append(await holding(sc, q, 1000))
    assert seen[-1].usage["cpu"] >= 1000 - SLACK_MILLI, seen


async def test_a_restart_counts_on_from_the_stored_record_decayed_across_the_gap(
    sc: Scenario, history_system: HistorySystem
) -> None:
    q = sc.name("q")
    await sc.create_quota(s.quota(q, cpu="4"))
    await sc.create_unit(s.unit("a", quota=q, cpu="2"))
    await sc.wait_phase("a")
    kept = await holding(sc, q, 200)  # the running reconciler's own record
    await sc.finish("a")  # the quota holds nothing from here on

    async def released() -> bool:
        obj = await sc.objects.get_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, sc.ns, names.QUOTA_PLURAL, q
        )
        return bool(((obj.get("status") or {}).get("used") or {}).get("cpu") in ("0", "0m"))

    await kube.eventually(released, what=f"{q} showing nothing used")
    history_system.stop_reconciler()
    # As an admin: a known record, taken 90 s ago. The new reconciler replaces a record a minute old
    # or more, so the fold it makes as it starts is written at once.
    taken = float(int(time.time()) - 90)
    usage = 3000
    await sc.patch_quota(q, {"metadata": {"annotations": {HISTORY: render(taken, {"cpu": f"{usage}m"})}}})
    before = await stored(sc, q)
    assert before is not None and before.at == taken and before.usage == {"cpu": usage}, before
    history_system.start_reconciler()
    after = await _first_after(sc, q, before)
    gap = after.at - taken
    low, high = decayed(usage, gap + SLACK_S) - SLACK_MILLI, decayed(usage, gap) + SLACK_MILLI
    print(f"kept {kept}; stored {usage}m at T; first new record {after.usage} at T+{gap:.0f}s")
    assert gap >= 60, after  # a minute after the stored one, not sooner
    assert after.usage.get("cpu", 0) > 0, after  # not reset
    assert low <= after.usage["cpu"] <= high, (after, low, high)


async def _first_after(sc: Scenario, quota: str, before: Record) -> Record:
    async def probe() -> Record | None:
        found = await stored(sc, quota)
        return found if found is not None and found.at > before.at else None

    return await kube.eventually(
        probe, timeout=60, interval=0.3, what=f"the new reconciler's record on {quota}"
    )


async def test_the_reconcilers_policy_lets_it_write_the_record_and_no_other_new_key(
    sc: Scenario, history_system: HistorySystem
) -> None:
    q = sc.name("q")
    await sc.create_quota(s.quota(q, cpu="1"))

    def as_reconciler(key: str, value: str) -> Any:
        patch = json.dumps({"metadata": {"annotations": {key: value}}})
        return sc.kubectl(
            f"--as={system.RECONCILER_USER}",
            "-n",
            sc.ns,
            "patch",
            "elasticquota",
            q,
            "--type=merge",
            "-p",
            patch,
            check=False,
        )

    async def refused(key: str) -> bool:
        done = as_reconciler(key, "{}")
        assert done.returncode != 0, f"the reconciler wrote {key}"
        assert "may change only the annotations" in done.stderr, done.stderr
        return True

    for key in ("koord-queue/usage-history-forged", "koord-queue/usage", "koord-queue/fair-share"):
        await kube.eventually(functools.partial(refused, key), what=f"the reconciler refused {key}")
    text = render(time.time(), {"cpu": "1"})
    done = as_reconciler(HISTORY, text)
    assert done.returncode == 0, done.stderr
    found = await stored(sc, q)
    assert found is not None and found.usage == {"cpu": 1000}, found


# --- the hostile tenant ----------------------------------------------------------------------------------


def alice(sc: Scenario, *args: str) -> Any:
    return tenancy.as_user(sc.cluster, tenancy.ALICE, "-n", sc.ns, *args)


def grant_alice(sc: Scenario) -> None:
    """alice's namespace user's rights, with the queue's user role bound as ``edit`` aggregates it in
    a real cluster (here no controller aggregates roles): she reads quotas and units, writes neither."""
    tenancy.grant(sc.cluster, sc.ns, tenancy.ALICE)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "alice-koord-queue-user", "namespace": sc.ns},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "koord-queue-user-edit",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenancy.ALICE}],
    }
    sc.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(binding))


async def admitted(sc: Scenario, *units: str) -> None:
    for name in units:
        await sc.wait_unit(name, lambda u: bool(s.admissions(u)), what="admitted")


async def used_cpu(sc: Scenario, quota: str, want: str) -> None:
    async def probe() -> bool:
        obj = await sc.objects.get_namespaced_custom_object(
            names.QUOTA_GROUP, names.QUOTA_VERSION, sc.ns, names.QUOTA_PLURAL, quota
        )
        used = ((obj.get("status") or {}).get("used") or {}).get("cpu")
        return used is not None and quantities.parse_milli(used) == quantities.parse_milli(want)

    await kube.eventually(probe, what=f"{quota} showing cpu {want} used")


async def test_alice_can_neither_write_her_quotas_record_nor_lower_it_with_her_jobs(sc: Scenario) -> None:
    mine, other = sc.name("mine"), sc.name("other")
    await sc.create_quota(s.quota(mine, cpu="4"))
    await sc.create_quota(s.quota(other, cpu="4"))
    grant_alice(sc)
    for name in ("j1", "j2"):
        await tenancy.create_as(sc.cluster, sc.ns, job(name, mine))
    await admitted(sc, "j1", "j2")
    before = await holding(sc, mine, 300)
    other_before = await next_record(sc, other)
    assert other_before.usage.get("cpu", 0) == 0, other_before

    # The record is not hers to write, remove, or reset by deleting the quota.
    zero = render(time.time(), {})
    for args in (
        ("annotate", "elasticquota", mine, f"{HISTORY}={zero}", "--overwrite"),
        ("annotate", "elasticquota", mine, f"{HISTORY}-"),
        (
            "patch",
            "elasticquota",
            mine,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"annotations": {HISTORY: None}}}),
        ),
        ("delete", "elasticquota", mine, "--wait=false"),
    ):
        done = alice(sc, *args)
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), (args, done.stderr)
        assert 'User "alice" cannot' in done.stderr, (args, done.stderr)
    # She reads it (so the refusals above are the write's, not the read's).
    assert alice(sc, "get", "elasticquota", mine, "-o", "json").returncode == 0
    kept = await stored(sc, mine)
    assert kept is not None and not not_lowered(before, kept), (before, kept)

    # Her job cannot move to her other quota while it runs ...
    done = alice(sc, "label", "job", "j1", f"{names.QUOTA_NAME_LABEL}={other}", "--overwrite")
    assert done.returncode != 0 and "the quota cannot change until the job finishes" in done.stderr, (
        done.stderr
    )
    # ... so she deletes all her jobs: the quota holds nothing, its record only decays.
    assert alice(sc, "delete", "job", "j1", "j2").returncode == 0
    for name in ("j1", "j2"):  # the garbage collector's part (no controller-manager runs here)
        await sc.delete_unit(name)
    await used_cpu(sc, mine, "0")
    emptied = await next_record(sc, mine, before)
    assert not not_lowered(before, emptied), (before, emptied)
    assert emptied.usage.get("cpu", 0) > 0, emptied
    # ... and recreates them: the same names, a new name, and one under her other quota.
    for name, quota in (("j1", mine), ("j2", mine), ("j3", mine), ("moved", other)):
        await tenancy.create_as(sc.cluster, sc.ns, job(name, quota))
    await admitted(sc, "j1", "j2", "j3", "moved")
    after = await next_record(sc, mine, emptied)
    assert not not_lowered(emptied, after) and not not_lowered(before, after), (before, emptied, after)
    # Her other quota counts only what it held itself (at most the moved job's 1 CPU), not her history.
    other_after = await next_record(sc, other, other_before)
    _, high = step_bounds(other_before, other_after, "cpu", 1000)
    assert other_after.usage.get("cpu", 0) <= high, (other_before, other_after, high)
    print(f"{mine}: {before.usage} -> {emptied.usage} -> {after.usage}; {other}: {other_after.usage}")
