"""Hostile-tenant attacks on the metrics endpoints (docs/operations.md#metrics).

The metrics say what runs in the cluster: every team's quota names, queue lengths, who waits. So
neither process serves them to whoever reaches the port: the reconciler answers a bearer token only
after a TokenReview and a SubjectAccessReview for ``get /metrics`` (401 without a token the API
server accepts, 403 without the right), and the webhook speaks only to clients holding a
certificate of its metrics client CA. Mallory (``chaos.tenant``) reaches both ports (the harness's
processes listen on the machine she attacks from; in a cluster she would reach the pods) and tries,
each round:

``scrape-reconciler-metrics-with-own-token``
    the reconciler's ``/metrics`` with no token, a forged one, and a token of her own: a
    ServiceAccount she makes in her namespace, its token from the TokenRequest API as herself
    (when RBAC does not give her that, the harness mints one for a ServiceAccount bound to ``edit``
    in her namespace, as her own deployment's pods would carry);
``bind-the-metrics-reader-to-herself``
    a RoleBinding of ``koord-queue-metrics-reader`` to that ServiceAccount in her namespace (should
    RBAC accept it, the scrape again with its token is the judge), and a ClusterRoleBinding of it
    (a server-side dry run, which must be refused);
``scrape-webhook-metrics-without-its-ca``
    the webhook's ``/metrics`` over TLS with no client certificate, and with one she issued herself.

Every scrape answered 200 is a breach; 401, 403 and a refused TLS handshake are refusals; a port
that is not listening (a fault restarting the process) or a 503 (the API server down, so the
reviews cannot be made) is retried for a while and then skipped. Which ports are the current
processes' metrics ports is read from the machine's listening sockets and the harness's scrape
credentials (``testenv.scraping``): a token marks the reconciler's, a client certificate the
webhook's. A refusal counts only when the harness's own scraper is served on the same port right
after it (the control): a dying process, or a port another program took over, refuses everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from chaos.tenant_common import NAMESPACE, Attacker
from koord_queue.certs import pki
from koord_queue.shared import kube
from testenv import scraping

RECONCILER: Final = "scrape-reconciler-metrics-with-own-token"
BIND: Final = "bind-the-metrics-reader-to-herself"
WEBHOOK: Final = "scrape-webhook-metrics-without-its-ca"
#: attack -> the defence expected to stop it (merged into ``chaos.tenant.ATTACKS``).
ATTACKS: Final[dict[str, str]] = {
    RECONCILER: "reconciler /metrics: TokenReview (no or forged token: 401), then SubjectAccessReview "
    "for get /metrics (a namespace user's token: 403); the right comes only from the ClusterRole "
    "koord-queue-metrics-reader, which the install binds to nobody",
    BIND: "RBAC: a namespace user's edit role writes no RoleBindings or ClusterRoleBindings (and "
    "one who may, a namespace admin, cannot bind a ClusterRole whose rights she lacks); a RoleBinding "
    "grants no non-resource URL anyway, so the scrape stays 403",
    WEBHOOK: "webhook /metrics: mutual TLS, only client certificates of --metrics-client-ca",
}
SERVICE_ACCOUNT: Final = "mallory-scraper"
READER_BINDING: Final = "mallory-metrics-reader"
FORGED_TOKEN: Final = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJtYWxsb3J5In0.forged"
#: How long a scrape is retried while the port is closed or the reviews cannot be made.
RETRY_S: Final = 30.0
TCP_TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN: Final = "0A"
#: local addresses a loopback client reaches: 127.0.0.1, 0.0.0.0, ::, ::1 (as /proc/net/tcp* write them)
_REACHABLE: Final = frozenset(
    {
        "0100007F",
        "00000000",
        "00000000000000000000000000000000",
        "00000000000000000000000001000000",
    }
)
SA_RESOURCE: Final = kube.Resource("", "v1", "serviceaccounts", "ServiceAccount")
_RBAC: Final = "rbac.authorization.k8s.io"
ROLE_BINDINGS: Final = kube.Resource(_RBAC, "v1", "rolebindings", "RoleBinding")
CLUSTER_ROLE_BINDINGS: Final = kube.Resource(_RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False)


def listening_ports(tables: Iterable[str]) -> set[int]:
    """Ports in the LISTEN state on an address a loopback client reaches, from the text of
    ``/proc/net/tcp`` and ``/proc/net/tcp6``."""
    ports: set[int] = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _LISTEN or ":" not in fields[1]:
                continue
            address, port = fields[1].rsplit(":", 1)
            if address in _REACHABLE:
                with contextlib.suppress(ValueError):
                    ports.add(int(port, 16))
    return ports


def metrics_ports(listening: Iterable[int]) -> tuple[int | None, int | None]:
    """``(reconciler, webhook)``: among ``listening``, the ports the harness scrapes with a token and
    with a client certificate (the highest when several: the newest process's port is no likelier
    either way, any live one will do)."""
    reconciler = webhook = None
    for port in sorted(listening):
        found = scraping.credentials(port)
        if found is None:
            continue
        if found.token:
            reconciler = port
        elif found.client_cert is not None:
            webhook = port
    return reconciler, webhook


def verdict(answers: dict[str, int | str]) -> tuple[str, str]:
    """The outcome of a set of tries (what -> HTTP status, or a word for a refused handshake):
    a 200 anywhere is a breach; every try a 401, a 403 or ``tls-refused`` is a refusal; anything
    else (a try that never got an answer) leaves the attack unjudged."""
    shown = ", ".join(f"{what}: {answer}" for what, answer in answers.items())
    if any(answer == 200 for answer in answers.values()):
        return "SUCCEEDED", f"served the metrics ({shown})"
    if answers and all(answer in (401, 403, "tls-refused") for answer in answers.values()):
        return "refused", shown
    return "skipped", f"no answer to judge ({shown})"


def _read_tables() -> list[str]:
    tables = []
    for path in TCP_TABLES:
        with contextlib.suppress(OSError):
            tables.append(Path(path).read_text())
    return tables


def _ports() -> tuple[int | None, int | None]:
    return metrics_ports(listening_ports(_read_tables()))


def _scrape(port: int, context: ssl.SSLContext, token: str | None) -> int | str:
    """One GET /metrics over TLS: the HTTP status, ``tls-refused`` when the server refused the
    handshake or closed it before answering, ``closed`` when nothing listens."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)
    except urllib.error.URLError as err:
        if isinstance(err.reason, ssl.SSLError | ConnectionResetError):
            return "tls-refused"
        return "closed"
    except ssl.SSLError:
        return "tls-refused"
    except (ConnectionResetError, http.client.RemoteDisconnected):
        return "tls-refused"
    except OSError:
        return "closed"


