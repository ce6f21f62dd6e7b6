"""``python -m chaos.run [--quick]``: faults, hostile input and an independent invariant observer,
unattended on the local control plane; a table on stdout, the counts in ``chaos/results.json``,
exit status 1 on any violation (2 when the run itself could not be carried out).

The run (see RELIABILITY.md for the table it produces and how to read it):

1. start an e2e control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with three
   8-CPU fake nodes), the webhook and the reconciler (its visibility API with a TLS certificate);
2. the observer follows etcd from now on (:mod:`chaos.observer`);
3. TLS probes of every TLS port; then a sustained load and a borrowing load below an
   oversubscribed parent quota (:mod:`chaos.load`) while faults are
   injected one after the other (:mod:`chaos.faults`), bare QueueUnits pour into one namespace,
   hostile objects and bodies are sent, and a hostile namespace user attacks the queue's hold on
   the load's live jobs (:mod:`chaos.tenant`);
4. the load drains; end-state checks (every job finished, admitted, or waiting with a message; no
   normal job lost; every bad object answered), log and file checks;
5. report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from chaos import load, security, tenant
from chaos.etcd import Etcd
from chaos.faults import FaultRecord, Faults
from chaos.observer import SCHEDULABLE_GRACE_S, USAGE_MISMATCH, Mismatch, Observer, settle
from chaos.views import TERMINAL
from koord_queue.certs import pki
from koord_queue.shared import kube
from testenv import system
from testenv.cluster import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
#: How long a usage mismatch may last at a quiescent point before it is a violation: the job
#: extension writes its usage reports asynchronously (pod events, then a status patch).
ACCOUNTING_WINDOW_S = 12.0
RESULTS = Path(__file__).with_name("results.json")
#: The hypothesis fuzz modules run as part of the report (they are also part of ``make unit``).
FUZZ_MODULES = ("tests/unit/test_fuzz_parsers.py", "tests/unit/test_webhook_fuzz.py")


@dataclass(frozen=True)
class Profile:
    name: str
    jobs: int
    load_seconds: float
    bulk_units: int
    webhook_bodies: int
    reconciler_kills: int
    etcd_pause_s: float
    writer_s: float
    shrink_hold_s: float
    deletions: int
    burst_rounds: int
    park_units: int
    drain_s: float
    gap_s: float
    tenant_rounds: int
    tenant_delay_s: float
    #: waves of the borrowing load (:func:`chaos.load.borrow_wave`) in ``load_seconds`` (their
    #: length); more follow until the fault schedule has ended
    borrow_waves: int


FULL = Profile("full", 240, 220.0, 3000, 400, 4, 6.0, 30.0, 15.0, 3, 4, 300, 240.0, 10.0, 5, 15.0, 8)
QUICK = Profile("quick", 70, 60.0, 1000, 100, 2, 4.0, 8.0, 6.0, 2, 2, 150, 90.0, 1.0, 3, 12.0, 4)
#: kwok nodes of 8 CPU: the main load's quotas fill two, the borrowing tree's parent one more, so
#: quota, not node capacity, is what holds jobs back.
NODES = 3

#: The reconciler's component configuration in the run (``maxUserPriority`` as the tenant phase
#: expects; the webhook gets the same value).
RECONCILER_CONFIG = f"""apiVersion: scheduling.k8s.io/v1
kind: KoordQueueConfiguration
defaultReclaimProtectTime: 0s
quotaNamespaceBinding: true
usageHalfLife: 2m
maxUserPriority: {tenant.CLUSTER_PRIORITY_CAP}
manageJobsWithoutQuotaName: true
managedJobsNamespaceSelector:
  matchLabels: {{{tenant.MANDATORY_LABEL}: "true"}}
