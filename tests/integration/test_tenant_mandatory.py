"""Mandatory queueing against a real kube-apiserver (docs/operations.md#mandatory-queueing), both ways.

Off (the default, the shared system): an unlabelled Job of alice's runs untouched. On (a control
plane of its own, whose reconciler is configured with ``manageJobsWithoutQuotaName`` and a namespace
selector, and whose webhook is registered with the webhooks for unlabelled jobs): alice's unlabelled
Job is held, labelled with her namespace's default quota and admitted there; as alice (the built-in
``edit`` role, ``tests/tenancy.py``) removing that label, adding a forged controller owner reference
or releasing a queued job is refused; and in a selected namespace without a quota her job stays held
with a Warning ``NoDefaultQuota``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from tests import kube, tenancy

pytestmark = pytest.mark.integration

ALICE = tenancy.ALICE
SELECTOR_LABEL = "koord-queue/mandatory"
CONFIG = (
    "apiVersion: scheduling.k8s.io/v1\n"
    "kind: KoordQueueConfiguration\n"
    "manageJobsWithoutQuotaName: true\n"
    "managedJobsNamespaceSelector:\n"
    f"  matchLabels: {{{SELECTOR_LABEL}: 'true'}}\n"
)
Obj = dict[str, Any]


def unlabelled_job(name: str, *, cpu: str = "1") -> Obj:
    container = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def get_job(cluster: LocalCluster, namespace: str, name: str) -> Obj:
    out = kube.kubectl(cluster, "get", "job", name, "-n", namespace, "-o", "json")
    job: Obj = json.loads(out.stdout)
    return job


def get_unit(cluster: LocalCluster, namespace: str, name: str) -> Obj | None:
    out = kube.kubectl(cluster, "get", "queueunit", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def as_alice(cluster: LocalCluster, namespace: str, *args: str, obj: Obj | None = None) -> Any:
    text = json.dumps(obj) if obj is not None else None
    return tenancy.as_user(cluster, ALICE, "-n", namespace, *args, input_text=text)


async def alice_may_create(cluster: LocalCluster, namespace: str, body: Obj) -> None:
    """alice's rights take a moment to load: retry her create until RBAC lets it in."""

    async def attempt() -> bool:
        done = as_alice(cluster, namespace, "create", "-f", "-", obj=body)
        assert "forbidden: User" not in done.stderr or "cannot create" not in done.stderr, done.stderr
        return done.returncode == 0 or "AlreadyExists" in done.stderr

    await kube.eventually(attempt, timeout=30, what=f"alice creating {body['metadata']['name']}")


# --- off: the default -----------------------------------------------------------------------------


async def test_off_by_default_an_unlabelled_job_runs_untouched(
    integration_cluster: LocalCluster, system_integration: system.Processes, namespace_in: str
) -> None:
    tenancy.grant(integration_cluster, namespace_in, ALICE)
    await alice_may_create(integration_cluster, namespace_in, unlabelled_job("free"))
    job = get_job(integration_cluster, namespace_in, "free")
    assert job["spec"].get("suspend") is not True
    assert names.JOB_HAS_ENQUEUED_ANNOTATION not in (job["metadata"].get("annotations") or {})
    gates = job["spec"]["template"]["spec"].get("schedulingGates") or []
    assert {"name": names.ADMISSION_GATE} not in gates
    assert get_unit(integration_cluster, namespace_in, "free") is None


# --- on: a control plane of its own ---------------------------------------------------------------


@dataclass(frozen=True)
class Mandatory:
    cluster: LocalCluster
    logdir: Path

    async def namespace(self, *, selected: bool) -> str:
        name = f"m-{uuid.uuid4().hex[:8]}"
        kube.kubectl(self.cluster, "create", "namespace", name)
        if selected:
            kube.kubectl(self.cluster, "label", "namespace", name, f"{SELECTOR_LABEL}=true")
            await self.selected(name)
        tenancy.grant(self.cluster, name, ALICE)
        return name

    async def selected(self, namespace: str) -> None:
        """The apiserver sees the namespace's label (its webhook selectors read a namespace cache):
        an unlabelled Job, created as a server-side dry run, comes back held."""

        async def held() -> bool:
            out = kube.kubectl(
                self.cluster,
                "create",
                "--dry-run=server",
                "-n",
                namespace,
                "-o",
                "json",
                "-f",
                "-",
                input_text=json.dumps(unlabelled_job("probe")),
            )
            return json.loads(out.stdout)["spec"].get("suspend") is True

        await kube.eventually(held, timeout=30, what=f"namespace {namespace} selected by the webhook")


@pytest.fixture(scope="class")
def mandatory_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mandatory]:
    logdir = tmp_path_factory.mktemp("mandatory")
    cluster = LocalCluster(profile="integration", workdir=logdir / "cp")
    cluster.start()
    processes = system.Processes()
    try:
        system.install_crds(cluster)
        config = logdir / "config.yaml"
        config.write_text(CONFIG)
        webhook, port = system.start_webhook(cluster, logdir=logdir, register=False)
        processes.components.append(webhook)
        processes.webhook_port = port
        system.register_webhook(
            cluster, port=port, mandatory_namespaces={"matchLabels": {SELECTOR_LABEL: "true"}}
        )
        reconciler = system.start_reconciler(cluster, logdir=logdir, extra_args=["--config", str(config)])
        processes.components.append(reconciler)
        yield Mandatory(cluster, logdir)
        processes.check()
    finally:
        processes.stop()
        log = logdir / "reconciler.log"
        if log.exists():
            print("--- reconciler (mandatory) ---\n" + "\n".join(log.read_text().splitlines()[-60:]))
        cluster.stop()


