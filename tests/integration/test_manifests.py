"""The install manifests (``manifests/``, one ``kubectl apply -k``) against the real kube-apiserver.

Covers: the kustomization renders every component; a server-side dry run of the whole install is
accepted; the reconciler's RBAC is explicit (no wildcards), equals the table below and grants exactly
that when the apiserver is asked (SubjectAccessReview), while the webhook's ServiceAccount is bound
to nothing; the namespace users' roles are aggregated into view/edit/admin, read only, equal their
table and grant it only in the bound namespace (never a cluster-wide visibility path, never a
QueueUnit write); no role anywhere can escalate, bind or impersonate; the webhook configurations
carry the same webhooks, rules and scoping as the local test setup
(``testenv.webhooks.configurations``); the component config parses without warnings; the
Deployments are hardened (the apiserver's PodSecurity admission accepts their pods under the
``restricted`` level the namespace enforces) and wired to their Services, PDBs, Secret, ConfigMap and
flags; the visibility APIService reaches the reconciler's visibility port through its Service, with
the names the reconciler's flags certify and inject into.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from koord_queue.reconciler import main as reconciler_main
from koord_queue.reconciler import visibility as reconciler_visibility
from koord_queue.shared.admission import decisions as admission
from koord_queue.shared.api import names
from koord_queue.shared.core import config as component_config
from koord_queue.shared.core import visibility, workloadref
from koord_queue.shared.jobs import batch_job
from koord_queue.webhook import main as webhook_main
from testenv import binaries, kinds, system, webhooks
from testenv.cluster import LocalCluster
from testenv.processes import wait_until
from tests import kube

pytestmark = pytest.mark.integration

MANIFESTS = binaries.PROJECT_ROOT / "manifests"
NAMESPACE = names.COMPONENT_NAMESPACE
RECONCILER_SA = "koord-queue-reconciler"
WEBHOOK_SA = "koord-queue-webhook"
CERT_SECRET = "koord-queue-webhook-cert"
VISIBILITY_SECRET = "koord-queue-visibility-cert"
VISIBILITY_SERVICE = "koord-queue-visibility-server"
APISERVICE = "v1alpha1.visibility.koord-queue.x-k8s.io"
#: The apiserver publishes the requestheader CA here; the reconciler reads it (and nothing else there).
AUTH_NAMESPACE = "kube-system"
AUTH_CONFIGMAP = "extension-apiserver-authentication"
AUTH_READER = "koord-queue-reconciler-authentication-reader"
LEASE = "koord-queue-reconciler"
#: The quota-binding admission policy's parameters, kept by the reconciler.
BINDINGS_CONFIGMAP = names.QUOTA_BINDINGS_CONFIGMAP
#: manifests/quota-binding-policy.yaml, quota-tree-policy.yaml and quota-name-policy.yaml: each a
#: ValidatingAdmissionPolicy and its binding.
QUOTA_POLICIES = (
    "koord-queue-quota-binding",
    "koord-queue-reconciler-quota-writes",
    "koord-queue-quota-tree",
    "koord-queue-quota-name",
)
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
#: Only the reconciler removes a pod's admission gate (manifests/admission-gate-policy.yaml).
GATE_POLICY = "koord-queue-admission-gate"
#: A pod's unit annotations are frozen, its requests cannot grow in place (pod-links-policy.yaml).
POD_LINKS_POLICY = "koord-queue-pod-links"
#: ... and is born behind the admission gate (the same file).
POD_BIRTH_POLICY = "koord-queue-pod-birth"
WEBHOOK_CONFIGURATION = "koord-queue"

Doc = dict[str, Any]

#: The reconciler's permissions: (namespace or "" for the ClusterRole, apiGroup, resource,
#: resourceNames, verbs). Each line is a call the code makes (or, for reads, the informer's
#: get/list/watch); change it together with manifests/rbac/reconciler.yaml.
Grant = tuple[str, str, str, tuple[str, ...], tuple[str, ...]]


def rbac() -> tuple[Grant, ...]:
    """The table, with the job kinds of the registry as it is now (a test may register one more)."""
    return (
        ("", "scheduling.x-k8s.io", "queueunits", (), ("get", "list", "watch", "create", "patch", "delete")),
        ("", "scheduling.x-k8s.io", "queueunits/status", (), ("patch",)),
        # patch: only the ignored-reason annotation and the published figures, with status.used where
        # the CRD has no status subresource (the policy koord-queue-reconciler-quota-writes).
        # create, and patch on a pool's root quota: its min, max, labels and pool annotations
        # (docs/pools.md#the-tree-of-a-pool), the same policy's exception.
        ("", "scheduling.sigs.k8s.io", "elasticquotas", (), ("get", "list", "watch", "create", "patch")),
        ("", "scheduling.sigs.k8s.io", "elasticquotas/status", (), ("patch",)),
        # docs/pools.md: the profiles are watched and labelled with their tree id; nodes are read
        ("", "quota.koordinator.sh", "elasticquotaprofiles", (), ("get", "list", "watch", "patch")),
        ("", "", "nodes", (), ("get", "list", "watch")),
        ("", "scheduling.k8s.io", "priorityclasses", (), ("get", "list", "watch")),
        # docs/compatibility.md#requests-the-apiserver-fills-in: what the apiserver adds to pods
        ("", "", "limitranges", (), ("get", "list", "watch")),
        ("", "node.k8s.io", "runtimeclasses", (), ("get", "list", "watch")),
        # docs/operations.md#mandatory-queueing: namespace labels select where queueing is mandatory
        ("", "", "namespaces", (), ("get", "list", "watch")),
        # Every job kind of the registry: watched, and patched to hold or resume it (testenv/kinds.py).
        *(
            ("", group, resource, (), ("get", "list", "watch", "patch"))
            for group, resource in kinds.resources()
        ),
        ("", "", "pods", (), ("get", "list", "watch", "patch", "delete")),
        ("", "", "events", (), ("create", "patch")),
        # docs/compatibility.md#native-gang-hand-off: a gang's Workload, created before its pods are ungated
        ("", "scheduling.k8s.io", "workloads", (), ("create", "get")),
        (
            "",
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            (WEBHOOK_CONFIGURATION,),
            ("get", "update", "patch"),
        ),
        (
            "",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            (WEBHOOK_CONFIGURATION,),
            ("get", "update", "patch"),
        ),
        ("", "apiregistration.k8s.io", "apiservices", (APISERVICE,), ("get", "patch")),
        # docs/operations.md#metrics: a scraper's token, and its right to get /metrics, are asked
        ("", "authentication.k8s.io", "tokenreviews", (), ("create",)),
        ("", "authorization.k8s.io", "subjectaccessreviews", (), ("create",)),
        (
            NAMESPACE,
            "scheduling.x-k8s.io",
            "queues",
            (),
            ("get", "list", "watch", "create", "patch", "delete"),
        ),
        (NAMESPACE, "scheduling.x-k8s.io", "queues/status", (), ("patch",)),
        (NAMESPACE, "coordination.k8s.io", "leases", (), ("create",)),
        (NAMESPACE, "coordination.k8s.io", "leases", (LEASE,), ("get", "update")),
        (NAMESPACE, "", "secrets", (), ("create",)),
        (NAMESPACE, "", "secrets", (CERT_SECRET, VISIBILITY_SECRET), ("get", "update")),
        (NAMESPACE, "", "configmaps", (), ("create",)),
        (NAMESPACE, "", "configmaps", (BINDINGS_CONFIGMAP,), ("get", "update")),
        # where the webhook learns whether gang pod templates are stamped (the native gang hand-off)
        (NAMESPACE, "", "configmaps", (workloadref.STATE_CONFIGMAP,), ("delete", "get", "update")),
        (AUTH_NAMESPACE, "", "configmaps", (AUTH_CONFIGMAP,), ("get",)),
    )


RBAC: tuple[Grant, ...] = rbac()
CLUSTER_SCOPED = {
    "nodes",
    "priorityclasses",
    "runtimeclasses",
    "namespaces",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "apiservices",
}
#: A namespace standing for "any namespace where users run jobs".
USER_NAMESPACE = "team-a"

VISIBILITY_GROUP = visibility.GROUP
#: The namespace users' ClusterRoles (manifests/rbac/user-roles.yaml): name → the built-in role it is
#: aggregated into. Each grants exactly USER_RULES.
USER_ROLES = {
    "koord-queue-user-view": "view",
    "koord-queue-user-edit": "edit",
    "koord-queue-user-admin": "admin",
}
#: (group, resource, verb) every namespace user's role grants: reading our objects, and the
#: namespaced visibility paths (a collection GET is authorized as ``list``, a named one as ``get``).
USER_RULES = {
    *(
        (group, resource, verb)
        for group, resource in (
            ("scheduling.x-k8s.io", "queueunits"),
            ("scheduling.x-k8s.io", "queues"),
            ("scheduling.sigs.k8s.io", "elasticquotas"),
        )
        for verb in ("get", "list", "watch")
    ),
    (VISIBILITY_GROUP, "queueunits", "list"),
    (VISIBILITY_GROUP, "queues/queueunits", "get"),
    (VISIBILITY_GROUP, "quotas", "list"),
}
#: (namespace, group, resource, verb) a namespace user bound in USER_NAMESPACE must NOT be allowed.
USER_DENIED = (
    *(
        (USER_NAMESPACE, "scheduling.x-k8s.io", "queueunits", verb)
        for verb in ("create", "update", "patch", "delete", "deletecollection")
    ),
    *((USER_NAMESPACE, "scheduling.x-k8s.io", "queueunits/status", verb) for verb in ("update", "patch")),
    (USER_NAMESPACE, "scheduling.x-k8s.io", "queues", "create"),
    (USER_NAMESPACE, "scheduling.sigs.k8s.io", "elasticquotas", "patch"),
    (USER_NAMESPACE, "scheduling.sigs.k8s.io", "elasticquotas", "create"),
    (USER_NAMESPACE, "scheduling.sigs.k8s.io", "elasticquotas/status", "patch"),
    # Another namespace.
    ("team-b", "scheduling.x-k8s.io", "queueunits", "list"),
    ("team-b", VISIBILITY_GROUP, "queueunits", "list"),
    ("team-b", VISIBILITY_GROUP, "queues/queueunits", "get"),
    ("team-b", VISIBILITY_GROUP, "quotas", "list"),
    # The cluster-wide views stay with admins.
    ("", "scheduling.x-k8s.io", "queueunits", "list"),
    ("", VISIBILITY_GROUP, "queueunits", "list"),
    ("", VISIBILITY_GROUP, "queues/queueunits", "get"),
    ("", VISIBILITY_GROUP, "elasticquotas/queueunits", "get"),
    ("", VISIBILITY_GROUP, "quotas", "list"),
)

#: (namespace, group, resource, name, verb) the reconciler must NOT be allowed.
RECONCILER_DENIED = (
    (NAMESPACE, "", "secrets", "other-secret", "get"),
    (NAMESPACE, "", "secrets", "", "list"),
    ("default", "", "secrets", CERT_SECRET, "get"),
    (USER_NAMESPACE, "", "secrets", "", "create"),
    (USER_NAMESPACE, "scheduling.x-k8s.io", "queueunits", "u", "update"),
    (USER_NAMESPACE, "scheduling.x-k8s.io", "queues", "", "create"),
    (USER_NAMESPACE, "scheduling.sigs.k8s.io", "elasticquotas", "q", "update"),
    (USER_NAMESPACE, "scheduling.sigs.k8s.io", "elasticquotas", "q", "delete"),
    (USER_NAMESPACE, "quota.koordinator.sh", "elasticquotaprofiles", "", "create"),
    (USER_NAMESPACE, "quota.koordinator.sh", "elasticquotaprofiles", "p", "update"),
    (USER_NAMESPACE, "quota.koordinator.sh", "elasticquotaprofiles", "p", "delete"),
    (USER_NAMESPACE, "scheduling.sigs.k8s.io", "elasticquotas/status", "q", "update"),
    (NAMESPACE, "", "configmaps", "koord-queue-config", "update"),
    (NAMESPACE, "", "configmaps", "", "list"),
    (USER_NAMESPACE, "", "configmaps", "", "create"),
    (USER_NAMESPACE, "batch", "jobs", "j", "update"),
    (USER_NAMESPACE, "batch", "jobs", "j", "delete"),
    (USER_NAMESPACE, "", "pods", "", "create"),
    (USER_NAMESPACE, "", "pods", "p", "update"),
    (USER_NAMESPACE, "", "events", "e", "delete"),
    (NAMESPACE, "coordination.k8s.io", "leases", "other-lease", "update"),
    ("default", "coordination.k8s.io", "leases", "", "create"),
    ("", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "someone-else", "patch"),
    ("", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "list"),
    ("", "apiextensions.k8s.io", "customresourcedefinitions", "", "list"),
    # namespaces are only read (docs/operations.md#mandatory-queueing)
    ("", "", "namespaces", "team-a", "update"),
    # nodes are only read (docs/pools.md)
    ("", "", "nodes", "n", "update"),
    ("", "", "nodes", "n", "patch"),
    ("", "", "nodes", "n", "delete"),
    ("", "apiregistration.k8s.io", "apiservices", "v1beta1.metrics.k8s.io", "patch"),
    ("", "apiregistration.k8s.io", "apiservices", APISERVICE, "update"),
    ("", "apiregistration.k8s.io", "apiservices", APISERVICE, "delete"),
    ("", "apiregistration.k8s.io", "apiservices", "", "list"),
    (AUTH_NAMESPACE, "", "configmaps", AUTH_CONFIGMAP, "list"),
    (AUTH_NAMESPACE, "", "configmaps", AUTH_CONFIGMAP, "watch"),
    (AUTH_NAMESPACE, "", "configmaps", "kube-proxy", "get"),
    (AUTH_NAMESPACE, "", "secrets", "", "list"),
    (NAMESPACE, "", "configmaps", "koord-queue-config", "get"),
)
#: A sample of what the webhook's identity must not do: it needs nothing at all.
WEBHOOK_DENIED = (
    (USER_NAMESPACE, "", "pods", "", "list"),
    (USER_NAMESPACE, "batch", "jobs", "", "list"),
    (USER_NAMESPACE, "", "events", "", "create"),
    (USER_NAMESPACE, "scheduling.x-k8s.io", "queueunits", "", "list"),
    (NAMESPACE, "", "secrets", CERT_SECRET, "get"),
    (NAMESPACE, "coordination.k8s.io", "leases", LEASE, "get"),
    ("", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", WEBHOOK_CONFIGURATION, "get"),
)


# --- rendering -------------------------------------------------------------------------------------


def render() -> list[Doc]:
    """``kubectl kustomize manifests/`` (needs no cluster), parsed."""
    out = subprocess.run(
        [str(binaries.kubectl()), "kustomize", str(MANIFESTS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return render()


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected exactly one {kind} {name}, found {len(matches)}"
    return matches[0]


def of_kind(docs: list[Doc], *kinds: str) -> list[Doc]:
    return [d for d in docs if d["kind"] in kinds]


def test_kustomize_renders_every_component(integration_cluster: LocalCluster) -> None:
    out = kube.kubectl(integration_cluster, "kustomize", str(MANIFESTS)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    present = {(d["kind"], d["metadata"]["name"]) for d in docs}
    expected = {
        ("Namespace", NAMESPACE),
        ("CustomResourceDefinition", "queues.scheduling.x-k8s.io"),
        ("CustomResourceDefinition", "queueunits.scheduling.x-k8s.io"),
        ("CustomResourceDefinition", "elasticquotas.scheduling.sigs.k8s.io"),
        ("CustomResourceDefinition", "elasticquotaprofiles.quota.koordinator.sh"),
        ("ServiceAccount", WEBHOOK_SA),
        ("ServiceAccount", RECONCILER_SA),
        ("ClusterRole", RECONCILER_SA),
        ("ClusterRoleBinding", RECONCILER_SA),
        *(("ClusterRole", name) for name in USER_ROLES),
        # docs/operations.md#metrics: for scrapers of the reconciler's /metrics, bound to nobody
        ("ClusterRole", "koord-queue-metrics-reader"),
        ("Role", RECONCILER_SA),
        ("RoleBinding", RECONCILER_SA),
        ("ConfigMap", "koord-queue-config"),
        ("Deployment", "koord-queue-reconciler"),
        ("Deployment", "koord-queue-webhook"),
        ("Service", "koord-queue-reconciler"),
        ("Service", "koord-queue-webhook"),
        ("Service", VISIBILITY_SERVICE),
        ("APIService", APISERVICE),
        ("Role", AUTH_READER),
        ("RoleBinding", AUTH_READER),
        ("PodDisruptionBudget", "koord-queue-reconciler"),
        ("PodDisruptionBudget", "koord-queue-webhook"),
        ("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION),
        ("ValidatingWebhookConfiguration", WEBHOOK_CONFIGURATION),
        *(
            (kind, policy)
            for kind in POLICY_KINDS
            for policy in (*QUOTA_POLICIES, GATE_POLICY, POD_LINKS_POLICY, POD_BIRTH_POLICY)
        ),
        ("ValidatingAdmissionPolicyBinding", "koord-queue-quota-binding-fallback"),
    }
    assert present == expected, f"missing {expected - present}, unexpected {present - expected}"
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "APIService",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in docs:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert where is None, f"{doc['kind']} {doc['metadata']['name']} is cluster-scoped"
        elif doc["metadata"]["name"] == AUTH_READER:
            # The one exception: what reads the apiserver's ConfigMap must live next to it.
            assert where == AUTH_NAMESPACE, f"{doc['kind']} {AUTH_READER} in {where!r}"
        else:
            assert where == NAMESPACE, f"{doc['kind']} {doc['metadata']['name']} in {where!r}"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "koord-queue"


# --- the real apiserver ----------------------------------------------------------------------------


def ensure_namespace(cluster: LocalCluster, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    try:
        cluster.request("POST", "/api/v1/namespaces", body)
    except urllib.error.HTTPError as err:
        err.close()  # the error holds the response open
        assert err.code == 409, err  # it exists already


def status_of(cluster: LocalCluster, path: str) -> int:
    """The HTTP status of a GET (as cluster admin)."""
    try:
        cluster.request("GET", path)
    except urllib.error.HTTPError as err:
        err.close()
        return err.code
    return 200


def test_server_side_dry_run_accepts_the_whole_install(
    integration_cluster: LocalCluster, rendered: list[Doc]
) -> None:
    # A dry run creates nothing, not even the namespace the other objects go into.
    ensure_namespace(integration_cluster, NAMESPACE)
    result = kube.kubectl(integration_cluster, "apply", "--dry-run=server", "-k", str(MANIFESTS), check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for doc in rendered:
        kind, name = doc["kind"].lower(), doc["metadata"]["name"]
        assert any(
            line.split("/", 1)[0].split(".", 1)[0] == kind and line.split("/", 1)[1].startswith(f"{name} ")
            for line in lines
            if "/" in line
        ), f"{kind}/{name} not in the apply output:\n{result.stdout}"
    # Nothing was persisted: in particular no webhook configuration pointing at a missing Service.
    for path in (
        f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{WEBHOOK_CONFIGURATION}",
        f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_CONFIGURATION}",
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/koord-queue-webhook",
    ):
        assert status_of(integration_cluster, path) == 404, path


@pytest.mark.parametrize("name", ["koord-queue-webhook", "koord-queue-reconciler"])
def test_pods_meet_the_restricted_pod_security_standard_the_namespace_enforces(
    integration_cluster: LocalCluster, rendered: list[Doc], name: str
) -> None:
    """The namespace enforces ``restricted``; the apiserver's PodSecurity admission, not our
    reading of the standard, judges a dry-run Pod made from each Deployment's template."""
    labels = find(rendered, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    namespace = f"psa-{name}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}
    try:
        integration_cluster.request("POST", "/api/v1/namespaces", body)
    except urllib.error.HTTPError as err:
        err.close()
        assert err.code == 409, err
    template = find(rendered, "Deployment", name)["spec"]["template"]
    spec = {k: v for k, v in template["spec"].items() if k != "serviceAccountName"}  # no SA there
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **template["metadata"]},
        "spec": spec,
    }
    try:
        integration_cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod)
    except urllib.error.HTTPError as err:
        message = err.read().decode(errors="replace")
        err.close()
        pytest.fail(f"{name}: pod refused ({err.code}): {message}")


