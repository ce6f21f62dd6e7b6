"""The visibility server's TLS and aggregator authentication over real sockets, its namespaced
answers (what a namespace user may see), its discovery document, and its flags.

``reconciler.visibility.make_app`` is served on 127.0.0.1 with ``ServingTLS.listening``, exactly as
the reconciler does. Certificates come from ``certs.pki``: a serving pair for the Service's DNS name
(the name the aggregator dials) and front-proxy client certificates from a requestheader CA. The
cluster side (Secret, ConfigMap) is a stub with the API's shapes, so the follower loop is tested
here too; tests/integration/test_visibility.py does the same against the real apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from koord_queue.certs import bundle, pki
from koord_queue.reconciler import main, visibility
from koord_queue.reconciler.visibility import RequestHeader, ServingTLS, Unauthorized
from koord_queue.shared import kube
from koord_queue.shared.api import parsing
from koord_queue.shared.api.names import QUOTA_NAMESPACES_ANNOTATION
from koord_queue.shared.core import visibility as answers
from koord_queue.shared.core.scheduling import Admit, Cache
from tests.unit.test_model import queue, quota, unit

NOW = datetime.now(UTC)
SERVICE, NAMESPACE = "koord-queue-visibility-server", "koord-queue"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"
DISCOVERY = "/apis/visibility.koord-queue.x-k8s.io/v1alpha1"


def serving_pair(ca_name: str = "visibility-ca") -> tuple[pki.KeyPair, pki.KeyPair]:
    ca = pki.new_ca(common_name=ca_name, now=NOW)
    names = bundle.service_dns_names(SERVICE, NAMESPACE)
    return ca, pki.issue_serving(ca=ca, common_name=names[0], dns_names=names, now=NOW)


class FrontProxy:
    """A requestheader CA and client certificates from it."""

    def __init__(self, name: str = "front-proxy-ca") -> None:
        self.ca = pki.new_ca(common_name=name, now=NOW)

    def client(self, common_name: str = "front-proxy-client") -> pki.KeyPair:
        return pki.issue_client(ca=self.ca, common_name=common_name, now=NOW)

    def requestheader(self, *allowed: str) -> RequestHeader:
        return RequestHeader(client_ca_pem=self.ca.cert_pem, allowed_names=frozenset(allowed))


@contextlib.asynccontextmanager
async def served(
    tls: ServingTLS | None, *, cache: Callable[[], Cache] = Cache, **kwargs: Any
) -> AsyncIterator[int]:
    runner = web.AppRunner(visibility.make_app(cache, tls=tls, **kwargs))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.listening if tls else None)
        await site.start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def get(
    port: int,
    tmp_path: Path,
    *,
    server_ca: pki.KeyPair | None,
    client: pki.KeyPair | None = None,
    user: str | None = "alice",
) -> tuple[int, dict[str, Any]]:
    """GET discovery the way the aggregator does: SNI and verification for ``<svc>.<ns>.svc``."""
    ctx: ssl.SSLContext | None = None
    if server_ca is not None:
        ctx = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
    if ctx is not None and client is not None:
        pki.write_pem(tmp_path / "client.crt", client.cert_pem, private=False)
        pki.write_pem(tmp_path / "client.key", client.key_pem, private=True)
        ctx.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    scheme = "https" if ctx is not None else "http"
    headers = {"X-Remote-User": user} if user else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{scheme}://127.0.0.1:{port}{DISCOVERY}",
            ssl=ctx if ctx is not None else False,
            server_hostname=SERVER_NAME if ctx is not None else None,
            headers=headers,
        ) as resp,
    ):
        return resp.status, await resp.json()


async def served_serial(port: int, server_ca: pki.KeyPair, client: pki.KeyPair, tmp_path: Path) -> int:
    ctx = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
    pki.write_pem(tmp_path / "c.crt", client.cert_pem, private=False)
    pki.write_pem(tmp_path / "c.key", client.key_pem, private=True)
    ctx.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=SERVER_NAME)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return int(x509.load_der_x509_certificate(der).serial_number)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


# --- requestheader (pure) -------------------------------------------------------------------------


def test_the_apiservers_configmap_is_parsed_as_it_writes_it() -> None:
    front = FrontProxy()
    data = {
        "client-ca-file": "-----BEGIN CERTIFICATE-----\nnot ours\n-----END CERTIFICATE-----\n",
        "requestheader-client-ca-file": front.ca.cert_pem.decode(),
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }

    parsed = RequestHeader.from_configmap(data)

    assert parsed is not None
    assert parsed.client_ca_pem.strip() == front.ca.cert_pem.strip()
    assert parsed.allowed_names == {"front-proxy-client"}
    assert parsed.username_headers == ("X-Remote-User",)


def test_a_configmap_without_requestheader_ca_or_with_odd_lists_falls_back_safely() -> None:
    assert RequestHeader.from_configmap({"client-ca-file": "x"}) is None
    parsed = RequestHeader.from_configmap(
        {
            "requestheader-client-ca-file": "PEM",
            "requestheader-allowed-names": "not json",
            "requestheader-username-headers": '[1, "", "X-User"]',
        }
    )
    assert parsed is not None
    assert parsed.allowed_names == frozenset()  # unparsable: any certificate from the CA
    assert parsed.username_headers == ("X-User",)
    defaults = RequestHeader.from_configmap({"requestheader-client-ca-file": "PEM"})
    assert defaults is not None and defaults.username_headers == ("X-Remote-User",)


def _peer(common_name: str) -> dict[str, Any]:
    return {"subject": ((("organizationName", "x"),), (("commonName", common_name),))}


def test_the_user_is_the_first_username_header_of_an_allowed_client() -> None:
    rh = RequestHeader(
        client_ca_pem=b"", allowed_names=frozenset({"front-proxy-client"}), username_headers=("A", "B")
    )
    assert rh.user(_peer("front-proxy-client"), {"A": "alice", "B": "bob"}) == "alice"
    assert rh.user(_peer("front-proxy-client"), {"A": "  ", "B": "bob"}) == "bob"
    with pytest.raises(Unauthorized, match="no user"):
        rh.user(_peer("front-proxy-client"), {})
    with pytest.raises(Unauthorized, match="allowed names"):
        rh.user(_peer("intruder"), {"A": "alice"})
    with pytest.raises(Unauthorized, match="client certificate"):
        rh.user(None, {"A": "alice"})
    # No allowed names: any certificate the CA verified.
    assert RequestHeader(client_ca_pem=b"").user(_peer("anyone"), {"X-Remote-User": "carol"}) == "carol"


# --- TLS and authentication over sockets ----------------------------------------------------------


async def test_only_the_aggregators_client_naming_a_user_is_served(tmp_path: Path) -> None:
    server_ca, pair = serving_pair()
    front = FrontProxy()
    tls = ServingTLS(client_auth=True)
    async with served(tls) as port:
        # Nothing to present yet: every handshake fails.
        with pytest.raises(aiohttp.ClientError):
            await get(port, tmp_path, server_ca=server_ca, client=front.client())
        assert tls.update(serving=pair, requestheader=None) is False  # still no requestheader CA
        assert tls.update(serving=None, requestheader=front.requestheader("front-proxy-client"))
        assert tls.ready

        status, body = await get(port, tmp_path, server_ca=server_ca, client=front.client())
        assert status == 200 and body["kind"] == "APIResourceList"
        status, body = await get(port, tmp_path, server_ca=server_ca, client=front.client(), user=None)
        assert (status, body["reason"]) == (401, "Unauthorized")
        status, body = await get(port, tmp_path, server_ca=server_ca, client=front.client("intruder"))
        assert status == 401 and "allowed names" in body["message"]
        with pytest.raises(aiohttp.ClientError):  # a certificate from another CA
            await get(port, tmp_path, server_ca=server_ca, client=FrontProxy("other").client())
        with pytest.raises(aiohttp.ClientError):  # no certificate at all
            await get(port, tmp_path, server_ca=server_ca, client=None)


async def test_rotations_take_effect_for_new_connections_without_a_restart(tmp_path: Path) -> None:
    server_ca, pair = serving_pair()
    front = FrontProxy()
    tls = ServingTLS(client_auth=True)
    tls.update(serving=pair, requestheader=front.requestheader())
    async with served(tls) as port:
        first = x509.load_pem_x509_certificate(pair.cert_pem).serial_number
        assert await served_serial(port, server_ca, front.client(), tmp_path) == first

        # A reissued serving certificate (here under a new CA, the harder case).
        new_ca, new_pair = serving_pair("visibility-ca-2")
        assert tls.update(serving=new_pair, requestheader=None)
        second = x509.load_pem_x509_certificate(new_pair.cert_pem).serial_number
        assert await served_serial(port, new_ca, front.client(), tmp_path) == second
        with pytest.raises(aiohttp.ClientError):  # the old CA no longer verifies the server
            await get(port, tmp_path, server_ca=server_ca, client=front.client())

        # A rotated requestheader CA: its clients are accepted, the old CA's are not.
        new_front = FrontProxy("front-proxy-ca-2")
        assert tls.update(serving=None, requestheader=new_front.requestheader())
        status, _ = await get(port, tmp_path, server_ca=new_ca, client=new_front.client())
        assert status == 200
        with pytest.raises(aiohttp.ClientError):
            await get(port, tmp_path, server_ca=new_ca, client=front.client())

        # Nothing new (or nothing at all from the cluster) keeps what is in force.
        assert tls.update(serving=new_pair, requestheader=None) is False
        assert tls.update(serving=None, requestheader=None) is False
        # Material that does not load is refused and the last good context stays.
        broken = pki.KeyPair(cert_pem=new_pair.cert_pem, key_pem=pair.key_pem)
        with pytest.raises(ssl.SSLError):
            tls.update(serving=broken, requestheader=None)
        assert await served_serial(port, new_ca, new_front.client(), tmp_path) == second


async def test_without_a_client_ca_tls_is_served_to_anyone_and_without_tls_plain_http(
    tmp_path: Path,
) -> None:
    server_ca, pair = serving_pair()
    tls = ServingTLS(client_auth=False)
    tls.update(serving=pair, requestheader=None)
    async with served(tls) as port:
        assert (await get(port, tmp_path, server_ca=server_ca, user=None))[0] == 200
        # TLS 1.2 too (the chaos run's probe matrix): the swapped context carries the certificate.
        tls12 = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls12, server_hostname=SERVER_NAME)
        cipher, version, _ = writer.get_extra_info("cipher")
        writer.close()
        await writer.wait_closed()
        assert version == "TLSv1.2" and cipher.startswith("ECDHE-ECDSA-")
    async with served(None) as port:
        assert (await get(port, tmp_path, server_ca=None, user=None))[0] == 200


async def test_static_files_are_loaded_once_with_an_optional_client_ca(tmp_path: Path) -> None:
    server_ca, pair = serving_pair()
    front = FrontProxy()
    for name, data in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem), ("ca.crt", front.ca.cert_pem)):
        pki.write_pem(tmp_path / name, data, private=name.endswith(".key"))
    tls = visibility.static_tls(
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        client_ca=str(tmp_path / "ca.crt"),
        allowed_names=frozenset({"front-proxy-client"}),
    )
    assert tls.ready and tls.client_auth
    async with served(tls) as port:
        assert (await get(port, tmp_path, server_ca=server_ca, client=front.client()))[0] == 200
        assert (await get(port, tmp_path, server_ca=server_ca, client=front.client("x")))[0] == 401


# --- the follower every replica runs --------------------------------------------------------------


class StubCluster:
    """``kube.Kube.get`` for the Secret and the apiserver's ConfigMap, nothing else."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.fail = False

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        if self.fail:
            raise kube.KubeError(503, "ServiceUnavailable", "apiserver down")
        try:
            return self.objects[(res.plural, namespace or "", name)]
        except KeyError:
            raise kube.NotFound(404, "NotFound", name) from None

    def put_secret(self, ca: pki.KeyPair, pair: pki.KeyPair) -> None:
        data = bundle.secret_data(ca=ca, serving=pair)
        self.objects[("secrets", NAMESPACE, "vis-cert")] = {"data": data}

    def put_configmap(self, front: FrontProxy) -> None:
        data = {
            "requestheader-client-ca-file": front.ca.cert_pem.decode(),
            "requestheader-allowed-names": '["front-proxy-client"]',
        }
        key = ("configmaps", "kube-system", "extension-apiserver-authentication")
        self.objects[key] = {"data": data}


