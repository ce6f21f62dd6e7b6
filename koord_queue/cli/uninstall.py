"""``kubectl koord-queue uninstall``: take the queue out of the way without leaving jobs held
(docs/operations.md#uninstall).

Removing the release alone strands every job the queue holds: it stays suspended and its pods stay
behind the ``koord-queue/admission`` gate, which only the reconciler may remove. So, in this order:

1. stop the reconciler (scale its Deployment to 0), or it would hold the released jobs again
   (``HeldUnadmitted``) and the order of the next steps would not matter;
2. delete the webhook configurations and every admission policy and binding of the install, so
   nothing new is held and nothing refuses the writes below (found by the label the manifests and
   the chart put on them, and by their names);
3. release (the adapter's own resume patch, as the reconciler writes it on admission) or delete
   every job whose QueueUnit is not admitted while the job is still suspended, taking the gate off
   its pod templates where the API still allows template changes;
4. remove the gate from every pod that still carries it.

Deleting policies takes a moment to reach the apiserver's admission chain, so a write refused by
admission is retried for a while. CRDs and QueueUnits stay: the admin removes the release after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TextIO, TypeVar

from koord_queue.cli.client import QUEUE_UNITS, CliError, Refused, denied
from koord_queue.shared import kube
from koord_queue.shared.api import durations, names
from koord_queue.shared.jobs import base, registry

Obj = dict[str, Any]
T = TypeVar("T")

_ADMISSION = "admissionregistration.k8s.io"
WEBHOOK_CONFIGS: Final = (
    kube.Resource(_ADMISSION, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
    kube.Resource(_ADMISSION, "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
)
POLICY_KINDS: Final = (
    kube.Resource(_ADMISSION, "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
    kube.Resource(_ADMISSION, "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
)
PODS: Final = kube.Resource("", "v1", "pods", "Pod")
SCALE: Final = kube.Resource("apps", "v1", "deployments", "Deployment")
#: The webhook configurations' name (manifests/webhook-configurations.yaml).
WEBHOOK_CONFIG_NAME: Final = "koord-queue"
#: The label the manifests (kustomization.yaml) and the chart put on everything they install.
PART_OF: Final = ("app.kubernetes.io/part-of", "koord-queue")
#: The policies and bindings of manifests/*-policy.yaml, for an install that lost its labels.
POLICY_NAMES: Final = frozenset(
    {
        "koord-queue-admission-gate",
        "koord-queue-pod-links",
        "koord-queue-pod-birth",
        "koord-queue-quota-binding",
        "koord-queue-quota-binding-fallback",
        "koord-queue-reconciler-quota-writes",
        "koord-queue-quota-name",
        "koord-queue-quota-tree",
    }
)
RECONCILER: Final = "koord-queue-reconciler"
#: How long a write refused by admission is retried while deleted policies still apply, and how
#: long the reconciler's pods get to stop.
SETTLE_SECONDS: Final = 30.0
STOP_SECONDS: Final = 120.0


class UsageError(CliError):
    code = 2


@dataclass
class Held:
    """A job the queue holds: its resource, namespace, name and the object as read."""

    res: kube.Resource
    namespace: str
    name: str
    job: Obj
    adapter: base.JobAdapter

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.res.kind.lower()}/{self.name}"


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)

    def section(self, verb: str, what: str, items: Sequence[str]) -> None:
        shown = ": " + ", ".join(items) if items else ""
        self.lines.append(f"{verb} {len(items)} {what}{shown}")


# --- pure decisions --------------------------------------------------------------------------------


def is_ours(obj: Mapping[str, Any], known: frozenset[str]) -> bool:
    """Installed by the manifests or the chart: labelled so, or named as they name it."""
    meta = obj.get("metadata") or {}
    labelled = (meta.get("labels") or {}).get(PART_OF[0]) == PART_OF[1]
    return labelled or meta.get("name") in known


def without_gate(gates: object) -> list[Any] | None:
    """``gates`` without the admission gate; None when it does not carry it."""
    if not isinstance(gates, list) or not any(
        isinstance(g, Mapping) and g.get("name") == names.ADMISSION_GATE for g in gates
    ):
        return None
    return [g for g in gates if not (isinstance(g, Mapping) and g.get("name") == names.ADMISSION_GATE)]


def gate_ops(obj: object, path: str = "") -> list[Obj]:
    """JSON Patch taking the admission gate off every ``schedulingGates`` list inside ``obj`` (a
    job's pod templates, wherever its kind keeps them), each guarded by a ``test`` of the list."""
    ops: list[Obj] = []
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            here = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
            kept = without_gate(value) if key == "schedulingGates" else None
            if kept is not None:
                ops += [
                    {"op": "test", "path": here, "value": value},
                    {"op": "replace", "path": here, "value": kept},
                ]
            else:
                ops += gate_ops(value, here)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            ops += gate_ops(value, f"{path}/{i}")
    return ops


def held_job(unit: Mapping[str, Any], job: Obj, adapter: base.JobAdapter) -> bool:
    """The queue holds ``job``: suspended and never resumed by the reconciler since (a held, waiting
    or preempted job; an admitted one carries the dequeue timestamp)."""
    phase = str((unit.get("status") or {}).get("phase") or "")
    finished = phase in (names.Phase.SUCCEED, names.Phase.FAILED)
    return not finished and adapter.is_suspended(job) and not base.is_dequeued(job)


# --- the cluster -----------------------------------------------------------------------------------


async def _settled(
    write: Callable[[], Awaitable[T]], what: str, res: kube.Resource, namespace: str | None
) -> T:
    """Run ``write``, retrying while admission still refuses it (a deleted policy or webhook
    configuration reaches the apiserver's admission chain a moment later). RBAC refusals are final."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        try:
            return await write()
        except kube.KubeError as err:
            failure = denied(err, what, res, namespace)
            transient = isinstance(failure, Refused) or err.status >= 500
            if not transient or time.monotonic() > deadline:
                raise failure from None
        await asyncio.sleep(0.5)


async def _list(api: kube.Kube, res: kube.Resource, namespace: str | None = None) -> list[Obj]:
    try:
        items, _ = await api.list(res, namespace=namespace)
    except kube.KubeError as err:
        raise denied(err, "list", res, namespace) from None
    return items


async def stop_reconciler(api: kube.Kube, report: Report, *, dry_run: bool) -> None:
    """Scale the reconciler to 0 and wait until none of its replicas is left."""
    ns = names.COMPONENT_NAMESPACE
    try:
        await api.get(SCALE, RECONCILER, namespace=ns)
    except kube.NotFound:
        report.lines.append(f"reconciler: no Deployment {ns}/{RECONCILER}, nothing to stop")
        return
    except kube.KubeError as err:
        raise denied(err, "get", SCALE, ns) from None
    if dry_run:
        report.lines.append(f"would scale Deployment {ns}/{RECONCILER} to 0")
        return
    try:
        await api.patch(SCALE, RECONCILER, {"spec": {"replicas": 0}}, namespace=ns)
    except kube.KubeError as err:
        raise denied(err, "patch", SCALE, ns) from None
    deadline = time.monotonic() + STOP_SECONDS
    while True:
        dep = await api.get(SCALE, RECONCILER, namespace=ns)
        if not int((dep.get("status") or {}).get("replicas") or 0):
            break
        if time.monotonic() > deadline:
            raise CliError(f"the reconciler ({ns}/{RECONCILER}) still runs after {STOP_SECONDS:.0f}s")
        await asyncio.sleep(1.0)
    report.lines.append(f"scaled Deployment {ns}/{RECONCILER} to 0")


async def remove_admission(api: kube.Kube, report: Report, *, dry_run: bool) -> None:
    """Delete the webhook configurations, then the policy bindings and the policies."""
    verb = "would delete" if dry_run else "deleted"
    for res in (*WEBHOOK_CONFIGS, *POLICY_KINDS):
        known = frozenset({WEBHOOK_CONFIG_NAME}) if res in WEBHOOK_CONFIGS else POLICY_NAMES
        found = [str(o["metadata"]["name"]) for o in await _list(api, res) if is_ours(o, known)]
        for name in found if not dry_run else ():
            try:
                await api.delete(res, name)
            except kube.NotFound:
                continue
            except kube.KubeError as err:
                raise denied(err, "delete", res, None) from None
        report.section(verb, f"{res.kind}s", sorted(found))


async def held_jobs(api: kube.Kube) -> list[Held]:
    """Every job behind a QueueUnit the queue has not admitted and still keeps suspended."""
    found: list[Held] = []
    for unit in await _list(api, QUEUE_UNITS):
        ref = (unit.get("spec") or {}).get("consumerRef") or {}
        api_version, kind, name = str(ref.get("apiVersion", "")), str(ref.get("kind", "")), ref.get("name")
        namespace = str((unit.get("metadata") or {}).get("namespace", ""))
        adapter = registry.by_kind(api_version, kind)
        if adapter is None or not name:
            continue
        group, _, version = api_version.rpartition("/")
        res = kube.Resource(group, version, adapter.plural, kind)
        try:
            job = await api.get(res, str(name), namespace=namespace)
        except kube.NotFound:
            continue
        except kube.KubeError as err:
            raise denied(err, "get", res, namespace) from None
        if held_job(unit, job, adapter):
            found.append(Held(res, namespace, str(name), job, adapter))
    return found


async def release(api: kube.Kube, held: Held) -> bool:
    """Ungate the job's templates (while it is suspended, the only time a Job allows it), then
    resume it with the adapter's patch. False when a template had to keep its gate."""
    ops = gate_ops(held.job)

    async def ungate_templates() -> bool:
        try:
            await api.patch(held.res, held.name, ops, namespace=held.namespace, content_type=kube.JSON_PATCH)
        except kube.KubeError as err:
            if err.status == 422 and "immutable" in err.message:
                return False  # a Job that has started keeps its template
            raise
        return True

    templates_clean = await _settled(ungate_templates, "patch", held.res, held.namespace) if ops else True
    job = await api.get(held.res, held.name, namespace=held.namespace)
    patch = held.adapter.resume_patch(job, now_text=durations.format_time(time.time()))

    def resume() -> Awaitable[Obj]:
        return api.patch(held.res, held.name, patch, namespace=held.namespace)

    await _settled(resume, "patch", held.res, held.namespace)
    return templates_clean


async def delete(api: kube.Kube, held: Held) -> None:
    def write() -> Awaitable[Obj]:
        return api.delete(held.res, held.name, namespace=held.namespace, propagation="Background")

    try:
        await _settled(write, "delete", held.res, held.namespace)
    except CliError:
        if await _exists(api, held.res, held.namespace, held.name):
            raise


async def ungate_pods(api: kube.Kube, skip_owners: set[str], *, dry_run: bool) -> list[str]:
    """Take the admission gate off every pod that carries it, but those of deleted jobs."""
    done: list[str] = []
    for pod in await _list(api, PODS):
        meta = pod.get("metadata") or {}
        gates = (pod.get("spec") or {}).get("schedulingGates")
        kept = without_gate(gates)
        owners = {str(o.get("uid")) for o in meta.get("ownerReferences") or []}
        if kept is None or meta.get("deletionTimestamp") or owners & skip_owners:
            continue
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if not dry_run:
            ops: list[Obj] = [
                {"op": "test", "path": "/spec/schedulingGates", "value": gates},
                {"op": "replace", "path": "/spec/schedulingGates", "value": kept},
            ]
            await _ungate(api, ns, name, ops)
        done.append(f"{ns}/{name}")
    return done


async def _ungate(api: kube.Kube, namespace: str, name: str, ops: list[Obj]) -> None:
    def write() -> Awaitable[Obj]:
        return api.patch(PODS, name, ops, namespace=namespace, content_type=kube.JSON_PATCH)

    try:
        await _settled(write, "patch", PODS, namespace)
    except CliError:
        if await _exists(api, PODS, namespace, name):
            raise  # a pod deleted meanwhile needs nothing


async def _exists(api: kube.Kube, res: kube.Resource, namespace: str, name: str) -> bool:
    try:
        await api.get(res, name, namespace=namespace)
    except kube.NotFound:
        return False
    return True


def check_args(args: Any) -> None:
    if not args.dry_run and not args.yes:
        raise UsageError(
            "uninstall releases or deletes every job the queue holds and removes its admission control; "
            "run it with --dry-run to see what it would do, then with --yes"
        )


async def cmd_uninstall(client: kube.Kube, args: Any, out: TextIO) -> int:
    check_args(args)
    dry_run = bool(args.dry_run)
    report = Report()
    await stop_reconciler(client, report, dry_run=dry_run)
    await remove_admission(client, report, dry_run=dry_run)
    held = await held_jobs(client)
    deleted_uids: set[str] = set()
    kept_gates: list[str] = []
    for job in held if not dry_run else ():
        if args.held == "delete":
            await delete(client, job)
        elif not await release(client, job):
            kept_gates.append(job.label)
    if args.held == "delete":
        deleted_uids = {str(j.job["metadata"].get("uid")) for j in held}
    verb = {"delete": "deleted", "release": "released"}[args.held]
    report.section(f"would {args.held}" if dry_run else verb, "held jobs", [j.label for j in held])
    if kept_gates:
        report.section(
            "kept the gate in the pod templates of (started before; rerun uninstall to ungate new pods)",
            "jobs",
            kept_gates,
        )
    pods = await ungate_pods(client, deleted_uids, dry_run=dry_run)
    report.section("would ungate" if dry_run else "ungated", "pods", pods)
    out.write("\n".join(report.lines) + "\n")
    if not dry_run:
        out.write(
            "the queue is out of the way; now remove the release (helm uninstall, or kubectl delete -k "
            "manifests/). CRDs and QueueUnits stay: docs/operations.md#uninstall\n"
        )
    return 0
