"""SPIRAL on TRL: Algorithm 1 with TRL's GRPOTrainer doing the optimisation (checked against trl 1.16.0, peft 0.21.2).

For a user who already trains with TRL (several GPUs through `accelerate launch`, vLLM generation, TRL's logging).
Nothing SPIRAL is re-implemented here; the subclass routes TRL's two seams to the project's own code:
  Algorithm 1, lines 1-13 and line 15's advantage   spiral.collect_spiral, unchanged (search traces, K sets of n,
      aggregation traces, rewards, advantages, dynamic sampling), in SpiralGRPOTrainer._generate_and_score_completions.
  Lines 14-18                                       train.importance_sampling_loss on TRL's (B, T) tensors, with
      train.loss_normalizer's constant C = |B| (N1 + K N2) L, in SpiralGRPOTrainer._compute_loss.
TRL's rollout_func is not used: TRL would then score and normalise the rows as GRPO groups (and log a warning
every step for the search rows, which have no reward); SPIRAL's advantages need the sets, which only the rollout
knows.

Every TRL setting that changes the update is pinned to train.py's (`grpo_args`): one AdamW step per batch
(num_iterations 1, steps_per_generation = gradient_accumulation_steps), constant learning rate (TRL: linear decay) at
train.py's (TRL: 1e-6), betas (0.9, 0.95), no weight decay, clip 1.0, no KL (beta 0), LoRA r = alpha = 32 on the
seven projections through peft, bf16 and gradient checkpointing as train.py's --dtype and --gradient-checkpointing,
plain sampling (top_k 0, top_p 1).

Where this departs from train.py:
  1. LoRA through peft: the same rank, alpha and modules, but peft's own initialisation (so not bit-identical).
  2. --batch-problems counts problems per process. With one process, dynamic sampling is train.py's (redraws until
     |B| problems carry signal, up to --max-draws). With several, every process must make the same generate calls
     (vLLM server mode gathers them), so nothing is redrawn: problems without signal drop out of the batch and of C,
     as in train.py when --max-draws ends a step early. Rows TRL expects but no kept problem fills are padded with
     advantage-0 rows, which add exactly 0 to the gradient.
  3. --use-vllm: TRL's vLLM engine samples both stages (sampler log-probs from vLLM, no sampler entropies, so no
     rollout/entropy_* columns). Not run here: it needs a GPU and `pip install trl[vllm]`.
  4. No --resume, --separate-aggregator or --algo grpo (train.py has them; TRL's GRPOTrainer is the GRPO baseline).
  5. With several processes, metrics.jsonl holds process 0's rollout metrics (its problems only); C counts all.

    python trl_spiral.py --preset tiny                                       # CPU, writes runs/tiny-trl/metrics.jsonl
    accelerate launch trl_spiral.py --model Qwen/Qwen3-4B-Instruct-2507 --use-vllm    # GPUs; --help for the rest
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import time
import typing
from dataclasses import dataclass
from unittest import mock

import numpy as np
import torch

import checkpoint
import cli
import rollout
import spiral
import train
from lora import TARGET_MODULES
from problemset import Problem
from rollout import Completion

try:
    import peft
    import trl
    from trl import GRPOConfig, GRPOTrainer
    MISSING = None
except ImportError as exc:  # main() says so in one line; SpiralGRPOTrainer needs trl
    GRPOConfig = GRPOTrainer = peft = trl = None
    MISSING = exc

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL pings the Hub from every trainer it builds
TESTED_WITH = {"trl": "1.16.0", "peft": "0.21.2"}  # this file overrides two private GRPOTrainer methods: pin TRL

# ----------------------------------------------------------------------------------------------------------------------
# 1. Configuration: train.py's TrainConfig (same flags, presets, defaults and checks) plus TRL's own settings

SHARED = ["preset", "model", "data", "steps", "out", "overwrite", "seed", "batch_problems", "max_draws", "num_search",
          "set_size", "num_sets", "num_aggregations", "max_new_tokens", "max_prompt_tokens", "target_length",
          "unbiased_set_rl", "temperature", "lr", "lora_rank", "lora_alpha", "weight_decay", "adam_beta1",
          "adam_beta2", "adam_eps", "max_grad_norm", "dtype", "gradient_checkpointing", "device", "cpu_threads"]


@dataclass
class EngineConfig:
    """TRL-only settings; everything SPIRAL is a train.TrainConfig field with train.py's meaning."""

    gradient_accumulation_steps: int = train.option(1, "TRL: micro-batches per optimizer step (one step per batch "
                                                       "of rollouts either way; C does not depend on it)")
    use_vllm: bool = train.option(False, "TRL: sample with vLLM (needs a GPU and trl[vllm])")
    vllm_mode: typing.Literal["colocate", "server"] = train.option("colocate", "TRL: vLLM in this process "
                                                                   "(colocate) or a `trl vllm-serve` server")


