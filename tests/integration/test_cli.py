"""``kubectl koord-queue`` end to end: the real kubectl finds the installed plugin on PATH, and the
plugin talks to the real kube-apiserver (and, through its aggregation layer, to the reconciler's
visibility API) with the credentials it is given.

Every waiting reason the scheduler produces is explained, as a namespace user (``alice``, bound in
her namespace to the install's read-only user role and to ``edit``, impersonated with ``--as`` as
kubectl does) and as the cluster admin: quota at the unit's own level, quota at a parent, a blocked
queue, an admission check, a preemption in progress (the preemptor, and its victim), an inactive
job (held with the plugin itself) and a queue that does not exist. Where alice cannot read
something (other namespaces' units, a parent quota of another namespace, the Queues, the
component configuration) the answer still names the reason and lists what it could not see.

``list``, ``quotas``, ``hold``/``release`` and ``priority`` (refused above the quota's cap) are
covered the same way, and each refusal by RBAC exits 4 naming the permission that is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import binaries, system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests import scenario as s
from tests.integration.test_visibility import Visibility, available, registered, serving_visibility
from tests.scenario import Scenario

pytestmark = pytest.mark.integration

USER = "alice"
USER_ROLE = "koord-queue-user-edit"
BIN = Path(sys.executable).parent


def plugin(cluster: LocalCluster, *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl koord-queue ARGS`` with the package's console scripts on PATH, as a user has them
    after ``pip install``; ``user`` impersonates like ``kubectl --as``."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    command = [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={cluster.kubeconfig}"]
    if user:
        command.append(f"--as={user}")
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=60, check=False)


@dataclass
class Tenant:
    cluster: LocalCluster
    sc: Scenario

    @property
    def ns(self) -> str:
        return self.sc.ns

    def run(self, *args: str, admin: bool = False) -> subprocess.CompletedProcess[str]:
        return plugin(self.cluster, *args, "-n", self.ns, user=None if admin else USER)

    async def explained(self, unit: str, reason: str, *, admin: bool = False) -> dict[str, Any]:
        """``explain -o json`` once it gives ``reason`` (the scheduler writes asynchronously)."""

        async def probe() -> dict[str, Any] | None:
            result = self.run("explain", unit, "-o", "json", admin=admin)
            assert result.returncode == 0, result.stderr
            answer: dict[str, Any] = json.loads(result.stdout)
            return answer if answer["reason"] == reason else None

        who = "admin" if admin else USER
        found: dict[str, Any] = await kube.eventually(probe, timeout=30, what=f"{unit}: {reason} for {who}")
        return found

    def text(self, unit: str, *, admin: bool = False) -> str:
        result = self.run("explain", unit, admin=admin)
        assert result.returncode == 0, result.stderr
        return result.stdout


@pytest.fixture(scope="module")
async def aggregated(
    integration_cluster: LocalCluster, system_integration: system.Processes
) -> AsyncIterator[Visibility]:
    """The visibility API behind the apiserver's aggregation layer, as ``make run`` registers it."""
    vis = await serving_visibility(integration_cluster, system_integration)
    with registered(integration_cluster, port=vis.port):
        await available(integration_cluster)
        yield vis


@pytest.fixture
async def t(
    integration_cluster: LocalCluster, aggregated: Visibility, namespace_in: str
) -> AsyncIterator[Tenant]:
    tenancy.grant(integration_cluster, namespace_in, USER)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{USER}-{USER_ROLE}", "namespace": namespace_in},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    kube.kubectl(integration_cluster, "apply", "-f", "-", input_text=json.dumps(binding))
    async with s.scenario(integration_cluster, namespace_in) as sc:
        tenant = Tenant(integration_cluster, sc)

        async def allowed() -> bool:
            return tenant.run("list").returncode == 0

        await kube.eventually(allowed, what=f"{USER} allowed to list in {namespace_in}")
        yield tenant


@contextlib.asynccontextmanager
async def other_namespace(t: Tenant) -> AsyncIterator[str]:
    name = f"{t.ns}-theirs"
    async with kube.client(t.cluster) as api:
        await kube.create_namespace(api, name)
        try:
            yield name
        finally:
            await kube.delete_namespace(api, name)


def apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(obj))


# --- waiting reasons --------------------------------------------------------------------------------


