"""Kueue itself as the baseline of the end-to-end admission benchmark, measured in the same run.

Run: ``python bench/bench_kueue.py --jobs 1000 --quotas 10`` (default order ``ours,kueue,kueue,ours``:
interleaved, so a drift in what else the machine runs hits both systems alike). Writes
``bench/results/kueue-vs-ours-[sat<rate>-|full-]<jobs>x<quotas>[-pools<N>][-kqps<qps>].json`` and
prints the ratios. Three kinds of run, each for both systems:

* the default, Kueue-comparable (``--mode comparable``): no controller-manager; the runner finishes
  the Jobs; the quotas allow 100 admissions/s, more than either system admits;
* **saturated** (``--saturate RATE``, comparable mode): every quota gets
  ``round(RATE x --saturate-runtime / quotas)`` slots and the run time is ``slots / RATE``, so the
  quotas admit only RATE jobs/s in all, well below what either system can admit; all jobs are created
  up front as always, so most of them wait in their queue for most of the run. Each job's run time is
  the mean times a seeded uniform factor in [0.5, 1.5] (``--runtime-jitter``; the same job gets the
  same run time in both systems), so that finishes do not come in synchronized waves;
* **full** (``--mode full``): bench_admission's full mode (``ba.make_cluster``: + kube-controller-manager
  with the Job controller, kube-scheduler, kwok nodes; pods created by the Job controller, bound, run
  for the run time by kwok and completed). Kueue does not gate the pods of batch Jobs (ours does:
  our webhook adds a scheduling gate the reconciler removes); it unsuspends the Job and the Job
  controller does the rest. The runner only creates Jobs and watches.

**Ours** is exactly ``bench_admission.run_once`` in Kueue-comparable mode (etcd + kube-apiserver,
our webhook and reconciler). **Kueue** runs on a fresh etcd + kube-apiserver of the same profile with
the same load, with Kueue's manager (``sigs.k8s.io/kueue/cmd/kueue``, built on demand from the Go
module by ``hack/kueue/build.sh``) in place of ours:

* its CRDs from the same module version (``config/components/crd/bases``), with the conversion
  webhook stanza its own kustomization adds to five of them (see below);
* the configuration Kueue ships (``config/components/manager/controller_manager_config.yaml``: client
  QPS 50, burst 100, the per-kind concurrency it sets) with these changes only: the ``batch/job``
  integration alone, leader election off, health, metrics and webhook servers on free loopback ports,
  the webhook certificates in the run's directory. ``--kueue-qps``/``--kueue-burst`` override the
  client limits (``--kueue-qps 500 --kueue-burst 1000`` are our reconciler's defaults), so a run can
  tell the rate limiter apart from the rest of the system; its log level is the binary's default;
* no webhook is registered with the apiserver (no Mutating/ValidatingWebhookConfiguration is
  applied): the benchmark creates each Job already suspended with the ``kueue.x-k8s.io/queue-name``
  and ``kueue.x-k8s.io/priority-class`` labels, which is what Kueue's Job webhook would have made of it.
  The apiserver therefore never calls Kueue, while ours pays one webhook call per Job create (two
  until session 5);
* internal certificate management stays on (Kueue's default). It cannot be turned off here: with
  ``internalCertManagement.enable: false`` the v0.17.0 manager reads the metrics server's certificate
  from the fixed path ``/etc/kueue/metrics/certs`` and exits when it is missing. Left on, it needs the
  ``kueue-system`` namespace, the empty ``kueue-webhook-server-cert`` Secret it fills, and CRDs that
  carry a conversion-webhook ``clientConfig`` for it to inject its CA into (it waits for that
  before it starts). No object is ever stored or asked for in another version than v1beta2, so the
  conversion webhook (behind a Service that does not exist) is never called;
* the ``VisibilityOnDemand`` feature gate off: its aggregated API server would write self-signed
  certificates to ``/visibility`` (or need them there). It serves pending-workload listings only,
  nothing on the admission path.

The load is the same objects per quota: a ResourceFlavor, one ClusterQueue per quota whose
nominal cpu is the ElasticQuota's (``slots x 100m``, no cohort, so no borrowing, as min = max does
for ours) with a LocalQueue in the bench namespace, and WorkloadPriorityClasses ``p10``, ``p50``,
``p100`` for the same priority mix (same seed, so the same job gets the same priority in both
systems). The runner is ``bench_admission.Runner``: the same creates, the same finishing through the
Job's status subresource once the run time has passed after admission and the Job was resumed.
Only the unit it watches differs: Kueue's Workload (admitted = condition ``Admitted`` true, done =
``Finished`` true), found through its owner reference to the Job.

**Compared** (the same definitions for both, computed from the same kinds of raw counts):
admissions/s (overall and sustained, as in bench_admission), kube-apiserver + etcd CPU ms per admitted
job, the controller's CPU ms per admitted job (ours: reconciler + webhook), writes per admitted job
(``apiserver_request_total`` writes, server-side apply included, minus the runner's own creates and
finishes), the controller's peak RSS (``VmHWM``; ours: the reconciler, the webhook reported beside
it), the latency probe. Ratios are ours / Kueue of the means over the runs of each system.
Every figure is per *admitted* job and covers the whole load, waiting included.

Also, in every run:

* **writes per job by kind, less the runner's**: ``apiserver_request_total`` writes by verb and
  resource[/subresource] (``APPLY`` is server-side apply), less the runner's Job creates
  (``POST jobs``) and finishes (``PATCH jobs/status``); the runner deletes nothing. Unit status writes
  (``PATCH queueunits/status``, ``APPLY workloads/status``) and events (``POST``/``PATCH events``) are
  separate kinds. In comparable and saturated runs this is the controller's (plus the apiserver's own
  lease renewals); in full mode it includes the Job controller, the scheduler and kwok.
* **the controller's own writes per job**: ours, the reconciler's requests as bench_admission counts
  them (exact). Kueue's cannot be read from ``apiserver_request_total`` (no user or user-agent label)
  nor from Kueue (its metrics endpoint serves controller-runtime's registry, while client-go's request
  counter hooks are taken by the component-base registry its visibility server imports, so
  ``rest_client_requests_total`` stays empty). In comparable and saturated runs only the runner, Kueue
  and the apiserver's own lease renewals write, so Kueue's are the rest, exactly. In full mode they are
  attributed (``kueue_writes``), a lower bound for events (below): every write in
  the ``kueue.x-k8s.io`` group and to Jobs without subresource (the resume; the Job controller writes
  ``jobs/status``), less the runner's creates, plus the event writes about the load's Jobs and
  Workloads from Kueue's reporting components (``kueue-admission``, ``batch/job-kueue-controller``),
  counted as below. Saturated and full runs count events (``RunConfig.watch_events``); without that
  Kueue's total is not given.
* **slot refill** (meaningful when jobs wait, i.e. saturated runs): for each Job the runner finished,
  from when its finish write returned to the next admission into the same quota seen by the runner's
  watch (unit ``Dequeued`` / Workload ``Admitted``). Per quota, in time order, each finish is paired
  with the earliest later admission no earlier finish took (one admission fills one freed slot);
  finishes with no later admission (nothing left waiting) are counted as unpaired. p50, p99, max and
  count.
* **per unit that waited** (its quota was full when its Job was created): the unit's *status writes
  before admission*, counted from the runner's watch of the units as the versions whose ``status``
  differs from the previous version seen, up to (not including) the admitting version. Each such
  version is one status write that changed something; a no-op write makes no watch event, but costs
  only an apiserver request (the totals by kind above count it). Exact while the watch is never cut
  with 410 Gone (``watch_gone``, recorded). And (saturated and full runs) the *event writes* whose
  involvedObject is the unit or its Job, by kind and reason, mean and max: after the load (after the
  CPU figures are taken) the runner lists every Event in the cluster once and sums their ``count``
  (an Event's create plus one update per repetition: the writes the event recorders made; Events
  live an hour, longer than any run). ``events_coverage`` = those writes / all event writes the
  apiserver counted during the load: 1.0 for ours in comparable runs; below in full mode (the
  scheduler's events are about pods), and about 0.5 for Kueue even in comparable runs (its other
  event writes were not traced to their objects in the time given: its per-unit event counts are a
  lower bound; the totals by kind above are exact). A first
  version counted events from a watch and missed many under load, without error; listing does not.

``--mode full`` and ``--saturate`` are not combined: the slot refill is timed from the runner's finish.

**Node pools** (``--pools N``, comparable mode, with or without ``--saturate``; default 0: the
objects above, unchanged): both systems get N equivalent pools ``pool-0`` ... ``pool-<N-1>`` and
every queue's slots split over them in whole jobs, in pool order (``bench_pools.split``: 20 slots
over 3 pools are 7, 7, 6), the same split for both:

* Kueue: N ResourceFlavors, each with ``nodeLabels`` naming its pool (``koord-queue.io/pool:
  pool-<i>``, and the product label our pool's nodes carry); every ClusterQueue's resource group
  lists the N flavors in order, each with its share of the cpu as ``nominalQuota``. Flavor
  fungibility keeps its defaults: a Workload that does not fit a flavor tries the next one.
* Ours: bench_pools.py's ``fallback`` shape in cpu (docs/pools.md#fallback-between-pools): N
  ElasticQuotaProfiles over one Node object each (``testenv.pools``' node and profile; written
  Ready, nothing runs on them), their root quotas kept by the reconciler (the load starts once every
  root holds its node's cpu); per queue, one quota inside each pool's tree with that pool's share,
  and the queue's own quota outside every tree listing them in pool order in
  ``koord-queue/pool-quotas`` with the whole cpu as its ``max``. Every pool node holds the largest
  pool's share of all queues, so no root limits what its quotas hold (Kueue's flavors have no limit
  of their own). The run is ``bench_admission.run_once`` with its quota set-up, its wait for the
  Queues and its runner swapped for these (``ours_in_pools``).

The probe's queue is split the same way. Each row counts its admissions by pool (ours:
``status.pool``; Kueue: the Workload's admitted flavor), ``admitted_by_pool``; the JSON carries
``pools`` (the count) and ``pool_layout`` (every queue's split). Where the jobs land depends on how
long each system keeps a quota's slots: the first pool fills first, the next ones only when a quota
has more jobs admitted at once than its first pool's share (a saturated run fills them all).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final
from unittest import mock

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_admission as ba
import bench_pools
from bench_admission import NS, ROOT, RunConfig

from koord_queue.shared import kube
from koord_queue.shared.api.quantities import parse_milli
from testenv import pools

KUEUE_VERSION: Final = "v0.17.0"
BUILD_SCRIPT: Final = ROOT / "hack" / "kueue" / "build.sh"
GROUP: Final = "kueue.x-k8s.io"
WORKLOADS: Final = kube.Resource(GROUP, "v1beta2", "workloads", "Workload")
LOCAL_QUEUES: Final = kube.Resource(GROUP, "v1beta2", "localqueues", "LocalQueue")
CLUSTER_QUEUES: Final = kube.Resource(GROUP, "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
FLAVORS: Final = kube.Resource(GROUP, "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)
PRIORITY_CLASSES: Final = kube.Resource(
    GROUP, "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", namespaced=False
)
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
FLAVOR: Final = "default-flavor"
KUEUE_NAMESPACE: Final = "kueue-system"
#: ResourceFlavors a ClusterQueue's resource group may list (its CRD's maxItems): ``--pools`` at most
MAX_POOLS: Final = 64
#: ``--order`` kind: ours with usage history off, the baseline of history's cost
#: (docs/compatibility.md#fair-over-time)
NO_HISTORY: Final = "ours-nohistory"
#: the CRDs Kueue's kustomization gives a conversion webhook, which its cert rotator must find
CONVERSION_CRDS: Final = frozenset(
    {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}
)
#: ``apiserver_request_total`` verbs that write; Kueue writes Workload status by server-side apply
WRITE_VERBS: Final = frozenset({"POST", "PATCH", "PUT", "DELETE", "DELETECOLLECTION", "APPLY"})


def build_kueue(version: str = KUEUE_VERSION) -> pathlib.Path:
    """The cache directory with ``kueue`` and ``crds/``; built on first use (minutes, once)."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), version], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            f"building Kueue failed (exit {result.returncode}): run bash {BUILD_SCRIPT} {version}"
        )
    return pathlib.Path(lines[-1])


