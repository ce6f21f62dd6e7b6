"""The reconciler process: watches, scheduling loop, job extensions, quota→queue sync.

``koord-queue-reconciler --kubeconfig ~/.kube/config`` (in a cluster: no flag, the ServiceAccount is
used). Every part runs in one asyncio loop: informers fill the stores; the scheduling loop decides
on a snapshot and writes admissions; the job extensions resume jobs, release pods and report; the
event recorder writes events off the hot path. Health (``/healthz``, ``/readyz``) is served on
``--health-port`` and Prometheus metrics on ``--metrics-port`` (10259, as upstream). The visibility
API (``visibility.koord-queue.x-k8s.io``) is served on ``--visibility-port``; with
``--manage-visibility-certs`` over TLS, for the kube-apiserver's aggregation layer only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import ssl
import sys
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from aiohttp import web

from koord_queue.certs.manager import VisibilityCertManager, WebhookCertManager
from koord_queue.reconciler import flags, metrics, priorities, servers, visibility, workloads
from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.informer import Handler, Informer
from koord_queue.reconciler.job_units import QUEUE_UNITS
from koord_queue.reconciler.jobs import JobExtensions
from koord_queue.reconciler.profiles import ProfileController
from koord_queue.reconciler.quotas import QUEUES, QUOTAS, QuotaBindingSync, QuotaQueueSync, QuotaStatusSync
from koord_queue.reconciler.scheduler import SchedulerLoop
from koord_queue.shared import kube, leases
from koord_queue.shared.core import config as component_config
from koord_queue.shared.core.scheduling import Cache
from koord_queue.shared.jobs import registry

log = logging.getLogger("reconciler")
#: The Service in front of /metrics (manifests/reconciler.yaml): the self-issued certificate's names.
METRICS_SERVICE = "koord-queue-reconciler"


def build_parser() -> argparse.ArgumentParser:
    """The reconciler's flags (``reconciler/flags.py``), described by this module's docstring."""
    return flags.build_parser(__doc__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return flags.parse_args(build_parser(), argv)


def _fanout(*handlers: Handler) -> Handler:
    def handle(old: kube.Obj | None, new: kube.Obj | None) -> None:
        for h in handlers:
            h(old, new)

    return handle


def _settings(args: argparse.Namespace) -> component_config.Settings:
    """The component configuration file's settings, with what flags override."""
    settings = component_config.load(args.config) if args.config else component_config.Settings()
    if args.usage_half_life is not None:
        value = component_config.duration(args.usage_half_life, "--usage-half-life")
        settings = dataclasses.replace(settings, usage_half_life_seconds=value)
    # The install namespace is never one where queueing is mandatory.
    queueing = dataclasses.replace(settings.mandatory_queueing, component_namespace=args.namespace)
    return dataclasses.replace(settings, mandatory_queueing=queueing)