# --- RBAC ------------------------------------------------------------------------------------------


def bound_roles(docs: list[Doc], service_account: str) -> list[Doc]:
    """The Roles and ClusterRoles bound to ``service_account`` in the rendered manifests."""
    roles = []
    for binding in of_kind(docs, "RoleBinding", "ClusterRoleBinding"):
        subjects = binding.get("subjects") or []
        if any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == service_account
            and s.get("namespace") == NAMESPACE
            for s in subjects
        ):
            ref = binding["roleRef"]
            roles.append(find(docs, ref["kind"], ref["name"]))
    return roles


def test_reconciler_rbac_is_explicit_and_matches_the_table(rendered: list[Doc]) -> None:
    roles = bound_roles(rendered, RECONCILER_SA)
    assert sorted(r["kind"] for r in roles) == ["ClusterRole", "Role", "Role"]
    granted: set[tuple[str, str, str, tuple[str, ...], tuple[str, ...]]] = set()
    for role in roles:
        namespace = role["metadata"].get("namespace", "")
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule, rule
            for key in ("apiGroups", "resources", "verbs"):
                assert rule.get(key), f"{role['kind']} rule without {key}: {rule}"
                assert not any("*" in value for value in rule[key]), f"wildcard in {key}: {rule}"
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.add(
                        (
                            namespace,
                            group,
                            resource,
                            tuple(rule.get("resourceNames") or ()),
                            tuple(sorted(rule["verbs"])),
                        )
                    )
    expected = {(ns, g, r, n, tuple(sorted(v))) for ns, g, r, n, v in RBAC}
    assert granted == expected, f"missing {expected - granted}, unexpected {granted - expected}"
    # Secrets only through the namespaced Role, and reading only the certificate Secrets; the
    # apiserver's ConfigMap only read, only by name.
    for ns, group, resource, resource_names, verbs in granted:
        if group == "" and resource == "secrets":
            assert ns == NAMESPACE
            assert set(verbs) == {"create"} or resource_names == (CERT_SECRET, VISIBILITY_SECRET)
        if group == "" and resource == "configmaps":
            assert (ns, resource_names, verbs) in (
                (AUTH_NAMESPACE, (AUTH_CONFIGMAP,), ("get",)),
                (NAMESPACE, (), ("create",)),
                (NAMESPACE, (BINDINGS_CONFIGMAP,), ("get", "update")),
                (NAMESPACE, (workloadref.STATE_CONFIGMAP,), ("delete", "get", "update")),
            )