def priority_class(priority: int) -> str:
    return f"p{priority}"


class PoolCountingRunner(ba.Runner):
    """bench_admission's runner, also counting the admissions by where they were placed: ours by
    the unit's ``status.pool`` (docs/pools.md#fallback-between-pools), Kueue's by the flavor its
    Workload was admitted to. With ``--pools`` this shows that both systems spread the same load
    over the pools, not that one of them admitted everything through its first route."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admitted_by_pool: Counter[str] = Counter()

    def pool_of(self, obj: kube.Obj) -> str:
        return str((obj.get("status") or {}).get("pool") or "")

    def observe(self, obj: kube.Obj) -> None:
        i = self.index(self.unit_of(obj)[0])
        track = self.tracks[i] if i is not None and i < len(self.tracks) else None
        was_admitted = bool(track.admitted) if track is not None else True
        super().observe(obj)
        if track is not None and not was_admitted and track.admitted:
            self.admitted_by_pool[self.pool_of(obj) or "-"] += 1

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["admitted_by_pool"] = dict(sorted(self.admitted_by_pool.items()))
        return out


class KueueRunner(PoolCountingRunner):
    """The benchmark's runner, watching Kueue's Workloads and creating Jobs labelled for Kueue."""

    units = WORKLOADS

    def pool_of(self, obj: kube.Obj) -> str:
        """The flavor(s) of the Workload's admission (one here: the Jobs ask for cpu only)."""
        admission = (obj.get("status") or {}).get("admission") or {}
        flavors = {
            str(f)
            for assignment in admission.get("podSetAssignments") or []
            for f in (assignment.get("flavors") or {}).values()
        }
        return ",".join(sorted(flavors))

    def unit_of(self, obj: kube.Obj) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        owner: dict[str, Any] = next(
            (r for r in meta.get("ownerReferences") or [] if r.get("kind") == "Job"), {}
        )
        state = {c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []}
        phase = "Succeed" if state.get("Finished") == "True" else ""
        if not phase and state.get("Admitted") == "True":
            phase = "Dequeued"
        return str(owner.get("name", "")), phase

    def make_job(self, name: str, quota: str, priority: int) -> kube.Obj:
        body = ba.job_body(name, quota, priority)
        body["metadata"]["labels"] = {QUEUE_LABEL: quota, PRIORITY_LABEL: priority_class(priority)}
        body["metadata"].pop("annotations", None)
        body["spec"]["suspend"] = True  # what Kueue's (unregistered) Job webhook would have set
        return body


