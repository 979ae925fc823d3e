"""Budget parsing: units, percentages, min, and clear errors; minimum budgets searched once."""

from dataclasses import replace

import pytest
from conftest import skip_net
from test_multidevice import problem as multi_problem

from onnx_remat.core.budget import Budget, parse_budget
from onnx_remat.core.devices import get_devices
from onnx_remat.core.errors import UsageError
from onnx_remat.core.options import MINIMUM_SECONDS
from onnx_remat.passes.simulate import simulate
from onnx_remat.passes.solve.baselines import BASELINES, baselines_of
from onnx_remat.passes.solve.min_budget import MinBudget
from onnx_remat.pipeline import costed_problem, prepare
from onnx_remat.resolve import HEURISTIC_SEARCH_SHARE, Minima, search_seconds


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


def test_minima_are_searched_once_per_other_budgets_and_again_only_longer_when_unproven(monkeypatch):
    """A device's minimum depends on the other devices' budgets, not its own: searched once for each of theirs, and
    again only when a longer search is asked of one that proved nothing."""
    searches = []

    def search(problem, device, seconds, slowdown):
        searches.append((problem.budgets, device, seconds))
        return MinBudget(10, 20 if seconds < 5 else 10)

    monkeypatch.setattr("onnx_remat.resolve.minimum_budget", search)
    minima = Minima(multi_problem([(0, 1)], [1, 1], [[1, 1], [1, 1]], [100, 100]))
    assert minima.minimum((100, 200), 0, 1) == MinBudget(10, 20)
    assert minima.minimum((150, 200), 0, 1) == MinBudget(10, 20)  # its own budget changes nothing
    assert minima.minimum((100, 300), 0, 1) == MinBudget(10, 20)
    assert minima.minimum((100, 200), 0, 5) == MinBudget(10, 10)  # longer, and the first proved nothing
    assert minima.minimum((100, 200), 0, 9) == MinBudget(10, 10)  # proven
    assert searches == [((100, 200), 0, 1), ((100, 300), 0, 1), ((100, 200), 0, 5)]


def test_min_resolves_only_against_a_known_minimum():
    with pytest.raises(ValueError, match="known minimum"):
        parse_budget("min").resolve(keep_all_bytes=1000)


def test_baselines_are_built_once_per_problem_whatever_its_budgets():
    problem = costed_problem(prepare(skip_net()), get_devices(None)).problem
    built = baselines_of(problem)
    assert baselines_of(replace(problem, budgets=(problem.keep_all_bytes() // 2,))) is built
    assert [baseline.name for baseline in built] == list(BASELINES)
    for baseline in built:
        again = simulate(problem, baseline.schedule)
        assert (baseline.peak_bytes, baseline.total_cost) == (again.peak_bytes, again.total_cost)


def test_the_minimum_search_takes_its_share_of_the_time_left():
    minimum, half = parse_budget("min"), parse_budget("50%")
    assert search_seconds(40.0, [minimum]) == 20.0
    assert search_seconds(40.0, [minimum], milp=False) == 40.0 * HEURISTIC_SEARCH_SHARE
    assert search_seconds(4.0, [half]) == 2.0
    assert search_seconds(40.0, [half]) == search_seconds(None, [minimum]) == MINIMUM_SECONDS