async def test_explain_quota_full_at_its_own_level(t: Tenant) -> None:
    q = t.sc.name("own")
    await t.sc.create_quota(s.quota(q, cpu="1"))
    await t.sc.create_unit(s.unit("holder", quota=q, priority=5))
    await t.sc.wait_phase("holder", "Dequeued")
    await t.sc.create_unit(s.unit("waiter", quota=q, priority=1))

    mine = await t.explained("waiter", "quota")
    assert mine["refusing_quota"] == q and mine["refusing_resource"] == "cpu"
    assert mine["position"] == 1
    (level,) = mine["levels"]
    assert (level["name"], level["max"], level["used"], level["refuses"]) == (
        q,
        {"cpu": 1000},
        {"cpu": 1000},
        True,
    )
    assert [h["key"] for h in mine["holders"]] == [f"{t.ns}/holder"]
    assert any("other namespaces" in u for u in mine["unknowns"])
    text = t.text("waiter")
    assert "Why: its own quota has no room for cpu: it asks for 1 cpu" in text
    assert "Charged per pod:\n  waiter: 1 x cpu=1\n" in text
    assert f"{q} has max 1 and at least 1 in use" in text
    assert "What would let it run:" in text and f"{q} must free cpu" in text

    admin = await t.explained("waiter", "quota", admin=True)
    assert admin["levels"][0]["used_complete"] is True
    assert not any("other namespaces" in u for u in admin["unknowns"])


async def test_explain_quota_full_at_a_parent_the_user_cannot_read(t: Tenant) -> None:
    parent, mine_q, theirs_q = t.sc.name("parent"), t.sc.name("child-a"), t.sc.name("child-b")
    async with other_namespace(t) as theirs:
        apply(t.cluster, {**s.quota(parent, cpu="1"), "metadata": {"name": parent, "namespace": theirs}})
        theirs_quota = s.quota(theirs_q, cpu="4", parent=parent)
        theirs_quota["metadata"]["namespace"] = theirs
        apply(t.cluster, theirs_quota)
        await t.sc.create_quota(s.quota(mine_q, cpu="4", parent=parent))
        await t.sc.wait_queue(theirs_q)
        holder = {
            **s.unit("holder", quota=theirs_q),
            "metadata": {"name": "holder", "namespace": theirs, "labels": {names.QUOTA_NAME_LABEL: theirs_q}},
        }
        apply(t.cluster, holder)

        async def held() -> bool:
            got = kube.kubectl(
                t.cluster, "get", "queueunit", "holder", "-n", theirs, "-o", "jsonpath={.status.phase}"
            )
            return got.stdout == "Dequeued"

        await kube.eventually(held, what="their holder admitted")
        await t.sc.create_unit(s.unit("waiter", quota=mine_q))

        mine = await t.explained("waiter", "parent-quota")
        assert mine["refusing_quota"] == parent
        # alice reads her child quota, not the parent (another namespace) nor the holder.
        assert [lv["name"] for lv in mine["levels"]] == [mine_q, parent]
        assert [lv["readable"] for lv in mine["levels"]] == [True, False]
        assert mine["holders"] == []
        text = t.text("waiter")
        assert f"Why: parent quota {parent} of {mine_q} has no room for cpu" in text
        assert f"{parent} (not readable)" in text

        admin = await t.explained("waiter", "parent-quota", admin=True)
        levels = {lv["name"]: lv for lv in admin["levels"]}
        assert levels[parent]["refuses"] is True and levels[mine_q]["refuses"] is False
        assert levels[parent]["used"] == {"cpu": 1000} and levels[parent]["max"] == {"cpu": 1000}
        assert [h["key"] for h in admin["holders"]] == [f"{theirs}/holder"]


async def test_explain_a_blocked_queue(t: Tenant) -> None:
    q = t.sc.name("block")
    await t.sc.create_quota(s.quota(q, cpu="2", policy="Block"))
    await t.sc.create_unit(s.unit("holder", quota=q, priority=9))
    await t.sc.wait_phase("holder", "Dequeued")
    await t.sc.create_unit(s.unit("big", quota=q, cpu="2", priority=5))
    await t.sc.wait_message("big", f"limited quotaName:{q}, limited resKey:cpu,; preempt failed")
    await t.sc.create_unit(s.unit("small", quota=q, priority=1))

    mine = await t.explained("small", "blocked")
    assert mine["policy"] == "Block"
    assert [a["key"] for a in mine["ahead"]] == [f"{t.ns}/big"]
    assert "is at the head" in t.text("small")
    await t.explained("small", "blocked", admin=True)
    big = await t.explained("big", "quota")
    assert big["refusing_quota"] == q


