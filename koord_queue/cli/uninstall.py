"""``kubectl koord-queue uninstall``: take the queue out of the way without leaving jobs held
(docs/operations.md#uninstall).

Removing the release alone strands every job the queue holds: it stays suspended and its pods stay
behind the ``koord-queue/admission`` gate, which only the reconciler may remove. So, in this order:

1. stop the reconciler (scale its Deployment to 0), or it would hold the released jobs again
   (``HeldUnadmitted``) and the order of the next steps would not matter;
2. delete the webhook configurations and every admission policy and binding of the install, so
   nothing new is held and nothing refuses the writes below (found by the label the manifests and
   the chart put on them, and by their names);
3. list every job of every kind the queue knows (the adapters' registry; a kind whose CRD is not
   served is skipped) and release (the adapter's own resume patch, as the reconciler writes it on
   admission) or delete each one the queue holds: unfinished, suspended, never resumed since, and
   marked by the queue (a QueueUnit naming it, the webhook's enqueue stamps, or a quota label).
   The marks, not the QueueUnits alone, find a job the webhook held while no reconciler ran to give
   it a unit;
4. take the gate off the pod templates of every unfinished job that carries it (held or already
   released), where the API still allows template changes;
5. remove the gate from every pod that still carries it.

Step 4 cannot reach a ``batch/v1`` Job the Job controller has started: its template is immutable
from then on, and its later pods (retries, further completions) are created gated. The gate cannot
be left out of admitted Jobs' templates instead: it is what keeps a Job's pods beyond its
admission (scaled up after admission, partially admitted) from being scheduled, and the reconciler
releases pods one by one under it (docs/architecture.md#decision-5-gate-pods-reclaim-only-unbound-ones).
Deleting and re-creating such a Job would kill its running pods. So the command names those jobs,
and ``--follow`` stays to ungate their pods as they appear until every one has finished or is gone.

Deleting policies takes a moment to reach the apiserver's admission chain, so a write refused by
admission is retried for a while. CRDs and QueueUnits stay: the admin removes the release after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TextIO, TypeVar

from koord_queue.cli.client import QUEUE_UNITS, CliError, Denied, Refused, denied
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
#: How often ``--follow`` looks for new gated pods of the Jobs that keep the gate in their template.
FOLLOW_POLL_SECONDS: Final = 2.0


class UsageError(CliError):
    code = 2


@dataclass
class Held:
    """A job the command acts on: its resource, namespace, name and the object as read, and whether
    the queue holds it (else it only carries the gate in a pod template)."""

    res: kube.Resource
    namespace: str
    name: str
    job: Obj
    adapter: base.JobAdapter
    holds: bool = True

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


def finished(job: Obj, adapter: base.JobAdapter) -> bool:
    return adapter.job_status(job) in (base.JobStatus.SUCCEEDED, base.JobStatus.FAILED)


def held_job(unit: Mapping[str, Any] | None, job: Obj, adapter: base.JobAdapter) -> bool:
    """The queue holds ``job``: unfinished, suspended and never resumed by the reconciler since (a
    held, waiting or preempted job; an admitted one carries the dequeue timestamp), and marked as
    the queue's: ``unit`` (its QueueUnit, None when it has none), the webhook's enqueue stamps, or
    its kind's own managed test (a quota label; a ``batch/v1`` Job its parent controls is not, as
    its parent is released instead). A job the webhook held while no reconciler ran has no unit."""
    if unit is not None:
        phase = str((unit.get("status") or {}).get("phase") or "")
        if phase in (names.Phase.SUCCEED, names.Phase.FAILED):
            return False
    if finished(job, adapter) or not adapter.is_suspended(job) or base.is_dequeued(job):
        return False
    return unit is not None or base.is_enqueued(job) or adapter.is_managed(job)


def template_locked(res: kube.Resource, job: Obj) -> bool:
    """A ``batch/v1`` Job that runs or has ever started (``status.startTime``): the apiserver lets
    a Job's pod template change only while it is suspended and has never started."""
    if (res.group, res.kind) != ("batch", "Job"):
        return False
    return base.dig(job, "spec", "suspend") is not True or base.dig(job, "status", "startTime") is not None


