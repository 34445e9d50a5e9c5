"""SPIRAL's data collection, Algorithm 1 of the paper, and the GRPO baseline.

Algorithm 1 as the paper prints it. Its numbering counts the comment lines and ENDFORs (LaTeX's algorithmic
package does); every "line N" in this repository refers to this listing:

     1  for each input x in B
     2      sample search traces y_1..y_N1 ~ pi_theta(. | x)
     3      // consider all C(N1, n) sets of size n we can construct from these N1 generations;
     4      // then randomly sample K sets from them without replacement
     5      sample sets G_1..G_K of n unique generations from {y_1:N1} without replacement
     6      for l = 1..K
     7          sample aggregation traces y^{G_l}_1..y^{G_l}_N2 ~ pi_theta(. | x, G_l)
     8          score set G_l: f_hat(x, G_l) = (1/N2) sum_i r(x, y^{G_l}_i)
     9      end for
    10      set baseline b = (1/K) sum_l f_hat(x, G_l)
    11      set advantage A#(x, G_l) = f_hat(x, G_l) - b
    12      // let G(y_j) be all sampled sets in G_1..G_K that contain y_j
    13      marginal set advantage A#_marg(x, y_j) = (1/|G(y_j)|) sum_{G in G(y_j)} A#(x, G)
    14      g_set(x) = sum_j grad log pi_theta(y_j | x) A#_marg(x, y_j)
    15      g_std(x) = sum_l sum_i grad log pi_theta(y^{G_l}_i | x, G_l) (r(x, y^{G_l}_i) - mean_k r(x, y^{G_l}_k))
    16      g(x) = g_set(x) + g_std(x)
    17  end for
    18  g = (1/|B|) sum_x g(x)
    19  return g

This file runs lines 1-13 and the advantage inside line 15, and returns one `Sample` per trace with its
advantage; train.py forms the gradient (lines 14-18). Dynamic sampling (Section 4): problems whose advantages are
all zero give no gradient, so problems are drawn until `batch_problems` of them carry signal (or `max_draws`).
Search traces are graded too, for logging only: in SPIRAL their reward never enters a gradient. The one exception is
the ablation `search_advantage="own"` (the paper's "Next Steps" baseline), which replaces line 13 alone.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import numpy as np

from advantages import (group_advantages, length_aware, marginal_set_advantages, oracle_set_scores, set_advantages,
                        spiral_advantages)
from problemset import Problem
from prompts import aggregation_prompt, search_prompt
from reward import grader_stats, reward
from rollout import Completion, generate
from setsample import all_sets, count_possible_sets, gradient_scale, sample_sets


@dataclass
class Sample:
    """One training sample: a completion, the advantage it is trained with, and which level it came from."""

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]  # log pi_sampler(token), the importance ratio's denominator
    advantage: float
    role: str  # "search" (set RL, g_set), "aggregation" (standard RL, g_std) or "grpo" (the baseline)
    reward: float | None = None  # r(x, y) of rewarded traces; None for SPIRAL's search traces (set RL)


@dataclass
class Rollouts:
    """What one collection step hands to train.py: the samples to train on and metrics to log."""

    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)


def _sample(c: Completion, advantage: float, role: str, reward_value: float | None = None) -> Sample:
    return Sample(c.prompt_ids, c.completion_ids, c.logprobs, float(advantage), role, reward_value)


def _lengths(completions: list[Completion]) -> np.ndarray:
    return np.array([len(c.completion_ids) for c in completions])


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _math_reward(x: Problem, text: str) -> float:
    """The default task's r(x, y): the math grader against x's gold answer (reward.reward, looked up when called)."""
    return reward(text, x.answer)


def _grader_metrics(before: dict[str, int]) -> dict[str, int]:
    """Grader incidents during this collection, e.g. grader/ungraded: rewards scored 0 without a verdict."""
    return {f"grader/{key}": count - before[key] for key, count in grader_stats().items()}


def _batch_metrics(drawn: int, kept: int, batch_problems: int) -> dict[str, float]:
    """Dynamic sampling's bookkeeping; draw_cap_hit = 1 when max_draws ended the step with fewer than |B| kept."""
    return {"problems_drawn": drawn, "problems_kept": kept, "problems_skipped": drawn - kept,
            "zero_advantage_fraction": (drawn - kept) / drawn, "draw_cap_hit": int(kept < batch_problems)}


