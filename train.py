"""SPIRAL and GRPO training: a plain PyTorch loop with LoRA on one GPU (no Trainer, peft, TRL or accelerate).

Each step collects a dynamically sampled batch B with spiral.py (Algorithm 1, lines 1-13 and line 15's advantage;
the listing is printed in spiral.py) and takes one AdamW step on the LoRA weights along
    g = (1/|B|) sum_x [g_set(x) + g_std(x)]                                      (Algorithm 1, lines 14-18)
through the paper's "REINFORCE with importance sampling" loss (`importance_sampling_loss`).

Where this departs from the paper (each is a flag):
  1. A local loop instead of Tinker. Tinker's LoRA details are not public: alpha = 32 (alpha/r = 1, as Thinking
     Machines' LoRA write-ups), peft's initialisation, AdamW betas (0.9, 0.95) as Tinker's AdamParams, eps 1e-8.
  2. The loss is divided by a constant C = |B| x token budget per problem instead of summed: Adam is invariant to
     it except through eps and clipping, and it keeps the gradient independent of lengths and micro-batching.
  3. Gradient clipping at norm 1.0 per adapter (Tinker: none), a safety net; `train/grad_norm` shows if it bites.
  4. 8 problems per step instead of 256 (one GPU, not a cluster); dynamic sampling is kept.
  5. Data: the bundled MATH train split instead of POLARIS-53K (`--data` takes a JSONL file or a Hub id).
  6. Samples with advantage 0 skip the backward pass (their gradient is 0), so train/* metrics cover trained tokens;
     rollout/entropy_* (the sampler's entropy) covers every trace of every drawn problem.

    python train.py                                  # the paper's setting (needs a GPU)
    python train.py --algo grpo                      # the GRPO baseline at equal maximum token budget
    python train.py --search-advantage own           # the ablation: search traces on their own reward (line 13)
    python train.py --separate-aggregator            # the two-model variant (theta != phi)
    python train.py --preset tiny                    # the CPU demo: ~3 minutes on 2 cores, learns visibly
    python train.py --preset tiny --out runs/x --resume
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import random
import re
import sys
import time
import typing
from dataclasses import dataclass, field
from typing import Literal

try:  # Ctrl-C while torch imports (20-40 s on a cold start): one line, as anywhere else in a run
    import numpy as np
    import torch
    from torch.nn.attention import sdpa_kernel

    import checkpoint
    import cli
    import fastgen
    import figures
    import rollout
    import setsample
    import shared_prompt
    import spiral
    import task
    import tiny
    import tiny_parts
    import tiny_walk
    from cli import ConfigError, validate
    from logprobs import attention_kept_contexts, learner_attention_backends, unwrap
    from lora import TARGET_MODULES, add_lora, adapter_names, export_adapters, lora_parameters, replace_dir, use_adapter
except KeyboardInterrupt:
    print("train.py: interrupted while starting; nothing was written", file=sys.stderr)
    sys.exit(130)

# ----------------------------------------------------------------------------------------------------------------------
# 1. Configuration: one dataclass; each field's help is its --help text


def option(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Defaults are the paper's appendix table (the `paper` preset) unless a help text says otherwise."""

    preset: Literal["paper", "tiny", "tiny_parts", "tiny_parts6", "tiny_walk"] = option(
        "paper", "paper: the appendix's table (needs a GPU); tiny: the CPU demo; tiny_parts: the CPU task of "
                 "tiny_parts.py; tiny_parts6: its 6-digit variant, where one trace is almost never right; tiny_walk: "
                 "tiny_walk.py's graph walk (its warm start is not shipped: `python tiny_walk.py --out "
                 "data/tiny_walk_warmstart` builds it)")
    algo: Literal["spiral", "grpo"] = option("spiral", "spiral (Algorithm 1) or grpo (the baseline, equal budget)")
    model: str = option(rollout.DEFAULT_MODEL, "base model: a Hugging Face id, a local directory, or 'tiny'")
    data: str = option("math_train", "training problems: bundled set, JSONL file or Hub id (paper: POLARIS-53K)")
    data_columns: str | None = option(None, "columns of --data: problem=COL,answer=COL,id=COL (the problem column "
                                            "holds text or a chat prompt of one user message; default problem, "
                                            "answer, id)")
    reward: str | None = option(None, "the task's reward r(x, y), MODULE:FUNCTION or PATH.py:FUNCTION with signature "
                                      "(problem, completion_text) -> float (default: the math grader, task.py)")
    steps: int = option(100, "optimiser steps, one batch of rollouts each")
    out: str | None = option(None, "run directory (default runs/<preset>-<algo>)")
    resume: bool = option(False, "continue the run in --out from its last checkpoint (--steps may grow)")
    overwrite: bool = option(False, "replace the run directory in --out")
    save_every: int = option(10, "save a checkpoint and the adapter every this many steps (and at the end)")
    seed: int = option(0, "seed for LoRA initialisation, data order, set sampling and token sampling")
    batch_problems: int = option(8, "|B|: problems with a non-zero advantage per step (paper: 256)")
    max_draws: int | None = option(None, "stop drawing problems for a step after this many (default 4 x |B|)")
    num_search: int = option(8, "N1: search traces per problem (Algorithm 1, line 2)")
    set_size: int = option(4, "n: search traces per set (line 5)")
    num_sets: int | str = option(4, "K: sets drawn per problem, without replacement from the C(N1, n) possible "
                                     "(line 5); all: every one of them (the K -> infinity limit of line 13)")
    num_aggregations: int = option(4, "N2: aggregation traces per set (line 7)")
    group_size: int = option(12, "GRPO: samples per problem (12 x 8192 = SPIRAL's 24 x 4096 = 98,304 tokens)")
    max_new_tokens: int | None = option(None, "max tokens per trace (default: spiral 4096, grpo 8192)")
    max_prompt_tokens: int = option(1024, "drop training problems whose search prompt is longer (paper: 1024)")
    target_length: int | None = option(None, "L_target of the appendix's length-aware advantage (default off)")
    unbiased_set_rl: bool = option(False, "divide the search traces' advantages by M of Proposition 3.1 for an "
                                          "unbiased set-RL gradient (paper: off; M is logged either way)")
    search_advantage: Literal["set", "own", "none"] = option(
        "set", "the search traces' advantage, Algorithm 1 line 13: set (SPIRAL: marginal set advantage), own (the "
               "ablation: GRPO's advantage on each trace's own reward) or none (0: search traces learn only through "
               "weights shared with aggregation); aggregation traces as SPIRAL's in all three")
    aggregator: Literal["model", "oracle"] = option(
        "model", "who scores a set at line 8: model (SPIRAL: the mean reward of N2 aggregation traces) or oracle (a "
                 "perfect selector, max_{y in G} r(x, y): no aggregation trace is sampled or trained, so line 13 "
                 "alone trains the policy; with --num-sets all, PKPO's pass@n objective)")
    temperature: float = option(1.0, "sampling temperature; the loss's log-probs use the same one")
    lr: float = option(2e-5, "AdamW learning rate (paper: 2e-5)")
    lora_rank: int = option(32, "LoRA rank r (paper: 32)")
    lora_alpha: float = option(32.0, "LoRA alpha, update scaled by alpha / r (not in the paper)")
    weight_decay: float = option(0.0, "AdamW decoupled weight decay")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.95, "AdamW beta2")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    max_grad_norm: float = option(1.0, "clip each adapter's gradient to this norm (0: no clipping, as Tinker)")
    separate_aggregator: bool = option(False, "two-model variant: adapter phi writes and learns the aggregation traces")
    micro_batch_tokens: int | None = option(None, "tokens per training micro-batch, packed (grouped) or padded "
                                                  "(per-sample), on any device. Default: planned by memory on a GPU "
                                                  "(grouped: a group stays whole whenever its counted peak fits the "
                                                  "free memory, split only when it must), else 40,960")
    logprob_chunk_size: int = option(256, "completion positions per lm_head chunk in the log-probs")
    generation_batch_size: int | None = option(None, "sequences per generate call (default: --generation-tokens)")
    generation_tokens: int | None = option(None, "KV-cache tokens (prompt + completion) per generate call (default: "
                                                 "the GPU's free memory minus a headroom; CPU: 131,072)")
    dtype: Literal["auto", "bfloat16", "float32"] = option("auto", "model weights and activations (auto: bfloat16 "
                                                           "on a GPU, float32 on a CPU); LoRA weights stay float32")
    generation: Literal["auto", "hf", "fast"] = option("auto", "sampler: hf (transformers generate, the reference), "
                                                       "fast (fastgen.py: cascade KV cache, CUDA graphs; Qwen3 "
                                                       "only) or auto (fast on a GPU where it applies, else hf)")
    gradient_checkpointing: bool = option(True, "recompute decoder-layer activations in the backward pass")
    # The learner's settings (shared_prompt.py, logprobs.py): how the gradient is computed, never what it is.
    learner: Literal["grouped", "per-sample"] = option("grouped", "grouped: each prompt through the model once for "
                                                       "all its completions (per-sample where a model does not "
                                                       "support it); per-sample: one row per sample, the reference")
    learner_attention: Literal["cudnn", "flash"] = option("cudnn", "the learner's attention kernel on a GPU: cudnn "
                                                          "(flash where cuDNN cannot run) or flash; sampling keeps "
                                                          "its own (no cuDNN: it crashed there)")
    keep_attention_outputs: bool = option(False, "with --gradient-checkpointing, keep each layer's attention "
                                                 "output instead of recomputing it in the backward (Qwen3-4B: "
                                                 "+6.5 GB at 21.7k tokens, computed)")
    device: str | None = option(None, "cuda or cpu (default: cuda if available)")
    cpu_threads: int | None = option(None, "torch threads on a CPU (default: torch's choice; tiny: 1)")
    warm_start_only: bool = option(False, "with --preset tiny and --out DIR: only build its warm-started base "
                                          "(tiny.warm_start, ~6 min) into DIR, then exit")
    plot: bool = option(True, "write OUT/metrics.png at the end (needs matplotlib)")


