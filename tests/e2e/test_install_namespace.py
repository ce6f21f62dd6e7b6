"""koord-queue installed in another namespace than ``koord-queue`` (docs/operations.md#install-namespace).

A control plane of its own holds one install, in ``platform-queue``: the webhook and the reconciler
are told that namespace (``--namespace``, as the manifests tell them through ``POD_NAMESPACE``), and
the RBAC and admission policies of ``manifests/`` are moved there as ``helm install -n`` moves them.
Then:

* a quota's Queue, the ConfigMaps ``koord-queue-quota-bindings`` and ``koord-queue-native-gangs``
  and the leader Lease appear in ``platform-queue`` and nothing of them in ``koord-queue``; a
  labelled Job is admitted, and one that does not fit waits and is published on that Queue's status;
  the plugin with ``--koord-queue-namespace`` lists both and explains the waiting one, reads the
  component configuration there, and stops and resumes the Queue there;
* the hostile case: ``koord-queue`` is now an ordinary namespace, and its tenant (given the right to
  write Queues there by a careless admin) creates a stopped, Block-policy Queue named after another
  team's quota, before that quota exists. The reconciler never reads it: the team's Queue is made
  in ``platform-queue`` and its job is admitted, and the tenant's Queue is left as she wrote it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared.api import names
from koord_queue.shared.jobs import base
from testenv import binaries, system
from testenv.cluster import LocalCluster
from testenv.processes import Component
from tests import kube, tenancy

pytestmark = pytest.mark.e2e

HOME = "platform-queue"
#: Once the install lives elsewhere, a tenant's namespace like any other.
OLD_HOME = names.COMPONENT_NAMESPACE
BIN = Path(sys.executable).parent
CONFIG = """\
apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
nativeGangHandoff: true
"""


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane with the system installed in :data:`HOME`."""
    cluster = LocalCluster(
        profile="e2e", workdir=tmp_path_factory.mktemp("install-ns-cp"), nodes=2, pod_duration_s=3.0
    )
    cluster.start()
    components: list[Component] = []
    logdir = tmp_path_factory.mktemp("install-ns-system")
    try:
        system.install_crds(cluster)
        system.create_namespace(cluster, HOME)
        # The component configuration as the install ships it, moved to HOME (the plugin reads it).
        shipped = [d for d in system.rendered_manifests() if d["kind"] == "ConfigMap"]
        kube.kubectl(
            cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(system.in_namespace(shipped, HOME))
        )
        config = logdir / "config.yaml"
        config.write_text(CONFIG)
        webhook, _ = system.start_webhook(cluster, logdir=logdir, namespace=HOME)
        components.append(webhook)
        system.install_policies(cluster, HOME)
        election = ["--leader-elect", "--lease-duration=4", "--renew-deadline=3", "--retry-period=1"]
        components.append(
            system.start_reconciler(
                cluster, logdir=logdir, namespace=HOME, extra_args=[f"--config={config}", *election]
            )
        )
        yield cluster
    finally:
        for component in reversed(components):
            component.stop()
        for name in ("webhook", "reconciler"):
            log = logdir / f"{name}.log"
            if log.exists():
                print(f"--- {name} log (tail) ---")
                print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))
        cluster.stop()


def plugin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl koord-queue ARGS`` as an admin, with the package's console scripts on PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    env.pop("KOORD_QUEUE_NAMESPACE", None)
    command = [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={cluster.kubeconfig}", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)


def get(cluster: LocalCluster, *args: str) -> dict[str, Any] | None:
    out = kube.kubectl(cluster, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def job(name: str, namespace: str, quota: str, *, cpu: str = "1", runs: str = "3s") -> str:
    """A one-pod Job; its pod runs ``runs`` on a kwok node."""
    return json.dumps(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {names.QUOTA_NAME_LABEL: quota}},
            "spec": {
                "template": {
                    "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": runs}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                        ],
                    },
                }
            },
        }
    )


async def admitted(cluster: LocalCluster, namespace: str, name: str) -> None:
    """Wait until the Job was held by the webhook and then admitted by the reconciler."""

    async def probe() -> bool:
        unit = get(cluster, "queueunit", name, "-n", namespace) or {}
        found = get(cluster, "job", name, "-n", namespace) or {}
        phase = (unit.get("status") or {}).get("phase")
        # Held by the webhook (its enqueue stamp), then admitted and resumed by the reconciler.
        let_go = bool(found) and base.is_enqueued(found) and base.is_dequeued(found)
        return let_go and phase in ("Dequeued", "Running", "Succeed") and not found["spec"].get("suspend")

    await kube.eventually(probe, timeout=90, what=f"Job {namespace}/{name} admitted")


