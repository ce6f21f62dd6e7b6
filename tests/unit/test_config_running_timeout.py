"""``jobRunningTimeout`` in the component configuration (docs/operations.md#component-configuration-file,
docs/compatibility.md#running-timeout): per job extension, upstream's ``runningTimeout``,
``backoffTimeout`` and ``partialRunningTimeout``, inheriting from a ``default`` entry field by field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from koord_queue.shared.core import config
from koord_queue.shared.jobs import registry
from koord_queue.shared.jobs.running_timeout import RunningTimeout

HEAD = "apiVersion: scheduling.k8s.io/v1\nkind: KoordQueueConfiguration\n"
MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "config.yaml"


def timeouts_of(body: str, extension: str) -> RunningTimeout:
    settings = config.parse(HEAD + body)
    assert settings.warnings == ()
    return settings.running_timeouts.for_extension(extension)


@pytest.mark.parametrize("extension", registry.EXTENSIONS)
def test_absent_means_off_for_every_extension(extension: str) -> None:
    assert timeouts_of("", extension) == RunningTimeout()
    assert not timeouts_of("jobRunningTimeout:\n", extension).enabled


BODY = """
jobRunningTimeout:
  default:
    runningTimeout: 10m
    backoffTimeout: 1m
  tfjob:
    runningTimeout: 30m
    partialRunningTimeout: 90s
  job:
    runningTimeout: 0s
  pytorchjob:
"""


@pytest.mark.parametrize(
    ("extension", "expected"),
    [
        ("tfjob", RunningTimeout(running_timeout=1800, backoff_timeout=60, partial_running_timeout=90)),
        ("job", RunningTimeout(running_timeout=0, backoff_timeout=60)),
        ("pytorchjob", RunningTimeout(running_timeout=600, backoff_timeout=60)),
        ("rayjob", RunningTimeout(running_timeout=600, backoff_timeout=60)),
    ],
)
def test_an_extension_overrides_the_default_field_by_field(extension: str, expected: RunningTimeout) -> None:
    assert timeouts_of(BODY, extension) == expected


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("5s", 5.0), ("1m30s", 90.0), ("1h", 3600.0), ("0", 0.0), ("250ms", 0.25), (45, 45.0), (2.5, 2.5)],
)
def test_go_durations_and_numbers_of_seconds(value: object, seconds: float) -> None:
    body = yaml.safe_dump({"jobRunningTimeout": {"default": {"runningTimeout": value}}})
    assert timeouts_of(body, "job").running_timeout == seconds


def test_unknown_extensions_and_fields_are_warned_about_not_applied() -> None:
    body = "jobRunningTimeout:\n  jobs:\n    runningTimeout: 5m\n  job:\n    runingTimeout: 5m\n"
    settings = config.parse(HEAD + body, source="cfg.yaml")
    assert settings.warnings == (
        "cfg.yaml: jobRunningTimeout.job: unknown field 'runingTimeout' ignored",
        "cfg.yaml: jobRunningTimeout: unknown job extension 'jobs' ignored; known: default, "
        + ", ".join(registry.EXTENSIONS),
    )
    assert not settings.running_timeouts.for_extension("job").enabled


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("jobRunningTimeout: 10m\n", "jobRunningTimeout"),
        ("jobRunningTimeout: [job]\n", "jobRunningTimeout"),
        ("jobRunningTimeout:\n  job: 10m\n", "jobRunningTimeout.job"),
        (
            "jobRunningTimeout:\n  job:\n    runningTimeout: ten minutes\n",
            "jobRunningTimeout.job.runningTimeout",
        ),
        ("jobRunningTimeout:\n  job:\n    runningTimeout: -1m\n", "jobRunningTimeout.job.runningTimeout"),
        (
            "jobRunningTimeout:\n  default:\n    backoffTimeout: -5\n",
            "jobRunningTimeout.default.backoffTimeout",
        ),
        (
            "jobRunningTimeout:\n  default:\n    backoffTimeout: true\n",
            "jobRunningTimeout.default.backoffTimeout",
        ),
        (
            "jobRunningTimeout:\n  default:\n    partialRunningTimeout: .nan\n",
            "jobRunningTimeout.default.partialRunningTimeout",
        ),
        ("jobRunningTimeout:\n  tfjob:\n    runningTimeout: [1]\n", "jobRunningTimeout.tfjob.runningTimeout"),
    ],
)
def test_a_bad_value_is_refused_with_its_field(body: str, field: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(f"cfg.yaml: {field}:")):
        config.parse(HEAD + body, source="cfg.yaml")


def test_the_shipped_configuration_keeps_the_timeouts_off_without_warnings() -> None:
    configmap = yaml.safe_load(MANIFEST.read_text())
    settings = config.parse(configmap["data"]["config.yaml"], source="koord-queue-config")
    assert settings.warnings == ()
    for extension in registry.EXTENSIONS:
        assert not settings.running_timeouts.for_extension(extension).enabled


def test_the_jobs_without_pods_timeout_is_on_by_default_and_set_like_the_others() -> None:
    """``noPodsTimeout`` (docs/compatibility.md#jobs-without-pods): 60 s unless set, 0 turns it off."""
    assert timeouts_of("", "job").no_pods_timeout == 60.0
    body = "jobRunningTimeout:\n  default:\n    noPodsTimeout: 2m\n  job:\n    noPodsTimeout: 0s\n"
    assert timeouts_of(body, "job").no_pods_timeout == 0.0
    assert timeouts_of(body, "tfjob").no_pods_timeout == 120.0
    configmap = yaml.safe_load(MANIFEST.read_text())
    shipped = config.parse(configmap["data"]["config.yaml"], source="koord-queue-config")
    assert shipped.running_timeouts.for_extension("job").no_pods_timeout == 60.0
