"""Test-time compute methods as pure functions: pass@k, majority@k, recursive self-aggregation (RSA), and the
set-level measures that tell a set's content (search) from what the aggregator makes of it (aggregation).

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
 4. Set-level measures (ours; the paper's "Next Steps" asks which half of the pipeline made a gain): a set's
    answers are the answer groups of note 2, formed over the whole population the set was drawn from; a member
    without an answer adds no answer. A set's plurality is its most frequent answer(s); it is right when one of its
    tied leaders holds a correct member.
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
from prompts import aggregation_prompt


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
            k_subsets = list(itertools.combinations(range(n), k))
        else:
            k_subsets = [rng.choice(n, size=k, replace=False) for _ in range(num_subsets)]
        hits = ties = 0
        for subset in k_subsets:
            winner, tied = majority_vote([group_ids[i] for i in subset], rng)
            hits += winner is not None and group_correct[winner]
            ties += tied
        results[k] = {"accuracy": hits / len(k_subsets), "votes": len(k_subsets), "ties": ties}
    return results


# ----------------------------------------------------------------------------------------------------------------------
# Recursive self-aggregation


def draw_rsa_sets(population: int, set_size: int, rng: np.random.Generator) -> np.ndarray:
    """RSA's subsampling (note 3): row j lists the k distinct members of the previous population that new
    member j aggregates. Rows are drawn independently. Returns int array sets_pop_k of shape (P, k)."""
    if not 1 <= set_size <= population:
        raise ValueError(f"need 1 <= set_size <= population, got set_size={set_size}, population={population}")
    return np.stack([rng.choice(population, size=set_size, replace=False) for _ in range(population)])


@dataclass
class RSAStep:
    step: int  # 1 = independent search traces
    sets_pop_k: list[list[int]] | None  # row j: indices into step t-1's population that trace j aggregated
    traces: list  # the P members of this step's population (anything with a .text)


def rsa_by_definition(problem: str, *, population: int, set_size: int, steps: int, seed: int,
                      sample_search: Callable, sample_aggregation: Callable) -> list[RSAStep]:
    """RSA for one problem, as the paper describes it: a population of P independent search traces; then at each
    step t = 2..T every one of P new members aggregates k members of step t-1's population (note 3), from the
    Aggregation Trace Prompt holding the problem and those k traces. sample_search() draws one search trace,
    sample_aggregation(prompt) one aggregation trace. The reference that recursive_self_aggregation (every problem
    and population in lockstep, one batched call per step) is tested equal to."""
    members_pop = [sample_search() for _ in range(population)]  # step 1: y_1..y_P ~ pi(. | x)
    history = [RSAStep(1, None, members_pop)]
    for t in range(2, steps + 1):
        rng = np.random.default_rng(derive_seed("rsa-sets", seed, problem, population, set_size, t))
        sets_pop_k = draw_rsa_sets(population, set_size, rng)  # member j aggregates step t-1's sets_pop_k[j]
        members_pop = [sample_aggregation(aggregation_prompt(problem, [members_pop[i].text for i in G_j]))
                       for G_j in sets_pop_k]
        history.append(RSAStep(t, sets_pop_k.tolist(), members_pop))
    return history


def recursive_self_aggregation(runs: list[tuple[str, int]], *, set_size: int, steps: int, seed: int,
                               search: Callable, aggregate: Callable) -> list[list[RSAStep]]:
    """RSA (paper figure "Pass@1 evaluation under RSA"; Venkatraman et al. 2025) for many runs in lockstep: what
    rsa_by_definition does for one problem, with each step of every run in one aggregate call.

    runs[r] = (problem, population P). Step 1: search(r) gives run r's P independent search traces. Step t > 1:
    one call aggregate(t, prompts_run) for every run at once (prompts_run[r]: run r's P Aggregation Trace Prompts,
    each over k members of step t-1) returns P new traces per run. Set draws are seeded per (problem, P, k, t):
    a longer run repeats a shorter one's steps exactly. Returns each run's history, steps 1..T.
    """
    histories = [[RSAStep(1, None, search(r))] for r in range(len(runs))]
    for t in range(2, steps + 1):
        sets_run = [draw_rsa_sets(P, set_size, np.random.default_rng(derive_seed("rsa-sets", seed, problem, P,
                                                                                set_size, t)))
                    for problem, P in runs]  # run r's sets_pop_k
        prompts_run = [[aggregation_prompt(problem, [history[-1].traces[i].text for i in row]) for row in sets_pop_k]
                       for (problem, _), sets_pop_k, history in zip(runs, sets_run, histories)]
        for history, sets_pop_k, traces in zip(histories, sets_run, aggregate(t, prompts_run)):
            history.append(RSAStep(t, sets_pop_k.tolist(), traces))
    return histories


# ----------------------------------------------------------------------------------------------------------------------
# Set-level measures (note 4)


def expected_distinct_answers(group_ids: list[int | None], k: int) -> float:
    """Distinct answers in a k-subset of the n samples, averaged over all C(n, k) subsets (the subsets pass@k
    averages over): E[#groups in S] = sum_g P(g meets S) = sum_g [1 - C(n - m_g, k) / C(n, k)] = sum_g pass@k(n, m_g, k),
    with m_g the samples in answer group g. Samples without an answer (None) add nothing."""
    sizes = Counter(g for g in group_ids if g is not None)
    return float(sum(pass_at_k(len(group_ids), m, k) for m in sizes.values()))


@dataclass
class SetCounts:
    """What sets of n candidates held, and what the aggregator made of them (index c: correct candidates in a set).

    sets_by_c[c] sets held exactly c correct candidates; hits_by_c[c] of them were aggregated into a correct trace.
    coverage = 1 - sets_by_c[0] / sets; c = 0 is recovery, c = n no regression. against_plurality counts the sets
    holding a correct candidate whose plurality (every tied leader) is wrong: a right aggregation there selected
    against the majority; against_plurality_hits of them were aggregated into a correct trace.
    """

    sets_by_c: list[int]  # (n + 1,)
    hits_by_c: list[int]  # (n + 1,)
    distinct: int  # distinct answers, summed over the sets
    against_plurality: int
    against_plurality_hits: int

    def __add__(self, other: SetCounts) -> SetCounts:
        if len(self.sets_by_c) != len(other.sets_by_c):
            raise ValueError(f"sets of {len(self.sets_by_c) - 1} and of {len(other.sets_by_c) - 1} candidates")
        return SetCounts(*([x + y for x, y in zip(a, b)] if isinstance(a, list) else a + b
                           for a, b in zip(vars(self).values(), vars(other).values())))


def count_sets(member_correct_pop: list[bool], member_group_pop: list[int | None], sets_K_n,
               output_correct_K) -> SetCounts:
    """SetCounts of K sets of n candidates over one population of P graded ones: set l holds the members
    sets_K_n[l] and was aggregated into a trace of reward output_correct_K[l] (RSA step t: the population of step
    t-1, the sets and the traces of step t). Candidate groups are note 2's (-1 or None: no answer)."""
    sets_K_n = np.asarray(sets_K_n, dtype=int).reshape(len(output_correct_K), -1)  # (K, n)
    n = sets_K_n.shape[1]
    correct_K_n = np.asarray(member_correct_pop, dtype=bool)[sets_K_n]  # (K, n)
    groups_pop = np.array([-1 if g is None else g for g in member_group_pop], dtype=int)  # (P,)
    hit_K = np.asarray(output_correct_K, dtype=bool)  # (K,)
    c_K = correct_K_n.sum(1)  # (K,)
    # votes_K_ans[l, a]: members of set l in answer group a; right_K_ans: whether one of them is correct
    member_ans_K_n = groups_pop[sets_K_n][None] == np.arange(groups_pop.max() + 1)[:, None, None]  # (ans, K, n)
    votes_K_ans = member_ans_K_n.sum(2).T  # (K, ans)
    right_K_ans = (member_ans_K_n & correct_K_n[None]).any(2).T  # (K, ans)
    leader_K_ans = (votes_K_ans == votes_K_ans.max(1, initial=0)[:, None]) & (votes_K_ans > 0)  # (K, ans)
    against_K = (c_K > 0) & ~(leader_K_ans & right_K_ans).any(1)  # (K,)
    return SetCounts(sets_by_c=np.bincount(c_K, minlength=n + 1).tolist(),
                     hits_by_c=np.bincount(c_K[hit_K], minlength=n + 1).tolist(),
                     distinct=int((votes_K_ans > 0).sum()), against_plurality=int(against_K.sum()),
                     against_plurality_hits=int((against_K & hit_K).sum()))


def set_measures(counts: SetCounts) -> dict:
    """Rates of SetCounts (None where no set qualified): coverage (sets with a correct candidate / sets), distinct
    answers per set, the aggregator's accuracy per c and for recovery (c = 0), a correct minority (0 < 2c < n),
    against the plurality, and no regression (c = n)."""
    sets_by_c, hits_by_c = np.array(counts.sets_by_c), np.array(counts.hits_by_c)  # (n + 1,): c = 0..n
    n, total = len(sets_by_c) - 1, int(sets_by_c.sum())

    def rate(hits, sets):
        return float(hits / sets) if sets else None

    minority = slice(1, (n + 1) // 2)  # 0 < c < n / 2
    return {"sets": total, "coverage": rate(total - sets_by_c[0], total),
            "distinct_answers": rate(counts.distinct, total),
            "sets_by_correct": counts.sets_by_c, "hits_by_correct": counts.hits_by_c,
            "accuracy_by_correct": [rate(h, s) for h, s in zip(hits_by_c, sets_by_c)],
            "recovery": rate(hits_by_c[0], sets_by_c[0]),
            "minority": rate(hits_by_c[minority].sum(), sets_by_c[minority].sum()),
            "against_plurality": rate(counts.against_plurality_hits, counts.against_plurality),
            "against_plurality_sets": counts.against_plurality, "no_regression": rate(hits_by_c[n], sets_by_c[n])}


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "testtime.py", "evaluate.py uses")
