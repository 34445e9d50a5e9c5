"""Sampling the K sets of search traces, and the gradient scale M of Proposition 3.1.

SPIRAL (Algorithm 1, line 5) draws N1 search traces for a prompt, then uniformly samples K sets of n
traces each, without replacement. Each set is shown to the aggregator, and each search trace is credited
with the mean advantage of the sets that contain it (advantages.py). This file holds the sampler and the
two numbers Proposition 3.1 attaches to it:

    q_K = Pr(a given trace is in at least one of the K sets) = 1 - C(A_{N-1}, K) / C(A_N, K)
    M   = (N / n) * q_K - 1

A_N is the number of possible sets over N traces: C(N, n) unordered sets, or (N)_n = N!/(N-n)! ordered
tuples. The paper states the ordered case. The proof holds word for word for unordered sets, because N/n
is again A_N divided by the number of sets that contain a given trace. In expectation the set-RL
estimator equals M times the true set-RL gradient. So M is the factor to divide the search-trace
learning rate (or advantages) by for an unbiased estimate.

Order inside a set. Give each row's traces to the aggregator in the row's order. Unordered rows are
ascending indices. Because the traces are i.i.d., that order says nothing about their content. So with
unordered sets the estimator's expectation is still M times the set-RL gradient, with M from
ordered=False, even when f_spiral depends on the order of the traces in the prompt. The Discussion's
symmetry worry does not arise. Reordering a set by content (by length, by answer) does bias it: the
estimate is then of a different, symmetrised objective. The same holds for the trace indices: number
the traces in the order they were sampled, not, say, in the order they finished generating.
tests/test_proposition.py checks both cases exactly.

Conventions: traces are the indices 0 .. N-1. Unordered sets come back as ascending rows, ordered tuples
in their sampled order. Only numpy and the standard library are used, so this file can be copied into
another trainer by itself.
"""

import itertools
import math

import numpy as np


def _count(name, value, minimum):
    """`value` as a Python int >= minimum, else ValueError naming it (True and 2.0 are not counts)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _total(N, n, ordered):
    """A_N: the number of possible sets of size n over N traces."""
    return math.perm(N, n) if ordered else math.comb(N, n)


def _check(num_traces, set_size, num_sets=None, ordered=False):
    """Validated ints (N, n, K); K is None when not given. Every message names the numbers."""
    N = _count("num_traces", num_traces, 1)
    n = _count("set_size", set_size, 1)
    if n > N:
        raise ValueError(f"set_size={n} is larger than num_traces={N}")
    if num_sets is None:
        return N, n, None
    K = _count("num_sets", num_sets, 1)
    if K > _total(N, n, ordered):
        kind = "ordered tuples" if ordered else "sets"
        raise ValueError(f"num_sets={K} exceeds the {_total(N, n, ordered)} possible {kind} of "
                         f"size set_size={n} from num_traces={N}")
    return N, n, K


def num_sets(num_traces, set_size, ordered=False):
    """A_N, the number of possible sets: C(N, n) unordered, or (N)_n = N!/(N-n)! ordered tuples."""
    N, n, _ = _check(num_traces, set_size, ordered=ordered)
    return _total(N, n, ordered)


def sample_sets(num_traces, set_size, num_sets, *, ordered=False, rng):
    """K sets of n distinct trace indices, uniform over all K-subsets of the A_N possible sets.

    Algorithm 1, line 5: "Sample sets G_1, ..., G_K of n unique generations from {y_1:N1} without
    replacement". No index repeats within a row. No two rows are the same set, or the same tuple when
    `ordered`. Returns int64 `sets_K_n` of shape (num_sets, set_size). Unordered rows are ascending.

    Two exact regimes, so at most 2K sets are ever listed:
    - K <= A_N / 2 (the usual case; N=64, n=8 has 4.4e9 sets): draw uniform rows and reject rows
      already drawn. Each accepted row is then uniform over the sets not yet drawn, which makes the K
      rows a uniform sample without replacement. At most about 1.39 K draws are expected.
    - K > A_N / 2: list all A_N < 2K sets and pick K of them with rng.choice(..., replace=False).

    `rng` is a numpy Generator (np.random.default_rng(seed)). It is required so that runs reproduce.
    """
    N, n, K = _check(num_traces, set_size, num_sets, ordered)
    total = _total(N, n, ordered)
    if 2 * K > total:
        every = list((itertools.permutations if ordered else itertools.combinations)(range(N), n))
        rows = [every[r] for r in rng.choice(total, size=K, replace=False)]
    else:
        seen, rows = set(), []
        while len(rows) < K:
            row = rng.choice(N, size=n, replace=False)  # uniform ordered n-tuple of distinct indices
            key = tuple(int(i) for i in (row if ordered else np.sort(row)))
            if key not in seen:
                seen.add(key)
                rows.append(key)
    return np.array(rows, dtype=np.int64).reshape(K, n)  # (K, n)


def _coverage(N, n, K, ordered):
    """q_K as an exact pair of ints (numerator, denominator); int / int then rounds correctly once."""
    # The K sets miss trace i exactly when all K come from the A_{N-1} sets over the other traces.
    denominator = math.comb(_total(N, n, ordered), K)
    return denominator - math.comb(_total(N - 1, n, ordered), K), denominator


def coverage_probability(num_traces, set_size, num_sets, ordered=True):
    """q_K of Proposition 3.1: the probability that a given trace is in at least one of the K sets.

    q_K = 1 - C(A_{N-1}, K) / C(A_N, K), computed exactly with Python integers and rounded once.
    q_1 = n / N, and q_K = 1 once K > A_{N-1}. The default `ordered=True` is the proposition's
    statement. SPIRAL samples unordered sets, so pass ordered=False for it.

    Paper defaults N1=8, n=4, K=4: unordered q_K = 1453/1541 = 0.94289, so 88/1541 = 5.7% of search
    traces are in no set and get no gradient. Ordered q_K = 1760221/1877122 = 0.93772.
    """
    N, n, K = _check(num_traces, set_size, num_sets, ordered)
    q_num, q_den = _coverage(N, n, K, ordered)
    return q_num / q_den


def gradient_scale(num_traces, set_size, num_sets, ordered=True):
    """M = (N / n) q_K - 1 of Proposition 3.1.

    E[sum_i grad log pi(y_i) A_marg(y_i)] = M grad E[f(y_1:n)]. In expectation the estimator built from
    marginal set advantages is the set-RL gradient times M. M = 0 for K = 1, because a single set's
    advantage is zero, and also for N = n. M grows with K up to N/n - 1 when every set is drawn.
    For an unbiased estimate, divide the search-trace advantages (or their learning rate) by M. M depends
    only on (N, n, K), so with a fixed configuration it can also be read as part of the learning rate.

    Paper defaults N1=8, n=4, K=4: unordered (as SPIRAL samples) M = 1365/1541 = 0.88579; ordered
    M = 821660/938561 = 0.87545. The arithmetic is exact, so large N and K neither overflow nor lose
    precision. Its cost grows with K log(A_N): about 0.2 s for N=1000, n=10 ordered, K=10^4.
    """
    N, n, K = _check(num_traces, set_size, num_sets, ordered)
    q_num, q_den = _coverage(N, n, K, ordered)
    return (N * q_num - n * q_den) / (n * q_den)  # (N/n) q_K - 1 over one common denominator