async def run(args: argparse.Namespace) -> None:
    settings = _settings(args)
    for warning in settings.warnings:
        log.warning("%s", warning)
    adapters = registry.enabled_adapters(args.enabled_extensions.split(","))
    leadership, client = await _connect(args)
    runners: list[web.AppRunner] = []
    try:
        # docs/compatibility.md#native-gang-hand-off: refused (with an error) without the API.
        handoff = await workloads.detect(client, enabled=settings.native_gang_handoff)
        events = EventRecorder(client, instance=socket.gethostname(), leadership=leadership)

        def jobs_changed() -> None:
            if all(i.synced.is_set() for i in jobs.informers()):
                jobs.mark_all()

        classes = priorities.PriorityClasses(changed=jobs_changed)
        scheduler = SchedulerLoop(client, events=events, settings=settings, leadership=leadership)
        ledger = scheduler.cache.ledger
        rules = priorities.QuotaPriorityRules(ledger, settings.max_user_priority, jobs_changed)
        pcs = Informer(client, kube.PRIORITY_CLASSES, handler=classes.on_event)
        units: Informer
        jobs = JobExtensions(
            client,
            adapters=adapters,
            units=lambda: units.objects,
            priority_classes=lambda: classes.values,
            events=events,
            workers=args.workers,
            priority_cap=rules.priority_cap,
            allowed_priority_classes=rules.allowed_classes,
            default_priority_class=classes.default,
            running_timeouts=settings.running_timeouts,
            leadership=leadership,
            mandatory_queueing=settings.mandatory_queueing,
            quotas=lambda: ledger.quotas.values(),
        )
        units = Informer(client, QUEUE_UNITS, handler=_fanout(scheduler.on_unit, jobs.on_unit), packed=True)
        scheduler.unit_store = units.objects
        queues, quota_sync = _queues(client, events, args.namespace, scheduler, lambda: quotas.objects)
        bindings = QuotaBindingSync(
            client,
            quotas=lambda: ledger.quotas.values(),
            namespace=args.namespace,
            enforce=settings.quota_namespace_binding,
            guarantees=settings.quota_guarantees,
        )
        figures = quota_status_sync(
            settings,
            client,
            cache=lambda: scheduler.cache,
            quotas=lambda: quotas.objects,
            ready=lambda: scheduler.cycles > 0,
        )
        pools = _pools(client, events, lambda: quotas.objects, args, scheduler, jobs)
        # jobs.on_quota after the scheduler's: it reads the ledger the scheduler's handler updates
        quota_handlers = [
            scheduler.on_quota,
            quota_sync.on_quota,
            bindings.on_quota,
            rules.on_quota,
            jobs.on_quota,
        ]
        extra = [part.on_quota for part in (figures, pools) if part is not None]
        quotas = Informer(client, QUOTAS, handler=_fanout(*quota_handlers, *extra))
        informers = [pcs, units, queues, quotas, *jobs.informers(), *pools.informers()]
        components = {"scheduler": scheduler, "jobs": jobs, "events": events, "quota_sync": quota_sync}
        components |= {"bindings": bindings, "figures": figures, "priority_classes": classes.values}
        metrics.watch_stores(informers, components, skip=(client, leadership, settings))

        def ready() -> bool:
            return all(i.synced.is_set() for i in informers)

        await _start_servers(args, client, ready, lambda: scheduler.cache, started=runners)

        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "events": events.run,
            "scheduler": lambda: _after(pools.first_pass, scheduler.run),
            "job-extensions": jobs.run,
            "quota-queues": quota_sync.run,
            "quota-bindings": bindings.run,
            "native-gangs": lambda: workloads.publish(client, handoff, args.namespace),
        }
        if figures is not None:
            loops["quota-figures"] = figures.run
        loops |= _cert_managers(args, client) | {"pools": pools.run}
        act = _leader_work(informers, loops, counted=(units, queues, quotas))

        try:
            await _supervise(informers, act, args, client)
        except* leases.LeadershipLost as group:
            raise group.exceptions[0] from None
    finally:
        for runner in runners:
            await runner.cleanup()
        await client.close()


def _queues(
    client: kube.Kube,
    events: EventRecorder,
    namespace: str,
    scheduler: SchedulerLoop,
    quotas: Callable[[], Mapping[str, kube.Obj]],
) -> tuple[Informer, QuotaQueueSync]:
    """The Queues' informer and the sync that keeps one Queue per quota. Only the install
    namespace's Queues count (docs/operations.md#install-namespace): one a tenant makes elsewhere
    is never read."""

    def gone(old: kube.Obj | None, new: kube.Obj | None) -> None:
        # A Queue deleted while its quota exists is re-created at once.
        if new is None:
            sync.on_queue_gone(old)

    queues = Informer(client, QUEUES, namespace=namespace, handler=_fanout(scheduler.on_queue, gone))
    sync = QuotaQueueSync(
        client, quotas=quotas, queues=lambda: queues.objects, events=events, namespace=namespace
    )
    return queues, sync


def _pools(
    client: kube.Kube,
    events: EventRecorder,
    quotas: Callable[[], Mapping[str, kube.Obj]],
    args: argparse.Namespace,
    scheduler: SchedulerLoop,
    jobs: JobExtensions,
) -> ProfileController:
    """The profile controller, with the scheduler and the job path told of every change of the
    pools' placements (docs/pools.md#placement)."""
    pools = ProfileController(client, events, quotas, write=args.quota_profiles)
    jobs.pools = lambda name: pools.pools.get(name)
    pools.subscribe(scheduler.set_placements)
    pools.subscribe(lambda placements: jobs.pools_changed(placements.keys()))
    return pools