# --- Kueue's control plane objects -----------------------------------------------------------------


def install_crds(cluster: Any, crd_dir: pathlib.Path) -> None:
    names: list[str] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERSION_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {
                            "namespace": KUEUE_NAMESPACE,
                            "name": "kueue-webhook-service",
                            "path": "/convert",
                        }
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        cluster.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, timeout=60.0)
        names.append(crd["metadata"]["name"])
    cluster.wait_for_crds(names)
    cluster.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
    )
    cluster.request(
        "POST",
        f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kueue-webhook-server-cert"}},
    )


def kueue_config(
    shipped: pathlib.Path, workdir: pathlib.Path, ports: dict[str, int], qps: float, burst: int
) -> Any:
    """Kueue's shipped configuration with only the changes the module doc lists."""
    cfg = yaml.safe_load(shipped.read_text())
    cfg["health"] = {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"}
    cfg["metrics"] = {"bindAddress": f"127.0.0.1:{ports['metrics']}"}
    cfg["webhook"] = {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(workdir / "kueue-certs")}
    cfg["leaderElection"] = {"leaderElect": False}
    cfg["integrations"] = {"frameworks": ["batch/job"]}
    cfg["clientConnection"] = {"qps": qps, "burst": burst}
    return cfg


def start_kueue(cluster: Any, build: pathlib.Path, workdir: pathlib.Path, qps: float, burst: int) -> Any:
    from testenv.processes import free_port, spawn, wait_until

    ports = {"health": free_port(), "metrics": free_port(), "webhook": free_port()}
    cfg = kueue_config(build / "controller_manager_config.yaml", workdir, ports, qps, burst)
    config_path = workdir / "kueue-config.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    log = workdir / "logs" / "kueue.log"
    argv = [str(build / "kueue"), f"--config={config_path}", "--feature-gates=VisibilityOnDemand=false"]
    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    component = spawn("kueue", argv, log, env=env, cwd=workdir, ports=ports)

    certs = workdir / "kueue-certs"

    def mount_certs() -> bool:
        """Do the kubelet's part: Kueue's cert rotator fills the Secret and then waits for its files
        in ``webhook.certDir``, where a pod would have the Secret mounted."""
        path = f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets/kueue-webhook-server-cert"
        data = json.loads(cluster.request("GET", path)).get("data") or {}
        if "tls.crt" not in data or "tls.key" not in data:
            return False
        certs.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            (certs / key).write_bytes(base64.b64decode(value))
        return True

    def ready() -> bool:
        if not (certs / "tls.crt").is_file() and not mount_certs():
            return False
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['health']}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)

    try:
        wait_until(ready, timeout=120, what="kueue /readyz", process=component)
    except BaseException:
        component.stop()
        print(f"--- kueue ---\n{component.tail(60)}")
        raise
    return component


def queue_slots(cfg: RunConfig) -> list[tuple[str, int]]:
    """Every queue of a run with its slots: the load's quotas, then the probe's (as
    ``bench_admission.setup_quotas`` makes them for ours)."""
    quotas = [(ba.quota_name(q), slots) for q, slots in enumerate(cfg.slots)]
    if cfg.probe_jobs:
        quotas.append((ba.PROBE_QUOTA, cfg.probe_jobs))
    return quotas


def flavor_objects(pool_count: int) -> list[kube.Obj]:
    """Without pools the one ResourceFlavor; with ``pool_count`` pools one per pool, whose
    ``nodeLabels`` are the labels our pool's ElasticQuotaProfile selects its nodes by."""
    head = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor"}
    if not pool_count:
        return [{**head, "metadata": {"name": FLAVOR}}]
    return [
        {**head, "metadata": {"name": p.name}, "spec": {"nodeLabels": p.match_labels}}
        for p in pool_list(pool_count)
    ]


