"""Sizes on the command line."""

from __future__ import annotations

import argparse

import pytest

from warmfleet.sizes import format_size, parse_size, size_arg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1 << 20),
        ("512M", 512 << 20),
        ("512m", 512 << 20),
        ("2G", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("64 KB", 64 << 10),
        ("1T", 1 << 40),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-1M", "12X", "1.2.3G", "lots"])
def test_bad_sizes_are_rejected_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError, match="examples: 512M"):
        size_arg(text)


def test_format_size() -> None:
    assert format_size(3 << 29) == "1.5 GiB"
    assert format_size(11_796_480) == "11.2 MiB"
    assert format_size(100) == "100 B"
