"""The component configuration file, ``KoordQueueConfiguration`` (REFERENCE §1.5).

``--config`` names a YAML file of ``apiVersion: scheduling.k8s.io/v1``, ``kind:
KoordQueueConfiguration`` (the older ``KubeQueueConfiguration`` is accepted too). Only
``defaultReclaimProtectTime`` changes our behaviour; ``plugins`` and ``pluginConfigs`` are accepted
for compatibility with upstream files and otherwise ignored. Unknown keys are reported, not ignored
silently, so a typo does not turn protection off without a word.
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
_KNOWN: Final = frozenset({"apiVersion", "kind", "plugins", "pluginConfigs", "defaultReclaimProtectTime"})


class ConfigError(ValueError):
    """The configuration file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Settings:
    #: Seconds after ``lastAllocateTime`` during which a unit cannot be a preemption victim.
    reclaim_protect_seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)


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
    return Settings(reclaim_protect_seconds=protect, warnings=warnings)


def load(path: Path) -> Settings:
    """Read and parse ``path`` (the only I/O here: the caller's process reads its own config)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    return parse(text, source=str(path))
