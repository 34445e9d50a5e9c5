"""TRL's reward contract inside SPIRAL's rollout (trl_spiral.SpiralGRPOTrainer), exactly as GRPOTrainer keeps it.

GRPOTrainer calls each reward function once per step, on the whole batch: f(prompts, completions, completion_ids,
**columns, trainer_state, log_extra, log_metric) -> one value (or None) per completion. SPIRAL's rollout
(spiral.collect_spiral) asks for r(x, y) one trace at a time, so TraceRewards sits between the two:

  1. it wraps the rollout's `generate`: line 2's call returns the round's N1 search traces per problem, line 7's K rows
     of N2 aggregation traces per problem; each role's traces are scored in one call per reward function
     (task.trl_rewards), with their real completion_ids (up to and including the EOS, as TRL's);
  2. collect_spiral then grades each problem's N1 search and K N2 aggregation traces in the order they were generated:
     TraceRewards.reward hands back the values in that order (never looked up by text: repeated texts keep their own);
  3. each trace's per-function values and log_extra columns are kept by the trace (its completion_ids list), and
     log_trl_columns computes TRL's logged columns from them over the traces trained.

With dynamic sampling's redraws (one process) a step has several rounds: each round is one call per function and
role. A trace every function returned None for scores 0, with a warning (TRL 1.16 warns, and leaves it out of its
group's baseline; SPIRAL's set score f_hat(x, G) needs a value for each of the set's N2 traces).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math

import numpy as np
import torch

import task
from problemset import Problem
from rollout import Completion

logger = logging.getLogger("trl_spiral")


class TraceRewards:
    """The reward functions of `trainer` (a SpiralGRPOTrainer) on SPIRAL's traces, in TRL's batches (see above)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.scored = collections.deque()  # (x, Completion, r(x, y)) in the order collect_spiral grades them
        self.round: list[Problem] = []  # the problems drawn since the last aggregation call
        self.search = None  # the round's search traces and their rewards, until line 7's call
        self.per_trace = {}  # id(completion_ids) -> (completion_ids, per-function values, log_extra columns)

    def reset(self) -> None:
        """A new step: nothing scored, nothing kept."""
        self.scored.clear()
        self.round, self.search, self.per_trace = [], None, {}

    def score(self, problems: list[Problem], completions: list[Completion]) -> list[float]:
        """TRL's reward functions on a batch of traces, one call each (task.trl_rewards, as GRPOTrainer's
        _calculate_rewards): each trace's r(x, y), with its per-function values and log_extra columns kept by the
        trace for TRL's columns. Every function returning None for a trace: a warning, and r = 0."""
        trainer, extra_columns = self.trainer, {}
        kwargs = {"trainer_state": trainer.state, "log_metric": trainer._log_metric,
                  "log_extra": lambda column, values: extra_columns.setdefault(column, []).extend(values)}
        if getattr(trainer, "async_loop", None) is not None:
            kwargs["run_async"] = lambda c: asyncio.run_coroutine_threadsafe(c, trainer.async_loop).result()
        rewards, values, unscorable = task.trl_rewards(
            trainer.reward_funcs, trainer.reward_weights.tolist(), [x.fields["prompt"] for x in problems],
            [c.text for c in completions], [c.completion_ids for c in completions], [x.fields for x in problems],
            **kwargs)
        for column, column_values in extra_columns.items():
            if len(column_values) != len(completions):
                raise task.RewardError(f"log_extra({column!r}, ...) got {len(column_values)} values in a call for "
                                       f"{len(completions)} completions; it takes one value per completion")
        for i, c in enumerate(completions):  # the list itself is kept: no other list can take its id this step
            self.per_trace[id(c.completion_ids)] = (c.completion_ids, values[i],
                                                    {k: v[i] for k, v in extra_columns.items()})
        if unscorable:
            prompt = str(problems[unscorable[0]].fields["prompt"])[:60]
            logger.warning(f"every reward function returned None for {len(unscorable)} of {len(completions)} "
                           f"completions (e.g. one of the prompt {prompt!r}); they score 0")
        return rewards

    def drawing(self, draw):
        """`draw` (the rollout's draw_problem) that also notes the problems of the round."""

        def drawing() -> Problem:
            x = draw()
            self.round.append(x)
            return x

        return drawing

    def scoring(self, generate):
        """`generate` that also scores what it returns, one call per reward function and role: line 2's call gives N1
        search traces per problem of the round, line 7's K rows of N2 aggregation traces per problem; after it, the
        round's rewards wait in collect_spiral's grading order (for `reward`)."""

        def scoring(model, tokenizer, prompts, **kwargs):
            out = generate(model, tokenizer, prompts, **kwargs)
            problems = self.round
            if self.search is None:  # line 2: the search traces (logged; trained on them only by search_advantage own)
                rewards = self.score([x for x, row in zip(problems, out) for _ in row], [c for row in out for c in row])
                self.search = (out, iter(rewards))
                return out
            (search, search_rewards), K = self.search, len(out) // len(problems)
            aggregation = [[c for row in out[i * K:(i + 1) * K] for c in row] for i in range(len(problems))]
            rewards = iter(self.score([x for x, row in zip(problems, aggregation) for _ in row],
                                      [c for row in aggregation for c in row]))
            for x, search_N1, aggregation_KN2 in zip(problems, search, aggregation):  # per problem, as it grades
                self.scored += [(x, c, next(search_rewards)) for c in search_N1]
                self.scored += [(x, c, next(rewards)) for c in aggregation_KN2]
            self.round, self.search = [], None
            return out

        return scoring

    def reward(self, problem: Problem, text: str) -> float:
        """r(x, y) for spiral.collect_spiral: the value `scoring` computed for this trace."""
        x, completion, value = self.scored.popleft()
        if x is not problem or completion.text != text:  # collect_spiral changed its grading order
            raise RuntimeError("spiral.collect_spiral graded a trace out of the order it was generated in")
        return value

    def of(self, samples) -> list[tuple]:
        """Each sample's (completion_ids, per-function values, log_extra columns), found by its trace."""
        entries = [self.per_trace[id(s.completion_ids)] for s in samples]
        assert all(entry[0] is s.completion_ids for entry, s in zip(entries, samples))
        return entries