async def test_explain_an_admission_check(t: Tenant) -> None:
    q = t.sc.name("checks")
    await t.sc.create_queue(s.queue(q, admission_checks=[{"name": "budget-check"}]))
    await t.sc.create_quota(s.quota(q, cpu="4"))
    await t.sc.create_unit(s.unit("checked", quota=q))
    await t.sc.wait_phase("checked", "Reserved")

    mine = await t.explained("checked", "admission-check")
    assert mine["checks"] == [["budget-check", "Pending", ""]]
    assert "it waits for admission check(s): budget-check (Pending)" in t.text("checked")
    listed = json.loads(t.run("list", "-o", "json").stdout)["items"]
    assert [(i["name"], i["reason"]) for i in listed] == [
        ("checked", "waiting for admission check(s): budget-check")
    ]
    await t.explained("checked", "admission-check", admin=True)


async def test_explain_a_preemption_in_progress_for_the_preemptor_and_its_victim(t: Tenant) -> None:
    q = t.sc.name("preempt")
    annotations = {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", names.ENABLE_PREEMPTION_ANNOTATION: "true"}
    await t.sc.create_quota(s.quota(q, cpu="1", annotations=annotations))
    # A bare unit has no job extension: admitted, its pods never run, and nobody carries out the
    # reclaim, so the round stays in progress for as long as the test looks.
    await t.sc.create_unit(s.unit("low", quota=q, priority=1))
    await t.sc.wait_phase("low", "Dequeued")
    await t.sc.create_unit(s.unit("high", quota=q, priority=10))

    mine = await t.explained("high", "preemptor")
    assert mine["round"]["preemptor"] == f"{t.ns}/high"
    assert mine["round"]["victims"] == [[f"{t.ns}/low", 1]]
    text = t.text("high")
    assert "preemption in progress for it in queue" in text and "low (1 replica(s))" in text
    victim = await t.explained("low", "being-preempted")
    assert "1 replica(s) are being reclaimed" in victim["summary"]
    admin = await t.explained("high", "preemptor", admin=True)
    assert admin["preemption"] == "enabled"


async def test_hold_makes_a_job_inactive_and_release_lets_it_run_again(t: Tenant) -> None:
    q = t.sc.name("hold")
    await t.sc.create_quota(s.quota(q, cpu="4"))
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": t.ns, "labels": {names.QUOTA_NAME_LABEL: q}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                }
            }
        },
    }
    created = tenancy.as_user(t.cluster, USER, "create", "-f", "-", input_text=json.dumps(job))
    assert created.returncode == 0, created.stderr
    await t.sc.wait_phase("train", "Dequeued")

    held = t.run("hold", "job/train")
    assert held.returncode == 0, held.stderr
    assert "job/train held: it was admitted, so koord-queue suspends it" in held.stdout
    annotation = kube.kubectl(
        t.cluster, "get", "job", "train", "-n", t.ns, "-o", "jsonpath={.metadata.annotations}"
    )
    assert json.loads(annotation.stdout)[names.ACTIVE_ANNOTATION] == "false"
    mine = await t.explained("train", "inactive")
    assert "release" in " ".join(mine["next_steps"])
    await t.explained("train", "inactive", admin=True)

    released = t.run("release", "train")
    assert released.returncode == 0, released.stderr
    await t.sc.wait_phase("train", "Dequeued")
    assert (await t.explained("train", "admitted"))["quota"] == q


async def test_explain_a_queue_that_does_not_exist(t: Tenant) -> None:
    missing = t.sc.name("nowhere")
    await t.sc.create_unit(s.unit("lost", quota=missing))
    mine = await t.explained("lost", "queue-not-found")
    assert f"names queue {missing}, which does not exist" in mine["summary"]
    assert f"create ElasticQuota {missing}" in mine["next_steps"][0]
    await t.explained("lost", "queue-not-found", admin=True)


# --- list, quotas, priority, refusals -----------------------------------------------------------


