"""Budget parsing: units, percentages, min, and clear errors."""

import pytest

from onnx_remat.budget import Budget, parse_budget
from onnx_remat.errors import UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1073741824),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("2 GiB", 2 * 2**30),
        ("100kb", 100_000),
        ("64B", 64),
    ],
)
def test_absolute_budgets(text, expected):
    assert parse_budget(text).resolve(keep_all_bytes=10, minimum_bytes=1) == expected


def test_percentage_is_of_keep_all():
    assert parse_budget("25%").resolve(keep_all_bytes=1000, minimum_bytes=1) == 250
    assert parse_budget("12.5%") == Budget(fraction=0.125)


def test_min_resolves_to_minimum():
    assert parse_budget("min").resolve(keep_all_bytes=1000, minimum_bytes=321) == 321


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "-5MiB", "0", "0%", "1..5GB", "%"])
def test_malformed_budgets_raise_usage_error(text):
    with pytest.raises(UsageError, match="budget"):
        parse_budget(text)
