"""The hostile tenant: ``mallory``, a namespace user, attacks the queue while the load runs.

Threat model (docs/architecture.md#trust-boundaries): namespace users are untrusted. Nothing they
can write (labels, annotations, pod fields, the status of a CRD without a status subresource) may
let a job skip the queue, grant it quota, or change another namespace's accounting. ``mallory``
gets exactly a namespace user's rights (``tests.tenancy.grant``: the built-in ``edit`` ClusterRole,
with the koord-queue user roles aggregated into it, plus a Role with the job and pod rights
``edit`` has in a real cluster) in the load namespace ``chaos``, where she is a member of the team
whose jobs the load submits, and in a namespace of her own, ``chaos-mallory``, whose quota is
``chaos-mallory``. Every request of hers is impersonated (``Impersonate-User: mallory``), so it goes
through the real authentication, RBAC, admission webhooks and ValidatingAdmissionPolicies.

Each round (a few per run, spread over the load) picks live targets from the API, as she can see
them (queued Jobs; never-schedulable victim Jobs whose unit holds an admission, else the two
:data:`SENTINELS` the harness adds to the load; gated pods), and tries every attack of
:data:`ATTACKS` once. Each try ends in one of:

``refused``
    the API refused it (RBAC, our webhook, an admission policy, or the API's own validation); the
    message is kept;
``neutralised``
    the API accepted it, and the harm it aims at was verified not to happen (the forged pod is not
    counted in the unit's running pods, the forged status was stripped, the priority was clamped,
    the unit was never admitted, ...);
``undone``
    the API accepted it, it took effect, and the reconciler repaired it (how long that took is
    kept); the observer's invariants still judge what happened in between;
``SUCCEEDED``
    the attack worked: a ``tenant-bypass`` violation with the details;
``skipped``
    no live target this time (or the target changed or vanished under the attack).

Transient refusals are retried, not counted: the webhook or the apiserver down during a fault, 5xx,
429, and a just-restarted apiserver that has not loaded its RBAC bindings or an admission policy's
parameters yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from chaos import (
    load,
    tenant_dashboard,
    tenant_history,
    tenant_metrics,
    tenant_orphans,
    tenant_plant,
    tenant_pool_job,
    tenant_pools,
    tenant_preemption,
    tenant_release,
    tenant_submitter,
    tenant_web_dashboard,
    tenant_workflows,
)
from chaos.observer import Observer
from chaos.tenant_common import (
    JOBS as JOBS,
)
from chaos.tenant_common import (
    MANDATORY_NAMESPACE as MANDATORY_NAMESPACE,
)
from chaos.tenant_common import (
    NAMESPACE as NAMESPACE,
)
from chaos.tenant_common import (
    QUOTA as QUOTA,
)
from chaos.tenant_common import (
    QUOTAS as QUOTAS,
)
from chaos.tenant_common import (
    UNDO_S as UNDO_S,
)
from chaos.tenant_common import (
    UNITS as UNITS,
)
from chaos.tenant_common import (
    WATCH_S as WATCH_S,
)
from chaos.tenant_common import (
    WORKFLOWS as WORKFLOWS,
)
from chaos.tenant_common import (
    Sent as Sent,
)
from chaos.tenant_common import (
    _meta,
)
from chaos.tenant_common import (
    gated as gated,
)
from chaos.tenant_common import (
    held_cpu_milli as held_cpu_milli,
)
from chaos.tenant_common import (
    is_admitted_unit as is_admitted_unit,
)
from chaos.tenant_common import (
    runs as runs,
)
from koord_queue.shared import kube
from koord_queue.shared.api import names, quantities
from testenv.cluster import LocalCluster
from testenv.kwok import COMPLETE_DELAY_ANNOTATION
from tests import tenancy

USER: Final = "mallory"
QUOTA_CPU: Final = "2"
#: Her second namespace, where queueing is mandatory (docs/operations.md#mandatory-queueing): the
#: run's configuration selects namespaces with :data:`MANDATORY_LABEL`, and the namespace's default
#: quota is the one named after it. Its quota is too small for her jobs there, so they stay queued.
MANDATORY_LABEL: Final = "koord-queue/mandatory"
MANDATORY_QUOTA_CPU: Final = "1"
#: ``maxUserPriority`` of the run (the reconciler's configuration and the webhook's flag).
CLUSTER_PRIORITY_CAP: Final = 1000
#: ``koord-queue/max-user-priority`` on :data:`CAPPED_QUOTA` (at the load's own top priority).
QUOTA_PRIORITY_CAP: Final = 100
CAPPED_QUOTA: Final = "chaos-a"
#: Jobs of the load namespace the harness adds for this phase, under their own quota: admitted, never
#: bound (a node selector no node has), so their units report 0 running pods for the whole run and a
#: forged pod counted for them would show. Load victims are admitted only now and then.
SENTINELS: Final = ("sentinel-0", "sentinel-1")
SENTINEL_QUOTA: Final = "chaos-sentinel"
#: The default request of the LimitRange in her namespace (milli-CPU).
LIMIT_RANGE_CPU_MILLI: Final = 1000
#: PriorityClasses the harness makes for her: her quota's ``koord-queue/allowed-priority-classes``
#: lists only the low one, so naming the urgent one must not give her unit its value
#: (docs/compatibility.md#priority-cap).
ALLOWED_CLASS: Final = "chaos-mallory-low"
ALLOWED_CLASS_VALUE: Final = 10
FORBIDDEN_CLASS: Final = "chaos-mallory-urgent"
FORBIDDEN_CLASS_VALUE: Final = 1_000_000
#: The raw ``priority`` she writes into a pod template (the apiserver would refuse it on a pod).
RAW_TEMPLATE_PRIORITY: Final = 1_000_000
#: The highest priority a unit of her own namespace may carry, worked out from the run's settings
#: alone: the annotation is capped at the cluster's cap (her quota has none of its own), and the
#: only class her quota allows is the low one.
OWN_PRIORITY_BOUND: Final = max(CLUSTER_PRIORITY_CAP, ALLOWED_CLASS_VALUE)
#: How long the relabel attack waits for the Job controller to let go of the relabelled pod (it
#: may be relisting after a fault); the reconciler's UNDO_S starts only then.
LET_GO_S: Final = 90.0
#: How long a round looks for a gated pod when its listing had none.
HUNT_S: Final = 20.0

TFJOBS = kube.Resource("kubeflow.org", "v1", "tfjobs", "TFJob")
CRDS = kube.Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
NODES = kube.Resource("", "v1", "nodes", "Node", False)

#: attack -> the defence expected to stop it (the report's table).
ATTACKS: Final[dict[str, str]] = {
    "forged-status-create": "mutating webhook holds every managed job on CREATE (suspend, gate, "
    "dequeue stamp dropped); the forged status is dropped by the apiserver",
    "strip-enqueue-annotations": "validating webhook: system annotations of an unfinished managed job "
    "are frozen",
    "unsuspend-queued-job": "validating webhook: only the reconciler releases a hold; reconciler: a "
    "job running without its dequeue stamp is suspended again (HeldUnadmitted)",
    "strip-and-unsuspend-in-one-write": "validating webhook (the hold does not depend on the "
    "annotations); reconciler as above",
    "remove-template-gate": "validating webhook: a managed job's template keeps the admission gate",
    "relabel-to-another-quota": "validating webhook: the quota label is frozen while unfinished "
    "(and the quota-binding policy)",
    "remove-quota-label": "validating webhook: the quota label cannot be removed while unfinished",
    "child-of-missing-parent": "mutating webhook gates the pod template of a Job that claims a "
    "parent (its pods are born gated; the Job is not suspended, the webhook cannot resolve owners); "
    "reconciler resolves the claim: a labelled Job whose controller reference names a TFJob that "
    "does not exist is held and queued like any labelled Job (or garbage collected)",
    "unlabelled-job-in-mandatory-namespace": "mutating webhook for unlabelled jobs (registered with "
    "the namespace selector of manageJobsWithoutQuotaName) holds it on CREATE; reconciler labels it "
    "with the namespace's default quota, and holds it again if it ran (HeldUnadmitted); releasing it "
    "is refused like for any queued job",
    "forged-owner-on-queued-job": "validating webhook: no write takes an unfinished managed job out of "
    "the queue, so no controller owner reference naming a queued kind can be added to it "
    "(docs/operations.md#mandatory-queueing)",
    "ungate-pod-of-queued-job": "ValidatingAdmissionPolicy koord-queue-admission-gate; reconciler "
    "deletes a released unbound pod beyond the admission (UnadmittedPodDeleted)",
    "strip-pod-unit-annotation": "ValidatingAdmissionPolicy koord-queue-pod-links: a pod's unit "
    "annotations cannot be changed or removed",
    "relabel-released-pod-out-of-job": "the Job controller lets go of the pod and makes a gated "
    "replacement; reconciler deletes a released pod its job does not own (EscapedPodDeleted)",
    "bound-pod-in-own-namespace-claiming-job": "ValidatingAdmissionPolicy koord-queue-pod-birth (a pod "
    "naming a unit is born gated); reconciler counts a pod only in the unit's namespace and owned by "
    "its job's UID (shared/jobs/podlinks.py)",
    "bare-bound-pod-naming-unit": "ValidatingAdmissionPolicy koord-queue-pod-birth; reconciler counts "
    "a pod only if owned by the unit's job (owner UID), never by the related-queueunit annotation "
    "alone; out of the gate it is deleted (EscapedPodDeleted)",
    "gated-pod-with-plain-owner-reference": "reconciler releases a pod only when its controller "
    "reference is the job (or an intermediate the job controls); a plain reference carrying the "
    "job's UID proves nothing and the pod stays gated (PodKeptGated)",
    "oversized-pod-controlled-by-job": "reconciler releases a pod only when its stored requests fit "
    "the per-pod size its pod set was admitted with; a larger one stays gated (PodKeptGated)",
    "annotate-existing-pod-into-unit": "ValidatingAdmissionPolicy koord-queue-pod-links: a unit "
    "annotation cannot be added to a pod that exists; reconciler counts a pod only when its job "
    "controls it",
    "scale-admitted-job-past-quota": "only the scheduler changes what a unit holds: the job "
    "extension never grows an admission to the pods it finds (PodsBeyondAdmission instead), and "
    "the scheduler admits the added pods only within the quota",
    "delete-pod-to-run-replacement-beside-it": "a bound pod being deleted counts against the "
    "admission until it is gone: its replacement waits gated (shared/jobs/podplan.py PodView.live)",
    "pod-level-requests-above-containers": "reconciler charges a template's pod-level requests "
    "(spec.resources) as the kube-scheduler reserves them, not the containers' sum "
    "(shared/api/podtemplates.py)",
    "add-container-to-admitted-job": "validating webhook: an admitted job's container names, "
    "runtimeClassName and pod-set annotation are frozen; reconciler: a container the admitted "
    "template did not name gets the current LimitRange default and is charged as a resize "
    "(AdmittedJobResized)",
    "no-requests-under-limit-range": "reconciler charges a container without requests the "
    "namespace's LimitRange default request, as the apiserver fills it into the pods "
    "(shared/jobs/poddefaults.py)",
    "label-running-job-into-quota": "validating webhook: a job joining a queue must arrive held; "
    "reconciler: a managed job running without a dequeue stamp is held and queued, not adopted",
    "job-naming-unbound-quota": "ValidatingAdmissionPolicy koord-queue-quota-binding; the "
    "scheduler never admits a unit whose namespace is not bound to its quota",
    "priority-above-cluster-cap": "validating webhook: scheduling.x-k8s.io/priority <= maxUserPriority",
    "priority-above-quota-cap": "reconciler clamps the unit's priority to the quota's "
    "koord-queue/max-user-priority",
    "raw-template-priority": "reconciler ignores a pod template's raw priority (the apiserver "
    "refuses it on pods): only PriorityClasses and the capped annotation give a unit its priority",
    "disallowed-priority-class": "reconciler: a PriorityClass missing from the quota's "
    "koord-queue/allowed-priority-classes gives no priority (Warning PriorityClassNotAllowed)",
    "workflow-forged-succeeded": "mutating webhook strips the status of a kind without a status "
    "subresource on CREATE",
    "workflow-status-update": "validating webhook: only the reconciler and --status-writers change "
    "a Workflow's status",
    **tenant_workflows.ATTACKS,
    tenant_orphans.ATTACK: tenant_orphans.DEFENCE,
    tenant_submitter.ATTACK: tenant_submitter.DEFENCE,
    **tenant_pools.ATTACKS,
    **tenant_preemption.ATTACKS,
    **tenant_history.ATTACKS,
    **tenant_release.ATTACKS,
    **tenant_metrics.ATTACKS,
    **tenant_plant.ATTACKS,
    **tenant_dashboard.ATTACKS,
    **tenant_web_dashboard.ATTACKS,
    "write-queueunit-status": "RBAC: namespace users may only read QueueUnits (user roles)",
    "create-queueunit": "RBAC: namespace users may only read QueueUnits (user roles)",
    "raise-quota-max": "RBAC: ElasticQuotas are cluster-admin objects",
    "create-same-named-quota": "RBAC: ElasticQuotas are cluster-admin objects (and quota names are "
    "unique: ValidatingAdmissionPolicy koord-queue-quota-name refuses a held name, the reconciler "
    "keeps it with its first claimant)",
}
OUTCOMES: Final = ("refused", "neutralised", "undone", "SUCCEEDED", "skipped", "error")


@dataclass
class Attempt:
    attack: str
    round: int
    target: str
    outcome: str
    detail: str
    #: seconds until the reconciler repaired an accepted attack (``undone``)
    seconds: float | None = None


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def quota_label(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(label key, quota)`` of a managed job, the Koordinator label first."""
    labels = _labels(job)
    for key in (names.QUOTA_NAME_LABEL, names.QUOTA_NAME_LABEL_FALLBACK):
        if labels.get(key):
            return key, str(labels[key])
    return None


