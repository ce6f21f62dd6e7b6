"""Kind knowledge lives on the kind: every list of job kinds agrees with the registry.

Each adapter in ``shared/jobs/registry.py`` declares its API group, version and resource
(``api_version``, ``plural``), its kind, unit name, pod sets, hold fields and status reading, once.
Kubernetes wants the kinds spelled out again in several places (docs/development.md#adding-a-job-kind):

* derived in code from the registry (``testenv/kinds.py``): ``configurations()`` of
  ``testenv/webhooks.py`` (with the webhooks for unlabelled jobs that mandatory queueing adds), ``rules()``
  of ``tests/tenancy.py`` (the namespace user of the hostile-tenant tests), ``rbac()`` of
  ``tests/integration/test_manifests.py`` (which pins the reconciler's ClusterRole), the minimal test
  CRDs of the kinds without a file in ``tests/crds/``, and the parent groups a ``batch/v1`` Job's
  controller claim is read against (``shared/jobs/batch_job.py``);
* generated into the YAML admins read, by ``make chart`` (``testenv/kinds.py`` fills the marked
  blocks): the four job webhooks of ``manifests/webhook-configurations.yaml``, the reconciler's
  ClusterRole in ``manifests/rbac/reconciler.yaml`` and the quota-binding policy's resourceRules;
* written by hand: the test CRDs that need a schema (``tests/crds/``), a sample per extension
  (``SAMPLES`` of ``tests/unit/test_job_adapters.py``) and the docs table of enabled extensions
  (docs/compatibility.md#enabled-extensions).

This module checks every one of them against the registry *independently* of the generator (its own
reading of the rules), so a forgotten ``make chart``, a hand edit inside a generated block or a bug in
the generator fails here, in the unit tier, naming the file and the missing or extra entry, instead of
as a job that slips past the webhook on a real cluster. The Helm chart is generated from
``manifests/`` and ``make chart CHECK=1`` keeps it equal, so only ``manifests/`` is read.

Every adapter counts, the opt-in ones (``raycluster``) too: the webhook and the reconciler decide at
run time, from ``--enabled-extensions``, which kinds they act on, so the install must let them reach
every kind the binary knows.
"""

from __future__ import annotations

import copy
import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_queue.shared.jobs import batch_job, registry
from koord_queue.shared.jobs.base import JobAdapter
from testenv import binaries, kinds, webhooks
from tests import tenancy

ROOT: Path = binaries.PROJECT_ROOT
Doc = dict[str, Any]
#: (API group, resource): what an RBAC rule, a webhook rule or a CRD names.
Kind = tuple[str, str]
#: Where a list lives (a file, then which list in it) → the objects read from there.
Sources = dict[str, list[Doc]]

WEBHOOKS_FILE = "manifests/webhook-configurations.yaml"
RECONCILER_RBAC_FILE = "manifests/rbac/reconciler.yaml"
TESTENV = "testenv/webhooks.py configurations()"
TENANCY = "tests/tenancy.py rules()"
RBAC_TABLE = "tests/integration/test_manifests.py rbac()"
CRD_DIR = "tests/crds"
GENERATED_CRDS = "testenv/kinds.py generated_crds()"
COMPATIBILITY = "docs/compatibility.md"

#: The job webhooks: one per quota label (an objectSelector cannot OR two labels), mutating on
#: CREATE and validating on UPDATE. The pod webhook and the webhook for our own objects hold no job
#: kind, and must not: a job rule there would send jobs to the wrong handler.
JOB_WEBHOOKS = frozenset(
    {
        "jobs.mutate.koord-queue.x-k8s.io",
        "jobs-fallback.mutate.koord-queue.x-k8s.io",
        "jobs.validate.koord-queue.x-k8s.io",
        "jobs-fallback.validate.koord-queue.x-k8s.io",
    }
)
#: Added only with mandatory queueing (docs/operations.md#mandatory-queueing): by the test setup
#: when given ``mandatory_namespaces``, and by the chart with ``config.manageJobsWithoutQuotaName``
#: as a copy of the first job webhook; ``manifests/`` has none.
UNLABELLED_WEBHOOKS = frozenset(
    {"unlabelled-jobs.mutate.koord-queue.x-k8s.io", "unlabelled-jobs.validate.koord-queue.x-k8s.io"}
)
#: Which job webhooks each source must have (a renamed or dropped webhook would otherwise escape).
WEBHOOKS_EXPECTED: dict[str, frozenset[str]] = {
    WEBHOOKS_FILE: JOB_WEBHOOKS,
    TESTENV: JOB_WEBHOOKS | UNLABELLED_WEBHOOKS,
}

