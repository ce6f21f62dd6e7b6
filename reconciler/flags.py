"""The reconciler's command line: its flags, grouped by concern, and the rules across them.

The flags are the reconciler's interface for admins (docs/operations.md#reconciler-flags); the process
(``reconciler/main.py``) only wires parts together from what they say. Kept apart so that each group
reads on its own, and a new flag lands next to the ones it goes with. The groups are added in the
order ``--help`` lists them; ``main.build_parser`` gives the description (its module docstring), so
the help and the docs test read the same parser as the process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from koord_queue.reconciler import visibility
from koord_queue.shared.api import names
from koord_queue.shared.jobs import registry

#: One function per concern, each adding its flags to the parser, in ``--help`` order.
Group = Callable[[argparse.ArgumentParser], None]


def build_parser(description: str | None) -> argparse.ArgumentParser:
    """Every flag of the reconciler, the groups in order."""
    p = argparse.ArgumentParser(
        prog="koord-queue-reconciler",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for group in GROUPS:
        group(p)
    return p


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``argv`` read by ``p``, the install namespace filled in where a namespace flag is unset, and
    flags that exclude or need each other refused with the parser's usage error."""
    args = p.parse_args(argv)
    # One source for the install namespace (docs/operations.md#install-namespace).
    for flag in ("visibility_namespace", "leader_election_namespace", "webhook_namespace"):
        if not getattr(args, flag):
            setattr(args, flag, args.namespace)
    if args.manage_visibility_certs and args.visibility_cert_file:
        p.error("--manage-visibility-certs and --visibility-cert-file exclude each other")
    if bool(args.visibility_cert_file) != bool(args.visibility_key_file):
        p.error("--visibility-cert-file and --visibility-key-file go together")
    if args.visibility_client_ca and not (args.visibility_cert_file or args.manage_visibility_certs):
        p.error("--visibility-client-ca needs TLS: --visibility-cert-file or --manage-visibility-certs")
    if bool(args.metrics_cert_file) != bool(args.metrics_key_file):
        p.error("--metrics-cert-file and --metrics-key-file go together")
    if args.metrics_cert_file and not args.metrics_secure:
        p.error("--metrics-cert-file needs --metrics-secure")
    if args.cert_sync_interval <= 0:
        p.error("--cert-sync-interval must be positive")
    return args


def _cluster(p: argparse.ArgumentParser) -> None:
    """The API server, the install namespace, the configuration file and the job kinds."""
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        help="kubeconfig file (default: $KUBECONFIG, else the in-cluster ServiceAccount)",
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE") or names.COMPONENT_NAMESPACE,
        help="the namespace the component is installed in: its Queues, its ConfigMaps (quota bindings, "
        "native gangs), and the default of every --*-namespace flag (default: $POD_NAMESPACE, else "
        "%(default)s; docs/operations.md#install-namespace)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="KoordQueueConfiguration file (scheduling.k8s.io/v1), e.g. defaultReclaimProtectTime",
    )
    p.add_argument(
        "--enabled-extensions",
        default=",".join(registry.DEFAULT_EXTENSIONS),
        help="job kinds to manage, comma separated (default: %(default)s; known: "
        f"{','.join(registry.EXTENSIONS)})",
    )
    p.add_argument(
        "--as",
        dest="impersonate",
        default="",
        metavar="USER",
        help="act as USER (like kubectl --as), e.g. to run locally with a ServiceAccount's RBAC",
    )
    p.add_argument(
        "--qps", type=float, default=500.0, help="client-side API rate limit (default %(default)s)"
    )
    p.add_argument("--burst", type=int, default=1000, help="client-side API burst (default %(default)s)")
    p.add_argument("--workers", type=int, default=8, help="job-extension workers (default %(default)s)")


def _health_and_metrics(p: argparse.ArgumentParser) -> None:
    """The health port and ``/metrics``, guarded over HTTPS by default (docs/operations.md#metrics)."""
    p.add_argument("--health-port", type=int, default=8081, help="/healthz and /readyz port; 0 disables")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=10259,
        help="Prometheus /metrics port (HTTPS unless --metrics-secure=false); 0 disables",
    )
    p.add_argument(
        "--metrics-secure",
        type=_switch,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="serve /metrics over HTTPS, only to a bearer token that passes a TokenReview and a "
        "SubjectAccessReview for get /metrics (docs/operations.md#metrics); false: plain HTTP to "
        "anyone, for local use only (default %(default)s)",
    )
    p.add_argument(
        "--metrics-cert-file",
        default="",
        help="TLS certificate of /metrics, re-read when it changes (default: a pair this replica "
        "issues itself; scrapers then skip verification)",
    )
    p.add_argument("--metrics-key-file", default="", help="TLS key of --metrics-cert-file")