async def _settled(which: int, context: ssl.SSLContext, token: str | None) -> int | str | None:
    """A scrape of the current process (``which``: 0 reconciler, 1 webhook), retried for
    :data:`RETRY_S` while it cannot be judged: no port (restarting), ``closed``, 503 (the reviews
    cannot be made), or a refusal the control scrape does not confirm. The last answer then comes
    back as ``unconfirmed ...``, which :func:`verdict` does not count as a refusal."""
    deadline = time.monotonic() + RETRY_S
    answer: int | str | None = None
    while time.monotonic() < deadline:
        port = (await asyncio.to_thread(_ports))[which]
        if port is not None:
            answer = await asyncio.to_thread(_scrape, port, context, token)
            if answer == 200:
                return answer  # served: a breach whoever listens there (a finding to look into)
            # A refusal counts only when the harness's own scraper is served on that port right
            # after: a refusal by a dying process, or by a port some other program took over,
            # proves nothing.
            if answer not in ("closed", 503) and await asyncio.to_thread(_control, port):
                return answer
        await asyncio.sleep(1.0)
    return None if answer is None else f"unconfirmed {answer}"


def _control(port: int) -> bool:
    """The harness's scraper (``testenv.scraping``) reads ``port``'s metrics."""
    try:
        return "koord_queue_build_info" in scraping.metrics_text(port, timeout=10)
    except (OSError, http.client.HTTPException):
        return False


