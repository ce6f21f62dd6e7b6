"""The webhook configurations of the local system: manifests/webhook-configurations.yaml by URL.

The integration and e2e tests register the webhook that ``testenv/system.py`` starts on loopback,
so the configurations name a URL instead of a Service; everything else (rules, scoping, the
reconciler's exemption, the webhooks mandatory queueing adds) is what the manifests say, and
``tests/integration/test_manifests.py`` holds the two equal. Kept apart from the processes that
``system.py`` starts because they are data, built from the job registry (``testenv/kinds.py``).
"""

from __future__ import annotations

import base64
from typing import Any, Final

from koord_queue.shared.api import names
from testenv import kinds

#: The configurations' name (the manifests' is ``koord-queue``, so both can be told apart).
CONFIG_NAME: Final = "koord-queue-local"


def configurations(
    *,
    url: str,
    ca_pem: bytes,
    mandatory_namespaces: dict[str, Any] | None = None,
    namespace: str = names.COMPONENT_NAMESPACE,
) -> list[dict[str, Any]]:
    """The local equivalents of manifests/webhook: same rules and scoping, URL instead of Service.

    ``mandatory_namespaces``: a label selector of the namespaces where queueing is mandatory
    (docs/operations.md#mandatory-queueing); it adds the webhooks for their unlabelled jobs, as the
    chart does with ``config.manageJobsWithoutQuotaName``. ``namespace``: the install namespace,
    left out by every job webhook, whose reconciler's writes skip the validating ones.
    """
    ca = base64.b64encode(ca_pem).decode()
    reconciler = names.reconciler_username(namespace)
    # Every webhook leaves out kube-system and the install namespace.
    exclusion = [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", namespace]}
    ]
    scope = {
        "namespaceSelector": {"matchExpressions": exclusion},
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        "failurePolicy": "Fail",
    }
    quota_label = {
        "objectSelector": {
            "matchExpressions": [{"key": "quota.scheduling.koordinator.sh/name", "operator": "Exists"}]
        }
    }
    fallback_label = {
        "objectSelector": {"matchExpressions": [{"key": "alibabacloud.com/quota-name", "operator": "Exists"}]}
    }
    # Every kind in the registry (testenv/kinds.py; manifests/ has the same list, generated).
    job_rules = kinds.match_rules()

    gated_label = {
        "objectSelector": {"matchExpressions": [{"key": names.GATED_POD_LABEL, "operator": "Exists"}]}
    }
    pod_rules = [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]

    def rules(ops: list[str], specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "operations": ops, "scope": "Namespaced"} for r in specs]

    def hook(
        name: str, path: str, ops: list[str], specs: list[dict[str, Any]], selector: dict[str, Any]
    ) -> dict[str, Any]:
        webhook = {
            "name": name,
            "clientConfig": {"url": f"{url}{path}", "caBundle": ca},
            "rules": rules(ops, specs),
            **scope,
            **selector,
        }
        if path.startswith("/validate"):
            # The reconciler's own writes skip the call (the webhook allows them anyway), so they
            # keep working while the webhook is down.
            webhook["matchConditions"] = [
                {
                    "name": "not-the-reconciler",
                    "expression": f"request.userInfo.username != '{reconciler}'",
                }
            ]
        return webhook

    our_kinds = [
        {
            "apiGroups": ["scheduling.x-k8s.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["queues", "queueunits"],
        },
        {
            "apiGroups": ["scheduling.sigs.k8s.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["elasticquotas"],
        },
    ]
    mutating: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG_NAME},
        "webhooks": [
            hook("jobs.mutate.koord-queue.x-k8s.io", "/mutate", ["CREATE"], job_rules, quota_label),
            hook(
                "jobs-fallback.mutate.koord-queue.x-k8s.io", "/mutate", ["CREATE"], job_rules, fallback_label
            ),
            # Pods of kinds without a pod template (SparkApplication) carry this label instead:
            # the webhook gates them; called again if a later webhook changed the pod.
            {
                **hook("pods.mutate.koord-queue.x-k8s.io", "/mutate-pod", ["CREATE"], pod_rules, gated_label),
                "reinvocationPolicy": "IfNeeded",
            },
        ],
    }
    validating: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIG_NAME},
        "webhooks": [
            hook(
                "jobs.validate.koord-queue.x-k8s.io",
                "/validate",
                ["UPDATE"],
                job_rules,
                quota_label,
            ),
            hook(
                "jobs-fallback.validate.koord-queue.x-k8s.io",
                "/validate",
                ["UPDATE"],
                job_rules,
                fallback_label,
            ),
            # Our own objects live in koord-queue too (auto-created Queues): validate them everywhere.
            hook(
                "api.validate.koord-queue.x-k8s.io",
                "/validate",
                ["CREATE", "UPDATE"],
                our_kinds,
                {"namespaceSelector": {}},
            ),
        ],
    }
    if mandatory_namespaces is not None:
        selected = _unlabelled_in(mandatory_namespaces, exclusion)
        mutating["webhooks"].append(
            {
                **hook(
                    "unlabelled-jobs.mutate.koord-queue.x-k8s.io",
                    "/mutate-unlabelled",
                    ["CREATE"],
                    job_rules,
                    {},
                ),
                **selected,
            }
        )
        validating["webhooks"].append(
            {
                **hook(
                    "unlabelled-jobs.validate.koord-queue.x-k8s.io",
                    "/validate-unlabelled",
                    ["UPDATE"],
                    job_rules,
                    {},
                ),
                **selected,
            }
        )
    return [mutating, validating]


def _unlabelled_in(mandatory_namespaces: dict[str, Any], exclusion: list[dict[str, Any]]) -> dict[str, Any]:
    """The selectors of the webhooks for unlabelled jobs: the namespaces where queueing is
    mandatory (docs/operations.md#mandatory-queueing) but never the excluded ones, and only jobs
    with neither quota label (labelled jobs have their own webhooks)."""
    labels = mandatory_namespaces.get("matchLabels")
    return {
        "namespaceSelector": {
            **({"matchLabels": labels} if labels else {}),
            "matchExpressions": [*exclusion, *(mandatory_namespaces.get("matchExpressions") or [])],
        },
        "objectSelector": {
            "matchExpressions": [
                {"key": "quota.scheduling.koordinator.sh/name", "operator": "DoesNotExist"},
                {"key": "alibabacloud.com/quota-name", "operator": "DoesNotExist"},
            ]
        },
    }
