"""Test-time compute methods as pure functions: pass@k, majority@k and recursive self-aggregation (RSA).

evaluate.py feeds them sampled traces and draws the paper's figures; nothing here samples or loads a model.

Choices where the paper is silent:
 1. majority@k with n > k samples averages over k-subsets of the n samples: all of them when there are at most
    `num_subsets`, else that many uniformly random ones (a single "first k" draw has the same mean, more variance).
 2. majority@k groups answers by math-verify equivalence (\\frac{1}{2}, 0.5 and 1/2 are one answer), greedily: an
    answer joins the first group whose first member it is equivalent to (math-verify's equivalence need not be
    transitive). A trace without a \\boxed{} answer casts no vote; a subset without any vote counts as wrong. Ties
    are broken uniformly at random with a seeded generator and counted. A group is graded by its first member.
 3. RSA sets: the paper "partition[s] the traces from the previous level into groups", yet keeps a population of
    8 with sets of 4, which a partition cannot do. We follow the RSA paper (Venkatraman et al., 2025): each of the
    P new members independently draws k distinct members of the previous population.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from reward import answers_equivalent
from rollout import aggregation_prompt


def digest(obj) -> str:
    """A stable hex digest of any JSON-able object (Python's hash() changes between processes)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def derive_seed(*parts) -> int:
    """A 63-bit seed determined by `parts`: each (problem, population, step) gets its own random stream."""
    return int(digest(parts)[:16], 16) & (2**63 - 1)


# ----------------------------------------------------------------------------------------------------------------------
# pass@k and majority@k


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k (paper figure "Pass@k evaluation"; Chen et al. 2021, eq. 1): 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials.
    """
    n, c = num_samples, num_correct
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= num_correct <= num_samples, got num_correct={c}, num_samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= num_samples, got k={k}, num_samples={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def cluster_answers(answers: list[str | None], equivalent=None) -> list[int | None]:
    """Group id per answer by math-verify equivalence (None stays None: no answer, no vote). See note 2."""
    equivalent = equivalent or answers_equivalent
    representatives: list[str] = []  # first member of each group
    group_of: dict[str, int] = {}  # exact strings seen before (saves math-verify calls)
    ids: list[int | None] = []
    for answer in answers:
        if answer is not None and answer not in group_of:
            match = (g for g, rep in enumerate(representatives) if equivalent(rep, answer))
            group_of[answer] = next(match, len(representatives))
            if group_of[answer] == len(representatives):
                representatives.append(answer)
        ids.append(None if answer is None else group_of[answer])
    return ids


def majority_vote(group_ids: list[int | None], rng: np.random.Generator) -> tuple[int | None, bool]:
    """(winning group, whether a tie was broken at random); (None, False) when nobody voted."""
    votes = Counter(g for g in group_ids if g is not None)
    if not votes:
        return None, False
    top = max(votes.values())
    leaders = sorted(g for g, v in votes.items() if v == top)
    return int(rng.choice(leaders)), len(leaders) > 1


def majority_at_k(answers, correct, ks, *, rng, equivalent=None, num_subsets=32) -> dict[int, dict]:
    """majority@k (self-consistency; paper figure "Comparison of inference methods scaling parallel traces").

    answers[i] is sample i's extracted answer (or None), correct[i] its reward. Returns, per k in ks, the accuracy
    of the majority answer averaged over k-subsets (note 1), the number of subsets voted on, and the ties.
    """
    n = len(answers)
    group_ids = cluster_answers(answers, equivalent)
    group_correct: dict[int, bool] = {}
    for g, ok in zip(group_ids, correct):
        if g is not None:
            group_correct.setdefault(g, bool(ok))  # a group is graded by its first member
    results = {}
    for k in ks:
        if not 1 <= k <= n:
            raise ValueError(f"need 1 <= k <= number of samples, got k={k}, samples={n}")
        if math.comb(n, k) <= num_subsets:
            subsets_S_k = list(itertools.combinations(range(n), k))
        else:
            subsets_S_k = [rng.choice(n, size=k, replace=False) for _ in range(num_subsets)]
        hits = ties = 0
        for subset in subsets_S_k:
            winner, tied = majority_vote([group_ids[i] for i in subset], rng)
            hits += winner is not None and group_correct[winner]
            ties += tied
        results[k] = {"accuracy": hits / len(subsets_S_k), "votes": len(subsets_S_k), "ties": ties}
    return results


# ----------------------------------------------------------------------------------------------------------------------
# Recursive self-aggregation


def draw_rsa_sets(population: int, set_size: int, rng: np.random.Generator) -> np.ndarray:
    """RSA's subsampling (note 3): row j lists the k distinct members of the previous population that new
    member j aggregates. Rows are drawn independently. Returns int array sets_P_k of shape (P, k)."""
    if not 1 <= set_size <= population:
        raise ValueError(f"need 1 <= set_size <= population, got set_size={set_size}, population={population}")
    return np.stack([rng.choice(population, size=set_size, replace=False) for _ in range(population)])


@dataclass
class RSAStep:
    step: int  # 1 = independent search traces
    sets_P_k: list[list[int]] | None  # row j: indices into step t-1's population that trace j aggregated
    traces: list  # the P members of this step's population (anything with a .text)


def recursive_self_aggregation(runs: list[tuple[str, int]], *, set_size: int, steps: int, seed: int,
                               search: Callable, aggregate: Callable) -> list[list[RSAStep]]:
    """RSA (paper figure "Pass@1 evaluation under RSA"; Venkatraman et al. 2025) for many runs in lockstep.

    runs[r] = (problem, population P). Step 1: search(r) gives run r's P independent search traces. Step t > 1:
    one call aggregate(t, prompts_R) for every run at once (prompts_R[r]: run r's P Aggregation Trace Prompts,
    each over k members of step t-1) returns P new traces per run. Set draws are seeded per (problem, P, k, t):
    a longer run repeats a shorter one's steps exactly. Returns each run's history, steps 1..T.
    """
    histories = [[RSAStep(1, None, search(r))] for r in range(len(runs))]
    for t in range(2, steps + 1):
        sets_R = [draw_rsa_sets(P, set_size, np.random.default_rng(derive_seed("rsa-sets", seed, problem, P,
                                                                              set_size, t)))
                  for problem, P in runs]
        prompts_R = [[aggregation_prompt(problem, [history[-1].traces[i].text for i in row]) for row in sets_P_k]
                     for (problem, _), sets_P_k, history in zip(runs, sets_R, histories)]
        for history, sets_P_k, traces in zip(histories, sets_R, aggregate(t, prompts_R)):
            history.append(RSAStep(t, sets_P_k.tolist(), traces))
    return histories


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "testtime.py", "evaluate.py uses")
