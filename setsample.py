"""Drawing the K sets of search traces (Algorithm 1, line 5), and q_K and M of Proposition 3.1.

    q_K = Pr(a given trace is in at least one of the K sets) = 1 - C(A_{N-1}, K) / C(A_N, K)
    M   = (N / n) q_K - 1          E[set-RL estimator] = M x (true set-RL gradient)

A_N is the number of possible sets of n traces out of N: C(N, n) unordered sets (what SPIRAL samples, the
default everywhere here) or (N)_n = N!/(N-n)! ordered tuples (what the Proposition states). For the paper's
N1=8, n=4, K=4: M = 1365/1541 = 0.886 (unordered), and 5.7% of search traces fall in no set. Why the
unordered estimator is unbiased too, and when set order matters: README, "Proposition 3.1 in numbers".
numpy and the standard library only: copy this file into another trainer as it is.
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


def count_possible_sets(num_traces, set_size, ordered=False):
    """A_N: how many different sets of n traces there are, C(N, n) (or (N)_n ordered). Not K."""
    N, n, _ = _check(num_traces, set_size, ordered=ordered)
    return _total(N, n, ordered)


def sample_sets(num_traces, set_size, num_sets, *, ordered=False, rng):
    """Algorithm 1, line 5: K sets G_1..G_K of n distinct traces, uniformly without replacement.

    Returns int64 sets_K_n (K, n); unordered rows are ascending, and no two rows are the same set.
    K <= A_N/2: draw rows and reject repeats (each accepted row is uniform over the sets not yet drawn);
    otherwise list all A_N < 2K sets and choose K. `rng` is a numpy Generator, required so runs reproduce.
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


def all_sets(num_traces, set_size):
    """Every one of the C(N, n) unordered sets, in lexicographic order: sets_K_n with K = C(N, n) (int64).

    Line 5 in the limit K -> all: line 13 then averages over every set a trace is in, with no sampling noise
    (train.py --num-sets all). Rows are ascending, as sample_sets' unordered rows are.
    """
    N, n, _ = _check(num_traces, set_size)
    return np.array(list(itertools.combinations(range(N), n)), dtype=np.int64).reshape(-1, n)  # (C(N, n), n)


def _coverage(N, n, K, ordered):
    """q_K as an exact pair of ints (numerator, denominator)."""
    # The K sets miss trace i exactly when all K come from the A_{N-1} sets over the other traces.
    denominator = math.comb(_total(N, n, ordered), K)
    return denominator - math.comb(_total(N - 1, n, ordered), K), denominator


def coverage_probability(num_traces, set_size, num_sets, ordered=False):
    """q_K = 1 - C(A_{N-1}, K) / C(A_N, K) of Proposition 3.1, exact integers rounded once.

    N1=8, n=4, K=4: 1453/1541 = 0.943 (ordered: 0.938). q_1 = n/N; q_K = 1 once K > A_{N-1}.
    """
    N, n, K = _check(num_traces, set_size, num_sets, ordered)
    q_num, q_den = _coverage(N, n, K, ordered)
    return q_num / q_den


def gradient_scale(num_traces, set_size, num_sets, ordered=False):
    """M = (N / n) q_K - 1 of Proposition 3.1: E[sum_i grad log pi(y_i) A#_marg(y_i)] = M grad E[f].

    N1=8, n=4, K=4: 1365/1541 = 0.886 (ordered: 0.875). M = 0 for K = 1 or N = n; it grows with K up to
    N/n - 1. Dividing the search-trace advantages by M makes the estimator unbiased (train.py --unbiased-set-rl).
    """
    N, n, K = _check(num_traces, set_size, num_sets, ordered)
    q_num, q_den = _coverage(N, n, K, ordered)
    return (N * q_num - n * q_den) / (n * q_den)  # (N/n) q_K - 1 over one common denominator


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (copied alone, it imports numpy only)
    print(__doc__)
