"""setsample.py: counts, the sampler's uniformity and validity, q_K and M, and bad inputs."""

import collections
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from setsample import count_possible_sets, coverage_probability, gradient_scale, sample_sets


def every_set(N, n, ordered):
    return list((itertools.permutations if ordered else itertools.combinations)(range(N), n))


def assert_valid(sets_K_n, N, n, K, ordered):
    assert sets_K_n.shape == (K, n) and sets_K_n.dtype == np.int64
    assert sets_K_n.min() >= 0 and sets_K_n.max() < N
    assert all(len(set(row)) == n for row in sets_K_n.tolist()), "an index repeats within a row"
    if not ordered:
        assert np.all(np.diff(sets_K_n, axis=1) > 0), "unordered rows must be ascending"
    keys = [tuple(row) if ordered else frozenset(row) for row in sets_K_n.tolist()]
    assert len(set(keys)) == K, "two rows are the same set"


@pytest.mark.parametrize("ordered", [False, True])
def test_count_possible_sets(ordered):
    for N in range(1, 8):
        for n in range(1, N + 1):
            assert count_possible_sets(N, n, ordered) == len(every_set(N, n, ordered))
    assert count_possible_sets(8, 4, ordered) == (1680 if ordered else 70)
    assert count_possible_sets(64, 8, ordered) == (math.perm(64, 8) if ordered else math.comb(64, 8))


def test_ordered_draws_are_tuples_so_both_orders_of_one_set_can_be_drawn():
    """ordered=True draws (N)_n tuples: (0, 1) and (1, 0) are two of them, and a draw of K = 3 of the 6 tuples of
    3 traces holds a tuple and its reverse 12 times in 20 (only 8 of the C(6, 3) = 20 collections hold no such pair).
    Deduplicating the tuples as sets would never draw both orders."""
    rng = np.random.default_rng(4)
    draws = [sample_sets(3, 2, 3, ordered=True, rng=rng).tolist() for _ in range(200)]
    with_both_orders = sum(any([b, a] in rows for a, b in rows) for rows in draws)
    assert 0.45 < with_both_orders / 200 < 0.75


@st.composite
def set_problems(draw):
    N = draw(st.integers(1, 9))
    n = draw(st.integers(1, N))
    ordered = draw(st.booleans())
    K = draw(st.integers(1, min(count_possible_sets(N, n, ordered), 60)))
    return N, n, K, ordered, draw(st.integers(0, 2 ** 32 - 1))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(set_problems())
def test_sample_sets_valid(problem):
    N, n, K, ordered, seed = problem
    assert_valid(sample_sets(N, n, K, ordered=ordered, rng=np.random.default_rng(seed)), N, n, K, ordered)


@pytest.mark.parametrize("ordered", [False, True])
def test_sample_sets_every_set_when_K_is_the_total(ordered):
    rng = np.random.default_rng(0)
    for N, n in [(5, 2), (4, 4), (6, 3)]:
        total = count_possible_sets(N, n, ordered)
        sets_K_n = sample_sets(N, n, total, ordered=ordered, rng=rng)
        assert sorted(map(tuple, sets_K_n.tolist())) == every_set(N, n, ordered)


@pytest.mark.parametrize("N, n, K, ordered", [
    (4, 2, 2, False),  # 6 sets, rejection regime (K <= A_N / 2)
    (4, 2, 4, False),  # 6 sets, listing regime (K > A_N / 2)
    (3, 2, 2, True),   # 6 tuples, rejection regime
    (3, 2, 5, True),   # 6 tuples, listing regime
])
def test_sample_sets_uniform_over_collections(N, n, K, ordered):
    """Each of the C(A_N, K) possible collections of K sets is equally likely: every count within
    5 binomial standard errors of draws / C(A_N, K), and the chi-square statistic below its 0.999
    quantile bound. Also each single set is in a draw with probability K / A_N."""
    draws, rng = 3000, np.random.default_rng(1)
    samples = [sample_sets(N, n, K, ordered=ordered, rng=rng) for _ in range(draws)]
    key = (lambda row: tuple(row)) if ordered else (lambda row: frozenset(row))
    collections_seen = collections.Counter(frozenset(key(r) for r in s.tolist()) for s in samples)
    cells = math.comb(count_possible_sets(N, n, ordered), K)
    assert len(collections_seen) == cells
    p = 1 / cells
    expected, se = draws * p, math.sqrt(draws * p * (1 - p))
    assert all(abs(c - expected) <= 5 * se for c in collections_seen.values()), collections_seen
    chi2 = sum((c - expected) ** 2 / expected for c in collections_seen.values())
    assert chi2 < (cells - 1) + 5 * math.sqrt(2 * (cells - 1))  # mean + 5 sd of chi2(cells - 1)
    in_draw = collections.Counter(key(r) for s in samples for r in s.tolist())
    p_set = K / count_possible_sets(N, n, ordered)
    se_set = math.sqrt(draws * p_set * (1 - p_set))
    assert all(abs(c - draws * p_set) <= 5 * se_set + 1e-9 for c in in_draw.values())