def log_trl_columns(trainer, samples, eos_ids) -> None:
    """TRL's own columns over the rows trained (the kept problems') of all processes, as GRPOTrainer computes them:
    num_tokens, completions/* (lengths; *_terminated_length over the traces that ended with EOS), reward, reward_std
    (the sample std, TRL's nanstd) and rewards/NAME/mean|std over the rewarded traces (the aggregation traces, the
    only ones trained on a reward; a trace every function returned None for is left out of reward, as TRL leaves it
    out), frac_reward_zero_std (the share of them whose set's N2 rewards are all equal: SPIRAL's group, line 15), what
    the reward functions gave log_metric, and TRL's completions table when asked for (--log_completions: per-function
    values, log_extra's columns, advantages)."""
    from accelerate.utils import gather_object

    N2 = trainer.spiral.num_aggregations
    aggregation = [s.reward for s in samples if s.role == "aggregation"]  # kept problems' traces, set by set
    sets_N2 = [aggregation[i:i + N2] for i in range(0, len(aggregation), N2)]
    flags = [len(set(rewards_N2)) == 1 for rewards_N2 in sets_N2 for _ in rewards_N2]  # per trace: its set's std 0
    per_trace = trainer.rewards.of(samples)
    rows = gather_object([(len(s.completion_ids), len(s.prompt_ids), s.completion_ids[-1] not in eos_ids,
                           entry[1] if s.reward is not None else None) for s, entry in zip(samples, per_trace)])
    lengths, prompt_tokens, truncated = ([row[i] for row in rows] for i in range(3))
    values_R_F = np.array([row[3] for row in rows if row[3] is not None], dtype=float).reshape(
        -1, len(trainer.reward_funcs))  # (R, F): rewarded traces x functions, NaN for None
    trainer.state.num_input_tokens_seen += sum(lengths) + sum(prompt_tokens)
    metrics = trainer._metrics["train"]
    metrics["num_tokens"] = [trainer.state.num_input_tokens_seen]
    if lengths:
        metrics["completions/mean_length"].append(float(np.mean(lengths)))
        metrics["completions/min_length"].append(float(min(lengths)))
        metrics["completions/max_length"].append(float(max(lengths)))
        metrics["completions/clipped_ratio"].append(float(np.mean(truncated)))
        ended = [n for n, cut in zip(lengths, truncated) if not cut] or [0]  # TRL's: 0 when none ended
        metrics["completions/mean_terminated_length"].append(float(np.mean(ended)))
        metrics["completions/min_terminated_length"].append(float(min(ended)))
        metrics["completions/max_terminated_length"].append(float(max(ended)))
    if len(values_R_F):
        weighted_R = np.where(np.isnan(values_R_F), 0.0, values_R_F) @ trainer.reward_weights.cpu().numpy()  # (R,)
        weighted_R = weighted_R[~np.isnan(values_R_F).all(axis=1)]  # TRL leaves unscorable traces out
        metrics["reward"].append(nanmean(weighted_R))
        metrics["reward_std"].append(nanstd(weighted_R))
        zero_std = gather_object(flags)
        metrics["frac_reward_zero_std"].append(float(np.mean(zero_std)) if zero_std else math.nan)
        for i, name in enumerate(trainer.reward_func_names):  # None from a function: not its trace (TRL's nanmean)
            metrics[f"rewards/{name}/mean"].append(nanmean(values_R_F[:, i]))
            metrics[f"rewards/{name}/std"].append(nanstd(values_R_F[:, i]))
    for name in sorted(set(gather_object(list(trainer._pending_metrics)))):  # log_metric: TRL's mean over processes
        values = trainer._pending_metrics.get(name, [])
        sums = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=trainer.accelerator.device)
        total, count = trainer.accelerator.gather(sums).view(-1, 2).sum(0).tolist()
        metrics[name].append(total / count)
    trainer._pending_metrics.clear()
    if trainer.log_completions:  # TRL's completions table, with SPIRAL's advantages and rewards
        decode = trainer.processing_class.decode
        trainer._logs["prompt"].extend(decode(s.prompt_ids) for s in samples)
        trainer._logs["completion"].extend(decode(s.completion_ids) for s in samples)
        for i, name in enumerate(trainer.reward_func_names):
            trainer._logs["rewards"][name].extend(entry[1][i] for entry in per_trace)
        trainer._logs["advantages"].extend(s.advantage for s in samples)
        for column in sorted(set(gather_object([k for entry in per_trace for k in entry[2]]))):  # log_extra's
            trainer._logs["extra"][column].extend(gather_object([entry[2].get(column) for entry in per_trace]))


def nanmean(values) -> float:
    """The mean of the non-NaN values (NaN if none), as torch.nanmean."""
    values = np.asarray(values, dtype=float)
    return float(np.nanmean(values)) if not np.isnan(values).all() else math.nan


def nanstd(values) -> float:
    """TRL's nanstd: the sample standard deviation (Bessel's correction) of the non-NaN values; NaN for fewer than 2."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "trl_rewards.py", "trl_spiral.py uses")
