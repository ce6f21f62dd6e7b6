"""An upgrade from the previous release keeps every QueueUnit and its admission
(docs/operations.md#upgrade).

The previous release is the commit ``hack/previous-release.yaml`` names. Its source is exported
with ``git archive`` and run as it was: its CRDs and admission policies (``kubectl kustomize`` of
its ``manifests/``), and its own webhook and reconciler (``python -m koord_queue.<part>.main`` from
that tree, with this venv's dependencies). On a control plane of this module's own (kwok nodes, the
Job controller) a 4-CPU quota admits two batch Jobs and a TFJob (no operator runs, so its unit stays
``Dequeued``) and queues a Job and a TFJob behind them.

Then the upgrade, as ``helm upgrade`` does it: the old processes stop, the CRDs and policies the
current chart renders (helm from the testenv cache) are applied server-side, and the current
webhook and reconciler start. A new job is parked by the new scheduler as over the quota: the proof
that it has run a cycle over the state it inherited. By then no unit was re-admitted or evicted (a
record of every unit version since before the upgrade: the same admissions and admitted phases
throughout, the jobs' dequeue stamps unchanged), the queued ones still wait, and the quota's usage is
what it was. Deleting one admitted Job frees 2 CPUs, and the two queued jobs are admitted.

CI runs on a clone with the full history; a clone without the previous release's commit fails here
with a message saying so, rather than testing nothing.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.certs import pki
from koord_queue.shared import kube as kq
from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from koord_queue.shared.jobs import registry
from testenv import binaries, kinds, system
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from testenv.processes import Component, free_port, http_ok, spawn, wait_until
from tests import kube
from tests.scenario import Scenario, phase, status

pytestmark = pytest.mark.e2e

ROOT = binaries.PROJECT_ROOT
RECORD = ROOT / "hack" / "previous-release.yaml"
UNITS = kq.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
NS = "upgrade"
QUOTA = "upgrade"
ADMITTED = ("Dequeued", "Running", "SchedSucceed")


def previous_release() -> tuple[str, str]:
    """The version and commit of the previous release (``hack/previous-release.yaml``)."""
    record = yaml.safe_load(RECORD.read_text())
    return str(record["version"]), str(record["commit"])


def export(commit: str, dest: Path) -> Path:
    """``git archive <commit>`` unpacked into ``dest`` (links kept as links, as ``make dist``)."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"the previous release's commit {commit} (hack/previous-release.yaml) is not in this clone "
            f"of {ROOT}: the upgrade test needs the full history (git fetch --unshallow)"
        )
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def install_objects(cluster: LocalCluster, docs: list[dict[str, Any]], *, manager: str) -> None:
    """The CRDs, ValidatingAdmissionPolicies and their bindings among ``docs``; waits for the CRDs."""
    wanted = {"CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    chosen = [d for d in docs if d and d.get("kind") in wanted]
    cluster.apply_docs(chosen, manager=manager)
    cluster.wait_for_crds([d["metadata"]["name"] for d in chosen if d["kind"] == "CustomResourceDefinition"])


def kustomized(tree: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(binaries.kubectl()), "kustomize", str(tree / "manifests")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def chart_rendered() -> list[dict[str, Any]]:
    """``helm template`` of the current chart in the install namespace, with its default values."""
    out = subprocess.run(
        [
            str(binaries.helm()),
            "template",
            "koord-queue",
            str(ROOT / "charts" / "koord-queue"),
            f"--namespace={names.COMPONENT_NAMESPACE}",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def foreign_crds(cluster: LocalCluster) -> None:
    """The test CRDs of the foreign job kinds (not part of any release)."""
    docs: list[dict[str, Any]] = []
    for path in sorted((ROOT / "tests" / "crds").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    docs += kinds.generated_crds()
    cluster.apply_docs(docs, manager="tests")
    cluster.wait_for_crds([d["metadata"]["name"] for d in docs])


def start_previous(cluster: LocalCluster, tree: Path, logdir: Path) -> list[Component]:
    """The previous release's webhook and reconciler, run from its own tree: ``python -m`` puts the
    working directory first on the path, ahead of the editable install of this checkout."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)}
    where = subprocess.run(
        [sys.executable, "-c", "import koord_queue.reconciler.main as m; print(m.__file__)"],
        cwd=tree,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).resolve().is_relative_to(tree.resolve()), where

    serving = pki.issue_serving(
        ca=cluster.ca,
        common_name="koord-queue-webhook",
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
        now=datetime.now(UTC),
    )
    certs = logdir / "previous-certs"
    certs.mkdir(parents=True, exist_ok=True)
    pki.write_pem(certs / "tls.crt", serving.cert_pem, private=False)
    pki.write_pem(certs / "tls.key", serving.key_pem, private=True)
    port, metrics = free_port(), free_port()
    webhook = spawn(
        "previous-webhook",
        [
            sys.executable,
            "-m",
            "koord_queue.webhook.main",
            f"--port={port}",
            f"--cert-file={certs / 'tls.crt'}",
            f"--key-file={certs / 'tls.key'}",
            f"--metrics-port={metrics}",
            f"--reconciler-username={system.RECONCILER_USER}",
        ],
        logdir / "previous-webhook.log",
        env=env,
        cwd=tree,
    )
    started = [webhook]
    try:
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{metrics}/metrics"),
            timeout=30,
            what="the previous webhook",
            process=webhook,
        )
        system.register_webhook(cluster, port=port)
        kubeconfig = cluster.kubeconfig_for(
            "previous-reconciler", user=system.RECONCILER_USER, groups=("system:masters",)
        )
        health = free_port()
        reconciler = spawn(
            "previous-reconciler",
            [
                sys.executable,
                "-m",
                "koord_queue.reconciler.main",
                f"--kubeconfig={kubeconfig}",
                f"--health-port={health}",
                f"--metrics-port={free_port()}",
                f"--visibility-port={free_port()}",
                "--bind-address=127.0.0.1",
            ],
            logdir / "previous-reconciler.log",
            env=env,
            cwd=tree,
        )
        started.append(reconciler)
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{health}/readyz"),
            timeout=60,
            what="the previous reconciler /readyz",
            process=reconciler,
        )
    except BaseException:
        for component in reversed(started):
            component.stop()
        raise
    return started


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        profile="e2e", workdir=tmp_path_factory.mktemp("upgrade-cp"), nodes=2, pod_duration_s=3.0
    )
    cluster.start()
    try:
        cluster.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": names.COMPONENT_NAMESPACE}},
        )
        foreign_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


def batch_job(name: str, *, pods: int = 1) -> dict[str, Any]:
    """``pods`` pods of 1 CPU that run until the test ends."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: QUOTA}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {
                "metadata": {"annotations": {COMPLETE_DELAY_ANNOTATION: "3600s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                    ],
                },
            },
        },
    }


def tf_job(name: str) -> dict[str, Any]:
    """One 1-CPU worker; no operator runs here, so an admitted one stays resumed without pods."""
    template = {
        "spec": {
            "containers": [
                {"name": "tensorflow", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
            ]
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: QUOTA}},
        "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template}}},
    }


def tf_unit(name: str) -> str:
    adapter = registry.by_kind("kubeflow.org/v1", "TFJob")
    assert adapter is not None
    return adapter.queue_unit_name(tf_job(name))


def granted(unit: dict[str, Any]) -> list[tuple[str, int]]:
    """The unit's admissions without the running counts (which follow the pods)."""
    return [(str(a.get("name")), int(a.get("replicas", 0))) for a in status(unit).get("admissions") or []]


def used_cpu(quota: dict[str, Any]) -> Any:
    return ((quota.get("status") or {}).get("used") or {}).get("cpu")


async def test_an_upgrade_from_the_previous_release_keeps_every_unit_and_its_admission(
    own_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = own_cluster
    version, commit = previous_release()
    tree = export(commit, tmp_path / f"koord-queue-{version}")
    install_objects(cluster, kustomized(tree), manager="previous-release")
    previous = start_previous(cluster, tree, tmp_path)
    current: system.Processes | None = None
    tf_run, tf_wait = tf_unit("tf-run"), tf_unit("tf-wait")
    admitted_units, queued_units = ("run-a", "run-b", tf_run), ("wait", tf_wait)
    try:
        async with kube.client(cluster) as api:
            await kube.create_namespace(api, NS)
            env = Scenario(api, cluster, NS, explain_with_pods=True)
            await env.create_quota(
                {
                    "apiVersion": names.QUOTA_API_VERSION,
                    "kind": "ElasticQuota",
                    "metadata": {"name": QUOTA},
                    "spec": {"min": {"cpu": "4"}, "max": {"cpu": "4"}},
                },
                wait_queue=False,
            )

            # Under the previous release: 4 CPUs admitted in two kinds, 2 CPUs queued behind them.
            env.apply(batch_job("run-a"))
            env.apply(batch_job("run-b", pods=2))
            env.apply(tf_job("tf-run"))
            for name in ("run-a", "run-b"):
                await env.wait_unit(name, lambda u: phase(u) == "Running", what="running", timeout=60)
            await env.wait_unit(tf_run, lambda u: phase(u) in ADMITTED and bool(granted(u)), what="admitted")
            env.apply(batch_job("wait"))
            env.apply(tf_job("tf-wait"))
            for name in queued_units:
                await env.wait_message(name, Message.limited(QUOTA, "cpu"))

            async def quota_used(cpu: str) -> dict[str, Any] | None:
                got = await env.objects.get_namespaced_custom_object(
                    names.QUOTA_GROUP, names.QUOTA_VERSION, NS, names.QUOTA_PLURAL, QUOTA
                )
                return got if str(used_cpu(got)) == cpu else None

            await kube.eventually(lambda: quota_used("4"), what="the quota's usage published as 4 CPUs")
            before = {name: await env.get_unit(name) for name in (*admitted_units, *queued_units)}
            dequeued = {
                name: (await env.get_job(job))["metadata"]["annotations"][
                    names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION
                ]
                for name, job in (("run-a", "run-a"), ("run-b", "run-b"), (tf_run, tf_job("tf-run")))
            }

            async with kube.Recorder(cluster, UNITS, namespace=NS) as units:
                # The upgrade, as helm upgrade does it: the processes are replaced, the CRDs and
                # policies of the new chart applied server-side.
                for component in reversed(previous):
                    component.stop()
                install_objects(cluster, chart_rendered(), manager="helm")
                current = system.start(cluster, logdir=tmp_path / "current")

                env.apply(batch_job("probe"))
                await env.wait_message("probe", Message.limited(QUOTA, "cpu"), timeout=60)
                await units.sync()
                for name in admitted_units:
                    seen = [before[name], *units.versions(name)]  # the record holds changes only
                    assert all(granted(v) == granted(before[name]) for v in seen), (
                        name,
                        [granted(v) for v in seen],
                    )
                    assert all(phase(v) in ADMITTED for v in seen), (name, [phase(v) for v in seen])
                for name in queued_units:
                    assert all(not granted(v) for v in [before[name], *units.versions(name)]), name
                    assert phase(await env.get_unit(name)) == "Enqueued", name
                for name, job in (("run-a", "run-a"), ("run-b", "run-b"), (tf_run, tf_job("tf-run"))):
                    stored = await env.get_job(job)
                    assert (
                        stored["metadata"]["annotations"][names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION]
                        == dequeued[name]
                    )
                assert await quota_used("4"), "the quota's usage changed over the upgrade"

            # The new reconciler admits the queued jobs once quota frees.
            env.kubectl("delete", "-n", NS, "job", "run-b", "--wait=false")
            for name in queued_units:
                await env.wait_unit(
                    name, lambda u: bool(granted(u)), what="admitted once run-b is gone", timeout=60
                )
            assert not granted(await env.get_unit("probe"))
            await kube.eventually(lambda: quota_used("4"), what="the quota full again with the queued jobs")
            assert granted(await env.get_unit("run-a")) == granted(before["run-a"])
    finally:
        if current is not None:
            current.stop()
        for component in reversed(previous):
            component.stop()
