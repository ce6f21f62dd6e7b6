"""Time text at the edge: Go durations ("100ms", "1m30s", "5m") and RFC 3339 timestamps.

Durations reach us from the same places upstream reads them with Go's parser: the Queue annotation
``koord-queue/queue-items-refresh-interval`` and ``defaultReclaimProtectTime`` in the component
configuration. Users copy values between the two systems, so the grammar must match Go's exactly,
including its error texts (``time: invalid duration "x"``), which end up in events and logs.

Grammar: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` with units ns, us, µs (U+00B5), μs (U+03BC), ms, s, m,
h; the bare string ``"0"`` is the only unit-less value accepted. Arithmetic is done in integer
nanoseconds (like Go) so "0.1s" is exactly 100,000,000 ns; Go truncates fractions beyond
nanosecond precision, and so do we. Pure: standard library only.

RFC 3339 (``metav1.Time``) helpers live here too: Kubernetes timestamps are parsed once into float
epoch seconds and written back at second precision in UTC; the clock itself is never read.
"""

from __future__ import annotations

import datetime as dt
import functools

__all__ = [
    "DurationError",
    "format_duration",
    "format_time",
    "parse_duration",
    "parse_duration_ns",
    "parse_go_duration",
    "parse_time",
]

_UNITS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
# Go rejects durations that overflow int64 nanoseconds (about 292 years).
_MAX_NS = (1 << 63) - 1


class DurationError(ValueError):
    """The text is not a Go duration; the message matches Go's ``time.ParseDuration`` error."""


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration into integer nanoseconds (may be negative).

    Raises :class:`DurationError` with Go's wording for an invalid text, a missing or unknown unit,
    or an overflow of int64 nanoseconds.
    """
    original = text
    if not isinstance(text, str):
        raise DurationError(f"time: invalid duration {original!r}")
    negative = False
    if text and text[0] in "+-":
        negative = text[0] == "-"
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise DurationError(f"time: invalid duration {_quote(original)}")
    total = 0
    while text:
        # Integer part.
        i = 0
        while i < len(text) and text[i].isascii() and text[i].isdigit():
            i += 1
        whole_text, text = text[:i], text[i:]
        # Fraction.
        frac_text = ""
        has_dot = bool(text) and text[0] == "."
        if has_dot:
            text = text[1:]
            j = 0
            while j < len(text) and text[j].isascii() and text[j].isdigit():
                j += 1
            frac_text, text = text[:j], text[j:]
        if not whole_text and not frac_text:
            raise DurationError(f"time: invalid duration {_quote(original)}")
        # Unit: everything up to the next digit or dot.
        k = 0
        while k < len(text) and text[k] != "." and not (text[k].isascii() and text[k].isdigit()):
            k += 1
        unit, text = text[:k], text[k:]
        if not unit:
            raise DurationError(f"time: missing unit in duration {_quote(original)}")
        if unit not in _UNITS:
            raise DurationError(f"time: unknown unit {_quote(unit)} in duration {_quote(original)}")
        scale = _UNITS[unit]
        if len(whole_text) > 30 or len(frac_text) > 30:
            # Far beyond Go's int64 range; also keeps int() away from its digit limit.
            raise DurationError(f"time: invalid duration {_quote(original)}")
        value = int(whole_text or "0") * scale
        if frac_text:
            # Truncate below one nanosecond, as Go does.
            value += int(frac_text) * scale // (10 ** len(frac_text))
        total += value
        if total > _MAX_NS + (1 if negative else 0):
            raise DurationError(f"time: invalid duration {_quote(original)}")
    return -total if negative else total


def parse_duration(text: str) -> float:
    """Parse a Go duration into seconds (a float, for timers and comparisons with epoch times)."""
    return parse_duration_ns(text) / 1_000_000_000


def parse_go_duration(text: str) -> float:
    """Alias of :func:`parse_duration` (seconds), the name ``shared.admission.validation`` uses."""
    return parse_duration(text)


def format_duration(seconds: float) -> str:
    """Render seconds in Go's ``Duration.String()`` style for the common cases ("1m30s", "100ms")."""
    ns = round(seconds * 1_000_000_000)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= scale:
                return sign + _trim(ns, scale) + unit
    hours, rest = divmod(ns, _UNITS["h"])
    minutes, rest = divmod(rest, _UNITS["m"])
    text = _trim(rest, _UNITS["s"]) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _trim(value: int, scale: int) -> str:
    whole, frac = divmod(value, scale)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def parse_time(text: object) -> float | None:
    """RFC 3339 text (``2024-05-01T10:00:00Z``, fractions and offsets allowed) -> epoch seconds."""
    if not isinstance(text, str) or not text:
        return None
    return _parse_time_text(text)


@functools.lru_cache(maxsize=4096)
def _parse_time_text(text: str) -> float | None:
    """Remembered: every unit event carries the same few stamps again (created, admitted, the
    conditions' transitions), and most units of a busy second share them."""
    value = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def format_time(epoch: float) -> str:
    """Epoch seconds -> RFC 3339 text at second precision in UTC (``metav1.Time`` wire format)."""
    return _format_second(int(epoch // 1))


@functools.lru_cache(maxsize=64)
def _format_second(second: int) -> str:
    """Remembered: the writers stamp many objects within one second."""
    return dt.datetime.fromtimestamp(second, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
