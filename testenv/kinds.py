"""The lists of job kinds, derived from the adapter registry (docs/development.md#adding-a-job-kind).

Kubernetes wants every job kind spelled out: in the job webhooks' match rules, in the reconciler's
ClusterRole, in the quota-binding policy, in the test setup and in the test CRDs. Each adapter in
``shared/jobs/registry.py`` already declares its API group, version(s) and resource (``api_version``,
``plural``, ``kind``, ``status_subresource``), so this module derives every such list from it:

* for code (``testenv/system.py``, ``tests/tenancy.py``, ``tests/integration/test_manifests.py``):
  :func:`match_rules`, :func:`rbac_rules`, :func:`resources` and :func:`minimal_crd`;
* for the YAML that admins read and must stay literal (``manifests/``): :func:`rewrite` fills each
  generated block (between a ``# >>> job kinds ...`` line and a ``# <<< job kinds`` line) with the
  rules the block's header asks for. ``make chart`` runs it before generating the chart
  (``testenv/chart.py``), and ``make chart CHECK=1`` fails while a block is stale.

Every function reads ``registry.ADAPTERS`` when called, not at import, so a test can register a kind
and see every list follow. Every adapter counts, the opt-in ones too: the processes decide at run
time which kinds they act on (``--enabled-extensions``), the install must let them reach all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from koord_queue.shared.jobs import registry
from koord_queue.shared.jobs.base import JobAdapter
from testenv import binaries

ROOT: Final = binaries.PROJECT_ROOT
#: The files with generated blocks; ``make chart`` rewrites them.
MANIFESTS: Final = (
    "manifests/webhook-configurations.yaml",
    "manifests/quota-binding-policy.yaml",
    "manifests/rbac/reconciler.yaml",
)
#: API groups the kube-apiserver serves itself: their kinds need no test CRD.
BUILT_IN_GROUPS: Final = frozenset({"", "batch", "apps"})
#: ``# >>> job kinds: <what> <JSON list>``, e.g. ``webhook-rules ["CREATE"]``; the block ends at
#: ``# <<< job kinds``. ``what`` is ``webhook-rules`` (match rules with a scope),
#: ``policy-rules`` (a ValidatingAdmissionPolicy's resourceRules) or ``rbac-rules`` (verbs).
_BEGIN: Final = re.compile(
    r"^(?P<indent>[ ]*)# >>> job kinds: (?P<what>[a-z-]+) (?P<arg>\[.*\])(?P<rest>.*)$"
)
_END: Final = re.compile(r"^[ ]*# <<< job kinds\b")

Rule = dict[str, Any]


class GeneratedBlockError(ValueError):
    """A generated block that cannot be rewritten (unknown kind of list, no end line)."""


def adapters() -> tuple[JobAdapter, ...]:
    """The registry's adapters, read now (a test may have registered one more)."""
    return registry.ADAPTERS


def split_api_version(api_version: str) -> tuple[str, str]:
    """``batch/v1`` → (``batch``, ``v1``)."""
    group, _, version = api_version.rpartition("/")
    return group, version


def resources(of: Iterable[JobAdapter] | None = None) -> dict[tuple[str, str], list[str]]:
    """(group, resource) → the versions the adapters read it in, in registry order, then the older
    versions an adapter asks the rules to match too (``older_versions``). Two adapters may be one
    resource in two versions (RayJob ``v1`` and ``v1alpha1``)."""
    found: dict[tuple[str, str], list[str]] = {}
    for adapter in adapters() if of is None else of:
        group, version = split_api_version(adapter.api_version)
        versions = found.setdefault((group, adapter.plural), [])
        for wanted in (version, *adapter.older_versions):
            if wanted not in versions:
                versions.append(wanted)
    return found


def match_rules(of: Iterable[JobAdapter] | None = None) -> list[Rule]:
    """Admission match rules (webhooks, policies) naming every job kind: one rule per API group and
    set of versions, its resources in registry order."""
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), versions in resources(of).items():
        grouped.setdefault((group, tuple(versions)), []).append(resource)
    return [
        {"apiGroups": [group], "apiVersions": list(versions), "resources": names}
        for (group, versions), names in grouped.items()
    ]