#: What the reconciler does with every job kind: watch it (get, list, watch for the informer) and
#: patch it to suspend or resume it. Exactly these, no more: the ClusterRole is least privilege (no
#: update where a patch is used, see the header of manifests/rbac/reconciler.yaml).
RECONCILER_VERBS = frozenset({"get", "list", "watch", "patch"})
#: What a namespace user may do with every job kind: what ``edit`` grants for workloads.
USER_VERBS = frozenset(tenancy.WRITE)


@dataclass(frozen=True)
class RoleSpec:
    """The verbs a role must grant on every job kind, and the resources besides the job kinds that it
    legitimately holds (listed so that a kind dropped from the registry but left in a role shows up
    as extra)."""

    verbs: frozenset[str]
    others: frozenset[Kind]


#: The roles that must grant every job kind.
ROLES: dict[tuple[str, str], RoleSpec] = {
    # The reconciler's other resources: its own objects, what a pod's charge depends on, the node
    # pools (profiles and nodes), pods and events, and the two reviews its metrics guard asks the
    # apiserver for a scraper's token and its right to get /metrics (docs/operations.md#metrics):
    # the component's own grants, never a job kind. Rows with resourceNames (webhook
    # configurations, the APIService) grant single objects, never a kind, and are not read as
    # coverage.
    ("ClusterRole", "koord-queue-reconciler"): RoleSpec(
        RECONCILER_VERBS,
        frozenset(
            {
                ("scheduling.x-k8s.io", "queueunits"),
                ("scheduling.sigs.k8s.io", "elasticquotas"),
                ("quota.koordinator.sh", "elasticquotaprofiles"),
                ("", "nodes"),
                ("scheduling.k8s.io", "priorityclasses"),
                ("scheduling.k8s.io", "workloads"),
                ("", "limitranges"),
                ("node.k8s.io", "runtimeclasses"),
                ("", "namespaces"),
                ("", "pods"),
                ("", "events"),
                ("authentication.k8s.io", "tokenreviews"),
                ("authorization.k8s.io", "subjectaccessreviews"),
            }
        ),
    ),
    # The tenant's other workloads: the pods of her jobs, their config and services, the CronJobs
    # that create Jobs (a parent kind, not a queued one), and reading events.
    ("Role", "tenancy"): RoleSpec(
        USER_VERBS,
        frozenset(
            {
                ("", "pods"),
                ("", "configmaps"),
                ("", "services"),
                ("", "events"),
                ("batch", "cronjobs"),
            }
        ),
    ),
}
#: Where each role must be found.
ROLES_EXPECTED: dict[str, tuple[str, str]] = {
    RECONCILER_RBAC_FILE: ("ClusterRole", "koord-queue-reconciler"),
    RBAC_TABLE: ("ClusterRole", "koord-queue-reconciler"),
    TENANCY: ("Role", "tenancy"),
}
#: API groups the kube-apiserver serves itself: their kinds (a ``batch/v1`` Job) need no test CRD.
BUILT_IN_GROUPS = frozenset({"", "batch", "apps"})
#: The policies that must list every job kind. Any other policy that names a job resource is held to
#: the same rule (a policy about jobs that misses a kind is a hole in it).
JOB_POLICIES = frozenset({"koord-queue-quota-binding"})


# --- what the registry says ------------------------------------------------------------------------


def split_api_version(api_version: str) -> tuple[str, str]:
    """``batch/v1`` → (``batch``, ``v1``); the core group ``v1`` → (``""``, ``v1``)."""
    group, _, version = api_version.rpartition("/")
    return group, version