def job_kinds() -> list[list[tuple[kube.Resource, base.JobAdapter]]]:
    """Every kind of the registry once, each as the served versions to try in order (the adapters'
    own, then their ``older_versions``): RayJob's two adapters are two views of the same objects."""
    kinds: dict[tuple[str, str], list[tuple[kube.Resource, base.JobAdapter]]] = {}
    for adapter in registry.ADAPTERS:
        group, _, version = adapter.api_version.rpartition("/")
        tries = kinds.setdefault((group, adapter.kind), [])
        for each in (version, *adapter.older_versions):
            res = kube.Resource(group, each, adapter.plural, adapter.kind)
            if all(known.version != each for known, _ in tries):
                tries.append((res, adapter))
    return list(kinds.values())


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


async def stop_reconciler(api: kube.Kube, report: Report, *, dry_run: bool, namespace: str) -> None:
    """Scale the reconciler to 0 and wait until none of its replicas is left."""
    ns = namespace  # the install namespace (--koord-queue-namespace)
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
    """Every job the queue holds, and every other unfinished job whose pod templates carry the
    gate (``holds`` False), over every served kind of the registry."""
    units: dict[tuple[str, str, str, str], Obj] = {}
    try:
        listed, _ = await api.list(QUEUE_UNITS)
    except kube.NotFound:
        listed = []  # the CRD is gone already
    except kube.KubeError as err:
        raise denied(err, "list", QUEUE_UNITS, None) from None
    for unit in listed:
        ref = (unit.get("spec") or {}).get("consumerRef") or {}
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        namespace = str((unit.get("metadata") or {}).get("namespace", ""))
        units[(namespace, group, str(ref.get("kind", "")), str(ref.get("name", "")))] = unit
    found: list[Held] = []
    for tries in job_kinds():
        for res, adapter in tries:
            try:
                jobs, _ = await api.list(res)
            except kube.NotFound:
                continue  # not served in this version (or at all)
            except kube.KubeError as err:
                raise denied(err, "list", res, None) from None
            for job in jobs:
                meta = job.get("metadata") or {}
                if meta.get("deletionTimestamp"):
                    continue  # on its way out: nothing to release or ungate
                namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
                own = units.get((namespace, res.group, res.kind, name))
                if held_job(own, job, adapter):
                    found.append(Held(res, namespace, name, job, adapter))
                elif not finished(job, adapter) and gate_ops(job.get("spec")):
                    found.append(Held(res, namespace, name, job, adapter, holds=False))
            break
    return found


async def ungate_templates(api: kube.Kube, held: Held) -> bool:
    """Take the gate off the job's pod templates; False when the API keeps them as they are (a
    started Job). A template may change while a Job is suspended and has never started."""
    if not gate_ops(held.job.get("spec")):
        return True

    async def write() -> bool:
        # Read afresh on every attempt: the patch's test ops fail once anyone changed the templates.
        job = await api.get(held.res, held.name, namespace=held.namespace)
        ops = gate_ops(job.get("spec"), "/spec")
        if not ops:
            return True
        try:
            await api.patch(held.res, held.name, ops, namespace=held.namespace, content_type=kube.JSON_PATCH)
        except kube.KubeError as err:
            if err.status == 422 and "immutable" in err.message:
                return False
            raise
        return True

    try:
        return await _settled(write, "patch", held.res, held.namespace)
    except CliError:
        if await _exists(api, held.res, held.namespace, held.name):
            raise
        return True  # deleted meanwhile: nothing left to gate


async def release(api: kube.Kube, held: Held) -> bool:
    """Ungate the job's templates (while it is suspended, the only time a Job allows it), then
    resume it with the adapter's patch. False when a template had to keep its gate."""
    templates_clean = await ungate_templates(api, held)
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


async def ungate_pods(
    api: kube.Kube,
    skip_owners: set[str],
    *,
    dry_run: bool,
    namespace: str | None = None,
    seen: Callable[[str], None] | None = None,
) -> list[str]:
    """Take the admission gate off every pod that carries it, but those of deleted jobs."""
    done: list[str] = []
    for pod in await _list(api, PODS, namespace):
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
        if seen is not None:
            seen(f"{ns}/{name}")
    return done