async def test_every_replica_follows_the_secret_and_the_published_requestheader_ca(tmp_path: Path) -> None:
    cluster = StubCluster()
    tls = ServingTLS(client_auth=True)

    def follow() -> Any:
        return visibility.follow_cluster(
            tls,
            cluster,  # type: ignore[arg-type]
            namespace=NAMESPACE,
            secret="vis-cert",
            requestheader=None,
            interval_s=0.02,
        )

    async def until(check: Any) -> None:
        for _ in range(500):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async with served(tls, background=follow) as port:
        await asyncio.sleep(0.05)
        assert not tls.ready  # neither the Secret nor the ConfigMap exists yet
        server_ca, pair = serving_pair()
        front = FrontProxy()
        cluster.put_secret(server_ca, pair)
        cluster.put_configmap(front)
        await until(lambda: tls.ready)
        assert (await get(port, tmp_path, server_ca=server_ca, client=front.client()))[0] == 200

        cluster.fail = True  # an apiserver outage keeps the certificate in force
        await asyncio.sleep(0.05)
        assert (await get(port, tmp_path, server_ca=server_ca, client=front.client()))[0] == 200
        cluster.fail = False

        # The leader reissues the serving certificate under the same CA: every replica follows.
        reissued = pki.issue_serving(ca=server_ca, common_name=SERVICE, dns_names=[SERVER_NAME], now=NOW)
        cluster.put_secret(server_ca, reissued)
        await until(lambda: tls.serving == reissued)
        assert (await get(port, tmp_path, server_ca=server_ca, client=front.client()))[0] == 200


