"""Unit tests for shared.api.quantities: parsing, rounding, formatting and resource-list arithmetic.

Tables pin the Kubernetes-documented examples and every suffix; hypothesis properties pin the
round trip (format then parse), sign symmetry, and the add/subtract/fits/covers laws the
scheduler relies on. No cluster needed.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_queue.shared.api import quantities
from koord_queue.shared.api.quantities import QuantityError

KI = 1024
MILLI_PER_UNIT = 1000


# --- parsing -------------------------------------------------------------------------------------

DOCUMENTED_EXAMPLES = [
    ("100m", 100),
    ("1", 1000),
    ("1.5", 1500),
    ("1Ki", 1024 * MILLI_PER_UNIT),
    ("1Mi", KI**2 * MILLI_PER_UNIT),
    ("1G", 10**9 * MILLI_PER_UNIT),
    ("1e3", 10**6),
    ("12E-3", 12),
    ("1n", 1),
    ("0.1m", 1),
    ("+2", 2000),
    (".5", 500),
    ("5.", 5000),
    ("0", 0),
    ("-0", 0),
    ("0.000", 0),
    ("1.5Gi", 3 * KI**3 // 2 * MILLI_PER_UNIT),
    ("128974848", 128974848 * MILLI_PER_UNIT),
    ("129e6", 129 * 10**6 * MILLI_PER_UNIT),
    ("123Mi", 123 * KI**2 * MILLI_PER_UNIT),
    ("1E+3", 10**6),
    ("1e-3", 1),
    ("007", 7000),
]


@pytest.mark.parametrize(("text", "milli"), DOCUMENTED_EXAMPLES)
def test_documented_examples_parse_to_exact_milli_units(text: str, milli: int) -> None:
    assert quantities.parse_milli(text) == milli


SUFFIXES = [
    ("n", 10**-9),
    ("u", 10**-6),
    ("m", 10**-3),
    ("", 1),
    ("k", 10**3),
    ("M", 10**6),
    ("G", 10**9),
    ("T", 10**12),
    ("P", 10**15),
    ("E", 10**18),
    ("Ki", 2**10),
    ("Mi", 2**20),
    ("Gi", 2**30),
    ("Ti", 2**40),
    ("Pi", 2**50),
    ("Ei", 2**60),
]


@pytest.mark.parametrize(("suffix", "factor"), SUFFIXES)
def test_every_suffix_scales_by_its_factor(suffix: str, factor: float) -> None:
    expected = max(1, round(3000 * factor))  # 3n and 3u are below one milli and round up to 1
    assert quantities.parse_milli(f"3{suffix}") == expected


@pytest.mark.parametrize(("suffix", "factor"), SUFFIXES)
def test_every_suffix_keeps_its_sign_when_negative(suffix: str, factor: float) -> None:
    assert quantities.parse_milli(f"-3{suffix}") == -quantities.parse_milli(f"3{suffix}")


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("1n", 1),
        ("999n", 1),
        ("1000001n", 2),
        ("0.5m", 1),
        ("1.0001", 1001),
        ("-0.5m", -1),
        ("-1n", -1),
        ("-1.0001", -1001),
        ("1.5m", 2),
        ("-1.5m", -2),
    ],
)
def test_sub_milli_remainders_round_away_from_zero_like_milli_value(text: str, milli: int) -> None:
    assert quantities.parse_milli(text) == milli


def test_ints_are_whole_units() -> None:
    assert quantities.parse_milli(2) == 2000
    assert quantities.parse_milli(-3) == -3000


@pytest.mark.parametrize(
    ("value", "milli"), [(0.5, 500), (1.5, 1500), (0.1, 100), (1e-7, 1), (2e16, 2 * 10**19)]
)
def test_finite_floats_are_read_through_their_shortest_repr(value: float, milli: int) -> None:
    assert quantities.parse_milli(value) == milli


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True, False])
def test_non_finite_floats_and_booleans_are_rejected(value: float) -> None:
    with pytest.raises(QuantityError):
        quantities.parse_milli(value)


INVALID = [
    "",
    "abc",
    "1.2.3",
    "1Kb",
    "--1",
    "+-1",
    "1 Gi",
    " 1",
    "1 ",
    "Mi",
    "1e",
    "1e+",
    "1E-",
    "1e1.5",
    "NaN",
    "inf",
    "-inf",
    ".",
    "-",
    "1ki",
    "1mi",
    "1K",
    "0x10",
    "1_000",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: int() accepts it, Kubernetes does not
    "1e1001",
    "1e-" + "9" * 50,
]


@pytest.mark.parametrize("text", INVALID)
def test_invalid_strings_raise_quantity_error_naming_the_text(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        quantities.parse_milli(text)
    assert repr(text) in str(info.value)
    assert "expected" in str(info.value) or "exponent" in str(info.value)


def test_quantity_error_is_a_value_error() -> None:
    assert issubclass(QuantityError, ValueError)


def test_extreme_but_bounded_exponents_parse_exactly() -> None:
    assert quantities.parse_milli("1e1000") == 10**1003
    assert quantities.parse_milli("1e-1000") == 1


# --- formatting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "resource", "text"),
    [
        (0, None, "0"),
        (500, "cpu", "500m"),
        (1500, "cpu", "1500m"),
        (2000, "cpu", "2"),
        (-500, "cpu", "-500m"),
        (110_000, "pods", "110"),
        (1_000_000, "cpu", "1k"),
        (8 * KI**3 * MILLI_PER_UNIT, "memory", "8Gi"),
        (8 * KI**3 * MILLI_PER_UNIT, "cpu", "8589934592"),
        (2 * 10**9 * MILLI_PER_UNIT, "memory", "2G"),  # not "1953125Ki": decimal is shorter
        (1000 * KI * MILLI_PER_UNIT, "memory", "1024k"),  # not "1000Ki": decimal is shorter
        (1000 * KI**2 * MILLI_PER_UNIT, "memory", "1000Mi"),
        (9875 * KI * MILLI_PER_UNIT, "memory", "9875Ki"),  # a tie with "10112k" goes to binary
        (1536 * MILLI_PER_UNIT, "memory", "1536"),
        (1536 * KI * MILLI_PER_UNIT, "ephemeral-storage", "1536Ki"),
        (2 * KI**2 * MILLI_PER_UNIT, "hugepages-2Mi", "2Mi"),
        (-2 * KI * MILLI_PER_UNIT, "memory", "-2Ki"),
        (1500, "memory", "1500m"),
        (KI**6 * MILLI_PER_UNIT, "memory", "1Ei"),
        (10**21 * MILLI_PER_UNIT, "cpu", "1000E"),
    ],
)
def test_format_milli_picks_the_shortest_natural_suffix(milli: int, resource: str | None, text: str) -> None:
    assert quantities.format_milli(milli, resource=resource) == text


RESOURCE_NAMES = st.sampled_from(
    ["cpu", "memory", "ephemeral-storage", "hugepages-1Gi", "nvidia.com/gpu", None]
)


@given(milli=st.integers(), resource=RESOURCE_NAMES)
def test_formatting_then_parsing_returns_the_same_integer(milli: int, resource: str | None) -> None:
    assert quantities.parse_milli(quantities.format_milli(milli, resource=resource)) == milli


@given(
    units=st.integers(min_value=-(2**70), max_value=2**70),
    power=st.integers(min_value=0, max_value=6),
    resource=RESOURCE_NAMES,
)
def test_formatting_round_trips_multiples_of_suffix_factors(
    units: int, power: int, resource: str | None
) -> None:
    for milli in (units * KI**power * MILLI_PER_UNIT, units * 1000**power * MILLI_PER_UNIT):
        assert quantities.parse_milli(quantities.format_milli(milli, resource=resource)) == milli


@given(
    sign=st.sampled_from(["", "+"]),
    whole=st.text("0123456789", max_size=8),
    frac=st.text("0123456789", max_size=12),
    suffix=st.sampled_from([s for s, _ in SUFFIXES] + ["e3", "e-3", "E-12", "e0"]),
)
def test_negating_a_string_negates_its_milli_value(sign: str, whole: str, frac: str, suffix: str) -> None:
    number = f"{whole}.{frac}" if frac else whole
    if not whole and not frac:
        number = "0"
    positive = quantities.parse_milli(f"{sign}{number}{suffix}")
    assert positive >= 0
    assert quantities.parse_milli(f"-{number}{suffix}") == -positive


# --- resource lists ------------------------------------------------------------------------------


def test_parse_resource_list_converts_every_entry_and_sorts_keys() -> None:
    raw = {"memory": "1Gi", "cpu": "500m", "pods": 10, "nvidia.com/gpu": 1.0}
    parsed = quantities.parse_resource_list(raw, path="spec.max")
    assert parsed == {"cpu": 500, "memory": KI**3 * 1000, "nvidia.com/gpu": 1000, "pods": 10_000}
    assert list(parsed) == sorted(parsed)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"cpu": "lots"}, "spec.max[cpu]: invalid quantity 'lots'"),
        ({"cpu": None}, "spec.max[cpu]: invalid quantity None"),
        ({"cpu": True}, "spec.max[cpu]: invalid quantity True"),
        ({"cpu": [1]}, "spec.max[cpu]: invalid quantity [1]"),
        ({"cpu": float("nan")}, "spec.max[cpu]: invalid quantity nan"),
        ({3: "1"}, "spec.max: resource name 3 must be a string"),
    ],
)
def test_parse_resource_list_errors_name_the_field_path_and_key(
    raw: dict[object, object], message: str
) -> None:
    with pytest.raises(QuantityError) as info:
        quantities.parse_resource_list(raw, path="spec.max")  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


def test_parse_resource_list_without_a_path_names_just_the_key() -> None:
    with pytest.raises(QuantityError, match=r"^memory: invalid quantity '1Kb'"):
        quantities.parse_resource_list({"memory": "1Kb"})


def test_format_resource_list_sorts_keys_and_uses_resource_aware_suffixes() -> None:
    res = {"memory": 2 * KI**3 * 1000, "cpu": 1500}
    assert list(quantities.format_resource_list(res).items()) == [("cpu", "1500m"), ("memory", "2Gi")]


RESOURCE_LISTS = st.dictionaries(
    st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]),
    st.integers(min_value=-(10**15), max_value=10**15),
)


@given(res=RESOURCE_LISTS)
def test_formatting_then_parsing_a_resource_list_returns_it(res: dict[str, int]) -> None:
    assert quantities.parse_resource_list(quantities.format_resource_list(res)) == res


def test_add_and_subtract_cover_the_union_of_keys_and_keep_zeros() -> None:
    a = {"cpu": 1000, "memory": 0}
    b = {"cpu": 1000, "pods": 2000}
    assert quantities.add(a, b) == {"cpu": 2000, "memory": 0, "pods": 2000}
    assert quantities.subtract(a, b) == {"cpu": 0, "memory": 0, "pods": -2000}


@given(a=RESOURCE_LISTS, b=RESOURCE_LISTS)
def test_subtracting_what_was_added_restores_the_original_values(
    a: dict[str, int], b: dict[str, int]
) -> None:
    restored = quantities.subtract(quantities.add(a, b), b)
    assert {name: restored[name] for name in a} == a
    assert all(restored[name] == 0 for name in restored.keys() - a.keys())


@given(a=RESOURCE_LISTS, b=RESOURCE_LISTS)
def test_add_is_commutative_and_results_are_sorted(a: dict[str, int], b: dict[str, int]) -> None:
    total = quantities.add(a, b)
    assert total == quantities.add(b, a)
    assert list(total) == sorted(total)


@given(a=RESOURCE_LISTS, n=st.integers(min_value=0, max_value=1000))
def test_scaling_equals_repeated_addition(a: dict[str, int], n: int) -> None:
    repeated: dict[str, int] = {name: 0 for name in a}
    for _ in range(min(n, 5)):
        repeated = quantities.add(repeated, a)
    if n <= 5:
        assert quantities.scale(a, n) == repeated
    assert quantities.scale(a, n) == {name: value * n for name, value in a.items()}


def test_is_zero_is_true_only_when_every_value_is_zero() -> None:
    assert quantities.is_zero({})
    assert quantities.is_zero({"cpu": 0, "memory": 0})
    assert not quantities.is_zero({"cpu": 0, "memory": 1})
    assert not quantities.is_zero({"cpu": -1})


# --- fits, covers, less_or_equal -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "available", "first_short"),
    [
        ({"cpu": 1000}, {"cpu": 1000}, None),
        ({"cpu": 1001}, {"cpu": 1000}, "cpu"),
        ({"cpu": 5000, "memory": 5}, {"cpu": 1000, "memory": 1}, "cpu"),
        ({"memory": 5, "pods": 2}, {"memory": 10, "pods": 1}, "pods"),
        ({"nvidia.com/gpu": 8000}, {"cpu": 1000}, None),
        ({}, {"cpu": 0}, None),
        ({"cpu": 0}, {"cpu": -1}, "cpu"),
    ],
)
def test_fits_reports_the_first_short_resource_in_sorted_order(
    request_: dict[str, int], available: dict[str, int], first_short: str | None
) -> None:
    assert quantities.fits(request_, available) == first_short


@given(request_=RESOURCE_LISTS, available=RESOURCE_LISTS)
def test_fits_returns_a_limited_resource_that_really_is_short(
    request_: dict[str, int], available: dict[str, int]
) -> None:
    short = quantities.fits(request_, available)
    if short is None:
        assert all(request_[r] <= available[r] for r in request_.keys() & available.keys())
    else:
        assert short in available
        assert request_[short] > available[short]
        assert all(request_[r] <= available[r] for r in request_.keys() & available.keys() if r < short)


@given(request_=RESOURCE_LISTS, available=RESOURCE_LISTS)
def test_a_request_that_fits_leaves_nothing_negative_that_was_not_already(
    request_: dict[str, int], available: dict[str, int]
) -> None:
    if quantities.fits(request_, available) is None:
        left = quantities.subtract(available, request_)
        assert all(left[r] >= 0 for r in available if available[r] >= 0)


@pytest.mark.parametrize(
    ("released", "request_", "expected"),
    [
        ({"cpu": 2000}, {"cpu": 2000}, True),
        ({"cpu": 1999}, {"cpu": 2000}, False),
        ({}, {"cpu": 0, "memory": -5}, True),
        ({"cpu": 2000}, {"cpu": 1000, "memory": 1}, False),
        ({"cpu": 2000, "memory": 7}, {}, True),
    ],
)
def test_covers_needs_every_positive_request_to_be_released(
    released: dict[str, int], request_: dict[str, int], expected: bool
) -> None:
    assert quantities.covers(released, request_) is expected


@given(request_=RESOURCE_LISTS, extra=RESOURCE_LISTS)
def test_releasing_at_least_the_request_always_covers_it(
    request_: dict[str, int], extra: dict[str, int]
) -> None:
    bonus = {name: abs(value) for name, value in extra.items()}
    assert quantities.covers(quantities.add(request_, bonus), request_)


def test_less_or_equal_lists_shared_keys_where_the_first_exceeds_the_second() -> None:
    low = {"cpu": 4000, "memory": 10, "pods": 5}
    high = {"cpu": 2000, "memory": 10, "nvidia.com/gpu": 1, "pods": 1}
    assert quantities.less_or_equal(low, high) == ["cpu", "pods"]
    assert quantities.less_or_equal(high, low) == []
    assert quantities.less_or_equal({"gpu": 9}, {}) == []
