"""Fault injectors: each one breaks one thing the system depends on, then restores it.

Every injector records what it did in :attr:`Faults.records` (name, when, how long the fault
lasted, and whether the broken part came back). Processes are signalled by PID through their
process group (each runs in its own session), never by name.

* :meth:`Faults.kill_reconciler`: SIGKILL the reconciler, start a fresh one (new process, new cache);
* :meth:`Faults.kill_webhook`: SIGKILL the webhook and start it again on the same port with the same
  certificate, so the registered webhook configuration stays valid (while it is down, managed jobs
  are refused: ``failurePolicy: Fail``);
* :meth:`Faults.restart_apiserver`: SIGKILL (or SIGTERM) kube-apiserver and start it again on the
  same port; every watch breaks and resumes with a resourceVersion the new apiserver's watch cache
  no longer has, so the reconciler gets ``410 Gone`` and relists;
* :meth:`Faults.expire_watches`: compact etcd up to the current revision, then restart the apiserver:
  a forced watch expiry and relist with the old history gone;
* :meth:`Faults.pause_etcd`: SIGSTOP etcd for some seconds, then SIGCONT;
* :meth:`Faults.status_writer`: a concurrent writer patching an unrelated status field
  (``status.podState``) of random QueueUnits, so the reconciler's conditional writes conflict;
* :meth:`Faults.delete_jobs`: delete jobs whose unit is mid-admission (admitted, pods not running)
  or mid-reclaim (a ``reclaimState`` is set);
* :meth:`Faults.shrink_quota`: lower a quota's ``max`` below its usage for a while, then restore it.

The faults that stop or blind the reconciler (its kill, the webhook's, the apiserver's restarts,
the etcd pause) open a *fault window* on the observer from their start until their recovery probe
is admitted (:func:`disturbing`): the guarantee invariants, which judge how fast the scheduler acts,
do not count that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import ssl
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from chaos.etcd import Etcd
from chaos.observer import Observer
from chaos.views import UnitView
from koord_queue.shared import kube
from koord_queue.shared.api import names
from testenv import system
from testenv.cluster import LocalCluster
from testenv.processes import Component

UNITS = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
QUOTAS = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")
JOBS = kube.Resource("batch", "v1", "jobs", "Job")


P = ParamSpec("P")
R = TypeVar("R")


def disturbing(
    method: Callable[Concatenate[Faults, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Faults, P], Coroutine[Any, Any, R]]:
    """Wrap a fault in a fault window on the observer (see the module docstring)."""

    async def wrapper(faults: Faults, /, *args: P.args, **kwargs: P.kwargs) -> R:
        faults.observer.disturb()
        try:
            return await method(faults, *args, **kwargs)
        finally:
            faults.observer.undisturb()

    return wrapper


@dataclass
class FaultRecord:
    fault: str
    at: float
    seconds: float
    recovered: bool
    detail: str = ""
    #: how many times the fault was injected by this record (job deletions: one per job)
    count: int = 1


@dataclass
class Faults:
    cluster: LocalCluster
    logdir: Path
    etcd: Etcd
    observer: Observer
    client: kube.Kube
    reconciler_args: list[str] = field(default_factory=list)
    webhook_args: list[str] = field(default_factory=list)
    #: the namespaces where queueing is mandatory (a label selector), registered with every webhook
    #: start (docs/operations.md#mandatory-queueing)
    mandatory_namespaces: dict[str, Any] | None = None
    reconcilers: list[Component] = field(default_factory=list)
    webhooks: list[Component] = field(default_factory=list)
    records: list[FaultRecord] = field(default_factory=list)
    #: jobs the chaos deleted on purpose (excluded from the end-state checks)
    deleted_jobs: dict[str, str] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    #: processes we signalled ourselves (their exit is expected)
    expected_exits: set[int] = field(default_factory=set)

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _record(self, fault: str, begun: float, recovered: bool, detail: str = "") -> FaultRecord:
        record = FaultRecord(
            fault=fault,
            at=round(begun - self.started, 1),
            seconds=round(time.monotonic() - begun, 2),
            recovered=recovered,
            detail=detail,
        )
        self.records.append(record)
        print(
            f"  [{record.at:7.1f}s] {fault}: {record.seconds:.1f}s, recovered={recovered} {detail}",
            flush=True,
        )
        return record

    # --- recovery probe ------------------------------------------------------------------------------

    async def probe(self, *, timeout: float = 90.0) -> float | None:
        """Seconds until a fresh tiny QueueUnit is admitted (the whole loop works again), or None."""
        from chaos import load

        self.counters["probe"] = self.counters.get("probe", 0) + 1
        name = f"probe-{self.counters['probe']:03d}"
        unit = load.bare_unit(name, load.PROBE_QUOTA, "1m", "probe", namespace=load.HOSTILE_NAMESPACE)
        begun = time.monotonic()
        deadline = begun + timeout
        key = f"{load.HOSTILE_NAMESPACE}/{name}"
        created = False
        while time.monotonic() < deadline:
            if not created:
                try:
                    await self.client.create(UNITS, unit, namespace=load.HOSTILE_NAMESPACE)
                    created = True
                except kube.Conflict:
                    created = True
                except kube.KubeError:
                    pass
            found = self.observer.units.get(key)
            if found is not None and found.total > 0:
                seconds = time.monotonic() - begun
                with contextlib.suppress(kube.KubeError):
                    await self.client.delete(UNITS, name, namespace=load.HOSTILE_NAMESPACE)
                return seconds
            await asyncio.sleep(0.1)
        return None

    async def _recovered(self, fault: str, begun: float, ok: bool, detail: str = "") -> FaultRecord:
        """Record the fault once the system works again end to end (the probe is admitted)."""
        seconds = await self.probe() if ok else None
        if seconds is None:
            return self._record(
                fault, begun, False, f"{detail}; NOT recovered (probe not admitted)".strip("; ")
            )
        return self._record(fault, begun, True, f"{detail}; admitting again {seconds:.1f}s later".strip("; "))

    # --- our processes ------------------------------------------------------------------------------

    @property
    def reconciler(self) -> Component:
        return self.reconcilers[-1]

    @property
    def webhook(self) -> Component:
        return self.webhooks[-1]

    async def start_reconciler(self) -> Component:
        name = f"reconciler-{len(self.reconcilers)}"
        component = await asyncio.to_thread(
            system.start_reconciler,
            self.cluster,
            logdir=self.logdir,
            name=name,
            extra_args=self.reconciler_args,
        )
        self.reconcilers.append(component)
        return component

    async def start_webhook(self) -> Component:
        component, _ = await asyncio.to_thread(
            system.start_webhook,
            self.cluster,
            logdir=self.logdir,
            extra_args=self.webhook_args,
            mandatory_namespaces=self.mandatory_namespaces,
        )
        self.webhooks.append(component)
        return component

    def crashed(self) -> list[str]:
        """Our current processes that died without being killed by us."""
        return [
            f"{c.name} exited with {c.process.returncode}"
            for c in (self.reconciler, self.webhook)
            if not c.alive() and c.process.pid not in self.expected_exits
        ]

    def _sigkill(self, component: Component) -> None:
        self.expected_exits.add(component.process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(component.process.pid, signal.SIGKILL)
        component.process.wait(timeout=30)

    # --- process faults -----------------------------------------------------------------------------

    @disturbing
    async def kill_reconciler(self) -> FaultRecord:
        begun = time.monotonic()
        victim = self.reconciler
        self._sigkill(victim)
        try:
            await self.start_reconciler()
        except Exception as err:
            return self._record("SIGKILL reconciler", begun, False, f"restart failed: {err}")
        return await self._recovered(
            "SIGKILL reconciler", begun, True, f"{victim.name} -> {self.reconciler.name}"
        )

    @disturbing
    async def kill_webhook(self, *, down_s: float = 3.0) -> FaultRecord:
        """SIGKILL the webhook, leave it down for ``down_s`` (creates are refused meanwhile), then
        start it again on the same port and certificate (the registration stays valid)."""
        begun = time.monotonic()
        victim = self.webhook
        self._sigkill(victim)
        await asyncio.sleep(down_s)
        argv = [str(a) for a in victim.process.args]  # type: ignore[union-attr]
        name = f"webhook-{len(self.webhooks)}"
        log = self.logdir / f"{name}.log"
        process = _spawn(argv, log)
        component = Component(name=name, process=process, log=log, ports=dict(victim.ports))
        self.webhooks.append(component)
        healthy = await _poll(lambda: _webhook_healthy(self.cluster, victim.ports["https"]), timeout=30)
        mutating = healthy and await self._webhook_mutates()
        detail = f"down {down_s:.0f}s; jobs held again: {mutating}"
        return await self._recovered("SIGKILL webhook", begun, mutating and component.alive(), detail)

    async def _webhook_mutates(self) -> bool:
        """A dry-run create of a managed Job comes back suspended (the webhook is in the loop)."""
        from chaos import load

        body = load.job(load.JobPlan("dry-run-probe", "chaos-b", "single", None, False), "probe")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                created = await self.client.request(
                    "POST", JOBS.path(load.NAMESPACE), query={"dryRun": "All"}, body=body
                )
                return bool(created.get("spec", {}).get("suspend"))
            except kube.KubeError:
                await asyncio.sleep(0.5)
        return False

    @disturbing
    async def restart_apiserver(self, *, kill: bool = True, label: str = "") -> FaultRecord:
        begun = time.monotonic()
        relists = self.reconciler_relists()
        try:
            await asyncio.to_thread(self.cluster.restart_component, "kube-apiserver", kill=kill)
        except Exception as err:
            return self._record(label or "restart kube-apiserver", begun, False, str(err)[:200])
        fault = label or f"restart kube-apiserver ({'SIGKILL' if kill else 'SIGTERM'})"
        record = await self._recovered(fault, begun, True)
        record.detail += f"; reconciler 410 relists +{self.reconciler_relists() - relists}"
        return record

    @disturbing
    async def kill_apiserver_mid_admission(
        self, namespace: str, *, rounds: int, size: int = 12
    ) -> FaultRecord:
        """SIGKILL kube-apiserver while a burst of admission writes is in flight.

        A quota starts with ``max: 0`` and ``size`` waiting one-CPU QueueUnits per round; each round
        raises ``max`` by ``size`` CPU and kills the apiserver a few milliseconds later, so some
        status writes are cut off after etcd committed them (the client sees a dropped connection,
        not the outcome). Right after the restart ``size`` / 2 higher-priority units arrive and
        compete for whatever the reconciler believes is free. Whatever it concludes, usage must
        never exceed ``max``.
        """
        from chaos import load

        begun = time.monotonic()
        quota = load.quota(load.BURST_QUOTA, "0", "", False, namespace)
        await self.client.create(QUOTAS, quota, namespace=namespace)

        async def units(prefix: str, n: int, priority: int) -> None:
            for i in range(n):
                unit = load.bare_unit(
                    f"{prefix}-{i:02d}", load.BURST_QUOTA, "1", "burst", namespace=namespace
                )
                unit["spec"]["priority"] = priority
                with contextlib.suppress(kube.KubeError):
                    await self.client.create(UNITS, unit, namespace=namespace)

        await units("burst", size * rounds, 0)
        await asyncio.sleep(2.0)  # all parked
        rng = random.Random(5)
        ambiguous = self.log_count("not written (0 ServerDisconnectedError")
        for r in range(rounds):
            cpu = str(size * (r + 1))
            await self.client.patch(
                QUOTAS, load.BURST_QUOTA, {"spec": {"max": {"cpu": cpu}}}, namespace=namespace
            )
            await asyncio.sleep(rng.uniform(0.005, 0.05))
            await asyncio.to_thread(self.cluster.restart_component, "kube-apiserver", kill=True)
            await units(f"burst-r{r}-high", size // 2, 100)
            await asyncio.sleep(3.0)
        admitted = sum(
            1 for k, u in self.observer.units.items() if k.startswith(f"{namespace}/burst-") and u.total > 0
        )
        cut = self.log_count("not written (0 ServerDisconnectedError") - ambiguous
        return await self._recovered(
            "SIGKILL kube-apiserver mid-admission burst",
            begun,
            True,
            f"{rounds} rounds; {cut} admission writes cut off; {admitted} burst units admitted",
        )

    @disturbing
    async def kill_apiserver_mid_park(self, namespace: str, *, units: int) -> FaultRecord:
        """SIGKILL kube-apiserver while the reconciler writes the waiting messages of a burst of new
        QueueUnits that can never be admitted (their quota has ``max: 0``). Every one of them must
        still end up saying why it waits."""
        from chaos import load

        begun = time.monotonic()
        quota = load.quota(load.FULL_QUOTA, "0", "", False, namespace)
        await self.client.create(QUOTAS, quota, namespace=namespace)
        created = 0
        third = asyncio.Event()

        async def worker(offset: int) -> None:
            nonlocal created
            for i in range(offset, units, 8):
                unit = load.bare_unit(f"waiting-{i:03d}", load.FULL_QUOTA, "1", "park", namespace=namespace)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    try:
                        await self.client.create(UNITS, unit, namespace=namespace)
                        break
                    except kube.Conflict:
                        break
                    except kube.KubeError:
                        await asyncio.sleep(0.5)
                created += 1
                if created >= units // 3:
                    third.set()

        creating = [asyncio.create_task(worker(i)) for i in range(8)]
        await third.wait()
        await asyncio.to_thread(self.cluster.restart_component, "kube-apiserver", kill=True)
        await asyncio.gather(*creating)
        lost = self.log_count(f"message for {namespace}/waiting-")
        return await self._recovered(
            "SIGKILL kube-apiserver mid waiting-message burst",
            begun,
            True,
            f"{units} never-admissible units; {lost} waiting messages cut off",
        )

    @disturbing
    async def expire_watches(self) -> FaultRecord:
        """Compact etcd's history, then restart the apiserver: every watch resumes with a
        resourceVersion that no longer exists and gets 410 Gone."""
        await self.observer.sync(self.etcd)
        revision = min(await self.etcd.revision(), self.observer.revision)
        await self.etcd.compact(revision)
        self._count("etcd compactions")
        return await self.restart_apiserver(
            kill=False, label=f"compact etcd at {revision} + apiserver restart (410)"
        )

    @disturbing
    async def pause_etcd(self, seconds: float) -> FaultRecord:
        begun = time.monotonic()
        etcd = next(c for c in self.cluster.components if c.name == "etcd")
        os.killpg(etcd.process.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.killpg(etcd.process.pid, signal.SIGCONT)
        ok = await _poll(lambda: self.cluster.request("GET", "/readyz") == "ok", timeout=60)
        return await self._recovered("pause etcd (SIGSTOP/SIGCONT)", begun, ok, f"paused {seconds:.0f}s")

    # --- API-level faults ----------------------------------------------------------------------------

    async def status_writer(
        self, namespace: str, seconds: float, *, writers: int = 4, rate: float = 10.0
    ) -> FaultRecord:
        """``writers`` concurrent tasks patch ``status.podState`` of random units of ``namespace``
        for ``seconds`` (no resourceVersion: they always win, the reconciler's conditional writes
        conflict)."""
        begun = time.monotonic()
        writes = errors = 0

        async def writer(seed: int) -> None:
            nonlocal writes, errors
            rng = random.Random(seed)
            while time.monotonic() - begun < seconds:
                keys = [k for k in self.observer.units if k.startswith(f"{namespace}/")]
                if keys:
                    name = rng.choice(keys).split("/", 1)[1]
                    body = {
                        "status": {"podState": {"running": rng.randint(0, 9), "pending": rng.randint(0, 9)}}
                    }
                    try:
                        await self.client.patch(UNITS, name, body, namespace=namespace, subresource="status")
                        writes += 1
                    except kube.KubeError:
                        errors += 1
                await asyncio.sleep(1.0 / rate)

        await asyncio.gather(*(writer(i) for i in range(writers)))
        self._count("concurrent status writes", writes)
        return await self._recovered(
            "concurrent writer on QueueUnit status", begun, True, f"{writes} patches, {errors} failed"
        )

    async def delete_jobs(
        self,
        namespace: str,
        *,
        count: int,
        until: asyncio.Event,
        spare: Callable[[str], bool] = lambda _: False,
    ) -> list[FaultRecord]:
        """Delete jobs at the worst moments, ``count`` of each kind, until ``until`` is set:
        *mid-admission* (the unit is admitted, no pod bound yet) and *mid-reclaim* (a reclaimState
        was just set: the delete is sent from the observer's hook, racing the job extension's
        reclaim)."""
        begun = time.monotonic()
        deleted: dict[str, list[str]] = {"mid-admission": [], "mid-reclaim": []}
        pending: list[tuple[str, str]] = []

        def candidate(unit: UnitView) -> str | None:
            if not unit.key.startswith(f"{namespace}/") or unit.consumer is None or unit.consumer[0] != "Job":
                return None
            job_key = f"{unit.consumer[1]}/{unit.consumer[2]}"
            if job_key in self.deleted_jobs or unit.phase in ("Succeed", "Failed") or spare(job_key):
                return None
            return job_key

        taken: Counter[str] = Counter()

        def take(job_key: str, when: str) -> None:
            self.deleted_jobs[job_key] = when
            pending.append((job_key, when))
            taken[when] += 1

        def on_reclaim(unit: UnitView) -> None:
            job_key = candidate(unit)
            if job_key is not None and taken["mid-reclaim"] < count:
                take(job_key, "mid-reclaim")

        self.observer.on_reclaim.append(on_reclaim)
        try:
            while not until.is_set() and min(len(v) for v in deleted.values()) < count:
                if len(deleted["mid-admission"]) < count and not any(
                    w == "mid-admission" for _, w in pending
                ):
                    for unit in list(self.observer.units.values()):
                        job_key = candidate(unit)
                        pods = self.observer.pods_of(unit.key)
                        if job_key and unit.total > 0 and not unit.reclaim and not any(p.bound for p in pods):
                            take(job_key, "mid-admission")
                            break
                while pending:
                    job_key, when = pending.pop()
                    with contextlib.suppress(kube.NotFound):
                        await self.client.delete(
                            JOBS, job_key.split("/", 1)[1], namespace=namespace, propagation="Background"
                        )
                    deleted[when].append(job_key)
                    self.log(f"deleted job {job_key} {when}")
                    if when == "mid-admission":
                        await asyncio.sleep(10.0)  # spread them over the run
                await asyncio.sleep(0.02)
        finally:
            self.observer.on_reclaim.remove(on_reclaim)
        records = []
        for when, jobs in deleted.items():
            self._count(f"jobs deleted {when}", len(jobs))
            if not jobs:
                records.append(self._record(f"delete jobs {when}", begun, True, "no opportunity arose"))
            else:
                detail = f"{len(jobs)} deleted: {', '.join(jobs)}"
                records.append(await self._recovered(f"delete jobs {when}", begun, True, detail))
            records[-1].count = len(jobs)
        return records

    def log(self, text: str) -> None:
        print(f"  [{time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    async def shrink_quota(self, namespace: str, name: str, *, cpu: str, hold: float) -> FaultRecord:
        """Lower ``max.cpu`` of a quota to ``cpu`` for ``hold`` seconds, then restore it."""
        begun = time.monotonic()
        quota = await self.client.get(QUOTAS, name, namespace=namespace)
        before = quota["spec"]["max"]["cpu"]
        used = self.observer.usage(name).get("cpu", 0)
        await self.client.patch(QUOTAS, name, {"spec": {"max": {"cpu": cpu}}}, namespace=namespace)
        await asyncio.sleep(hold)
        await self.client.patch(QUOTAS, name, {"spec": {"max": {"cpu": before}}}, namespace=namespace)
        return await self._recovered(
            f"quota shrink {name}",
            begun,
            True,
            f"max cpu {before} -> {cpu} (used {used / 1000:g}) for {hold:.0f}s",
        )

    # --- observations ------------------------------------------------------------------------------

    def reconciler_relists(self) -> int:
        """``410 -> relist`` lines in every reconciler's log so far."""
        total = 0
        for component in self.reconcilers:
            with contextlib.suppress(OSError):
                total += component.log.read_text(errors="replace").count("(410); relisting")
        return total

    def log_count(self, needle: str) -> int:
        total = 0
        for component in self.reconcilers:
            with contextlib.suppress(OSError):
                total += component.log.read_text(errors="replace").count(needle)
        return total


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, output appended to ``log`` (as ``testenv.system`` does)."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


async def _poll(check: Callable[[], bool], *, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await asyncio.to_thread(check):
                return True
        except Exception:  # a failed probe is "not yet"
            pass
        await asyncio.sleep(interval)
    return False


def _webhook_healthy(cluster: LocalCluster, port: int) -> bool:
    context = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=2) as resp:
        return bool(resp.status == 200)
