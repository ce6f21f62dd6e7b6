"""Leader election: run the reconciler's work only while this replica holds its Lease.

Beside ``shared.kube`` rather than in it: the election is kubernetes-asyncio's own (``LeaseLock``,
client-go semantics) over its ``ApiClient``, which ``Kube.api_client`` builds on first use from the
client's own credentials, and only the reconciler's process runs it
(docs/operations.md#reconciler-flags): nothing else imports kubernetes-asyncio. What it adds is the
coupling to the client's ``Leadership`` gate, so no write of this process can overlap another
leader's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from koord_queue.shared import kube

log = logging.getLogger(__name__)


class LeadershipLost(Exception):
    """The Lease was lost (or could not be renewed in time): stop acting at once."""


async def lead(
    client: kube.Kube,
    *,
    name: str,
    namespace: str,
    identity: str,
    work: Callable[[], Awaitable[None]],
    lease_s: float = 15.0,
    renew_s: float = 10.0,
    retry_s: float = 2.0,
) -> None:
    """Wait for the Lease ``namespace/name``, run ``work`` while holding it; raise when it is lost.

    kubernetes-asyncio's LeaseLock does the election (client-go semantics: a candidate takes over
    a Lease whose holder has not renewed it within ``lease_s``). ``work`` is cancelled the moment
    renewal fails, and :class:`LeadershipLost` is raised so the process exits and restarts with
    fresh state instead of acting on a cache another leader has moved past.

    The client's ``kube.Leadership`` gate follows the Lease: closed while waiting, opened just
    before ``work`` starts, closed again the moment renewal fails (before ``work`` has even seen
    its cancellation), so no write of this process can overlap another leader's.
    """
    from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
    from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

    gate = client.leadership

    async def started() -> None:
        log.info("%s: leading as %s", name, identity)
        gate.acquire()
        try:
            await work()
        finally:
            gate.release()

    async def stopped() -> None:
        gate.release()
        log.warning("%s: leadership lost by %s", name, identity)

    gate.release()
    lock = LeaseLock(name, namespace, identity, client.api_client)
    # The Lease stores whole seconds; the library formats the duration into it as given.
    config = electionconfig.Config(lock, max(1, round(lease_s)), renew_s, retry_s, started, stopped)
    try:
        await leaderelection.LeaderElection(config).run()
    finally:
        gate.release()
    raise LeadershipLost(f"lease {namespace}/{name} lost by {identity}")
