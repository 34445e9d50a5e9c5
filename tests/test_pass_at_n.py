"""Line 13 under a perfect selector is pass@n policy optimisation (PKPO, Walder & Karkhanis 2025).

When the aggregator always picks the best candidate, a set scores f(G) = max_{y in G} r(y). With every one of the
C(N1, n) sets, line 13's marginal set advantage is then, for r in {0, 1} and c right traces of N1,

    A#_marg(y_j) = 1 - rho(N1, c, n)                         if y_j is right
                 = rho(N1 - 1, c, n - 1) - rho(N1, c, n)      if y_j is wrong,    rho(N, c, k) = 1 - C(N-c, k)/C(N, k)

PKPO's transformed reward times N1/n minus its unbiased pass@n estimate. These tests check the identity against
rho written out here with math.comb, the closed form for rewards in [0, 1] against enumeration of every set, and
that K sampled sets give this all-sets advantage times M_K / M_all in expectation (Proposition 3.1; M_all = 1 for
the paper's N1 = 2n, so the factor is M).
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advantages import (marginal_set_advantages, oracle_set_scores, pass_at_k_estimate, pass_at_n_advantages,
                        set_advantages)
from setsample import all_sets, gradient_scale, sample_sets


def rho(N, c, k):
    """The unbiased pass@k estimate from c right of N, written out (no project code)."""
    return 1 - math.comb(N - c, k) / math.comb(N, k)


def line13_by_enumeration(rewards_N1, n):
    """The paper's line 13 over every set, with f(G) = max over G: the plain double loop."""
    N = len(rewards_N1)
    every = list(itertools.combinations(range(N), n))
    scores = [max(rewards_N1[j] for j in G) for G in every]
    baseline = sum(scores) / len(scores)
    return np.array([np.mean([s - baseline for G, s in zip(every, scores) if j in G]) for j in range(N)])


@st.composite
def population(draw, binary):
    N = draw(st.integers(2, 9))
    n = draw(st.integers(1, N))
    if binary:
        rewards = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=N, max_size=N))
    else:  # a few distinct values, so ties occur often
        values = draw(st.lists(st.floats(0, 1), min_size=1, max_size=4))
        rewards = draw(st.lists(st.sampled_from(values), min_size=N, max_size=N))
    return np.array(rewards), n


def test_all_sets_lists_every_set_once_in_order():
    sets = all_sets(6, 3)
    assert sets.shape == (20, 3) and sets.dtype == np.int64
    assert [tuple(row) for row in sets] == list(itertools.combinations(range(6), 3))
    assert all_sets(4, 4).tolist() == [[0, 1, 2, 3]]


def test_oracle_set_scores_is_the_best_candidate_of_each_set():
    rewards = np.array([0.2, 0.9, 0.0, 0.5, 0.5])
    sets = np.array([[0, 2, 4], [1, 3, 4], [2, 3, 4], [0, 2, 3]])
    assert oracle_set_scores(sets, rewards).tolist() == [0.5, 0.9, 0.5, 0.5]
    with pytest.raises(ValueError, match="indices in"):
        oracle_set_scores(np.array([[0, 5]]), rewards)


@settings(max_examples=150, deadline=None)
@given(population(binary=True))
def test_line13_over_all_sets_with_a_perfect_selector_is_pkpo(problem):
    rewards, n = problem
    N, c = len(rewards), int(rewards.sum())
    expected = np.array([1 - rho(N, c, n) if r == 1 else (rho(N - 1, c, n - 1) if n > 1 else 0.0) - rho(N, c, n)
                         for r in rewards])
    sets = all_sets(N, n)
    library = marginal_set_advantages(sets, set_advantages(oracle_set_scores(sets, rewards)), N)
    assert np.allclose(library, expected, atol=1e-12)
    assert np.allclose(pass_at_n_advantages(rewards, n), expected, atol=1e-12)
    assert pass_at_k_estimate(N, c, n) == pytest.approx(rho(N, c, n), abs=1e-15)


@settings(max_examples=150, deadline=None)
@given(population(binary=False))
def test_closed_form_equals_enumeration_for_rewards_in_the_unit_interval(problem):
    rewards, n = problem
    assert np.allclose(pass_at_n_advantages(rewards, n), line13_by_enumeration(rewards, n), atol=1e-12)