# Each preset overrides TrainConfig's defaults; a value may be a dict keyed by --algo.
PRESETS: dict[str, dict] = {
    "paper": {"max_new_tokens": {"spiral": 4096, "grpo": 8192}},
    # The CPU demo: the paper's N1=8, n=4, K=4, N2=4 on tiny.py's sums task, from the shipped warm start.
    "tiny": {
        "model": tiny.WARM_START_DIR, "data": "tiny_sums", "device": "cpu", "cpu_threads": 1, "save_every": 25,
        "max_new_tokens": {"spiral": 12, "grpo": 24},  # equal budget: 12 x 24 = (8 + 4 x 4) x 12 tokens
        "lr": 2e-3,  # LoRA on a 0.9M-parameter model: 100x the paper's (measured: 5e-3 and 1e-2 collapse)
        "micro_batch_tokens": 8192,
        "gradient_checkpointing": False,  # memory is no issue here; recomputation would cost ~30% of a step
    },
    # The second CPU task (tiny_parts.py), where a set of traces knows more than one; the tiny preset otherwise.
    "tiny_parts": {
        "model": tiny_parts.WARM_START_DIR, "data": tiny_parts.PROBLEMS_FILE, "device": "cpu", "cpu_threads": 1,
        "steps": 30, "save_every": 10, "lr": 2e-3, "micro_batch_tokens": 8192, "gradient_checkpointing": False,
        "max_draws": 16,  # 2 |B|: once most problems are solved, 4 |B| draws per step doubled the CPU time
        "max_new_tokens": {"spiral": 16, "grpo": 32},  # a trace is 14 tokens; 12 x 32 = (8 + 4 x 4) x 16
    },
    # Its 6-digit variant (tiny_parts.TASKS["tiny_parts6"]), the tiny_parts settings otherwise but for 40 steps.
    "tiny_parts6": {
        "model": tiny_parts.TASKS["tiny_parts6"].warm_start_dir, "data": tiny_parts.TASKS["tiny_parts6"].problems_file,
        "device": "cpu", "cpu_threads": 1, "steps": 40, "save_every": 10, "lr": 2e-3, "micro_batch_tokens": 8192,
        "gradient_checkpointing": False, "max_draws": 16,
        "max_new_tokens": {"spiral": 28, "grpo": 56},  # a trace is 23 tokens; 12 x 56 = (8 + 4 x 4) x 28 = 672
    },
}
PRESETS["tiny_walk"] = tiny_walk.TRAIN_PRESET  # tiny_walk.py: one trace limited by search


