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
    max_draws = max_draws if max_draws is not None else 4 * batch_problems
    N1, n, K, N2 = num_search, set_size, num_sets, num_aggregations
    aggregation_context = aggregation_adapter or contextlib.nullcontext

    samples: list[Sample] = []
    kept = drawn = 0
    search_rewards, aggregation_rewards, search_lengths, aggregation_lengths = [], [], [], []
    search_truncated, aggregation_truncated = [], []
    while kept < batch_problems and drawn < max_draws:
        problems = [draw_problem() for _ in range(min(batch_problems - kept, max_draws - drawn))]
        drawn += len(problems)

        # Line 2: y_1..y_N1 ~ pi_theta(. | x), for every problem in one batched call.
        search_P_N1 = generate(model, tokenizer, [search_prompt(p.problem) for p in problems],
                               samples_per_prompt=N1, max_new_tokens=max_new_tokens, temperature=temperature,
                               micro_batch_size=micro_batch_size)
        # Line 5: K sets of n distinct search traces, uniformly without replacement from all C(N1, n) sets.
        sets_P_K_n = [sample_sets(N1, n, K, rng=rng) for _ in problems]
        # Line 7: y^G_1..y^G_N2 ~ pi(. | x, G) for each set; the set's traces enter the prompt in the drawn order.
        prompts_PK = [aggregation_prompt(p.problem, [search_P_N1[i][j].text for j in sets_K_n])
                      for i, (p, sets) in enumerate(zip(problems, sets_P_K_n)) for sets_K_n in sets]
        with aggregation_context():
            aggregation_PK_N2 = generate(model, tokenizer, prompts_PK, samples_per_prompt=N2,
                                         max_new_tokens=max_new_tokens, temperature=temperature,
                                         micro_batch_size=micro_batch_size)

        for i, problem in enumerate(problems):
            search_N1 = search_P_N1[i]
            aggregation_K_N2 = aggregation_PK_N2[i * K:(i + 1) * K]
            # Lines 7-8: r(x, y^G_l_i); only these rewards train anything.
            rewards_K_N2 = np.array([[reward(c.text, problem.answer) for c in row] for row in aggregation_K_N2])
            # Lines 8-13 and line 15's advantage (eq. final_trace_std_rl_advantage) in one call.
            search_adv_N1, aggregation_adv_K_N2 = spiral_advantages(sets_P_K_n[i], rewards_K_N2, N1)
            flat_aggregation = [c for row in aggregation_K_N2 for c in row]
            if target_length is not None:  # appendix, eq. length-aware-advantage, on both levels
                search_adv_N1 = length_aware(search_adv_N1, _lengths(search_N1), target_length)
                aggregation_adv_K_N2 = length_aware(aggregation_adv_K_N2,
                                                    _lengths(flat_aggregation).reshape(K, N2), target_length)

            # Logging only: search traces are graded so we can plot search vs aggregation accuracy.
            search_rewards += [reward(c.text, problem.answer) for c in search_N1]
            aggregation_rewards += rewards_K_N2.ravel().tolist()
            search_lengths += _lengths(search_N1).tolist()
            aggregation_lengths += _lengths(flat_aggregation).tolist()
            search_truncated += [c.truncated for c in search_N1]
            aggregation_truncated += [c.truncated for c in flat_aggregation]

            if not (np.any(search_adv_N1 != 0) or np.any(aggregation_adv_K_N2 != 0)):
                continue  # dynamic sampling: no gradient from this problem
            kept += 1
            samples += [_to_sample(c, a, "search") for c, a in zip(search_N1, search_adv_N1)]
            samples += [_to_sample(c, a, "aggregation", r) for c, a, r in
                        zip(flat_aggregation, aggregation_adv_K_N2.ravel(), rewards_K_N2.ravel())]

    tokens = sum(search_lengths) + sum(aggregation_lengths)
    metrics = {
        "search_accuracy": float(np.mean(search_rewards)),
        "aggregation_accuracy": float(np.mean(aggregation_rewards)),
        "search_length": float(np.mean(search_lengths)),
        "aggregation_length": float(np.mean(aggregation_lengths)),
        "search_truncation_rate": float(np.mean(search_truncated)),
        "aggregation_truncation_rate": float(np.mean(aggregation_truncated)),
        "problems_drawn": drawn,
        "problems_kept": kept,
        "problems_skipped": drawn - kept,
        "zero_advantage_fraction": (drawn - kept) / drawn,
        "tokens_generated": tokens,
        "tokens_per_problem": tokens / drawn,
        "token_budget_per_problem": (N1 + K * N2) * max_new_tokens,  # paper: (8 + 16) * 4096 = 98,304
    }
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
    max_draws = max_draws if max_draws is not None else 4 * batch_problems
    samples: list[Sample] = []
    kept = drawn = 0
    all_rewards, all_lengths, all_truncated = [], [], []
    while kept < batch_problems and drawn < max_draws:
        problems = [draw_problem() for _ in range(min(batch_problems - kept, max_draws - drawn))]
        drawn += len(problems)
        groups_P_G = generate(model, tokenizer, [search_prompt(p.problem) for p in problems],
                              samples_per_prompt=group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                              micro_batch_size=micro_batch_size)
        for problem, group in zip(problems, groups_P_G):
            rewards_G = np.array([reward(c.text, problem.answer) for c in group])
            adv_G = group_advantages(rewards_G)
            if target_length is not None:
                adv_G = length_aware(adv_G, _lengths(group), target_length)
            all_rewards += rewards_G.tolist()
            all_lengths += _lengths(group).tolist()
            all_truncated += [c.truncated for c in group]
            if not np.any(adv_G != 0):
                continue
            kept += 1
            samples += [_to_sample(c, a, "grpo", r) for c, a, r in zip(group, adv_G, rewards_G)]

    tokens = sum(all_lengths)
    metrics = {
        "accuracy": float(np.mean(all_rewards)),
        "length": float(np.mean(all_lengths)),
        "truncation_rate": float(np.mean(all_truncated)),
        "problems_drawn": drawn,
        "problems_kept": kept,
        "problems_skipped": drawn - kept,
        "zero_advantage_fraction": (drawn - kept) / drawn,
        "tokens_generated": tokens,
        "tokens_per_problem": tokens / drawn,
        "token_budget_per_problem": group_size * max_new_tokens,  # paper: 12 * 8192 = 98,304
    }
    return Rollouts(samples, metrics)