# --- what a namespace user sees --------------------------------------------------------------------


def two_tenants() -> Cache:
    """Queues team-a and team-b (one cpu each, nothing admitted yet) with units of namespaces a and b.

    team-a holds a/high (1), b/mid (2), a/low (3); team-b holds b/other (1), a/solo (2).
    """
    cache = Cache()
    for name in ("team-a", "team-b"):
        cache.put_quota(quota(name, cpu="1"))
        cache.put_queue(queue(name).build())
    for name, namespace, queue_name, priority in (
        ("high", "a", "team-a", 10),
        ("mid", "b", "team-a", 5),
        ("low", "a", "team-a", 1),
        ("other", "b", "team-b", 3),
        ("solo", "a", "team-b", 1),
    ):
        cache.put_unit(unit(name, namespace).quota(queue_name).priority(priority).cpu("1").build())
    return cache


def listed(body: dict[str, Any]) -> list[tuple[str, str, str, int]]:
    return [
        (i["metadata"]["namespace"], i["metadata"]["name"], i["queueName"], i["position"])
        for i in body["items"]
    ]


def test_a_namespace_sees_its_own_waiting_units_across_queues_with_global_positions() -> None:
    cache = two_tenants()

    mine = answers.namespace_units(cache.state, cache.units, "a", {})

    assert mine["kind"] == "QueueUnitsSummary" and mine["metadata"]["total"] == 3
    assert listed(mine) == [("a", "high", "team-a", 1), ("a", "low", "team-a", 3), ("a", "solo", "team-b", 2)]
    assert listed(answers.namespace_units(cache.state, cache.units, "b", {"offset": "1"})) == [
        ("b", "other", "team-b", 1)
    ]
    assert answers.namespace_units(cache.state, cache.units, "nobody", {})["items"] == []