async def test_everything_lives_in_the_install_namespace_and_jobs_are_admitted(moved: LocalCluster) -> None:
    cluster, team = moved, "team-ns"
    system.create_namespace(cluster, team)
    kube.apply_quota(cluster, team, team, cpu="2")

    async def kept_in_home() -> bool:
        queue = get(cluster, "queue", team, "-n", HOME)
        bindings = get(cluster, "configmap", names.QUOTA_BINDINGS_CONFIGMAP, "-n", HOME)
        gangs = get(cluster, "configmap", "koord-queue-native-gangs", "-n", HOME)
        lease = get(cluster, "lease", "koord-queue-reconciler", "-n", HOME)
        return bool(queue and bindings and team in json.dumps(bindings.get("data")) and gangs and lease)

    await kube.eventually(kept_in_home, timeout=60, what=f"Queue, ConfigMaps and Lease in {HOME}")
    left = kube.kubectl(
        cluster, "get", "queues,configmaps,leases", "-n", OLD_HOME, "-o", "name"
    ).stdout.split()
    assert left == ["configmap/kube-root-ca.crt"], left

    kube.kubectl(cluster, "apply", "-f", "-", input_text=job("work", team, team, runs="300s"))
    await admitted(cluster, team, "work")
    # One that does not fit waits, and the scheduler publishes it on the Queue in HOME.
    kube.kubectl(cluster, "apply", "-f", "-", input_text=job("waits", team, team, cpu="2"))

    async def published() -> list[dict[str, Any]]:
        queue = get(cluster, "queue", team, "-n", HOME) or {}
        active = ((queue.get("status") or {}).get("queueItemDetails") or {}).get("active") or []
        return [a for a in active if a.get("name") == "waits" and a.get("namespace") == team]

    await kube.eventually(published, timeout=60, what=f"the waiting job on Queue {HOME}/{team}'s status")

    listed = plugin(cluster, f"--koord-queue-namespace={HOME}", "-n", team, "list", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.split()) == [f"queueunit.scheduling.x-k8s.io/{n}" for n in ("waits", "work")]
    explained = plugin(cluster, "--koord-queue-namespace", HOME, "-n", team, "explain", "waits", "-o", "json")
    assert explained.returncode == 0, explained.stderr
    answer = json.loads(explained.stdout)
    assert answer["reason"] == "quota" and answer["quota"] == team, answer
    # It read the Queues and the configuration of HOME: nothing was derived or assumed.
    unread = [
        u for u in answer["unknowns"] if u.startswith(("the Queues", "Queue ")) or "koord-queue-config" in u
    ]
    assert not unread and answer["policy"] == "Priority", answer["unknowns"]
    # Without the flag it looks in koord-queue, finds no configuration there, and says so.
    default = plugin(cluster, "-n", team, "explain", "waits", "-o", "json")
    assert default.returncode == 0, default.stderr
    assert any(
        f"{OLD_HOME}/koord-queue-config not found" in u for u in json.loads(default.stdout)["unknowns"]
    )

    # An administrator's writes go there too.
    stopped = plugin(cluster, f"--koord-queue-namespace={HOME}", "stop", team)
    assert stopped.returncode == 0, stopped.stderr
    queue = get(cluster, "queue", team, "-n", HOME) or {}
    assert queue["metadata"]["annotations"].get(names.STOPPED_ANNOTATION) == "true"
    resumed = plugin(cluster, f"--koord-queue-namespace={HOME}", "resume", team)
    assert resumed.returncode == 0, resumed.stderr
    queue = get(cluster, "queue", team, "-n", HOME) or {}
    assert queue["metadata"].get("annotations", {}).get(names.STOPPED_ANNOTATION) != "true"


async def test_a_queue_a_tenant_makes_outside_the_install_namespace_is_never_used(
    moved: LocalCluster,
) -> None:
    cluster, victim = moved, "team-victim"
    tenancy.grant(cluster, OLD_HOME, tenancy.ALICE)
    # A careless admin lets her write Queues in her namespace (the user roles never do).
    kube.kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        input_text=yaml.safe_dump_all(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "alice-queues", "namespace": OLD_HOME},
                    "rules": [{"apiGroups": [names.GROUP], "resources": ["queues"], "verbs": tenancy.WRITE}],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "alice-queues", "namespace": OLD_HOME},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "alice-queues",
                    },
                    "subjects": [
                        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenancy.ALICE}
                    ],
                },
            ]
        ),
    )
    # Her Queue, named after the other team's quota before that quota exists: stopped, and Block.
    trap = {
        "apiVersion": names.API_VERSION,
        "kind": "Queue",
        "metadata": {
            "name": victim,
            "namespace": OLD_HOME,
            "annotations": {names.STOPPED_ANNOTATION: "true"},
        },
        "spec": {"queuePolicy": "Block", "priority": 1},
    }
    await tenancy.create_as(cluster, OLD_HOME, trap)
    written = get(cluster, "queue", victim, "-n", OLD_HOME) or {}
    assert written["metadata"]["annotations"][names.STOPPED_ANNOTATION] == "true"

    system.create_namespace(cluster, victim)
    kube.apply_quota(cluster, victim, victim, cpu="2")
    kube.kubectl(cluster, "apply", "-f", "-", input_text=job("victim-work", victim, victim))
    await admitted(cluster, victim, "victim-work")

    # The team's Queue is the reconciler's own, in HOME: Priority, not stopped.
    queue = get(cluster, "queue", victim, "-n", HOME) or {}
    assert queue["spec"]["queuePolicy"] == "Priority"
    assert names.STOPPED_ANNOTATION not in queue["metadata"].get("annotations", {})
    # Hers is as she wrote it: the reconciler neither adopted, patched nor published status on it.
    mine = get(cluster, "queue", victim, "-n", OLD_HOME) or {}
    assert mine["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert "status" not in mine or not mine["status"]
    # The plugin pointed at the install reads the real Queue.
    explained = plugin(
        cluster, f"--koord-queue-namespace={HOME}", "-n", victim, "explain", "victim-work", "-o", "json"
    )
    assert explained.returncode == 0, explained.stderr
    answer = json.loads(explained.stdout)
    assert answer["reason"] != "queue-stopped" and answer["policy"] == "Priority", answer