def rbac_rules(verbs: Iterable[str], of: Iterable[JobAdapter] | None = None) -> list[Rule]:
    """RBAC rules granting ``verbs`` on every job kind: one rule per API group."""
    grouped: dict[str, list[str]] = {}
    for group, resource in resources(of):
        grouped.setdefault(group, []).append(resource)
    return [
        {"apiGroups": [group], "resources": names, "verbs": list(verbs)} for group, names in grouped.items()
    ]


# --- test CRDs -------------------------------------------------------------------------------------


def minimal_crd(group: str, resource: str, of: Iterable[JobAdapter] | None = None) -> dict[str, Any]:
    """A test CRD for a registry kind that has no file in ``tests/crds/``: every version the adapters
    read, served, the first stored; no schema (``x-kubernetes-preserve-unknown-fields``), and the
    status subresource when the adapter says its CRD has one. Enough for the webhook, the reconciler
    and a tenant's writes; a kind whose tests need a typed field (a ``suspend`` that must be a
    boolean) keeps a file with a schema."""
    chosen = [
        a
        for a in (adapters() if of is None else of)
        if (split_api_version(a.api_version)[0], a.plural) == (group, resource)
    ]
    if not chosen:
        raise KeyError(f"no adapter in shared/jobs/registry.py has {group}/{resource}")
    versions = resources(chosen)[(group, resource)]
    kind = chosen[0].kind
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource}.{group}", "labels": {"koord-queue-py/test-crd": "true"}},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": resource,
                "singular": kind.lower(),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": i == 0,
                    "schema": schema,
                    **({"subresources": {"status": {}}} if chosen[0].status_subresource else {}),
                }
                for i, version in enumerate(versions)
            ],
        },
    }


def crd_file(group: str, resource: str) -> Path:
    """Where a kind's test CRD with a schema lives, if it has one."""
    return ROOT / "tests" / "crds" / f"{group}_{resource}.yaml"


def generated_crds(of: Iterable[JobAdapter] | None = None) -> list[dict[str, Any]]:
    """The minimal CRDs of the registry kinds that are not built in and have no file."""
    chosen = tuple(adapters() if of is None else of)
    return [
        minimal_crd(group, resource, chosen)
        for group, resource in resources(chosen)
        if group not in BUILT_IN_GROUPS and not crd_file(group, resource).exists()
    ]


# --- the generated blocks of manifests/ ------------------------------------------------------------


def _flow(values: Iterable[str]) -> str:
    return json.dumps(list(values))


def _block(what: str, arg: list[str], indent: str) -> list[str]:
    """The YAML lines of one generated block (the flow style of the hand-written rules around it)."""
    lines: list[str] = []
    if what in ("webhook-rules", "policy-rules"):
        for rule in match_rules():
            lines += [
                f"{indent}- apiGroups: {_flow(rule['apiGroups'])}",
                f"{indent}  apiVersions: {_flow(rule['apiVersions'])}",
                f"{indent}  resources: {_flow(rule['resources'])}",
                f"{indent}  operations: {_flow(arg)}",
            ]
            if what == "webhook-rules":
                lines.append(f"{indent}  scope: Namespaced")
    elif what == "rbac-rules":
        for rule in rbac_rules(arg):
            lines += [
                f"{indent}- apiGroups: {_flow(rule['apiGroups'])}",
                f"{indent}  resources: {_flow(rule['resources'])}",
                f"{indent}  verbs: {_flow(rule['verbs'])}",
            ]
    else:
        raise GeneratedBlockError(f"unknown generated list {what!r}")
    return lines


def rewrite(text: str, where: str = "<text>") -> str:
    """``text`` with every generated block refilled from the registry (the rest verbatim)."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        begin = _BEGIN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not begin:
            continue
        end = next((j for j in range(i, len(lines)) if _END.match(lines[j])), None)
        if end is None:
            raise GeneratedBlockError(f"{where}: a `# >>> job kinds` block without `# <<< job kinds`")
        out += _block(begin["what"], json.loads(begin["arg"]), begin["indent"])
        i = end
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def stale_manifests() -> list[str]:
    """The files of :data:`MANIFESTS` whose generated blocks differ from the registry (empty: none)."""
    return [
        name for name in MANIFESTS if rewrite((ROOT / name).read_text(), name) != (ROOT / name).read_text()
    ]


def write_manifests() -> list[str]:
    """Refill the generated blocks of :data:`MANIFESTS`; the files that changed."""
    changed = stale_manifests()
    for name in changed:
        path = ROOT / name
        path.write_text(rewrite(path.read_text(), name))
    return changed