async def test_list_shows_positions_wait_and_reason_and_refuses_other_namespaces_naming_the_permission(
    t: Tenant,
) -> None:
    q = t.sc.name("list")
    await t.sc.create_quota(s.quota(q, cpu="1"))
    await t.sc.create_unit(s.unit("holder", quota=q, priority=5))
    await t.sc.wait_phase("holder", "Dequeued")
    await t.sc.create_unit(s.unit("second", quota=q, priority=1))
    await t.sc.create_unit(s.unit("first", quota=q, priority=3))

    async def positioned() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = json.loads(t.run("list", "-o", "json").stdout)["items"]
        waiting = [i for i in items if i["position"] is not None]
        # A unit has a position once queued, its phase and reason (read from the unit) only once
        # the scheduler has parked it: wait for both.
        parked = all(i["phase"] == "Enqueued" for i in waiting)
        return items if len(waiting) == 2 and parked else None

    items = {
        i["name"]: i
        for i in await kube.eventually(positioned, what="positions from the visibility API, both parked")
    }
    assert (items["first"]["position"], items["second"]["position"]) == (1, 2)
    assert items["holder"]["phase"] == "Dequeued" and items["holder"]["position"] is None
    assert items["first"]["reason"] == f"no room in quota {q} for cpu"
    table = t.run("list").stdout.splitlines()
    assert table[0].split() == ["NAME", "QUEUE", "PHASE", "PRIORITY", "POSITION", "WAITED", "REASON"]
    assert any(line.split()[:5] == ["first", q, "Enqueued", "3", "1"] for line in table)
    only = json.loads(t.run("list", "--phase", "Dequeued", "-o", "json").stdout)["items"]
    assert [i["name"] for i in only] == ["holder"]

    everywhere = t.run("list", "-A")
    assert everywhere.returncode == 4
    assert (
        'permission denied: you may not list "queueunits.scheduling.x-k8s.io" cluster-wide'
        in everywhere.stderr
    )
    assert 'verb "list" on resource "queueunits" in API group "scheduling.x-k8s.io"' in everywhere.stderr
    admin = plugin(t.cluster, "list", "-A", "-o", "json")
    assert admin.returncode == 0, admin.stderr
    assert {i["name"] for i in json.loads(admin.stdout)["items"] if i["namespace"] == t.ns} == {
        "holder",
        "first",
        "second",
    }
    foreign = plugin(t.cluster, "explain", "x", "-n", "kube-system", user=USER)
    assert foreign.returncode == 4 and 'in namespace "kube-system"' in foreign.stderr


async def test_quotas_shows_the_tree_with_usage_and_waiting_work(t: Tenant) -> None:
    parent, child = t.sc.name("root"), t.sc.name("leaf")
    await t.sc.create_quota(s.quota(parent, cpu="3"))
    await t.sc.create_quota(s.quota(child, cpu="2", parent=parent))
    await t.sc.create_unit(s.unit("a", quota=child, cpu="2"))
    await t.sc.wait_phase("a", "Dequeued")
    await t.sc.create_unit(s.unit("b", quota=child, cpu="1"))
    await t.sc.wait_message("b", f"limited quotaName:{child}, limited resKey:cpu,; preempt failed")

    rows = {r["name"]: r for r in json.loads(t.run("quotas", "-o", "json").stdout)["items"]}
    assert rows[child]["parent"] == parent and rows[child]["depth"] == 1
    assert (rows[child]["used"], rows[child]["waiting"], rows[child]["waiting_request"]) == (
        "cpu=2",
        1,
        "cpu=1",
    )
    assert rows[parent]["used"] == "cpu=2" and rows[parent]["over_min"] == ""
    tree = t.run("quotas", "--tree").stdout
    assert f"└─ {child}" in tree and "≥cpu=2" in tree and "BORROWED" in tree
    admin = plugin(t.cluster, "quotas", "--tree", "-A")
    assert admin.returncode == 0 and f"└─ {child}" in admin.stdout and "≥" not in admin.stdout


