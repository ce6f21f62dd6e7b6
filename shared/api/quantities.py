"""Kubernetes resource quantities as exact integers of milli-units.

Every quota, pod-set request and usage figure passes through this module: strings such as ``"500m"``,
``"1.5Gi"`` or ``"12E-3"`` are parsed once at the edge into ``int`` milli-units, and all arithmetic
past that point is exact integer arithmetic (never floats, which would drift under repeated
add/subtract of admitted workloads). The module is pure: standard library only, no I/O, no clock.

Parsing follows ``k8s.io/apimachinery/pkg/api/resource.Quantity``::

    <quantity> ::= <sign>? <number> <suffix>
    <number>   ::= <digits> | <digits> "." <digits>? | "." <digits>
    <suffix>   ::= "" | Ki Mi Gi Ti Pi Ei | n u m k M G T P E | (e|E) <sign>? <digits>

Rounding matches ``Quantity.MilliValue()``: a sub-milli remainder rounds *away from zero* (that is
what ``int64Amount.AsScaledInt64`` and ``inf.RoundUp`` do), so ``"1n"`` -> 1, ``"0.5m"`` -> 1 and
``"-0.5m"`` -> -1; ``parse_milli("-x") == -parse_milli("x")`` always holds. Deliberate differences:
values are never capped to int64 and negative binary-suffixed fractions are not clamped to zero
(a Kubernetes slow-path quirk); decimal exponents beyond +/-``_MAX_EXPONENT`` are rejected so a
hostile string cannot make us build an enormous integer.

A resource list is a ``dict[str, int]`` (name -> milli-units). Zero entries are meaningful and kept:
in :func:`fits` a resource *absent* from ``available`` is unlimited, so dropping a zero from
``subtract(max, used)`` would silently turn an exhausted resource into an unlimited one.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping

__all__ = [
    "QuantityError",
    "Resources",
    "add",
    "covers",
    "fits",
    "format_milli",
    "format_resource_list",
    "is_zero",
    "less_or_equal",
    "parse_milli",
    "parse_resource_list",
    "scale",
    "subtract",
]

Resources = dict[str, int]
"""Resource name -> quantity in milli-units."""


class QuantityError(ValueError):
    """A value is not a valid Kubernetes quantity (or a resource list holds one)."""


_EXPECTED = (
    "expected a number with an optional sign and fraction followed by an optional suffix "
    "(Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as e3), e.g. '500m', '1.5', '2Gi'"
)
_MAX_EXPONENT = 1000
_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<whole>[0-9]+)(?:\.(?P<frac1>[0-9]*))?|\.(?P<frac2>[0-9]+))"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE])?)"
)
# Power of ten each decimal suffix contributes, relative to the base unit.
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_POWERS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Largest first, so formatting picks the biggest exact suffix.
_FORMAT_BINARY = tuple((s, 1 << p) for s, p in reversed(_BINARY_POWERS.items()))
_FORMAT_DECIMAL = tuple((s, 10**e) for s, e in reversed(_DECIMAL_EXPONENTS.items()) if e > 0)
_BINARY_RESOURCES = frozenset({"memory", "ephemeral-storage"})


def parse_milli(value: str | int | float) -> int:
    """Return ``value`` in milli-units, rounding a sub-milli remainder away from zero.

    Strings use the Kubernetes grammar; ints are whole units (``2`` -> 2000); finite floats are
    read through ``repr`` (the shortest string that round-trips, so ``0.1`` means 0.1, not the
    binary approximation). ``bool`` is rejected even though it is an ``int`` subclass.
    """
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: a boolean is not a quantity; {_EXPECTED}")
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"invalid quantity {value!r}: it is not a finite number; {_EXPECTED}")
        return _parse_string(repr(value))
    if isinstance(value, str):
        return _parse_string(value)
    raise QuantityError(f"invalid quantity {value!r}: got {type(value).__name__}; {_EXPECTED}")


@functools.lru_cache(maxsize=4096)
def _parse_string(text: str) -> int:
    """Parse one quantity string; cached because the same few strings recur across every pod."""
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(f"invalid quantity {text!r}: {_EXPECTED}")
    whole = match["whole"] or ""
    frac = match["frac1"] or match["frac2"] or ""
    try:
        digits = int(whole + frac)
    except ValueError:  # more digits than Python converts by default (sys.get_int_max_str_digits)
        raise QuantityError(f"invalid quantity {text!r}: too many digits") from None
    # value = digits * 10**exp10 * 2**exp2, counted in milli-units (hence the +3).
    exp10 = 3 - len(frac)
    exp2 = 0
    if match["exp"] is not None:
        exponent = match["exp"][1:]
        # Check the length first: int() on a thousands-digit exponent is itself the hazard.
        if len(exponent.lstrip("+-").lstrip("0")) > 6 or abs(int(exponent)) > _MAX_EXPONENT:
            raise QuantityError(
                f"invalid quantity {text!r}: the exponent must be between "
                f"-{_MAX_EXPONENT} and {_MAX_EXPONENT}"
            )
        exp10 += int(exponent)
    else:
        suffix = match["suffix"] or ""
        if suffix in _BINARY_POWERS:
            exp2 = _BINARY_POWERS[suffix]
        else:
            exp10 += _DECIMAL_EXPONENTS[suffix]
    numerator = digits << exp2
    # Ceiling division for negative exponents: a sub-milli remainder rounds the magnitude up.
    magnitude = numerator * _pow10(exp10) if exp10 >= 0 else -(-numerator // _pow10(-exp10))
    return -magnitude if match["sign"] == "-" else magnitude


def _pow10(exponent: int) -> int:
    """``10**exponent`` for ``exponent >= 0``, typed as ``int`` (``int.__pow__`` is not)."""
    result: int = 10**exponent
    return result


def _prefers_binary(resource: str | None) -> bool:
    if resource is None:
        return False
    return resource in _BINARY_RESOURCES or resource.startswith("hugepages-")


def format_milli(milli: int, *, resource: str | None = None) -> str:
    """Return a short canonical string for ``milli`` that :func:`parse_milli` reads back exactly.

    Non-whole values use ``m`` (``1500`` -> ``"1500m"``). Whole values use the largest exact
    decimal suffix (``k`` .. ``E``) or the plain integer (``2000`` -> ``"2"``). For memory-like
    resources (``memory``, ``ephemeral-storage``, ``hugepages-*``) the largest exact binary suffix
    is used instead unless the decimal form is strictly shorter, so 8 GiB is ``"8Gi"`` but
    2 GB stays ``"2G"`` rather than ``"1953125Ki"``.
    """
    if milli % 1000:
        return f"{milli}m"
    units = milli // 1000
    if units == 0:
        return "0"
    decimal = _with_suffix(units, _FORMAT_DECIMAL)
    if _prefers_binary(resource):
        binary = _with_suffix(units, _FORMAT_BINARY)
        if len(binary) <= len(decimal):
            return binary
    return decimal


def _with_suffix(units: int, table: tuple[tuple[str, int], ...]) -> str:
    """``units`` written with the largest suffix in ``table`` that divides it exactly."""
    for suffix, factor in table:
        if units % factor == 0:
            return f"{units // factor}{suffix}"
    return str(units)


def _join(path: str, key: str) -> str:
    """Kubernetes field-path style for a map key: ``spec.max[cpu]``."""
    return f"{path}[{key}]" if path else key


def parse_resource_list(raw: Mapping[str, object], *, path: str = "") -> Resources:
    """Parse a raw ``{name: quantity}`` mapping (e.g. ``spec.max``) into milli-units, keys sorted.

    Raises :class:`QuantityError` naming the field path and key of the first bad entry.
    """
    parsed: Resources = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            where = path or "resource list"
            raise QuantityError(f"{where}: resource name {key!r} must be a string")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise QuantityError(
                f"{_join(path, key)}: invalid quantity {value!r} ({type(value).__name__}); {_EXPECTED}"
            )
        try:
            parsed[key] = parse_milli(value)
        except QuantityError as err:
            raise QuantityError(f"{_join(path, key)}: {err}") from None
    return dict(sorted(parsed.items()))


def format_resource_list(res: Mapping[str, int]) -> dict[str, str]:
    """Render a resource list with :func:`format_milli`, keys sorted (for status fields and logs)."""
    return {name: format_milli(res[name], resource=name) for name in sorted(res)}


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    """Return ``a + b`` over the union of keys (a missing key counts as 0), zeros kept, keys sorted."""
    return {name: a.get(name, 0) + b.get(name, 0) for name in sorted(a.keys() | b.keys())}


def subtract(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    """Return ``a - b`` over the union of keys, zeros and negatives kept, keys sorted.

    ``subtract(add(a, b), b)`` restricted to ``a``'s keys equals ``a``; keys only in ``b`` come
    back as 0.
    """
    return {name: a.get(name, 0) - b.get(name, 0) for name in sorted(a.keys() | b.keys())}


def scale(a: Mapping[str, int], n: int) -> Resources:
    """Return every value of ``a`` multiplied by ``n`` (per-pod request x pod count), keys sorted."""
    return {name: a[name] * n for name in sorted(a)}


def is_zero(a: Mapping[str, int]) -> bool:
    """True when every value is 0 (an empty list is zero)."""
    return all(v == 0 for v in a.values())


def fits(request: Mapping[str, int], available: Mapping[str, int]) -> str | None:
    """Return the first resource (sorted) where ``request`` exceeds ``available``, else ``None``.

    A resource absent from ``available`` is unlimited. Note a request of 0 does not fit a negative
    (over-committed) availability; callers that want otherwise should drop zero requests first.
    """
    for name in sorted(request):
        if name in available and request[name] > available[name]:
            return name
    return None


def covers(released: Mapping[str, int], request: Mapping[str, int]) -> bool:
    """True when ``released`` supplies every positive amount in ``request`` (missing counts as 0)."""
    return all(released.get(name, 0) >= amount for name, amount in request.items() if amount > 0)


def less_or_equal(a: Mapping[str, int], b: Mapping[str, int]) -> list[str]:
    """Return the sorted names, present in both, where ``a`` exceeds ``b`` (empty means ``a <= b``).

    Used to validate ``min <= max``; each returned name is one violation to report.
    """
    return sorted(name for name in a.keys() & b.keys() if a[name] > b[name])