def collect_spiral(
    model,
    tokenizer,
    draw_problem: Callable[[], Problem],
    *,
    batch_problems: int,
    num_search: int = 8,
    set_size: int = 4,
    num_sets: int | str = 4,
    num_aggregations: int = 4,
    max_new_tokens: int = 4096,
    temperature: float = 1.0,
    target_length: int | None = None,
    rng: np.random.Generator,
    aggregation_adapter: Callable[[], ContextManager] | None = None,
    max_draws: int | None = None,
    micro_batch_size: int | None = None,
    tokens_per_micro_batch: int | None = None,
    search_advantage_scale: float = 1.0,
    reward_fn: Callable[[Problem, str], float] | None = None,
    search_advantage: str = "set",
    aggregator: str = "model",
) -> Rollouts:
    """Algorithm 1, lines 1-13 and line 15's advantage, for a dynamically sampled batch B.

    N1 = num_search, n = set_size, K = num_sets (or "all": every one of the C(N1, n) sets), N2 = num_aggregations.
    Per kept problem: N1 search Samples with A#_marg and K N2 aggregation Samples with the within-set advantage,
    both after the length-aware rule when `target_length` is set. `aggregation_adapter`: a context under which
    pi_phi writes the aggregation traces (the appendix's two-model variant). `search_advantage_scale` multiplies
    A#_marg: 1/M of Proposition 3.1 (setsample.gradient_scale) for an unbiased set-RL gradient (train.py
    --unbiased-set-rl), 1 in the paper. `reward_fn`: the task's r(x, y) (task.py; default: the math grader).

    Two switches isolate line 13, the one line where SPIRAL differs from "GRPO plus a trained aggregator":
      search_advantage "set"   (SPIRAL)  A#_marg(x, y_j) = (1/|G(y_j)|) sum_{G in G(y_j)} A#(x, G)
                       "own"   (ablation, the paper's "Next Steps")  A(x, y_j) = r(x, y_j) - (1/N1) sum_k r(x, y_k)
                       "none"  (the floor)  A = 0: search traces learn only through weights shared with aggregation
      aggregator       "model" (SPIRAL)  lines 6-8 as the paper: f_hat(x, G) = mean reward of N2 aggregation traces
                       "oracle" a perfect selector, f_hat(x, G) = max_{y in G} r(x, y): no aggregation trace is
                                sampled or trained, so line 13 alone trains the policy; with num_sets="all" it is
                                PKPO's pass@n objective (advantages.pass_at_n_advantages)
    Everything else is the same across the switches: the sets, dynamic sampling (a problem is kept when any
    advantage is non-zero) and train.py's loss normaliser C.
    """
    _check_counts(batch_problems=batch_problems, num_search=num_search, set_size=set_size,
                  num_aggregations=num_aggregations, max_new_tokens=max_new_tokens)
    if num_sets != "all":
        _check_counts(num_sets=num_sets)
    if search_advantage not in ("set", "own", "none"):
        raise ValueError(f"search_advantage must be 'set', 'own' or 'none', got {search_advantage!r}")
    if aggregator not in ("model", "oracle"):
        raise ValueError(f"aggregator must be 'model' or 'oracle', got {aggregator!r}")
    if aggregator == "oracle" and search_advantage != "set":
        raise ValueError("aggregator 'oracle' trains the search traces by line 13 alone: search_advantage must be "
                         f"'set', got {search_advantage!r}")
    if search_advantage != "set" and search_advantage_scale != 1.0:
        raise ValueError("search_advantage_scale (1/M of Proposition 3.1) concerns set RL only")
    N1, n, N2 = num_search, set_size, num_aggregations
    K = count_possible_sets(N1, n) if num_sets == "all" else num_sets
    model_aggregator = aggregator == "model"
    grade = reward_fn or _math_reward
    max_draws = 4 * batch_problems if max_draws is None else max_draws
    grader_before = grader_stats()
    sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, micro_batch_size=micro_batch_size,
                    tokens_per_micro_batch=tokens_per_micro_batch)
    samples: list[Sample] = []
    log = _TraceLog(("search", "aggregation") if model_aggregator else ("search",))  # metrics only
    drawn = kept = 0
    while kept < batch_problems and drawn < max_draws:  # dynamic sampling: draw until |B| problems carry signal
        problems = [draw_problem() for _ in range(min(batch_problems - kept, max_draws - drawn))]
        drawn += len(problems)
        with log.timed("search"):  # Line 2: y_1..y_N1 ~ pi_theta(. | x), every problem of the round in one call.
            search_P_N1 = generate(model, tokenizer, [search_prompt(x.problem) for x in problems],
                                   samples_per_prompt=N1, **sampling)
        # Line 5: K sets of n distinct search traces, uniformly without replacement among all C(N1, n) (or all).
        sets_P_K_n = [all_sets(N1, n) if num_sets == "all" else sample_sets(N1, n, K, rng=rng) for _ in problems]
        if model_aggregator:  # Lines 6-7: the Aggregation Trace Prompt holding x and G_l's traces in index order.
            aggregation_prompts = [aggregation_prompt(x.problem, [search_N1[j].text for j in G_l])
                                   for x, search_N1, sets_K_n in zip(problems, search_P_N1, sets_P_K_n)
                                   for G_l in sets_K_n]
            with log.timed("aggregation"), (aggregation_adapter or contextlib.nullcontext)():
                # Line 7: y^{G_l}_1..y^{G_l}_N2 ~ pi_theta(. | x, G_l) (pi_phi in the two-model variant).
                aggregation_PK_N2 = generate(model, tokenizer, aggregation_prompts, samples_per_prompt=N2, **sampling)

        for i, x in enumerate(problems):
            search_N1, sets_K_n = search_P_N1[i], sets_P_K_n[i]
            search_rewards_N1 = np.array([grade(x, c.text) for c in search_N1])  # SPIRAL: logging only
            if model_aggregator:
                aggregation_KN2 = [c for row in aggregation_PK_N2[i * K:(i + 1) * K] for c in row]  # set by set
                # Line 8's rewards r(x, y^{G_l}_i): the only rewards that train anything.
                rewards_K_N2 = np.array([grade(x, c.text) for c in aggregation_KN2]).reshape(K, N2)
                # Lines 8-13 (set scores, baseline, set and marginal advantages) and line 15's advantage.
                set_adv_N1, aggregation_adv_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=N1)
                scores_K = rewards_K_N2.mean(axis=1)  # f_hat(x, G_l), for the metrics
            else:  # the perfect selector's line 8; lines 10-13 as SPIRAL's; nothing to sample or train at line 7
                aggregation_KN2, rewards_K_N2, aggregation_adv_K_N2 = [], np.zeros((K, 0)), np.zeros((K, 0))
                scores_K = oracle_set_scores(sets_K_n, search_rewards_N1)  # max_{y in G_l} r(x, y)
                set_adv_N1 = marginal_set_advantages(sets_K_n, set_advantages(scores_K), N1)
            own_adv_N1 = group_advantages(search_rewards_N1)
            search_adv_N1 = {"set": set_adv_N1 * search_advantage_scale,  # 1/M: E[g_set] = the set-RL gradient
                             "own": own_adv_N1,  # the ablation's line 13: each trace on its own reward
                             "none": np.zeros(N1)}[search_advantage]
            if target_length is not None:  # appendix, eq. length-aware-advantage, on both levels
                search_adv_N1 = length_aware(search_adv_N1, _lengths(search_N1), target_length)
                if model_aggregator:
                    aggregation_adv_K_N2 = length_aware(aggregation_adv_K_N2,
                                                        _lengths(aggregation_KN2).reshape(K, N2), target_length)
            log.add("search", search_rewards_N1, search_N1)
            if model_aggregator:
                log.add("aggregation", rewards_K_N2.ravel(), aggregation_KN2)
            log.add_sets(scores_K, set_adv_N1, own_adv_N1, search_rewards_N1)
            if not (np.any(search_adv_N1 != 0) or np.any(aggregation_adv_K_N2 != 0)):
                continue  # dynamic sampling: this problem gives no gradient
            kept += 1
            search_reward_N1 = [None] * N1 if model_aggregator and search_advantage != "own" else search_rewards_N1
            samples += [_sample(c, a, "search", r) for c, a, r in zip(search_N1, search_adv_N1, search_reward_N1)]
            samples += [_sample(c, a, "aggregation", r) for c, a, r in
                        zip(aggregation_KN2, aggregation_adv_K_N2.ravel(), rewards_K_N2.ravel())]

    budget = (N1 + K * N2 if model_aggregator else N1) * max_new_tokens  # paper: (8 + 4 x 4) x 4096 = 98,304
    return Rollouts(samples, _spiral_metrics(log, drawn, kept, batch_problems, budget, gradient_scale(N1, n, K),
                                             search_advantage_scale, grader_before))


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
    tokens_per_micro_batch: int | None = None,
    reward_fn: Callable[[Problem, str], float] | None = None,
) -> Rollouts:
    """The GRPO baseline: G = group_size samples per problem, A_i = r_i - mean_j r_j (Dr. GRPO: no std division).

    Equal budget: 12 x 8192 = 98,304 tokens per problem, as SPIRAL's (8 + 16) x 4096. `rng` is unused (no sets);
    it keeps the two collectors' signatures alike. `reward_fn`: the task's r(x, y), as for collect_spiral.
    """
    _check_counts(batch_problems=batch_problems, group_size=group_size, max_new_tokens=max_new_tokens)
    max_draws = 4 * batch_problems if max_draws is None else max_draws
    grade = reward_fn or _math_reward
    grader_before = grader_stats()
    samples: list[Sample] = []
    log = _TraceLog(("grpo",))  # its entropy is comparable with SPIRAL's search traces
    drawn = kept = 0
    while kept < batch_problems and drawn < max_draws:  # dynamic sampling, as for SPIRAL
        problems = [draw_problem() for _ in range(min(batch_problems - kept, max_draws - drawn))]
        drawn += len(problems)
        groups_P_G = generate(model, tokenizer, [search_prompt(x.problem) for x in problems],
                              samples_per_prompt=group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                              micro_batch_size=micro_batch_size, tokens_per_micro_batch=tokens_per_micro_batch)
        for x, group in zip(problems, groups_P_G):
            rewards_G = np.array([grade(x, c.text) for c in group])
            adv_G = group_advantages(rewards_G)
            if target_length is not None:
                adv_G = length_aware(adv_G, _lengths(group), target_length)
            log.add("grpo", rewards_G, group)
            if not np.any(adv_G != 0):
                continue
            kept += 1
            samples += [_sample(c, a, "grpo", r) for c, a, r in zip(group, adv_G, rewards_G)]

    tokens = sum(log.lengths["grpo"])
    metrics = _batch_metrics(drawn, kept, batch_problems) | log.means({"grpo": ""}) | {
        "tokens_generated": tokens,
        "tokens_per_problem": tokens / drawn,
        "token_budget_per_problem": group_size * max_new_tokens,  # paper: 12 x 8192 = 98,304
    } | log.entropy_metrics() | _grader_metrics(grader_before)
    return Rollouts(samples, metrics)


