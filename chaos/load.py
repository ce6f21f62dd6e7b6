"""The workload the faults hit, and the hostile input thrown at the system meanwhile.

Sustained mixed load (namespace ``chaos``): single-pod and two-pod batch Jobs over three leaf quotas,
two of them children of a parent quota whose ``max`` is below the sum of theirs. Quota ``chaos-a``
waits for pods to run and allows preemption; one job in five there is a low-priority *victim* whose
pod can never be scheduled (a node selector no node has), so it holds quota until a later
higher-priority job preempts it (a quarter of the victims have ``backoffLimit: 0``: a preemption must
not count as a failure of the job). One in ten is a schedulable *low*-priority job, preemptible
while its pod is not yet running (reclaim races the scheduler binding it). Pods run a few seconds
on kwok nodes, so admissions, finishes and preemptions go on all the time. Some jobs carry the
fallback quota label, every job carries the secret marker annotation that must never show up in a
log.

Borrowing load (namespace ``chaos-borrow``): an oversubscribed parent quota (``max`` 8 CPU) whose
four children guarantee a ``min`` (2, 2, 1 and 2 CPU, adding up to less than the parent's ``min``)
and may each use far more (``max`` 4 to 6 CPU); one of them does not lend its ``min``
(``allow-lent-resource: "false"``). Jobs arrive in waves for as long as faults are injected: each
wave a *hot* child gets a burst that borrows all the spare capacity it is given, with *hogs* (pods
no node accepts, so they hold borrowed quota without running until the load deletes them), while
the other children send pairs of jobs that their ``min`` guarantees, so borrowed quota must be
reclaimed. Two children's
pods ask for CPU only, the other two's for CPU and memory (which no ``min`` names), as the main
load's do. This is the load the observer's ``guarantee-unserved`` and ``guarantee-taken`` judge
(docs/compatibility.md#quota-guarantees).

Hostile input: job kinds with missing or wrong-typed fields, bad scheduling annotations, a request
no quota can hold, QueueUnits with no quota or a missing one, an ~800 KB QueueUnit, thousands of
bare QueueUnits in one namespace, and raw HTTPS bodies at the webhook (oversized, invalid UTF-8,
truncated, deeply nested, random bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import random
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from koord_queue.shared import kube
from koord_queue.shared.api import names

NAMESPACE = "chaos"
BULK_NAMESPACE = "chaos-bulk"
HOSTILE_NAMESPACE = "chaos-hostile"
BORROW_NAMESPACE = "chaos-borrow"
NAMESPACES = (NAMESPACE, BULK_NAMESPACE, HOSTILE_NAMESPACE, BORROW_NAMESPACE)

PARENT = "chaos-parent"
#: name -> (max cpu, parent, wait-for-pods-running + preemption)
QUOTAS: dict[str, tuple[str, str, bool]] = {
    PARENT: ("10", "", False),
    "chaos-a": ("6", PARENT, True),
    "chaos-b": ("6", PARENT, False),
    "chaos-c": ("4", "", False),
}
#: The borrowing tree: an oversubscribed parent (its children's ``max`` add up to 21 CPU).
BORROW_PARENT = "chaos-borrow-parent"
BORROW_PARENT_CPU = "8"


@dataclass(frozen=True)
class BorrowChild:
    """A child of :data:`BORROW_PARENT`: its guaranteed and maximal CPU, whether it lends unused
    ``min`` to its siblings, and whether its pods also ask for memory (which its ``min`` does not
    name)."""

    name: str
    min_cpu: str
    max_cpu: str
    lends: bool
    memory: bool


BORROW_CHILDREN = (
    BorrowChild("chaos-borrow-1", "2", "6", True, False),
    BorrowChild("chaos-borrow-2", "2", "6", True, True),
    BorrowChild("chaos-borrow-3", "1", "5", True, False),
    BorrowChild("chaos-borrow-4", "2", "4", False, True),
)
BULK_QUOTA = "chaos-bulk"
#: The quota of the hostile objects (namespace chaos-hostile); bound to that namespace too.
HOSTILE_QUOTA = "chaos-c"
#: Recovery probes (tiny bare units) are admitted under this quota, in the hostile namespace.
PROBE_QUOTA = "chaos-probe"
#: Admission bursts cut short by an apiserver SIGKILL happen under this quota (hostile namespace).
BURST_QUOTA = "chaos-burst"
#: Never-admissible units (``max: 0``) whose waiting messages an apiserver SIGKILL cuts off.
FULL_QUOTA = "chaos-full"
BULK_QUOTA_CPU = "20"
SECRET_ANNOTATION = "chaos.koord-queue.io/secret"

UNITS = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
QUOTA_RESOURCE = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")
JOBS = kube.Resource("batch", "v1", "jobs", "Job")


def quota(name: str, cpu: str, parent: str, preempt: bool, namespace: str = NAMESPACE) -> dict[str, Any]:
    labels = {names.QUOTA_PARENT_LABEL: parent} if parent else {}
    annotations = (
        {names.WAIT_FOR_PODS_RUNNING_ANNOTATION: "true", names.ENABLE_PREEMPTION_ANNOTATION: "true"}
        if preempt
        else {}
    )
    return {
        "apiVersion": names.QUOTA_API_VERSION,
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {"max": {"cpu": cpu, "memory": "1Ti"}, "min": {"cpu": "0"}},
    }


def container(cpu: str, *, memory: bool = True) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": "64Mi"} if memory else {"cpu": cpu}
    return {"name": "c", "image": "busybox", "resources": {"requests": requests}}


def borrow_quotas() -> list[dict[str, Any]]:
    """The borrowing tree, parent first (the tree rules at the door need the parent's ``min``)."""
    parent = quota(BORROW_PARENT, BORROW_PARENT_CPU, "", False, BORROW_NAMESPACE)
    parent["metadata"]["labels"][names.QUOTA_IS_PARENT_LABEL] = "true"
    parent["spec"]["min"] = {"cpu": BORROW_PARENT_CPU}
    out = [parent]
    for child in BORROW_CHILDREN:
        body = quota(child.name, child.max_cpu, BORROW_PARENT, False, BORROW_NAMESPACE)
        body["spec"]["min"] = {"cpu": child.min_cpu}
        if not child.lends:
            body["metadata"]["labels"][names.QUOTA_ALLOW_LENT_LABEL] = "false"
        out.append(body)
    return out


@dataclass(frozen=True)
class JobPlan:
    name: str
    quota: str
    #: "single", "pair", "low" (preemptible), "victim" (preemptible, never schedulable), "hog"
    #: (borrowing load: never schedulable, deleted by the load after a while)
    shape: str
    priority: int | None
    fallback_label: bool
    backoff_limit: int = 0
    namespace: str = NAMESPACE
    #: CPU of a single pod ("single", "hog"; a "pair" has two pods of 500m)
    cpu: str = "1"
    memory: bool = True


def plan(i: int, rng: random.Random) -> JobPlan:
    """Job ``i`` of the load: a deterministic mix (see the module docstring)."""
    leaf = ("chaos-a", "chaos-b", "chaos-c", "chaos-a", "chaos-b")[i % 5]
    if i % 10 in (0, 3):
        # Most victims keep the Job default retry budget; one in four has none at all.
        return JobPlan(f"victim-{i:04d}", "chaos-a", "victim", 0, False, 0 if i % 20 == 3 else 6)
    if i % 10 == 8:
        return JobPlan(f"low-{i:04d}", "chaos-a", "low", 1, False, 6)
    shape = "pair" if i % 7 == 0 else "single"
    priority = 100 if leaf == "chaos-a" else rng.choice([None, 0, 10, 50])
    return JobPlan(f"job-{i:04d}", leaf, shape, priority, i % 11 == 5)


#: The hot child's burst in every wave of the borrowing load (besides its hogs): (shape, cpu).
BURST = (("single", "1"), ("single", "2"), ("pair", "1"), ("single", "1"))
#: Rounds in which each other child sends two 1-CPU jobs at once during a wave.
TRICKLE = 2


def borrow_wave(w: int, length: float, first: int = 0) -> list[tuple[float, JobPlan]]:
    """Wave ``w`` of the borrowing load, deterministic: ``(seconds after the wave's start, job)``
    in arrival order; jobs are numbered from ``first``.

    Child ``w mod 4`` is hot: within the wave's first 2 s (less in a short wave) it gets as many
    1-CPU hogs as its ``max`` allows (it takes all the spare capacity it is given with pods that
    never run, so the borrowed quota is reclaimable) and :data:`BURST`. Meanwhile every other child
    sends :data:`TRICKLE` pairs of 1-CPU jobs (two at once: the whole ``min`` of most children),
    which its ``min`` guarantees, so the parent is full and the hot child's borrowed quota must
    come back. A hog lives :func:`hog_lifetime`, longer than a wave, so the next hot child finds
    the last one's borrowed quota still taken."""
    out: list[tuple[float, JobPlan]] = []
    n = first

    def make(at: float, child: BorrowChild, shape: str, cpu: str) -> None:
        nonlocal n
        prefix = "hog" if shape == "hog" else "borrow"
        name = f"{prefix}-{n:04d}-{child.name.rsplit('-', 1)[-1]}"
        priority = 0 if shape == "hog" else 10
        out.append(
            (at, JobPlan(name, child.name, shape, priority, False, 0, BORROW_NAMESPACE, cpu, child.memory))
        )
        n += 1

    hot = BORROW_CHILDREN[w % len(BORROW_CHILDREN)]
    burst = [("hog", "1")] * int(hot.max_cpu) + list(BURST)
    spread = min(2.0, length / 8)
    for k, (shape, cpu) in enumerate(burst):
        make(spread * k / len(burst), hot, shape, cpu)
    others = [c for c in BORROW_CHILDREN if c is not hot]
    for j in range(TRICKLE):
        for c, child in enumerate(others):
            at = length * (0.25 + 0.35 * j + 0.1 * c)
            make(at, child, "single", "1")
            make(at + spread / 20, child, "single", "1")
    out.sort(key=lambda item: item[0])
    return out


def borrow_schedule(waves: int, length: float) -> list[tuple[float, JobPlan]]:
    """``waves`` waves of ``length`` seconds (:func:`borrow_wave`), as one schedule."""
    out: list[tuple[float, JobPlan]] = []
    for w in range(waves):
        out += [(w * length + at, p) for at, p in borrow_wave(w, length, first=len(out))]
    return out


def hog_lifetime(length: float) -> float:
    """How long the load lets a hog live: one and a half waves of ``length`` seconds."""
    return 1.5 * length


def job(p: JobPlan, secret: str, namespace: str | None = None) -> dict[str, Any]:
    namespace = p.namespace if namespace is None else namespace
    label = names.QUOTA_NAME_LABEL_FALLBACK if p.fallback_label else names.QUOTA_NAME_LABEL
    annotations = {SECRET_ANNOTATION: secret}
    if p.priority is not None:
        annotations[names.PRIORITY_ANNOTATION] = str(p.priority)
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container(p.cpu, memory=p.memory)]}
    spec: dict[str, Any] = {"backoffLimit": p.backoff_limit, "template": {"spec": pod_spec}}
    if p.shape == "pair":
        pod_spec["containers"] = [container("500m", memory=p.memory)]
        spec["parallelism"] = spec["completions"] = 2
    if p.shape in ("victim", "hog"):
        pod_spec["nodeSelector"] = {"chaos.koord-queue.io/nowhere": "true"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": p.name,
            "namespace": namespace,
            "labels": {label: p.quota},
            "annotations": annotations,
        },
        "spec": spec,
    }