def required_kinds(adapters: Iterable[JobAdapter]) -> dict[Kind, frozenset[str]]:
    """(group, resource) → the versions the adapters read it in. Two adapters may share a kind in
    two versions (RayJob ``v1`` and ``v1alpha1``): one resource, both versions."""
    found: dict[Kind, set[str]] = {}
    for adapter in adapters:
        group, version = split_api_version(adapter.api_version)
        found.setdefault((group, adapter.plural), set()).add(version)
    return {kind: frozenset(versions) for kind, versions in found.items()}


def registered() -> dict[Kind, frozenset[str]]:
    """What the registry requires now (read at call time, so a test can register a kind)."""
    return required_kinds(registry.ADAPTERS)


# --- what the lists say ----------------------------------------------------------------------------


def fmt(kind: Kind) -> str:
    group, resource = kind
    return f"{group or 'core'}/{resource}"


@dataclass
class Covered:
    """What one list grants or matches per (group, resource): versions and verbs."""

    versions: dict[Kind, set[str]]
    verbs: dict[Kind, set[str]]


def covered_by(rules: Iterable[Mapping[str, Any]]) -> Covered:
    """Every (group, resource) of ``rules`` (each a cross product of its groups and resources).

    Subresources (``pods/resize``, ``queueunits/status``) are not kinds and are skipped: no job kind
    needs one in these lists (the reconciler patches a job's spec, the webhooks see the object). A
    rule with ``resourceNames`` grants single objects, never a whole kind, so it covers nothing.
    """
    versions: dict[Kind, set[str]] = {}
    verbs: dict[Kind, set[str]] = {}
    for rule in rules:
        if rule.get("resourceNames"):
            continue
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                if "/" in resource:
                    continue
                versions.setdefault((group, resource), set()).update(rule.get("apiVersions") or ())
                verbs.setdefault((group, resource), set()).update(rule.get("verbs") or ())
    return Covered(versions, verbs)


def compare(
    where: str,
    rules: Iterable[Mapping[str, Any]],
    kinds: Mapping[Kind, frozenset[str]],
    *,
    verbs: frozenset[str] | None = None,
    others: frozenset[Kind] = frozenset(),
) -> list[str]:
    """How ``rules`` (found at ``where``) disagree with ``kinds``: a kind missing, a version or verb
    missing, or an entry no adapter has.

    ``verbs`` is None for match rules (webhooks, policies), whose ``apiVersions`` must include the
    kind's versions. More versions are allowed: one rule holds several resources (the ``ray.io``
    rule matches ``rayclusters`` in ``v1alpha1`` too), and with the default ``matchPolicy:
    Equivalent`` the apiserver converts a request in another served version to a listed one anyway,
    so an extra version matches nothing new. For RBAC rules ``verbs`` is the exact set each kind
    must be granted.
    """
    found = covered_by(rules)
    problems: list[str] = []
    for kind in sorted(kinds):
        if kind not in found.versions:
            what = f"versions {sorted(kinds[kind])}" if verbs is None else f"verbs {sorted(verbs)}"
            problems.append(f"{where}: missing {fmt(kind)} ({what})")
            continue
        if verbs is None:
            listed = found.versions[kind]
            lacking = sorted(kinds[kind] - listed) if "*" not in listed else []
            if lacking:
                problems.append(f"{where}: {fmt(kind)} lacks version(s) {lacking}")
        elif found.verbs[kind] != verbs:
            problems.append(
                f"{where}: {fmt(kind)} is granted {sorted(found.verbs[kind])}, expected {sorted(verbs)}"
            )
    for kind in sorted(set(found.versions) - set(kinds) - others):
        problems.append(f"{where}: extra {fmt(kind)} (no adapter in shared/jobs/registry.py has it)")
    return problems


def check_webhooks(where: str, doc: Doc, kinds: Mapping[Kind, frozenset[str]], seen: set[str]) -> list[str]:
    problems: list[str] = []
    for webhook in doc.get("webhooks") or ():
        name = str(webhook["name"])
        label = f"{where} ({doc['kind']}, webhook {name})"
        if name in JOB_WEBHOOKS | UNLABELLED_WEBHOOKS:
            seen.add(name)
            problems += compare(label, webhook.get("rules") or (), kinds)
        else:
            stray = sorted(set(covered_by(webhook.get("rules") or ()).versions) & set(kinds))
            problems += [f"{label}: job kind {fmt(k)} in a webhook that is not a job webhook" for k in stray]
    return problems


