"""``kubectl koord-queue uninstall`` on a full control plane (docs/operations.md#uninstall).

The Job controller, the scheduler and kwok fake nodes run, with the webhook and the reconciler, on
a control plane of this module's own (the command deletes the cluster-wide webhook configurations
and admission policies every other test relies on). Three jobs share a quota of one CPU:

* ``steady`` (three completions, one at a time) was admitted and runs: its template keeps the gate,
  since a started Job's template is immutable, so every later pod is created gated;
* ``queued`` waits for the quota (its unit ``Enqueued``);
* ``unitless`` was held by the webhook after the reconciler stopped, so it never got a QueueUnit.

One run of the command releases ``queued`` and ``unitless`` (both run to the end ungated) and names
``steady``; ``steady``'s next pod is then created gated, which is the limitation the docs describe;
a second run with ``--follow`` ungates each of its pods as it appears and returns once the Job has
completed all three. In the end no pod carries the gate.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.cli import uninstall
from koord_queue.shared.api import names
from testenv import binaries, system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import kube
from tests.scenario import Scenario, gated, phase

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        profile="e2e", workdir=tmp_path_factory.mktemp("uninstall-cp"), nodes=2, pod_duration_s=3.0
    )
    cluster.start()
    try:
        system.install_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


def plugin(cluster: LocalCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``kubectl koord-queue ARGS`` as a cluster admin, with the package's console scripts on PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    command = [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={cluster.kubeconfig}", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def job(name: str, quota: str, *, completions: int = 1, run_for: str = "3s") -> dict[str, Any]:
    """A Job of one pod at a time asking for 1 CPU; each pod runs ``run_for`` on a fake node."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: quota}},
        "spec": {
            "parallelism": 1,
            "completions": completions,
            "template": {
                "metadata": {"annotations": {COMPLETE_DELAY_ANNOTATION: run_for}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:stable",
                            "resources": {"requests": {"cpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def label_as_installed(cluster: LocalCluster) -> None:
    """The local webhook configurations carry the label the manifests and the chart put on
    everything they install, by which the command finds them."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        kube.kubectl(
            cluster, "label", "--overwrite", kind, system.WEBHOOK_CONFIG_NAME, "=".join(uninstall.PART_OF)
        )


def complete(got: dict[str, Any], succeeded: int) -> bool:
    return (
        any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in (got.get("status") or {}).get("conditions") or []
        )
        and (got.get("status") or {}).get("succeeded") == succeeded
    )


async def test_uninstall_releases_held_jobs_and_follows_started_ones_to_their_end(
    own_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = own_cluster
    processes = system.start(cluster, logdir=tmp_path)
    try:
        label_as_installed(cluster)
        async with kube.client(cluster) as api:
            ns = "uninstall-e2e"
            await kube.create_namespace(api, ns)
            env = Scenario(api, cluster, ns, explain_with_pods=True)
            quota = await env.add_quota("uninstall-e2e", {"cpu": "1"})
            q = quota["metadata"]["name"]

            env.apply(job("steady", q, completions=3, run_for="6s"))
            await env.wait_unit(
                "steady", lambda u: phase(u) == "Running", what="admitted and running", timeout=60
            )
            env.apply(job("queued", q))
            await env.wait_phase("queued", "Enqueued")

            reconciler = next(c for c in processes.components if c.name == "reconciler")
            reconciler.stop()  # as if it crashed for good: the Deployment is not there to scale
            env.apply(job("unitless", q))
            held = await env.get_job("unitless")
            assert held["spec"]["suspend"] is True  # the webhook holds it on its own

            first = plugin(cluster, "uninstall", "--held=release", "--yes")
            assert first.returncode == 0, first.stderr
            assert f"released 2 held jobs: {ns}/job/queued, {ns}/job/unitless" in first.stdout
            assert f"kept the gate in the pod templates of 1 started Jobs: {ns}/job/steady" in first.stdout
            assert "--follow" in first.stdout
            assert "deleted 1 MutatingWebhookConfigurations: koord-queue-local" in first.stdout

            # The limitation: the started Job's next pod comes from its gated template.
            async def gated_pod_of_steady() -> Any:
                return next((p for p in await env.pods("steady") if gated(p)), None)

            await kube.eventually(gated_pod_of_steady, timeout=60, what="steady's next pod, created gated")
            steady = await env.get_job("steady")
            gates = steady["spec"]["template"]["spec"]["schedulingGates"]
            assert {"name": names.ADMISSION_GATE} in gates

            follow = plugin(cluster, "uninstall", "--held=release", "--yes", "--follow", timeout=180)
            assert follow.returncode == 0, follow.stderr
            assert "following 1 Jobs until they finish" in follow.stdout
            assert "ungated pod " in follow.stdout
            assert "the 1 Jobs finished or are gone" in follow.stdout

            assert complete(await env.get_job("steady"), 3)
            for name in ("queued", "unitless"):
                await env.wait_job(name, lambda j: complete(j, 1), what="ran to the end without the queue")
                assert not any(gated(p) for p in await env.pods(name)), name
            assert not any(gated(p) for p in await env.pods("steady"))
            assert sorted(u["metadata"]["name"] for u in await env.list_units()) == ["queued", "steady"]
            assert (
                yaml.safe_load(
                    kube.kubectl(cluster, "get", "validatingadmissionpolicies", "-o", "yaml").stdout
                )["items"]
                == []
            )
    finally:
        processes.stop()