# ----------------------------------------------------------------------------------------------------------------------
# Logging: what a step's metrics average over. Nothing below enters a gradient.


class _TraceLog:
    """What a step's metrics average over, per role ("search", "aggregation"; "grpo"): the reward, length,
    truncation and sampler entropy of every trace of every drawn problem, kept or not, and generation seconds.
    Logging only: nothing here enters a gradient."""

    def __init__(self, roles: tuple[str, ...]):
        self.roles = roles
        self.rewards = {role: [] for role in roles}
        self.lengths = {role: [] for role in roles}
        self.truncated = {role: [] for role in roles}
        self.entropy = {role: [0.0, 0] for role in roles}  # [sum of per-token sampler entropies, tokens]
        self.seconds = {role: 0.0 for role in roles}
        self.sets = []  # per drawn problem: (scores_K, set_adv_N1, own_adv_N1, rewards_N1), SPIRAL only

    @contextlib.contextmanager
    def timed(self, role: str):
        start = time.perf_counter()
        yield
        self.seconds[role] += time.perf_counter() - start

    def add(self, role: str, rewards, completions: list[Completion]) -> None:
        self.rewards[role] += [float(r) for r in rewards]
        self.lengths[role] += _lengths(completions).tolist()
        self.truncated[role] += [c.truncated for c in completions]
        for c in completions:
            if c.entropies is not None:
                self.entropy[role][0] += float(sum(c.entropies))
                self.entropy[role][1] += len(c.entropies)

    def means(self, prefix: dict[str, str]) -> dict[str, float]:
        """{prefix}accuracy, {prefix}length, {prefix}truncation_rate for each role (prefix: role -> "" or "search_")."""
        return {f"{prefix[role]}{name}": float(np.mean(values[role]))
                for name, values in (("accuracy", self.rewards), ("length", self.lengths),
                                     ("truncation_rate", self.truncated)) for role in self.roles}

    def add_sets(self, scores_K, set_adv_N1, own_adv_N1, rewards_N1) -> None:
        """One drawn problem's line-13 instruments: its K set scores f_hat(x, G_l), each search trace's marginal set
        advantage (line 13) and the own-reward advantage it would get instead, and the traces' rewards."""
        self.sets.append((np.asarray(scores_K, float), set_adv_N1, own_adv_N1, np.asarray(rewards_N1, float)))

    def line13_metrics(self) -> dict[str, float]:
        """Can line 13 act? Over the step's drawn problems:
            line13/set_scores_differ   fraction whose K set scores are not all equal (else A#(x, G) = 0 for all G)
            line13/set_score_sd        mean over problems of the sd of f_hat over the K sets
            line13/corr_set_own        correlation of A#_marg(y_j) with r(y_j) - mean r over every search trace
                                       (1: set RL ranks traces as their own rewards do; omitted if either is constant)
            line13/wrong_positive      share of wrong search traces (r < 1) whose A#_marg > 0 (omitted if none)"""
        if not self.sets:
            return {}
        scores = [s for s, _, _, _ in self.sets]
        out = {"line13/set_scores_differ": float(np.mean([np.any(s != s[0]) for s in scores])),
               "line13/set_score_sd": float(np.mean([s.std() for s in scores]))}
        set_adv, own_adv, rewards = (np.concatenate([row[i] for row in self.sets]) for i in (1, 2, 3))
        if set_adv.std() > 0 and own_adv.std() > 0:
            out["line13/corr_set_own"] = float(np.corrcoef(set_adv, own_adv)[0, 1])
        if np.any(rewards < 1):
            out["line13/wrong_positive"] = float(np.mean(set_adv[rewards < 1] > 0))
        return out

    def entropy_metrics(self) -> dict[str, float]:
        """rollout/entropy_<role>: mean entropy per sampled token over every trace of every drawn problem (nats)."""
        return {f"rollout/entropy_{role}": s / n for role, (s, n) in self.entropy.items() if n}