def sets_per_problem(cfg: TrainConfig) -> int:
    """K as a number: --num-sets, or C(N1, n) for --num-sets all."""
    return setsample.count_possible_sets(cfg.num_search, cfg.set_size) if cfg.num_sets == "all" else cfg.num_sets


def traces_per_problem(cfg: TrainConfig) -> int:
    """Completions generated per problem: SPIRAL N1 + K N2 (N1 with the oracle aggregator), GRPO G (paper: 24, 12)."""
    if cfg.algo == "grpo":
        return cfg.group_size
    return cfg.num_search + (sets_per_problem(cfg) * cfg.num_aggregations if cfg.aggregator == "model" else 0)


def token_budget_per_problem(cfg: TrainConfig) -> int:
    """Max completion tokens per problem: SPIRAL (N1 + K N2) L, GRPO G L (paper: both 98,304)."""
    return traces_per_problem(cfg) * cfg.max_new_tokens


def budget_line(cfg: TrainConfig) -> str:
    """The maximum budget per problem written out, e.g. "(8 + 4 x 4) x 16 = 384" (SPIRAL) or "12 x 32 = 384"."""
    traces = (f"{cfg.group_size}" if cfg.algo == "grpo" else f"{cfg.num_search}" if cfg.aggregator == "oracle"
              else f"({cfg.num_search} + {sets_per_problem(cfg)} x {cfg.num_aggregations})")
    return f"{traces} x {cfg.max_new_tokens} = {token_budget_per_problem(cfg):,}"


