"""The component configuration file, ``KoordQueueConfiguration`` (REFERENCE §1.5).

``--config`` names a YAML file of ``apiVersion: scheduling.k8s.io/v1``, ``kind:
KoordQueueConfiguration`` (the older ``KubeQueueConfiguration`` is accepted too). What changes our
behaviour:

* ``defaultReclaimProtectTime``: a unit admitted less than this long ago is no preemption victim;
* ``quotaNamespaceBinding`` (default true): a quota serves only jobs of its own namespace and of the
  namespaces its ``quota.scheduling.koordinator.sh/namespaces`` annotation lists; false restores
  upstream's unchecked behaviour (any job may name any quota);
* ``maxUserPriority`` (default unset: no cap): the largest priority a job may ask for with the
  ``scheduling.x-k8s.io/priority`` annotation; larger values are clamped (PriorityClass values,
  which admins control, are not).

``plugins`` and ``pluginConfigs`` are accepted for compatibility with upstream files and otherwise
ignored. Unknown keys are reported, not ignored silently, so a typo does not turn protection off
without a word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from shared.durations import DurationError, parse_duration

API_VERSION: Final = "scheduling.k8s.io/v1"
KINDS: Final = ("KoordQueueConfiguration", "KubeQueueConfiguration")
_KNOWN: Final = frozenset(
    {
        "apiVersion",
        "kind",
        "plugins",
        "pluginConfigs",
        "defaultReclaimProtectTime",
        "quotaNamespaceBinding",
        "maxUserPriority",
    }
)
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


class ConfigError(ValueError):
    """The configuration file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Settings:
    #: Seconds after ``lastAllocateTime`` during which a unit cannot be a preemption victim.
    reclaim_protect_seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)
    #: A quota serves only units of the namespaces it is bound to (``quotaNamespaceBinding``).
    quota_namespace_binding: bool = True
    #: Cluster-wide cap on the priority a job may ask for by annotation (``maxUserPriority``).
    max_user_priority: int | None = None


def parse(text: str, *, source: str = "config") -> Settings:
    try:
        doc: Any = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        raise ConfigError(f"{source}: not valid YAML: {type(err).__name__}") from None
    if doc is None:
        return Settings()
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") not in KINDS:
        raise ConfigError(
            f"{source}: expected apiVersion {API_VERSION} and kind {KINDS[0]}, got "
            f"{doc.get('apiVersion')!r} / {doc.get('kind')!r}"
        )
    warnings = tuple(f"{source}: unknown field {key!r} ignored" for key in sorted(set(doc) - _KNOWN))
    raw = doc.get("defaultReclaimProtectTime")
    protect = 0.0
    if raw is not None:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise ConfigError(
                f"{source}: defaultReclaimProtectTime: expected a duration such as 5m, got {raw!r}"
            )
        try:
            protect = parse_duration(raw) if isinstance(raw, str) else float(raw)
        except DurationError as err:
            raise ConfigError(f"{source}: defaultReclaimProtectTime: {err}") from None
        if not math.isfinite(protect) or protect < 0:
            raise ConfigError(f"{source}: defaultReclaimProtectTime: must be a finite, non-negative duration")
    binding = doc.get("quotaNamespaceBinding")
    if binding is None:
        binding = True
    if not isinstance(binding, bool):
        raise ConfigError(f"{source}: quotaNamespaceBinding: expected true or false, got {binding!r}")
    cap = doc.get("maxUserPriority")
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not _INT32_MIN <= cap <= _INT32_MAX
    ):
        raise ConfigError(
            f"{source}: maxUserPriority: expected a 32-bit integer (or no value for no cap), got {cap!r}"
        )
    return Settings(
        reclaim_protect_seconds=protect,
        warnings=warnings,
        quota_namespace_binding=binding,
        max_user_priority=cap,
    )


def load(path: Path) -> Settings:
    """Read and parse ``path`` (the only I/O here: the caller's process reads its own config)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    return parse(text, source=str(path))
