"""Keep every pool's root quota and placement (docs/pools.md#the-tree-of-a-pool); the decisions are
in ``shared.core.profiles``.

ElasticQuotaProfiles and Nodes are watched here; ElasticQuota events come from the reconciler's
quota informer (``on_quota``), whose store is read to compare. Each event marks the profiles it
concerns dirty: a profile event its own profile (and every profile of the same name, so a duplicate
is told why it is ignored), a node event every profile whose selector picks the node before or
after the change, a quota event the profile whose root it is. A pass runs ``settle_seconds`` after
the first mark (a timer on the event loop): a hundred nodes joining cost one pass and at most one
write per profile, not one per node.

Nodes are kept slim (labels, allocatable, taints, ``unschedulable`` and whether Ready): a kubelet's
heartbeat changes nothing kept, so it marks nothing.

A pass over a profile (only that counts for its name): label it with its tree id when it has none,
then create its root quota when absent, else merge-patch what differs (our labels and annotations,
``spec.min`` and ``spec.max``; others' labels and annotations are never removed). A failed write
gets a Warning ``CreateQuotaFailed`` or ``UpdateQuotaFailed`` on the profile and is tried again
after ``retry_seconds``. With ``--quota-profiles=false`` nothing is written; :attr:`pools` (each
pool's :class:`PoolPlacement`, with the tolerations of its nodes) is kept either way, and
:meth:`subscribe` callbacks hear every change of it. The passes run on the leader only (the loop
starts in ``act``), where the scheduler and the job path read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from koord_queue.reconciler.events import EventRecorder
from koord_queue.reconciler.informer import Informer
from koord_queue.shared import kube
from koord_queue.shared.api import names
from koord_queue.shared.api.placement import PoolPlacement
from koord_queue.shared.core import profiles as decide

log = logging.getLogger(__name__)

PROFILES = kube.Resource(
    decide.PROFILE_GROUP, decide.PROFILE_VERSION, decide.PROFILE_PLURAL, decide.PROFILE_KIND
)
NODES = kube.Resource("", "v1", "nodes", "Node", namespaced=False)
QUOTAS = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")

PoolsCallback = Callable[[Mapping[str, PoolPlacement]], None]


def slim_node(obj: kube.Obj) -> kube.Obj:
    """Only what a pool reads of a node (``shared.core.profiles.parse_node``): no heartbeat, no
    resourceVersion, so a status update that changes nothing a pool needs compares equal."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = [
        {"type": "Ready", "status": c.get("status")}
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") == "Ready"
    ]
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable") is True, "taints": spec.get("taints") or []},
        "status": {"allocatable": status.get("allocatable") or {}, "conditions": ready},
    }


