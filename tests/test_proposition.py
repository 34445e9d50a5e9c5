"""Proposition 3.1 on a tiny categorical policy, exactly and by Monte Carlo.

The policy is pi_theta = softmax(theta) over A actions, so grad_theta log pi(y) = e_y - softmax(theta).
The set objective f is a random table over A^n, so it is not symmetric. The estimator is built with the
library code (setsample + advantages):

    g = sum_i grad log pi(y_i) A#_marg(y_i),

and the proposition says E[g] = M grad E[f(y_1..y_n)], with M = gradient_scale(N, n, K, ordered).

The exact test enumerates every outcome y_1..y_N and every K-collection of sets. Sets are fed to f in
index order (the order setsample returns them in, and the order a trainer puts them into the prompt).
The identity then holds for unordered sets too, symmetric f or not, with the unordered M: the traces
are i.i.d., so index order carries no information about their content. The Discussion's concern is
real only when the order in the prompt depends on the traces' content.
test_content_dependent_order_is_biased shows that case: sorting each set by content turns the estimate
into M times the gradient of a different, symmetrised objective.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advantages import marginal_set_advantages, set_advantages, spiral_advantages
from setsample import gradient_scale, sample_sets


def softmax(theta):
    e = np.exp(theta - np.max(theta))
    return e / e.sum()


def grad_log_pi(ys, pi):
    """grad_theta log pi(y) = e_y - pi for each y: shape ys.shape + (A,)."""
    return np.eye(len(pi))[ys] - pi


def estimate(ys_N, sets_K_n, f_table, pi, present=None):
    """One draw of the set-RL gradient estimate (Algorithm 1, line 14), built with the library code.

    `present` reorders each set's traces before f sees them (None: index order, as sampled).
    """
    shown_K_n = ys_N[sets_K_n] if present is None else present(ys_N[sets_K_n])  # actions, (K, n)
    scores_K = f_table[tuple(shown_K_n.T)]  # f(y_s1, ..., y_sn) per set, (K,)
    adv_N = marginal_set_advantages(sets_K_n, set_advantages(scores_K), len(ys_N))
    return adv_N @ grad_log_pi(ys_N, pi)  # (A,)


def exact_expected_estimate(N, n, K, pi, f_table, ordered, present=None):
    """E over y_1..y_N ~ pi and over a uniform K-collection of sets, by enumerating both."""
    A = len(pi)
    make = itertools.permutations if ordered else itertools.combinations
    every_set = np.array(list(make(range(N), n)))
    collections = list(itertools.combinations(range(len(every_set)), K))
    total = np.zeros(A)
    for ys in itertools.product(range(A), repeat=N):
        ys_N = np.array(ys)
        mean_over_T = sum(estimate(ys_N, every_set[list(T)], f_table, pi, present) for T in collections)
        total += np.prod(pi[ys_N]) * mean_over_T / len(collections)
    return total


def grad_expected_f(f_table, pi):
    """grad E_{y_1..y_n ~ pi}[f(y_1..y_n)] = sum_y p(y) f(y) sum_r grad log pi(y_r), by enumeration."""
    A, n = len(pi), f_table.ndim
    grad = np.zeros(A)
    for ys in itertools.product(range(A), repeat=n):
        grad += np.prod(pi[list(ys)]) * f_table[ys] * grad_log_pi(np.array(ys), pi).sum(axis=0)
    return grad


def small_configs(ordered, max_work=1500):
    """(A, N, n, K) whose exact enumeration takes at most max_work estimator calls."""
    out = []
    for A, N in itertools.product((2, 3), (2, 3, 4)):
        for n in range(1, N + 1):
            total = math.perm(N, n) if ordered else math.comb(N, n)
            out += [(A, N, n, K) for K in range(1, total + 1) if A ** N * math.comb(total, K) <= max_work]
    return out


@st.composite
def problems(draw, ordered):
    A, N, n, K = draw(st.sampled_from(small_configs(ordered)))
    theta = np.array(draw(st.lists(st.floats(-2, 2), min_size=A, max_size=A)))
    f_table = np.array(draw(st.lists(st.floats(-1, 1), min_size=A ** n, max_size=A ** n))).reshape((A,) * n)
    return N, n, K, theta, f_table


@settings(max_examples=25, deadline=None, derandomize=True)
@given(problems(ordered=True))
def test_proposition_exact_ordered(problem):
    N, n, K, theta, f_table = problem
    pi = softmax(theta)
    lhs = exact_expected_estimate(N, n, K, pi, f_table, ordered=True)
    rhs = gradient_scale(N, n, K, ordered=True) * grad_expected_f(f_table, pi)
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-9)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(problems(ordered=False), st.booleans())
def test_proposition_exact_unordered(problem, symmetric):
    """Unordered sets with the unordered M: exact for a symmetric f and, in index order, for any f."""
    N, n, K, theta, f_table = problem
    if symmetric:  # average over all orders of the arguments
        f_table = np.mean([f_table.transpose(p) for p in itertools.permutations(range(n))], axis=0)
    pi = softmax(theta)
    lhs = exact_expected_estimate(N, n, K, pi, f_table, ordered=False)
    rhs = gradient_scale(N, n, K, ordered=False) * grad_expected_f(f_table, pi)
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-9)


@pytest.mark.parametrize("ordered", [True, False])
def test_proposition_exact_every_small_config(ordered):
    """The same identity over every small (A, N, n, K), K = 1 and K = A_N included, with a random
    non-symmetric f and theta per configuration."""
    rng = np.random.default_rng(7)
    for A, N, n, K in small_configs(ordered):
        pi = softmax(rng.normal(size=A))
        f_table = rng.uniform(-1, 1, size=(A,) * n)
        lhs = exact_expected_estimate(N, n, K, pi, f_table, ordered)
        rhs = gradient_scale(N, n, K, ordered=ordered) * grad_expected_f(f_table, pi)
        np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-9, err_msg=f"A={A} N={N} n={n} K={K}")


def test_content_dependent_order_is_biased():
    """Sorting a set's traces by content before f sees them estimates the symmetrised objective.

    f(a, b) = 1{a = 0, b = 1}: E[f] = pi0 pi1, but E[f(sorted)] = 2 pi0 pi1, so the gradient is off by a
    factor of 2. Index order (present=None) has no such bias, ordered or unordered.
    """
    N, n, K = 3, 2, 2
    pi = softmax(np.array([0.3, -0.4]))
    f_table = np.array([[0.0, 1.0], [0.0, 0.0]])
    by_content = lambda shown_K_n: np.sort(shown_K_n, axis=1)  # noqa: E731
    for ordered in (False, True):
        M = gradient_scale(N, n, K, ordered=ordered)
        assert M > 0
        unbiased = M * grad_expected_f(f_table, pi)
        in_index_order = exact_expected_estimate(N, n, K, pi, f_table, ordered)
        sorted_by_content = exact_expected_estimate(N, n, K, pi, f_table, ordered, present=by_content)
        np.testing.assert_allclose(in_index_order, unbiased, rtol=0, atol=1e-12)
        np.testing.assert_allclose(sorted_by_content, 2 * unbiased, rtol=0, atol=1e-12)
        assert np.abs(unbiased).max() > 0.01  # so "twice" is a real difference


def monte_carlo(N, n, K, pi, f_table, ordered, draws, seed):
    """Mean and standard error, per coordinate, of the estimate over `draws` independent draws."""
    rng = np.random.default_rng(seed)
    ys_R_N = rng.choice(len(pi), size=(draws, N), p=pi)
    g_R_A = np.array([estimate(ys_N, sample_sets(N, n, K, ordered=ordered, rng=rng), f_table, pi)
                      for ys_N in ys_R_N])
    return g_R_A.mean(axis=0), g_R_A.std(axis=0, ddof=1) / math.sqrt(draws)


@st.composite
def mc_problems(draw):
    A = draw(st.sampled_from((2, 3)))
    N = draw(st.integers(2, 8))
    n = draw(st.integers(1, min(N, 4)))
    ordered = draw(st.booleans())
    total = math.perm(N, n) if ordered else math.comb(N, n)
    K = draw(st.integers(1, min(total, 6)))
    theta = np.array(draw(st.lists(st.floats(-2, 2), min_size=A, max_size=A)))
    f_table = np.array(draw(st.lists(st.floats(0, 1), min_size=A ** n, max_size=A ** n))).reshape((A,) * n)
    return N, n, K, ordered, theta, f_table, draw(st.integers(0, 2 ** 32 - 1))


@settings(max_examples=10, deadline=None, derandomize=True)
@given(mc_problems())
def test_proposition_monte_carlo(problem):
    """sample_sets + advantages agree with M grad E[f] within 5 standard errors (2000 draws)."""
    N, n, K, ordered, theta, f_table, seed = problem
    pi = softmax(theta)
    mean, se = monte_carlo(N, n, K, pi, f_table, ordered, draws=2000, seed=seed)
    expected = gradient_scale(N, n, K, ordered=ordered) * grad_expected_f(f_table, pi)
    assert np.all(np.abs(mean - expected) <= 5 * se + 1e-12), (mean, expected, se)


def test_monte_carlo_can_tell_the_scale_apart():
    """At the paper's N1=8, n=4, K=4 the same Monte Carlo check rejects (N/n) q_K = M + 1 (what an
    estimator without the set baseline would give) and 0, so the 5-SE tolerance above is not vacuous."""
    N, n, K = 8, 4, 4
    pi = softmax(np.array([0.5, -0.5]))
    f_table = np.zeros((2,) * n)
    f_table[1, 1, :, :] = 1.0  # rewarded when the first two shown traces are action 1
    mean, se = monte_carlo(N, n, K, pi, f_table, ordered=False, draws=4000, seed=0)
    grad = grad_expected_f(f_table, pi)
    M = gradient_scale(N, n, K, ordered=False)
    assert np.all(np.abs(mean - M * grad) <= 5 * se)
    for wrong in (M + 1, 0.0):
        assert np.all(np.abs(mean - wrong * grad) > 5 * se), (wrong, mean, se)


def test_spiral_advantages_search_part_is_the_set_rl_estimator():
    """spiral_advantages scores sets by their mean aggregation reward: with one aggregation trace per
    set whose reward is f, its search advantages equal the set-advantage pipeline used above."""
    rng = np.random.default_rng(3)
    ys_N = rng.integers(0, 2, size=6)
    f_table = rng.random((2, 2, 2))
    sets_K_n = sample_sets(6, 3, 5, rng=rng)
    scores_K = f_table[tuple(ys_N[sets_K_n].T)]
    adv_N1, _ = spiral_advantages(sets_K_n, rewards_K_N2=scores_K[:, None], N1=6)
    np.testing.assert_allclose(adv_N1, marginal_set_advantages(sets_K_n, set_advantages(scores_K), 6))