@pytest.mark.parametrize("ordered", [False, True])
def test_sample_sets_draws_when_sets_are_astronomically_many(ordered):
    """No listing of all C(N, n) sets (which would never end here): the draws are rejection-sampled."""
    rng = np.random.default_rng(2)
    sets_K_n = sample_sets(64, 8, 1000, ordered=ordered, rng=rng)
    huge = sample_sets(300, 100, 50, ordered=ordered, rng=rng)  # C(300, 100) > 2**63
    assert_valid(sets_K_n, 64, 8, 1000, ordered)
    assert_valid(huge, 300, 100, 50, ordered)


def test_sample_sets_reproducible_and_accepts_numpy_ints():
    a = sample_sets(np.int64(8), np.int32(4), np.int64(4), rng=np.random.default_rng(5))
    b = sample_sets(8, 4, 4, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def exact_coverage(N, n, K, ordered):
    """q_K by enumerating every K-collection: the fraction that contains trace 0."""
    sets = every_set(N, n, ordered)
    collections_ = list(itertools.combinations(sets, K))
    return Fraction(sum(any(0 in s for s in T) for T in collections_), len(collections_))


@pytest.mark.parametrize("ordered", [False, True])
def test_coverage_probability_exact_by_enumeration(ordered):
    for N, n in [(3, 1), (3, 2), (4, 2), (4, 3), (5, 2), (3, 3)]:
        for K in range(1, min(count_possible_sets(N, n, ordered), 4) + 1):
            assert coverage_probability(N, n, K, ordered) == float(exact_coverage(N, n, K, ordered))


@pytest.mark.parametrize("N, n, K, ordered",
                         [(8, 4, 4, False), (8, 4, 4, True), (6, 2, 3, False), (10, 3, 2, True)])
def test_coverage_probability_monte_carlo(N, n, K, ordered):
    draws, rng = 4000, np.random.default_rng(3)
    covered = sum(bool(np.any(sample_sets(N, n, K, ordered=ordered, rng=rng) == 0)) for _ in range(draws))
    q = coverage_probability(N, n, K, ordered)
    assert abs(covered / draws - q) <= 5 * math.sqrt(q * (1 - q) / draws)


def test_paper_defaults():
    """N1=8, n=4, K=4: the numbers quoted in the docstrings."""
    assert coverage_probability(8, 4, 4, ordered=False) == 1453 / 1541
    assert gradient_scale(8, 4, 4, ordered=False) == 1365 / 1541
    assert coverage_probability(8, 4, 4, ordered=True) == 1760221 / 1877122
    assert gradient_scale(8, 4, 4, ordered=True) == 821660 / 938561
    assert 1 - coverage_probability(8, 4, 4, ordered=False) == pytest.approx(0.0571, abs=1e-4)


def test_every_function_defaults_to_unordered_sets_as_spiral_samples():
    assert gradient_scale(8, 4, 4) == 1365 / 1541
    assert coverage_probability(8, 4, 4) == 1453 / 1541
    assert count_possible_sets(8, 4) == 70
    assert np.all(np.diff(sample_sets(8, 4, 4, rng=np.random.default_rng(0)), axis=1) > 0)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(1, 40), st.integers(1, 40), st.booleans())