async def test_priority_within_the_quota_cap_is_set_and_above_it_refused(t: Tenant) -> None:
    q = t.sc.name("cap")
    await t.sc.create_quota(s.quota(q, cpu="4", annotations={names.MAX_USER_PRIORITY_ANNOTATION: "50"}))
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "urgent", "namespace": t.ns, "labels": {names.QUOTA_NAME_LABEL: q}},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
            }
        },
    }
    assert tenancy.as_user(t.cluster, USER, "create", "-f", "-", input_text=json.dumps(job)).returncode == 0
    await t.sc.wait_unit("urgent")
    refused = t.run("priority", "urgent", "80")
    assert refused.returncode == 1
    assert "priority 80 is above the cap 50" in refused.stderr and f"(quota {q})" in refused.stderr
    done = t.run("priority", "urgent", "40")
    assert done.returncode == 0, done.stderr
    got = kube.kubectl(t.cluster, "get", "job", "urgent", "-n", t.ns, "-o", "json")
    assert json.loads(got.stdout)["metadata"]["annotations"][names.PRIORITY_ANNOTATION] == "40"

    async def followed() -> bool:
        unit = await t.sc.get_unit("urgent")
        return bool(unit["spec"].get("priority") == 40)

    await kube.eventually(followed, what="the unit's priority follows the job")
    other = plugin(t.cluster, "hold", "urgent", "-n", "kube-system", user=USER)
    assert other.returncode == 4 and 'verb "list" on resource "queueunits"' in other.stderr