@dataclass
class Load:
    client: kube.Kube
    secret: str
    rng: random.Random = field(default_factory=lambda: random.Random(20261130))
    submitted: dict[str, JobPlan] = field(default_factory=dict)
    refusals: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    #: ``ns/name`` of the jobs the load deleted itself (the borrowing load's hogs)
    deleted: set[str] = field(default_factory=set)

    async def setup(self) -> None:
        for namespace in NAMESPACES:
            with contextlib.suppress(kube.Conflict):
                await self.client.create(kube.NAMESPACES, {"metadata": {"name": namespace}})
        for name, (cpu, parent, preempt) in QUOTAS.items():
            body = quota(name, cpu, parent, preempt)
            if name == HOSTILE_QUOTA:  # charged with the hostile objects of their own namespace
                annotations = body["metadata"]["annotations"]
                annotations[names.QUOTA_NAMESPACES_ANNOTATION] = json.dumps([HOSTILE_NAMESPACE])
            await self.client.create(QUOTA_RESOURCE, body, namespace=NAMESPACE)
        for body in borrow_quotas():
            await self.client.create(QUOTA_RESOURCE, body, namespace=BORROW_NAMESPACE)
        await self.client.create(
            QUOTA_RESOURCE,
            quota(BULK_QUOTA, BULK_QUOTA_CPU, "", False, BULK_NAMESPACE),
            namespace=BULK_NAMESPACE,
        )
        await self.client.create(
            QUOTA_RESOURCE,
            quota(PROBE_QUOTA, "1000", "", False, HOSTILE_NAMESPACE),
            namespace=HOSTILE_NAMESPACE,
        )
        sa = kube.Resource("", "v1", "serviceaccounts", "ServiceAccount")
        for namespace in NAMESPACES:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    await self.client.get(sa, "default", namespace=namespace)
                    break
                except kube.KubeError:
                    await asyncio.sleep(0.3)

    async def create_with_retry(self, obj: dict[str, Any], resource: kube.Resource, namespace: str) -> bool:
        """Create, retrying while the webhook or the apiserver is down (refusals are counted)."""
        delay = 0.2
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                await self.client.create(resource, obj, namespace=namespace)
                return True
            except kube.Conflict as err:
                if err.reason == "AlreadyExists":
                    return True
                self.refusals["conflict"] += 1
            except kube.KubeError as err:
                if err.status == 0:
                    self.refusals["apiserver unreachable"] += 1
                elif "failed calling webhook" in err.message:
                    self.refusals["webhook unreachable (failurePolicy Fail)"] += 1
                else:
                    self.refusals[f"HTTP {err.status}"] += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 3.0)
        return False

    async def submit(self, count: int, seconds: float) -> None:
        """Create ``count`` jobs spread over ``seconds`` (a sustained arrival rate)."""
        interval = seconds / max(count, 1)
        tasks: list[asyncio.Task[bool]] = []
        plans: list[JobPlan] = []
        started = time.monotonic()
        for i in range(count):
            p = plan(i, self.rng)
            self.submitted[p.name] = p
            plans.append(p)
            tasks.append(asyncio.create_task(self.create_with_retry(job(p, self.secret), JOBS, NAMESPACE)))
            await asyncio.sleep(max(0.0, started + (i + 1) * interval - time.monotonic()))
        results = await asyncio.gather(*tasks)
        self.counters["jobs submitted"] = sum(results)
        self.counters["jobs never created"] = len(results) - sum(results)
        for p, ok in zip(plans, results, strict=True):
            if not ok:
                del self.submitted[p.name]

    async def submit_borrowing(
        self, length: float, *, waves: int, until: asyncio.Event | None = None
    ) -> None:
        """The borrowing load: :func:`borrow_wave` after wave, ``length`` seconds each, at least
        ``waves`` of them and more until ``until`` is set (the fault schedule has ended, so the
        guarantees are judged under every fault). Each hog is deleted :func:`hog_lifetime` after
        its creation (a user giving up on a job that never starts), so borrowed quota held by
        pods that never run is returned eventually even when nothing reclaims it."""
        lifetime = hog_lifetime(length)
        started = time.monotonic()
        tasks: list[asyncio.Task[bool]] = []
        plans: list[JobPlan] = []
        w = 0
        while w < waves or (until is not None and not until.is_set()):
            for at, p in borrow_wave(w, length, first=len(plans)):
                await asyncio.sleep(max(0.0, started + w * length + at - time.monotonic()))
                self.submitted[p.name] = p
                plans.append(p)
                tasks.append(asyncio.create_task(self._borrowing_job(p, lifetime)))
            w += 1
            await asyncio.sleep(max(0.0, started + w * length - time.monotonic()))
        self.counters["borrowing waves"] = w
        results = await asyncio.gather(*tasks)
        self.counters["borrowing jobs submitted"] = sum(results)
        for p, ok in zip(plans, results, strict=True):
            if not ok:
                del self.submitted[p.name]

    async def _borrowing_job(self, p: JobPlan, lifetime: float) -> bool:
        if not await self.create_with_retry(job(p, self.secret), JOBS, p.namespace):
            return False
        if p.shape != "hog":
            return True
        await asyncio.sleep(lifetime)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                await self.client.delete(JOBS, p.name, namespace=p.namespace, propagation="Background")
            except kube.NotFound:
                pass
            except kube.KubeError:
                await asyncio.sleep(1.0)  # the apiserver is down or restarting: try again
                continue
            self.deleted.add(f"{p.namespace}/{p.name}")
            self.counters["hogs deleted by the load"] += 1
            break
        return True

    async def bulk_units(self, count: int, *, concurrency: int = 48) -> float:
        """``count`` bare QueueUnits (no job) in one namespace, created as fast as possible."""
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(count):
            queue.put_nowait(i)
        started = time.monotonic()

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                unit = bare_unit(f"bulk-{i:05d}", BULK_QUOTA, "1", self.secret, namespace=BULK_NAMESPACE)
                if await self.create_with_retry(unit, UNITS, BULK_NAMESPACE):
                    self.counters["bulk QueueUnits created"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.monotonic() - started


def bare_unit(
    name: str, quota_name: str | None, cpu: str, secret: str, *, namespace: str, extra_env: int = 0
) -> dict[str, Any]:
    labels = {names.QUOTA_NAME_LABEL: quota_name} if quota_name else {}
    c = container(cpu)
    if extra_env:
        c["env"] = [{"name": f"E{i:05d}", "value": "x" * 150} for i in range(extra_env)]
    return {
        "apiVersion": names.API_VERSION,
        "kind": "QueueUnit",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {SECRET_ANNOTATION: secret},
        },
        "spec": {"podSet": [{"name": "main", "count": 1, "template": {"spec": {"containers": [c]}}}]},
    }