def cluster_queue(name: str, slots: int, pool_count: int) -> kube.Obj:
    """A ClusterQueue with the ElasticQuota's cpu: in one flavor, or split over the pools' flavors
    in pool order (:func:`pool_slots`, as ours splits it over the pool quotas), tried in that order
    (flavor fungibility's defaults; no cohort, so nothing is borrowed)."""
    if pool_count:
        flavors = [
            {
                "name": p.name,
                "resources": [{"name": "cpu", "nominalQuota": f"{share * ba.CPU_PER_JOB_MILLI}m"}],
            }
            for p, share in zip(pool_list(pool_count), pool_slots(slots, pool_count), strict=True)
        ]
    else:
        quota = {"name": "cpu", "nominalQuota": f"{slots * ba.CPU_PER_JOB_MILLI}m"}
        flavors = [{"name": FLAVOR, "resources": [quota]}]
    spec = {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": flavors}]}
    return {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


async def setup_queues(client: kube.Kube, cfg: RunConfig, pool_count: int = 0) -> None:
    """A ClusterQueue + LocalQueue per quota with the ElasticQuota's cpu, and the priority classes."""
    await ba.create_namespace(client, NS)
    for flavor in flavor_objects(pool_count):
        await client.create(FLAVORS, flavor)
    for prio, _ in ba.PRIORITIES:
        await client.create(
            PRIORITY_CLASSES,
            {
                "apiVersion": f"{GROUP}/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority_class(prio)},
                "value": prio,
            },
        )
    for name, slots in queue_slots(cfg):
        await client.create(CLUSTER_QUEUES, cluster_queue(name, slots, pool_count))
        lq = {
            "apiVersion": f"{GROUP}/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": name},
        }
        await client.create(LOCAL_QUEUES, lq, namespace=NS)


async def wait_active(client: kube.Kube, count: int, timeout: float = 60.0) -> None:
    """Until every LocalQueue (hence its ClusterQueue) reports Active: Kueue admits nothing before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items, _ = await client.list(LOCAL_QUEUES, namespace=NS)
        active = sum(
            1
            for i in items
            if any(
                c.get("type") == "Active" and c.get("status") == "True"
                for c in (i.get("status") or {}).get("conditions") or []
            )
        )
        if active >= count:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"Kueue's LocalQueues not Active within {timeout}s")


async def settle_writes(cluster: Any, timeout: float = 15.0, quiet: float = 1.5) -> bool:
    """Wait (bounded) until the apiserver has counted no write for ``quiet`` seconds; False if the
    deadline came first."""
    return await ba.until_quiet(
        lambda: writes_of(ba.diff(ba.scrape_apiserver(cluster), Counter())), timeout, quiet, interval=0.5
    )


def writes_of(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.split("|", 1)[0] in WRITE_VERBS)


# --- N node pools (--pools) -----------------------------------------------------------------------

NODES: Final = kube.Resource("", "v1", "nodes", "Node", namespaced=False)
PROFILES: Final = kube.Resource(
    "quota.koordinator.sh", "v1alpha1", pools.PROFILE_PLURAL, "ElasticQuotaProfile"
)
#: GPUs of a pool's node: the jobs ask for cpu only; a root quota holding them says it is kept
POOL_NODE_GPUS: Final = 8


def pool_list(pool_count: int) -> list[pools.Pool]:
    """The pools ``pool-0`` ... ``pool-<N-1>``, one Node object each (no kwok: nothing runs)."""
    return [pools.Pool(f"pool-{i}", 1, POOL_NODE_GPUS) for i in range(pool_count)]


def pool_slots(slots: int, pool_count: int) -> list[int]:
    """A quota's slots split over the pools in whole jobs, the first pools taking the remainder:
    ``1/N`` of its cpu each where that is a whole number of jobs, and the same total either way."""
    return list(bench_pools.split(slots, pool_count))


def our_pool_quotas(cfg: RunConfig, pool_count: int) -> list[kube.Obj]:
    """bench_pools.py's ``fallback`` shape in cpu: per queue, one quota inside each pool's tree with
    the pool's share of its cpu, then the queue's own quota outside every tree listing them in pool
    order (``koord-queue/pool-quotas``) with the whole cpu as its ``max`` (the cap across pools)."""
    out: list[kube.Obj] = []
    made = pool_list(pool_count)
    for name, slots in queue_slots(cfg):
        routes = tuple(f"{name}-{p.name}" for p in made)
        for route, pool, share in zip(routes, made, pool_slots(slots, pool_count), strict=True):
            out.append(cpu_quota(bench_pools.quota(route, 0, parent=pool.root_quota), share))
        out.append(cpu_quota(bench_pools.quota(name, 0, routes=routes), slots))
    return out


def cpu_quota(body: kube.Obj, slots: int) -> kube.Obj:
    """bench_pools' quota (its name, parent and routes) holding ``slots`` jobs' cpu, not GPUs."""
    cpu = {"cpu": f"{slots * ba.CPU_PER_JOB_MILLI}m"}
    return {**body, "spec": {"min": cpu, "max": cpu}}


def pool_node_cpu(cfg: RunConfig, pool_count: int) -> str:
    """Every pool node's cpu: the largest pool's share of all queues, in whole cores, so that no
    pool's root limits what its quotas hold (Kueue's flavors have no limit of their own)."""
    shares = [pool_slots(slots, pool_count) for _, slots in queue_slots(cfg)]
    largest = max(sum(s[i] for s in shares) for i in range(pool_count))
    return str(max(1, math.ceil(largest * ba.CPU_PER_JOB_MILLI / 1000)))


async def setup_pools(client: kube.Kube, cfg: RunConfig, pool_count: int) -> None:
    """Ours with pools, in place of ``bench_admission.setup_quotas``: the pools' Node objects
    (written Ready, as ``testenv.pools.create`` does without kwok) and ElasticQuotaProfiles, and
    the quotas of :func:`our_pool_quotas`. The root quotas come from the reconciler."""
    await ba.create_namespace(client, NS)
    await ba.create_namespace(client, pools.NAMESPACE)
    cpu = pool_node_cpu(cfg, pool_count)
    for pool in pool_list(pool_count):
        body = pools.node(pool, 0, cpu=cpu, memory="256Gi")
        await client.create(NODES, body)
        ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
        status = {**body["status"], "conditions": ready}
        await client.patch(NODES, pool.node_name(0), {"status": status}, subresource="status")
        await client.create(PROFILES, pools.profile(pool), namespace=pools.NAMESPACE)
    for quota in our_pool_quotas(cfg, pool_count):
        await client.create(ba.QUOTAS, quota, namespace=NS)


async def wait_pool_roots(client: kube.Kube, cfg: RunConfig, pool_count: int, timeout: float) -> None:
    """Until the reconciler keeps every pool's root quota with its node's cpu (the load must not
    start against a tree without its root)."""
    want = parse_milli(pool_node_cpu(cfg, pool_count))
    roots = {p.root_quota for p in pool_list(pool_count)}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items, _ = await client.list(ba.QUOTAS, namespace=pools.NAMESPACE)
        kept = {
            str(i["metadata"]["name"])
            for i in items
            if parse_milli(((i.get("spec") or {}).get("min") or {}).get("cpu", "0")) == want
        }
        if roots <= kept:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"root quotas {sorted(roots)} not kept with {want}m cpu within {timeout}s")


@contextlib.contextmanager
def ours_in_pools(pool_count: int) -> Iterator[None]:
    """``bench_admission.run_once`` as measured without pools, with the pools' set-up: its quota
    set-up replaced by :func:`setup_pools`, its wait for the Queues followed by
    :func:`wait_pool_roots`, its runner counting admissions by pool. ``run_once`` takes no hook
    for these, so the three module attributes are swapped for the run and restored whatever
    happens; everything else (processes, probe, counters, figures) stays its code."""
    wait_queues = ba.wait_queues

    async def setup(client: kube.Kube, cfg: RunConfig) -> None:
        await setup_pools(client, cfg, pool_count)

    async def wait(client: kube.Kube, cfg: RunConfig, timeout: float = 60.0) -> None:
        await wait_queues(client, cfg, timeout)
        await wait_pool_roots(client, cfg, pool_count, timeout)

    with (
        mock.patch.object(ba, "setup_quotas", setup),
        mock.patch.object(ba, "wait_queues", wait),
        mock.patch.object(ba, "Runner", PoolCountingRunner),
    ):
        yield


def pool_layout(cfg: RunConfig, pool_count: int) -> dict[str, Any]:
    """The pools of a run, for the JSON: both systems use this split (flavors' nominal quotas,
    pool quotas' cpu)."""
    made = pool_list(pool_count)
    return {
        "count": pool_count,
        "names": [p.name for p in made],
        "node_labels": [p.match_labels for p in made],
        "slots_by_queue": {name: pool_slots(slots, pool_count) for name, slots in queue_slots(cfg)},
        "pool_node_cpu": pool_node_cpu(cfg, pool_count),
    }


# --- one Kueue run ---------------------------------------------------------------------------------


def run_kueue_once(
    cfg: RunConfig, build: pathlib.Path, qps: float, burst: int, pool_count: int = 0
) -> dict[str, Any]:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"kq-bench-kueue-{cfg.tag}-"))
    (workdir / "logs").mkdir(parents=True)
    cluster, nodes = ba.make_cluster(cfg, workdir)
    total_slots = sum(cfg.slots)
    print(
        f"== kueue {KUEUE_VERSION} (qps {qps}, burst {burst}), {cfg.mode}: {cfg.jobs} jobs over"
        f" {cfg.quotas} quotas, {total_slots} slots, runtime {cfg.runtime}s"
        f" (quota bound {total_slots / cfg.runtime:.1f}/s)"
        + (f", {nodes} kwok nodes" if nodes else "")
        + (f", {pool_count} pools (flavors)" if pool_count else ""),
        flush=True,
    )
    started = time.monotonic()
    cluster.start()
    manager = None
    try:
        install_crds(cluster, build / "crds")
        manager = start_kueue(cluster, build, workdir, qps, burst)
        result: dict[str, Any] = {
            "system": "kueue",
            "kueue": {"version": KUEUE_VERSION, "build": str(build), "qps": qps, "burst": burst},
            "config": {
                **{k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("keep_logs",)},
                "runtime_s": cfg.runtime,
                "slots_total": total_slots,
                "quota_bound_rate": round(total_slots / cfg.runtime, 2),
                "kwok_nodes": nodes,
                "pools": pool_count,
            },
            "machine": ba.machine(),
            "versions": ba.versions(cluster),
            "start_s": round(time.monotonic() - started, 1),
        }
        print(f"  control plane and Kueue up in {result['start_s']}s", flush=True)

        async def load() -> dict[str, Any]:
            client = await ba.runner_client(cluster)
            try:
                await setup_queues(client, cfg, pool_count)
                await wait_active(client, cfg.quotas + (1 if cfg.probe_jobs else 0))
                settled = await settle_writes(cluster, timeout=ba.setup_settle_seconds(cfg.quotas), quiet=1.0)
                idle = await ba.idle_cpu([*cluster.components, manager], cfg.idle_s)
                probe: dict[str, Any] = {}
                if cfg.probe_jobs:
                    probe = await ba.run_probe(cfg, client, KueueRunner)
                    f = probe["latency_fit"]
                    print(f"  probe: create->Admitted p50 {f['p50_s']}s p99 {f['p99_s']}s", flush=True)
                    await settle_writes(cluster, timeout=10, quiet=1.0)
                procs = [*cluster.components, manager]
                api0 = await asyncio.to_thread(ba.scrape_apiserver, cluster)
                cpu0 = ba.component_cpu(procs)
                self_cpu0 = time.process_time()
                machine0 = ba.machine_cpu()
                load0 = ba.loadavg()
                requests0 = Counter(client.requests)
                runner = KueueRunner(cfg, client)
                wall0 = time.monotonic()
                await runner.run(time.monotonic() + cfg.deadline_s)
                load_s = time.monotonic() - wall0
                cpu_load = ba.component_cpu(procs)
                self_cpu_load = time.process_time() - self_cpu0
                machine1 = ba.machine_cpu()
                if cfg.watch_events:
                    await runner.count_events()
                await settle_writes(cluster)
                api1 = await asyncio.to_thread(ba.scrape_apiserver, cluster)
                summary = runner.summary()
                summary["load_seconds"] = round(load_s, 3)
                during = {k: round(cpu_load[k] - cpu0.get(k, 0.0), 2) for k in cpu_load}
                during["bench-runner"] = round(self_cpu_load, 2)
                summary["cpu_s_during_load"] = during
                busy = machine1["busy"] - machine0["busy"]
                summary["machine_during_load"] = {
                    "loadavg_before": load0,
                    "loadavg_after": ba.loadavg(),
                    "busy_cores": round(busy / load_s, 2),
                    "our_cores": round(sum(during.values()) / load_s, 2),
                    "other_cores": round(max(0.0, busy - sum(during.values())) / load_s, 2),
                    "steal_cores": round((machine1["steal"] - machine0["steal"]) / load_s, 2),
                }
                summary["controller_rss_mib"] = {
                    k: round(v, 1) for k, v in ba.proc_mem_mib(manager.process.pid).items()
                }
                summary["peak_rss_mib"] = ba.peak_rss(procs)
                summary["apiserver_requests"] = ba.diff(api1, api0)
                summary["runner_requests"] = dict(client.requests - requests0)
                summary["probe"] = probe
                summary["idle_cpu_cores"] = idle
                summary["idle_after_quiet_setup"] = settled  # False: the idle figures include set-up
                return summary
            finally:
                await client.close()

        result["run"] = asyncio.run(load())
        log_text = manager.log.read_text(errors="replace")
        errors = [line for line in log_text.splitlines() if '"level":"error"' in line]
        result["kueue_log"] = {
            "lines": log_text.count("\n"),
            "errors": len(errors),
            # expected: the rotator finds no webhook configurations to inject into (none is applied)
            # and no ProvisioningRequest API; anything else is worth a look
            "error_messages": sorted(
                {json.loads(line).get("msg", "") for line in errors if line.startswith("{")}
            ),
        }
        result["kueue_log_tail"] = manager.tail(5)
        return result
    except BaseException:
        print(cluster.logs())
        if manager is not None:
            print(f"--- kueue ---\n{manager.tail(60)}")
        raise
    finally:
        if manager is not None:
            manager.stop(timeout=30)
        cluster.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