def _visibility(p: argparse.ArgumentParser) -> None:
    """The visibility API: its port, its TLS from files or managed behind the aggregation layer."""
    p.add_argument(
        "--visibility-port",
        type=int,
        default=8082,
        help="visibility API port (visibility.koord-queue.x-k8s.io); 0 disables",
    )
    p.add_argument(
        "--visibility-cert-file",
        default="",
        help="TLS certificate of the visibility API, loaded once (instead of --manage-visibility-certs)",
    )
    p.add_argument("--visibility-key-file", default="", help="TLS key of the visibility API")
    p.add_argument(
        "--visibility-client-ca",
        default="",
        help="CA of the apiserver's aggregator client certificate (requestheader CA); when set, only "
        "clients presenting such a certificate and an X-Remote-User header are served (default with "
        "--manage-visibility-certs: read from kube-system/extension-apiserver-authentication)",
    )
    p.add_argument(
        "--visibility-allowed-names",
        default="",
        help="common names allowed for the --visibility-client-ca certificate, comma separated "
        "(default: any; with the ConfigMap its requestheader-allowed-names apply)",
    )
    p.add_argument(
        "--manage-visibility-certs",
        action="store_true",
        help="serve the visibility API behind the aggregation layer: the leader issues and rotates "
        "its serving certificate (a Secret) and injects the CA into the APIService; every replica "
        "serves the Secret's certificate and accepts only the apiserver's front-proxy client",
    )
    p.add_argument(
        "--visibility-namespace",
        default=None,
        help="namespace of the visibility Service and Secret (default: --namespace)",
    )
    p.add_argument(
        "--visibility-service",
        default="koord-queue-visibility-server",
        help="visibility Service name, certified as <service>.<namespace>.svc (default %(default)s)",
    )
    p.add_argument(
        "--visibility-secret",
        default="koord-queue-visibility-cert",
        help="visibility certificate Secret (default %(default)s)",
    )
    p.add_argument(
        "--visibility-apiservice",
        default=visibility.APISERVICE,
        help="APIService to inject the visibility CA into (default %(default)s)",
    )


def _shared_by_servers(p: argparse.ArgumentParser) -> None:
    """What the servers and the certificate managers share: the check interval and the address."""
    p.add_argument(
        "--cert-sync-interval",
        type=float,
        default=60.0,
        help="seconds between certificate checks: Secrets and caBundles (leader), the visibility "
        "certificate in force (every replica) (default %(default)s)",
    )
    p.add_argument(
        "--bind-address", default="0.0.0.0", help="address of the health, metrics and visibility servers"
    )


def _leader_election(p: argparse.ArgumentParser) -> None:
    """Several replicas, one acting: the Lease and its timing (docs/operations.md#reconciler-flags)."""
    p.add_argument(
        "--leader-elect",
        action="store_true",
        help="run several replicas: only the holder of the Lease acts, all serve health and metrics",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=None,
        help="namespace of the Lease (default: --namespace)",
    )
    p.add_argument("--leader-election-id", default="koord-queue-reconciler", help="name of the Lease")
    p.add_argument(
        "--leader-election-identity",
        default="",
        help="this replica's identity in the Lease and in its user agent (default: <hostname>_<random>)",
    )
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default %(default)s)")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default %(default)s)")
    p.add_argument("--retry-period", type=float, default=2.0, help="seconds (default %(default)s)")


def _webhook_certs(p: argparse.ArgumentParser) -> None:
    """The webhook's serving certificate, issued and rotated by the leader, and where it goes."""
    p.add_argument(
        "--manage-webhook-certs",
        action="store_true",
        help="issue and rotate the webhook's serving certificate (a Secret) and inject its CA "
        "into the webhook configurations",
    )
    p.add_argument(
        "--webhook-namespace",
        default=None,
        help="namespace of the webhook Service and Secret (default: --namespace)",
    )
    p.add_argument("--webhook-service", default="koord-queue-webhook", help="webhook Service name")
    p.add_argument("--webhook-secret", default="koord-queue-webhook-cert", help="webhook certificate Secret")
    p.add_argument(
        "--webhook-configuration",
        default="koord-queue",
        help="name of the Mutating/ValidatingWebhookConfiguration to inject the CA into",
    )


def _logging(p: argparse.ArgumentParser) -> None:
    """How much the process logs."""
    p.add_argument(
        "-v",
        "--verbosity",
        type=int,
        default=0,
        help="log verbosity: 0 info, 2 scheduling decisions, 4 debug",
    )


def _pools(p: argparse.ArgumentParser) -> None:
    """The flags of node pools (docs/pools.md), added to ``p``."""
    p.add_argument(
        "--quota-profiles",
        type=_switch,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="keep each ElasticQuotaProfile's root quota (docs/pools.md#the-tree-of-a-pool); false where "
        "Koordinator's quota controller keeps them: pools are still read (default %(default)s)",
    )
    p.add_argument(
        "--usage-half-life",
        default=None,
        metavar="DURATION",
        help="half-life of each quota's decayed usage, which orders spare capacity among sibling quotas "
        "(docs/compatibility.md#fair-over-time); 0s turns it off; overrides usageHalfLife of --config "
        "(default: the file's, else 1h)",
    )


def _switch(text: str) -> bool:
    """A boolean flag's value: ``--quota-profiles=false``."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


GROUPS: tuple[Group, ...] = (
    _cluster,
    _health_and_metrics,
    _visibility,
    _shared_by_servers,
    _leader_election,
    _webhook_certs,
    _logging,
    _pools,
)