def grpo_args(cfg: train.TrainConfig, eng: EngineConfig, output_dir: str):
    """GRPOConfig with every setting that changes the update pinned to train.py's (see the module docstring).

    Rows per optimizer step per process = |B| (N1 + K N2); TRL's num_generations is N1 + K N2, so each problem's
    rows form one of TRL's groups, and a process's generation batch holds whole groups only.
    """
    G = cfg.num_search + cfg.num_sets * cfg.num_aggregations  # rows per problem: 24 in the paper
    bf16 = rollout.resolve_dtype(cfg.dtype, cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return GRPOConfig(
        output_dir=output_dir, max_steps=cfg.steps, seed=cfg.seed, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, use_cpu=cfg.device == "cpu", remove_unused_columns=False,
        # One optimizer step per batch of rollouts, so TRL's PPO ratio stays 1 and its clip never acts.
        per_device_train_batch_size=cfg.batch_problems * G // eng.gradient_accumulation_steps,
        gradient_accumulation_steps=eng.gradient_accumulation_steps, num_iterations=1, num_generations=G,
        # AdamW exactly as train.py's, at a constant learning rate (TRL defaults: linear decay from 1e-6).
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_epsilon=cfg.adam_eps,
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        bf16=bf16 == torch.bfloat16, gradient_checkpointing=cfg.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        # No KL, no reward scaling; the loss itself is SpiralGRPOTrainer._compute_loss.
        beta=0.0, scale_rewards="none", loss_type="dr_grpo", vllm_importance_sampling_correction=False,
        # Plain sampling from softmax(logits / T), the policy the gradient is for (rollout.py, choice 1).
        temperature=cfg.temperature, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        max_completion_length=cfg.max_new_tokens, use_vllm=eng.use_vllm, vllm_mode=eng.vllm_mode)


def lora_config(cfg: train.TrainConfig):
    """peft's LoraConfig for train.py's adapter: r, alpha, lora.TARGET_MODULES, no dropout, no bias."""
    return peft.LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(TARGET_MODULES),
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def aggregation_reward(completions, answer, **_):
    """r(x, y) (reward.reward) as a TRL reward function. GRPOTrainer needs one to be built; SpiralGRPOTrainer grades
    inside spiral.collect_spiral (aggregation traces only) and never calls it."""
    from reward import reward

    return [reward(c, a) for c, a in zip(completions, answer)]


# ----------------------------------------------------------------------------------------------------------------------
# 2. Generation backends with rollout.generate's signature


def vllm_generate(trainer):
    """rollout.generate through TRL's vLLM engine: the same Completions (cut at the first EOS, sampler log-probs), no
    entropies. Temperature and max tokens are the trainer's, which grpo_args sets from the same config."""

    def generate(model, tokenizer, prompts, *, samples_per_prompt, max_new_tokens, temperature=1.0, **_):
        assert (max_new_tokens, temperature) == (trainer.max_completion_length, trainer.temperature)
        n, eos_ids = samples_per_prompt, rollout.eos_token_ids(model, tokenizer)
        ids_P = [rollout.chat_prompt_ids(tokenizer, p) for p in prompts]
        # TRL's engine takes each prompt repeated n times, side by side, and samples n completions per prompt.
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=[ids for ids in ids_P for _ in range(n)], images=None, num_generations=n)
        out = []
        for p, ids in enumerate(ids_P):
            row = []
            for k in range(p * n, (p + 1) * n):
                kept, truncated = rollout.cut_at_first_eos(list(completion_ids[k]), eos_ids)
                sampler = [float("nan") if lp[0] is None else lp[0] for lp in logprobs[k]][:len(kept)]  # top-1 = y_t
                row.append(Completion(list(ids), kept, sampler, tokenizer.decode(kept, skip_special_tokens=True),
                                      truncated))
            out.append(row)
        return out

    return generate


