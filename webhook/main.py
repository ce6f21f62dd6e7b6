"""Command line of the admission webhook (``koord-queue-webhook``).

Parses flags into a :class:`~webhook.server.ServerConfig`, sets up one-line logging to stderr and
runs the server until SIGTERM. Flag errors (unknown extension, one TLS file without the other) exit
with status 2 and a message before anything listens, so a bad Deployment fails its rollout at once.
At the default verbosity logs never contain object contents; ``-v`` adds denial messages and
tracebacks of internal errors.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.api import names
from koord_queue.shared.api.goparse import INT32_MAX, INT32_MIN
from koord_queue.shared.jobs import registry
from koord_queue.webhook import nativegangs, server

#: Young-generation threshold of the cyclic garbage collector (Python's default is 700). A review
#: allocates a few hundred containers (the parsed body, the patch) and frees all of them by
#: reference counting; with reviews decided in batches, the default threshold made the collector
#: run every few reviews only to rescan live objects and find no garbage.
GC_YOUNG_THRESHOLD = 20_000


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (0-65535), got {value}")
    return value


def _int32(text: str) -> int:
    value = int(text)
    if not INT32_MIN <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be a 32-bit integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="koord-queue-webhook",
        description="koord-queue admission webhook: holds and gates managed jobs, validates queue objects.",
    )
    parser.add_argument(
        "--bind-address", default="0.0.0.0", help="address to listen on (default: %(default)s)"
    )
    parser.add_argument("--port", type=_port, default=9443, help="HTTPS port (default: %(default)s)")
    parser.add_argument(
        "--cert-file", type=Path, help="PEM serving certificate (chain); reloaded when it changes"
    )
    parser.add_argument("--key-file", type=Path, help="PEM private key of --cert-file")
    parser.add_argument(
        "--cert-reload-interval",
        type=float,
        default=10.0,
        help="seconds between checks of the certificate files (default: %(default)s)",
    )
    parser.add_argument(
        "--enabled-extensions",
        default=",".join(registry.DEFAULT_EXTENSIONS),
        help=f"comma-separated job kinds, of: {', '.join(registry.EXTENSIONS)} (default: %(default)s)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE") or names.COMPONENT_NAMESPACE,
        help="the namespace the component is installed in, which names the reconciler's "
        "ServiceAccount (default: $POD_NAMESPACE, else %(default)s; docs/operations.md#install-namespace)",
    )
    parser.add_argument(
        "--reconciler-username",
        default=None,
        help="the only user allowed to resume a queued job (default: the reconciler's ServiceAccount "
        f"in --namespace, system:serviceaccount:<namespace>:{names.RECONCILER_SERVICE_ACCOUNT})",
    )
    parser.add_argument(
        "--status-writers",
        default=",".join(sorted(admission.DEFAULT_STATUS_WRITERS)),
        help="comma-separated users (besides the reconciler) allowed to change the status of a "
        "managed job whose CRD has no status subresource, i.e. the Argo workflow controller's "
        "ServiceAccount (default: %(default)s)",
    )
    parser.add_argument(
        "--max-user-priority",
        type=_int32,
        default=None,
        help="deny a job whose scheduling.x-k8s.io/priority annotation is above this value; keep it "
        "equal to maxUserPriority in the reconciler's KoordQueueConfiguration (default: no cap)",
    )
    parser.add_argument(
        "--native-gang-handoff-file",
        type=Path,
        default=None,
        help="native gang hand-off (docs/compatibility.md#native-gang-hand-off): the mounted key "
        "workloadAPI of the ConfigMap koord-queue-native-gangs the reconciler publishes; workloadRef "
        "is stamped on gang pod templates only while it says scheduling.k8s.io/v1alpha1 "
        "(default: off)",
    )
    _probe_and_scrape_flags(parser)
    parser.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=server.DEFAULT_MAX_BODY_BYTES,
        help="largest AdmissionReview accepted; larger bodies get HTTP 413 (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-delay",
        type=float,
        default=3.0,
        help="seconds to report not-ready before closing on SIGTERM (default: %(default)s)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging (includes denial messages)"
    )
    return parser


def _probe_and_scrape_flags(parser: argparse.ArgumentParser) -> None:
    """The ports the kubelet probes and scrapers reach, apart from the admission port: /metrics over
    mutual TLS by default (docs/operations.md#metrics), health in plain HTTP."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=8080,
        help="/metrics port, HTTPS for clients of --metrics-client-ca only; 0 disables "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-client-ca",
        type=Path,
        default=None,
        help="PEM CA of the clients allowed to scrape /metrics (mutual TLS; re-read when it changes; "
        "while the file is missing every client is refused); without it and without "
        "--metrics-insecure the metrics are not served (docs/operations.md#metrics)",
    )
    parser.add_argument(
        "--metrics-insecure",
        action="store_true",
        help="serve /metrics as plain HTTP to anyone, for local use only",
    )
    parser.add_argument(
        "--health-port",
        type=_port,
        default=8081,
        help="plain-HTTP /healthz and /readyz port for probes, 0 disables (default: %(default)s)",
    )


def parse_config(argv: Sequence[str] | None = None) -> tuple[server.ServerConfig, bool]:
    """The server configuration and the verbosity; exits with status 2 on bad flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.cert_file is None) != (args.key_file is None):
        parser.error("--cert-file and --key-file must be given together")
    if args.metrics_client_ca is not None and args.cert_file is None:
        parser.error("--metrics-client-ca needs TLS: --cert-file and --key-file")
    if args.metrics_client_ca is not None and args.metrics_insecure:
        parser.error("--metrics-client-ca and --metrics-insecure exclude each other")
    try:
        extensions = frozenset(e.strip() for e in args.enabled_extensions.split(",") if e.strip())
        admission_config = admission.AdmissionConfig(
            enabled_extensions=extensions,
            reconciler_username=args.reconciler_username or names.reconciler_username(args.namespace),
            status_writers=frozenset(u.strip() for u in args.status_writers.split(",") if u.strip()),
            max_user_priority=args.max_user_priority,
            native_gangs=nativegangs.PublishedState(args.native_gang_handoff_file)
            if args.native_gang_handoff_file is not None
            else None,
        )
    except registry.UnknownExtensionError as err:
        parser.error(str(err))
    config = server.ServerConfig(
        admission=admission_config,
        host=args.bind_address,
        port=args.port,
        cert_file=args.cert_file,
        key_file=args.key_file,
        metrics_port=args.metrics_port,
        metrics_client_ca=args.metrics_client_ca,
        metrics_insecure=args.metrics_insecure,
        health_port=args.health_port,
        max_body_bytes=args.max_body_bytes,
        cert_reload_interval=args.cert_reload_interval,
        shutdown_delay=args.shutdown_delay,
    )
    return config, bool(args.verbose)


def main(argv: Sequence[str] | None = None) -> int:
    config, verbose = parse_config(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # What start-up created (modules, the adapter registry, ...) lives as long as the process: keep
    # the collector from rescanning it, and let it run less often (see GC_YOUNG_THRESHOLD).
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    try:
        asyncio.run(server.run(config))
    except (OSError, ValueError) as err:  # port in use, unreadable certificate, ...
        logging.getLogger("webhook").error("cannot start: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