def _spiral_metrics(log: _TraceLog, drawn: int, kept: int, batch_problems: int, budget: int, M: float,
                    search_advantage_scale: float, grader_before: dict[str, int]) -> dict[str, float]:
    """collect_spiral's metrics: per level, means over every trace of every drawn problem; tokens per problem."""
    search_tokens, aggregation_tokens = sum(log.lengths["search"]), sum(log.lengths.get("aggregation", []))
    tokens = search_tokens + aggregation_tokens
    return _batch_metrics(drawn, kept, batch_problems) | log.means({"search": "search_",
                                                                    "aggregation": "aggregation_"}) | {
        "time/search_s": log.seconds["search"],
        "time/aggregation_s": log.seconds.get("aggregation", 0.0),
        "tokens_generated": tokens,
        "tokens_per_problem": tokens / drawn,  # generated per drawn problem, against the maximum below
        "tokens_per_problem_search": search_tokens / drawn,
        "tokens_per_problem_aggregation": aggregation_tokens / drawn,
        "token_budget_per_problem": budget,
        "gradient_scale_M": M,  # Proposition 3.1: E[g_set] = M x the set-RL gradient
        "search_advantage_scale": search_advantage_scale,
    } | log.line13_metrics() | log.entropy_metrics() | _grader_metrics(grader_before)


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "spiral.py", "train.py, trl_spiral.py and the verl recipe use")
