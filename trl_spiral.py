"""SPIRAL on TRL: Algorithm 1 with TRL's GRPOTrainer doing the optimisation (checked against trl 1.16.0, peft 0.21.2).

For a user who already trains with TRL: TRL's flags (`TrlParser` over GRPOConfig, `--config recipe.yaml`; trl_args.py),
several processes through `accelerate launch` (DDP, ZeRO-3; FSDP with vLLM only), vLLM generation, `report_to`,
`save_steps` checkpoints and `--resume_from_checkpoint`. Nothing SPIRAL is re-implemented; the subclass routes TRL's
two seams to this project:
  Algorithm 1, lines 1-13 and line 15's advantage   spiral.collect_spiral, unchanged (search traces, K sets of n,
      aggregation traces, rewards, advantages, dynamic sampling), in SpiralGRPOTrainer._generate_and_score_completions.
  Lines 14-18                                       train.importance_sampling_loss on TRL's (B, T) tensors, with
      train.loss_normalizer's constant C = |B| (N1 + K N2) L, in SpiralGRPOTrainer._compute_loss.
TRL's rollout_func is not used: TRL would then score and normalise the rows as GRPO groups.

Settings. SpiralArguments holds SPIRAL's own (train.py's flags of the same meaning, from the same presets); TRL's go by
TRL's names, with train.py's values as defaults (learning_rate, max_steps, max_completion_length, temperature, the AdamW
settings, ...). Every GRPOConfig field is classified in trl_args.FIELDS; one that would make the update something other
than Algorithm 1's, or would be ignored, is pinned (or derived from N1, K, N2 and |B|): another value is a one-line
error that says why, from the command line and from SpiralGRPOTrainer(model, reward_funcs, args, train_dataset) alike.
The task: the reward_funcs given (TRL's signature, called on TRL's batches: trl_rewards.py), or --reward's
r(problem, completion) (task.py), or the math grader.

Where this departs from train.py:
  1. LoRA through peft: the same rank, alpha and modules, but peft's own initialisation (so not bit-identical).
  2. --batch_problems counts problems per process. With one process, dynamic sampling is train.py's (redraws until
     |B| problems carry signal, up to --max_draws). With several, every process must make the same generate calls
     (vLLM server mode gathers them), so nothing is redrawn: problems without signal drop out of the batch and of C,
     and their rows are padded with advantage-0 rows, which add exactly 0 to the gradient.
  3. --use_vllm: TRL's vLLM engine samples both stages (no sampler entropies, so no rollout/entropy_* columns).
     Not run here: it needs a GPU and `pip install trl[vllm]`.
  4. No --separate-aggregator or --algo grpo (TRL's own GRPOTrainer is the GRPO baseline). Checkpoints are TRL's
     (OUT/checkpoint-N, with SPIRAL's sampling state in spiral_state.json); OUT/adapter is written at the end.
  5. With several processes, metrics.jsonl's rollout and train/* columns are process 0's alone (its problems and
     rows; train/loss is its rows' loss over C / processes), but for train/loss_normalizer (C counts every process's
     kept problems) and train/grad_norm (the synchronised gradient's). TRL's columns (reward, num_tokens,
     completions/*, entropy) are over all processes.

    python trl_spiral.py --preset tiny                                       # CPU, writes runs/tiny-trl/metrics.jsonl
    accelerate launch --config_file recipe/trl/ddp.yaml trl_spiral.py --config recipe/trl/paper.yaml  # GPUs
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from unittest import mock

import numpy as np
import torch

import checkpoint
import cli
import rollout
import spiral
import task
import train
import trl_args
import trl_rewards
import trl_run
from lora import TARGET_MODULES, write_json_atomic
from problemset import Columns, Problem, problem_from_record
from rollout import Completion
from trl_run import STATE_FILE, read_spiral_states, resume_checkpoint  # noqa: F401 - trl_spiral.STATE_FILE

try:
    import peft
    import trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.models import unwrap_model_for_generation
    MISSING = None
except ImportError as exc:  # main() says so in one line; SpiralGRPOTrainer needs trl
    GRPOConfig = GRPOTrainer = peft = trl = None
    TrainerCallback = object
    MISSING = exc

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL pings the Hub from every trainer it builds
TESTED_WITH = {"trl": "1.16.0", "peft": "0.21.2"}  # this file overrides two private GRPOTrainer methods: pin TRL

# ----------------------------------------------------------------------------------------------------------------------
# 1. Configuration: trl_args.py (SpiralArguments, TRL's settings with train.py's defaults, PINNED, derived_settings);
#    here, the adapter and the reward function TRL is built with


def lora_config(cfg: train.TrainConfig):
    """peft's LoraConfig for train.py's adapter: r, alpha, lora.TARGET_MODULES, no dropout, no bias."""
    return peft.LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(TARGET_MODULES),
                           lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def aggregation_reward(completions, answer, **_):
    """The default task in TRL's signature: r(x, y) = reward.reward(y, gold), the math grader on the `answer` column
    (looked up as spiral.reward, the grader spiral.collect_spiral uses by default)."""
    return [spiral.reward(task.text_of(c), None if a is None else str(a)) for c, a in zip(completions, answer)]


# ----------------------------------------------------------------------------------------------------------------------
# 2. Generation through TRL's vLLM engine, with rollout.generate's signature


def vllm_generate(trainer):
    """rollout.generate through TRL's vLLM engine: the same Completions (cut at the first EOS, sampler log-probs), no
    entropies. Temperature and max tokens are the trainer's, which come from the same flags."""

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
    """GRPOTrainer whose rollouts are Algorithm 1's (spiral.collect_spiral) and whose loss is train.py's, built as
    TRL's own: SpiralGRPOTrainer(model, reward_funcs, args, train_dataset, ...).

    `reward_funcs`: TRL's reward functions f(prompts, completions, **columns) -> list[float] (summed with
    args.reward_weights as TRL sums them; None: the math grader on the `answer` column; task.trl_reward adapts a
    task's r(problem, completion)); they score the aggregation traces (and the search traces, for logging only), one
    call per function on all of a round's traces of a role, as TRL's batch (trl_rewards.TraceRewards).
    `train_dataset`: a datasets.Dataset with a `prompt` column (text or one user message) and any others, which reach
    the reward functions. `args`: a GRPOConfig, checked against SPIRAL's pins and derived values exactly as
    trl_spiral.py's command line checks its flags (trl_args.check_grpo_config; None: trl_args.grpo_config(...)).
    `spiral_config`: SPIRAL's own settings, a trl_args.SpiralArguments or train.TrainConfig (None: the paper
    preset's N1, n, K, N2 and |B|). `peft_config` None: SPIRAL's LoRA (trl_args.SpiralArguments.lora_r). After each
    optimizer step, train.py's metrics row is appended to `metrics_path` (when set, by process 0 only) and added to
    TRL's logs. Not taken: reward models, tools, environments, rollout_func, an eval_dataset (ValueError).
    """

    # The loss divides by the whole batch's C (train.loss_normalizer), the same in every micro-batch: TRL's
    # training_step must not divide it again by the gradient-accumulation steps.
    loss_is_scaled_for_ga = True

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, reward_processing_classes=None, callbacks=None, optimizers=(None, None),
                 peft_config=None, *, spiral_config=None, **kwargs):
        taken = {"eval_dataset": eval_dataset, "reward_processing_classes": reward_processing_classes,
                 **{k: kwargs.get(k) for k in ("tools", "rollout_func", "environment_factory")}}
        for name, value in taken.items():
            if value is not None:
                raise ValueError(f"SpiralGRPOTrainer takes no {name}: SPIRAL's rollout is spiral.collect_spiral "
                                 "(evaluate with evaluate.py)")
        reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs or
                                                                                            aggregation_reward]
        for i, function in enumerate(reward_funcs):
            if isinstance(function, (str, torch.nn.Module)) or not callable(function):
                raise ValueError(f"reward_funcs[{i}] is {type(function).__name__}: SpiralGRPOTrainer takes reward "
                                 "functions f(prompts, completions, **columns) -> list[float] (wrap a reward model)")
        if train_dataset is None or not hasattr(train_dataset, "__len__"):
            raise ValueError("SpiralGRPOTrainer needs a train_dataset with a length (a datasets.Dataset): dynamic "
                             "sampling redraws problems from it")
        args = args if args is not None else trl_args.grpo_config(spiral_config)
        cfg = trl_args.spiral_train_config(spiral_config, args)
        trl_args.check_grpo_config(args, cfg)
        problems = [problem_from_record(row, Columns(problem="prompt"), False, f"train_dataset row {i}")
                    for i, row in enumerate(train_dataset)]
        if not problems:
            raise ValueError("train_dataset holds no problems")
        torch.manual_seed(cfg.seed)  # peft draws LoRA's A from here
        super().__init__(model, reward_funcs, args, train_dataset, None, processing_class, None, callbacks,
                         optimizers, peft_config=peft_config if peft_config is not None else lora_config(cfg),
                         **kwargs)
        self.spiral, self.metrics_path, self.last_rollouts = cfg, None, None
        rank = self.accelerator.process_index  # each process draws its own sets; process 0's are train.py's
        self._np_rng = np.random.default_rng(cfg.seed if rank == 0 else [cfg.seed, rank])
        problems = self._drop_long_prompts(problems)
        self._redraw = train.ProblemStream(problems, cfg.seed)  # dynamic sampling's extra problems
        self._row, self._stats, self._rollout_end = {}, None, 0.0
        self.rewards = trl_rewards.TraceRewards(self)  # TRL's batches and columns (trl_rewards.py)
        self.add_callback(SpiralStateCallback(self))
        eos = rollout.eos_token_ids(self.model, self.processing_class)[0]
        ids = rollout.chat_prompt_ids(self.processing_class, rollout.search_prompt(problems[0].problem))
        # the probe, with TRL's types (an empty completion is its EOS alone): a reward that fails here would in training
        self.rewards.score([problems[0]], [Completion(ids, [eos], [0.0], "", False)])
        self._pending_metrics.clear()
        self.rewards.reset()

    def _drop_long_prompts(self, problems: list[Problem]) -> list[Problem]:
        """The problems whose search prompt fits --max_prompt_tokens (train.py drops them the same way); the dataset
        TRL samples from is cut to them, with one line saying how many went."""
        tokenizer, limit = self.processing_class, self.spiral.max_prompt_tokens
        kept = [i for i, p in enumerate(problems)
                if len(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(p.problem))) <= limit]
        if not kept:
            raise cli.ConfigError(f"every problem's prompt is longer than --max_prompt_tokens {limit}")
        if len(kept) < len(problems):
            if self.accelerator.is_main_process:
                print(f"trl_spiral.py: dropped {len(problems) - len(kept)} of {len(problems)} problems longer than "
                      f"{limit} prompt tokens")
            self.train_dataset = self.train_dataset.select(kept)
        return [problems[i] for i in kept]

    def _generate_and_score_completions(self, inputs):
        """Algorithm 1, lines 1-13 and line 15's advantage for this process's problems (spiral.collect_spiral), as
        the padded tensors TRL's training step takes: one row per trace, B = len(inputs) rows.

        TRL repeats each problem num_generations = N1 + K N2 times in `inputs`; a kept problem fills its rows with
        its N1 search and K N2 aggregation traces, and advantage-0 rows fill what dropped problems leave.
        """
        cfg, G, tokenizer = self.spiral, self.num_generations, self.processing_class
        problems = [problem_from_record(x, Columns(problem="prompt"), False, "a TRL batch row")
                    for x in inputs[::G]]  # (B / G,) problems x
        queue = list(problems)
        several = self.accelerator.num_processes > 1  # every process must make the same generate calls: no redraw
        generate = spiral.generate
        if self.use_vllm:
            if self.state.global_step != self._last_loaded_step:  # push the LoRA-merged weights to vLLM, as TRL does
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            generate = vllm_generate(self)
        self.rewards.reset()  # TRL's reward functions score what `generate` returns, in TRL's batches
        backend = mock.patch.object(spiral, "generate", self.rewards.scoring(generate))  # collect_spiral: no generate=
        start = time.perf_counter()
        if self.use_vllm:  # vLLM generates; the model is only read (generation_config), so nothing is gathered
            gathered = contextlib.nullcontext(self.accelerator.unwrap_model(self.model))
        else:  # as TRL's own generation: ZeRO-3's parameters gathered (hooks off) for the rollout, so each process
            # generates alone. (FSDP would gather per forward, a collective: parse_args refuses it without vLLM.)
            gathered = unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
        draw = self.rewards.drawing(lambda: queue.pop(0) if queue else self._redraw())  # the step's, then redraws
        with gathered as unwrapped, torch.no_grad(), backend:
            model = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped  # LoRA inside
            rollouts = spiral.collect_spiral(
                model, tokenizer, draw, batch_problems=len(problems),
                num_search=cfg.num_search, set_size=cfg.set_size, num_sets=cfg.num_sets,
                num_aggregations=cfg.num_aggregations, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                target_length=cfg.target_length, rng=self._np_rng,
                max_draws=len(problems) if several else (cfg.max_draws or 4 * len(problems)),
                micro_batch_size=cfg.generation_batch_size, tokens_per_micro_batch=cfg.generation_tokens,
                search_advantage_scale=1 / train.gradient_scale_M(cfg) if cfg.unbiased_set_rl else 1.0,
                search_advantage=cfg.search_advantage, reward_fn=self.rewards.reward)
        seconds = time.perf_counter() - start
        self.last_rollouts = rollouts

        samples = rollouts.samples  # kept problems only: |B| (N1 + K N2) <= len(inputs)
        eos_ids = rollout.eos_token_ids(model, tokenizer)
        eos = eos_ids[0]
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
        trl_rewards.log_trl_columns(self, samples, eos_ids)
        tokens = rollouts.metrics["tokens_generated"]
        self._row = {**rollouts.metrics, "train/loss_normalizer": C, "time/rollout_s": seconds,
                     "time/generated_tokens_per_s": tokens / max(seconds, 1e-9)}
        self._stats = {"loss": 0.0, "samples": 0, "tokens": 0, "ratios": [], "entropy": {}}
        self._rollout_end = time.perf_counter()
        return {key: value.to(device) for key, value in output.items()}

    def _compute_loss(self, model, inputs):
        """Algorithm 1, lines 14-18 on one micro-batch: train.importance_sampling_loss over its completion tokens,

            loss = -(1/C) sum_t exp(log pi_theta(y_t) - log pi_sampler(y_t)) A_t,

        with the whole batch's C, so micro-batches and processes add up to train.py's loss (loss_is_scaled_for_ga).
        pi_theta's log-probs come from TRL's own forward (through the DDP wrapper, so gradients are synchronised), at
        the sampling temperature.
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
        loss, ratio_T = train.importance_sampling_loss(logps_BT[mask_BT], sampler_BT[mask_BT], adv_BT[mask_BT],
                                                       float(inputs["normalizer"]))
        entropy_T = entropy_BT[mask_BT].detach().float()  # (T,), float32: bf16 could not count past 256 exactly
        # TRL's column: mean over the trained tokens of all processes, as one all-reduce of [sum, count] (float32)
        totals = self.accelerator.reduce(torch.stack([entropy_T.sum(), entropy_T.new_tensor(entropy_T.numel())]),
                                         reduction="sum")  # (2,); one process: a copy
        self._metrics["train"]["entropy"].append(float(totals[0] / totals[1].clamp(min=1)))
        if self._stats is not None:  # train.py's train/* metrics, over trained samples only
            s = self._stats
            s["loss"] += loss.item()
            s["samples"] += int(trained_B.sum())
            s["tokens"] += int(attention_mask[trained_B].sum())
            s["ratios"].append(ratio_T.detach())
            for role, rows_B in [("search", trained_B & inputs["is_search"]), ("aggregation",
                                                                               trained_B & ~inputs["is_search"])]:
                s["entropy"].setdefault(role, []).append(entropy_BT[rows_B][mask_BT[rows_B]].detach())
        return loss

    def _train_metrics(self) -> dict[str, float]:
        s = self._stats
        return train.loss_metrics(s["loss"], s["samples"], s["tokens"], s["ratios"], s["entropy"])

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, plus train.py's metrics row (the same columns) after each optimizer step."""
        if self._row and "loss" in logs:
            row = {"step": self.state.global_step, **self._row, **self._train_metrics()}
            if logs.get("grad_norm") is not None:  # before clipping, as train.py's
                row["train/grad_norm"] = float(logs["grad_norm"])
            row |= {"data/epoch": int(self.state.epoch or 0), "time/train_s": time.perf_counter() - self._rollout_end}
            self._row = {}
            # TRL's trackers prefix every key with train/ (transformers' rewrite_logs): train.py's train/* columns go
            # without theirs, and where TRL logs the same quantity (loss, grad_norm) TRL's value stands.
            logs.update({key.removeprefix("train/"): value for key, value in row.items()
                         if key != "step" and key.removeprefix("train/") not in logs})
            if self.accelerator.is_main_process and self.metrics_path:
                checkpoint.append_metrics(self.metrics_path, row)
                print(f"trl_spiral.py: step {row['step']}/{self.state.max_steps}: accuracy search "
                      f"{row['search_accuracy']:.3f}, aggregation {row['aggregation_accuracy']:.3f}; problems kept "
                      f"{row['problems_kept']}/{row['problems_drawn']}", flush=True)
        super().log(logs, start_time)

    hub_failure = None  # the first failed upload (--push_to_hub), said in one line when the run ends

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """transformers' upload of a checkpoint (--push_to_hub); a failure (the network, the Hub) is kept, not raised,
        so the run completes on every process, with SPIRAL's state in the checkpoint, and ends in one line."""
        try:
            super()._push_from_checkpoint(checkpoint_folder)
        except Exception as exc:
            if not trl_run.hub_error(exc):
                raise
            self.hub_failure = self.hub_failure or exc

    def create_model_card(self, *args, **kwargs):
        """No README.md in the run directory: it could not be told from a user's file (see checkpoint.RUN_ENTRY)."""

    # SPIRAL's sampling state in TRL's checkpoints, so that --resume_from_checkpoint equals an unbroken run.

    def spiral_state(self) -> dict:
        return {"numpy": self._np_rng.bit_generator.state, "data": self._redraw.state()}

    def load_spiral_state(self, checkpoint_dir: str) -> None:
        """This process's entry of checkpoint_dir/spiral_state.json: set draws and redraws continue where they were."""
        states = read_spiral_states(checkpoint_dir, self.accelerator.num_processes)
        state = states[self.accelerator.process_index]
        self._np_rng.bit_generator.state = state["numpy"]
        self._redraw = train.ProblemStream(self._redraw.problems, self.spiral.seed,
                                           **checkpoint.data_position({"data": state["data"]}, self._redraw.problems))