# ----------------------------------------------------------------------------------------------------------------------
# 3. The trainer


def _pad(rows: list[list], value, side: str, dtype) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r, dtype=dtype) for r in rows], batch_first=True,
                                           padding_value=value, padding_side=side)  # (B, T)


class SpiralGRPOTrainer(GRPOTrainer or object):
    """GRPOTrainer whose rollouts are Algorithm 1's (spiral.collect_spiral) and whose loss is train.py's.

    `spiral_config`: the train.TrainConfig of the run (N1, n, K, N2, L, T, ...); `problems`: the training problems,
    from which dynamic sampling redraws. After each optimizer step, train.py's metrics row is appended to
    `metrics_path` (when set) and added to TRL's logs.
    """

    def __init__(self, *args, spiral_config: train.TrainConfig, problems: list[Problem], **kwargs):
        super().__init__(*args, **kwargs)
        self.spiral, self.metrics_path, self.last_rollouts = spiral_config, None, None
        self._np_rng = np.random.default_rng(spiral_config.seed)  # Algorithm 1, line 5's set draws
        self._redraw = train.ProblemStream(problems, spiral_config.seed)  # dynamic sampling's extra problems
        self._row, self._stats, self._rollout_end = {}, None, 0.0

    def _generate_and_score_completions(self, inputs):
        """Algorithm 1, lines 1-13 and line 15's advantage for this process's problems (spiral.collect_spiral), as
        the padded tensors TRL's training step takes: one row per trace, B = len(inputs) rows.

        TRL repeats each problem num_generations = N1 + K N2 times in `inputs`; a kept problem fills its rows with
        its N1 search and K N2 aggregation traces, and advantage-0 rows fill what dropped problems leave.
        """
        cfg, G, tokenizer = self.spiral, self.num_generations, self.processing_class
        problems = [Problem(x["prompt"], x["answer"]) for x in inputs[::G]]  # (B / G,) problems x
        queue = list(problems)
        several = self.accelerator.num_processes > 1  # every process must make the same generate calls: no redraw
        model = self.accelerator.unwrap_model(self.model)
        model = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's LoRA is inside it
        backend = contextlib.nullcontext()
        if self.use_vllm:
            if self.state.global_step != self._last_loaded_step:  # push the LoRA-merged weights to vLLM, as TRL does
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            backend = mock.patch.object(spiral, "generate", vllm_generate(self))  # collect_spiral has no generate=
        start = time.perf_counter()
        with torch.no_grad(), backend:
            rollouts = spiral.collect_spiral(
                model, tokenizer, lambda: queue.pop(0) if queue else self._redraw(), batch_problems=len(problems),
                num_search=cfg.num_search, set_size=cfg.set_size, num_sets=cfg.num_sets,
                num_aggregations=cfg.num_aggregations, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                target_length=cfg.target_length, rng=self._np_rng,
                max_draws=len(problems) if several else (cfg.max_draws or 4 * len(problems)),
                micro_batch_size=cfg.generation_batch_size, tokens_per_micro_batch=cfg.generation_tokens,
                search_advantage_scale=1 / train.gradient_scale_M(cfg) if cfg.unbiased_set_rl else 1.0)
        seconds = time.perf_counter() - start
        self.last_rollouts = rollouts

        samples = rollouts.samples  # kept problems only: |B| (N1 + K N2) <= len(inputs)
        eos = rollout.eos_token_ids(model, tokenizer)[0]
        filler = samples[0] if samples else spiral.Sample(
            rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(problems[0].problem)), [eos], [0.0], 0.0, "")
        rows = samples + [dataclasses.replace(filler, advantage=0.0, role="filler")] * (len(inputs) - len(samples))
        device, pad_id = self.accelerator.device, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        kept_all = int(self.accelerator.gather(torch.tensor([rollouts.metrics["problems_kept"]], device=device)).sum())
        C = train.loss_normalizer(cfg, kept_all)  # line 18's 1/|B|, |B| = kept problems over all processes
        output = {
            "prompt_ids": _pad([s.prompt_ids for s in rows], pad_id, "left", torch.long),  # (B, P)
            "prompt_mask": _pad([[1] * len(s.prompt_ids) for s in rows], 0, "left", torch.long),  # (B, P)
            "completion_ids": _pad([s.completion_ids for s in rows], pad_id, "right", torch.long),  # (B, T)
            "completion_mask": _pad([[1] * len(s.completion_ids) for s in rows], 0, "right", torch.long),  # (B, T)
            "sampling_per_token_logps": _pad([s.sampler_logprobs for s in rows], 0.0, "right", torch.float32),
            "advantages": torch.tensor([s.advantage for s in rows], dtype=torch.float32),  # (B,)
            "is_search": torch.tensor([s.role == "search" for s in rows]),  # (B,)
            # 0-d: TRL's shuffle and split hand it whole to every micro-batch. DDP averages the processes'
            # gradients, so each divides by C / processes and the average is the sum over all of them / C.
            "normalizer": torch.tensor(C / self.accelerator.num_processes, dtype=torch.float64),
        }
        if self.log_completions:  # TRL's completions table, with SPIRAL's advantages and rewards
            self._logs["prompt"].extend(tokenizer.decode(s.prompt_ids) for s in samples)
            self._logs["completion"].extend(tokenizer.decode(s.completion_ids) for s in samples)
            for name in self.reward_func_names:
                self._logs["rewards"][name].extend(math.nan if s.reward is None else s.reward for s in samples)
            self._logs["advantages"].extend(s.advantage for s in samples)
        tokens = rollouts.metrics["tokens_generated"]
        self._row = {**rollouts.metrics, "train/loss_normalizer": C, "time/rollout_s": seconds,
                     "time/generated_tokens_per_s": tokens / max(seconds, 1e-9)}
        self._stats = {"loss": 0.0, "samples": 0, "tokens": 0, "ratios": [], "entropy": {}}
        self._rollout_end = time.perf_counter()
        return {key: value.to(device) for key, value in output.items()}

    def _compute_loss(self, model, inputs):
        """Algorithm 1, lines 14-18 on one micro-batch: train.importance_sampling_loss over its completion tokens,

            loss = -(1/C) sum_t exp(log pi_theta(y_t) - log pi_sampler(y_t)) A_t,

        with the whole batch's C, so micro-batches and processes add up to train.py's loss (TRL does not rescale
        it: GRPOTrainer.loss_is_scaled_for_ga). pi_theta's log-probs come from TRL's own forward (through the DDP
        wrapper, so gradients are synchronised), at the sampling temperature.
        """
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)  # (B, P + T)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P + T)
        logps_BT, entropy_BT, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)  # (B, T), (B, T)
        adv_B = inputs["advantages"]
        trained_B = adv_B != 0  # a zero advantage has an exactly zero gradient (train.py skips those samples)
        mask_BT = inputs["completion_mask"].bool() & trained_B[:, None]  # (B, T)
        sampler_BT = inputs["sampling_per_token_logps"]  # (B, T)
        sampler_BT = torch.where(torch.isnan(sampler_BT), logps_BT.detach(), sampler_BT)  # unscored by vLLM: ratio 1
        adv_BT = adv_B[:, None].expand_as(logps_BT)  # (B, T): every token carries its trace's A
        loss, ratio_N = train.importance_sampling_loss(logps_BT[mask_BT], sampler_BT[mask_BT], adv_BT[mask_BT],
                                                       float(inputs["normalizer"]))
        if self._stats is not None:  # train.py's train/* metrics, over trained samples only
            s = self._stats
            s["loss"] += loss.item()
            s["samples"] += int(trained_B.sum())
            s["tokens"] += int(attention_mask[trained_B].sum())
            s["ratios"].append(ratio_N.detach())
            for role, rows_B in [("search", trained_B & inputs["is_search"]), ("aggregation",
                                                                               trained_B & ~inputs["is_search"])]:
                s["entropy"].setdefault(role, []).append(entropy_BT[rows_B][mask_BT[rows_B]].detach())
        return loss

    def _train_metrics(self) -> dict[str, float]:
        s = self._stats
        metrics = {"train/loss": s["loss"], "train/samples_trained": s["samples"], "train/tokens_trained": s["tokens"]}
        ratio_all = torch.cat(s["ratios"]) if s["ratios"] else torch.zeros(0)
        if ratio_all.numel():
            metrics |= {"train/importance_ratio_mean": float(ratio_all.mean()),
                        "train/importance_ratio_min": float(ratio_all.min()),
                        "train/importance_ratio_max": float(ratio_all.max())}
        for role, parts in s["entropy"].items():
            if sum(p.numel() for p in parts):
                metrics[f"train/entropy_{role}"] = float(torch.cat(parts).float().mean())
        return metrics

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, plus train.py's metrics row (the same columns) after each optimizer step."""
        if self._row and "loss" in logs:
            row = {"step": self.state.global_step, **self._row, **self._train_metrics()}
            if logs.get("grad_norm") is not None:  # before clipping, as train.py's
                row["train/grad_norm"] = float(logs["grad_norm"])
            row |= {"data/epoch": int(self.state.epoch or 0), "time/train_s": time.perf_counter() - self._rollout_end}
            self._row = {}
            logs.update({key: value for key, value in row.items() if key != "step"})
            if self.accelerator.is_main_process and self.metrics_path:
                checkpoint.append_metrics(self.metrics_path, row)
                print(f"trl_spiral.py: step {row['step']}/{self.state.max_steps}: accuracy search "
                      f"{row['search_accuracy']:.3f}, aggregation {row['aggregation_accuracy']:.3f}; problems kept "
                      f"{row['problems_kept']}/{row['problems_drawn']}")
        super().log(logs, start_time)