def gradient_scale_M(cfg: TrainConfig) -> float | None:
    """M of Proposition 3.1 for the run's N1, n, K (unordered sets): E[g_set] = M x the set-RL gradient. GRPO: None."""
    return setsample.gradient_scale(cfg.num_search, cfg.set_size, sets_per_problem(cfg)) if cfg.algo == "spiral" \
        else None


# ----------------------------------------------------------------------------------------------------------------------
# 2. The loss and one optimisation step: Algorithm 1, lines 14-18


def loss_normalizer(cfg: TrainConfig, problems_kept: int) -> float:
    """C = |B| x token budget per problem: line 18's 1/|B| times a constant 1/budget.

    |B| is the number of problems kept (those with a non-zero advantage), as the paper's dynamic sampling
    defines the batch: fewer when max_draws ends a step early. C must not depend on the sampled lengths or on the
    micro-batch split (the length bias Dr. GRPO removes; the per-micro-batch bug GRPO-Zero fixed).
    """
    return max(problems_kept, 1) * token_budget_per_problem(cfg)


def importance_sampling_loss(logprobs_T, sampler_logprobs_T, adv_T, normalizer: float):
    """REINFORCE with importance sampling (Tinker's `importance_sampling` loss), flat over tokens:

        loss = -(1/C) sum_t exp(log pi_theta(y_t) - log pi_sampler(y_t)) A_t

    At ratio 1 its gradient is (1/C) sum_samples A(y) grad log pi_theta(y): search samples (A = A#_marg) sum to
    g_set(x) (line 14), aggregation samples (A = r - set mean) to g_std(x) (line 15), one sum is line 16, and C
    holds line 18's 1/|B|. The ratio corrects for sampler and learner numerics differing. Returns (loss, ratio_T).
    """
    ratio_T = torch.exp(logprobs_T - sampler_logprobs_T)  # (T,)
    return -(ratio_T * adv_T).sum() / normalizer, ratio_T


def accumulate_gradients(model, samples, *, loss_normalizer: float, temperature: float = 1.0,
                         micro_batch_tokens: int | None = None, chunk_size: int = 256,
                         adapter_for_role: dict[str, str] | None = None, pad_token_id: int = 0,
                         learner: str = "grouped", learner_attention: str = "cudnn") -> dict[str, float | str]:
    """Add the gradient of `importance_sampling_loss` over `samples` into the LoRA parameters' .grad.

    Each sample trains the adapter `adapter_for_role[role]` ("default" unless given; the two-model variant sends
    aggregation samples to phi). Every micro-batch divides by the same constant, so the split does not matter.
    learner="grouped" runs each prompt once for all its completions (shared_prompt.py; per sample where
    shared_prompt.unsupported(model) says it does not apply: the metric train/learner_fallback names why), "per-sample"
    one row per sample (the reference); both give the same gradient. Micro-batches: shared_prompt.micro_batches
    (micro_batch_tokens None: planned by memory). `learner_attention`: the SDPA kernels on a GPU.
    """
    adapter_for_role = adapter_for_role or {}
    base = unwrap(model)
    device = next(base.parameters()).device
    trained = [s for s in samples if s.advantage != 0]  # a zero advantage has an exactly zero gradient
    for s in trained:
        if len(s.sampler_logprobs) != len(s.completion_ids):
            raise ValueError(f"a sample has {len(s.completion_ids)} completion tokens but "
                             f"{len(s.sampler_logprobs)} sampler log-probs")
    by_adapter: dict[str, list] = {}
    for s in trained:
        by_adapter.setdefault(adapter_for_role.get(s.role, "default"), []).append(s)
    fallback = shared_prompt.unsupported(model) if learner == "grouped" and trained else ""
    grouped = learner == "grouped" and bool(trained) and not fallback
    backends = learner_attention_backends(learner_attention, device.type, base.dtype, masked=not grouped)

    loss_sum, ratios, entropy_by_role, tokens = 0.0, [], {}, 0
    for name, group in by_adapter.items():
        # The kernels and the grouped attention stay chosen over the backward: checkpointing recomputes the forward.
        with use_adapter(model, name), sdpa_kernel(backends), \
                (shared_prompt.sharing_prompts(model) if grouped else contextlib.nullcontext()):
            for micro, forward in shared_prompt.micro_batches(model, group, grouped, micro_batch_tokens, pad_token_id,
                                                              device, temperature, chunk_size, backends):
                logprobs_T, entropy_T = forward()  # (T,), (T,) sample after sample, in the order of `micro`
                sampler_T = torch.tensor([lp for s in micro for lp in s.sampler_logprobs], device=device)  # (T,)
                lengths_B = torch.tensor([len(s.completion_ids) for s in micro], device=device)  # (B,)
                adv_B = torch.tensor([s.advantage for s in micro], device=device, dtype=torch.float32)  # (B,)
                adv_T = torch.repeat_interleave(adv_B, lengths_B)  # (T,): every token carries its sample's A
                loss, ratio_T = importance_sampling_loss(logprobs_T, sampler_T, adv_T, loss_normalizer)
                loss.backward()
                loss_sum += loss.item()
                ratios.append(ratio_T.detach())
                tokens += sum(len(s.prompt_ids) + len(s.completion_ids) for s in micro)  # the samples' own tokens
                for s, ent in zip(micro, torch.split(entropy_T, lengths_B.tolist())):
                    entropy_by_role.setdefault(s.role, []).append(ent)

    metrics = loss_metrics(loss_sum, len(trained), tokens, ratios, entropy_by_role)
    return metrics | ({"train/learner_fallback": f"per-sample: {fallback}"} if fallback else {})


