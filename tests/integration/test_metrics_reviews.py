"""The reviews that guard the reconciler's ``/metrics`` pass the leadership gate, and nothing else
does (docs/operations.md#metrics, docs/architecture.md#decision-12-leadership-and-high-availability).

Every replica serves ``/metrics``, so a follower must be able to ask the API server about a
scraper's token. A review stores nothing; the gate still refuses every write, and the reviews are
counted apart from the writes.
"""

from __future__ import annotations

import pytest

from koord_queue.shared import kube
from koord_queue.shared.core import access
from testenv import scraping
from testenv.cluster import LocalCluster

pytestmark = pytest.mark.integration


async def test_a_follower_reviews_tokens_and_still_writes_nothing(
    integration_cluster: LocalCluster, namespace_in: str
) -> None:
    token = scraping.service_account_token(integration_cluster, namespace_in, "reviewed", seconds=600)
    client = await kube.Kube.connect(
        kubeconfig=str(integration_cluster.kubeconfig), leadership=kube.Leadership(leading=False)
    )
    async with client:
        user = access.reviewed_user(await client.review(kube.TOKEN_REVIEWS, access.token_review(token)))
        assert user is not None and user.username == f"system:serviceaccount:{namespace_in}:reviewed"
        assert f"system:serviceaccounts:{namespace_in}" in user.groups
        answer = await client.review(kube.SUBJECT_ACCESS_REVIEWS, access.access_review(user))
        assert access.access_verdict(user, answer).outcome is access.Outcome.FORBIDDEN
        forged = await client.review(kube.TOKEN_REVIEWS, access.token_review(token[:-4] + "AAAA"))
        assert access.reviewed_user(forged) is None

        # Only reviews pass: a write is refused before it is sent, and no other kind is a review.
        configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-written"}}
        with pytest.raises(kube.NotLeading):
            await client.create(
                kube.Resource("", "v1", "configmaps", "ConfigMap"), configmap, namespace=namespace_in
            )
        with pytest.raises(ValueError, match="not a review"):
            await client.review(kube.SECRETS, {})
        assert client.requests["REVIEW"] == 3 and client.writes == 0