def test_gradient_scale_K1_is_zero_and_K_above_one_is_positive(N, n, ordered):
    n = min(n, N)
    assert coverage_probability(N, n, 1, ordered) == n / N
    assert gradient_scale(N, n, 1, ordered) == 0.0
    if N > n and count_possible_sets(N, n, ordered) >= 2:
        for K in (2, min(7, count_possible_sets(N, n, ordered))):
            assert gradient_scale(N, n, K, ordered) > 0


def test_gradient_scale_limits():
    assert gradient_scale(8, 4, 70, ordered=False) == 1.0  # every set: N/n - 1
    assert gradient_scale(5, 5, 1, ordered=True) == 0.0 and gradient_scale(5, 5, 100, ordered=True) == 0.0
    Ms = [gradient_scale(8, 4, K, ordered=False) for K in range(1, 71)]
    assert all(a < b for a, b in zip(Ms, Ms[1:30])) and all(a <= b for a, b in zip(Ms, Ms[1:]))
    assert Ms[3] == 1365 / 1541 and Ms[1] == 35 / 69  # K = 2: 1 - 2 C(35, 2) / C(70, 2)


def float_scale(N, n, K, ordered):
    """M from q_K = 1 - prod_j (A_{N-1} - j) / (A_N - j), in floats: an independent check."""
    big, small = (math.perm(N, n), math.perm(N - 1, n)) if ordered else (math.comb(N, n), math.comb(N - 1, n))
    ratio = math.prod((small - j) / (big - j) for j in range(K)) if K <= small else 0.0
    return N / n * (1 - ratio) - 1


@pytest.mark.parametrize("N, n, K, ordered",
                         [(1000, 10, 2000, True), (10 ** 6, 2, 3, False), (64, 8, 1000, False)])
def test_gradient_scale_large_inputs_do_not_overflow(N, n, K, ordered):
    """C(A_N, K) overflows a float here (1000, 10, 2000: about 10^60000); exact integers do not."""
    assert gradient_scale(N, n, K, ordered) == pytest.approx(float_scale(N, n, K, ordered), rel=1e-10)
    assert 0 < gradient_scale(N, n, K, ordered) <= N / n - 1


@pytest.mark.parametrize("call, message", [
    (lambda: sample_sets(5, 2, 11, rng=np.random.default_rng()),
     r"num_sets=11 exceeds the 10 possible sets.*set_size=2.*num_traces=5"),
    (lambda: sample_sets(3, 2, 7, ordered=True, rng=np.random.default_rng()),
     r"num_sets=7 exceeds the 6 possible ordered tuples"),
    (lambda: sample_sets(3, 4, 1, rng=np.random.default_rng()), r"set_size=4 is larger than num_traces=3"),
    (lambda: sample_sets(3, 0, 1, rng=np.random.default_rng()), r"set_size must be at least 1, got 0"),
    (lambda: sample_sets(-3, 2, 1, rng=np.random.default_rng()), r"num_traces must be at least 1, got -3"),
    (lambda: sample_sets(5, 2, -1, rng=np.random.default_rng()), r"num_sets must be at least 1, got -1"),
    (lambda: sample_sets(5, 2, 0, rng=np.random.default_rng()), r"num_sets must be at least 1, got 0"),
    (lambda: sample_sets(5.0, 2, 1, rng=np.random.default_rng()), r"num_traces must be an integer, got 5.0"),
    (lambda: sample_sets(5, 2, 1.5, rng=np.random.default_rng()), r"num_sets must be an integer, got 1.5"),
    (lambda: sample_sets(5, True, 1, rng=np.random.default_rng()), r"set_size must be an integer, got True"),
    (lambda: count_possible_sets(4, 5), r"set_size=5 is larger than num_traces=4"),
    (lambda: count_possible_sets(4, "2"), r"set_size must be an integer, got '2'"),
    (lambda: coverage_probability(8, 4, 71, ordered=False), r"num_sets=71 exceeds the 70 possible sets"),
    (lambda: coverage_probability(8, 9, 1), r"set_size=9 is larger than num_traces=8"),
    (lambda: gradient_scale(8, 4, 1681, ordered=True), r"num_sets=1681 exceeds the 1680 possible ordered tuples"),
    (lambda: gradient_scale(8, 4, -2), r"num_sets must be at least 1, got -2"),
])
def test_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_rng_is_required():
    with pytest.raises(TypeError):
        sample_sets(5, 2, 1)