def loss_metrics(loss_sum: float, samples_trained: int, tokens_trained: int, ratios: list, entropy_by_role: dict
                 ) -> dict[str, float]:
    """The train/* columns of a step (trl_spiral.py writes the same): the loss summed over micro-batches, what was
    trained, the importance ratio over the trained tokens (`ratios`: (T,) tensors) and each role's mean entropy
    (`entropy_by_role`: role -> (T,) tensors; a role with no token gets no column)."""
    metrics = {"train/loss": loss_sum, "train/samples_trained": samples_trained, "train/tokens_trained": tokens_trained}
    ratio_all = torch.cat(ratios) if ratios else torch.zeros(0)
    if ratio_all.numel():
        metrics |= {"train/importance_ratio_mean": float(ratio_all.mean()),
                    "train/importance_ratio_min": float(ratio_all.min()),
                    "train/importance_ratio_max": float(ratio_all.max())}
    for role, parts in entropy_by_role.items():
        if sum(p.numel() for p in parts):
            metrics[f"train/entropy_{role}"] = float(torch.cat(parts).float().mean())
    return metrics


def train_step(model, optimizer, samples, *, max_grad_norm: float = 1.0, **kwargs) -> dict[str, float]:
    """accumulate_gradients (kwargs go there), clip each adapter separately (as two models would be), AdamW step.
    An adapter with no trained sample gets no gradient, and AdamW leaves it unchanged."""
    was_training = model.training
    model.train()  # activation checkpointing only runs in training mode
    optimizer.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(model, samples, **kwargs)
    for name in adapter_names(model):
        params = [p for p in lora_parameters(model, name) if p.grad is not None]
        if params:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)
            metrics["train/grad_norm" + ("" if name == "default" else f"_{name}")] = float(norm)
    bad = [f"{k} = {v}" for k, v in metrics.items() if re.match("train/(loss|grad_norm)", k) and not math.isfinite(v)]
    if bad:  # stop before the step: the weights, and so every checkpoint, stay finite
        raise Diverged(f"non-finite {', '.join(bad)}; no optimizer step was taken")
    optimizer.step()
    if not torch.stack([torch.isfinite(p).all() for g in optimizer.param_groups for p in g["params"]]).all():
        raise Diverged("the AdamW step made the LoRA weights non-finite (is --lr too large?)")
    optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    return metrics


# ----------------------------------------------------------------------------------------------------------------------
# 3. The loop


class ProblemStream:
    """draw_problem() for spiral.collect_*: epoch e visits the problems in permutation default_rng([seed, e]),
    so a checkpoint needs only (epoch, index)."""

    def __init__(self, problems, seed: int, epoch: int = 0, index: int = 0):
        self.problems, self.seed, self.epoch, self.index = problems, seed, epoch, index
        self._order = np.random.default_rng([seed, epoch]).permutation(len(problems))
        self.sha256 = checkpoint.data_fingerprint(problems)  # a resume refuses changed data (data_position)

    def __call__(self):
        if self.index == len(self.problems):
            self.epoch, self.index = self.epoch + 1, 0
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.problems))
        problem = self.problems[self._order[self.index]]
        self.index += 1
        return problem

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "sha256": self.sha256}