def test_webhook_service_account_is_bound_to_nothing(rendered: list[Doc]) -> None:
    assert bound_roles(rendered, WEBHOOK_SA) == []
    for binding in of_kind(rendered, "RoleBinding", "ClusterRoleBinding"):
        assert all(s.get("name") != WEBHOOK_SA for s in binding.get("subjects") or []), binding
    assert find(rendered, "ServiceAccount", WEBHOOK_SA).get("automountServiceAccountToken") is False
    pod = find(rendered, "Deployment", "koord-queue-webhook")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == WEBHOOK_SA
    assert pod["automountServiceAccountToken"] is False


@pytest.fixture(scope="module")
def rbac_installed(integration_cluster: LocalCluster, rendered: list[Doc]) -> Iterator[LocalCluster]:
    """Apply only the ServiceAccounts, Roles and bindings for real (idempotent; left in place: they
    are what an install creates, and harmless without the Deployments)."""
    ensure_namespace(integration_cluster, NAMESPACE)
    docs = of_kind(rendered, "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    kube.kubectl(integration_cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
    yield integration_cluster


def allowed(
    cluster: LocalCluster,
    service_account: str,
    *,
    namespace: str,
    group: str,
    resource: str,
    name: str,
    verb: str,
) -> bool:
    """Ask the apiserver (SubjectAccessReview) whether the ServiceAccount may do this."""
    return review(
        cluster,
        user=f"system:serviceaccount:{NAMESPACE}:{service_account}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"),
        namespace=namespace,
        group=group,
        resource=resource,
        name=name,
        verb=verb,
    )