async def _after(event: asyncio.Event, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``work`` once ``event`` is set."""
    await event.wait()
    await work()


async def _connect(args: argparse.Namespace) -> tuple[kube.Leadership, kube.Kube]:
    """The leadership gate and the API client behind it."""
    # The one leadership gate (``kube.Leadership``): closed from the start with --leader-elect, so
    # not even the first watch event can lead to a write before the Lease is held; ``leases.lead``
    # opens it. The client refuses every write while it is closed; the parts that queue work from
    # watch events get it too, so a follower queues nothing.
    leadership = kube.Leadership(leading=not args.leader_elect)
    # One identity per replica, in the Lease and in the user agent, so an audit log tells the
    # replicas apart (docs/operations.md#reconciler-flags).
    args.leader_election_identity = args.leader_election_identity or (
        f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    )
    client = await kube.Kube.connect(
        kubeconfig=args.kubeconfig,
        qps=args.qps,
        burst=args.burst,
        user_agent=f"koord-queue-reconciler/{args.leader_election_identity}",
        impersonate=args.impersonate or None,
        leadership=leadership,
    )
    client.on_request = metrics.count_api_request
    client.on_error = metrics.count_api_error
    metrics.watch_leadership(leadership)
    return leadership, client


async def _start_servers(
    args: argparse.Namespace,
    client: kube.Kube,
    ready: Callable[[], bool],
    cache: Callable[[], Cache],
    *,
    started: list[web.AppRunner],
) -> None:
    """Health, metrics and the visibility API, on every replica; a port of 0 turns one off. Each
    server joins ``started`` as it starts, so the caller stops those that did if a later one fails."""
    visibility_app, tls = _visibility_server(args, client, cache)
    if tls is not None:
        metrics.watch_certificate("visibility-serving", tls.cert_in_force)
    metrics_app, metrics_context = _metrics_server(args, client)
    apps = (
        (servers.health_app(ready), args.health_port, None),
        (metrics_app, args.metrics_port, metrics_context),
        (visibility_app, args.visibility_port, tls.listening if tls else None),
    )
    for app, port, context in apps:
        runner = await servers.serve(app, args.bind_address, port, context)
        if runner is not None:
            started.append(runner)


def _metrics_server(
    args: argparse.Namespace, client: kube.Kube
) -> tuple[web.Application, ssl.SSLContext | None]:
    """``/metrics`` and its TLS context: guarded by token and access reviews over HTTPS, or plain
    with ``--metrics-secure=false`` (docs/operations.md#metrics)."""
    if not args.metrics_secure or args.metrics_port <= 0:
        if args.metrics_port > 0:
            log.warning("--metrics-secure=false: /metrics is plain HTTP for anyone (local use only)")
        return servers.metrics_app(), None
    tls = servers.metrics_tls(
        cert_file=args.metrics_cert_file,
        key_file=args.metrics_key_file,
        service=METRICS_SERVICE,
        namespace=args.namespace,
        interval_s=args.cert_sync_interval,
    )
    metrics.watch_certificate("metrics-serving", tls.tls.cert_in_force)
    return servers.metrics_app(servers.MetricsGuard(client), tls=tls), tls.tls.listening


def _leader_work(
    informers: list[Informer],
    loops: Mapping[str, Callable[[], Coroutine[Any, Any, None]]],
    *,
    counted: tuple[Informer, ...],
) -> Callable[[], Coroutine[Any, Any, None]]:
    """What only the leader does; every replica keeps its caches warm for a fast take-over.

    Runs while ``leadership`` is open. Every writer (``loops``) starts here, and each begins from
    its warm cache, since a follower queued nothing: the job extensions and the scheduler with a
    full pass (``_take_over``), the Queue sync with every quota it saw, the binding sync, the quota
    figures and the certificate managers with a first comparison against the cluster.
    """

    async def act() -> None:
        for inf in informers:
            await inf.synced.wait()
        log.info("caches synced: %s", ", ".join(f"{len(i.objects)} {i.resource.plural}" for i in counted))
        async with asyncio.TaskGroup() as acting:
            for name, start in loops.items():
                acting.create_task(start(), name=name)

    return act


def _cert_managers(
    args: argparse.Namespace, client: kube.Kube
) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
    """The certificate managers the flags turn on: the webhook's serving certificate and the
    visibility API's (docs/operations.md#reconciler-flags)."""
    found: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}
    if args.manage_webhook_certs:
        found["webhook-certs"] = WebhookCertManager(
            client,
            namespace=args.webhook_namespace,
            secret=args.webhook_secret,
            service=args.webhook_service,
            configuration=args.webhook_configuration,
            interval_s=args.cert_sync_interval,
        ).run
    if args.manage_visibility_certs:
        found["visibility-certs"] = VisibilityCertManager(
            client,
            namespace=args.visibility_namespace,
            secret=args.visibility_secret,
            service=args.visibility_service,
            apiservice=args.visibility_apiservice,
            interval_s=args.cert_sync_interval,
        ).run
    return found


def quota_status_sync(
    settings: component_config.Settings,
    client: kube.Kube,
    *,
    cache: Callable[[], Cache],
    quotas: Callable[[], Mapping[str, kube.Obj]],
    ready: Callable[[], bool] = lambda: True,
) -> QuotaStatusSync | None:
    """The publisher of the quotas' figures, or None with ``publishQuotaStatus: false``: where
    koord-scheduler runs it owns ``status.used`` and the runtime/request annotations, and two
    writers would overwrite each other (docs/compatibility.md#quota-guarantees). It only ever
    runs in ``act``, that is on the leader."""
    if not settings.publish_quota_status:
        return None
    return QuotaStatusSync(client, cache=cache, quotas=quotas, ready=ready)


def _visibility_server(
    args: argparse.Namespace, client: kube.Kube, cache: Callable[[], Cache]
) -> tuple[web.Application, visibility.ServingTLS | None]:
    """The visibility app and its TLS: managed (Secret + aggregator auth), from files, or none."""
    allowed = frozenset(n.strip() for n in args.visibility_allowed_names.split(",") if n.strip())
    if args.manage_visibility_certs:
        tls = visibility.ServingTLS(client_auth=True)
        fixed = visibility.static_requestheader(args.visibility_client_ca or None, allowed)

        def follow() -> Coroutine[Any, Any, None]:
            return visibility.follow_cluster(
                tls,
                client,
                namespace=args.visibility_namespace,
                secret=args.visibility_secret,
                requestheader=fixed,
                interval_s=args.cert_sync_interval,
            )

        return visibility.make_app(cache, tls=tls, background=follow), tls
    if args.visibility_cert_file:
        tls = visibility.static_tls(
            cert_file=args.visibility_cert_file,
            key_file=args.visibility_key_file,
            client_ca=args.visibility_client_ca or None,
            allowed_names=allowed,
        )
        return visibility.make_app(cache, tls=tls), tls
    return visibility.make_app(cache), None


async def _supervise(
    informers: list[Informer],
    act: Callable[[], Coroutine[Any, Any, None]],
    args: argparse.Namespace,
    client: kube.Kube,
) -> None:
    """Informers on every replica; ``act`` directly, or only while holding the Lease."""
    async with asyncio.TaskGroup() as tg:
        for inf in informers:
            tg.create_task(inf.run(), name=f"informer-{inf.resource.plural}")
        if args.leader_elect:
            identity = args.leader_election_identity
            tg.create_task(
                leases.lead(
                    client,
                    name=args.leader_election_id,
                    namespace=args.leader_election_namespace,
                    identity=identity,
                    work=act,
                    lease_s=args.lease_duration,
                    renew_s=args.renew_deadline,
                    retry_s=args.retry_period,
                ),
                name="leader-election",
            )
        else:
            tg.create_task(act(), name="act")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    level = logging.DEBUG if args.verbosity >= 4 else logging.INFO
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.verbosity < 4:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    SchedulerLoop.verbosity = args.verbosity
    loop = asyncio.new_event_loop()
    task = loop.create_task(run(args), name="reconciler")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        log.info("stopped")
    except component_config.ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    except kube.ClientConfigError as err:
        raise SystemExit(f"error: {err}") from None
    except leases.LeadershipLost as err:
        log.error("%s; exiting so that a restart starts from fresh state", err)
        raise SystemExit(1) from None
    except registry.UnknownExtensionError as err:
        raise SystemExit(f"error: --enabled-extensions: {err}") from None
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


if __name__ == "__main__":
    main()