def test_a_queue_seen_from_a_namespace_lists_only_that_namespace_at_its_place_in_the_queue() -> None:
    cache = two_tenants()

    everyone = answers.queue_units(cache.state, cache.units, "team-a", {})
    only_b = answers.queue_units(cache.state, cache.units, "team-a", {}, namespace="b")

    assert listed(everyone) == [
        ("a", "high", "team-a", 1),
        ("b", "mid", "team-a", 2),
        ("a", "low", "team-a", 3),
    ]
    assert listed(only_b) == [("b", "mid", "team-a", 2)] and only_b["metadata"]["total"] == 1
    assert answers.queue_units(cache.state, cache.units, "team-b", {}, namespace="c")["items"] == []
    with pytest.raises(answers.NotFound):
        answers.queue_units(cache.state, cache.units, "no-such-queue", {}, namespace="a")


@pytest.mark.parametrize("namespace", ["", "A", "a/b", "a_b", "-a", "a-", "a.b", "x" * 64, "a\n"])
def test_a_path_that_cannot_name_a_namespace_is_refused(namespace: str) -> None:
    """The apiserver authorized the path's namespace segment verbatim; we must read the same one."""
    cache = two_tenants()
    with pytest.raises(answers.BadRequest, match="namespace name"):
        answers.namespace_units(cache.state, cache.units, namespace, {})
    with pytest.raises(answers.BadRequest, match="namespace name"):
        answers.queue_units(cache.state, cache.units, "team-a", {}, namespace=namespace)