def collect(cfg: TrainConfig, model, tokenizer, stream: ProblemStream, np_rng, reward_fn=None) -> spiral.Rollouts:
    """Algorithm 1, lines 1-13 and 15's advantage (spiral.collect_spiral), or the GRPO baseline's rollouts; rewards
    from `reward_fn`, the task's r(x, y) (None: the math grader)."""
    common = dict(batch_problems=cfg.batch_problems, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                  target_length=cfg.target_length, rng=np_rng, max_draws=cfg.max_draws,
                  micro_batch_size=cfg.generation_batch_size, tokens_per_micro_batch=cfg.generation_tokens,
                  reward_fn=reward_fn)
    if cfg.algo == "grpo":
        return spiral.collect_grpo(model, tokenizer, stream, group_size=cfg.group_size, **common)
    aggregator = (lambda: use_adapter(model, "aggregator")) if cfg.separate_aggregator else None
    return spiral.collect_spiral(model, tokenizer, stream, num_search=cfg.num_search, set_size=cfg.set_size,
                                 num_sets=cfg.num_sets, num_aggregations=cfg.num_aggregations,
                                 aggregation_adapter=aggregator,
                                 search_advantage_scale=1 / gradient_scale_M(cfg) if cfg.unbiased_set_rl else 1.0,
                                 search_advantage=cfg.search_advantage, aggregator=cfg.aggregator, **common)