class SpiralStateCallback(TrainerCallback):
    """After TRL writes OUT/checkpoint-N, process 0 adds spiral_state.json with every process's SPIRAL state (the
    other processes write nothing there), and the old run that --overwrite moved aside is deleted."""

    def __init__(self, trainer: SpiralGRPOTrainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        from accelerate.utils import gather_object

        states = gather_object([self.trainer.spiral_state()])  # one per process, in process order
        if self.trainer.accelerator.is_main_process:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", STATE_FILE)
            write_json_atomic(path, {"processes": states})
            checkpoint.delete_moved_aside(args.output_dir)
        return control


# ======================================================================================================================
# Plumbing below: input validation (the command line itself is trl_args.parse_args) and the run directory.


def resolve(argv) -> tuple[train.TrainConfig, GRPOConfig, list[Problem]]:
    """Flags -> (TrainConfig, GRPOConfig, problems), every check done and nothing written; ConfigError if bad."""
    if MISSING is not None:
        raise cli.ConfigError(f"needs trl and peft ({MISSING}); pip install trl=={TESTED_WITH['trl']} "
                              f"peft=={TESTED_WITH['peft']}")
    _, args, cfg = trl_args.parse_args(argv)
    trl_run.check_resume_path(args.resume_from_checkpoint, cfg.out)
    if args.reward_weights is not None and len(args.reward_weights) != 1:
        raise cli.ConfigError(f"--reward_weights {args.reward_weights}: one weight per reward function, and "
                              "trl_spiral.py has one (--reward, or the math grader)")
    try:
        problems = cli.validate(cfg, resume_flag="--resume_from_checkpoint")
        cli.task_reward(cfg.reward, problems)  # --reward: imported and probed on one problem now
    except cli.ConfigError as exc:
        raise cli.ConfigError(trl_args.trl_flag_names(str(exc))) from None
    if args.use_vllm and not (torch.cuda.is_available() and _installed("vllm")):
        raise cli.ConfigError("--use_vllm needs a CUDA GPU and vllm (pip install trl[vllm])")
    if (trl.__version__, peft.__version__) != (TESTED_WITH["trl"], TESTED_WITH["peft"]) and args.process_index == 0:
        print(f"trl_spiral.py: checked with trl {TESTED_WITH['trl']} and peft {TESTED_WITH['peft']}; you have trl "
              f"{trl.__version__} and peft {peft.__version__}, whose private GRPOTrainer methods may differ")
    return cfg, args, problems


def _installed(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def build_trainer(cfg: train.TrainConfig, args, model, tokenizer, problems) -> SpiralGRPOTrainer:
    """SpiralGRPOTrainer for `model` (a transformers causal LM; peft adds the LoRA) on `problems`, whose every column
    reaches the reward: --reward's r(x, y) in TRL's signature (task.trl_reward), or the math grader."""
    from datasets import Dataset

    column = Columns.parse(cfg.data_columns).problem  # the prompt as the file holds it: text or one user message
    rows = [{**p.fields, "prompt": p.fields.get(column, p.problem), "answer": p.answer,
             **({"id": p.id} if p.id is not None else {})} for p in problems]  # the id: in the data's fingerprint
    reward_funcs = [task.trl_reward(task.checked(task.load_reward(cfg.reward), cfg.reward))] if cfg.reward else None
    columns = list(dict.fromkeys(key for row in rows for key in row))  # from_list would keep only row 0's columns
    dataset = Dataset.from_dict({key: [row.get(key) for row in rows] for key in columns})
    return SpiralGRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
                             processing_class=tokenizer, peft_config=lora_config(cfg), spiral_config=cfg)


def _on_main(args, action) -> None:
    """Run `action` on process 0 only; every process raises its ConfigError/CheckpointError, so none is left waiting."""
    error = None
    if args.process_index == 0:
        try:
            action()
        except (cli.ConfigError, checkpoint.CheckpointError) as exc:
            error = str(exc)
    if args.world_size > 1:
        box = [error]
        torch.distributed.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise cli.ConfigError(error)


def adapter_digest(model) -> str:
    """sha256 of the trainable (LoRA) weights: equal on every process of a DDP run, or the processes diverged."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def run(cfg: train.TrainConfig, args, problems: list[Problem]) -> SpiralGRPOTrainer | None:
    """Load the policy, build the trainer, train to --max_steps; OUT/metrics.jsonl, OUT/checkpoint-N (TRL's, every
    --save_steps), OUT/adapter (PEFT format). Process 0 alone locks and writes OUT (TRL adds each process's RNG state
    to its checkpoints). A resume from a checkpoint at --max_steps trains nothing (None; trl_run.finish)."""
    from transformers import PrinterCallback

    if cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)
    resume_from = resume_checkpoint(cfg, args)
    step = None
    if resume_from:
        with open(os.path.join(resume_from, "trainer_state.json"), encoding="utf-8") as f:
            step = json.load(f)["global_step"]  # metrics.jsonl is cut back to it: the later steps are redone
        if step >= args.max_steps:  # the run is complete (transformers' loop would train one step more)
            _on_main(args, lambda: (checkpoint.lock_run_dir(cfg.out), trl_run.finish(resume_from, cfg.out)))
            if args.process_index == 0:
                print(f"trl_spiral.py: {resume_from} is at --max_steps {args.max_steps}: nothing left to train; the "
                      f"run is as it was (adapter in {os.path.join(cfg.out, 'adapter')})")
            return None
    try:
        model, tokenizer = rollout.load_policy(cfg.model, device=str(args.device), dtype=cfg.dtype)
    except Exception as exc:  # noqa: BLE001 - a bad model directory fails in many ways; one line names it
        raise cli.ConfigError(f"--model_name_or_path {cfg.model}: cannot load it ({checkpoint.first_line(exc)})")

    def claim_run_dir():  # one writer per run directory, as train.py; then config.json (or the metrics cut back)
        checkpoint.lock_run_dir(cfg.out)
        checkpoint.prepare_run_dir(cfg.out, config={**dataclasses.asdict(cfg), "trl": args.to_dict(),
                                                    "gradient_scale_M": train.gradient_scale_M(cfg),
                                                    "versions": checkpoint.versions(args.device)
                                                    | trl_args.engine_versions()},
                                   overwrite=cfg.overwrite, resume_step=step)

    _on_main(args, lambda: trl_run.check_hub(args))  # before anything is written
    _on_main(args, claim_run_dir)
    trainer = build_trainer(cfg, args, model, tokenizer, problems)
    trainer.remove_callback(PrinterCallback)  # one line per step instead (SpiralGRPOTrainer.log)
    trainer.metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    if resume_from:
        trainer.load_spiral_state(resume_from)
    trainer.train(resume_from_checkpoint=resume_from)
    try:
        trainer.save_model(os.path.join(cfg.out, "adapter"))  # every process (ZeRO-3/FSDP gather); process 0 writes
    except Exception as exc:  # --push_to_hub: the adapter is written, then uploaded
        if not (args.push_to_hub and trl_run.hub_error(exc)):
            raise
        trainer.hub_failure = trainer.hub_failure or exc
    digests = [adapter_digest(trainer.model)]
    if args.world_size > 1 and not (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled):
        from accelerate.utils import gather_object
        digests = gather_object(digests)
        if len(set(digests)) != 1:
            raise RuntimeError(f"the {args.world_size} processes ended with different adapters: {digests}")
    if args.process_index == 0:
        checkpoint.delete_moved_aside(cfg.out)  # the new run is complete even if it saved no checkpoint
        same = f"; the same adapter on all {len(digests)} processes" if len(digests) > 1 else ""
        print(f"trl_spiral.py: done; adapter in {os.path.join(cfg.out, 'adapter')} (sha256 {digests[0][:12]}{same})")
    if trainer.hub_failure is not None:
        failure = checkpoint.first_line(trainer.hub_failure)
        raise cli.ConfigError(f"--push_to_hub: an upload to the Hub failed ({failure}); the run is complete in "
                              f"{cfg.out} (upload it later with `hf upload`)")
    return trainer


def main(argv: list[str] | None = None) -> int:
    """Parse and validate (one-line errors, exit 2, nothing written), then train; Ctrl-C: one line, exit 130."""
    cfg = None
    checkpoint.quiet_libraries()
    try:
        cfg, args, problems = resolve(sys.argv[1:] if argv is None else argv)
        run(cfg, args, problems)
    except (cli.ConfigError, checkpoint.CheckpointError) as exc:
        print(f"trl_spiral.py: error: {exc}", file=sys.stderr)
        return 2
    except task.RewardError as exc:  # the task's reward failed in training: TRL's checkpoints stay good
        exc.__traceback__ = exc.__context__ = None
        print(f"trl_spiral.py: error: {exc}; stopped (--resume_from_checkpoint true continues from the last "
              "checkpoint)", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        exc.__traceback__ = None
        print("trl_spiral.py: interrupted; continue from the last checkpoint with --resume_from_checkpoint true "
              "(and the same flags)", file=sys.stderr)
        return 130
    finally:
        if cfg is not None:
            checkpoint.unlock_run_dir(cfg.out)  # only process 0 holds it; removes an OUT it created if still empty
    return 0


if __name__ == "__main__":
    sys.exit(main())