def test_discovery_lists_each_resource_once_with_a_scope_its_parent_agrees_with() -> None:
    """The apiserver's aggregated discovery refuses a group whose subresource and parent (real or
    implied by another subresource) disagree on scope; kubectl would then warn on every call."""
    resources = answers.discovery()["resources"]
    names = [r["name"] for r in resources]
    assert len(names) == len(set(names))
    scope = {r["name"]: r["namespaced"] for r in resources}
    assert scope == {
        "queues/queueunits": True,
        "elasticquotas/queueunits": False,
        "queueunits": True,
        "quotas": True,
    }
    parents: dict[str, bool] = {n: v for n, v in scope.items() if "/" not in n}
    for name, namespaced in scope.items():
        parent = name.split("/", 1)[0]
        if "/" in name:
            assert parents.setdefault(parent, namespaced) == namespaced, name
    verbs = {r["name"]: r["verbs"] for r in resources}
    # What the apiserver checks: GET of a collection path is ``list``, of a named object ``get``.
    assert verbs == {
        "queues/queueunits": ["get"],
        "elasticquotas/queueunits": ["get"],
        "queueunits": ["list"],
        "quotas": ["list"],
    }
    kinds = {r["name"]: r["kind"] for r in resources}
    assert kinds.pop("quotas") == "QuotaSummary"
    assert set(kinds.values()) == {"QueueUnitsSummary"}


async def get_json(port: int, path: str) -> tuple[int, dict[str, Any] | str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{DISCOVERY}{path}") as resp,
    ):
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, await resp.text()


async def test_the_server_routes_the_namespaced_paths_and_never_answers_past_the_namespace() -> None:
    cache = two_tenants()
    async with served(None, cache=lambda: cache) as port:
        status, body = await get_json(port, "/namespaces/a/queueunits")
        assert status == 200 and isinstance(body, dict)
        assert [i["metadata"]["name"] for i in body["items"]] == ["high", "low", "solo"]

        status, body = await get_json(port, "/namespaces/b/queues/team-a/queueunits?limit=5")
        assert status == 200 and isinstance(body, dict)
        assert listed(body) == [("b", "mid", "team-a", 2)]

        status, body = await get_json(port, "/namespaces/b/queues/missing/queueunits")
        assert status == 404 and isinstance(body, dict) and body["reason"] == "NotFound"
        status, body = await get_json(port, "/namespaces/a/queueunits?limit=0")
        assert status == 400 and isinstance(body, dict) and body["reason"] == "BadRequest"
        status, body = await get_json(port, "/namespaces/Nope/queueunits")
        assert status == 400 and isinstance(body, dict) and "namespace name" in body["message"]
        # An escaped slash is one segment to some parsers and two to others: never an answer.
        for sneaky in ("/namespaces/a%2Fb/queueunits", "/namespaces/b%2F..%2Fa/queueunits"):
            status, body = await get_json(port, sneaky)
            assert status in (400, 404), (sneaky, status, body)

        # The cluster-wide view is unchanged: every namespace.
        status, body = await get_json(port, "/queues/team-a/queueunits")
        assert status == 200 and isinstance(body, dict)
        assert [i["metadata"]["namespace"] for i in body["items"]] == ["a", "b", "a"]


# --- quota figures ----------------------------------------------------------------------------------