def check_policy(where: str, doc: Doc, kinds: Mapping[Kind, frozenset[str]]) -> list[str]:
    name = doc["metadata"]["name"]
    rules = (doc.get("spec") or {}).get("matchConstraints", {}).get("resourceRules") or ()
    if name not in JOB_POLICIES and not set(covered_by(rules).versions) & set(kinds):
        return []  # a policy about pods or quotas, not about jobs
    return compare(f"{where} (ValidatingAdmissionPolicy {name})", rules, kinds)


def check_crds(sources: Sources, kinds: Mapping[Kind, frozenset[str]]) -> list[str]:
    """Every kind not built in has a test CRD: its file ``tests/crds/<group>_<plural>.yaml`` when its
    tests need a schema, else the minimal one ``testenv/kinds.py`` derives from the adapter. Either
    serves the kind's versions and has the status subresource exactly when the adapter says so."""
    problems: list[str] = []
    files = {where: docs for where, docs in sources.items() if where.startswith(CRD_DIR + "/")}
    generated = {
        (d["spec"]["group"], d["spec"]["names"]["plural"]): d for d in sources.get(GENERATED_CRDS, [])
    }
    status = {
        (split_api_version(a.api_version)[0], a.plural): a.status_subresource for a in registry.ADAPTERS
    }
    for kind in sorted(k for k in kinds if k[0] not in BUILT_IN_GROUPS):
        where = f"{CRD_DIR}/{kind[0]}_{kind[1]}.yaml"
        crds = [d for d in files.pop(where, []) if d.get("kind") == "CustomResourceDefinition"]
        if not crds and kind in generated:
            where, crds = GENERATED_CRDS, [generated.pop(kind)]
        if not crds:
            problems.append(f"{where}: missing (the test CRD of {fmt(kind)}), and none is generated")
            continue
        spec = crds[0]["spec"]
        if (spec["group"], spec["names"]["plural"]) != kind:
            problems.append(f"{where}: defines {spec['group']}/{spec['names']['plural']}, not {fmt(kind)}")
        served = [v for v in spec.get("versions") or () if v.get("served")]
        if lacking := sorted(kinds[kind] - {v["name"] for v in served}):
            problems.append(f"{where}: {fmt(kind)} does not serve version(s) {lacking}")
        with_status = {(v.get("subresources") or {}).get("status") is not None for v in served}
        if kind in status and with_status != {status[kind]}:
            problems.append(
                f"{where}: {fmt(kind)}'s status subresource disagrees with its adapter's status_subresource"
            )
    problems += [
        f"{where}: extra CRD (no adapter in shared/jobs/registry.py has it)" for where in sorted(files)
    ]
    return problems + [f"{GENERATED_CRDS}: extra CRD {fmt(kind)}" for kind in sorted(generated)]


_DOCS_ROW = re.compile(
    r"^\| `(?P<ext>[a-z0-9]+)` \| `(?P<api>[^`]+)` (?P<kind>\w+) \| (?P<default>on|off)\b", re.M
)


def extension_table_disagreements(text: str) -> list[str]:
    """How the table of docs/compatibility.md#enabled-extensions disagrees with the registry: a row per
    extension, with its API version, kind and default (``on`` exactly for ``DEFAULT_EXTENSIONS``)."""
    start = text.index("### Enabled extensions")
    rows = {m["ext"]: m for m in _DOCS_ROW.finditer(text[start : text.index("\n### ", start + 1)])}
    where = f"{COMPATIBILITY}: the table of #enabled-extensions"
    problems: list[str] = []
    for adapter in registry.ADAPTERS:
        row = rows.pop(adapter.extension, None)
        default = "on" if adapter.extension in registry.DEFAULT_EXTENSIONS else "off"
        if row is None:
            problems.append(f"{where} has no row for {adapter.extension!r}")
        elif (row["api"], row["kind"], row["default"]) != (adapter.api_version, adapter.kind, default):
            expected = f"`{adapter.api_version}` {adapter.kind}, {default}"
            problems.append(f"{where}: {adapter.extension!r} says {row[0]!r}, expected {expected}")
    return problems + [f"{where} has a row for {ext!r}, which no adapter has" for ext in sorted(rows)]


