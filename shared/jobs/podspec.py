"""Per-pod resource requests, computed the way the kube-scheduler sees a pod.

The queue charges a pod set ``per_pod x count``, so ``per_pod`` must match what the scheduler will
reserve, or the quota admits work the nodes cannot hold (or holds back work that fits). The rule
(``k8s.io/component-helpers/resource.PodRequests``):

1. each container asks for its ``requests``; a resource with only a ``limits`` entry asks for the
   limit (the apiserver defaults requests from limits);
2. the regular containers run together, so they add up; so do sidecars (init containers with
   ``restartPolicy: Always``), which keep running next to them;
3. each ordinary init container runs alone next to the sidecars started before it, so the pod needs
   the *maximum* of the steady state and every init step;
4. ``spec.overhead`` (RuntimeClass overhead) is added on top.

Also here: the ``koord-queue/min-resources`` annotation (a ResourceList written as JSON or YAML),
shared by the Workflow adapter and the validating webhook so both accept exactly the same text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from koord_queue.shared.api import podtemplates as shared_podspec
from koord_queue.shared.api import quantities
from koord_queue.shared.jobs.base import JobSpecError, optional_mapping, require_mapping

# libyaml when available: the pure-Python loader is ~10x slower on large annotations.
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_QUANTITY_HINT = "must be a quantity such as 500m, 2 or 4Gi"


def parse_resources(raw: object, path: str) -> dict[str, int]:
    """A ResourceList (``{name: quantity}``) in milli-units, keys sorted; negatives rejected."""
    mapping = optional_mapping(raw, path)
    parsed: dict[str, int] = {}
    for name, value in mapping.items():
        if not isinstance(name, str) or not name:
            raise JobSpecError(path, f"Invalid value: resource name {name!r} must be a non-empty string")
        where = f"{path}[{name}]"
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise JobSpecError(where, f"Invalid value: {_QUANTITY_HINT}")
        try:
            milli = quantities.parse_milli(value)
        except quantities.QuantityError as err:
            raise JobSpecError(where, f"Invalid value: {err}") from None
        if milli < 0:
            raise JobSpecError(where, f"Invalid value: {value!r}: must be greater than or equal to 0")
        parsed[name] = milli
    return dict(sorted(parsed.items()))


def pod_requests(spec: object, path: str) -> dict[str, int]:
    """Requests of one pod built from the pod spec ``spec``: ``shared.api.podtemplates`` decides (one rule for
    the webhook, the job extensions and the scheduler); its errors become :class:`JobSpecError`."""
    pod = require_mapping(spec, path)
    try:
        return shared_podspec.pod_requests(pod, path=path)
    except quantities.QuantityError as err:
        where, _, detail = str(err).partition(": ")
        raise JobSpecError(where or path, f"Invalid value: {detail or err}") from None


def template_requests(template: object, path: str) -> dict[str, int]:
    """Requests of one pod created from a PodTemplateSpec."""
    return pod_requests(require_mapping(template, path).get("spec"), f"{path}.spec")


def load_resource_text(value: str, path: str) -> Mapping[str, Any]:
    """The raw mapping in a ResourceList annotation: JSON when it starts with ``{``, else YAML.

    An empty text is an empty mapping. Raises :class:`JobSpecError` naming ``path`` when the text
    does not parse or is not a mapping; the quantities inside are not checked here.
    """
    stripped = value.strip()
    try:
        raw = json.loads(stripped) if stripped.startswith("{") else yaml.load(stripped, Loader=_YAML_LOADER)
    except (ValueError, yaml.YAMLError, RecursionError):
        raise JobSpecError(
            path, 'Invalid value: must be a resource list in JSON or YAML, e.g. {"cpu": "2", "memory": "4Gi"}'
        ) from None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise JobSpecError(path, "Invalid value: must be a map of resource names to quantities")
    return raw


def parse_min_resources(value: str, path: str) -> dict[str, int]:
    """The ``koord-queue/min-resources`` annotation in milli-units (see :func:`load_resource_text`)."""
    return parse_resources(load_resource_text(value, path), path)