class ProfileController:
    def __init__(
        self,
        client: kube.Kube,
        events: EventRecorder,
        quotas: Callable[[], Mapping[str, kube.Obj]],
        *,
        write: bool = True,
        settle_seconds: float = 0.2,
        retry_seconds: float = 2.0,
    ) -> None:
        self.client = client
        self.events = events
        self.quotas = quotas
        #: keep root quotas and tree ids (off with --quota-profiles=false)
        self.write = write
        self.settle_seconds = settle_seconds
        self.retry_seconds = retry_seconds
        self.profile_informer = Informer(client, PROFILES, handler=self.on_profile, optional=True)
        self.node_informer = Informer(client, NODES, handler=self.on_node, transform=slim_node)
        self._pools: dict[str, PoolPlacement] = {}
        #: profile key -> the profile as last read; profile key -> the pool name it placed, and
        #: pool name -> the key of the profile whose placement :attr:`pools` shows
        self._parsed: dict[str, decide.Profile] = {}
        self._names: dict[str, str] = {}
        self._sources: dict[str, str] = {}
        self._subscribers: list[PoolsCallback] = []
        self._dirty: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        #: (profile key, reason) -> the last warning given (each is given once until it changes)
        self._warned: dict[tuple[str, str], str] = {}
        self._written = kube.OwnWrites()
        self.passes = 0
        self.writes = 0
        #: set once the first pass has placed every pool (after the caches synced; also when that
        #: pass failed): the scheduler waits for it, so a restart does not park the units of every
        #: pool as "unknown" for the moment before
        self.first_pass = asyncio.Event()

    # --- what others read ------------------------------------------------------------------------

    @property
    def pools(self) -> Mapping[str, PoolPlacement]:
        """Pool name -> its placement, for the profiles that count."""
        return MappingProxyType(self._pools)

    def subscribe(self, callback: PoolsCallback) -> None:
        """Call ``callback`` with the new :attr:`pools` whenever any pool's placement changes."""
        self._subscribers.append(callback)

    def informers(self) -> list[Informer]:
        return [self.profile_informer, self.node_informer]

    # --- events ----------------------------------------------------------------------------------

    def on_profile(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        meta = (new or old or {}).get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        before = self._parsed.pop(key, None)
        touched = {before.name} if before is not None else set()
        if new is not None:
            self._parsed[key] = decide.parse_profile(new)
            touched.add(self._parsed[key].name)
        self._mark(key)
        for other, profile in self._parsed.items():  # the same name elsewhere
            if profile.name in touched:
                self._mark(other)

    def on_node(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        if old == new:
            return
        labels = [((o.get("metadata") or {}).get("labels") or {}) for o in (old, new) if o is not None]
        for key, profile in self._parsed.items():
            if any(decide.selects(profile, ls) for ls in labels):
                self._mark(key)

    def on_quota(self, old: kube.Obj | None, new: kube.Obj | None) -> None:
        meta = (new or old or {}).get("metadata") or {}
        for key, profile in self._parsed.items():
            if profile.namespace == meta.get("namespace") and profile.quota_name == meta.get("name"):
                self._mark(key)

    def _mark(self, key: str) -> None:
        """Queue a profile for the next pass, which starts ``settle_seconds`` after the first mark."""
        self._dirty[key] = None
        if self._timer is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the first pass sees it
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self.settle_seconds, self._wake.set)

    # --- passes ----------------------------------------------------------------------------------

    async def run(self) -> None:
        for informer in self.informers():
            await informer.synced.wait()
        for key in list(self._parsed):
            self._dirty[key] = None
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._timer = None
            try:
                await self.sync_dirty()
            except Exception:  # a bug must not stop the leader's task group
                log.exception("pools: pass failed")
            self.first_pass.set()

    async def sync_dirty(self) -> None:
        """One pass over every profile marked since the last."""
        dirty, self._dirty = list(self._dirty), {}
        self.passes += 1
        counted = decide.counting(self._parsed.values())
        nodes = [decide.parse_node(raw) for raw in self.node_informer.objects.values()]
        pools = dict(self._pools)
        for key in dirty:
            old_name = self._names.pop(key, None)
            if old_name is not None and self._sources.get(old_name) == key:
                del pools[old_name], self._sources[old_name]
            profile, raw = self._parsed.get(key), self.profile_informer.objects.get(key)
            if profile is None or raw is None:
                self._clear(key, *{reason for k, reason in self._warned if k == key})
                continue
            holder = counted[profile.name]
            if holder.key != key:
                message = decide.duplicate_message(profile, holder)
                self._warn(raw, key, decide.DUPLICATE_PROFILE_REASON, message)
                continue
            self._clear(key, decide.DUPLICATE_PROFILE_REASON)
            pools[profile.name] = decide.placement(profile, nodes)
            self._names[key], self._sources[profile.name] = profile.name, key
            if self.write:
                try:
                    await self._keep_root(raw, profile, nodes)
                except Exception:
                    log.exception("pools: profile %s: root quota not kept; will retry", key)
                    self._retry(key)
        if pools != self._pools:
            self._pools = pools
            view = self.pools
            for callback in self._subscribers:
                try:
                    callback(view)
                except Exception:
                    log.exception("pools: a subscriber failed")
        self.first_pass.set()

    def _retry(self, key: str) -> None:
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_later(self.retry_seconds, self._mark, key)

    def _warn(self, raw: kube.Obj, key: str, reason: str, message: str) -> None:
        """A Warning event on the profile, once until the message changes (or it is cleared)."""
        if self._warned.get((key, reason)) == message:
            return
        self._warned[key, reason] = message
        log.warning("ElasticQuotaProfile %s: %s", key, message)
        self.events.record(raw, type_="Warning", reason=reason, message=message)

    def _clear(self, key: str, *reasons: str) -> None:
        """Forget warnings whose cause is gone, so a recurrence is reported again."""
        for reason in reasons:
            self._warned.pop((key, reason), None)

    async def _keep_root(self, raw: kube.Obj, profile: decide.Profile, nodes: list[decide.Node]) -> None:
        """Label the profile with its tree id, then create or patch its root quota."""
        key = profile.key
        if not profile.writable:
            message = "; ".join(profile.problems)
            self._warn(raw, key, decide.INVALID_PROFILE_REASON, f"the root quota is left as it is: {message}")
            return
        if profile.problems:
            self._warn(raw, key, decide.INVALID_PROFILE_REASON, "; ".join(profile.problems))
        else:
            self._clear(key, decide.INVALID_PROFILE_REASON)
        label = decide.tree_id_patch(profile)
        if label is not None:
            try:
                await self.client.patch(PROFILES, profile.name, label, namespace=profile.namespace)
            except kube.KubeError as err:  # the root carries the same id: the label can wait
                log.warning("ElasticQuotaProfile %s: tree id label not written: %s; will retry", key, err)
                self._retry(key)
        want = decide.root_quota(profile, nodes)
        quota_key = f"{want.namespace}/{want.name}"
        existing = self.quotas().get(quota_key)
        if existing is not None and self._written.behind(quota_key, existing):
            return  # the watch has not shown our last write yet; its event marks the profile again
        try:
            if existing is None:
                done = await self._create(want)
            else:
                patch = decide.quota_patch(existing, want)
                if patch is None:  # it shows the pool already
                    done = None
                else:
                    done = await self.client.patch(QUOTAS, want.name, patch, namespace=want.namespace)
        except kube.KubeError as err:
            reason = (
                decide.CREATE_QUOTA_FAILED_REASON if existing is None else decide.UPDATE_QUOTA_FAILED_REASON
            )
            verb = "create" if existing is None else "update"
            self._warn(raw, key, reason, f"failed to {verb} the root quota {quota_key}: {err}")
            self._retry(key)
            return
        self._clear(key, decide.CREATE_QUOTA_FAILED_REASON, decide.UPDATE_QUOTA_FAILED_REASON)
        if done is not None:
            self._written.wrote(quota_key, done)
            self.writes += 1

    async def _create(self, want: decide.RootQuota) -> Any:
        """Create the root quota; one the store did not show yet is patched instead."""
        try:
            return await self.client.create(QUOTAS, decide.quota_body(want), namespace=want.namespace)
        except kube.Conflict as err:
            if err.reason != "AlreadyExists":
                raise
        current = await self.client.get(QUOTAS, want.name, namespace=want.namespace)
        patch = decide.quota_patch(current, want)
        if patch is None:
            return current
        return await self.client.patch(QUOTAS, want.name, patch, namespace=want.namespace)