# --- hostile objects through the apiserver ----------------------------------------------------------


def _meta(name: str, secret: str, **annotations: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": HOSTILE_NAMESPACE,
        "labels": {names.QUOTA_NAME_LABEL: "chaos-c"},
        "annotations": {SECRET_ANNOTATION: secret, **annotations},
    }


def hostile_objects(secret: str) -> list[tuple[str, kube.Resource, dict[str, Any]]]:
    """``(case, resource, object)``: each must be refused with a message, or accepted and then get
    a message (an event, or its unit's status) without stopping the reconcile loop."""
    tfjobs = kube.Resource("kubeflow.org", "v1", "tfjobs", "TFJob")
    pytorch = kube.Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
    workflows = kube.Resource("argoproj.io", "v1alpha1", "workflows", "Workflow")
    spark = kube.Resource("sparkoperator.k8s.io", "v1beta2", "sparkapplications", "SparkApplication")
    rayjobs = kube.Resource("ray.io", "v1", "rayjobs", "RayJob")
    tmpl = {"spec": {"containers": [container("1")]}}

    def tf(name: str, specs: object) -> dict[str, Any]:
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": _meta(name, secret),
            "spec": specs,
        }

    def batch(name: str, cpu: str = "1", **annotations: str) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(name, secret, **annotations),
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container(cpu)]}}},
        }

    return [
        (
            "tfjob-containers-not-a-list",
            tfjobs,
            tf(
                "tf-containers",
                {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {"containers": "oops"}}}}},
            ),
        ),
        (
            "tfjob-template-is-a-string",
            tfjobs,
            tf("tf-template", {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": "oops"}}}),
        ),
        (
            "tfjob-negative-replicas",
            tfjobs,
            tf("tf-negative", {"tfReplicaSpecs": {"Worker": {"replicas": -3, "template": tmpl}}}),
        ),
        (
            "tfjob-bad-quantity",
            tfjobs,
            tf(
                "tf-quantity",
                {
                    "tfReplicaSpecs": {
                        "Worker": {"replicas": 1, "template": {"spec": {"containers": [container("lots")]}}}
                    }
                },
            ),
        ),
        ("tfjob-replica-specs-a-list", tfjobs, tf("tf-list", {"tfReplicaSpecs": ["Worker"]})),
        (
            "pytorchjob-no-specs",
            pytorch,
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": _meta("pt-empty", secret),
                "spec": {},
            },
        ),
        (
            "workflow-bad-min-resources",
            workflows,
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "metadata": _meta("wf-min", secret, **{names.MIN_RESOURCES_ANNOTATION: "cpu: [1, 2]"}),
                "spec": {
                    "entrypoint": "main",
                    "templates": [{"name": "main", "container": {"image": "busybox"}}],
                },
            },
        ),
        (
            "workflow-no-templates",
            workflows,
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "metadata": _meta("wf-empty", secret, **{names.MIN_RESOURCES_ANNOTATION: "cpu: 1"}),
                "spec": {"templates": 7},
            },
        ),
        (
            "sparkapp-wrong-types",
            spark,
            {
                "apiVersion": "sparkoperator.k8s.io/v1beta2",
                "kind": "SparkApplication",
                "metadata": _meta("spark-types", secret),
                "spec": {"driver": {"cores": "lots", "memory": []}, "executor": {"instances": "many"}},
            },
        ),
        (
            "rayjob-wrong-types",
            rayjobs,
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayJob",
                "metadata": _meta("ray-types", secret),
                "spec": {"rayClusterSpec": {"headGroupSpec": "x", "workerGroupSpecs": {"a": 1}}},
            },
        ),
        ("job-priority-not-a-number", JOBS, batch("job-priority", **{names.PRIORITY_ANNOTATION: "high"})),
        ("job-max-exec-negative", JOBS, batch("job-max-exec", **{names.MAX_EXEC_TIME_ANNOTATION: "-5"})),
        ("job-request-beyond-any-quota", JOBS, batch("job-huge", cpu="100000")),
        (
            "unit-missing-quota",
            UNITS,
            bare_unit("unit-missing-quota", "no-such-quota", "1", secret, namespace=HOSTILE_NAMESPACE),
        ),
        (
            "unit-no-quota-label",
            UNITS,
            bare_unit("unit-no-label", None, "1", secret, namespace=HOSTILE_NAMESPACE),
        ),
        (
            "unit-huge-request",
            UNITS,
            bare_unit("unit-huge", "chaos-c", "1e15", secret, namespace=HOSTILE_NAMESPACE),
        ),
        (
            "unit-800KB",
            UNITS,
            bare_unit("unit-big", "chaos-c", "100m", secret, namespace=HOSTILE_NAMESPACE, extra_env=4500),
        ),
        (
            "unit-wrong-typed-count",
            UNITS,
            {
                **bare_unit("unit-count", "chaos-c", "1", secret, namespace=HOSTILE_NAMESPACE),
                "spec": {"podSet": [{"name": "main", "count": "two", "template": tmpl}]},
            },
        ),
    ]


