"""Go's scalar parsers (``shared.api.goparse``): the webhook's strict grammar and the reconciler's lenient
reading of the same annotations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_queue.shared.api import goparse


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("True", True), ("TRUE", True), ("t", True), ("1", True), ("false", False), ("F", False),
     ("0", False), ("yes", None), ("tRUE", None), (" true", None), ("", None), (None, None)],
)  # fmt: skip
def test_parse_go_bool(text: str | None, expected: bool | None) -> None:
    assert goparse.parse_go_bool(text) is expected


@pytest.mark.parametrize(
    ("text", "bits", "expected"),
    [("42", 32, 42), ("-7", 32, -7), ("+7", 32, 7), ("2147483647", 32, 2**31 - 1), ("2147483648", 32, None),
     ("-2147483648", 32, -(2**31)), ("1_000", 64, None), (" 1", 64, None), ("1.0", 64, None), ("", 64, None),
     ("9223372036854775807", 64, 2**63 - 1), ("9" * 500, 64, None)],
)  # fmt: skip
def test_parse_go_int(text: str, bits: int, expected: int | None) -> None:
    assert goparse.parse_go_int(text, bits=bits) == expected


@pytest.mark.parametrize(
    ("text", "bits", "expected"),
    [("42", 32, 42), (" -7 ", 32, -7), ("1_000", 32, 1000), ("2147483648", 32, None),
     ("2147483648", None, 2**31), ("-2147483648", 32, -(2**31)), ("1.0", 32, None), ("0x10", 32, None),
     ("", 32, None), (None, 32, None)],
)  # fmt: skip
def test_parse_lenient_int(text: str | None, bits: int | None, expected: int | None) -> None:
    assert goparse.parse_lenient_int(text, bits=bits) == expected


@given(st.integers(min_value=goparse.INT32_MIN, max_value=goparse.INT32_MAX))
def test_every_int32_reads_the_same_strictly_and_leniently(number: int) -> None:
    assert (
        goparse.parse_go_int(str(number), bits=32)
        == goparse.parse_lenient_int(str(number), bits=32)
        == number
    )


@given(st.text(max_size=12))
def test_what_go_accepts_the_lenient_reading_accepts_alike(text: str) -> None:
    strict = goparse.parse_go_int(text, bits=32)
    if strict is not None:
        assert goparse.parse_lenient_int(text, bits=32) == strict