# ======================================================================================================================
# Plumbing below: the command line and input validation.


def build_parser() -> argparse.ArgumentParser:
    """train.py's flags for SHARED fields (same help, same defaults and presets) plus EngineConfig's."""
    parser = cli.OneLineParser(prog="trl_spiral.py", description=__doc__.split("\n\n")[0],
                           argument_default=argparse.SUPPRESS)
    hints = typing.get_type_hints(train.TrainConfig) | typing.get_type_hints(EngineConfig)
    fields = [f for f in dataclasses.fields(train.TrainConfig) if f.name in SHARED] + list(dataclasses.fields(EngineConfig))
    for f in fields:
        flag, tp, help_text = "--" + f.name.replace("_", "-"), hints[f.name], f.metadata["help"]
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif typing.get_origin(tp) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(tp), help=help_text)
        else:
            parser.add_argument(flag, type=cli.converter(tp, flag), metavar=f.name.upper(), help=help_text)
    return parser


def resolve(argv) -> tuple[train.TrainConfig, EngineConfig, list[Problem]]:
    """Flags -> (TrainConfig, EngineConfig, problems), every check done and nothing written; ConfigError if bad."""
    if MISSING is not None:
        raise cli.ConfigError(f"needs trl and peft ({MISSING}); pip install trl=={TESTED_WITH['trl']} "
                                f"peft=={TESTED_WITH['peft']}")
    explicit = vars(build_parser().parse_args(argv))
    eng = EngineConfig(**{f.name: explicit.pop(f.name) for f in dataclasses.fields(EngineConfig)
                          if f.name in explicit})
    explicit.setdefault("out", os.path.join("runs", f"{explicit.get('preset', 'paper')}-trl"))
    cfg = train.resolve_config(explicit)
    problems = cli.validate(cfg)
    if (trl.__version__, peft.__version__) != (TESTED_WITH["trl"], TESTED_WITH["peft"]):
        print(f"trl_spiral.py: checked with trl {TESTED_WITH['trl']} and peft {TESTED_WITH['peft']}; you have trl "
              f"{trl.__version__} and peft {peft.__version__}, whose private GRPOTrainer methods may differ")
    G = cfg.num_search + cfg.num_sets * cfg.num_aggregations
    cli.need(eng.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", eng.gradient_accumulation_steps,
                "a positive integer")
    cli.need(cfg.batch_problems * G % eng.gradient_accumulation_steps == 0, "gradient_accumulation_steps",
                eng.gradient_accumulation_steps, f"a divisor of the {cfg.batch_problems * G} rows per step "
                                                 f"(--batch-problems x (N1 + K N2))")
    if eng.use_vllm and not (torch.cuda.is_available() and _installed("vllm")):
        raise cli.ConfigError("--use-vllm needs a CUDA GPU and vllm (pip install trl[vllm])")
    return cfg, eng, problems