def test_completion_scripts_and_the_kubectl_completion_hook() -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for shell in ("bash", "zsh"):
        script = subprocess.run(
            [str(BIN / "kubectl-koord_queue"), "completion", shell],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        assert "kubectl-koord_queue __complete" in script
    hook = subprocess.run(
        [str(BIN / "kubectl_complete-koord_queue"), "ex"], capture_output=True, text=True, env=env, check=True
    )
    assert hook.stdout == "explain\n:4\n"
    flags = subprocess.run(
        [str(BIN / "kubectl-koord_queue"), "__complete", "list", "-o", ""],
        capture_output=True,
        text=True,
        check=True,
    )
    assert flags.stdout.splitlines() == ["wide", "json", "yaml", "name", "jsonpath=", ":4"]
    commands = subprocess.run(
        [str(BIN / "kubectl_complete-koord_queue"), "st"], capture_output=True, text=True, env=env, check=True
    )
    assert commands.stdout == "stop\n:4\n"


# --- stop and resume a queue, describe, version, -o name / jsonpath, -l, --watch -------------------


async def test_stop_admits_nothing_keeps_places_and_resume_admits_in_order(t: Tenant) -> None:
    """docs/compatibility.md#stopping-a-queue: the admin stops a queue; a namespace user may not."""
    q = t.sc.name("stop")
    await t.sc.create_quota(s.quota(q, cpu="4"))
    await t.sc.create_unit(s.unit("running", quota=q))
    await t.sc.wait_phase("running", "Dequeued")

    refused = t.run("stop", q)  # alice: edit in her namespace, nothing on Queues
    assert refused.returncode == 4, refused.stderr
    assert 'permission denied: you may not patch "queues.scheduling.x-k8s.io"' in refused.stderr
    assert f'in namespace "{names.COMPONENT_NAMESPACE}"' in refused.stderr
    queue = await t.sc.get_queue(q)
    assert queue is not None and names.STOPPED_ANNOTATION not in (queue["metadata"].get("annotations") or {})

    stopped = t.run("stop", q, admin=True)
    assert stopped.returncode == 0, stopped.stderr
    assert f"queue {q} stopped: nothing new is admitted" in stopped.stdout
    await t.sc.wait_queue(
        q, lambda o: (o["metadata"].get("annotations") or {}).get(names.STOPPED_ANNOTATION) == "true"
    )
    await t.sc.create_unit(s.unit("low", quota=q, priority=1))
    await t.sc.create_unit(s.unit("high", quota=q, priority=9))
    text = f"queue {q} is stopped by an administrator; nothing is admitted until it is resumed"
    for name in ("low", "high"):
        unit = await t.sc.wait_message(name, text)
        assert unit["status"]["phase"] == "Enqueued"
    assert (await t.sc.get_unit("running"))["status"]["phase"] == "Dequeued"  # admitted: untouched
    listed = json.loads(t.run("list", "-o", "json").stdout)["items"]
    short = f"queue {q} is stopped by an administrator"
    assert {i["name"]: i["reason"] for i in listed if i["name"] != "running"} == {"low": short, "high": short}
    explained = await t.explained("low", "queue-stopped")
    assert explained["next_steps"] == [f"a cluster admin resumes it: kubectl koord-queue resume {q}"]

    resumed = t.run("resume", q, admin=True)
    assert resumed.returncode == 0, resumed.stderr
    await t.sc.wait_phase("high", "Dequeued")
    await t.sc.wait_phase("low", "Dequeued")
    queue = await t.sc.get_queue(q)
    assert queue is not None and names.STOPPED_ANNOTATION not in (queue["metadata"].get("annotations") or {})
    missing = t.run("stop", t.sc.name("no-such-queue"), admin=True)
    assert missing.returncode == 3 and "does not exist" in missing.stderr


async def test_describe_version_output_formats_and_selectors(t: Tenant) -> None:
    q = t.sc.name("fmt")
    await t.sc.create_quota(s.quota(q, cpu="1"))
    await t.sc.create_unit(s.unit("holder", quota=q))
    await t.sc.wait_phase("holder", "Dequeued")
    waiting = s.unit("waiting", quota=q)
    waiting["metadata"].setdefault("labels", {})["team"] = "blue"
    await t.sc.create_unit(waiting)
    await t.sc.wait_message("waiting", f"limited quotaName:{q}")

    described = t.run("describe", "waiting")
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0].split() == ["Name:", "waiting"] and ["Namespace:", t.ns] in [x.split() for x in lines]
    assert any(x.split()[:2] == ["Phase:", "Enqueued"] for x in lines)
    assert f"limited quotaName:{q}" in described.stdout and "Events:" in described.stdout
    assert "Admissions:\n  <none>" in described.stdout
    holder = t.run("describe", "holder").stdout
    assert (
        "Admissions:" in holder
        and "<none>" not in holder.split("Admissions:")[1].split("Admission Checks")[0]
    )
    assert t.run("describe", "nobody").returncode == 3

    version = t.run("version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.splitlines()[0].startswith("Plugin version: 0.")
    assert version.stdout.splitlines()[1].startswith("Server version: ")

    names_out = t.run("list", "-o", "name")
    assert names_out.returncode == 0, names_out.stderr
    assert names_out.stdout.splitlines() == [
        "queueunit.scheduling.x-k8s.io/holder",
        "queueunit.scheduling.x-k8s.io/waiting",
    ]
    template = '{range .items[*]}{.metadata.name}={.status.phase}{"\\n"}{end}'
    ranged = t.run("list", "-o", f"jsonpath={template}")
    assert ranged.stdout == "holder=Dequeued\nwaiting=Enqueued\n", ranged.stderr
    selected = t.run("list", "-l", "team=blue", "-o", "jsonpath={.items[*].metadata.name}")
    assert selected.stdout == "waiting", selected.stderr
    assert t.run("list", "-l", "team=green", "-o", "name").stdout == ""
    quotas = t.run("quotas", "-o", "jsonpath={.items[*].metadata.name}")
    assert quotas.returncode == 0 and q in quotas.stdout.split(), quotas.stderr
    assert f"elasticquota.scheduling.sigs.k8s.io/{q}" in t.run("quotas", "-o", "name").stdout.splitlines()
    bad = t.run("list", "-o", "jsonpath={..name}")
    assert bad.returncode == 2 and "recursive descent" in bad.stderr


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_list_watch_prints_again_when_a_unit_changes(t: Tenant) -> None:
    q = t.sc.name("watch")
    await t.sc.create_quota(s.quota(q, cpu="1"))
    await t.sc.create_unit(s.unit("early", quota=q))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    command = [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={t.cluster.kubeconfig}", f"--as={USER}"]
    proc = await asyncio.create_subprocess_exec(
        *command,
        "list",
        "-w",
        "-n",
        t.ns,
        "-o",
        "name",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        # Ctrl-C as at a terminal: a suite started in the background (``make test &``, nohup) ignores
        # SIGINT, and an ignored SIGINT is inherited through kubectl's exec by the plugin.
        preexec_fn=_interruptible,
    )
    assert proc.stdout is not None
    try:

        async def line() -> str:
            assert proc.stdout is not None
            return (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()

        assert await line() == "queueunit.scheduling.x-k8s.io/early\n"  # the first listing
        await t.sc.create_unit(s.unit("late", quota=q))
        seen = ""
        while "queueunit.scheduling.x-k8s.io/late" not in seen:  # printed again on the watch event
            seen = await line()
        assert proc.returncode is None  # still watching
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), timeout=15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode in (130, -signal.SIGINT)