def review(
    cluster: LocalCluster,
    *,
    user: str,
    groups: tuple[str, ...],
    namespace: str,
    group: str,
    resource: str,
    name: str,
    verb: str,
) -> bool:
    """Ask the apiserver (SubjectAccessReview) whether ``user`` in ``groups`` may do this."""
    resource, _, subresource = resource.partition("/")
    attributes = {"verb": verb, "group": group, "resource": resource}
    if subresource:
        attributes["subresource"] = subresource
    if namespace:
        attributes["namespace"] = namespace
    if name:
        attributes["name"] = name
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": list(groups), "resourceAttributes": attributes},
    }
    out = cluster.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
    return bool(json.loads(out)["status"].get("allowed"))


def test_the_apiserver_grants_the_reconciler_its_table_and_nothing_more(
    rbac_installed: LocalCluster,
) -> None:
    missing = []
    for ns, group, resource, resource_names, verbs in RBAC:
        base = resource.split("/")[0]
        namespace = "" if base in CLUSTER_SCOPED else (ns or USER_NAMESPACE)
        for verb in verbs:
            # Calls on one object carry its name; collection calls (list, watch, create) do not.
            collection = verb in ("list", "watch", "create")
            for name_for_call in resource_names or ("" if collection else "some-object",):
                if not allowed(
                    rbac_installed,
                    RECONCILER_SA,
                    namespace=namespace,
                    group=group,
                    resource=resource,
                    name=name_for_call,
                    verb=verb,
                ):
                    missing.append((namespace, group, resource, name_for_call, verb))
    assert missing == []
    excessive = [
        probe
        for probe in RECONCILER_DENIED
        if allowed(
            rbac_installed,
            RECONCILER_SA,
            namespace=probe[0],
            group=probe[1],
            resource=probe[2],
            name=probe[3],
            verb=probe[4],
        )
    ]
    assert excessive == []