def _installed(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def build_trainer(cfg: train.TrainConfig, eng: EngineConfig, model, tokenizer, problems) -> SpiralGRPOTrainer:
    """SpiralGRPOTrainer for `model` (a transformers causal LM; peft adds the LoRA) on `problems`."""
    from datasets import Dataset

    torch.manual_seed(cfg.seed)  # peft draws LoRA's A from here
    return SpiralGRPOTrainer(
        model=model, reward_funcs=aggregation_reward, args=grpo_args(cfg, eng, os.path.join(cfg.out, "trl")),
        train_dataset=Dataset.from_list([{"prompt": p.problem, "answer": p.answer} for p in problems]),
        processing_class=tokenizer, peft_config=lora_config(cfg), spiral_config=cfg, problems=problems)


def run(cfg: train.TrainConfig, eng: EngineConfig, problems: list[Problem]) -> SpiralGRPOTrainer:
    """Load the policy, build the trainer, train cfg.steps steps; OUT/metrics.jsonl and OUT/adapter (PEFT format)."""
    import transformers

    cfg.device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)
    try:
        model, tokenizer = rollout.load_policy(cfg.model, device=cfg.device, dtype=cfg.dtype)
    except Exception as exc:  # noqa: BLE001 - a bad model directory fails in many ways; one line names it
        raise cli.ConfigError(f"--model {cfg.model}: cannot load it ({checkpoint.first_line(exc)})") from exc
    kept = [p for p in problems if len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(p.problem)))
            <= cfg.max_prompt_tokens]
    if not kept:
        raise cli.ConfigError(f"every problem's prompt is longer than --max-prompt-tokens {cfg.max_prompt_tokens}")
    checkpoint.prepare_run_dir(cfg.out, config={**dataclasses.asdict(cfg), **dataclasses.asdict(eng),
                                                "gradient_scale_M": train.gradient_scale_M(cfg)},
                               overwrite=cfg.overwrite, resume_step=None)
    trainer = build_trainer(cfg, eng, model, tokenizer, kept)
    trainer.remove_callback(transformers.PrinterCallback)  # one line per step instead (SpiralGRPOTrainer.log)
    trainer.metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    trainer.train()
    trainer.model.save_pretrained(os.path.join(cfg.out, "adapter"))
    print(f"trl_spiral.py: done; adapter in {os.path.join(cfg.out, 'adapter')}")
    return trainer


def main(argv: list[str] | None = None) -> int:
    """Parse and validate (one-line errors, exit 2, nothing written), then train."""
    cfg = None
    try:
        cfg, eng, problems = resolve(argv)
        checkpoint.lock_run_dir(cfg.out)  # one writer per run directory, as train.py
        run(cfg, eng, problems)
    except (cli.ConfigError, checkpoint.CheckpointError) as exc:
        print(f"trl_spiral.py: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if cfg is not None:
            checkpoint.unlock_run_dir(cfg.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