class TestMandatoryQueueing:
    async def test_an_unlabelled_job_is_held_labelled_with_the_namespace_quota_and_admitted(
        self, mandatory_system: Mandatory
    ) -> None:
        m = mandatory_system
        ns = await m.namespace(selected=True)
        kube.apply_quota(m.cluster, ns, ns, cpu="2")
        await alice_may_create(m.cluster, ns, unlabelled_job("train"))
        held = get_job(m.cluster, ns, "train")
        # Held at the door though unlabelled (it may be admitted and released already: it fits).
        assert names.JOB_HAS_ENQUEUED_ANNOTATION in held["metadata"]["annotations"]
        assert {"name": names.ADMISSION_GATE} in held["spec"]["template"]["spec"]["schedulingGates"]

        async def labelled_and_admitted() -> Obj | None:
            job = get_job(m.cluster, ns, "train")
            unit = get_unit(m.cluster, ns, "train")
            if (job["metadata"].get("labels") or {}).get(names.QUOTA_NAME_LABEL) != ns or unit is None:
                return None
            admitted = (unit.get("status") or {}).get("phase") in ("Dequeued", "Running")
            released = names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION in (job["metadata"].get("annotations") or {})
            return job if admitted and released else None

        job = await kube.eventually(labelled_and_admitted, timeout=60, what="the job labelled and admitted")
        assert job["spec"]["suspend"] is False  # released by the queue, not past it

        # The event is queued when the label is written and written by the asynchronous event
        # writer, in no step with the admission: wait for it.
        async def told() -> bool:
            reasons = [e["reason"] for e in kube.events_of(m.cluster, ns, "train")]
            assert names.EventReason.DEFAULT_QUOTA in reasons, reasons
            return True

        await kube.eventually(told, what="the DefaultQuota event on the job")

    async def test_alice_cannot_take_a_queued_job_out_of_the_queue(self, mandatory_system: Mandatory) -> None:
        m = mandatory_system
        ns = await m.namespace(selected=True)
        kube.apply_quota(m.cluster, ns, ns, cpu="1")
        await alice_may_create(m.cluster, ns, unlabelled_job("big", cpu="4"))  # never fits: stays queued

        async def labelled() -> bool:
            labels = get_job(m.cluster, ns, "big")["metadata"].get("labels") or {}
            return labels.get(names.QUOTA_NAME_LABEL) == ns

        await kube.eventually(labelled, timeout=60, what="the job labelled with its default quota")
        label_off = as_alice(m.cluster, ns, "label", "job", "big", f"{names.QUOTA_NAME_LABEL}-")
        assert label_off.returncode != 0 and "quota" in label_off.stderr, label_off.stderr
        job = get_job(m.cluster, ns, "big")
        owner = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "name": "parent",
            "uid": str(uuid.uuid4()),
            "controller": True,
        }
        patch = {
            "metadata": {"ownerReferences": [owner], "resourceVersion": job["metadata"]["resourceVersion"]}
        }
        forged = as_alice(m.cluster, ns, "patch", "job", "big", "--type=merge", "-p", json.dumps(patch))
        assert forged.returncode != 0 and "ownerReferences" in forged.stderr, forged.stderr
        release = as_alice(
            m.cluster, ns, "patch", "job", "big", "--type=merge", "-p", '{"spec":{"suspend":false}}'
        )
        assert release.returncode != 0, release.stderr
        assert get_job(m.cluster, ns, "big")["spec"]["suspend"] is True

    async def test_without_a_default_quota_the_job_stays_held_with_a_warning(
        self, mandatory_system: Mandatory
    ) -> None:
        m = mandatory_system
        ns = await m.namespace(selected=True)
        await alice_may_create(m.cluster, ns, unlabelled_job("orphan"))

        async def warned() -> bool:
            reasons = [e["reason"] for e in kube.events_of(m.cluster, ns, "orphan")]
            return names.EventReason.NO_DEFAULT_QUOTA in reasons

        await kube.eventually(warned, timeout=60, what="the NoDefaultQuota warning")
        job = get_job(m.cluster, ns, "orphan")
        assert job["spec"]["suspend"] is True
        assert names.QUOTA_NAME_LABEL not in (job["metadata"].get("labels") or {})
        # The quota arriving later releases it into its queue.
        kube.apply_quota(m.cluster, ns, ns, cpu="2")

        async def admitted() -> bool:
            unit = get_unit(m.cluster, ns, "orphan")
            return unit is not None and (unit.get("status") or {}).get("phase") in ("Dequeued", "Running")

        await kube.eventually(admitted, timeout=60, what="the job admitted once its quota exists")

    async def test_an_unselected_namespace_keeps_its_unlabelled_jobs_unqueued(
        self, mandatory_system: Mandatory
    ) -> None:
        m = mandatory_system
        ns = await m.namespace(selected=False)
        await alice_may_create(m.cluster, ns, unlabelled_job("free"))
        assert get_job(m.cluster, ns, "free")["spec"].get("suspend") is not True