"""


# --- the run ----------------------------------------------------------------------------------------


@dataclass
class CheckedFaults(Faults):
    """The fault injectors, with the ``usage-mismatch`` checkpoint after every recovery probe."""

    checkpoint: Any = None

    async def _recovered(self, fault: str, begun: float, ok: bool, detail: str = "") -> FaultRecord:
        record = await super()._recovered(fault, begun, ok, detail)
        if self.checkpoint is not None:
            await self.checkpoint(f"after {fault}")
        return record


class Run:
    def __init__(self, profile: Profile, workdir: Path) -> None:
        self.profile = profile
        self.workdir = workdir
        self.logdir = workdir / "system"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.secret = f"chaos-secret-{secrets.token_hex(8)}"
        self.extra_violations: Counter[str] = Counter()
        self.extra_details: list[dict[str, Any]] = []
        self.inputs: Counter[str] = Counter()
        self.end_checks: Counter[str] = Counter()
        self.notes: list[str] = []
        self._explained_keys: set[str] = set()
        self.started = time.monotonic()
        self._accounting = asyncio.Lock()
        self.accounting_log: list[dict[str, Any]] = []
        #: set when the fault schedule has ended (the borrowing load runs until then)
        self.faults_done = asyncio.Event()

    def violate(self, invariant: str, detail: str) -> None:
        self.extra_violations[invariant] += 1
        if self.extra_violations[invariant] <= 50:
            self.extra_details.append({"invariant": invariant, "detail": detail})
        print(f"  VIOLATION {invariant}: {detail}", flush=True)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    async def fuzz(self) -> dict[str, int]:
        """Run the hypothesis fuzz modules; examples per test (any failure is a violation)."""
        argv = [sys.executable, "-m", "pytest", *FUZZ_MODULES, "-q", "-p", "no:cacheprovider"]
        argv += [f"--basetemp={self.workdir / 'pytest'}", "--hypothesis-show-statistics"]
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await process.communicate()
        text = output.decode(errors="replace")
        counts: dict[str, int] = {}
        test = ""
        for line in text.splitlines():
            if line.startswith("tests/") and line.rstrip().endswith(":") and "::" in line:
                test = line.rstrip()[:-1]
            elif (match := re.search(r"(\d+) passing", line)) and test:
                counts[test] = counts.get(test, 0) + int(match.group(1))
        summary = text.strip().splitlines()[-1] if text.strip() else "no output"
        self.notes.append(f"fuzz modules: {summary}")
        if process.returncode != 0:
            self.violate("fuzz", f"pytest {' '.join(FUZZ_MODULES)} failed: {summary}")
        return counts

    async def execute(self) -> dict[str, Any]:
        p = self.profile
        self.log(f"chaos run ({p.name}) in {self.workdir}")
        fuzzing = asyncio.create_task(self.fuzz(), name="fuzz")
        cluster = LocalCluster(
            profile="e2e", workdir=self.workdir / "cp", nodes=NODES, node_cpu="8", pod_duration_s=3.0
        )
        await asyncio.to_thread(cluster.start)
        self.cluster = cluster
        try:
            await asyncio.to_thread(system.install_crds, cluster)
            self.log(f"control plane up ({cluster.start_seconds:.0f}s)")
            async with aiohttp.ClientSession() as session:
                results = await self._with_cluster(cluster, Etcd(cluster.etcd_url, session))
            counts = await fuzzing
            results["fuzz_examples"] = counts
            for module in FUZZ_MODULES:
                total = sum(n for test, n in counts.items() if test.startswith(module))
                results["inputs_fuzzed"][f"hypothesis examples: {module}"] = total
            if self.extra_violations["fuzz"]:
                results["violations"]["fuzz"] = self.extra_violations["fuzz"]
                details = results["violation_details"]
                details += [d for d in self.extra_details if d["invariant"] == "fuzz" and d not in details]
            results["violations_total"] = sum(results["violations"].values())
            return results
        finally:
            await asyncio.to_thread(cluster.stop)

    async def _with_cluster(self, cluster: LocalCluster, etcd: Etcd) -> dict[str, Any]:
        p = self.profile
        observer = Observer(namespaces=frozenset((*load.NAMESPACES, tenant.NAMESPACE)))
        observing = asyncio.create_task(observer.run(etcd), name="observer")
        client = await kube.Kube.connect(
            kubeconfig=str(cluster.kubeconfig), qps=400, burst=800, user_agent="chaos"
        )
        config = self.logdir / "koord-queue-config.yaml"
        config.write_text(RECONCILER_CONFIG)
        faults = CheckedFaults(
            cluster=cluster,
            logdir=self.logdir,
            etcd=etcd,
            observer=observer,
            client=client,
            reconciler_args=[*self._visibility_tls_args(cluster), f"--config={config}"],
            webhook_args=[f"--max-user-priority={tenant.CLUSTER_PRIORITY_CAP}"],
            mandatory_namespaces={"matchLabels": {tenant.MANDATORY_LABEL: "true"}},
        )
        faults.started = self.started
        self.faults, self.observer, self.observing = faults, observer, observing
        self.etcd = etcd
        faults.checkpoint = self.check_accounting
        mallory: tenant.Tenant | None = None
        try:
            await faults.start_webhook()
            await asyncio.to_thread(system.install_policies, cluster)
            await faults.start_reconciler()
            self.log("webhook, admission policies and reconciler up")
            workload = load.Load(client, self.secret)
            await workload.setup()
            mallory = tenant.Tenant(
                cluster,
                client,
                observer,
                violate=self.violate,
                log=self.log,
                spare=faults.deleted_jobs.__contains__,
            )
            await mallory.setup()
            self.tenant = mallory
            sec = security.Findings()
            await asyncio.to_thread(security.probe_tls, faults.webhook.ports["https"], "webhook", sec)
            await asyncio.to_thread(
                security.probe_tls, faults.reconciler.ports["visibility"], "reconciler visibility API", sec
            )
            self.log(f"TLS probes: {sec.checks} checks, {len(sec.problems)} problems")
            watchdog = asyncio.create_task(self._watchdog(faults), name="watchdog")
            submitting = asyncio.create_task(workload.submit(p.jobs, p.load_seconds), name="load")
            borrowing = asyncio.create_task(
                workload.submit_borrowing(
                    p.load_seconds / p.borrow_waves, waves=p.borrow_waves, until=self.faults_done
                ),
                name="borrowing load",
            )
            attacking = asyncio.create_task(
                mallory.run(rounds=p.tenant_rounds, seconds=p.load_seconds, delay=p.tenant_delay_s),
                name="tenant",
            )
            await self._inject(faults, workload, client)
            await submitting
            await borrowing
            await attacking
            self._tenant_inputs(mallory)
            self.log(f"load submitted: {workload.counters['jobs submitted']} jobs; draining")
            await self._drain(workload)
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            if self.observing.done():
                self.violate("observer-failed", f"the observer stopped: {self.observing.exception()!r}")
            synced = await observer.sync(etcd, timeout=60)
            if synced:
                # Let every pending grace run out, then judge what is left.
                await asyncio.sleep(SCHEDULABLE_GRACE_S + 0.5)
                synced = await observer.sync(etcd, timeout=60)
            if not synced:
                self.violate("observer-sync", "the observer could not catch up with etcd at the end")
            observer.finish()
            await self.check_accounting("end of run")
            await self._end_state(workload, client)
            await mallory.final_checks(self.end_checks)
            observer.dump(self.workdir / "observer-history.jsonl")
            self._security(cluster, faults, sec)
            return self._results(workload, sec)
        finally:
            if mallory is not None:
                await mallory.close()
            for component in [*faults.reconcilers, *faults.webhooks]:
                await asyncio.to_thread(component.stop)
            observing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await observing
            await client.close()

    async def check_accounting(self, label: str) -> None:
        """``usage-mismatch`` at a quiescent point: what persists for :data:`ACCOUNTING_WINDOW_S`
        (re-read from etcd at every poll) is a violation, what goes away is counted as tolerated."""
        observer = self.observer

        async def current() -> list[Mismatch]:
            await observer.sync(self.etcd, timeout=10)
            return observer.accounting_mismatches()

        async with self._accounting:
            observer.checks["usage charged = held: checkpoints"] += 1
            settled = await settle(current, window=ACCOUNTING_WINDOW_S)
            if settled.transient:
                observer.stats["usage mismatches gone within the window (tolerated)"] += settled.transient
            for mismatch in settled.persisted:
                observer.violate(
                    USAGE_MISMATCH, observer.revision, f"{label}: [{mismatch.rule}] {mismatch.detail}"
                )
                print(f"  VIOLATION {USAGE_MISMATCH} {label}: {mismatch.detail}", flush=True)
            self.accounting_log.append(
                {
                    "at": round(time.monotonic() - self.started, 1),
                    "checkpoint": label,
                    "seconds": settled.seconds,
                    "transient": settled.transient,
                    "persisted": [f"[{m.rule}] {m.detail}" for m in settled.persisted],
                }
            )
            self.log(
                f"usage-mismatch checkpoint {label}: {len(settled.persisted)} persisted, "
                f"{settled.transient} transient ({settled.seconds}s)"
            )

    def _visibility_tls_args(self, cluster: LocalCluster) -> list[str]:
        serving = pki.issue_serving(
            ca=cluster.ca,
            common_name="koord-queue-visibility",
            dns_names=["localhost"],
            ip_addresses=["127.0.0.1"],
            now=datetime.now(UTC),
        )
        certdir = self.logdir / "visibility-certs"
        certdir.mkdir(exist_ok=True)
        pki.write_pem(certdir / "tls.crt", serving.cert_pem, private=False)
        pki.write_pem(certdir / "tls.key", serving.key_pem, private=True)
        return [
            f"--visibility-cert-file={certdir / 'tls.crt'}",
            f"--visibility-key-file={certdir / 'tls.key'}",
        ]

    async def _watchdog(self, faults: Faults) -> None:
        """A process of ours that dies on its own is a violation; it is restarted so the run goes on."""
        while True:
            await asyncio.sleep(1.0)
            for problem in faults.crashed():
                self.violate("process-crashed", problem)
                if problem.startswith("reconciler"):
                    faults.expected_exits.add(faults.reconciler.process.pid)
                    await faults.start_reconciler()
                else:
                    faults.expected_exits.add(faults.webhook.process.pid)
                    await faults.start_webhook()

    async def _inject(self, faults: Faults, workload: load.Load, client: kube.Kube) -> None:
        """The fault schedule: one fault after the other while the load runs; job deletions at the
        worst moments are armed for the whole time."""
        p = self.profile
        gap = p.gap_s
        ns = load.NAMESPACE
        done = asyncio.Event()
        # Victims with no retry budget are left alone: they show whether a preemption fails a job.
        fragile = {f"{ns}/{load.plan(i, random.Random(0)).name}" for i in range(p.jobs) if i % 20 == 3}
        # The tenant phase's sentinels are always admitted and never bound: leave them alone too.
        fragile |= {f"{ns}/{name}" for name in tenant.SENTINELS}
        deleting = asyncio.create_task(
            faults.delete_jobs(ns, count=p.deletions, until=done, spare=fragile.__contains__),
            name="deletions",
        )
        await asyncio.sleep(gap + 3)
        await faults.kill_reconciler()
        bulk = asyncio.create_task(workload.bulk_units(p.bulk_units), name="bulk")
        await asyncio.sleep(gap)
        writer = asyncio.create_task(faults.status_writer(ns, p.writer_s), name="writer")
        await faults.kill_webhook()
        await asyncio.sleep(gap)
        await faults.pause_etcd(p.etcd_pause_s)
        await writer
        await asyncio.sleep(gap)
        await faults.restart_apiserver(kill=True)
        await faults.kill_reconciler()
        await self._hostile(faults, client)
        bulk_seconds = await bulk
        self.log(
            f"{workload.counters['bulk QueueUnits created']} bulk QueueUnits created in {bulk_seconds:.0f}s"
        )
        await asyncio.sleep(gap)
        await faults.shrink_quota(ns, load.PARENT, cpu="3", hold=p.shrink_hold_s)
        await asyncio.sleep(gap)
        await faults.shrink_quota(ns, "chaos-c", cpu="1", hold=p.shrink_hold_s)
        await faults.kill_apiserver_mid_admission(load.HOSTILE_NAMESPACE, rounds=p.burst_rounds)
        await faults.expire_watches()
        for i in range(max(0, p.reconciler_kills - 2)):
            await asyncio.sleep(gap)
            await faults.kill_reconciler()
            if i == 0 and p.name == "full":
                await asyncio.sleep(gap)
                await faults.restart_apiserver(kill=True)
                await asyncio.sleep(gap)
                await faults.pause_etcd(p.etcd_pause_s)
        # Last, so that no later reconciler restart rewrites what was lost.
        await faults.kill_apiserver_mid_park(load.HOSTILE_NAMESPACE, units=p.park_units)
        done.set()
        self.faults_done.set()
        await deleting

    async def _hostile(self, faults: Faults, client: kube.Kube) -> None:
        self.hostile = await load.submit_hostile(client, self.secret)
        self.inputs["hostile objects submitted"] = len(self.hostile)
        self.inputs["hostile objects refused with a message"] = sum(1 for h in self.hostile if not h.created)
        for outcome in self.hostile:
            if not outcome.created and not outcome.message:
                self.violate("hostile-input", f"{outcome.case}: refused without a message")
        sample = load.job(load.plan(1, random.Random(1)), self.secret)
        fuzz = await load.fuzz_webhook(
            faults.webhook.ports["https"],
            self.cluster.ca_pem,
            load.review(sample),
            self.profile.webhook_bodies,
        )
        self.inputs["hostile webhook bodies"] = fuzz.sent
        self.webhook_outcomes = dict(fuzz.outcomes)
        for bad in fuzz.bad:
            self.violate("webhook-hostile-input", bad)
        self.log(
            f"hostile input: {len(self.hostile)} objects, {fuzz.sent} webhook bodies {dict(fuzz.outcomes)}"
        )

    def _tenant_inputs(self, mallory: tenant.Tenant) -> None:
        summary = tenant.summarize(mallory.attempts)
        self.inputs["hostile tenant attacks (mallory)"] = sum(row["tried"] for row in summary.values())
        outcomes = Counter(a.outcome for a in mallory.attempts)
        self.log(f"hostile tenant: {dict(outcomes)}; transient retries {dict(mallory.transient)}")
        for error in mallory.errors:
            self.notes.append(f"tenant harness error: {error}")

    async def _drain(self, workload: load.Load) -> None:
        """Wait until every normal job that was not deleted on purpose has finished."""
        deadline = time.monotonic() + self.profile.drain_s
        while time.monotonic() < deadline:
            if not self._unfinished(workload):
                self.log("every normal job finished")
                return
            await asyncio.sleep(2.0)
        self.log(f"{len(self._unfinished(workload))} normal jobs unfinished after the drain deadline")

    def _unfinished(self, workload: load.Load) -> list[str]:
        out = []
        for name, p in workload.submitted.items():
            key = f"{p.namespace}/{name}"
            if p.shape in ("victim", "hog") or key in self.faults.deleted_jobs or key in workload.deleted:
                continue
            job = self.observer.jobs.get(key)
            if job is None or not job.finished:
                out.append(key)
        return out

    # --- end-state checks ---------------------------------------------------------------------------

    async def _invalid_job_events(self, client: kube.Kube) -> set[tuple[str, str]]:
        items, _ = await client.list(kube.EVENTS, namespace=load.HOSTILE_NAMESPACE)
        return {
            (str(e.get("involvedObject", {}).get("kind")), str(e.get("involvedObject", {}).get("name")))
            for e in items
            if e.get("reason") == "InvalidJob"
        }

    async def _end_state(self, workload: load.Load, client: kube.Kube) -> None:
        observer = self.observer
        for key in self._unfinished(workload):
            unit = observer.unit_of_job(key)
            state = "no QueueUnit" if unit is None else f"unit phase {unit.phase!r}, message {unit.message!r}"
            self.violate("job-lost", f"{key} did not finish: {state}")
        self.end_checks["normal jobs finished"] = sum(
            1 for p in workload.submitted.values() if p.shape not in ("victim", "hog")
        ) - len(self._unfinished(workload))
        # Every submitted managed job ends finished, admitted, or waiting with a message.
        for name, p in workload.submitted.items():
            key = f"{p.namespace}/{name}"
            if key in self.faults.deleted_jobs or key in workload.deleted:
                continue
            self.end_checks["job ends admitted or waiting with a reason"] += 1
            job = observer.jobs.get(key)
            if job is None:
                self.violate("job-vanished", f"{key} no longer exists")
                continue
            if job.finished:
                continue
            self._explained(observer.unit_of_job(key), key)
        # Every unit of ours is admitted or says why it waits.
        for key, unit in observer.units.items():
            self.end_checks["unit admitted or has a message"] += 1
            self._explained(unit, key)
        bulk = [u for k, u in observer.units.items() if k.startswith(f"{load.BULK_NAMESPACE}/")]
        admitted = sum(1 for u in bulk if u.total > 0)
        self.notes.append(f"bulk namespace: {len(bulk)} units, {admitted} admitted (quota allows 20)")
        if bulk and admitted < min(len(bulk), int(load.BULK_QUOTA_CPU)):
            self.violate("bulk-not-admitted", f"only {admitted} of {len(bulk)} bulk units admitted")
        # Every hostile object was refused with a message, or got one.
        invalid = await self._invalid_job_events(client)
        for outcome in self.hostile:
            if not outcome.created:
                continue
            self.end_checks["accepted bad object answered"] += 1
            key = f"{load.HOSTILE_NAMESPACE}/{outcome.name}"
            if (outcome.kind, outcome.name) in invalid:
                continue
            unit = observer.units.get(key) if outcome.kind == "QueueUnit" else None
            if unit is None and outcome.kind != "QueueUnit":
                unit = next(
                    (
                        u
                        for u in observer.units.values()
                        if u.consumer == (outcome.kind, load.HOSTILE_NAMESPACE, outcome.name)
                    ),
                    None,
                )
            if unit is None:
                self.violate("hostile-input", f"{outcome.case}: accepted, but no event and no QueueUnit")
            else:
                self._explained(unit, key)
        for problem in self.faults.crashed():
            self.violate("process-crashed", problem)
        self.end_checks["reconciler healthy at the end"] += 1
        port = self.faults.reconciler.ports["health"]
        try:
            healthy = await asyncio.to_thread(_http_ok, f"http://127.0.0.1:{port}/readyz")
        except OSError:
            healthy = False
        if not healthy:
            self.violate("reconciler-unready", "the reconciler's /readyz does not answer 200 at the end")

    def _explained(self, unit: Any, key: str) -> None:
        if key in self._explained_keys:
            return
        self._explained_keys.add(key)
        if unit is None:
            self.violate("silent-job", f"{key}: no QueueUnit and no InvalidJob event")
        elif not (unit.total > 0 and unit.phase not in TERMINAL) and not unit.message:
            self.violate("silent-job", f"{key}: waits (phase {unit.phase!r}) with no status.message")

    def _security(self, cluster: LocalCluster, faults: Faults, sec: security.Findings) -> None:
        logs = sorted(self.logdir.glob("*.log"))
        security.scan_logs(
            logs, {"the secret annotation (object contents)": self.secret, "key material": "PRIVATE KEY"}, sec
        )
        assert cluster.workdir is not None
        roots = [cluster.workdir, cluster.workdir / "pki", self.logdir / "webhook-certs"]
        roots.append(self.logdir / "visibility-certs")
        files = security.private_files(roots)
        security.check_modes(files, sec)
        security.check_image_and_manifests(Path(__file__).resolve().parent.parent, sec)
        self.inputs["log files scanned"] = len(logs)
        self.inputs["key/kubeconfig files checked"] = len(files)
        for problem in sec.problems:
            self.violate("security", problem)
        self.notes.extend(sec.notes)

    # --- report -------------------------------------------------------------------------------------

    def _results(self, workload: load.Load, sec: security.Findings) -> dict[str, Any]:
        observer, faults = self.observer, self.faults
        fault_counts: Counter[str] = Counter()
        fault_recovered: Counter[str] = Counter()
        for record in faults.records:
            base = record.fault.split(" at ")[0]
            base = "compact etcd + apiserver restart (410)" if base.startswith("compact etcd") else base
            fault_counts[base] += record.count
            fault_recovered[base] += record.count if record.recovered else 0
        inputs = Counter(self.inputs)
        inputs["jobs submitted (mixed load)"] = workload.counters["jobs submitted"]
        inputs["jobs submitted (borrowing load)"] = workload.counters["borrowing jobs submitted"]
        inputs["borrowing load waves"] = workload.counters["borrowing waves"]
        inputs["bulk QueueUnits (one namespace)"] = workload.counters["bulk QueueUnits created"]
        inputs["concurrent status patches"] = faults.counters.get("concurrent status writes", 0)
        checks = Counter(observer.checks)
        checks.update(self.end_checks)
        checks["TLS / log / file-mode checks"] = sec.checks
        violations = Counter(observer.violation_counts)
        violations.update(self.extra_violations)
        stats = Counter(observer.stats)
        stats["reconciler 410 relists (from its logs)"] = faults.reconciler_relists()
        stats["hogs deleted by the borrowing load"] = workload.counters["hogs deleted by the load"]
        longest = observer.guarantees.longest_served
        stats["guarantee-unserved: longest wait ended by an admission (quiet ms)"] = round(longest * 1000)
        stats["reconciler write conflicts (409 in its logs)"] = faults.log_count("409")
        stats.update({f"creates refused: {k}": v for k, v in workload.refusals.items()})
        return {
            "profile": self.profile.name,
            "finished_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration_s": round(time.monotonic() - self.started, 1),
            "faults": {
                k: {"injected": v, "recovered": fault_recovered[k]} for k, v in sorted(fault_counts.items())
            },
            "fault_log": [asdict(r) for r in faults.records],
            "usage_checkpoints": self.accounting_log,
            "inputs_fuzzed": dict(sorted(inputs.items())),
            "webhook_body_outcomes": getattr(self, "webhook_outcomes", {}),
            "hostile_objects": [asdict(h) for h in getattr(self, "hostile", [])],
            "hostile_tenant": self.tenant.results() if hasattr(self, "tenant") else {},
            "invariant_checks": dict(sorted(checks.items())),
            "violations": dict(sorted(violations.items())),
            "violations_total": sum(violations.values()),
            "violation_details": [asdict(v) for v in observer.violations] + self.extra_details,
            "observed": dict(sorted(stats.items())),
            "notes": self.notes,
        }


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)


def table(title: str, header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [title, "  " + "  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  " + "  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    parts = [
        table(
            "Faults injected",
            ("fault", "injected", "recovered"),
            [(k, v["injected"], v["recovered"]) for k, v in results["faults"].items()],
        ),
        table("Inputs fuzzed", ("input", "count"), list(results["inputs_fuzzed"].items())),
        table(
            "Hostile tenant (mallory): tries per attack",
            ("attack", "tried", "refused", "neutralised", "undone", "SUCCEEDED", "skipped", "error"),
            [
                (
                    k,
                    v["tried"],
                    v["refused"],
                    v["neutralised"],
                    v["undone"],
                    v["SUCCEEDED"],
                    v["skipped"],
                    v["error"],
                )
                for k, v in (results.get("hostile_tenant") or {}).get("attacks", {}).items()
            ]
            or [("(not run)", 0, 0, 0, 0, 0, 0, 0)],
        ),
        table(
            "Invariant checks performed",
            ("check", "evaluations"),
            list(results["invariant_checks"].items()),
        ),
        table("Observed", ("event", "count"), list(results["observed"].items())),
        table(
            "Violations found",
            ("invariant", "count"),
            list(results["violations"].items()) or [("(none)", 0)],
        ),
    ]
    for detail in results["violation_details"][:40]:
        parts.append(f"  ! {detail}")
    parts.append(
        f"TOTAL VIOLATIONS: {results['violations_total']}  ({results['profile']}, {results['duration_s']}s)"
    )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (about 3 minutes)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to put the control plane and logs")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write the counts (JSON)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kq-chaos-"))
    run = Run(QUICK if args.quick else FULL, workdir)
    try:
        results = asyncio.run(run.execute())
    except Exception as err:
        print(f"chaos run failed: {err!r}", file=sys.stderr)
        print(f"logs kept in {workdir}", file=sys.stderr)
        raise SystemExit(2) from err
    args.results.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    print()
    print(render(results))
    print(f"\nresults written to {args.results}")
    if results["violations_total"] or args.keep:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if results["violations_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
