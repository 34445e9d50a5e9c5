"""SPIRAL data collection: Algorithm 1 of the paper as readable code, and the GRPO baseline.

For each problem x (Algorithm 1; line numbers count the comment lines, as the paper's listing does):
  line 2      sample N1 search traces            y_1..y_N1 ~ pi_theta(. | x)
  line 5      draw K sets of n distinct traces   G_1..G_K, uniformly without replacement (setsample.sample_sets)
  line 7      sample N2 aggregation traces       y^G_1..y^G_N2 ~ pi_theta(. | x, G)   (or pi_phi: two-model variant)
  lines 8-13  grade ONLY the aggregation traces and turn rewards into advantages (advantages.spiral_advantages):
  and 15      search traces get the marginal set advantage (set RL, lines 10-13),
              aggregation traces the within-set centred reward (standard RL, the advantage inside line 15).
Both levels then go through the appendix's length-aware rule (advantages.length_aware).

The result is a flat list of `Sample`s (prompt, completion, sampler log-probs, advantage, role) that train.py turns
into the importance-sampled REINFORCE loss; the gradient (lines 14-16 and 18) lives there.

Dynamic sampling (paper, Section 4): problems whose every advantage is zero give no gradient, so we keep drawing
problems until the batch holds `batch_problems` problems with at least one non-zero advantage (or `max_draws`
problems have been drawn), and log how many were drawn and skipped.

Search traces are graded too, but only for logging (`search_accuracy`): their reward never enters a gradient.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import numpy as np

from advantages import group_advantages, length_aware, spiral_advantages
from rollout import Completion, Problem, aggregation_prompt, generate, reward, search_prompt
from setsample import sample_sets


@dataclass
class Sample:
    """One training sample: a completion, the advantage it is trained with, and which level it came from."""

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]  # log pi_sampler(token) for the importance ratio
    advantage: float
    role: str  # "search" (set RL), "aggregation" (standard RL) or "grpo" (the baseline)
    reward: float | None = None  # r(x, y) for graded traces; None for search traces (never rewarded)


@dataclass
class Rollouts:
    """What one collection step hands to train.py: the samples to train on and metrics to log."""

    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)


def _to_sample(c: Completion, advantage: float, role: str, reward_value: float | None = None) -> Sample:
    return Sample(c.prompt_ids, c.completion_ids, c.logprobs, float(advantage), role, reward_value)


def _lengths(completions: list[Completion]) -> np.ndarray:
    return np.array([len(c.completion_ids) for c in completions])


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _dynamic_sampling(draw_problem, batch_problems: int, max_draws: int | None, collect_round) -> dict[str, float]:
    """Dynamic sampling (paper, Section 4): draw problems in rounds until `batch_problems` of them carry a non-zero
    advantage, or `max_draws` (default 4 x batch_problems) have been drawn. `collect_round(problems)` samples and
    grades one round and returns how many of its problems it kept."""
    max_draws = max_draws if max_draws is not None else 4 * batch_problems
    kept = drawn = 0
    while kept < batch_problems and drawn < max_draws:
        problems = [draw_problem() for _ in range(min(batch_problems - kept, max_draws - drawn))]
        drawn += len(problems)
        kept += collect_round(problems)
    return {"problems_drawn": drawn, "problems_kept": kept, "problems_skipped": drawn - kept,
            "zero_advantage_fraction": (drawn - kept) / drawn}


def _has_signal(*advantages: np.ndarray) -> bool:
    return any(np.any(a != 0) for a in advantages)


def collect_spiral(
    model,
    tokenizer,
    draw_problem: Callable[[], Problem],
    *,
    batch_problems: int,
    num_search: int = 8,
    set_size: int = 4,
    num_sets: int = 4,
    num_aggregations: int = 4,
    max_new_tokens: int = 4096,
    temperature: float = 1.0,
    target_length: int | None = None,
    rng: np.random.Generator,
    aggregation_adapter: Callable[[], ContextManager] | None = None,
    max_draws: int | None = None,
    micro_batch_size: int | None = None,
) -> Rollouts:
    """Algorithm 1, lines 1-13 and the advantage of line 15, for a dynamically sampled batch of problems.

    Per problem x: N1 = `num_search` search traces, K = `num_sets` sets of n = `set_size` traces, N2 =
    `num_aggregations` aggregation traces per set. Returns one Sample per trace of every kept problem:
    N1 search samples with advantage A#_marg(x, y_j) (eq. search_trace_set_rl_advantage) and K*N2 aggregation
    samples with A(x, y^G_l_i) = r - mean_i' r (eq. final_trace_std_rl_advantage), both after the length-aware
    rule (eq. length-aware-advantage) when `target_length` is set.

    `aggregation_adapter`, if given, is a context-manager factory under which aggregation traces are generated:
    the appendix's two-model variant, where pi_phi (a second adapter) writes the aggregation traces.
    """
    _check_counts(batch_problems=batch_problems, num_search=num_search, set_size=set_size, num_sets=num_sets,
                  num_aggregations=num_aggregations, max_new_tokens=max_new_tokens)
    N1, n, K, N2 = num_search, set_size, num_sets, num_aggregations
    aggregation_context = aggregation_adapter or contextlib.nullcontext
    sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, micro_batch_size=micro_batch_size)
    samples: list[Sample] = []
    log = {key: [] for key in ("search_reward", "aggregation_reward", "search_length", "aggregation_length",
                               "search_truncated", "aggregation_truncated")}
    seconds = {"search": 0.0, "aggregation": 0.0}

    def collect_round(problems: list[Problem]) -> int:
        # Line 2: y_1..y_N1 ~ pi_theta(. | x), for every problem in one batched call.
        start = time.perf_counter()
        search_P_N1 = generate(model, tokenizer, [search_prompt(p.problem) for p in problems],
                               samples_per_prompt=N1, **sampling)
        seconds["search"] += time.perf_counter() - start
        # Line 5: K sets of n distinct search traces, uniformly without replacement from all C(N1, n) sets.
        sets_P_K_n = [sample_sets(N1, n, K, rng=rng) for _ in problems]
        # Line 7: y^G_1..y^G_N2 ~ pi(. | x, G) for each set; the set's traces enter the prompt in the drawn order.
        prompts_PK = [aggregation_prompt(p.problem, [search_P_N1[i][j].text for j in sets_K_n])
                      for i, (p, sets) in enumerate(zip(problems, sets_P_K_n)) for sets_K_n in sets]
        start = time.perf_counter()
        with aggregation_context():
            aggregation_PK_N2 = generate(model, tokenizer, prompts_PK, samples_per_prompt=N2, **sampling)
        seconds["aggregation"] += time.perf_counter() - start

        kept = 0
        for i, problem in enumerate(problems):
            search_N1 = search_P_N1[i]
            aggregation_KN2 = [c for row in aggregation_PK_N2[i * K:(i + 1) * K] for c in row]  # set by set
            # Lines 7-8: r(x, y^G_l_i); only these rewards train anything.
            rewards_K_N2 = np.array([reward(c.text, problem.answer) for c in aggregation_KN2]).reshape(K, N2)
            # Lines 8-13 and line 15's advantage (eq. final_trace_std_rl_advantage) in one call.
            search_adv_N1, aggregation_adv_K_N2 = spiral_advantages(sets_P_K_n[i], rewards_K_N2, N1)
            if target_length is not None:  # appendix, eq. length-aware-advantage, on both levels
                search_adv_N1 = length_aware(search_adv_N1, _lengths(search_N1), target_length)
                aggregation_adv_K_N2 = length_aware(aggregation_adv_K_N2,
                                                    _lengths(aggregation_KN2).reshape(K, N2), target_length)

            # Logging only: search traces are graded so we can plot search vs aggregation accuracy.
            log["search_reward"] += [reward(c.text, problem.answer) for c in search_N1]
            log["aggregation_reward"] += rewards_K_N2.ravel().tolist()
            log["search_length"] += _lengths(search_N1).tolist()
            log["aggregation_length"] += _lengths(aggregation_KN2).tolist()
            log["search_truncated"] += [c.truncated for c in search_N1]
            log["aggregation_truncated"] += [c.truncated for c in aggregation_KN2]

            if not _has_signal(search_adv_N1, aggregation_adv_K_N2):
                continue  # dynamic sampling: no gradient from this problem
            kept += 1
            samples.extend(_to_sample(c, a, "search") for c, a in zip(search_N1, search_adv_N1))
            samples.extend(_to_sample(c, a, "aggregation", r) for c, a, r in
                           zip(aggregation_KN2, aggregation_adv_K_N2.ravel(), rewards_K_N2.ravel()))
        return kept

    metrics = _dynamic_sampling(draw_problem, batch_problems, max_draws, collect_round)
    tokens = sum(log["search_length"]) + sum(log["aggregation_length"])
    metrics.update({
        "search_accuracy": float(np.mean(log["search_reward"])),
        "aggregation_accuracy": float(np.mean(log["aggregation_reward"])),
        "search_length": float(np.mean(log["search_length"])),
        "aggregation_length": float(np.mean(log["aggregation_length"])),
        "search_truncation_rate": float(np.mean(log["search_truncated"])),
        "aggregation_truncation_rate": float(np.mean(log["aggregation_truncated"])),
        "time/search_s": seconds["search"],
        "time/aggregation_s": seconds["aggregation"],
        "tokens_generated": tokens,
        "tokens_per_problem": tokens / metrics["problems_drawn"],
        "token_budget_per_problem": (N1 + K * N2) * max_new_tokens,  # paper: (8 + 16) * 4096 = 98,304
    })
    return Rollouts(samples, metrics)


def collect_grpo(
    model,
    tokenizer,
    draw_problem: Callable[[], Problem],
    *,
    batch_problems: int,
    group_size: int = 12,
    max_new_tokens: int = 8192,
    temperature: float = 1.0,
    target_length: int | None = None,
    rng: np.random.Generator | None = None,
    max_draws: int | None = None,
    micro_batch_size: int | None = None,
) -> Rollouts:
    """The GRPO baseline: G = `group_size` samples per problem, A_i = r_i - mean_j r_j (Dr. GRPO: no std division).

    The paper's equal-budget design: 12 samples x 8192 tokens = 98,304 tokens per problem, the same as SPIRAL's
    8 x 4096 + 16 x 4096. The length-aware rule applies here too when `target_length` is set. `rng` is unused
    (GRPO draws no sets); it is accepted so both collectors share one call signature.
    """
    _check_counts(batch_problems=batch_problems, group_size=group_size, max_new_tokens=max_new_tokens)
    samples: list[Sample] = []
    log = {"reward": [], "length": [], "truncated": []}

    def collect_round(problems: list[Problem]) -> int:
        groups_P_G = generate(model, tokenizer, [search_prompt(p.problem) for p in problems],
                              samples_per_prompt=group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                              micro_batch_size=micro_batch_size)
        kept = 0
        for problem, group in zip(problems, groups_P_G):
            rewards_G = np.array([reward(c.text, problem.answer) for c in group])
            adv_G = group_advantages(rewards_G)
            if target_length is not None:
                adv_G = length_aware(adv_G, _lengths(group), target_length)
            log["reward"] += rewards_G.tolist()
            log["length"] += _lengths(group).tolist()
            log["truncated"] += [c.truncated for c in group]
            if not _has_signal(adv_G):
                continue
            kept += 1
            samples.extend(_to_sample(c, a, "grpo", r) for c, a, r in zip(group, adv_G, rewards_G))
        return kept

    metrics = _dynamic_sampling(draw_problem, batch_problems, max_draws, collect_round)
    tokens = sum(log["length"])
    metrics.update({
        "accuracy": float(np.mean(log["reward"])),
        "length": float(np.mean(log["length"])),
        "truncation_rate": float(np.mean(log["truncated"])),
        "tokens_generated": tokens,
        "tokens_per_problem": tokens / metrics["problems_drawn"],
        "token_budget_per_problem": group_size * max_new_tokens,  # paper: 12 * 8192 = 98,304
    })
    return Rollouts(samples, metrics)
