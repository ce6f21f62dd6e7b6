"""The one list of job adapters, and lookups by kind and by extension name.

Adapters are listed explicitly (docs/architecture.md#decision-7-one-adapter-per-job-kind): adding a kind
means adding a line here, and the contract test in ``tests/unit/test_job_adapters.py`` picks it up
automatically. Extension names match upstream's ``--enabled-extensions`` values
(docs/compatibility.md#enabled-extensions).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from koord_queue.shared.jobs import batch_job, jobset, kubeflow, ray, spark, workflow
from koord_queue.shared.jobs.base import JobAdapter


def parent_groups(adapters: Iterable[JobAdapter]) -> frozenset[str]:
    """The API groups of every kind we queue except ``batch/v1`` Job itself: a Job controlled by one of
    them is its child, accounted under the parent's unit (docs/compatibility.md#batchv1-job). Their
    controllers create Jobs for them (a RayJob's submitter, an MPIJob's launcher, a JobSet's
    replicated jobs, an Argo resource step), so a new kind is a parent as soon as it is registered."""
    return frozenset(
        group for adapter in adapters if (group := adapter.api_version.rpartition("/")[0]) != "batch"
    )


#: Every kind but ``batch/v1`` Job, in registry order: a new kind is one line here.
_OTHERS: Final[tuple[JobAdapter, ...]] = (
    *kubeflow.adapters(),
    jobset.JobSetAdapter(),
    ray.RayJobAdapter(api_version="ray.io/v1", extension="rayjob"),
    ray.RayJobAdapter(api_version="ray.io/v1alpha1", extension="rayjobv1alpha1"),
    ray.RayClusterAdapter(),
    workflow.WorkflowAdapter(),
    spark.SparkApplicationAdapter(),
)
#: The API groups whose controllers create ``batch/v1`` Jobs for a job we queue, handed to the
#: Job's adapter (so ``shared/jobs/batch_job.py`` names no kind and imports no registry).
PARENT_GROUPS: Final[frozenset[str]] = parent_groups(_OTHERS)

ADAPTERS: Final[tuple[JobAdapter, ...]] = (batch_job.BatchJobAdapter(PARENT_GROUPS), *_OTHERS)

_BY_EXTENSION: Final = {adapter.extension: adapter for adapter in ADAPTERS}
_BY_KIND: Final = {(adapter.api_version, adapter.kind): adapter for adapter in ADAPTERS}

EXTENSIONS: Final[tuple[str, ...]] = tuple(adapter.extension for adapter in ADAPTERS)
#: Enabled unless configured otherwise. RayCluster is opt-in, as upstream's chart has it: most
#: RayClusters are created by RayJobs, and long-lived interactive clusters rarely want queueing.
DEFAULT_EXTENSIONS: Final[tuple[str, ...]] = tuple(e for e in EXTENSIONS if e != "raycluster")


class UnknownExtensionError(ValueError):
    """An extension name that no adapter has."""


def by_kind(api_version: str, kind: str) -> JobAdapter | None:
    """The adapter for ``apiVersion``/``kind`` (e.g. ``batch/v1``, ``Job``), if any."""
    return _BY_KIND.get((api_version, kind))


def by_extension(name: str) -> JobAdapter:
    try:
        return _BY_EXTENSION[name]
    except KeyError:
        raise UnknownExtensionError(_unknown_message([name])) from None


def enabled_adapters(extension_names: Iterable[str]) -> tuple[JobAdapter, ...]:
    """The adapters for ``extension_names`` in registry order; unknown names are all reported.

    Two served versions of one kind (``rayjob`` and ``rayjobv1alpha1``) are two views of the *same*
    stored objects, so only the first enabled one is returned: two informers over one RayJob made
    two job extensions race to create, own and resume the same QueueUnit, and the unit's
    ``consumerRef``/owner version depended on which won. The webhook still holds a job submitted in
    either version (it looks adapters up with :func:`by_kind` and the enabled names).
    """
    wanted = {name.strip() for name in extension_names if name.strip()}
    unknown = sorted(wanted - _BY_EXTENSION.keys())
    if unknown:
        raise UnknownExtensionError(_unknown_message(unknown))
    chosen: dict[tuple[str, str], JobAdapter] = {}
    for adapter in ADAPTERS:
        if adapter.extension in wanted:
            chosen.setdefault((adapter.api_version.split("/")[0], adapter.kind), adapter)
    return tuple(chosen.values())


def _unknown_message(unknown: list[str]) -> str:
    listed = ", ".join(repr(name) for name in unknown)
    return f"unknown job extension(s) {listed}; known extensions: {', '.join(EXTENSIONS)}"
