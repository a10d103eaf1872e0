"""min_peak_chain against an independent brute force over all subsets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver import CheckpointSet, min_peak_chain
from solver.chain.min_peak import _bounded_cost, _branch_and_bound, tied_blocks

METHODS = ("cubic", "fast")


def brute_force_peak(sizes: np.ndarray) -> float:
    """Least peak over all 2^n kept subsets, vectorised over subsets.

    Row ``m`` of ``kept`` is subset ``m`` (bit ``i`` = tensor ``i`` kept). Scanning the
    positions left to right, ``run`` is each subset's current non-kept run sum (reset to 0
    at a kept tensor) and ``largest`` its largest run so far.
    """
    n = sizes.shape[0]
    masks = np.arange(1 << n, dtype=np.int64)
    kept = (masks[:, None] >> np.arange(n)) & 1
    run = np.zeros(1 << n)
    largest = np.zeros(1 << n)
    for i in range(n):
        run = (run + sizes[i]) * (1 - kept[:, i])
        largest = np.maximum(largest, run)
    return float(np.min(kept @ sizes + largest)) if n else 0.0


def check_structure(sizes: np.ndarray, result: CheckpointSet) -> None:
    """The set is sorted, segments are the maximal non-kept runs, peak is as defined."""
    n = sizes.shape[0]
    kept = list(result.checkpoints)
    assert kept == sorted(set(kept)) and all(0 <= i < n for i in kept)
    covered = sorted(kept + [i for seg in result.segments for i in seg])
    assert covered == list(range(n)), "kept + segments must partition the indices"
    for seg in result.segments:
        assert list(seg) == list(range(seg[0], seg[-1] + 1)), "a segment is consecutive"
        assert seg[0] == 0 or seg[0] - 1 in kept, "a segment starts after a checkpoint"
        assert seg[-1] == n - 1 or seg[-1] + 1 in kept, "a segment ends before a checkpoint"
    largest = max((sizes[list(seg)].sum() for seg in result.segments), default=0.0)
    assert result.peak == pytest.approx(sizes[kept].sum() + largest, rel=1e-12, abs=1e-12)


small_ints = st.lists(st.integers(0, 20), min_size=0, max_size=14)
tie_heavy = st.lists(st.sampled_from([0, 1, 2]), min_size=0, max_size=14)
floats = st.lists(
    st.floats(0, 100, allow_nan=False, allow_infinity=False), min_size=0, max_size=12
)


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=250, deadline=None)
@given(sizes=st.one_of(small_ints, tie_heavy))
def test_equals_brute_force_integers(method, sizes):
    array = np.asarray(sizes, dtype=np.float64)
    result = min_peak_chain(array, method=method)
    check_structure(array, result)
    assert result.peak == brute_force_peak(array)  # integer sizes: exact arithmetic


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=120, deadline=None)
@given(sizes=floats)
def test_equals_brute_force_floats(method, sizes):
    array = np.asarray(sizes, dtype=np.float64)
    result = min_peak_chain(array, method=method)
    check_structure(array, result)
    assert result.peak == pytest.approx(brute_force_peak(array), rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(
    "family",
    [
        lambda rng, n: rng.random(n),
        lambda rng, n: rng.integers(0, 5, n).astype(float),
        lambda rng, n: rng.exponential(size=n) ** 3,
        lambda rng, n: 1.0 + 1e-3 * rng.random(n),
        lambda rng, n: np.arange(1, n + 1, dtype=float),
        lambda rng, n: np.ones(n),
    ],
    ids=["uniform", "small-ints", "heavy-tail", "near-equal", "increasing", "equal"],
)
def test_fast_equals_cubic_on_longer_chains(family):
    rng = np.random.default_rng(0)
    for n in (30, 90, 160):
        sizes = family(rng, n)
        fast = min_peak_chain(sizes, method="fast")
        cubic = min_peak_chain(sizes, method="cubic")
        check_structure(sizes, fast)
        assert fast.peak == pytest.approx(cubic.peak, rel=1e-12)


@pytest.mark.parametrize("m", [2, 3, 10, 40])
def test_tied_blocks_lower_bound_family(m):
    # Lemma 5 (solver/chain/min_peak.py): the least peak T0 + m d is attained at exactly the m + 1
    # bounds T0 + i d, and every exact search must evaluate a bound in each gap between.
    sizes = tied_blocks(m)
    top, optimum = 10.0 * m, 11.0 * m
    assert sizes.size == 4 * m - 1
    if sizes.size <= 14:
        assert brute_force_peak(sizes) == optimum
    for method in METHODS:
        result = min_peak_chain(sizes, method=method)
        check_structure(sizes, result)
        assert result.peak == optimum
    prefix = np.concatenate(([0.0], np.cumsum(sizes)))
    parent = np.empty(sizes.size + 2, np.int64)
    for i in range(m + 1):
        bound = top + i
        assert bound + _bounded_cost(sizes, prefix, bound, parent) == optimum
        between = bound + 0.5
        assert between + _bounded_cost(sizes, prefix, between, parent) > optimum
    assert top - 1 + _bounded_cost(sizes, prefix, top - 1, parent) > optimum
    assert _branch_and_bound(sizes, prefix)[1] >= m
    with pytest.raises(ValueError, match="at least 2"):
        tied_blocks(1)


def test_hand_worked():
    # Keep the 5 and the 2: segments {3,1,4,1}=9, {9}, {6}; peak 5 + 2 + 9 = 16.
    # No set does better: brute force agrees.
    sizes = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=float)
    for method in METHODS:
        result = min_peak_chain(sizes, method=method)
        assert result.peak == 16.0 == brute_force_peak(sizes)
    # Equal sizes: n = 8 ones -> keep 2 (positions splitting into runs of <= 2)
    # gives 2 + 2 = 4; keeping 1 gives 1 + 4 = 5; keeping 3 gives 3 + 2 = 5.
    assert min_peak_chain(np.ones(8)).peak == 4.0


def test_empty_zero_and_single():
    assert min_peak_chain([]) == CheckpointSet(checkpoints=(), segments=(), peak=0.0)
    zeros = min_peak_chain([0.0, 0.0, 0.0])
    assert zeros.peak == 0.0 and zeros.checkpoints == ()  # ties prefer fewer checkpoints
    assert min_peak_chain([7.0]).peak == 7.0


@pytest.mark.parametrize(
    "sizes, message",
    [
        ([[1.0, 2.0]], "one-dimensional"),
        ([1.0, -2.0, 3.0], r"sizes\[1\] = -2\.0"),
        ([1.0, 2.0, float("nan")], r"sizes\[2\] = nan"),
        ([float("inf")], r"sizes\[0\] = inf"),
    ],
)
def test_invalid_sizes(sizes, message):
    with pytest.raises(ValueError, match=message):
        min_peak_chain(sizes)


def test_unknown_method():
    with pytest.raises(ValueError, match="'cubic' or 'fast'"):
        min_peak_chain([1.0], method="quadratic")


def test_large_chain_beats_simple_feasible_sets():
    # Not a timing assertion (benchmarks/linear_speed.py measures that): a large chain
    # runs, its set is well formed, and its peak is no worse than keeping nothing or
    # keeping every 141st tensor.
    sizes = np.random.default_rng(1).random(20_000)
    result = min_peak_chain(sizes, method="fast")
    check_structure(sizes, result)
    kept = np.arange(0, sizes.size, 141)
    ends = np.append(kept[1:], sizes.size)
    regular = sizes[kept].sum() + max(sizes[a + 1 : b].sum() for a, b in zip(kept, ends))
    assert result.peak <= min(sizes.sum(), regular)