def train(cfg: TrainConfig, problems, reward_fn=None) -> None:
    """cfg.steps steps of: collect a batch (lines 1-13), one gradient step on it (lines 14-18), log, checkpoint.
    `reward_fn`: the task's checked r(x, y) (task.resolve; None: the math grader)."""
    model, tokenizer, optimizer, stream, np_rng, start, base_path = start_run(cfg, problems)
    adapter_for_role = {"aggregation": "aggregator"} if cfg.separate_aggregator else {}
    metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    if cfg.generation_batch_size is None:
        budget = cfg.generation_tokens or rollout.generation_token_budget(model)
        print(f"train.py: {model.dtype}; generate calls hold up to {budget:,} tokens of KV cache "
              f"({rollout.kv_bytes_per_token(model.config, model.dtype):,} bytes per token)")
    print(f"train.py: at most {budget_line(cfg)} completion tokens per problem (the tokens generated: "
          "tokens_per_problem in metrics.jsonl)")
    if start >= cfg.steps:
        print(f"train.py: the run in {cfg.out} is already at step {start} = --steps; pass a larger --steps to continue")
    bar, watch = figures.StepBar(cfg.algo, cfg.steps, start), cli.StepWatch()  # in a step: its stage, problems drawn
    for step in range(start + 1, cfg.steps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():  # Algorithm 1, lines 1-13: search, sets, aggregation, rewards, advantages
            rollouts = collect(cfg, model, tokenizer, bar.counting(stream), np_rng, reward_fn)
        t1 = time.perf_counter()
        fastgen.release()  # the KV arena goes to the learner; fastgen keeps its graphs for the next step (hf: no-op)
        bar.stage("gradient")
        # Algorithm 1, lines 14-18: g = (1/|B|) sum_x [g_set(x) + g_std(x)], then one AdamW step along it.
        C = loss_normalizer(cfg, rollouts.metrics["problems_kept"])
        stats = train_step(model, optimizer, rollouts.samples, loss_normalizer=C, temperature=cfg.temperature,
                           micro_batch_tokens=cfg.micro_batch_tokens, chunk_size=cfg.logprob_chunk_size,
                           max_grad_norm=cfg.max_grad_norm, adapter_for_role=adapter_for_role,
                           pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
                           learner=cfg.learner, learner_attention=cfg.learner_attention)
        t2 = time.perf_counter()
        row = {"step": step, **rollouts.metrics, **stats, "train/loss_normalizer": C,
               "data/epoch": stream.epoch, "time/rollout_s": t1 - t0, "time/train_s": t2 - t1,
               "time/generated_tokens_per_s": rollouts.metrics["tokens_generated"] / max(t1 - t0, 1e-9)}
        checkpoint.append_metrics(metrics_path, row)
        if step % cfg.save_every == 0 or step == cfg.steps:
            checkpoint.save_checkpoint(cfg.out, model=model, optimizer=optimizer, step=step, data_state=stream.state(),
                                       np_rng=np_rng, config=dataclasses.asdict(cfg), base_model_name_or_path=base_path)
            export_adapters(model, os.path.join(cfg.out, "adapter"), base_path, base_root=cfg.out)  # "../base"
        for line in watch.check(row):  # grader timeouts; steps that kept no problem (no gradient)
            bar.write(line)
        bar.step_done(row)
    bar.close()
    if cfg.plot and figures.plot_training(metrics_path, os.path.join(cfg.out, "metrics.png")):
        print(f"train.py: wrote {os.path.join(cfg.out, 'metrics.png')}")
    rows = checkpoint.read_metrics(metrics_path)
    # the table last: the README's demo shows it
    print(f"train.py: done; adapter in {os.path.join(cfg.out, 'adapter')}\n"
          f"train.py: {figures.generated_tokens_line(rows, cfg.algo == 'spiral', budget_line(cfg))}\n"
          + figures.first_last_table(rows))


def enable_gradient_checkpointing(model, keep_attention_outputs: bool = False) -> None:
    """Non-reentrant activation checkpointing on every decoder layer: gradients reach the LoRA weights inside a
    layer even though its input (the frozen embedding's output) does not require grad. keep_attention_outputs:
    selective checkpointing that saves the attention kernels' outputs, so the backward recomputes the layer's
    linears but not its attention (logprobs.attention_kept_contexts)."""
    kwargs = {"use_reentrant": False}
    if keep_attention_outputs:
        kwargs["context_fn"] = attention_kept_contexts
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; gradient_* is deprecated there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def start_run(cfg: TrainConfig, problems):
    """Model, LoRA, optimizer and data order, fresh or restored from the run's last checkpoint. Whatever can fail on
    the inputs (loading the model and the checkpoint) happens before the run directory is touched."""
    if cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)
    random.seed(cfg.seed)
    np_rng = np.random.default_rng(cfg.seed)
    try:
        model, tokenizer = rollout.load_policy(cfg.model, device=cfg.device or ("cuda" if torch.cuda.is_available()
                                                                                else "cpu"), dtype=cfg.dtype)
    except Exception as exc:  # noqa: BLE001 - a bad model directory fails in many ways; one line names it
        raise ConfigError(f"--model {cfg.model}: cannot load it ({checkpoint.first_line(exc)})") from exc
    if cfg.generation == "fast" and fastgen.supports(model):
        raise ConfigError(f"--generation fast: {fastgen.supports(model)}")
    cfg.generation = rollout.resolve_engine(cfg.generation, model)  # config.json records the sampler used
    model.generation_engine = cfg.generation  # every rollout.generate call of the run (spiral.py's included)
    prompt_lengths = [len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(p.problem))) for p in problems]
    kept = [p for p, n in zip(problems, prompt_lengths) if n <= cfg.max_prompt_tokens]
    if not kept:
        raise ConfigError(f"every problem's prompt is longer than --max-prompt-tokens {cfg.max_prompt_tokens}")
    if len(kept) < len(problems):
        print(f"train.py: dropped {len(problems) - len(kept)} of {len(problems)} problems longer than "
              f"{cfg.max_prompt_tokens} prompt tokens")
    base_model = copy.deepcopy(model) if cfg.model == "tiny" else None  # saved to OUT/base below, without LoRA

    torch.manual_seed(cfg.seed)  # LoRA's A initialisation draws from here
    add_lora(model, cfg.lora_rank, cfg.lora_alpha, TARGET_MODULES, "default")
    if cfg.separate_aggregator:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, TARGET_MODULES, "aggregator")
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model, cfg.keep_attention_outputs)
    why = shared_prompt.unsupported(model) if cfg.learner == "grouped" else ""
    if why:
        print(f"train.py: --learner grouped does not apply to this model ({why}); the learner trains per sample "
              "(metric train/learner_fallback)")
    model.eval()
    optimizer = torch.optim.AdamW([{"params": lora_parameters(model, name)} for name in adapter_names(model)],
                                  lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay)
    stream, start = ProblemStream(kept, cfg.seed), 0
    resume_from = checkpoint.latest_checkpoint(cfg.out) if cfg.resume else None  # None: a crash before the first
    if resume_from is not None:
        state = checkpoint.load_checkpoint(resume_from, model=model, optimizer=optimizer, np_rng=np_rng)
        start, stream = state["step"], ProblemStream(kept, cfg.seed, **checkpoint.data_position(state, kept))

    # Only now, with every input checked and loaded, does the run touch the disk.
    checkpoint.prepare_run_dir(cfg.out, config={**dataclasses.asdict(cfg), "gradient_scale_M": gradient_scale_M(cfg),
                                                "versions": checkpoint.versions(model.device)},
                               overwrite=cfg.overwrite, resume_step=start if cfg.resume else None)
    base_path = checkpoint.save_base(cfg.out, cfg.model, base_model, tokenizer, in_checkout=tiny.WARM_START_DIR)
    return model, tokenizer, optimizer, stream, np_rng, start, base_path


# ======================================================================================================================
# Plumbing below: the command line and input validation.

# May change on --resume: none changes the algorithm (only an unchanged resume is bit-exact, though).
RESUME_MUTABLE = {"steps", "save_every", "out", "resume", "overwrite", "device", "cpu_threads", "plot",
                  "micro_batch_tokens", "logprob_chunk_size", "generation_batch_size", "generation_tokens",
                  "generation", "learner", "learner_attention", "keep_attention_outputs"}