def finished(job: Mapping[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)


def queued(job: Mapping[str, Any]) -> bool:
    """A managed Job held by the queue: suspended, not admitted (no dequeue stamp), alive."""
    return (
        quota_label(job) is not None
        and (job.get("spec") or {}).get("suspend") is True
        and not _annotations(job).get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
        and not finished(job)
        and not _meta(job).get("deletionTimestamp")
    )


#: A controller owner reference naming a kind of another API group the queue manages (a Kubeflow
#: TFJob that does not exist): a batch Job controlled by such a kind counts as its parent's child.
FORGED_OWNER: Final = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "TFJob",
    "name": "mallory-parent",
    "uid": "00000000-0000-4000-8000-00000000f0f0",
    "controller": True,
}


def forged_controller(job: Mapping[str, Any]) -> bool:
    """The stored job carries :data:`FORGED_OWNER` (judged on the object alone)."""
    refs = _meta(job).get("ownerReferences")
    return isinstance(refs, list) and any(
        isinstance(ref, Mapping) and ref.get("uid") == FORGED_OWNER["uid"] and ref.get("controller") is True
        for ref in refs
    )


def running_reported(unit: Mapping[str, Any]) -> int:
    """The running pods a unit's admissions report (``status.admissions[].running``, what the job
    extension counts; ``podState`` is not read: the chaos status writer scribbles on it)."""
    status = unit.get("status") or {}
    return sum(int(a.get("running") or 0) for a in status.get("admissions") or [])


#: A finalizer of hers: keeps a deleted pod terminating until she removes it.
HOLD_FINALIZER: Final = "chaos.koord-queue.io/mallory-hold"


def _container_cpu_milli(container: Mapping[str, Any], default_cpu_milli: int) -> int:
    """CPU a container of a pod takes: its request, else its limit, else the LimitRange default the
    apiserver fills in. Read from the container alone."""
    resources = container.get("resources") or {}
    for key in ("requests", "limits"):
        cpu = (resources.get(key) or {}).get("cpu")
        if cpu is not None:
            try:
                return quantities.parse_milli(cpu)
            except (quantities.QuantityError, TypeError):
                return 0
    return default_cpu_milli