@dataclass
class HostileOutcome:
    case: str
    kind: str
    name: str
    created: bool
    message: str


async def submit_hostile(client: kube.Kube, secret: str) -> list[HostileOutcome]:
    outcomes = []
    for case, resource, obj in hostile_objects(secret):
        name = obj["metadata"]["name"]
        try:
            await client.create(resource, obj, namespace=HOSTILE_NAMESPACE)
            outcomes.append(HostileOutcome(case, resource.kind, name, True, ""))
        except kube.KubeError as err:
            outcomes.append(
                HostileOutcome(case, resource.kind, name, False, f"HTTP {err.status}: {err.message}")
            )
    return outcomes


# --- raw bodies at the webhook ----------------------------------------------------------------------


@dataclass
class WebhookFuzz:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)


def _post(port: int, context: ssl.SSLContext, path: str, body: bytes, headers: dict[str, str]) -> int:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=20)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        payload = response.read()
        if response.status == 200:
            answer = json.loads(payload)
            if not isinstance(answer.get("response", {}).get("allowed"), bool):
                return -1
        return response.status
    finally:
        connection.close()


def webhook_bodies(rng: random.Random, count: int, review: dict[str, Any]) -> list[tuple[str, str, bytes]]:
    """``(case, path, body)``: fixed hostile cases plus ``count`` random ones."""
    valid = json.dumps(review, ensure_ascii=False).encode()
    cases: list[tuple[str, str, bytes]] = [
        ("oversized body (8 MiB)", "/mutate", b" " * (8 << 20)),
        (
            "oversized valid review (4 MiB padding)",
            "/validate",
            valid[:-1] + b', "pad": "' + b"x" * (4 << 20) + b'"}',
        ),
        ("invalid UTF-8", "/validate", valid[:40] + b"\xff\xfe\xed\xa0\x80" + valid[40:]),
        ("truncated review", "/mutate", valid[: len(valid) // 2]),
        ("deep nesting", "/mutate", b"[" * 100_000 + b"]" * 100_000),
        ("empty body", "/validate", b""),
        ("null review", "/validate", b"null"),
    ]
    for i in range(count):
        kind = i % 4
        if kind == 0:
            body = rng.randbytes(rng.randint(0, 4096))
        elif kind == 1:
            at = rng.randrange(len(valid))
            body = valid[:at] + rng.randbytes(rng.randint(1, 16)) + valid[at:]
        elif kind == 2:
            body = valid[: rng.randrange(len(valid))]
        else:
            mutated = json.loads(valid)
            mutated["request"]["object"]["spec"] = rng.choice(
                [None, 1, "x", [], {"template": 5}, {"parallelism": "9"}]
            )
            body = json.dumps(mutated).encode()
        cases.append((f"random-{kind}", rng.choice(["/mutate", "/validate"]), body))
    return cases


async def fuzz_webhook(port: int, ca_pem: bytes, review: dict[str, Any], count: int) -> WebhookFuzz:
    """Send hostile bodies to the running webhook over TLS. Allowed answers: 400, 404, 405, 413, or
    200 with a well-formed review; never a 5xx or a dropped connection."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    result = WebhookFuzz()
    for case, path, body in webhook_bodies(random.Random(99), count, review):
        try:
            outcome = str(await asyncio.to_thread(_post, port, context, path, body, {}))
        except (OSError, http.client.HTTPException) as err:
            # The server may answer 413 and close while an oversized body is still being sent.
            outcome = (
                "closed while sending" if case.startswith("oversized") else f"connection failed: {err!r}"
            )
        result.sent += 1
        result.outcomes[outcome] += 1
        if outcome not in ("200", "400", "404", "405", "413", "closed while sending"):
            result.bad.append(f"{case}: {outcome}")
    return result


def review(obj: dict[str, Any], *, operation: str = "CREATE") -> dict[str, Any]:
    """An AdmissionReview v1 request for ``obj`` as the apiserver sends it."""
    group, _, version = str(obj.get("apiVersion", "v1")).rpartition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "chaos-1",
            "kind": {"group": group, "version": version, "kind": obj.get("kind", "")},
            "resource": {"group": group, "version": version, "resource": "jobs"},
            "operation": operation,
            "namespace": obj.get("metadata", {}).get("namespace", ""),
            "userInfo": {"username": "chaos"},
            "object": obj,
            "oldObject": obj if operation == "UPDATE" else None,
        },
    }