def test_the_apiserver_grants_the_webhook_nothing(rbac_installed: LocalCluster) -> None:
    excessive = [
        probe
        for probe in WEBHOOK_DENIED
        if allowed(
            rbac_installed,
            WEBHOOK_SA,
            namespace=probe[0],
            group=probe[1],
            resource=probe[2],
            name=probe[3],
            verb=probe[4],
        )
    ]
    assert excessive == []


def test_no_role_can_escalate_bind_or_impersonate(rendered: list[Doc]) -> None:
    for role in of_kind(rendered, "ClusterRole", "Role"):
        for rule in role.get("rules") or []:
            assert not {"escalate", "bind", "impersonate", "*"} & set(rule["verbs"]), (role, rule)
            for key in ("apiGroups", "resources"):
                assert "*" not in (rule.get(key) or []), (role["metadata"]["name"], rule)


AGGREGATE_LABEL = "rbac.authorization.k8s.io/aggregate-to-"


def test_namespace_users_roles_are_read_only_and_aggregated_into_view_edit_and_admin(
    rendered: list[Doc],
) -> None:
    for name, builtin in USER_ROLES.items():
        role = find(rendered, "ClusterRole", name)
        labels = role["metadata"]["labels"]
        assert {k: v for k, v in labels.items() if k.startswith(AGGREGATE_LABEL)} == {
            f"{AGGREGATE_LABEL}{builtin}": "true"
        }, name
        assert "aggregationRule" not in role
        granted: set[tuple[str, str, str]] = set()
        for rule in role["rules"]:
            # No resourceNames or nonResourceURLs: plain reads of whole resources.
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
            # Read only, whatever the table says: a namespace user never writes a unit or its status.
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, (name, rule)
            granted |= {
                (g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
            }
        assert granted == USER_RULES, (name, USER_RULES - granted, granted - USER_RULES)
    # Only these carry an aggregation label, and none is bound directly: users get them through the
    # built-in roles their namespace admin binds.
    aggregated = {
        d["metadata"]["name"]
        for d in of_kind(rendered, "ClusterRole")
        if any(k.startswith(AGGREGATE_LABEL) for k in d["metadata"].get("labels") or {})
    }
    assert aggregated == set(USER_ROLES)
    for binding in of_kind(rendered, "RoleBinding", "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] not in USER_ROLES, binding


@pytest.mark.parametrize("role", sorted(USER_ROLES))
def test_the_apiserver_grants_a_namespace_user_their_table_in_their_namespace_only(
    rbac_installed: LocalCluster, role: str
) -> None:
    """Without a controller-manager nothing aggregates here: the user is bound to our ClusterRole
    itself with a RoleBinding, which is what aggregation into view/edit/admin adds to theirs."""
    user = f"tenant-{role}"
    ensure_namespace(rbac_installed, USER_NAMESPACE)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{role}-test", "namespace": USER_NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    kube.kubectl(rbac_installed, "apply", "-f", "-", input_text=json.dumps(binding))

    def may(namespace: str, group: str, resource: str, verb: str) -> bool:
        collection = verb in ("list", "watch", "create", "deletecollection")
        return review(
            rbac_installed,
            user=user,
            groups=("system:authenticated",),
            namespace=namespace,
            group=group,
            resource=resource,
            name="" if collection else "some-object",
            verb=verb,
        )

    try:
        wait_until(
            lambda: may(USER_NAMESPACE, "scheduling.x-k8s.io", "queueunits", "list"),
            timeout=30,
            what=f"the RoleBinding to {role} in effect",
        )
        missing = [(g, r, v) for g, r, v in sorted(USER_RULES) if not may(USER_NAMESPACE, g, r, v)]
        assert missing == []
        excessive = [probe for probe in USER_DENIED if may(*probe)]
        assert excessive == []
    finally:
        kube.kubectl(rbac_installed, "delete", "-f", "-", input_text=json.dumps(binding), check=False)


# --- webhook configurations ------------------------------------------------------------------------


def test_webhook_configurations_match_the_local_test_setup(rendered: list[Doc]) -> None:
    local = {c["kind"]: c for c in webhooks.configurations(url="https://127.0.0.1:1", ca_pem=b"ca")}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        ours = find(rendered, kind, WEBHOOK_CONFIGURATION)
        theirs = local[kind]
        assert [w["name"] for w in ours["webhooks"]] == [w["name"] for w in theirs["webhooks"]]
        for mine, reference in zip(ours["webhooks"], theirs["webhooks"], strict=True):
            name = mine["name"]
            # Every setting but the client config is identical (no extra keys either way).
            assert {k: v for k, v in mine.items() if k != "clientConfig"} == {
                k: v for k, v in reference.items() if k != "clientConfig"
            }, name
            for key, value in {
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "admissionReviewVersions": ["v1"],
            }.items():
                assert mine[key] == value, (name, key)
            assert mine["clientConfig"] == {
                "service": {
                    "name": "koord-queue-webhook",
                    "namespace": NAMESPACE,
                    "path": urlsplit(reference["clientConfig"]["url"]).path,
                    "port": 443,
                }
            }, name  # no caBundle: the reconciler injects it and a re-apply must not wipe it


def test_the_pod_webhook_sees_only_the_creation_of_pods_labelled_for_the_gate(rendered: list[Doc]) -> None:
    """failurePolicy Fail on pods is safe only because the webhook is scoped to pods that must be
    gated: any other pod never waits for it, so an outage blocks only those."""
    config = find(rendered, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)
    [hook] = [w for w in config["webhooks"] if w["name"] == "pods.mutate.koord-queue.x-k8s.io"]
    assert hook["clientConfig"]["service"]["path"] == "/mutate-pod"
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": names.GATED_POD_LABEL, "operator": "Exists"}]
    }
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and set(excluded["values"]) == {"kube-system", NAMESPACE}
    # Every other webhook on pods would widen that: none exists.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for other in find(rendered, kind, WEBHOOK_CONFIGURATION)["webhooks"]:
            if other is not hook:
                assert all("pods" not in rule["resources"] for rule in other["rules"]), other["name"]


# --- configuration and Deployments -----------------------------------------------------------------


def test_component_config_is_accepted_without_warnings(rendered: list[Doc]) -> None:
    text = find(rendered, "ConfigMap", "koord-queue-config")["data"]["config.yaml"]
    settings = component_config.parse(text, source="koord-queue-config")
    assert settings.warnings == ()
    assert settings.reclaim_protect_seconds == 0
    assert settings.quota_namespace_binding is True
    assert settings.max_user_priority is None
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("scheduling.k8s.io/v1", "KoordQueueConfiguration")
    assert doc["plugins"] == [{"name": "Priority"}, {"name": "ElasticQuotaV2"}]


def container_of(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


@pytest.mark.parametrize("name", ["koord-queue-webhook", "koord-queue-reconciler"])
def test_deployment_is_highly_available_and_hardened(rendered: list[Doc], name: str) -> None:
    deployment = find(rendered, "Deployment", name)
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items())
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert any(c["topologyKey"] == "kubernetes.io/hostname" for c in pod["topologySpreadConstraints"])
    container = container_of(deployment)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsNonRoot"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind
    assert container["livenessProbe"] and container["readinessProbe"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports, probe

    # The PDB and the Service select these pods; the Service's target ports exist.
    pdb = find(rendered, "PodDisruptionBudget", name)
    assert pdb["spec"]["minAvailable"] == 1
    assert all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    service = find(rendered, "Service", name)
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports, port
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}


def test_webhook_deployment_serves_the_certificate_secret_behind_port_443(rendered: list[Doc]) -> None:
    deployment = find(rendered, "Deployment", "koord-queue-webhook")
    container = container_of(deployment)
    assert container["command"] == ["koord-queue-webhook"]
    config, _ = webhook_main.parse_config(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config.port == ports["webhook"] == 9443
    assert config.metrics_port == ports["metrics"]
    # Only the reconciler may resume a queued job: the webhook's namespace, which the downward API
    # gives it (docs/operations.md#install-namespace), names the reconciler's ServiceAccount.
    reconciler_user = f"system:serviceaccount:{NAMESPACE}:{RECONCILER_SA}"
    env = {e["name"]: e.get("valueFrom") for e in container.get("env", [])}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    for namespace in (NAMESPACE, "elsewhere"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("POD_NAMESPACE", namespace)
            moved, _ = webhook_main.parse_config(container["args"])
        assert moved.admission.reconciler_username == f"system:serviceaccount:{namespace}:{RECONCILER_SA}"
    assert config.admission.reconciler_username == reconciler_user
    assert system.RECONCILER_USER == admission.DEFAULT_RECONCILER_USERNAME == reconciler_user

    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    cert_volume = volumes[mounts[str(config.cert_file.parent)]]
    assert cert_volume["secret"]["secretName"] == CERT_SECRET
    assert str(config.key_file.parent) == str(config.cert_file.parent)
    # Only the serving pair is projected: the CA key in the same Secret stays out of the pod.
    assert {i["key"]: i["path"] for i in cert_volume["secret"]["items"]} == {
        "tls.crt": config.cert_file.name,
        "tls.key": config.key_file.name,
    }

    service = find(rendered, "Service", "koord-queue-webhook")
    https = next(p for p in service["spec"]["ports"] if p["port"] == 443)
    assert https["targetPort"] == "webhook"
    # docs/operations.md#metrics: probes on the plain health port, /metrics for the client CA only,
    # the CA from an optional ConfigMap (the webhook refuses every scraper until it exists).
    assert config.health_port == ports["health"] == 8081
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "health"
        assert container[probe]["httpGet"].get("scheme", "HTTP") == "HTTP"
    assert config.metrics_client_ca is not None and not config.metrics_insecure
    ca_volume = volumes[mounts[str(config.metrics_client_ca.parent)]]
    assert ca_volume["configMap"] == {
        "name": "koord-queue-metrics-client-ca",
        "optional": True,
        "items": [{"key": "ca.crt", "path": config.metrics_client_ca.name}],
    }


def test_reconciler_deployment_reads_its_config_and_elects_a_leader(rendered: list[Doc]) -> None:
    deployment = find(rendered, "Deployment", "koord-queue-reconciler")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RECONCILER_SA
    container = container_of(deployment)
    assert "command" not in container  # the image's ENTRYPOINT is koord-queue-reconciler
    assert "--leader-elect" in container["args"]
    # Every other flag is one the reconciler understands (--leader-elect comes with the election).
    args = reconciler_main.parse_args([a for a in container["args"] if a != "--leader-elect"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.health_port == ports["health"] == 8081
    assert args.metrics_port == ports["metrics"] == 10259
    # docs/operations.md#metrics: HTTPS with token and access reviews, never plain in a cluster.
    assert args.metrics_secure is True and "--metrics-secure=false" not in container["args"]
    # The webhook's serving certificate exists only because the reconciler issues it: without this
    # flag the webhook pods never start and every labelled job is refused.
    assert args.manage_webhook_certs and args.manage_visibility_certs
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"

    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container["volumeMounts"] if str(args.config).startswith(m["mountPath"] + "/"))
    config_map = volumes[mount["name"]]["configMap"]
    assert config_map["name"] == "koord-queue-config"
    assert args.config.name in {i["path"] for i in config_map["items"]}


def test_the_visibility_apiservice_reaches_the_reconcilers_visibility_port(rendered: list[Doc]) -> None:
    apiservice = find(rendered, "APIService", APISERVICE)
    spec = apiservice["spec"]
    assert f"{spec['version']}.{spec['group']}" == APISERVICE == reconciler_visibility.APISERVICE
    assert f"{spec['group']}/{spec['version']}" == visibility.API_VERSION
    assert 0 < spec["groupPriorityMinimum"] < 1000 and spec["versionPriority"] > 0
    # Trust comes from the caBundle the reconciler injects; nothing may switch verification off.
    assert "caBundle" not in spec and not spec.get("insecureSkipTLSVerify")
    assert spec["service"] == {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE, "port": 443}

    service = find(rendered, "Service", VISIBILITY_SERVICE)
    port = next(p for p in service["spec"]["ports"] if p["port"] == 443)
    deployment = find(rendered, "Deployment", "koord-queue-reconciler")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    container = container_of(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = reconciler_main.parse_args([a for a in container["args"] if a != "--leader-elect"])
    assert ports[port["targetPort"]] == args.visibility_port == 8082

    # The reconciler certifies the Service's name, keeps the pair in the Secret its RBAC names and
    # injects the CA into this APIService; no files are mounted for it.
    assert args.manage_visibility_certs and not args.visibility_cert_file
    assert (args.visibility_namespace, args.visibility_service) == (NAMESPACE, VISIBILITY_SERVICE)
    assert args.visibility_secret == VISIBILITY_SECRET
    assert args.visibility_apiservice == APISERVICE
    assert not args.visibility_client_ca  # read from the apiserver's ConfigMap, which RBAC allows


# --- the quota-binding admission policy ------------------------------------------------------------


def test_the_quota_binding_policy_covers_what_the_job_webhooks_cover(rendered: list[Doc]) -> None:
    """Same job kinds, operations and namespace scoping as the validating job webhooks; the
    reconciler exempt; its parameters the ConfigMap the reconciler keeps, allowing until it exists."""
    policy = find(rendered, "ValidatingAdmissionPolicy", "koord-queue-quota-binding")["spec"]
    webhook = find(rendered, "ValidatingWebhookConfiguration", WEBHOOK_CONFIGURATION)["webhooks"][0]
    assert webhook["name"] == "jobs.validate.koord-queue.x-k8s.io"
    assert policy["failurePolicy"] == "Fail"
    assert policy["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    constraints = policy["matchConstraints"]
    assert constraints["namespaceSelector"] == webhook["namespaceSelector"]
    # The validating job webhooks take UPDATE only (the mutating one checks CREATE); the policy
    # needs CREATE too, for a job created with a quota its namespace is not bound to.
    assert [{k: v for k, v in r.items() if k not in ("scope", "operations")} for r in webhook["rules"]] == [
        {k: v for k, v in r.items() if k != "operations"} for r in constraints["resourceRules"]
    ]
    assert {tuple(r["operations"]) for r in webhook["rules"]} == {("UPDATE",)}
    assert {tuple(r["operations"]) for r in constraints["resourceRules"]} == {("CREATE", "UPDATE")}
    conditions = {c["name"]: c["expression"] for c in policy["matchConditions"]}
    assert conditions["not-the-reconciler"] == webhook["matchConditions"][0]["expression"]
    assert names.QUOTA_NAME_LABEL in conditions["carries-a-quota-label"]
    assert names.QUOTA_NAME_LABEL_FALLBACK in conditions["carries-a-quota-label"]
    # One binding per quota label, each selecting only objects carrying it: until the apiserver has
    # loaded the parameter a matching binding refuses everything, so it must never match
    # unrelated workloads.
    for name, label in (
        ("koord-queue-quota-binding", names.QUOTA_NAME_LABEL),
        ("koord-queue-quota-binding-fallback", names.QUOTA_NAME_LABEL_FALLBACK),
    ):
        binding = find(rendered, "ValidatingAdmissionPolicyBinding", name)["spec"]
        assert binding["policyName"] == "koord-queue-quota-binding"
        assert binding["validationActions"] == ["Deny"]
        assert binding["paramRef"] == {
            "name": BINDINGS_CONFIGMAP,
            "namespace": NAMESPACE,
            "parameterNotFoundAction": "Allow",
        }
        assert binding["matchResources"]["objectSelector"] == {
            "matchExpressions": [{"key": label, "operator": "Exists"}]
        }
    # The denial text is the scheduler's waiting message, built in CEL: the same literals around
    # the same values.
    validation, parent_rule = policy["validations"]
    # The second rule refuses a parent quota with the scheduler's text for it.
    parent_parts = re.split("(QUOTA)", names.Message.parent_quota("QUOTA"))
    parent_cel = " + ".join("variables.quota" if p == "QUOTA" else f"'{p}'" for p in parent_parts if p)
    assert " ".join(parent_rule["messageExpression"].split()).replace("' + '", "") == " ".join(
        parent_cel.split()
    ).replace("' + '", "")
    variables = {"QUOTA": "variables.quota", "NAMESPACE": "request.namespace", "USABLE": "variables.usable"}
    parts = re.split(
        "(QUOTA|NAMESPACE|USABLE)", names.quota_not_bound_message("QUOTA", "NAMESPACE", ["USABLE"])
    )
    cel = " + ".join(variables.get(p, f"'{p}'") for p in parts if p)
    assert " ".join(validation["messageExpression"].split()) == cel
    writes = find(rendered, "ValidatingAdmissionPolicyBinding", "koord-queue-reconciler-quota-writes")["spec"]
    assert writes["validationActions"] == ["Deny"]


class _ToyAdapter(batch_job.BatchJobAdapter):
    """A kind with no file in tests/crds, in two versions (only its identity matters here)."""

    extension = "toyjob"
    api_version = "example.com/v1"
    kind = "ToyJob"
    plural = "toyjobs"
    queue_unit_suffix = "toy-qu"


class _ToyV1Beta1Adapter(_ToyAdapter):
    api_version = "example.com/v1beta1"


class _StatuslessToyAdapter(_ToyAdapter):
    """As Argo's Workflow: the CRD has no status subresource."""

    api_version = "example.com/v1"
    kind = "StatuslessToy"
    plural = "statuslesstoys"
    status_subresource = False


@pytest.mark.parametrize(
    ("adapters", "status"),
    [((_ToyAdapter(), _ToyV1Beta1Adapter()), True), ((_StatuslessToyAdapter(),), False)],
)
def test_a_kind_without_a_crd_file_gets_a_minimal_crd_the_apiserver_serves(
    integration_cluster: LocalCluster, adapters: tuple[batch_job.BatchJobAdapter, ...], status: bool
) -> None:
    """``testenv/system.py`` installs, for a registry kind without a file in tests/crds, the CRD that
    ``testenv/kinds.py`` derives from its adapter: the apiserver accepts it, serves every version the
    adapters read, keeps every field, and serves the status subresource exactly when the adapter says
    its CRD has one (docs/development.md#adding-a-job-kind)."""
    plural = adapters[0].plural
    crd = kinds.minimal_crd("example.com", plural, adapters)
    kube.kubectl(integration_cluster, "apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(crd))
    name = crd["metadata"]["name"]
    try:
        integration_cluster.wait_for_crds([name])
        ensure_namespace(integration_cluster, "toys")
        for adapter in adapters:
            version = adapter.api_version.split("/")[1]
            base_path = f"/apis/example.com/{version}/namespaces/toys/{plural}"
            body = {
                "apiVersion": adapter.api_version,
                "kind": adapter.kind,
                "metadata": {"name": f"t-{version}"},
                "spec": {"suspend": True, "template": {"spec": {"containers": [{"name": "a"}]}}},
            }
            stored = json.loads(integration_cluster.request("POST", base_path, body))
            assert stored["spec"] == body["spec"], stored  # nothing pruned
            patch = {"status": {"phase": "Running"}}
            code = 200
            try:
                integration_cluster.request(
                    "PATCH",
                    f"{base_path}/t-{version}/status",
                    patch,
                    content_type="application/merge-patch+json",
                )
            except urllib.error.HTTPError as err:
                err.close()  # the error holds the response open
                code = err.code
            assert code == (200 if status else 404), (adapter, code)
    finally:
        integration_cluster.request(
            "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        )


def test_the_metrics_reader_grants_get_metrics_and_nothing_else(rendered: list[Doc]) -> None:
    """docs/operations.md#metrics: the ClusterRole a scraper is bound to reads /metrics only, is
    aggregated into no built-in role (so no namespace user gets it with view, edit or admin), and
    the install binds nobody to it."""
    role = find(rendered, "ClusterRole", "koord-queue-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not any(
        k.startswith("rbac.authorization.k8s.io/aggregate") for k in role["metadata"].get("labels", {})
    )
    for binding in of_kind(rendered, "RoleBinding", "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] != "koord-queue-metrics-reader", binding