def test_pkpo_consequences_at_the_paper_sizes():
    """N1 = 8, n = 4: a right trace's credit falls as its sets fill with right traces; a wrong trace is credited
    for right sets it sits in, and both are exactly 0 once every set is right (c > N1 - n)."""
    adv = {c: pass_at_n_advantages(np.array([1.0] * c + [0.0] * (8 - c)), 4) for c in range(9)}
    right = [adv[c][0] for c in range(1, 9)]
    assert all(a > b for a, b in zip(right, right[1:5]))  # c = 1..5: less and less credit
    assert adv[1][0] == pytest.approx(1 - 0.5) and adv[1][7] == pytest.approx(3 / 7 - 0.5)
    for c in (5, 6, 7, 8):  # every 4-set holds a right trace: set RL falls silent
        assert np.all(adv[c] == 0.0)
    assert np.all(adv[0] == 0.0)


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 5).flatmap(lambda N: st.tuples(st.just(N), st.integers(1, N - 1))).flatmap(
    lambda Nn: st.tuples(st.just(Nn[0]), st.just(Nn[1]), st.integers(1, min(4, math.comb(*Nn))),
                         st.lists(st.floats(0, 1), min_size=Nn[0], max_size=Nn[0]))))
def test_k_sampled_sets_give_the_all_sets_advantage_times_M_over_M_all(case):
    """Exactly, by enumerating every collection of K distinct sets: E[A#_marg,K(y_j)] = (M_K / M_all) A#_all(y_j),
    where A#_all is line 13 over every set and M_all = N/n - 1 (Proposition 3.1's M at K = C(N, n))."""
    N, n, K, rewards = case
    rewards = np.array(rewards)
    every = all_sets(N, n)
    total = np.zeros(N)
    collections = list(itertools.combinations(range(len(every)), K))
    for chosen in collections:
        sets = every[list(chosen)]
        total += marginal_set_advantages(sets, set_advantages(oracle_set_scores(sets, rewards)), N)
    factor = gradient_scale(N, n, K) / gradient_scale(N, n, len(every))
    assert np.allclose(total / len(collections), factor * pass_at_n_advantages(rewards, n), atol=1e-12)


def test_monte_carlo_at_the_paper_sizes_is_M_times_pass_at_n():
    """N1 = 8, n = 4, K = 4 sets drawn as SPIRAL draws them: the mean over draws is M = 0.886 times PKPO's
    advantage (M_all = 8/4 - 1 = 1), within 5 standard errors; 1.0 times it is rejected."""
    rewards = np.array([1.0, 0, 0, 1, 0, 0, 0, 0])
    rng = np.random.default_rng(0)
    draws = np.array([marginal_set_advantages(s, set_advantages(oracle_set_scores(s, rewards)), 8)
                      for s in (sample_sets(8, 4, 4, rng=rng) for _ in range(20000))])  # (draws, N1)
    mean, se = draws.mean(0), draws.std(0, ddof=1) / np.sqrt(len(draws))
    target = gradient_scale(8, 4, 4) * pass_at_n_advantages(rewards, 4)
    assert np.all(np.abs(mean - target) < 5 * se)
    assert np.any(np.abs(mean - pass_at_n_advantages(rewards, 4)) > 5 * se)


def test_equal_rewards_or_one_set_give_exact_zeros_and_bad_inputs_are_refused():
    assert np.all(pass_at_n_advantages([0.3] * 6, 3) == 0.0)
    assert np.all(pass_at_n_advantages([0.0, 1.0, 1.0], 3) == 0.0)
    assert pass_at_n_advantages([0.0, 1.0, 0.5], 1).tolist() == pytest.approx([-0.5, 0.5, 0.0])
    for bad in (0, 4, 2.0, True):
        with pytest.raises(ValueError, match="set_size"):
            pass_at_n_advantages([0.0, 1.0, 1.0], bad)
    with pytest.raises(ValueError, match="finite"):
        pass_at_n_advantages([0.0, float("nan")], 1)