def _unverified() -> ssl.SSLContext:
    """As a scraper reads the reconciler's self-issued certificate (``insecure_skip_verify``)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def own_token(t: Attacker) -> tuple[str | None, str]:
    """A token of a ServiceAccount in her namespace, bound to ``edit`` there by the harness (what the
    pods of her own deployments would carry, and what lets the token read her own namespace, the
    in-cluster dashboard attack's control): asked for as herself; when RBAC does not let her, minted
    by the harness. Returns ``(token, how)``; no token when neither worked."""
    m = t.mallory
    assert m is not None
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}}
    created = await t.send(lambda: m.create(SA_RESOURCE, account, namespace=NAMESPACE))
    edit = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{SERVICE_ACCOUNT}-edit"},
        "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
    }
    with contextlib.suppress(kube.Conflict):
        await t.admin.create(ROLE_BINDINGS, edit, namespace=NAMESPACE)
    path = SA_RESOURCE.path(NAMESPACE, SERVICE_ACCOUNT) + "/token"
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600},
    }
    sent = await t.send(functools.partial(m.request, "POST", path, body=request), rbac_allows=False)
    token = str((sent.obj.get("status") or {}).get("token") or "")
    if sent.status == "accepted" and token:
        return token, "her own token (TokenRequest as herself)"
    why = sent.message or created.message
    with contextlib.suppress(kube.Conflict):
        await t.admin.create(SA_RESOURCE, account, namespace=NAMESPACE)
    try:
        minted = await t.admin.request("POST", path, body=request)
    except kube.KubeError as err:
        return None, f"no token: she was refused ({why}) and the harness failed ({err})"
    token = str((minted.get("status") or {}).get("token") or "")
    return token or None, f"a token of her namespace's ServiceAccount (TokenRequest refused her: {why[:120]})"


def _reader_binding(cluster_wide: bool) -> kube.Obj:
    meta: dict[str, str] = {"name": READER_BINDING if not cluster_wide else f"{READER_BINDING}-{NAMESPACE}"}
    return {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRoleBinding" if cluster_wide else "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": scraping.READER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
    }


async def metrics_attacks(t: Attacker, r: int) -> None:
    """The module's attacks for round ``r``."""
    m = t.mallory
    assert m is not None
    port, _ = await asyncio.to_thread(_ports)
    target = f"reconciler :{port}/metrics"
    token, how = await own_token(t)
    answers: dict[str, int | str] = {}
    for what, offered in (("no token", None), ("forged token", FORGED_TOKEN), ("own token", token)):
        if what == "own token" and offered is None:
            continue
        answer = await _settled(0, _unverified(), offered)
        if answer is not None:
            answers[what] = answer
    outcome, detail = verdict(answers)
    t.record(RECONCILER, r, target, outcome, f"{detail}; {how}")

    # The reader role bound to herself: in her namespace (a real write: the scrape after it is the
    # judge), and cluster-wide (a dry run: it must be refused outright).
    binding = await t.send(
        lambda: m.create(ROLE_BINDINGS, _reader_binding(False), namespace=NAMESPACE), rbac_allows=False
    )
    cluster_wide = await t.send(
        lambda: m.request(
            "POST",
            CLUSTER_ROLE_BINDINGS.path(None),
            body=_reader_binding(True),
            query={"dryRun": "All"},
        ),
        rbac_allows=False,
    )
    try:
        if cluster_wide.status == "accepted":
            t.record(
                BIND, r, "ClusterRoleBinding", "SUCCEEDED", "accepted (a dry run): she bound the reader role"
            )
        elif cluster_wide.status == "refused":
            t.record(BIND, r, "ClusterRoleBinding", "refused", cluster_wide.message)
        else:
            t.record(BIND, r, "ClusterRoleBinding", "skipped", cluster_wide.message)
        if binding.status == "refused":
            t.record(BIND, r, f"RoleBinding {NAMESPACE}/{READER_BINDING}", "refused", binding.message)
        elif binding.status in ("accepted", "exists") and token is not None:
            answer = await _settled(0, _unverified(), token)
            outcome, detail = verdict(
                {"own token after the RoleBinding": answer} if answer is not None else {}
            )
            if outcome == "refused":
                outcome = "neutralised"
                detail = f"the RoleBinding was accepted; the scrape stayed refused ({detail})"
            t.record(BIND, r, f"RoleBinding {NAMESPACE}/{READER_BINDING}", outcome, detail)
        else:
            t.record(BIND, r, f"RoleBinding {NAMESPACE}/{READER_BINDING}", "skipped", binding.message or how)
    finally:
        if binding.status in ("accepted", "exists"):
            with contextlib.suppress(kube.KubeError):
                await t.admin.delete(ROLE_BINDINGS, READER_BINDING, namespace=NAMESPACE)

    await _webhook(t, r)


async def _webhook(t: Attacker, r: int) -> None:
    """The webhook's /metrics with no client certificate and with one of her own CA."""
    _, port = await asyncio.to_thread(_ports)
    answers: dict[str, int | str] = {}
    bare = _unverified()
    answer = await _settled(1, bare, None)
    if answer is not None:
        answers["no client certificate"] = answer
    now = datetime.now(UTC)
    ca = pki.new_ca(common_name="mallory", now=now)
    pair = pki.issue_client(ca=ca, common_name="prometheus", now=now)
    with tempfile.TemporaryDirectory(prefix="mallory-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        pki.write_pem(cert, pair.cert_pem, private=False)
        pki.write_pem(key, pair.key_pem, private=True)
        own = _unverified()
        own.load_cert_chain(cert, key)
        answer = await _settled(1, own, None)
    if answer is not None:
        answers["her own client certificate"] = answer
    outcome, detail = verdict(answers)
    t.record(WEBHOOK, r, f"webhook :{port}/metrics", outcome, detail)