class Diverged(Exception):
    """A non-finite loss, gradient or weight: the run stops (exit code 1) and its last checkpoint stays good."""


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field, help from its metadata. Defaults are SUPPRESSed, so only the flags given
    appear in the namespace and override the preset."""
    parser = cli.OneLineParser(prog="train.py", description=__doc__.split("\n\n")[0],
                               argument_default=argparse.SUPPRESS)
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag, tp, help_text = "--" + f.name.replace("_", "-"), hints[f.name], f.metadata["help"]
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif f.name == "num_sets":
            parser.add_argument(flag, type=cli.count_or_all, metavar="K|all", help=help_text)
        elif typing.get_origin(tp) is Literal:
            parser.add_argument(flag, choices=typing.get_args(tp), help=help_text)
        else:
            parser.add_argument(flag, type=cli.converter(tp, flag), metavar=f.name.upper(), help=help_text)
    return parser


def resolve_config(explicit: dict, saved: dict | None = None) -> TrainConfig:
    """TrainConfig defaults <- preset <- explicit flags; on --resume: the checkpoint's config <- explicit flags."""
    if saved is not None:
        saved = {k: v for k, v in saved.items() if k not in ("gradient_scale_M", "versions")}  # config.json logs them
        unknown = sorted(set(saved) - {f.name for f in dataclasses.fields(TrainConfig)})
        if unknown:
            raise ConfigError(f"--resume: the checkpoint's config has settings this train.py lacks {unknown}")
        changed = {k: v for k, v in explicit.items() if k not in RESUME_MUTABLE and saved.get(k) != v}
        if changed:
            name, value = next(iter(changed.items()))
            raise ConfigError(f"--{name.replace('_', '-')} {value} differs from the checkpoint's {saved.get(name)}; "
                              "resume with the run's settings or start a new run")
        values = {**saved, "overwrite": False, **explicit}  # a run started with --overwrite resumes too
    else:
        preset, algo = explicit.get("preset", TrainConfig.preset), explicit.get("algo", TrainConfig.algo)
        values = {**{k: (v[algo] if isinstance(v, dict) else v) for k, v in PRESETS[preset].items()}, **explicit}
    cfg = TrainConfig(**values)
    if cfg.out is None:
        cfg.out = os.path.join("runs", f"{cfg.preset}-{cfg.algo}")
    if cfg.max_new_tokens is None:
        cfg.max_new_tokens = {"spiral": 4096, "grpo": 8192}[cfg.algo]
    return cfg


def main(argv: list[str] | None = None) -> int:
    """Parse, validate (one-line errors, exit 2, nothing written), then train (exit 1 if it diverges)."""
    cfg = None
    checkpoint.quiet_libraries()
    try:
        explicit = vars(build_parser().parse_args(argv))
        if explicit.get("warm_start_only"):
            return cli.warm_start_only(explicit, explicit.get("cpu_threads", PRESETS["tiny"]["cpu_threads"]))
        saved = None
        if explicit.get("resume") and not explicit.get("overwrite"):
            explicit["out"] = explicit.get("out") or resolve_config(explicit).out  # never the checkpoint's own out
            saved = checkpoint.saved_config(explicit["out"])  # None: validate says "no checkpoint"
        cfg = resolve_config(explicit, saved)
        problems = validate(cfg)
        cfg.out = os.path.abspath(cfg.out)  # before the reward runs: its os.chdir cannot move the run's files
        reward_fn = cli.task_reward(cfg.reward, problems)  # --reward: imported and probed on one problem now
        checkpoint.lock_run_dir(cfg.out)  # one writer: a second train.py on OUT stops here, having written nothing
        train(cfg, problems, reward_fn)
    except (ConfigError, checkpoint.CheckpointError) as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    except task.RewardError as exc:  # the task's reward failed during training: its checkpoints stay good
        exc.__traceback__ = exc.__context__ = None  # frees train()'s frame: its progress bar ends its line first
        last = checkpoint.latest_checkpoint(cfg.out)
        print(f"train.py: error: {exc}; stopped. " + (f"The last good checkpoint is {last}" if last else
                                                      "No checkpoint was saved"), file=sys.stderr)
        return 1
    except Diverged as exc:
        exc.__traceback__ = None  # frees train()'s frame, so its progress bar ends its line before this message
        rows, last = checkpoint.read_metrics(f"{cfg.out}/metrics.jsonl"), checkpoint.latest_checkpoint(cfg.out)
        print(f"train.py: error: step {rows[-1]['step'] + 1 if rows else 1}: {exc}; stopped. "
              + (f"The last good checkpoint is {last}" if last else "No checkpoint was saved"), file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        exc.__traceback__ = None
        print("train.py: interrupted; continue with --resume", file=sys.stderr)
        return 130
    finally:
        if cfg is not None:
            checkpoint.unlock_run_dir(cfg.out)  # and removes an OUT it created if nothing was written there
    return 0


if __name__ == "__main__":
    sys.exit(main())