# --- the comparison --------------------------------------------------------------------------------


def by_kind_group(api: dict[str, float]) -> Counter[tuple[str, str, str]]:
    """Writes the apiserver counted, by (verb, group, resource[/subresource])."""
    out: Counter[tuple[str, str, str]] = Counter()
    for key, value in api.items():
        verb, group, resource, sub, _code = key.split("|")
        if verb in WRITE_VERBS:
            out[(verb, group, f"{resource}{'/' + sub if sub else ''}")] += value
    return out


def kueue_writes(run: dict[str, Any], writes: Counter[tuple[str, str, str]]) -> Counter[str]:
    """Kueue's own writes, by kind (see the module doc): ``apiserver_request_total`` has no user or
    user-agent label, and Kueue's client-go request counter is not served (its metrics endpoint
    serves controller-runtime's registry, while the client-go hooks are taken by the
    component-base registry its visibility server imports), so they are attributed by what only
    Kueue writes: every write in its API group and to the Job itself (``jobs`` without subresource:
    the resume; the Job controller writes ``jobs/status``), plus the event writes about the load's
    Jobs and Workloads from Kueue's reporting components (``kueue-admission``,
    ``batch/job-kueue-controller``; ``Runner.count_events``); the runner's own Job creates are
    taken off."""
    out: Counter[str] = Counter()
    for (verb, group, resource), value in writes.items():
        if group == GROUP or (group == "batch" and resource == "jobs"):
            out[f"{verb} {resource}"] += value
    sources: dict[str, float] = (run.get("waiting_units") or {}).get("event_writes_by_source") or {}
    for key, value in sources.items():
        if key.startswith("kueue") or key.startswith("batch/job-kueue"):
            out["events"] += value
    out["POST jobs"] -= run["runner_requests"].get("POST", 0)  # the runner's creates
    return +out