def undercharged(job: Mapping[str, Any], unit: Mapping[str, Any], *, default_cpu_milli: int) -> list[str]:
    """Pod sets of a TFJob whose unit holds an admission for them at less CPU per pod than the
    stored job's pods would take, the LimitRange default filled in (sorted). Judged from the two
    stored objects and the run's LimitRange alone, never with the product's code."""
    admitted = {
        str((a or {}).get("name"))
        for a in (unit.get("status") or {}).get("admissions") or []
        if int((a or {}).get("replicas") or 0) > 0
    }
    if (unit.get("status") or {}).get("phase") in ("Succeed", "Failed"):
        return []
    charged: dict[str, int] = {}
    for pod_set in (unit.get("spec") or {}).get("podSet") or []:
        containers = ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []
        charged[str(pod_set.get("name"))] = sum(_container_cpu_milli(c, 0) for c in containers)
    short = []
    for role, replica_spec in ((job.get("spec") or {}).get("tfReplicaSpecs") or {}).items():
        name = str(role).lower()
        containers = (((replica_spec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        takes = sum(_container_cpu_milli(c, default_cpu_milli) for c in containers)
        if name in admitted and charged.get(name, 0) < takes:
            short.append(name)
    return sorted(short)


def forged_pod_body(name: str, *, annotations: dict[str, str], owner: dict[str, Any], cpu: str) -> kube.Obj:
    """A gated pod of hers with one owner reference (a controller one or not, as ``owner`` says)
    and one container asking for ``cpu``; no label a Job controller selects its pods by, so no
    controller takes it over or lets go of it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "ownerReferences": [owner]},
        "spec": {
            "restartPolicy": "Never",
            "schedulingGates": [{"name": names.ADMISSION_GATE}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


def priority_above(unit: Mapping[str, Any], bound: int) -> int | None:
    """The unit's ``spec.priority`` when it is above ``bound`` (an attack got through), else None."""
    value = (unit.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > bound else None


def summarize(attempts: list[Attempt]) -> dict[str, dict[str, Any]]:
    """Per attack: how many tries ended how, the defence, a sample refusal and the repair times."""
    out: dict[str, dict[str, Any]] = {}
    for attack, defence in ATTACKS.items():
        mine = [a for a in attempts if a.attack == attack]
        counts = Counter(a.outcome for a in mine)
        row: dict[str, Any] = {"tried": sum(counts[o] for o in OUTCOMES if o != "skipped")}
        row.update({o: counts[o] for o in OUTCOMES})
        row["defence"] = defence
        sample = next((a.detail for a in mine if a.outcome == "refused"), "")
        sample = sample or next((a.detail for a in mine if a.outcome != "skipped"), "")
        row["sample"] = sample[:300]
        undone = [a.seconds for a in mine if a.seconds is not None]
        if undone:
            row["undone_s"] = [round(s, 1) for s in undone]
        out[attack] = row
    return out


class Tenant:
    """Mallory and her attacks. :meth:`setup` before the load, :meth:`run` during it,
    :meth:`final_checks` after the drain, :meth:`results` for the report."""

    def __init__(
        self,
        cluster: LocalCluster,
        admin: kube.Kube,
        observer: Observer,
        *,
        violate: Callable[[str, str], None],
        log: Callable[[str], None],
        spare: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self.cluster = cluster
        self.admin = admin
        self.observer = observer
        self.violate = violate
        self.log = log
        #: ``ns/name`` of load jobs she must leave alone (e.g. deleted on purpose by a fault)
        self.spare = spare
        self.attempts: list[Attempt] = []
        self.transient: Counter[str] = Counter()
        self.errors: list[str] = []
        self.rng = random.Random(8)
        self.nodes: list[str] = []
        self.workflows = False
        self.mallory: kube.Kube | None = None
        #: units whose job was accepted under a quota not bound to its namespace (never admitted)
        self._unbound_units: set[str] = set()
        #: her namespace's pods and units over the run, for the pools' placement check
        self.pool_record: tenant_pools.PoolRecorder | None = None

    # --- set-up ---------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Her namespace and quota, her rights in both namespaces (as a cluster admin grants them),
        the run's priority cap on :data:`CAPPED_QUOTA`, the :data:`SENTINELS`; waits until RBAC lets
        her in."""
        with contextlib.suppress(kube.Conflict):
            await self.admin.create(kube.NAMESPACES, {"metadata": {"name": NAMESPACE}})
        await self.admin.create(
            QUOTAS, load.quota(QUOTA, QUOTA_CPU, "", False, NAMESPACE), namespace=NAMESPACE
        )
        allowed = {
            "metadata": {"annotations": {names.ALLOWED_PRIORITY_CLASSES_ANNOTATION: f'["{ALLOWED_CLASS}"]'}}
        }
        await self.admin.patch(QUOTAS, QUOTA, allowed, namespace=NAMESPACE)
        for class_name, value in (
            (ALLOWED_CLASS, ALLOWED_CLASS_VALUE),
            (FORBIDDEN_CLASS, FORBIDDEN_CLASS_VALUE),
        ):
            with contextlib.suppress(kube.Conflict):
                await self.admin.create(
                    kube.PRIORITY_CLASSES, {"metadata": {"name": class_name}, "value": value}
                )
        cap = {"metadata": {"annotations": {names.MAX_USER_PRIORITY_ANNOTATION: str(QUOTA_PRIORITY_CAP)}}}
        await self.admin.patch(QUOTAS, CAPPED_QUOTA, cap, namespace=load.NAMESPACE)
        # Her namespace has a LimitRange, as an admin gives one to keep pods from asking for nothing.
        limit_range = {
            "metadata": {"name": "defaults", "namespace": NAMESPACE},
            "spec": {
                "limits": [{"type": "Container", "defaultRequest": {"cpu": f"{LIMIT_RANGE_CPU_MILLI}m"}}]
            },
        }
        await self.admin.create(kube.LIMIT_RANGES, limit_range, namespace=NAMESPACE)
        sentinels = load.quota(SENTINEL_QUOTA, "1", "", False, load.NAMESPACE)
        await self.admin.create(QUOTAS, sentinels, namespace=load.NAMESPACE)
        for name in SENTINELS:
            body = load.job(load.JobPlan(name, SENTINEL_QUOTA, "victim", 0, False), "sentinel")
            body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
            await self.admin.create(JOBS, body, namespace=load.NAMESPACE)
        mandatory = {"metadata": {"name": MANDATORY_NAMESPACE, "labels": {MANDATORY_LABEL: "true"}}}
        with contextlib.suppress(kube.Conflict):
            await self.admin.create(kube.NAMESPACES, mandatory)
        await self.admin.create(
            QUOTAS,
            load.quota(MANDATORY_NAMESPACE, MANDATORY_QUOTA_CPU, "", False, MANDATORY_NAMESPACE),
            namespace=MANDATORY_NAMESPACE,
        )
        for namespace in (load.NAMESPACE, NAMESPACE, MANDATORY_NAMESPACE):
            await asyncio.to_thread(tenancy.grant, self.cluster, namespace, USER)
        nodes, _ = await self.admin.list(NODES)
        self.nodes = sorted(str(_meta(n).get("name")) for n in nodes)
        try:
            await self.admin.get(CRDS, "workflows.argoproj.io")
            self.workflows = True
        except kube.NotFound:
            self.workflows = False
        self.mallory = await kube.Kube.connect(
            kubeconfig=str(self.cluster.kubeconfig), qps=50, burst=100, user_agent="mallory", impersonate=USER
        )
        deadline = time.monotonic() + 60
        for namespace in (load.NAMESPACE, NAMESPACE):
            while True:
                try:
                    await self.mallory.list(JOBS, namespace=namespace)
                    await self.mallory.list(kube.PODS, namespace=namespace)
                    break
                except kube.KubeError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        sa = kube.Resource("", "v1", "serviceaccounts", "ServiceAccount")
        while time.monotonic() < deadline:
            try:
                await self.admin.get(sa, "default", namespace=NAMESPACE)
                break
            except kube.KubeError:
                await asyncio.sleep(0.3)
        # Her pools, made after the node list above: her forged bound pods keep to the load's nodes.
        self.pool_record = await tenant_pools.setup(self, self.cluster)

    async def close(self) -> None:
        if self.pool_record is not None:
            await self.pool_record.stop()
        if self.mallory is not None:
            await self.mallory.close()

    # --- the phase ------------------------------------------------------------------------------

    async def run(self, *, rounds: int, seconds: float, delay: float) -> None:
        """``rounds`` rounds of every attack, the first after ``delay`` s, spread over ``seconds``."""
        await asyncio.sleep(delay)
        interval = max(0.0, seconds - delay) / max(rounds, 1)
        for r in range(rounds):
            started = time.monotonic()
            await self.round(r)
            counts = Counter(a.outcome for a in self.attempts if a.round == r)
            self.log(f"tenant round {r}: {dict(counts)} ({time.monotonic() - started:.0f}s)")
            await asyncio.sleep(max(0.0, started + interval - time.monotonic()))

    async def _wait_for_targets(self, timeout: float) -> None:
        """Until the load offers a few queued jobs, a victim and a gated pod (as the observer sees
        them, which costs the apiserver nothing), or ``timeout``."""
        deadline = time.monotonic() + timeout
        prefix = f"{load.NAMESPACE}/"
        while time.monotonic() < deadline:
            jobs = [j for k, j in self.observer.jobs.items() if k.startswith(prefix)]
            waiting = sum(1 for j in jobs if j.managed and j.suspended and not j.finished and not j.deleting)
            victims = any(j.key.startswith(f"{prefix}victim-") and not j.finished for j in jobs)
            pods = any(
                p.live and p.gated and not p.bound
                for k, p in self.observer.pods.items()
                if k.startswith(prefix) and not k.startswith(f"{prefix}mallory-")
            )
            if waiting >= 3 and victims and pods:
                return
            await asyncio.sleep(1.0)

    async def round(self, r: int) -> None:
        m = self.mallory
        assert m is not None
        await self._wait_for_targets(25.0)
        # Targets as she sees them: everything she needs is readable with a namespace user's rights.
        jobs = (await self._read(lambda: m.list(JOBS, namespace=load.NAMESPACE))) or []
        pods = (await self._read(lambda: m.list(kube.PODS, namespace=load.NAMESPACE))) or []
        load_jobs = [
            j
            for j in jobs
            if str(_meta(j).get("name", "")).startswith(("job-", "victim-", "low-", "sentinel-"))
            and not self.spare(f"{load.NAMESPACE}/{_meta(j).get('name')}")
        ]
        self.rng.shuffle(load_jobs)
        queued_jobs = [j for j in load_jobs if queued(j)]
        victims = [
            j
            for j in load_jobs
            if str(_meta(j).get("name")).startswith(("victim-", "sentinel-"))
            and not finished(j)
            and not _meta(j).get("deletionTimestamp")
        ]
        # Victims whose unit holds an admission first (load victims when there are, else the
        # sentinels): their units report running pods, so a forged pod counted for them would show
        # (a queued unit reports nothing at all). Preempted victims keep their dequeue stamp, so the
        # job alone does not tell; she reads the units (the user roles let her).
        admitted_units = await self._admitted_units()
        victims.sort(key=lambda j: f"{load.NAMESPACE}/{_meta(j).get('name')}" not in admitted_units)
        capped = [
            j
            for j in queued_jobs
            if (quota_label(j) or ("", ""))[1] == CAPPED_QUOTA
            and str(_meta(j).get("name")).startswith(("low-", "job-"))
        ]
        capped.sort(key=lambda j: not str(_meta(j).get("name")).startswith("low-"))  # a change shows
        priority_target = capped[0] if capped else None
        # The priority attack may be accepted (below the cluster cap) and so change its job: keep
        # it to itself. The others are refused when the defences hold, so they may share targets;
        # should one be accepted, the others see a changed resourceVersion, read again and retry.
        queued_jobs = [j for j in queued_jobs if j is not priority_target]
        gated_pods = [
            p
            for p in pods
            if gated(p.get("spec"))
            and not _meta(p).get("deletionTimestamp")
            and not (p.get("spec") or {}).get("nodeName")
            and not str(_meta(p).get("name", "")).startswith("mallory-")
        ]
        self.rng.shuffle(gated_pods)
        # Released, never-bound pods of the sentinels (their jobs stay admitted, their pods unbound).
        released_pods = [
            p
            for p in pods
            if str(_meta(p).get("name", "")).startswith(SENTINELS)
            and not gated(p.get("spec"))
            and not _meta(p).get("deletionTimestamp")
            and not (p.get("spec") or {}).get("nodeName")
            and _annotations(p).get(names.RELATED_QUEUEUNIT_ANNOTATION)
        ]
        self.rng.shuffle(released_pods)

        def pick(pool: list[kube.Obj], i: int) -> kube.Obj | None:
            return pool[i % len(pool)] if pool else None

        attacks: list[Awaitable[None]] = [
            self.forged_status_create(r),
            self.strip_enqueue_annotations(r, pick(queued_jobs, 0)),
            self.unsuspend(r, pick(queued_jobs, 1), strip=False),
            self.unsuspend(r, pick(queued_jobs, 2), strip=True),
            self.remove_template_gate(r, pick(queued_jobs, 3)),
            self.relabel(r, pick(queued_jobs, 4), remove=False),
            self.relabel(r, pick(queued_jobs, 5), remove=True),
            self.forged_owner(r, pick(queued_jobs, 7)),
            self.ungate_pod(r, pick(gated_pods, 0)),
            self.strip_pod_link(r, pick(released_pods, 0)),
            self.relabel_released_pod(r, pick(released_pods, 1)),
            self.forged_pod(r, pick(victims, 0), own_namespace=True),
            self.forged_pod(r, pick(victims, 1), own_namespace=False),
            self.label_running_job(r),
            self.child_of_missing_parent(r),
            self.unlabelled_in_mandatory_namespace(r),
            self.job_naming_unbound_quota(r),
            self.hidden_size(r, pod_level=True),
            self.hidden_size(r, pod_level=False),
            self.add_container_to_admitted(r),
            self.unproven_pod(r, oversized=False),
            self.unproven_pod(r, oversized=True),
            self.join_unit(r, pick(victims, 2)),
            self.outgrow(r),
            self.terminate_and_replace(r),
            self.priority(r, priority_target),
            self.own_priority(r, forbidden_class=False),
            self.own_priority(r, forbidden_class=True),
            self.rbac(r, pick(queued_jobs, 6)),
            tenant_orphans.orphan_and_recreate(self, r),
            tenant_submitter.forged_submitter(self, r),
            *tenant_pools.attacks(self, r),
            tenant_pool_job.pool_job(self, r),
            tenant_preemption.preemption_attacks(self, r, bound=OWN_PRIORITY_BOUND),
            tenant_history.history_attacks(self, r),
            tenant_release.release_attacks(self, r),
            tenant_metrics.metrics_attacks(self, r),
            tenant_plant.plant_attacks(self, r),
            tenant_dashboard.dashboard_attacks(self, r),
            tenant_web_dashboard.web_dashboard_attacks(self, r),
        ]
        if self.workflows:
            attacks.append(self.workflow(r))
            attacks.append(tenant_workflows.workflow_reservation(self, r))
        results = await asyncio.gather(*(self._guard(a) for a in attacks), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                self.errors.append(repr(result))

    async def _admitted_units(self) -> set[str]:
        """``ns/name`` of the load's units holding an admission, as mallory reads them."""
        m = self.mallory
        assert m is not None
        try:
            units, _ = await m.list(UNITS, namespace=load.NAMESPACE)
        except kube.KubeError as err:
            self.transient[f"read units: HTTP {err.status}"] += 1
            return set()
        return {
            f"{load.NAMESPACE}/{_meta(u).get('name')}"
            for u in units
            if is_admitted_unit(u)
            and not any(
                (a or {}).get("reclaimState") for a in (u.get("status") or {}).get("admissions") or []
            )
        }

    async def _guard(self, attack: Awaitable[None]) -> None:
        try:
            await attack
        except Exception as err:  # a harness problem: reported, never mistaken for a defence
            self.errors.append(repr(err))
            self.log(f"tenant attack failed to run: {err!r}")

    # --- plumbing -------------------------------------------------------------------------------

    def record(
        self, attack: str, r: int, target: str, outcome: str, detail: str, seconds: float | None = None
    ) -> None:
        assert attack in ATTACKS and outcome in OUTCOMES, (attack, outcome)
        self.attempts.append(Attempt(attack, r, target, outcome, detail[:500], seconds))
        if outcome == "SUCCEEDED":
            self.violate("tenant-bypass", f"{attack} on {target}: {detail}")

    async def _read(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """A read as mallory (or the harness), retried through faults; None when it never worked."""
        deadline = time.monotonic() + 90
        while True:
            try:
                result = await call()
            except kube.NotFound:
                return None
            except kube.KubeError as err:
                if time.monotonic() > deadline:
                    self.errors.append(f"read failed: {err}")
                    return None
                self.transient[f"read: HTTP {err.status}"] += 1
                await asyncio.sleep(0.5)
                continue
            if isinstance(result, tuple):
                return result[0]
            return result

    async def send(self, call: Callable[[], Awaitable[kube.Obj]], *, rbac_allows: bool = True) -> Sent:
        """One write of mallory's, retried while the refusal is a fault's and not a decision.

        ``rbac_allows``: her roles grant this verb on this resource, so an RBAC refusal is the
        freshly restarted apiserver whose authorizer has not loaded the bindings yet (it answers 403
        for a moment), not a decision. Likewise a ValidatingAdmissionPolicy whose parameters are not
        loaded yet refuses everything it matches (``failurePolicy: Fail``) until they are.
        """
        deadline = time.monotonic() + 90
        delay = 0.3
        while True:
            try:
                return Sent("accepted", await call())
            except kube.NotFound as err:
                return Sent("gone", message=err.message)
            except kube.Conflict as err:
                if err.reason == "AlreadyExists":
                    # Not a decision of the system's: after a transient failure it is this very
                    # create, stored before the fault cut its answer off; on a first try, a name
                    # the harness reused. Either way nothing was refused, and the try is not judged.
                    return Sent("exists", message=f"HTTP 409: {err.message}")
                return Sent("changed", message=err.message)
            except kube.KubeError as err:
                unready_rbac = rbac_allows and err.status == 403 and f'User "{USER}" cannot' in err.message
                unready_policy = "not yet synced to use for admission" in err.message
                transient = (
                    err.status == 0
                    or err.status >= 500
                    or err.status == 429
                    or "failed calling webhook" in err.message
                    or unready_rbac
                    or unready_policy
                )
                if transient and time.monotonic() < deadline:
                    kind = (
                        "webhook unreachable"
                        if "failed calling webhook" in err.message
                        else "RBAC not loaded yet (403)"
                        if unready_rbac
                        else "admission policy parameters not loaded yet (422)"
                        if unready_policy
                        else f"HTTP {err.status}"
                    )
                    self.transient[kind] += 1
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 3.0)
                    continue
                return Sent("refused", message=f"HTTP {err.status}: {err.message}")

    async def _patch_job(
        self, attack: str, r: int, job: kube.Obj | None, patch: dict[str, Any]
    ) -> tuple[Sent, str] | None:
        """Patch a load job as mallory (:meth:`_patch`); a job read again is attacked again only
        while it is still queued."""
        return await self._patch(attack, r, JOBS, job, patch, "no queued job of the load", queued)

    async def _patch(
        self,
        attack: str,
        r: int,
        res: kube.Resource,
        obj: kube.Obj | None,
        patch: dict[str, Any],
        none: str,
        still: Callable[[kube.Obj], bool],
    ) -> tuple[Sent, str] | None:
        """Patch a load object as mallory, conditional on the version she read (one that changed
        meanwhile is read again and attacked again while ``still`` holds, at most twice more).
        Records a skip or a refusal; returns the answer and the target only when accepted."""
        m = self.mallory
        assert m is not None
        if obj is None:
            self.record(attack, r, "-", "skipped", f"{none} at this moment")
            return None
        name = str(_meta(obj).get("name"))
        target = f"{load.NAMESPACE}/{name}"
        for _ in range(3):
            body = {
                **patch,
                "metadata": {
                    **patch.get("metadata", {}),
                    "resourceVersion": _meta(obj).get("resourceVersion"),
                },
            }
            sent = await self.send(functools.partial(m.patch, res, name, body, namespace=load.NAMESPACE))
            if sent.status != "changed":
                break
            fresh = await self._read(lambda: m.get(res, name, namespace=load.NAMESPACE))
            if fresh is None or not still(fresh):
                break
            obj = fresh
        if sent.status in ("gone", "changed"):
            self.record(attack, r, target, "skipped", f"target changed or vanished: {sent.message}")
            return None
        if sent.status == "refused":
            self.record(attack, r, target, "refused", sent.message)
            return None
        return sent, target

    async def _until(
        self, probe: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.5
    ) -> float | None:
        """Seconds until ``probe`` holds, None if it never did within ``timeout``."""
        begun = time.monotonic()
        while time.monotonic() - begun < timeout:
            with contextlib.suppress(kube.KubeError):
                if await probe():
                    return time.monotonic() - begun
            await asyncio.sleep(interval)
        return None

    async def _pod_now(self, name: str) -> kube.Obj | None:
        """The load namespace's pod ``name`` as stored now (the admin reads it); None once gone."""
        try:
            return await self.admin.get(kube.PODS, name, namespace=load.NAMESPACE)
        except kube.NotFound:
            return None

    async def _patch_released_pod(
        self, attack: str, r: int, pod: kube.Obj | None, metadata: dict[str, Any]
    ) -> tuple[Sent, str] | None:
        """Patch a released sentinel pod's metadata as mallory (:meth:`_patch`)."""

        def released(p: kube.Obj) -> bool:
            return not gated(p.get("spec")) and not _meta(p).get("deletionTimestamp")

        patch = {"metadata": metadata}
        return await self._patch(attack, r, kube.PODS, pod, patch, "no released sentinel pod", released)

    async def _job_held_again(self, namespace: str, name: str) -> bool:
        job = await self.admin.get(JOBS, name, namespace=namespace)
        spec = job.get("spec") or {}
        return spec.get("suspend") is True or bool(
            _annotations(job).get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
        )

    # --- the attacks ----------------------------------------------------------------------------

    async def forged_status_create(self, r: int) -> None:
        """A labelled Job created with a forged ``status`` (startTime, active) and a forged dequeue
        stamp: the apiserver drops the status only after mutating admission."""
        attack = "forged-status-create"
        m = self.mallory
        assert m is not None
        name = f"mallory-forged-{r}"
        body = load.job(load.JobPlan(name, "chaos-b", "single", None, False), "mallory")
        body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
        body["metadata"]["annotations"] = {names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION: "2026-01-01T00:00:00Z"}
        body["status"] = {"startTime": "2026-01-01T00:00:00Z", "active": 1, "ready": 1}
        target = f"{load.NAMESPACE}/{name}"
        sent = await self.send(lambda: m.create(JOBS, body, namespace=load.NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "refused", sent.message)
            return
        stored = sent.obj
        spec = stored.get("spec") or {}
        held = (
            spec.get("suspend") is True
            and gated((spec.get("template") or {}).get("spec"))
            and not _annotations(stored).get(names.JOB_DEQUEUE_TIMESTAMP_ANNOTATION)
        )
        if held:
            self.record(
                attack,
                r,
                target,
                "neutralised",
                "stored held: spec.suspend=true, template gated, forged dequeue stamp and status dropped",
            )
            return
        seconds = await self._until(lambda: self._job_held_again(load.NAMESPACE, name), UNDO_S)
        detail = f"stored unheld (suspend={spec.get('suspend')!r}, annotations {dict(_annotations(stored))})"
        if seconds is not None:
            self.record(attack, r, target, "undone", detail + "; held again by the reconciler", seconds)
        else:
            self.record(attack, r, target, "SUCCEEDED", detail + "; never held again")

    async def strip_enqueue_annotations(self, r: int, job: kube.Obj | None) -> None:
        attack = "strip-enqueue-annotations"
        if job is not None and not (
            _annotations(job).get(names.JOB_HAS_ENQUEUED_ANNOTATION)
            or _annotations(job).get(names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION)
        ):
            job = None
        patch = {
            "metadata": {
                "annotations": {
                    names.JOB_HAS_ENQUEUED_ANNOTATION: None,
                    names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION: None,
                }
            }
        }
        done = await self._patch_job(attack, r, job, patch)
        if done is None:
            return
        sent, target = done
        left = {k: v for k, v in _annotations(sent.obj).items() if k.startswith("koord-queue/job-")}
        self.record(attack, r, target, "SUCCEEDED", f"accepted: the system annotations are now {left}")

    async def unsuspend(self, r: int, job: kube.Obj | None, *, strip: bool) -> None:
        """Release the hold (``spec.suspend: false``); with ``strip``, in the same write as
        removing the enqueue annotations (the hold must not depend on them)."""
        attack = "strip-and-unsuspend-in-one-write" if strip else "unsuspend-queued-job"
        patch: dict[str, Any] = {"spec": {"suspend": False}}
        if strip:
            patch["metadata"] = {
                "annotations": {
                    names.JOB_HAS_ENQUEUED_ANNOTATION: None,
                    names.JOB_ENQUEUE_TIMESTAMP_ANNOTATION: None,
                }
            }
        done = await self._patch_job(attack, r, job, patch)
        if done is None:
            return
        _, target = done
        name = target.split("/", 1)[1]
        seconds = await self._until(lambda: self._job_held_again(load.NAMESPACE, name), UNDO_S)
        if seconds is not None:
            self.record(attack, r, target, "undone", "accepted; suspended again by the reconciler", seconds)
        else:
            self.record(attack, r, target, "SUCCEEDED", f"accepted and still released after {UNDO_S:.0f}s")

    async def remove_template_gate(self, r: int, job: kube.Obj | None) -> None:
        attack = "remove-template-gate"
        patch = {"spec": {"template": {"spec": {"schedulingGates": None}}}}
        done = await self._patch_job(attack, r, job, patch)
        if done is None:
            return
        sent, target = done
        template = ((sent.obj.get("spec") or {}).get("template") or {}).get("spec")
        if gated(template):
            self.record(attack, r, target, "neutralised", "accepted, but the template is still gated")
        else:
            self.record(attack, r, target, "SUCCEEDED", "accepted: the job's pod template lost its gate")

    async def relabel(self, r: int, job: kube.Obj | None, *, remove: bool) -> None:
        attack = "remove-quota-label" if remove else "relabel-to-another-quota"
        found = quota_label(job) if job is not None else None
        if job is None or found is None:
            self.record(attack, r, "-", "skipped", "no queued job of the load at this moment")
            return
        key, current = found
        other = next(q for q in ("chaos-a", "chaos-b", "chaos-c") if q != current)
        done = await self._patch_job(
            attack, r, job, {"metadata": {"labels": {key: None if remove else other}}}
        )
        if done is None:
            return
        sent, target = done
        now = quota_label(sent.obj)
        self.record(attack, r, target, "SUCCEEDED", f"accepted: quota label {found} -> {now}")

    async def forged_owner(self, r: int, job: kube.Obj | None) -> None:
        """Add a controller owner reference naming another managed kind to a queued Job, then
        release it: were the reference kept, the job would no longer count as queued and the
        release would pass. Judged on the stored objects: the reference stored and the job running
        without a dequeue stamp is a bypass."""
        attack = "forged-owner-on-queued-job"
        refs = list(_meta(job).get("ownerReferences") or []) if job is not None else []
        done = await self._patch_job(attack, r, job, {"metadata": {"ownerReferences": [*refs, FORGED_OWNER]}})
        if done is None:
            return
        sent, target = done
        if not forged_controller(sent.obj):
            self.record(attack, r, target, "neutralised", "accepted, but the owner reference was not stored")
            return
        name = target.split("/", 1)[1]
        released = await self._patch_job(attack, r, sent.obj, {"spec": {"suspend": False}})
        if released is None:
            return  # the release was refused (recorded): the job stays held
        seconds = await self._until(lambda: self._job_held_again(load.NAMESPACE, name), UNDO_S)
        if seconds is not None:
            self.record(attack, r, target, "undone", "accepted; suspended again by the reconciler", seconds)
        else:
            detail = f"a controller owner reference got in and the job ran released for {UNDO_S:.0f}s"
            self.record(attack, r, target, "SUCCEEDED", detail)

    def _gated_pod_keys(self) -> list[str]:
        """Gated, unbound, live pods of the load as the observer sees them; those whose job's unit
        holds no admission first (a preempted victim's replacement waits like that for long)."""
        prefix = f"{load.NAMESPACE}/"
        found: list[tuple[bool, str]] = []
        for key, pod in self.observer.pods.items():
            if not key.startswith(prefix) or key.startswith(f"{prefix}mallory-"):
                continue
            if not (pod.live and pod.gated and not pod.bound):
                continue
            unit = self.observer.units.get(pod.unit) if pod.unit else None
            found.append((unit is not None and unit.total > 0, key))
        self.rng.shuffle(found)
        return [key for _, key in sorted(found, key=lambda f: f[0])]

    async def ungate_pod(self, r: int, listed: kube.Obj | None) -> None:
        """Remove the admission gate from a gated pod of a job that is not admitted for it. Gated
        pods are rarer than queued jobs (a preempted victim's replacement, or a pod between its
        creation and its release): without one in her listing she hunts for one for a while."""
        attack = "ungate-pod-of-queued-job"
        m = self.mallory
        assert m is not None
        deadline = time.monotonic() + HUNT_S
        tried: set[str] = set()
        sent: Sent | None = None
        name = target = ""
        while sent is None:
            pod = listed
            listed = None
            if pod is None:
                keys = [k for k in self._gated_pod_keys() if k not in tried]
                if not keys:
                    if time.monotonic() > deadline:
                        self.record(attack, r, "-", "skipped", f"no gated pod within {HUNT_S:.0f}s")
                        return
                    await asyncio.sleep(0.2)
                    continue
                tried.add(keys[0])
                pod = await self._read(
                    functools.partial(m.get, kube.PODS, keys[0].split("/", 1)[1], namespace=load.NAMESPACE)
                )
                if pod is None or not gated(pod.get("spec")) or (pod.get("spec") or {}).get("nodeName"):
                    continue
            name = str(_meta(pod).get("name"))
            target = f"{load.NAMESPACE}/{name}"
            body = {
                "metadata": {"resourceVersion": _meta(pod).get("resourceVersion")},
                "spec": {"schedulingGates": None},
            }
            attempt = await self.send(
                functools.partial(m.patch, kube.PODS, name, body, namespace=load.NAMESPACE)
            )
            if attempt.status in ("gone", "changed"):
                if time.monotonic() > deadline:
                    self.record(
                        attack, r, target, "skipped", f"target changed or vanished: {attempt.message}"
                    )
                    return
                continue  # released or deleted by the reconciler meanwhile: find another
            sent = attempt
        if sent.status == "refused":
            self.record(attack, r, target, "refused", sent.message)
            return

        async def repaired() -> bool:
            now = await self._pod_now(name)
            return now is None or bool(_meta(now).get("deletionTimestamp")) or gated(now.get("spec"))

        seconds = await self._until(repaired, UNDO_S)
        if seconds is not None:
            self.record(
                attack, r, target, "undone", "accepted; the pod was deleted by the reconciler", seconds
            )
        else:
            self.record(attack, r, target, "SUCCEEDED", f"accepted: the pod stayed ungated for {UNDO_S:.0f}s")

    async def strip_pod_link(self, r: int, pod: kube.Obj | None) -> None:
        """Take the unit annotation off a released pod: the reconciler would lose sight of it, and a
        reclaim would hand its quota on while the pod can still be scheduled."""
        attack = "strip-pod-unit-annotation"
        change = {"annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: None}}
        done = await self._patch_released_pod(attack, r, pod, change)
        if done is not None:
            self.record(attack, r, done[1], "SUCCEEDED", "accepted: the pod no longer names its unit")

    async def relabel_released_pod(self, r: int, pod: kube.Obj | None) -> None:
        """Change the label the Job selects its pods by on a released pod: the Job controller lets
        go of it and makes a gated replacement, which the admission releases too. The pod that left
        its job must be deleted before it could run beside its replacement."""
        attack = "relabel-released-pod-out-of-job"
        change = {"labels": {"batch.kubernetes.io/controller-uid": f"mallory-{r}"}}
        done = await self._patch_released_pod(attack, r, pod, change)
        if done is None:
            return
        sent, target = done
        name, uid = str(_meta(sent.obj).get("name")), _meta(sent.obj).get("uid")
        job_uids = {str(ref.get("uid")) for ref in _meta(sent.obj).get("ownerReferences") or []}
        seen_let_go = False

        async def still_there() -> kube.Obj | None:
            now = await self._pod_now(name)
            if now is None or _meta(now).get("uid") != uid or _meta(now).get("deletionTimestamp"):
                return None
            return now

        async def gone() -> bool:
            return await still_there() is None

        async def gone_or_let_go() -> bool:
            nonlocal seen_let_go
            now = await still_there()
            if now is None:
                return True
            seen_let_go = (
                not {str(ref.get("uid")) for ref in _meta(now).get("ownerReferences") or []} & job_uids
            )
            return seen_let_go

        # The harm starts when the Job controller lets go of the pod (its owner reference goes);
        # until then it is still the job's pod, counted in its admission. Under faults the
        # controller may take a while: its clock is LET_GO_S, the reconciler's UNDO_S from there.
        let_go = await self._until(gone_or_let_go, LET_GO_S)
        if let_go is None:
            self.record(
                attack,
                r,
                target,
                "neutralised",
                f"accepted; the Job controller did not let go of the pod within {LET_GO_S:.0f}s, "
                "so it stayed its job's pod, counted in the admission",
            )
            return
        deleted = await self._until(gone, UNDO_S)
        if deleted is None:
            self.record(
                attack,
                r,
                target,
                "SUCCEEDED",
                f"accepted: the pod lived on outside its job {UNDO_S:.0f}s after its controller let go",
            )
            return
        after = f" {deleted:.1f}s after its controller let go" if seen_let_go else ""
        self.record(
            attack,
            r,
            target,
            "undone",
            f"accepted; the pod that left its job was deleted{after}",
            let_go + deleted,
        )

    async def forged_pod(self, r: int, victim: kube.Obj | None, *, own_namespace: bool) -> None:
        """A pod bound to a node (``nodeName``), naming a victim's unit in its annotation: in her own
        namespace claiming the victim Job as owner with its real UID, or bare in the load namespace.
        A victim's pods never bind, so its unit must go on reporting 0 running pods."""
        attack = "bound-pod-in-own-namespace-claiming-job" if own_namespace else "bare-bound-pod-naming-unit"
        m = self.mallory
        assert m is not None
        if victim is None or not self.nodes:
            self.record(attack, r, "-", "skipped", "no victim job at this moment")
            return
        job_name = str(_meta(victim).get("name"))
        template = ((victim.get("spec") or {}).get("template") or {}).get("metadata") or {}
        unit_ref = str((template.get("annotations") or {}).get(names.RELATED_QUEUEUNIT_ANNOTATION) or "")
        if not unit_ref:
            unit_ref = f"{load.NAMESPACE}/{job_name}"
        unit_name = unit_ref.split("/", 1)[-1]
        namespace = NAMESPACE if own_namespace else load.NAMESPACE
        name = f"mallory-{'claim' if own_namespace else 'bare'}-{r}"
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "annotations": {
                **(template.get("annotations") or {}),
                names.RELATED_QUEUEUNIT_ANNOTATION: unit_ref,
            },
            "labels": {"batch.kubernetes.io/job-name": job_name, "job-name": job_name},
        }
        if own_namespace:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": str(_meta(victim).get("uid")),
                    "controller": True,
                }
            ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": self.nodes[r % len(self.nodes)],
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}],
            },
        }
        target = f"{namespace}/{name} -> {unit_ref}"

        async def unit() -> kube.Obj | None:
            try:
                return await self.admin.get(UNITS, unit_name, namespace=load.NAMESPACE)
            except kube.KubeError:
                return None

        before = await unit()
        sent = await self.send(lambda: m.create(kube.PODS, pod, namespace=namespace))
        if sent.status != "accepted":
            self.record(attack, r, target, "refused", sent.message)
            return
        try:
            worst, samples = 0, 0
            begun = time.monotonic()
            while time.monotonic() - begun < WATCH_S:
                found = await unit()
                if found is not None:
                    worst = max(worst, running_reported(found))
                    samples += 1
                await asyncio.sleep(0.5)
            was = running_reported(before) if before is not None else 0
            state = "admitted" if before is not None and is_admitted_unit(before) else "queued"
            if worst > 0:
                self.record(
                    attack,
                    r,
                    target,
                    "SUCCEEDED",
                    f"the victim's unit ({state}) reported {worst} running pods (before: {was}); its "
                    "own pods can never bind: the forged pod was counted",
                )
            else:
                self.record(
                    attack,
                    r,
                    target,
                    "neutralised",
                    f"accepted; not counted: the victim's unit ({state}) reported 0 running pods in "
                    f"{samples} reads over {WATCH_S:.0f}s",
                )
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.request(
                    "DELETE",
                    kube.PODS.path(namespace, name),
                    body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                )

    async def label_running_job(self, r: int) -> None:
        """Her own unlabelled Job runs at once (nothing queues it); then she labels it into her
        namespace's own quota, which would make it count as admitted without waiting."""
        attack = "label-running-job-into-quota"
        m = self.mallory
        assert m is not None
        name = f"mallory-runner-{r}"
        body = load.job(load.JobPlan(name, QUOTA, "single", None, False), "mallory", namespace=NAMESPACE)
        body["metadata"]["labels"] = {}
        body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
        created = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        target = f"{NAMESPACE}/{name}"
        if created.status != "accepted" or (created.obj.get("spec") or {}).get("suspend") is True:
            self.record(
                attack, r, target, "skipped", f"the unlabelled job was not created running: {created.message}"
            )
            return
        label = {"metadata": {"labels": {names.QUOTA_NAME_LABEL: QUOTA}}}
        sent = await self.send(lambda: m.patch(JOBS, name, label, namespace=NAMESPACE))
        if sent.status != "accepted":
            outcome = "refused" if sent.status == "refused" else "skipped"
            self.record(attack, r, target, outcome, sent.message)
            return
        if finished(sent.obj):
            self.record(attack, r, target, "skipped", "accepted, but the job had already finished")
            return
        seconds = await self._until(lambda: self._job_held_again(NAMESPACE, name), UNDO_S)
        if seconds is not None:
            self.record(attack, r, target, "undone", "accepted; held and queued by the reconciler", seconds)
        else:
            self.record(attack, r, target, "SUCCEEDED", f"accepted and not held within {UNDO_S:.0f}s")

    async def child_of_missing_parent(self, r: int) -> None:
        """A labelled Job of hers claiming, by a controller reference, a TFJob that does not exist:
        were the claim read, not resolved, the Job would be the parent's child and run unqueued.
        Judged on the stored Job: its pod template must be gated as stored (the webhook cannot
        resolve owners, so it lets a claiming Job in unsuspended but with its pods born gated), and
        then it must be held within the bound, or gone (the garbage collector deletes a dependent
        whose owner does not exist); anything else is a bypass. The observer's
        ``unadmitted-pod-schedulable`` judges its pods independently."""
        attack = "child-of-missing-parent"
        m = self.mallory
        assert m is not None
        name = f"mallory-child-{r}"
        body = load.job(load.JobPlan(name, QUOTA, "single", None, False), "mallory", namespace=NAMESPACE)
        body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
        body["metadata"]["ownerReferences"] = [dict(FORGED_OWNER)]
        created = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        target = f"{NAMESPACE}/{name}"
        if created.status != "accepted":
            outcome = "refused" if created.status == "refused" else "skipped"
            self.record(attack, r, target, outcome, created.message)
            return
        if (created.obj.get("spec") or {}).get("suspend") is True:
            self.record(attack, r, target, "neutralised", "accepted, but held at creation")
            return
        if not gated(((created.obj.get("spec") or {}).get("template") or {}).get("spec")):
            detail = "accepted with an ungated pod template: its pods run before the claim is checked"
            self.record(attack, r, target, "SUCCEEDED", detail)
            return
        gone = False

        async def held_or_gone() -> bool:
            nonlocal gone
            try:
                return await self._job_held_again(NAMESPACE, name)
            except kube.NotFound:
                gone = True
                return True

        seconds = await self._until(held_or_gone, UNDO_S)
        if seconds is None:
            self.record(attack, r, target, "SUCCEEDED", f"accepted and not held within {UNDO_S:.0f}s")
        else:
            then = "garbage collected" if gone else "held and queued by the reconciler"
            detail = f"accepted unsuspended with its pod template gated (no pod schedulable); then {then}"
            self.record(attack, r, target, "neutralised", detail, seconds)

    async def unlabelled_in_mandatory_namespace(self, r: int) -> None:
        """An unlabelled Job of hers where queueing is mandatory, too big for the namespace's quota,
        then released by her. Judged on the stored Job: held when created (or within the bound),
        and still held after her release; a Job running without the dequeue stamp is a bypass."""
        attack = "unlabelled-job-in-mandatory-namespace"
        m = self.mallory
        assert m is not None
        name = f"mallory-unlabelled-{r}"
        body = load.job(
            load.JobPlan(name, QUOTA, "single", None, False), "mallory", namespace=MANDATORY_NAMESPACE
        )
        body["metadata"]["labels"] = {}
        body["spec"]["template"]["spec"]["containers"] = [load.container("2")]
        created = await self.send(lambda: m.create(JOBS, body, namespace=MANDATORY_NAMESPACE))
        target = f"{MANDATORY_NAMESPACE}/{name}"
        if created.status != "accepted":
            outcome = "refused" if created.status == "refused" else "skipped"
            self.record(attack, r, target, outcome, created.message)
            return
        held_at_creation = (created.obj.get("spec") or {}).get("suspend") is True
        release = {"spec": {"suspend": False}}
        sent = await self.send(lambda: m.patch(JOBS, name, release, namespace=MANDATORY_NAMESPACE))
        if sent.status == "refused" and held_at_creation:
            self.record(attack, r, target, "refused", sent.message)
            return
        seconds = await self._until(lambda: self._job_held_again(MANDATORY_NAMESPACE, name), UNDO_S)
        if seconds is not None:
            how = "held at creation" if held_at_creation else "created running"
            self.record(attack, r, target, "undone", f"{how}; held and queued by the reconciler", seconds)
        else:
            self.record(attack, r, target, "SUCCEEDED", f"ran unqueued for {UNDO_S:.0f}s")

    async def job_naming_unbound_quota(self, r: int) -> None:
        """A Job in her namespace under one of the load's quotas, which are not bound to it."""
        attack = "job-naming-unbound-quota"
        m = self.mallory
        assert m is not None
        quota = ("chaos-a", "chaos-b", "chaos-c")[r % 3]
        name = f"mallory-unbound-{r}"
        body = load.job(load.JobPlan(name, quota, "single", None, False), "mallory", namespace=NAMESPACE)
        body["spec"]["template"]["spec"]["containers"] = [load.container("100m")]
        target = f"{NAMESPACE}/{name} (quota {quota})"
        sent = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "refused", sent.message)
            return
        key = f"{NAMESPACE}/{name}"
        self._unbound_units.add(key)
        message = ""
        begun = time.monotonic()
        while time.monotonic() - begun < WATCH_S:
            unit = await self._own_unit(name)
            if unit and is_admitted_unit(unit):
                self.record(attack, r, target, "SUCCEEDED", f"admitted under {quota}: {unit.get('status')}")
                return
            message = str((unit.get("status") or {}).get("message") or message)
            await asyncio.sleep(0.5)
        self.record(attack, r, target, "neutralised", f"accepted; not admitted, waits: {message!r}")

    async def _own_unit(self, name: str) -> kube.Obj:
        """The unit ``name`` in her namespace as an admin reads it; empty while unreadable."""
        try:
            unit: kube.Obj = await self.admin.get(UNITS, name, namespace=NAMESPACE)
        except kube.KubeError:
            return {}
        return unit

    async def hidden_size(self, r: int, *, pod_level: bool) -> None:
        """A Job in her own namespace whose pods take far more than its containers ask for: 64 CPU
        of pod-level requests over 100m containers, or 4 pods with no requests at all under the
        LimitRange :meth:`setup` gives her namespace (1 CPU each). Her quota holds 2 CPU, so
        charged what its pods take the unit must wait; admitted, it got quota for nothing."""
        m = self.mallory
        assert m is not None
        attack = "pod-level-requests-above-containers" if pod_level else "no-requests-under-limit-range"
        name = f"mallory-{'podlevel' if pod_level else 'bare'}-{r}"
        body = load.job(load.JobPlan(name, QUOTA, "single", None, False), "mallory", namespace=NAMESPACE)
        pod = body["spec"]["template"]["spec"]
        if pod_level:
            pod["containers"] = [load.container("100m")]
            pod["resources"] = {"requests": {"cpu": "64"}}
            charged = 64_000
        else:
            pod["containers"] = [{"name": "c", "image": "busybox"}]
            body["spec"]["parallelism"] = body["spec"]["completions"] = 4
            charged = 4 * LIMIT_RANGE_CPU_MILLI
        target = f"{NAMESPACE}/{name}"
        sent = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "refused", sent.message)
            return
        try:
            shown: object = None
            begun = time.monotonic()
            while time.monotonic() - begun < WATCH_S:
                unit = await self._own_unit(name)
                if unit and is_admitted_unit(unit):
                    detail = f"admitted in a 2-CPU quota: spec.resource {unit['spec'].get('resource')}"
                    self.record(attack, r, target, "SUCCEEDED", detail)
                    return
                shown = (unit.get("spec") or {}).get("resource") or shown
                await asyncio.sleep(0.5)
            cpu = (shown or {}).get("cpu") if isinstance(shown, Mapping) else None
            try:
                milli = quantities.parse_milli(cpu) if cpu is not None else None
            except quantities.QuantityError:
                milli = None
            if milli != charged:
                self.record(attack, r, target, "SUCCEEDED", f"charged {shown}, its pods take {charged}m CPU")
                return
            self.record(
                attack, r, target, "neutralised", f"accepted; charged {shown} and waits, not admitted"
            )
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")

    async def add_container_to_admitted(self, r: int) -> None:
        """A TFJob of hers (one 100m worker) in her namespace with its LimitRange; once admitted
        she adds a container that asks for nothing, which its pods would get the LimitRange
        default for (docs/compatibility.md#admitted-pod-size). Refused at the door, or accepted and
        within :data:`UNDO_S` either queued again or charged what its pods take; admitted for less
        beyond that, the container runs uncharged."""
        m = self.mallory
        assert m is not None
        attack = "add-container-to-admitted-job"
        name = f"mallory-sidecar-{r}"
        target = f"{NAMESPACE}/{name}"
        container = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
        body = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": name, "labels": {names.QUOTA_NAME_LABEL: QUOTA}},
            "spec": {
                "tfReplicaSpecs": {
                    "Worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}
                }
            },
        }
        sent = await self.send(lambda: m.create(TFJOBS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "skipped", f"her TFJob was not accepted: {sent.message}")
            return
        unit_name = f"{name}-tf-qu"
        try:
            begun = time.monotonic()
            while not is_admitted_unit(await self._own_unit(unit_name)):
                if time.monotonic() - begun > UNDO_S:
                    self.record(attack, r, target, "skipped", "her TFJob was not admitted in time")
                    return
                await asyncio.sleep(0.5)
            sidecar = {"name": "sidecar", "image": "busybox"}
            patch = [
                {
                    "op": "add",
                    "path": "/spec/tfReplicaSpecs/Worker/template/spec/containers/-",
                    "value": sidecar,
                }
            ]
            sent = await self.send(
                lambda: m.patch(TFJOBS, name, patch, namespace=NAMESPACE, content_type=kube.JSON_PATCH)
            )
            if sent.status != "accepted":
                self.record(attack, r, target, "refused", sent.message)
                return
            begun = time.monotonic()
            while True:
                job = await self._read(lambda: self.admin.get(TFJOBS, name, namespace=NAMESPACE)) or {}
                short = undercharged(
                    job, await self._own_unit(unit_name), default_cpu_milli=LIMIT_RANGE_CPU_MILLI
                )
                if not short:
                    self.record(
                        attack,
                        r,
                        target,
                        "undone",
                        "queued again or charged its new container",
                        time.monotonic() - begun,
                    )
                    return
                if time.monotonic() - begun > UNDO_S:
                    self.record(
                        attack,
                        r,
                        target,
                        "SUCCEEDED",
                        f"pod set(s) {short} admitted below what their pods take",
                    )
                    return
                await asyncio.sleep(0.5)
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.delete(TFJOBS, name, namespace=NAMESPACE, propagation="Background")

    async def unproven_pod(self, r: int, *, oversized: bool) -> None:
        """A pod the admission has room for but that is not provably the job's, or not of the size
        admitted (docs/compatibility.md#pod-gating). In her own namespace she submits a one-pod Job
        (its pods never bind) and, once it is admitted, makes a gated pod naming its unit: with a
        plain owner reference carrying the Job's real UID, or controlled by the Job but asking for
        ten times the admitted CPU. Then she deletes the Job's own pod, so the admission has room
        and her pod, older than the controller's replacement, comes first in line. Released, it
        would run unproven or larger than charged."""
        m = self.mallory
        assert m is not None
        attack = "oversized-pod-controlled-by-job" if oversized else "gated-pod-with-plain-owner-reference"
        name = f"mallory-{'large' if oversized else 'loose'}-{r}"
        plan = load.JobPlan(name, QUOTA, "victim", None, False, cpu="100m", memory=False)
        body = load.job(plan, "mallory", namespace=NAMESPACE)
        target = f"{NAMESPACE}/{name}"
        sent = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "skipped", f"her job was not accepted: {sent.message}")
            return
        job = sent.obj
        forged = f"{name}-forged"
        try:
            begun = time.monotonic()
            while not is_admitted_unit(await self._own_unit(name)):
                if time.monotonic() - begun > UNDO_S:
                    self.record(attack, r, target, "skipped", "her job was not admitted in time")
                    return
                await asyncio.sleep(0.5)
            template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
            ref = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": str(_meta(job).get("uid"))}
            pod = forged_pod_body(
                forged,
                annotations=dict(template.get("annotations") or {}),
                owner={**ref, "controller": True} if oversized else ref,
                cpu="1" if oversized else "100m",
            )
            sent = await self.send(lambda: m.create(kube.PODS, pod, namespace=NAMESPACE))
            if sent.status != "accepted":
                self.record(attack, r, target, "refused", sent.message)
                return
            own = await self._read(
                lambda: m.list(
                    kube.PODS, namespace=NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={name}"
                )
            )
            for other in own or []:
                if _meta(other).get("name") != forged:
                    with contextlib.suppress(kube.KubeError):
                        await m.delete(kube.PODS, str(_meta(other).get("name")), namespace=NAMESPACE)
            begun = time.monotonic()
            while time.monotonic() - begun < WATCH_S:
                now = await self._read(lambda: m.get(kube.PODS, forged, namespace=NAMESPACE))
                if now is not None and not gated(now.get("spec")):
                    why = (
                        "asking for 1 CPU where 100m was admitted"
                        if oversized
                        else "with a plain owner reference"
                    )
                    self.record(attack, r, target, "SUCCEEDED", f"her pod {forged}, {why}, was released")
                    return
                await asyncio.sleep(0.5)
            self.record(
                attack,
                r,
                target,
                "neutralised",
                f"accepted; {forged} stayed gated for {WATCH_S:.0f}s with room in the admission",
            )
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.delete(kube.PODS, forged, namespace=NAMESPACE)
            with contextlib.suppress(kube.KubeError):
                await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")

    async def _own_job_admitted(self, attack: str, r: int, body: kube.Obj) -> kube.Obj | None:
        """Submit ``body`` in her namespace and wait for its unit's admission; None (recorded as
        skipped) when it is not accepted or not admitted in time."""
        m = self.mallory
        assert m is not None
        name = str(body["metadata"]["name"])
        sent = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record(
                attack, r, f"{NAMESPACE}/{name}", "skipped", f"her job was not accepted: {sent.message}"
            )
            return None
        begun = time.monotonic()
        while not is_admitted_unit(await self._own_unit(name)):
            if time.monotonic() - begun > UNDO_S:
                self.record(attack, r, f"{NAMESPACE}/{name}", "skipped", "her job was not admitted in time")
                return None
            await asyncio.sleep(0.5)
        return sent.obj

    async def _own_pods(self, job: str) -> list[kube.Obj]:
        m = self.mallory
        assert m is not None
        found = await self._read(
            lambda: m.list(
                kube.PODS, namespace=NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}"
            )
        )
        return list(found or [])

    async def outgrow(self, r: int) -> None:
        """Her admitted one-pod Job (500m) raised to eight pods at once (counts may change). The
        scheduler may admit the added pods only as her 2-CPU quota allows, and nothing else may
        grow what her units hold: judged on what the API shows, her units of that quota never hold
        more than 2 CPU together, and her Job never has more pods running (bound or out of the gate) than
        its unit holds."""
        m = self.mallory
        assert m is not None
        attack = "scale-admitted-job-past-quota"
        name = f"mallory-grow-{r}"
        plan = load.JobPlan(name, QUOTA, "single", None, False, cpu="500m", memory=False)
        body = load.job(plan, "mallory", namespace=NAMESPACE)
        # Eight completions, one at a time: `completions` is immutable, `parallelism` is hers to raise.
        body["spec"]["parallelism"], body["spec"]["completions"] = 1, 8
        target = f"{NAMESPACE}/{name}"
        try:
            if await self._own_job_admitted(attack, r, body) is None:
                return
            scale = {"spec": {"parallelism": 8}}
            sent = await self.send(lambda: m.patch(JOBS, name, scale, namespace=NAMESPACE))
            if sent.status != "accepted":
                self.record(attack, r, target, "refused", sent.message)
                return
            worst_total, worst_over = 0, 0
            begun = time.monotonic()
            while time.monotonic() - begun < 2 * WATCH_S:
                units = await self._read(lambda: self.admin.list(UNITS, namespace=NAMESPACE)) or []
                # Her quota's units only: her pool jobs in this namespace hold another quota's.
                mine = [u for u in units if (quota_label(u) or ("", ""))[1] == QUOTA]
                worst_total = max(worst_total, sum(held_cpu_milli(u) for u in mine))
                own = next((u for u in units if _meta(u).get("name") == name), None)
                running = sum(1 for p in await self._own_pods(name) if runs(p))
                held = sum(
                    int((a or {}).get("replicas") or 0)
                    for a in ((own or {}).get("status") or {}).get("admissions") or []
                )
                worst_over = max(worst_over, running - held)
                await asyncio.sleep(0.5)
            if worst_total > int(QUOTA_CPU) * 1000 or worst_over > 0:
                detail = (
                    f"her units held {worst_total}m CPU together (quota {QUOTA_CPU}), and her job "
                    f"ran up to {worst_over} pod(s) beyond its admission"
                )
                self.record(attack, r, target, "SUCCEEDED", detail)
                return
            self.record(
                attack,
                r,
                target,
                "neutralised",
                f"accepted; her units held at most {worst_total}m CPU together and her pods never "
                "outran the admission",
            )
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")

    async def terminate_and_replace(self, r: int) -> None:
        """Her admitted one-pod Job (1 CPU): she puts a finalizer of her own on its running pod and
        deletes it, so the pod keeps terminating (and, with a kubelet, running) for as long as she
        likes; the Job's replacement must not run beside it. Judged on the API alone: her Job
        never has more pods that run or may run (bound, terminating ones included, or out of the
        gate) than its unit holds."""
        m = self.mallory
        assert m is not None
        attack = "delete-pod-to-run-replacement-beside-it"
        name = f"mallory-replace-{r}"
        plan = load.JobPlan(name, QUOTA, "single", None, False, cpu="1", memory=False)
        body = load.job(plan, "mallory", namespace=NAMESPACE)
        # Its pod runs (on a kwok node) for the whole attack instead of completing on the load's clock.
        template_meta = body["spec"]["template"].setdefault("metadata", {})
        template_meta.setdefault("annotations", {})[COMPLETE_DELAY_ANNOTATION] = "300s"
        target = f"{NAMESPACE}/{name}"
        held_pod = ""
        try:
            if await self._own_job_admitted(attack, r, body) is None:
                return
            begun = time.monotonic()
            first = None
            while first is None and time.monotonic() - begun < UNDO_S:
                first = next(
                    (p for p in await self._own_pods(name) if (p.get("spec") or {}).get("nodeName")), None
                )
                await asyncio.sleep(0.5)
            if first is None:
                self.record(attack, r, target, "skipped", "her job's pod was not bound in time")
                return
            held_pod = str(_meta(first).get("name"))
            hold = {"metadata": {"finalizers": [HOLD_FINALIZER]}}
            sent = await self.send(lambda: m.patch(kube.PODS, held_pod, hold, namespace=NAMESPACE))
            if sent.status != "accepted":
                self.record(attack, r, target, "skipped", f"her finalizer was not accepted: {sent.message}")
                return
            with contextlib.suppress(kube.KubeError):
                await m.delete(kube.PODS, held_pod, namespace=NAMESPACE)
            worst_over, terminating_seen = 0, 0
            begun = time.monotonic()
            while time.monotonic() - begun < 2 * WATCH_S:
                pods = await self._own_pods(name)
                unit = await self._own_unit(name)
                if not unit:
                    # Unreadable (a fault: the apiserver restarting), not a unit holding nothing:
                    # such a read proves nothing either way.
                    await asyncio.sleep(0.5)
                    continue
                held = sum(
                    int((a or {}).get("replicas") or 0)
                    for a in (unit.get("status") or {}).get("admissions") or []
                )
                worst_over = max(worst_over, sum(1 for p in pods if runs(p)) - held)
                terminating_seen += any(
                    _meta(p).get("name") == held_pod and _meta(p).get("deletionTimestamp") for p in pods
                )
                await asyncio.sleep(0.5)
            if worst_over > 0:
                detail = f"her job ran {worst_over} pod(s) beyond its admission while {held_pod} terminated"
                self.record(attack, r, target, "SUCCEEDED", detail)
            elif not terminating_seen:
                self.record(
                    attack,
                    r,
                    target,
                    "skipped",
                    f"{held_pod} did not stay terminating (its finalizer was removed)",
                )
            else:
                self.record(
                    attack,
                    r,
                    target,
                    "neutralised",
                    f"accepted; while {held_pod} terminated ({terminating_seen} reads) no replacement "
                    "ran beside it",
                )
        finally:
            if held_pod:
                with contextlib.suppress(kube.KubeError):
                    await m.patch(
                        kube.PODS,
                        held_pod,
                        [{"op": "remove", "path": "/metadata/finalizers"}],
                        namespace=NAMESPACE,
                        content_type=kube.JSON_PATCH,
                    )
            with contextlib.suppress(kube.KubeError):
                await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")

    async def join_unit(self, r: int, victim: kube.Obj | None) -> None:
        """A pod of hers, bound to a node and naming no unit (the birth rule does not apply), that
        she then annotates into a victim's unit, controlled by the victim Job by its real UID. A
        victim's pods never bind, so its unit must go on reporting 0 running pods."""
        m = self.mallory
        assert m is not None
        attack = "annotate-existing-pod-into-unit"
        if victim is None or not self.nodes:
            self.record(attack, r, "-", "skipped", "no victim job at this moment")
            return
        job_name = str(_meta(victim).get("name"))
        template = ((victim.get("spec") or {}).get("template") or {}).get("metadata") or {}
        links = {
            k: v
            for k, v in (template.get("annotations") or {}).items()
            if k in (names.RELATED_QUEUEUNIT_ANNOTATION, names.RELATED_PODSET_ANNOTATION)
        }
        unit_ref = links.get(names.RELATED_QUEUEUNIT_ANNOTATION) or f"{load.NAMESPACE}/{job_name}"
        name = f"mallory-join-{r}"
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job_name,
            "uid": str(_meta(victim).get("uid")),
        }
        pod = forged_pod_body(name, annotations={}, owner={**owner, "controller": True}, cpu="100m")
        pod["spec"].pop("schedulingGates")
        pod["spec"]["nodeName"] = self.nodes[r % len(self.nodes)]
        target = f"{load.NAMESPACE}/{name} -> {unit_ref}"
        sent = await self.send(lambda: m.create(kube.PODS, pod, namespace=load.NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "skipped", f"her own pod was not accepted: {sent.message}")
            return
        try:
            patch = {"metadata": {"annotations": {names.RELATED_QUEUEUNIT_ANNOTATION: unit_ref, **links}}}
            sent = await self.send(lambda: m.patch(kube.PODS, name, patch, namespace=load.NAMESPACE))
            if sent.status != "accepted":
                self.record(attack, r, target, "refused", sent.message)
                return
            unit_name = unit_ref.split("/", 1)[-1]
            worst = 0
            begun = time.monotonic()
            while time.monotonic() - begun < WATCH_S:
                found = await self._read(lambda: self.admin.get(UNITS, unit_name, namespace=load.NAMESPACE))
                worst = max(worst, running_reported(found) if found is not None else 0)
                await asyncio.sleep(0.5)
            if worst > 0:
                self.record(
                    attack, r, target, "SUCCEEDED", f"the victim's unit reported {worst} running pods"
                )
            else:
                self.record(
                    attack, r, target, "neutralised", "accepted; the victim's unit reported 0 running pods"
                )
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.request(
                    "DELETE",
                    kube.PODS.path(load.NAMESPACE, name),
                    body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                )

    async def priority(self, r: int, job: kube.Obj | None) -> None:
        """``scheduling.x-k8s.io/priority`` raised on a queued job of the capped quota: first to the
        int32 maximum (above the cluster's maxUserPriority), then to the cluster cap itself (above
        the quota's own cap)."""
        cluster_attack, quota_attack = "priority-above-cluster-cap", "priority-above-quota-cap"
        patch = {"metadata": {"annotations": {names.PRIORITY_ANNOTATION: str(2**31 - 1)}}}
        done = await self._patch_job(cluster_attack, r, job, patch)
        if done is not None:
            await self._priority_held(cluster_attack, r, done[1], 2**31 - 1)
        if job is None:
            self.record(quota_attack, r, "-", "skipped", "no queued job of the capped quota at this moment")
            return
        m = self.mallory
        assert m is not None
        fresh = await self._read(lambda: m.get(JOBS, str(_meta(job).get("name")), namespace=load.NAMESPACE))
        if fresh is None or not queued(fresh):
            self.record(quota_attack, r, "-", "skipped", "the target was admitted or vanished meanwhile")
            return
        patch = {"metadata": {"annotations": {names.PRIORITY_ANNOTATION: str(CLUSTER_PRIORITY_CAP)}}}
        done = await self._patch_job(quota_attack, r, fresh, patch)
        if done is not None:
            await self._priority_held(quota_attack, r, done[1], CLUSTER_PRIORITY_CAP)

    async def _priority_held(self, attack: str, r: int, target: str, asked: int) -> None:
        """The unit's priority must stay at or below the caps."""
        name = target.split("/", 1)[1]
        cap = min(CLUSTER_PRIORITY_CAP, QUOTA_PRIORITY_CAP)
        seen: list[int] = []
        begun = time.monotonic()
        while time.monotonic() - begun < WATCH_S:
            with contextlib.suppress(kube.KubeError):
                unit = await self.admin.get(UNITS, name, namespace=load.NAMESPACE)
                value = (unit.get("spec") or {}).get("priority")
                if isinstance(value, int):
                    seen.append(value)
                    if value > cap:
                        self.record(
                            attack,
                            r,
                            target,
                            "SUCCEEDED",
                            f"asked {asked}: the unit's priority became {value}",
                        )
                        return
            await asyncio.sleep(0.5)
        final = seen[-1] if seen else None
        self.record(
            attack,
            r,
            target,
            "neutralised",
            f"accepted (asked {asked}); the unit's priority stayed <= {cap} "
            f"(values seen {sorted(set(seen))}, now {final})",
        )

    async def own_priority(self, r: int, *, forbidden_class: bool) -> None:
        """A Job in her own namespace that asks for a priority no admin gave her: a raw
        ``priority`` in its pod template, or the PriorityClass her quota does not allow. Judged on
        the run's settings alone: her unit must never carry more than :data:`OWN_PRIORITY_BOUND`.
        Its pods could not land anywhere (a node selector no node has), so even a class the
        kube-scheduler honours preempts no pod of the load."""
        m = self.mallory
        assert m is not None
        attack = "disallowed-priority-class" if forbidden_class else "raw-template-priority"
        name = f"mallory-{'class' if forbidden_class else 'rawprio'}-{r}"
        body = load.job(load.JobPlan(name, QUOTA, "victim", None, False), "mallory", namespace=NAMESPACE)
        pod = body["spec"]["template"]["spec"]
        pod["containers"] = [load.container("100m")]
        if forbidden_class:
            pod["priorityClassName"] = FORBIDDEN_CLASS
        else:
            pod["priority"] = RAW_TEMPLATE_PRIORITY
        target = f"{NAMESPACE}/{name}"
        sent = await self.send(lambda: m.create(JOBS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record(attack, r, target, "refused", sent.message)
            return
        try:
            seen: set[object] = set()
            begun = time.monotonic()
            while time.monotonic() - begun < WATCH_S:
                unit = await self._own_unit(name)
                if unit:
                    high = priority_above(unit, OWN_PRIORITY_BOUND)
                    if high is not None:
                        detail = f"the unit's priority became {high} (allowed at most {OWN_PRIORITY_BOUND})"
                        self.record(attack, r, target, "SUCCEEDED", detail)
                        return
                    seen.add((unit.get("spec") or {}).get("priority"))
                await asyncio.sleep(0.5)
            shown = sorted(str(v) for v in seen) or ["no unit yet"]
            self.record(
                attack,
                r,
                target,
                "neutralised",
                f"accepted; the unit's priority stayed low ({', '.join(shown)})",
            )
        finally:
            with contextlib.suppress(kube.KubeError):
                await m.delete(JOBS, name, namespace=NAMESPACE, propagation="Background")

    async def workflow(self, r: int) -> None:
        """An Argo Workflow (its CRD has no status subresource) created with a forged
        ``status.phase: Succeeded``, then its status changed to Succeeded by an update."""
        m = self.mallory
        assert m is not None
        name = f"mallory-wf-{r}"
        target = f"{NAMESPACE}/{name}"
        body = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": {names.QUOTA_NAME_LABEL: QUOTA},
                "annotations": {names.MIN_RESOURCES_ANNOTATION: json.dumps({"cpu": "100m"})},
            },
            "spec": {
                "entrypoint": "main",
                "templates": [{"name": "main", "container": {"image": "busybox"}}],
            },
            "status": {"phase": "Succeeded", "finishedAt": "2026-01-01T00:00:00Z"},
        }
        sent = await self.send(lambda: m.create(WORKFLOWS, body, namespace=NAMESPACE))
        if sent.status != "accepted":
            self.record("workflow-forged-succeeded", r, target, "refused", sent.message)
            self.record("workflow-status-update", r, target, "skipped", "no workflow of hers to update")
            return
        try:
            phase = (sent.obj.get("status") or {}).get("phase")
            if phase == "Succeeded":
                self.record(
                    "workflow-forged-succeeded", r, target, "SUCCEEDED", "stored with status.phase Succeeded"
                )
            else:
                self.record(
                    "workflow-forged-succeeded",
                    r,
                    target,
                    "neutralised",
                    f"accepted; the forged status was stripped (stored status {sent.obj.get('status')!r})",
                )
            update = {"status": {"phase": "Succeeded", "finishedAt": "2026-01-01T00:00:00Z"}}
            sent = await self.send(lambda: m.patch(WORKFLOWS, name, update, namespace=NAMESPACE))
            if sent.status == "accepted":
                stored = (sent.obj.get("status") or {}).get("phase")
                outcome = "SUCCEEDED" if stored == "Succeeded" else "neutralised"
                self.record(
                    "workflow-status-update", r, target, outcome, f"accepted; stored status.phase {stored!r}"
                )
            else:
                outcome = "refused" if sent.status == "refused" else "skipped"
                self.record("workflow-status-update", r, target, outcome, sent.message)
        finally:
            # No Argo controller here: an admitted Workflow would hold its quota for ever.
            with contextlib.suppress(kube.KubeError):
                await m.delete(WORKFLOWS, name, namespace=NAMESPACE)

    async def rbac(self, r: int, job: kube.Obj | None) -> None:
        """Writes of admin- and reconciler-owned objects: a QueueUnit's status (admit herself), a
        QueueUnit of her own, a quota's max, a same-named quota in her namespace."""
        m = self.mallory
        assert m is not None
        if job is not None:
            name = str(_meta(job).get("name"))
            status = {"status": {"phase": "Dequeued", "admissions": [{"name": name, "replicas": 1}]}}
            sent = await self.send(
                lambda: m.patch(UNITS, name, status, namespace=load.NAMESPACE, subresource="status"),
                rbac_allows=False,
            )
            await self._rbac_outcome("write-queueunit-status", r, f"{load.NAMESPACE}/{name}", sent)
        else:
            self.record(
                "write-queueunit-status", r, "-", "skipped", "no queued job of the load at this moment"
            )
        unit = load.bare_unit(f"mallory-unit-{r}", "chaos-b", "1", "mallory", namespace=load.NAMESPACE)
        sent = await self.send(lambda: m.create(UNITS, unit, namespace=load.NAMESPACE), rbac_allows=False)
        await self._rbac_outcome("create-queueunit", r, f"{load.NAMESPACE}/mallory-unit-{r}", sent)
        raise_max = {"spec": {"max": {"cpu": "1000"}}}
        sent = await self.send(
            lambda: m.patch(QUOTAS, CAPPED_QUOTA, raise_max, namespace=load.NAMESPACE), rbac_allows=False
        )
        await self._rbac_outcome("raise-quota-max", r, f"{load.NAMESPACE}/{CAPPED_QUOTA}", sent)
        twin = load.quota(CAPPED_QUOTA, "1000", "", True, NAMESPACE)
        sent = await self.send(lambda: m.create(QUOTAS, twin, namespace=NAMESPACE), rbac_allows=False)
        await self._rbac_outcome("create-same-named-quota", r, f"{NAMESPACE}/{CAPPED_QUOTA}", sent)

    async def _rbac_outcome(self, attack: str, r: int, target: str, sent: Sent) -> None:
        if sent.status == "refused":
            self.record(attack, r, target, "refused", sent.message)
            return
        if sent.status != "accepted":
            self.record(attack, r, target, "skipped", sent.message)
            return
        self.record(attack, r, target, "SUCCEEDED", "accepted: a namespace user wrote it")
        # Put things back so that the rest of the run stays meaningful.
        namespace, name = target.split("/", 1)
        with contextlib.suppress(kube.KubeError):
            if attack == "raise-quota-max":
                spec = {"spec": {"max": {"cpu": load.QUOTAS[CAPPED_QUOTA][0]}}}
                await self.admin.patch(QUOTAS, name, spec, namespace=namespace)
            elif attack == "create-same-named-quota":
                await self.admin.delete(QUOTAS, name, namespace=namespace)
            elif attack == "create-queueunit":
                await self.admin.delete(UNITS, name, namespace=namespace)

    # --- after the load -------------------------------------------------------------------------

    async def final_checks(self, checks: Counter[str]) -> None:
        """After the drain: no unit of hers under an unbound quota was ever admitted; no unit reports
        more running pods than the unfinished pods its job owns and has bound, terminating ones included
        (so no forged pod was counted); no
        unit of her own namespace carries more priority than :data:`OWN_PRIORITY_BOUND`; every pod
        released for a unit of a pool carried the pool's selector and bound in it
        (:func:`chaos.tenant_pools.placement_breaches`)."""
        for breach in await tenant_pools.final_check(self.pool_record, checks):
            self.violate("tenant-bypass", breach)
        if self.pool_record is not None:
            self.transient["pool record: watch begun again"] += self.pool_record.relists
            for why, n in self.pool_record.breaks.items():
                self.transient[f"pool record broke: {why}"] += n
        own = await self._read(functools.partial(self.admin.list, UNITS, namespace=NAMESPACE)) or []
        for unit in own:
            checks["tenant: her units carry no more priority than the admins allow"] += 1
            high = priority_above(unit, OWN_PRIORITY_BOUND)
            if high is not None:
                key = f"{NAMESPACE}/{_meta(unit).get('name')}"
                self.violate("tenant-bypass", f"{key} has priority {high}, above {OWN_PRIORITY_BOUND}")
        for key in sorted(self._unbound_units):
            checks["tenant: unit under an unbound quota never admitted"] += 1
            if self.observer.cycles.get(key, 0) > 0:
                self.record(
                    "job-naming-unbound-quota",
                    -1,
                    key,
                    "SUCCEEDED",
                    f"admitted {self.observer.cycles[key]} times by the end of the run",
                )
        for namespace in (load.NAMESPACE, NAMESPACE):
            units = await self._read(functools.partial(self.admin.list, UNITS, namespace=namespace)) or []
            for unit in units:
                ref = (unit.get("spec") or {}).get("consumerRef") or {}
                if ref.get("kind") != "Job":
                    continue
                job = self.observer.jobs.get(f"{namespace}/{ref.get('name')}")
                if job is None or job.deleting:
                    continue
                # A bound pod being deleted still runs until it is gone, and the queue counts it
                # (docs/compatibility.md#pod-gating): only finished pods drop out of the count.
                owned = sum(1 for p in self.observer.owned_pods(job) if p.bound and not p.terminal)
                reported = running_reported(unit)
                checks["tenant: unit reports no more running pods than its job owns"] += 1
                key = f"{namespace}/{_meta(unit).get('name')}"
                if reported > owned and (unit.get("status") or {}).get("phase") not in ("Succeed", "Failed"):
                    self.violate(
                        "tenant-bypass",
                        f"{key} reports {reported} running pods at the end; its job owns {owned} bound pods",
                    )

    def results(self) -> dict[str, Any]:
        return {
            "user": USER,
            "namespaces": [load.NAMESPACE, NAMESPACE],
            "attacks": summarize(self.attempts),
            "attempts": [asdict(a) for a in self.attempts],
            "transient_retries": dict(self.transient),
            "harness_errors": self.errors,
        }