_UNIT_ROW = re.compile(r"^\| (?P<kind>[^|]+?) \| `(?P<unit>[^`]+)` \|", re.M)


def unit_name_disagreements(text: str) -> list[str]:
    """How the table of docs/compatibility.md#unit-names-and-pod-sets disagrees with the adapters'
    ``queue_unit_suffix``: the docs are the spec of upstream's unit names, the adapter the one
    declaration the code and the integration tests use. A row is keyed by the kind's name (its last
    word, without versions: "RayJob (`v1`, `v1alpha1`)" is RayJob)."""
    start = text.index("### Unit names and pod sets")
    section = text[start : text.index("\n### ", start + 1)]
    rows = {
        re.sub(r"\(.*\)|`[^`]*`", "", m["kind"]).split()[-1]: m["unit"]
        for m in _UNIT_ROW.finditer(section)
        if m["kind"] != "kind"
    }
    where = f"{COMPATIBILITY}: the table of #unit-names-and-pod-sets"
    problems: list[str] = []
    for adapter in registry.ADAPTERS:
        expected = "<name>" + (f"-{adapter.queue_unit_suffix}" if adapter.queue_unit_suffix else "")
        if adapter.kind not in rows:
            problems.append(f"{where} has no row for {adapter.kind} ({adapter.extension!r})")
        elif rows[adapter.kind] != expected:
            problems.append(
                f"{where}: {adapter.kind} ({adapter.extension!r}) is {rows[adapter.kind]}, "
                f"expected {expected}"
            )
    return problems


def docs_disagreements(text: str) -> list[str]:
    """Both tables of docs/compatibility.md that step 4 of the guide extends."""
    return extension_table_disagreements(text) + unit_name_disagreements(text)


def disagreements(sources: Sources, kinds: Mapping[Kind, frozenset[str]]) -> list[str]:
    """Every way ``sources`` disagree with ``kinds``, each naming its file; empty when they agree."""
    problems: list[str] = []
    webhooks_seen: dict[str, set[str]] = {where: set() for where in WEBHOOKS_EXPECTED}
    roles_seen: set[tuple[str, tuple[str, str]]] = set()
    policies_seen: set[str] = set()
    for where, docs in sources.items():
        if where.startswith(CRD_DIR + "/") or where == GENERATED_CRDS:
            continue
        for doc in docs:
            kind, name = str(doc.get("kind")), str((doc.get("metadata") or {}).get("name", ""))
            if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                problems += check_webhooks(where, doc, kinds, webhooks_seen.setdefault(where, set()))
            elif kind == "ValidatingAdmissionPolicy":
                policies_seen.add(name)
                problems += check_policy(where, doc, kinds)
            elif (kind, name) in ROLES:
                roles_seen.add((where, (kind, name)))
                spec = ROLES[(kind, name)]
                label = f"{where} ({kind} {name})"
                problems += compare(
                    label, doc.get("rules") or (), kinds, verbs=spec.verbs, others=spec.others
                )
    for where, expected in WEBHOOKS_EXPECTED.items():
        problems += [
            f"{where}: no job webhook {n}" for n in sorted(expected - webhooks_seen.get(where, set()))
        ]
    for where, role in ROLES_EXPECTED.items():
        if (where, role) not in roles_seen:
            problems.append(f"{where}: no {role[0]} {role[1]}")
    problems += [
        f"manifests/: no ValidatingAdmissionPolicy {n}" for n in sorted(JOB_POLICIES - policies_seen)
    ]
    return problems + check_crds(sources, kinds)


# --- reading the lists -----------------------------------------------------------------------------