def common_figures(result: dict[str, Any]) -> dict[str, Any]:
    """The figures compared, by one definition for both systems (see the module doc)."""
    run = result["run"]
    ours = result.get("system") != "kueue"
    admitted = run["admitted"] or 1
    api = run["apiserver_requests"]
    runner_writes = sum(v for k, v in run["runner_requests"].items() if k in WRITE_VERBS)
    by_kind: Counter[str] = Counter()
    conflicts = 0.0
    for key, value in api.items():
        verb, _group, resource, sub, code = key.split("|")
        if verb in WRITE_VERBS:
            by_kind[f"{verb} {resource}{'/' + sub if sub else ''}"] += value
            if code == "409":
                conflicts += value
    cpu: dict[str, float] = run["cpu_s_during_load"]
    controller = ("reconciler", "webhook") if ours else ("kueue",)
    rss = (run.get("reconciler_rss_mib") if ours else run.get("controller_rss_mib")) or {}
    total_ms = sum(cpu.values()) * 1e3 / admitted
    idle: dict[str, float] = run.get("idle_cpu_cores") or {}
    runner: dict[str, float] = run["runner_requests"]
    # the cluster's writes less the runner's: its creates are POST jobs, its finishes PATCH jobs/status
    less_runner = Counter(by_kind)
    less_runner["POST jobs"] -= runner.get("POST", 0)
    less_runner["PATCH jobs/status"] -= runner.get("PATCH", 0)
    if ours:
        own = run.get("reconciler_requests") or {}
        own_writes = ba.writes_of(own)
        own_by_kind: Counter[str] = Counter()
        for key, value in own.items():
            verb, resource, sub = key.split("|")
            if verb in ba.WRITE_VERBS:
                own_by_kind[f"{verb} {resource}{'/' + sub if sub else ''}"] += value
    elif result["config"].get("mode", "comparable") == "comparable":
        # only the runner, Kueue and the apiserver (its lease) write: the rest is Kueue's, exactly
        own_by_kind = Counter({k: v for k, v in less_runner.items() if v > 0 and "leases" not in k})
        own_writes = sum(own_by_kind.values())
    else:
        own_by_kind = kueue_writes(run, by_kind_group(api))
        # without the events counted Kueue's event writes cannot be told from others': no total
        own_writes = sum(own_by_kind.values()) if result["config"].get("watch_events") else None
    event_writes_api = sum(v for (_verb, _group, res), v in by_kind_group(api).items() if res == "events")
    sources: dict[str, float] = (run.get("waiting_units") or {}).get("event_writes_by_source") or {}
    refill: dict[str, Any] = run.get("slot_refill") or {}
    waited: dict[str, Any] = (run.get("waiting_units") or {}).get("waited") or {}
    waited_writes = waited.get("status_writes_before_admission") or {}
    # events are counted only when the runner watched them (saturated runs)
    watched = (run.get("waiting_units") or {}).get("events_watched")
    waited_events = (waited.get("events") or {}) if watched else {}

    def net_ms(names: tuple[str, ...]) -> float | None:
        """CPU ms per job less what these processes burn idle over the load's duration."""
        if not idle:
            return None
        load_s = float(run["load_seconds"])
        busy = sum(cpu.get(n, 0.0) - idle.get(n, 0.0) * load_s for n in names)
        return round(busy * 1e3 / admitted, 2)

    out: dict[str, Any] = {
        "system": result.get("system") or ("ours" if ours else "kueue"),
        "mode": result["config"].get("mode", "comparable"),
        "quota_bound_rate": result["config"].get("quota_bound_rate"),
        "admitted": run["admitted"],
        "all_admitted_s": run.get("all_admitted_s"),
        "overall_rate": run.get("overall_rate"),
        "sustained_rate": run.get("sustained_rate"),
        "probe_p50_s": (run.get("probe") or {}).get("latency_fit", {}).get("p50_s"),
        "probe_p99_s": (run.get("probe") or {}).get("latency_fit", {}).get("p99_s"),
        "fit_p50_s": run["latency_fit"]["p50_s"],
        "fit_p99_s": run["latency_fit"]["p99_s"],
        "apiserver_etcd_cpu_ms_per_job": round(
            (cpu.get("kube-apiserver", 0.0) + cpu.get("etcd", 0.0)) * 1e3 / admitted, 2
        ),
        "controller_cpu_ms_per_job": round(sum(cpu.get(c, 0.0) for c in controller) * 1e3 / admitted, 2),
        "apiserver_etcd_net_cpu_ms_per_job": net_ms(("kube-apiserver", "etcd")),
        "controller_net_cpu_ms_per_job": net_ms(controller),
        "idle_cpu_cores": idle,
        # False: the set-up had not gone quiet, so the idle figures (and the net ones) hold some of it
        "idle_after_quiet_setup": run.get("idle_after_quiet_setup"),
        "cpu_ms_per_job": {k: round(v * 1e3 / admitted, 2) for k, v in cpu.items()},
        "cpu_bound_rate_estimate": round((result["machine"]["nproc"] or 1) * 1e3 / total_ms, 1)
        if total_ms
        else None,
        "writes_per_job": round((writes_of(api) - runner_writes) / admitted, 2),
        "write_conflicts_per_job": round(conflicts / admitted, 3),
        "apiserver_writes_per_job_by_kind": {k: round(v / admitted, 3) for k, v in by_kind.most_common()},
        "writes_per_job_by_kind_less_runner": {
            k: round(v / admitted, 3) for k, v in less_runner.most_common() if v > 0
        },
        "controller_writes_per_job": round(own_writes / admitted, 2) if own_writes is not None else None,
        "controller_writes_per_job_by_kind": {
            k: round(v / admitted, 3) for k, v in own_by_kind.most_common()
        },
        "slot_refill_count": refill.get("count"),
        "slot_refill_unpaired": refill.get("finishes_unpaired"),
        "slot_refill_p50_s": refill.get("p50_s"),
        "slot_refill_p99_s": refill.get("p99_s"),
        "slot_refill_max_s": refill.get("max_s"),
        "waited_units": waited.get("units"),
        "waited_status_writes_mean": waited_writes.get("mean"),
        "waited_status_writes_max": waited_writes.get("max"),
        "waited_status_writes_histogram": waited_writes.get("histogram"),
        "waited_events_mean": waited_events.get("mean"),
        "waited_events_max": waited_events.get("max"),
        "waited_events_by_reason": waited_events.get("mean_by_reason"),
        "watch_gone": run.get("watch_gone"),
        # event writes about the load's jobs and units / all those the apiserver counted
        "events_coverage": round(sum(sources.values()) / event_writes_api, 3)
        if sources and event_writes_api
        else None,
        "controller_peak_rss_mib": rss.get("VmHWM"),
        "apiserver_peak_rss_mib": (run.get("peak_rss_mib") or {}).get("kube-apiserver"),
        "other_cores": run["machine_during_load"]["other_cores"],
        "load_seconds": run["load_seconds"],
        "pools": result.get("pools", 0),
        # where the jobs were admitted: ours by status.pool, Kueue's by flavor (PoolCountingRunner)
        "admitted_by_pool": run.get("admitted_by_pool"),
    }
    if ours:
        out["webhook_cpu_ms_per_job"] = out["cpu_ms_per_job"].get("webhook")
        out["webhook_peak_rss_mib"] = (run.get("webhook_rss_mib") or {}).get("VmHWM")
    return out


