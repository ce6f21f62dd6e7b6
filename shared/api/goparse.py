"""Go's scalar parsers, for the annotation values upstream reads with ``strconv``.

Upstream Koord-Queue reads its boolean and integer annotations with Go's ``strconv.ParseBool`` and
``strconv.ParseInt``; the webhook refuses exactly what Go would refuse (``shared.admission.validation``), and
the reconciler reads the same spellings (``shared.api.parsing``, ``shared.jobs.jobext``). Go durations are in
``shared.api.durations``.

Two readings of an integer:

* :func:`parse_go_int` is Go's grammar exactly (no spaces, no underscores, in range): what the
  webhook accepts;
* :func:`parse_lenient_int` is the reconciler's reading of an annotation it must not choke on (a
  job created before the webhook was installed): surrounding spaces and Python's digit separators
  are tolerated, anything else is ``None`` and the caller falls back to its default.

Pure, no I/O.
"""

from __future__ import annotations

import re
from typing import Final

INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1

_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_GO_INT: Final = re.compile(r"[+-]?[0-9]+")


def parse_go_bool(value: str | None) -> bool | None:
    """``strconv.ParseBool``: the value, or ``None`` when Go would return an error (or for None)."""
    if value in _GO_TRUE:
        return True
    return False if value in _GO_FALSE else None


def parse_go_int(value: str, *, bits: int = 64) -> int | None:
    """``strconv.ParseInt(value, 10, bits)``: no spaces, no underscores, in range, else ``None``."""
    if not _GO_INT.fullmatch(value) or len(value) > 40:
        return None
    number = int(value)
    limit = 1 << (bits - 1)
    return number if -limit <= number < limit else None


def parse_lenient_int(value: str | None, *, bits: int | None = None) -> int | None:
    """``int()`` of the stripped text, within ``bits`` when given; ``None`` when it does not parse."""
    if value is None:
        return None
    try:
        number = int(value.strip(), 10)
    except ValueError:
        return None
    if bits is None:
        return number
    limit = 1 << (bits - 1)
    return number if -limit <= number < limit else None