async def still_gated(api: kube.Kube, held: Held) -> bool:
    """The job is unfinished and its pod templates still carry the gate."""
    try:
        job = await api.get(held.res, held.name, namespace=held.namespace)
    except kube.NotFound:
        return False
    except kube.KubeError as err:
        raise denied(err, "get", held.res, held.namespace) from None
    return not finished(job, held.adapter) and bool(gate_ops(job.get("spec")))


async def follow(
    api: kube.Kube, kept: list[Held], skip_owners: set[str], out: TextIO, *, poll: float = FOLLOW_POLL_SECONDS
) -> int:
    """Ungate the pods of ``kept`` (jobs whose templates keep the gate) as they appear, until every
    one has finished or is gone; returns how many pods it ungated."""

    def seen(pod: str) -> None:
        out.write(f"ungated pod {pod}\n")
        out.flush()

    count = 0
    left = list(kept)
    while left:
        for namespace in sorted({k.namespace for k in left}):
            count += len(await ungate_pods(api, skip_owners, dry_run=False, namespace=namespace, seen=seen))
        left = [k for k in left if await still_gated(api, k)]
        if left:
            await asyncio.sleep(poll)
    return count


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
    await stop_reconciler(client, report, dry_run=dry_run, namespace=str(args.koord_queue_namespace))
    await remove_admission(client, report, dry_run=dry_run)
    found = await held_jobs(client)
    held = [j for j in found if j.holds]
    gated = [j for j in found if not j.holds]
    deleted_uids: set[str] = set()
    kept: list[Held] = []
    if dry_run:
        kept = [j for j in found if template_locked(j.res, j.job) and gate_ops(j.job.get("spec"))]
        kept = [j for j in kept if not (j.holds and args.held == "delete")]
    failed: list[str] = []
    failed_labels: set[str] = set()

    async def each(job: Held, act: Awaitable[bool]) -> None:
        """One job's writes; a job the API refuses is reported and the others go on (a namespace
        user's odd object must not leave everyone else's jobs held). RBAC refusals stop the run."""
        try:
            if not await act:
                kept.append(job)
        except Denied:
            raise
        except (CliError, kube.KubeError) as err:
            failed.append(f"{job.label} ({err})")
            failed_labels.add(job.label)

    async def delete_it(job: Held) -> bool:
        await delete(client, job)
        return True

    for job in held if not dry_run else ():
        if args.held == "delete":
            await each(job, delete_it(job))
        else:
            await each(job, release(client, job))
    for job in gated if not dry_run else ():
        await each(job, ungate_templates(client, job))
    if args.held == "delete":
        deleted_uids = {str(j.job["metadata"].get("uid")) for j in held}
    verb = {"delete": "deleted", "release": "released"}[args.held]
    done = [j.label for j in held if j.label not in failed_labels]
    report.section(f"would {args.held}" if dry_run else verb, "held jobs", done)
    skipped = {j.label for j in kept} | failed_labels
    report.section(
        "would ungate the pod templates of" if dry_run else "ungated the pod templates of",
        "jobs the queue had released",
        [j.label for j in gated if j.label not in skipped],
    )
    if kept:
        report.section("kept the gate in the pod templates of", "started Jobs", [j.label for j in kept])
    pods = await ungate_pods(client, deleted_uids, dry_run=dry_run)
    report.section("would ungate" if dry_run else "ungated", "pods", pods)
    if failed:
        report.section("could not release, delete or ungate", "jobs", failed)
    out.write("\n".join(report.lines) + "\n")
    follow_on = bool(getattr(args, "follow", False))
    if kept and not follow_on:
        out.write(
            "the pods those Jobs create from now on (retries, further completions) are gated again: "
            "run uninstall with --follow to ungate them as they appear until the Jobs finish "
            "(docs/operations.md#uninstall)\n"
        )
    if kept and follow_on and not dry_run:
        out.write(f"following {len(kept)} Jobs until they finish or are deleted (Ctrl-C stops)\n")
        out.flush()
        more = await follow(client, kept, deleted_uids, out)
        out.write(f"the {len(kept)} Jobs finished or are gone; ungated {more} more pods\n")
    if failed:
        out.write("the jobs above were left as they are; fix what the API said and run uninstall again\n")
        return 1
    if not dry_run:
        out.write(
            "the queue is out of the way; now remove the release (helm uninstall, or kubectl delete -k "
            "manifests/). CRDs and QueueUnits stay: docs/operations.md#uninstall\n"
        )
    return 0