RATIO_KEYS: Final = (
    "overall_rate",
    "sustained_rate",
    "apiserver_etcd_cpu_ms_per_job",
    "controller_cpu_ms_per_job",
    "apiserver_etcd_net_cpu_ms_per_job",
    "controller_net_cpu_ms_per_job",
    "writes_per_job",
    "controller_writes_per_job",
    "controller_peak_rss_mib",
    "probe_p50_s",
    "slot_refill_p50_s",
    "slot_refill_p99_s",
    "slot_refill_max_s",
    "waited_status_writes_mean",
    "waited_events_mean",
)


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def ratios(rows: list[dict[str, Any]], baseline: str = "kueue") -> dict[str, Any]:
    """ours / ``baseline`` (Kueue, or ours with usage history off) of each figure's mean over the
    runs of each."""
    out: dict[str, Any] = {}
    for key in RATIO_KEYS:
        ours = mean([r[key] for r in rows if r["system"] == "ours" and r.get(key) is not None])
        theirs = mean([r[key] for r in rows if r["system"] == baseline and r.get(key) is not None])
        out[key] = {
            "ours": ours,
            baseline: theirs,
            f"ours_over_{baseline}": round(ours / theirs, 3) if ours is not None and theirs else None,
        }
    return out


def print_row(row: dict[str, Any]) -> None:
    print(
        f"  {row['system']:>14}: all admitted {row['all_admitted_s']}s, overall {row['overall_rate']}/s,"
        f" sustained {row['sustained_rate']}/s"
        f" | apiserver+etcd {row['apiserver_etcd_cpu_ms_per_job']} ms/job,"
        f" controller {row['controller_cpu_ms_per_job']} ms/job | writes/job {row['writes_per_job']}"
        f" | peak RSS {row['controller_peak_rss_mib']} MiB | probe p50 {row['probe_p50_s']}s"
        f" | other load {row['other_cores']} cores",
        flush=True,
    )
    if row.get("pools"):
        print(f"         {row['pools']} pools: admitted by pool {row['admitted_by_pool']}", flush=True)
    if row.get("idle_after_quiet_setup") is False:
        print("         the set-up was still writing when idle CPU was measured: read the gross CPU figures")
    print(f"         writes/job by kind, less the runner's: {row['writes_per_job_by_kind_less_runner']}")
    print(
        f"         controller's own writes/job {row['controller_writes_per_job']}:"
        f" {row['controller_writes_per_job_by_kind']}",
        flush=True,
    )
    if row["slot_refill_count"]:
        print(
            f"         slot refill (finish written -> next admission in its quota): p50"
            f" {row['slot_refill_p50_s']}s p99 {row['slot_refill_p99_s']}s max {row['slot_refill_max_s']}s"
            f" (n={row['slot_refill_count']}, {row['slot_refill_unpaired']} finishes unpaired)",
            flush=True,
        )
    if row["waited_units"]:
        print(
            f"         per unit that waited (n={row['waited_units']}): status writes before admission"
            f" mean {row['waited_status_writes_mean']} max {row['waited_status_writes_max']}"
            f" {row['waited_status_writes_histogram']}; events mean {row['waited_events_mean']}"
            f" max {row['waited_events_max']} {row['waited_events_by_reason']}"
            f" (events coverage {row['events_coverage']})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--quotas", type=int, default=10)
    parser.add_argument("--order", default="ours,kueue,kueue,ours", help="the runs, in order")
    parser.add_argument(
        "--mode",
        choices=("comparable", "full"),
        default="comparable",
        help="full: + controller-manager, scheduler and kwok nodes (pods run)",
    )
    parser.add_argument(
        "--saturate",
        type=float,
        default=0.0,
        metavar="RATE",
        help="saturated run: the quotas admit only RATE jobs/s in all (comparable mode)",
    )
    parser.add_argument(
        "--saturate-runtime",
        type=float,
        default=10.0,
        help="saturated run: the mean run time (s) the slots are sized for (default %(default)s)",
    )
    parser.add_argument(
        "--runtime-jitter",
        type=float,
        default=None,
        help="run time x uniform [1-j, 1+j] per job (default: 0.5 saturated, else 0)",
    )
    parser.add_argument("--kueue-qps", type=float, default=50.0, help="Kueue's client QPS (shipped: 50)")
    parser.add_argument("--kueue-burst", type=int, default=100, help="Kueue's client burst (shipped: 100)")
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="deadline of each load (s); default derived"
    )
    parser.add_argument("--probe-jobs", type=int, default=40)
    parser.add_argument(
        "--pools",
        type=int,
        default=0,
        metavar="N",
        help="N node pools: N flavors for Kueue, N ElasticQuotaProfiles and fallback quotas for ours",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=10.0, help="idle CPU measured before the load (0: none)"
    )
    args = parser.parse_args()
    order = [s.strip() for s in args.order.split(",") if s.strip()]
    if set(order) - {"ours", "kueue", NO_HISTORY}:
        parser.error(f"--order takes ours, kueue and {NO_HISTORY}")
    if args.saturate and args.mode != "comparable":
        parser.error("--saturate needs --mode comparable: the runner finishes the jobs")
    if args.pools and args.mode != "comparable":
        parser.error("--pools needs --mode comparable: the pools' nodes are API objects, nothing runs")
    if not 0 <= args.pools <= MAX_POOLS:
        parser.error(f"--pools takes 0 to {MAX_POOLS} (Kueue's flavors per resource group)")
    base = RunConfig(
        mode=args.mode,
        jobs=args.jobs,
        quotas=args.quotas,
        probe_jobs=args.probe_jobs,
        idle_s=args.idle_seconds,
        runtime_jitter=args.runtime_jitter or 0.0,
        # full mode: Kueue's own event writes are told apart by counting events (see kueue_writes)
        watch_events=args.mode == "full",
    )
    if args.saturate:
        slots = max(1, round(args.saturate * args.saturate_runtime / args.quotas))
        jitter = 0.5 if args.runtime_jitter is None else args.runtime_jitter
        base = dataclasses.replace(
            base,
            slots_per_quota=slots,
            quota_rate=args.saturate,
            runtime_jitter=jitter,
            watch_events=True,
        )
    # Kueue's shipped client limit may make it slower than ours: give both the same, longer deadline
    derived = 60 + args.jobs / 4 + 2 * base.runtime
    if args.saturate:
        derived = max(derived, 60 + 1.25 * args.jobs / args.saturate + 3 * base.runtime)
    cfg = dataclasses.replace(base, timeout_s=args.timeout or round(derived))
    build_started = time.monotonic()
    build = build_kueue() if "kueue" in order else None
    build_s = round(time.monotonic() - build_started, 1)
    suffix = "" if (args.kueue_qps, args.kueue_burst) == (50.0, 100) else f"-kqps{args.kueue_qps:g}"
    kind = f"sat{args.saturate:g}-" if args.saturate else ("full-" if args.mode == "full" else "")
    pooled = f"-pools{args.pools}" if args.pools else ""
    out_path = ba.RESULTS / f"kueue-vs-ours-{kind}{args.jobs}x{args.quotas}{pooled}{suffix}.json"
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for system in order:
        t0 = time.monotonic()
        if system in ("ours", NO_HISTORY):
            if args.pools:
                print(f"== ours with {args.pools} pools (ElasticQuotaProfiles, fallback quotas)", flush=True)
            run_cfg = cfg
            if system == NO_HISTORY:
                print("== ours with usage history off (--usage-half-life=0s)", flush=True)
                off = (*cfg.reconciler_args, "--usage-half-life=0s")
                run_cfg = dataclasses.replace(cfg, reconciler_args=off)
            with ours_in_pools(args.pools) if args.pools else contextlib.nullcontext():
                result = ba.run_once(run_cfg)
            result["system"] = system
        else:
            assert build is not None
            result = run_kueue_once(cfg, build, args.kueue_qps, args.kueue_burst, args.pools)
        result["pools"] = args.pools
        result["wall_s"] = round(time.monotonic() - t0, 1)
        row = common_figures(result)
        print_row(row)
        rows.append(row)
        with contextlib.suppress(KeyError):
            del result["run"]["timeline"]
        runs.append(result)
        summary = {
            "order": order,
            "mode": args.mode,
            "saturate_rate": args.saturate or None,
            "jobs": args.jobs,
            "quotas": args.quotas,
            "pools": args.pools,
            "pool_layout": pool_layout(cfg, args.pools) if args.pools else None,
            "slots_total": sum(cfg.slots),
            "runtime_s": cfg.runtime,
            "kueue": {
                "version": KUEUE_VERSION,
                "qps": args.kueue_qps,
                "burst": args.kueue_burst,
                "build_s": build_s,
            },
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
            "rows": rows,
            "ratios": ratios(rows),
            "history_cost": ratios(rows, baseline=NO_HISTORY),
            "runs": runs,
        }
        out_path.write_text(json.dumps(summary, indent=1) + "\n")  # after every run: partial results survive
    if args.pools:
        print(f"  ratios ours / kueue with {args.pools} pools:", flush=True)
    for key, value in ratios(rows).items():
        print(f"  {key:>32}: ours {value['ours']} / kueue {value['kueue']} = {value['ours_over_kueue']}")
    if NO_HISTORY in order:
        print("  usage history's cost, ours / ours with history off:", flush=True)
        for key, value in ratios(rows, baseline=NO_HISTORY).items():
            print(f"  {key:>32}: {value['ours']} / {value[NO_HISTORY]} = {value[f'ours_over_{NO_HISTORY}']}")
    print(f"  written to {out_path.relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so each run's control plane and controllers are torn down.
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        main()