def shared_quotas() -> Cache:
    """``mine`` (namespace a, max 4 cpu, min 2) holding 3 cpu; ``lent`` (namespace b, listing a in
    its namespaces annotation) and ``theirs`` (namespace b only), both idle."""
    cache = Cache()
    for name, namespace, extra in (("mine", "a", None), ("lent", "b", '["a"]'), ("theirs", "b", None)):
        annotations = {QUOTA_NAMESPACES_ANNOTATION: extra} if extra else {}
        raw = {
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"min": {"cpu": "2"}, "max": {"cpu": "4"}},
        }
        cache.put_quota(parsing.parse_quota(raw))
        cache.put_queue(queue(name).build())
    for i in range(3):
        cache.put_unit(unit(f"u{i}", "a").quota("mine").cpu("1").build())
    cache.put_unit(unit("waits", "a").quota("mine").cpu("2").build())
    for decision in cache.schedule(1000.0).decisions:
        if isinstance(decision, Admit):
            cache.assume(decision, now=1000.0)
    return cache


def test_quota_figures_cluster_wide_list_every_quota_and_a_namespace_only_its_bound_quotas() -> None:
    cache = shared_quotas()

    everything = answers.quotas(cache.ledger, cache.state, {})
    assert everything["kind"] == "QuotaSummary" and everything["metadata"]["total"] == 3
    assert [i["metadata"] for i in everything["items"]] == [
        {"name": "lent", "namespace": "b"},
        {"name": "mine", "namespace": "a"},
        {"name": "theirs", "namespace": "b"},
    ]
    mine = everything["items"][1]
    assert (mine["min"], mine["max"], mine["used"], mine["borrowed"]) == (
        {"cpu": "2"},
        {"cpu": "4"},
        {"cpu": "3"},
        {"cpu": "1"},
    )
    # Top-level: runtime = request = usage plus the waiting 2 cpu, capped at max.
    assert (mine["request"], mine["runtime"]) == ({"cpu": "4"}, {"cpu": "4"})

    seen_from_a = answers.quotas(cache.ledger, cache.state, {}, namespace="a")
    assert [i["metadata"]["name"] for i in seen_from_a["items"]] == ["lent", "mine"]
    seen_from_b = answers.quotas(cache.ledger, cache.state, {"limit": "1"}, namespace="b")
    assert [i["metadata"]["name"] for i in seen_from_b["items"]] == ["lent"]
    assert seen_from_b["metadata"]["total"] == 2
    assert answers.quotas(cache.ledger, cache.state, {}, namespace="nobody")["items"] == []
    with pytest.raises(answers.BadRequest, match="namespace name"):
        answers.quotas(cache.ledger, cache.state, {}, namespace="a/b")


async def test_the_server_routes_the_quota_figures() -> None:
    cache = shared_quotas()
    async with served(None, cache=lambda: cache) as port:
        status, body = await get_json(port, "/quotas")
        assert status == 200 and isinstance(body, dict) and body["metadata"]["total"] == 3
        status, body = await get_json(port, "/namespaces/a/quotas")
        assert status == 200 and isinstance(body, dict)
        assert [i["metadata"]["name"] for i in body["items"]] == ["lent", "mine"]
        status, body = await get_json(port, "/namespaces/Nope/quotas")
        assert status == 400 and isinstance(body, dict) and body["reason"] == "BadRequest"


# --- flags ----------------------------------------------------------------------------------------


def test_visibility_flags_defaults_and_conflicts(capsys: pytest.CaptureFixture[str]) -> None:
    args = main.parse_args(["--manage-visibility-certs"])
    assert (args.visibility_service, args.visibility_secret, args.visibility_apiservice) == (
        SERVICE,
        "koord-queue-visibility-cert",
        "v1alpha1.visibility.koord-queue.x-k8s.io",
    )
    assert args.cert_sync_interval == 60.0
    for bad in (
        ["--manage-visibility-certs", "--visibility-cert-file=a", "--visibility-key-file=b"],
        ["--visibility-cert-file=a"],
        ["--visibility-client-ca=ca.crt"],
        ["--cert-sync-interval=0"],
    ):
        with pytest.raises(SystemExit):
            main.parse_args(bad)
        assert "error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main.parse_args(["--help"])
    help_text = capsys.readouterr().out
    for flag in (
        "--manage-visibility-certs",
        "--visibility-service",
        "--visibility-secret",
        "--visibility-apiservice",
        "--visibility-namespace",
        "--visibility-client-ca",
        "--visibility-allowed-names",
        "--cert-sync-interval",
    ):
        assert flag in help_text, flag