def read_yaml(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def rbac_table_as_role() -> Doc:
    """The cluster-wide rows of the ``RBAC`` table that pins the reconciler's permissions, as a
    ClusterRole (imported by name: it is an integration module, read here as data only)."""
    table = importlib.import_module("tests.integration.test_manifests").rbac()
    rules = [
        {"apiGroups": [group], "resources": [resource], "resourceNames": list(names), "verbs": list(verbs)}
        for namespace, group, resource, names, verbs in table
        if namespace == ""
    ]
    return {"kind": "ClusterRole", "metadata": {"name": "koord-queue-reconciler"}, "rules": rules}


def read_sources() -> Sources:
    """Every list of job kinds, keyed by where it lives."""
    sources: Sources = {}
    manifests = ROOT / "manifests"
    for path in sorted([*manifests.glob("*.yaml"), *manifests.glob("rbac/*.yaml")]):
        if path.name != "kustomization.yaml":
            sources[str(path.relative_to(ROOT))] = read_yaml(path)
    # The test setup's webhooks as the integration tests register them, with the mandatory-queueing
    # webhooks for unlabelled jobs (any selector adds them).
    sources[TESTENV] = webhooks.configurations(
        url="https://127.0.0.1:1", ca_pem=b"", mandatory_namespaces={"matchLabels": {"queueing": "mandatory"}}
    )
    sources[TENANCY] = [{"kind": "Role", "metadata": {"name": "tenancy"}, "rules": tenancy.rules()}]
    sources[RBAC_TABLE] = [rbac_table_as_role()]
    for path in sorted((ROOT / CRD_DIR).glob("*.yaml")):
        sources[str(path.relative_to(ROOT))] = read_yaml(path)
    sources[GENERATED_CRDS] = kinds.generated_crds()
    return sources


# --- the repository agrees -------------------------------------------------------------------------


def test_the_registry_names_every_kind_it_adapts() -> None:
    """The derivation itself: one entry per (group, resource), versions merged, opt-in kinds in."""
    kinds = registered()
    # The same group and resource in two versions is one kind (RayJob v1 and v1alpha1).
    assert kinds[("ray.io", "rayjobs")] == {"v1", "v1alpha1"}
    # Opt-in extensions count: RayCluster is off by default but the binary knows it.
    assert ("ray.io", "rayclusters") in kinds
    assert "raycluster" not in registry.DEFAULT_EXTENSIONS
    assert len(kinds) == len({(a.api_version.split("/")[0], a.kind) for a in registry.ADAPTERS})


def test_every_list_of_job_kinds_agrees_with_the_registry() -> None:
    """The check itself, on the repository as it is."""
    problems = disagreements(read_sources(), registered())
    assert not problems, "lists of job kinds that disagree with shared/jobs/registry.py:\n" + "\n".join(
        problems
    )


def test_every_job_webhook_also_matches_the_older_versions_an_adapter_names() -> None:
    """``older_versions`` (the RayCluster's ``v1alpha1``): a cluster served only in that version
    still reaches the webhook's guard, in manifests/ and in the test setup alike."""
    older = {
        (split_api_version(a.api_version)[0], a.plural): set(a.older_versions)
        for a in registry.ADAPTERS
        if a.older_versions
    }
    assert older, "the RayCluster adapter names v1alpha1"
    sources = read_sources()
    for where in (WEBHOOKS_FILE, TESTENV):
        for doc in sources[where]:
            for webhook in doc.get("webhooks") or ():
                if webhook["name"] not in JOB_WEBHOOKS:
                    continue
                matched = covered_by(webhook.get("rules") or ()).versions
                for kind, versions in older.items():
                    assert versions <= matched.get(kind, set()), (where, webhook["name"], kind)


def test_the_checker_reads_every_list_it_promises() -> None:
    """A guard on the reader: if a file moved, the comparison above would pass on nothing."""
    sources = read_sources()
    for where in (
        WEBHOOKS_FILE,
        RECONCILER_RBAC_FILE,
        "manifests/quota-binding-policy.yaml",
        TESTENV,
        TENANCY,
    ):
        assert sources.get(where), where
    custom = [kind for kind in registered() if kind[0] not in BUILT_IN_GROUPS]
    files = sum(where.startswith(CRD_DIR + "/") for where in sources)
    assert files + len(sources[GENERATED_CRDS]) == len(custom)


# --- a new kind, following docs/development.md#adding-a-job-kind -----------------------------------


class ToyJobAdapter(batch_job.BatchJobAdapter):
    """Step 1 of the guide: a kind the repository has never heard of. A Job-shaped custom resource
    (``spec.suspend``, one pod template), so it reads like a Job and declares only its identity."""

    extension = "toyjob"
    api_version = "example.com/v1"
    kind = "ToyJob"
    plural = "toyjobs"
    queue_unit_suffix = "toy-qu"


TOY: Kind = ("example.com", "toyjobs")
#: Step 4: its rows in docs/compatibility.md#enabled-extensions (opt-in) and #unit-names-and-pod-sets.
TOY_DOCS_ROWS = {
    "| `sparkapp` |": "| `toyjob` | `example.com/v1` ToyJob | off |\n",
    "| Argo Workflow |": "| ToyJob | `<name>-toy-qu` | `spec.suspend` | one, named after the job |\n",
}


def contract_module() -> Any:
    """The adapter contract's module (imported by name: a test module, read here as code)."""
    return importlib.import_module("tests.unit.test_job_adapters")


def toy_job() -> Doc:
    """Step 3: the toy's sample, a labelled Job sample renamed to the toy's kind."""
    job: Doc = contract_module().SAMPLES["job"]()
    return {**job, "apiVersion": ToyJobAdapter.api_version, "kind": ToyJobAdapter.kind}


def make_chart(sources: Sources) -> Sources:
    """What ``make chart`` does to ``manifests/``, done to a copy of ``sources`` (the files untouched)."""
    done = copy.deepcopy(sources)
    for name in kinds.MANIFESTS:
        text = kinds.rewrite((ROOT / name).read_text(), name)
        done[name] = [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]
    return done


def every_problem(sources: Sources, samples: Mapping[str, Any], docs: str) -> list[str]:
    """Every check the guide names: the lists of kinds, the samples and the docs table."""
    return [
        *disagreements(sources, registered()),
        *contract_module().sample_disagreements(samples),
        *docs_disagreements(docs),
    ]


def guide_text() -> str:
    text = (ROOT / "docs" / "development.md").read_text()
    start = text.index("## Adding a job kind")
    return text[start : text.index("\n## ", start + 1)]


def test_a_toy_kind_added_by_following_the_guide_passes_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps 1 and 2 done (the adapter, registered), the rest not yet: the checks name exactly the
    files the guide tells the developer to edit or regenerate, and pass once the guide is followed.
    Everything derived from the registry follows by itself."""
    contract = contract_module()
    toy = ToyJobAdapter()
    monkeypatch.setattr(registry, "ADAPTERS", (*registry.ADAPTERS, toy))
    monkeypatch.setattr(registry, "EXTENSIONS", (*registry.EXTENSIONS, toy.extension))
    assert registered()[TOY] == {"v1"}
    docs = (ROOT / COMPATIBILITY).read_text()

    problems = every_problem(read_sources(), contract.SAMPLES, docs)
    assert problems and all("example.com/toyjobs" in p or "'toyjob'" in p for p in problems), problems
    files = {p.split(" ")[0].rstrip(":") for p in problems}
    # manifests/ until `make chart`: the four job webhooks, the policy, the ClusterRole; the sample;
    # the docs row. Nothing derived (test setup, tenant, RBAC table, test CRD) is named.
    assert files == {
        WEBHOOKS_FILE,
        "manifests/quota-binding-policy.yaml",
        RECONCILER_RBAC_FILE,
        "tests/unit/test_job_adapters.py",
        COMPATIBILITY,
    }, problems
    assert len(problems) == 4 + 1 + 1 + 1 + 2, problems
    guide = guide_text()
    for file in files | {"shared/jobs/registry.py", "tests/unit/test_kind_registry.py", "make chart"}:
        assert f"`{file}`" in guide, file
    assert "five files" in guide

    # Derived: the test setup's six job webhooks, the tenant, the RBAC table, the CRD, the parents.
    sources = make_chart(read_sources())
    (crd,) = [c for c in sources[GENERATED_CRDS] if c["spec"]["group"] == "example.com"]
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert "example.com" in registry.parent_groups(registry.ADAPTERS)

    # Steps 3 to 5 done (the sample, which meets the adapter contract; the docs row; `make chart`).
    monkeypatch.setattr(contract, "GATED", contract.GATED | {toy.extension})
    assert contract.contract_failures(toy, toy_job) == []
    samples = {**contract.SAMPLES, toy.extension: toy_job}
    for anchor, row in TOY_DOCS_ROWS.items():
        end_of_row = docs.index("\n", docs.index(anchor)) + 1
        docs = docs[:end_of_row] + row + docs[end_of_row:]
    assert every_problem(sources, samples, docs) == []


def test_the_generated_blocks_are_up_to_date() -> None:
    """``make chart`` was run after the last change to the registry (else: run it)."""
    assert kinds.stale_manifests() == [], "run `make chart`"


def test_a_job_controlled_by_any_registered_kind_is_a_child() -> None:
    """``shared/jobs/batch_job.py`` reads its parent groups from the registry: every kind we queue but
    ``batch/v1`` Job itself. A Job controlled by one is not queued on its own."""
    assert registry.parent_groups(registry.ADAPTERS) == registry.PARENT_GROUPS
    assert {group for group, _ in registered()} - {"batch"} == registry.PARENT_GROUPS
    for adapter in registry.ADAPTERS:
        ref = {"apiVersion": adapter.api_version, "kind": adapter.kind, "name": "p", "controller": True}
        job = {"metadata": {"name": "child", "ownerReferences": [ref]}}
        claimed = batch_job.claimed_parent(job, registry.PARENT_GROUPS) is not None
        assert claimed is (adapter.kind != "Job"), adapter


def test_the_docs_tables_and_the_samples_agree_with_the_registry() -> None:
    """And a row that disagrees is named, in each table."""
    assert docs_disagreements((ROOT / COMPATIBILITY).read_text()) == []
    units = "### Unit names and pod sets\n| kind | unit name |\n| TFJob | `<name>-tfjob-qu` |\n\n### N"
    assert (
        f"{COMPATIBILITY}: the table of #unit-names-and-pod-sets: TFJob ('tfjob') is <name>-tfjob-qu, "
        "expected <name>-tf-qu" in unit_name_disagreements(units)
    )
    assert contract_module().sample_disagreements() == []
    assert extension_table_disagreements(
        "### Enabled extensions\n| `job` | `batch/v2` Job | on |\n\n### N"
    ) == [
        f"{COMPATIBILITY}: the table of #enabled-extensions: 'job' says '| `job` | `batch/v2` Job | on', "
        "expected `batch/v1` Job, on",
        *(
            f"{COMPATIBILITY}: the table of #enabled-extensions has no row for {e!r}"
            for e in registry.EXTENSIONS[1:]
        ),
    ]


def test_a_kind_left_behind_or_half_granted_is_named() -> None:
    """The other ways to disagree: a kind removed from the registry but still listed, a version or a
    verb missing for a listed kind."""
    kinds = registered()
    sources = read_sources()
    # A kind dropped from the registry but still granted: extra, in every list.
    fewer = {k: v for k, v in kinds.items() if k != ("argoproj.io", "workflows")}
    extra = disagreements(sources, fewer)
    assert extra and all("argoproj.io" in p for p in extra), extra
    assert (
        f"{RECONCILER_RBAC_FILE} (ClusterRole koord-queue-reconciler): extra argoproj.io/workflows"
        in "\n".join(extra)
    )
    # A version the webhooks do not list, and a verb the reconciler lacks.
    more = {**kinds, ("jobset.x-k8s.io", "jobsets"): frozenset({"v1alpha2", "v1"})}
    assert any(
        p.startswith(WEBHOOKS_FILE) and "jobset.x-k8s.io/jobsets lacks version(s) ['v1']" in p
        for p in disagreements(sources, more)
    )
    role = copy.deepcopy(sources)
    for doc in role[RECONCILER_RBAC_FILE]:
        for rule in doc.get("rules") or ():
            if rule.get("resources") == ["jobsets"]:
                rule["verbs"] = ["get", "list", "watch"]
    assert (
        f"{RECONCILER_RBAC_FILE} (ClusterRole koord-queue-reconciler): jobset.x-k8s.io/jobsets is granted "
        "['get', 'list', 'watch'], expected ['get', 'list', 'patch', 'watch']"
    ) in disagreements(role, kinds)


def test_no_role_lists_a_job_kind_among_its_own_grants() -> None:
    """A role's own grants (the reconciler's reviews for its metrics guard, its quotas, pods, events)
    are excused from being "extra" only because no adapter has them: a job kind listed there would
    stay granted, unnoticed, after its adapter left the registry."""
    for role, spec in ROLES.items():
        assert not spec.others & set(registered()), role
