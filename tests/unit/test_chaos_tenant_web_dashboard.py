"""The hostile tenant's attack through the in-cluster web dashboard
(``chaos/tenant_web_dashboard.py``, docs/dashboard.md#installed-in-the-cluster): the real in-cluster
server on a real socket, over plain HTTP, in front of a stand-in API server that answers each token
as RBAC would. Every refusal is refused; a dashboard that serves another namespace to her token is a
breach; no token of hers leaves the try unjudged.

What the real API server refuses is tried against the local control plane by the chaos run itself
(``make chaos QUICK=1``) and by tests/e2e/test_dashboard_incluster.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from chaos import tenant_web_dashboard as web_dashboard
from chaos.tenant_common import NAMESPACE
from chaos.tenant_dashboard import OTHER_NAMESPACE
from koord_queue.shared import kube
from tests.unit.test_chaos_tenant_dashboard import FakeApiServer, FakeAttacker

TOKEN = "her-token"


class FakeTokenClient(FakeApiServer):
    """The API server as one token sees it: her token is a ServiceAccount of her namespace."""

    def __init__(self, token: str, allowed: frozenset[str] | None) -> None:
        super().__init__(allowed)
        self.token = token

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if path.endswith("/selfsubjectreviews"):
            if self.token != TOKEN:
                raise kube.KubeError(401, "Unauthorized", "Unauthorized")
            return {"status": {"userInfo": {"username": f"system:serviceaccount:{NAMESPACE}:web"}}}
        return await super().request(method, path, **kw)

    async def close(self) -> None:
        return None


def run(allowed: frozenset[str] | None, token: str | None = TOKEN) -> tuple[str, str, str]:
    t = FakeAttacker(FakeApiServer(frozenset({NAMESPACE})), FakeApiServer(None))

    def connect(offered: str) -> kube.Kube:
        return cast(kube.Kube, FakeTokenClient(offered, allowed))

    async def token_of(_: Any) -> tuple[str | None, str]:
        return token, "her own token (TokenRequest as herself)" if token else "no token: refused"

    asyncio.run(
        web_dashboard.web_dashboard_attacks(
            t,  # type: ignore[arg-type]
            0,
            connect=connect,
            token_of=token_of,
        )
    )
    return t.records[web_dashboard.IN_CLUSTER]


def test_her_token_through_the_in_cluster_dashboard_is_refused_another_namespace() -> None:
    outcome, detail, target = run(frozenset({NAMESPACE}))
    assert outcome == "refused", detail
    assert detail.startswith(
        "page, no token: 401, page: 403, units: 403, one unit: 403, hold: 403, units, header: 403, "
        "hold, header: 403"
    ), detail
    assert target.startswith(OTHER_NAMESPACE)


def test_a_dashboard_that_serves_another_namespace_to_her_token_is_a_breach() -> None:
    outcome, detail, _ = run(None)  # an API server that refuses her token nothing
    assert outcome == "SUCCEEDED" and "units: 200" in detail


def test_without_a_token_of_hers_the_try_is_unjudged() -> None:
    outcome, detail, _ = run(frozenset({NAMESPACE}), token=None)
    assert outcome == "skipped" and "no token" in detail


def test_a_token_the_api_server_refuses_is_unjudged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_dashboard, "PAUSE", 0.0)  # tried again at once
    outcome, detail, _ = run(frozenset({NAMESPACE}), token="forged")
    assert outcome == "skipped" and "login answered 401" in detail


def test_the_attack_is_in_the_report() -> None:
    from chaos.tenant import ATTACKS

    assert set(web_dashboard.ATTACKS) <= set(ATTACKS)
