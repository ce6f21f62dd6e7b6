"""What ``kubectl koord-queue`` reads and writes, through the project's one API client
(``shared.kube``), and what it could not read.

Every read that may be refused (a namespace user reads only their namespace) is tried widest first
and falls back, and each fallback is written down in ``Gathered.unknowns`` so that the answer says
what it does not know instead of failing. Only a refusal of what a command cannot do without (the
QueueUnits of the namespace asked about, the write of a job annotation) is an error, and it names
the permission: :class:`Denied`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import yaml

from koord_queue.shared import kube
from koord_queue.shared.api import names, quantities
from koord_queue.shared.api.model import QueueConfig, Quota, Unit
from koord_queue.shared.api.parsing import parse_queue, parse_quota, parse_unit
from koord_queue.shared.core import config as component_config
from koord_queue.shared.core import quotaqueues, visibility
from koord_queue.shared.core.replay import ServedStanding
from koord_queue.shared.jobs import registry

Obj = dict[str, Any]

QUEUE_UNITS: Final = kube.Resource(names.GROUP, names.VERSION, names.QUEUEUNIT_PLURAL, "QueueUnit")
QUEUES: Final = kube.Resource(names.GROUP, names.VERSION, names.QUEUE_PLURAL, "Queue")
QUOTAS: Final = kube.Resource(names.QUOTA_GROUP, names.QUOTA_VERSION, names.QUOTA_PLURAL, "ElasticQuota")
CONFIGMAPS: Final = kube.Resource("", "v1", "configmaps", "ConfigMap")
EVENTS: Final = kube.Resource("", "v1", "events", "Event")
DEPLOYMENTS: Final = kube.Resource("apps", "v1", "deployments", "Deployment")
#: The reconciler's Deployment (manifests/reconciler.yaml): its image tag is the server's version.
RECONCILER_DEPLOYMENT: Final = "koord-queue-reconciler"
#: The component configuration the install ships (manifests/config.yaml).
CONFIG_MAP: Final = "koord-queue-config"
CONFIG_KEY: Final = "config.yaml"
VISIBILITY: Final = f"/apis/{visibility.GROUP}/{visibility.VERSION}"
USER_AGENT: Final = "kubectl-koord_queue/0.2.0"


class CliError(Exception):
    """A failure the user should read; ``code`` is the exit status."""

    code = 1


class NotFoundError(CliError):
    code = 3


class Denied(CliError):
    """RBAC refused a request; the message names the permission that is missing."""

    code = 4

    def __init__(self, verb: str, resource: str, group: str, namespace: str | None, detail: str) -> None:
        self.verb, self.resource, self.group, self.namespace = verb, resource, group, namespace
        where = f'in namespace "{namespace}"' if namespace else "cluster-wide"
        full = f"{resource}.{group}" if group else resource
        super().__init__(
            f'permission denied: you may not {verb} "{full}" {where} (missing RBAC permission: '
            f'verb "{verb}" on resource "{resource}" in API group "{group or "core"}" {where}). '
            f"The API server said: {detail}"
        )


class Refused(CliError):
    """The cluster refused a write for a reason other than RBAC (a webhook or an admission policy)."""

    code = 5


def is_rbac_refusal(err: kube.KubeError) -> bool:
    return err.status == 403 and " cannot " in err.message and ' resource "' in err.message


def denied(err: kube.KubeError, verb: str, res: kube.Resource | str, namespace: str | None) -> CliError:
    """The :class:`CliError` for a failed request (RBAC refusal, admission refusal, other)."""
    if isinstance(res, kube.Resource):
        resource, group = res.plural, res.group
    else:
        group, _, resource = res.partition(":")
    if is_rbac_refusal(err):
        return Denied(verb, resource, group, namespace, err.message)
    if err.status in (400, 403, 422):
        return Refused(f"refused: {err.message}")
    if isinstance(err, kube.NotFound):
        return NotFoundError(err.message)
    return CliError(f"{verb} {resource}: {err.status} {err.reason}: {err.message}".strip())


# --- kubeconfig --------------------------------------------------------------------------------------


def kubeconfig_path(flag: str | None) -> str | None:
    """``--kubeconfig``, else ``$KUBECONFIG`` (a path list, as kubectl reads it), else
    ``~/.kube/config`` when it exists; None means in-cluster credentials."""
    if flag:
        return flag
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return env
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


#: Where the plugin looks for the component when ``--koord-queue-namespace`` is not given.
NAMESPACE_ENV: Final = "KOORD_QUEUE_NAMESPACE"


def component_namespace(flag: str | None) -> str:
    """The namespace koord-queue is installed in (docs/operations.md#install-namespace):
    ``--koord-queue-namespace``, else ``$KOORD_QUEUE_NAMESPACE``, else ``koord-queue``."""
    return flag or os.environ.get(NAMESPACE_ENV) or names.COMPONENT_NAMESPACE


def default_namespace(path: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context in use (kubectl's default), else ``default``."""
    if path is None:
        token_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return token_ns.read_text().strip() if token_ns.is_file() else "default"
    docs: list[Mapping[str, Any]] = []
    for part in path.split(os.pathsep):
        try:
            loaded = yaml.safe_load(Path(part).read_text()) if part else None
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(loaded, Mapping):
            docs.append(loaded)
    current = context or next((str(d["current-context"]) for d in docs if d.get("current-context")), "")
    for doc in docs:
        for entry in doc.get("contexts") or []:
            if isinstance(entry, Mapping) and entry.get("name") == current:
                found = (entry.get("context") or {}).get("namespace")
                return str(found) if found else "default"
    return "default"


async def connect(kubeconfig: str | None, context: str | None, as_user: str | None) -> kube.Kube:
    try:
        return await kube.Kube.connect(
            kubeconfig=kubeconfig,
            context=context,
            impersonate=as_user,
            qps=50.0,
            burst=100,
            pool_size=8,
            user_agent=USER_AGENT,
        )
    except kube.ClientConfigError as err:
        raise CliError(f"{err} (give --kubeconfig, or set KUBECONFIG)") from None


# --- what was read ---------------------------------------------------------------------------------


@dataclass
class Gathered:
    """The raw objects read for a command, parsed on demand, and what could not be read."""

    units: dict[str, Obj] = field(default_factory=dict)
    quotas: list[Obj] = field(default_factory=list)
    queues: list[Obj] | None = None
    settings: component_config.Settings | None = None
    complete: bool = False
    positions: dict[str, int] = field(default_factory=dict)
    queue_missing: set[str] = field(default_factory=set)
    unreadable_quotas: set[str] = field(default_factory=set)
    unknowns: list[str] = field(default_factory=list)
    visibility_ok: bool = True
    #: every ElasticQuota of the cluster was listed (a namespace user reads only their namespace's)
    quotas_complete: bool = True
    #: the standings among siblings the visibility API served, by quota
    standings: dict[str, ServedStanding] = field(default_factory=dict)
    #: the resourceVersion of the QueueUnit list, for ``list --watch``
    resource_version: str = ""
    #: where the Queues were looked for (the install namespace, ``--koord-queue-namespace``); set by
    #: :meth:`Reader.queues`, and the namespace of the Queues derived when they cannot be read
    component_namespace: str = ""

    def parsed_units(self) -> dict[str, Unit]:
        return {key: parse_unit(raw) for key, raw in self.units.items()}

    def parsed_quotas(self) -> list[Quota]:
        return [parse_quota(q) for q in self.quotas]

    def positions_lost(self, err: kube.KubeError) -> bool:
        """Whether a visibility read's error leaves every position unknown (recorded here), or only
        names a queue the scheduler does not know (a 404 for it: that queue has no positions)."""
        if err.status == 404 and 'queue "' in err.message:
            return False
        self.visibility_ok = False
        self.unknowns.append(f"positions unknown: the visibility API answered {err.status} ({err.message})")
        return True

    def queue_configs(self) -> list[QueueConfig]:
        """The Queues read, or those the reconciler derives from the quotas read."""
        if self.queues is not None:
            return [parse_queue(q) for q in self.queues]
        return [parse_queue(quotaqueues.intent(q, self.component_namespace).queue) for q in self.quotas]


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class Reader:
    """Reads through one :class:`shared.kube.Kube`, recording fallbacks in a :class:`Gathered`.
    ``component_namespace``: where the component is installed (``--koord-queue-namespace``,
    docs/operations.md#install-namespace), which holds the Queues, the component configuration and
    the reconciler's Deployment."""

    def __init__(self, client: kube.Kube, component_namespace: str) -> None:
        self.client = client
        self.component_namespace = component_namespace

    async def units(
        self, namespace: str | None, got: Gathered, *, want_all: bool, selector: str | None = None
    ) -> None:
        """QueueUnits of ``namespace`` (None: every namespace). ``want_all`` first tries every
        namespace (a complete view for the replay) and falls back to ``namespace`` on a refusal.
        ``selector`` is a label selector, as ``kubectl get -l`` takes it."""
        if want_all and namespace is not None:
            try:
                items, _ = await self.client.list(QUEUE_UNITS)
                got.units = {_key(u): u for u in items}
                got.complete = True
                return
            except kube.KubeError as err:
                if not is_rbac_refusal(err):
                    raise denied(err, "list", QUEUE_UNITS, None) from None
                got.unknowns.append(
                    "QueueUnits of other namespaces cannot be read (no cluster-wide list permission): "
                    "usage counts only what you can see"
                )
        try:
            items, got.resource_version = await self.client.list(
                QUEUE_UNITS, namespace=namespace, label_selector=selector
            )
        except kube.KubeError as err:
            raise denied(err, "list", QUEUE_UNITS, namespace) from None
        got.units = {_key(u): u for u in items}
        got.complete = namespace is None and not selector

    async def quotas(self, namespace: str | None, got: Gathered) -> None:
        """Every ElasticQuota, else those of ``namespace``; the parents referenced but not read are
        recorded as unreadable."""
        try:
            got.quotas, _ = await self.client.list(QUOTAS)
        except kube.KubeError as err:
            if not is_rbac_refusal(err) or namespace is None:
                raise denied(err, "list", QUOTAS, None) from None
            got.quotas_complete = False
            try:
                got.quotas, _ = await self.client.list(QUOTAS, namespace=namespace)
                got.unknowns.append(
                    f"ElasticQuotas outside namespace {namespace} cannot be read (parents, other teams' "
                    "quotas)"
                )
            except kube.KubeError as err2:
                if not is_rbac_refusal(err2):
                    raise denied(err2, "list", QUOTAS, namespace) from None
                got.unknowns.append(f"no ElasticQuota can be read ({err2.message})")
        readable = {str((q.get("metadata") or {}).get("name", "")) for q in got.quotas}
        for quota in got.quotas:
            parent = ((quota.get("metadata") or {}).get("labels") or {}).get(names.QUOTA_PARENT_LABEL) or ""
            if parent and parent != names.ROOT_QUOTA and parent not in readable:
                got.unreadable_quotas.add(parent)

    async def queues(self, got: Gathered) -> None:
        ns = got.component_namespace = self.component_namespace
        try:
            got.queues, _ = await self.client.list(QUEUES, namespace=ns)
        except kube.KubeError as err:
            if not is_rbac_refusal(err):
                raise denied(err, "list", QUEUES, ns) from None
            got.queues = None  # derived from the quotas, as the reconciler derives them
            got.unknowns.append(f"the Queues (namespace {ns}) cannot be read: they are admins'")

    async def settings(self, got: Gathered) -> None:
        """The component configuration the install ships, when readable; defaults when absent."""
        ns = self.component_namespace
        try:
            cm = await self.client.get(CONFIGMAPS, CONFIG_MAP, namespace=ns)
        except kube.NotFound:
            got.settings = component_config.Settings()
            got.unknowns.append(
                f"ConfigMap {ns}/{CONFIG_MAP} not found: the defaults of the component configuration "
                "are assumed (is koord-queue installed in another namespace? --koord-queue-namespace)"
            )
            return
        except kube.KubeError as err:
            got.settings = None
            if is_rbac_refusal(err):
                got.unknowns.append(
                    f"the component configuration ({ns}/{CONFIG_MAP}) cannot be read: "
                    "the priority cap, the reclaim protect time and the running timeouts are unknown"
                )
                return
            raise denied(err, "get", CONFIGMAPS, ns) from None
        text = str((cm.get("data") or {}).get(CONFIG_KEY) or "")
        try:
            got.settings = component_config.parse(text, source=f"ConfigMap {CONFIG_MAP}")
        except component_config.ConfigError as err:
            got.settings = None
            got.unknowns.append(f"the component configuration cannot be parsed: {err}")

    async def positions(self, namespace: str | None, queues: Iterable[str], got: Gathered) -> None:
        """Positions from the visibility API: the namespaced path for a namespace (what a namespace
        user may read), the cluster-wide queue paths otherwise. A missing or unavailable API leaves
        the positions empty and says so."""
        paths = (
            [f"{VISIBILITY}/namespaces/{quote(namespace, safe='')}/queueunits"]
            if namespace is not None
            else [f"{VISIBILITY}/queues/{quote(q, safe='')}/queueunits" for q in sorted(set(queues))]
        )
        for path in paths:
            try:
                page = await self.client.request("GET", path, query={"limit": visibility.MAX_LIMIT})
            except kube.KubeError as err:
                if got.positions_lost(err):
                    return
                continue
            for item in page.get("items") or []:
                if "position" in item:
                    got.positions[_key(item)] = int(item["position"])

    async def standings(self, namespace: str, got: Gathered) -> None:
        """Each quota's standing among its siblings as the visibility API serves it to the
        namespace (``fairShare``): the scheduler's figures for levels whose parent the reader
        cannot read. Nothing when the API is unavailable or keeps no history."""
        path = f"{VISIBILITY}/namespaces/{quote(namespace, safe='')}/quotas"
        try:
            page = await self.client.request("GET", path, query={"limit": visibility.MAX_LIMIT})
        except kube.KubeError:
            return
        for item in page.get("items") or []:
            found = served_standing(item)
            if found is not None:
                got.standings[str((item.get("metadata") or {}).get("name", ""))] = found

    async def queue_exists(self, namespace: str, queue: str, got: Gathered) -> bool | None:
        """Does the scheduler know queue ``queue``? Asked on the namespaced visibility path a
        namespace user may read; None when it cannot tell."""
        path = (
            f"{VISIBILITY}/namespaces/{quote(namespace, safe='')}/queues/{quote(queue, safe='')}/queueunits"
        )
        try:
            await self.client.request("GET", path, query={"limit": 1})
        except kube.KubeError as err:
            if err.status == 404 and 'queue "' in err.message:
                got.queue_missing.add(queue)
                return False
            return None
        return True

    async def events(self, namespace: str, kind: str, name: str, uid: str) -> tuple[list[Obj], str | None]:
        """The events about one object, oldest first; the reason when they cannot be read."""
        fields = f"involvedObject.kind={kind},involvedObject.name={name}"
        if uid:
            fields += f",involvedObject.uid={uid}"
        try:
            page = await self.client.request(
                "GET", EVENTS.path(namespace), query={"fieldSelector": fields, "limit": 500}, verb="LIST"
            )
        except kube.KubeError as err:
            return [], str(denied(err, "list", EVENTS, namespace))

        def when(e: Obj) -> str:
            return str(
                e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp", "")
            )

        return sorted(page.get("items") or [], key=when), None

    async def server_version(self) -> str:
        """The reconciler Deployment's image tag; ``unknown`` when it cannot be read."""
        try:
            dep = await self.client.get(
                DEPLOYMENTS, RECONCILER_DEPLOYMENT, namespace=self.component_namespace
            )
        except kube.KubeError:
            return "unknown"
        containers = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        image = str(containers[0].get("image") or "") if containers else ""
        ref = image.rsplit("/", 1)[-1]
        if "@" in ref:
            return ref.split("@", 1)[1]
        return ref.split(":", 1)[1] if ":" in ref else "unknown"

    # --- queues (administrators) -------------------------------------------------------------

    async def patch_queue(self, queue: str, patch: Obj) -> Obj:
        """Merge ``patch`` into Queue ``queue``; a user without the right gets :class:`Denied`."""
        try:
            return await self.client.patch(QUEUES, queue, patch, namespace=self.component_namespace)
        except kube.KubeError as err:
            if isinstance(err, kube.NotFound):
                raise NotFoundError(
                    f"queue {queue} does not exist (queues are named after their ElasticQuota: "
                    "kubectl koord-queue quotas -A)"
                ) from None
            raise denied(err, "patch", QUEUES, self.component_namespace) from None

    # --- jobs --------------------------------------------------------------------------------

    async def patch_job_annotation(self, unit: Obj, key: str, value: str) -> tuple[str, Obj]:
        """Set one annotation on the job of ``unit``; returns ``(kind/name, job as written)``."""
        ref = (unit.get("spec") or {}).get("consumerRef") or {}
        api_version, kind, name = (
            str(ref.get("apiVersion", "")),
            str(ref.get("kind", "")),
            str(ref.get("name", "")),
        )
        namespace = str((unit.get("metadata") or {}).get("namespace", ""))
        adapter = registry.by_kind(api_version, kind)
        if adapter is None or not name:
            raise CliError(
                f"QueueUnit {_key(unit)} has no job of a kind koord-queue manages ({kind or 'none'}); "
                "only a job's annotations can be changed"
            )
        group, _, version = api_version.rpartition("/")
        res = kube.Resource(group, version, adapter.plural, kind)
        patch = {"metadata": {"annotations": {key: value}}}
        try:
            written = await self.client.patch(res, name, patch, namespace=namespace)
        except kube.KubeError as err:
            raise denied(err, "patch", res, namespace) from None
        return f"{kind.lower()}/{name}", written


def served_standing(item: Mapping[str, Any]) -> ServedStanding | None:
    """The ``fairShare`` (and ``usageHistory``) of one visibility ``QuotaSummary`` item; None when
    absent or malformed."""
    share, history = item.get("fairShare"), item.get("usageHistory") or {}
    if not isinstance(share, Mapping) or not isinstance(history, Mapping):
        return None
    try:
        score = share.get("score")
        return ServedStanding(
            parent=str(share["parent"]),
            position=int(share["position"]),
            siblings=int(share["siblings"]),
            ahead_count=int(share["aheadCount"]),
            ahead=tuple(str(n) for n in share.get("ahead") or ()),
            share={str(r): float(v) for r, v in (share.get("share") or {}).items()},
            score=None if score is None else float(score),
            usage=quantities.parse_resource_list(history.get("usage") or {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError, quantities.QuantityError):
        return None


def find_unit(units: Mapping[str, Obj], namespace: str, wanted: str) -> Obj:
    """The QueueUnit a user means by ``wanted``: a unit name, a job name, or ``kind/name``."""
    kind, _, name = wanted.rpartition("/")
    mine = [u for k, u in sorted(units.items()) if k.startswith(f"{namespace}/")]

    def consumer(u: Obj) -> Mapping[str, Any]:
        return (u.get("spec") or {}).get("consumerRef") or {}

    def kind_ok(u: Obj) -> bool:
        if not kind:
            return True
        wanted_kind = kind.lower().split(".")[0]
        return str(consumer(u).get("kind", "")).lower() in (wanted_kind, wanted_kind.rstrip("s")) or (
            wanted_kind in ("queueunit", "queueunits", "qu")
        )

    exact = [u for u in mine if (u.get("metadata") or {}).get("name") == name and kind_ok(u)]
    if kind in ("queueunit", "queueunits", "qu") and exact:
        return exact[0]
    by_job = [u for u in mine if consumer(u).get("name") == name and kind_ok(u)]
    found = by_job or exact
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFoundError(
            f'no QueueUnit for "{wanted}" in namespace {namespace} (is the job labelled with a quota?)'
        )
    listed = ", ".join(f"{str(consumer(u).get('kind', '')).lower()}/{consumer(u).get('name')}" for u in found)
    raise CliError(f'"{wanted}" is ambiguous in namespace {namespace}: {listed}; give KIND/NAME')
