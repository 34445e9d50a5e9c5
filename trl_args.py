"""trl_spiral.py's settings: SPIRAL's own arguments, TRL's (GRPOConfig) under TRL's names with train.py's values as
defaults, and the TRL settings that SPIRAL pins or derives; `parse_args` reads them through TRL's TrlParser, with
`--config recipe.yaml` as TRL scripts take it.

Precedence: command-line flags > the --config YAML > the preset's train.py values > TRL's defaults. A pinned setting
given another value, or a derived one set to something else, is a one-line error that says why (cli.ConfigError).
Plumbing, not SPIRAL: trl_spiral.py holds the algorithm's side.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import typing
import warnings
from dataclasses import dataclass

import torch

import checkpoint
import cli
import rollout
import train

try:
    from trl import GRPOConfig, TrlParser
except ImportError:  # trl_spiral.main says so in one line
    GRPOConfig = TrlParser = None

@dataclass
class SpiralArguments:
    """SPIRAL's settings, with train.py's meaning; a value left unset is the preset's (train.PRESETS)."""

    preset: typing.Literal["paper", "tiny"] = train.option("paper", "paper: the appendix's table (GPUs); tiny: the "
                                                           "CPU demo's model, data and settings")
    model_name_or_path: str | None = train.option(None, "base model: a Hugging Face id, a local directory or 'tiny'")
    dataset_name: str | None = train.option(None, "training problems: bundled set, JSONL file or Hub id")
    overwrite: bool = train.option(False, "replace the run directory in --output_dir (train.py's --overwrite)")
    batch_problems: int | None = train.option(None, "|B|: problems with a non-zero advantage per step, per process")
    max_draws: int | None = train.option(None, "stop drawing problems for a step after this many (default 4 x |B|)")
    num_search: int | None = train.option(None, "N1: search traces per problem (Algorithm 1, line 2)")
    set_size: int | None = train.option(None, "n: search traces per set (line 5)")
    num_sets: int | None = train.option(None, "K: sets drawn per problem, without replacement (line 5)")
    num_aggregations: int | None = train.option(None, "N2: aggregation traces per set (line 7)")
    max_prompt_tokens: int | None = train.option(None, "drop training problems whose search prompt is longer")
    target_length: int | None = train.option(None, "L_target of the appendix's length-aware advantage (default off)")
    unbiased_set_rl: bool = train.option(False, "divide the search traces' advantages by M of Proposition 3.1")
    search_advantage: typing.Literal["set", "own"] | None = train.option(
        None, "Algorithm 1 line 13: set (SPIRAL) or own (the ablation: search traces on their own reward)")
    lora_r: int | None = train.option(None, "LoRA rank r (paper: 32)")
    lora_alpha: float | None = train.option(None, "LoRA alpha, update scaled by alpha / r")
    dtype: typing.Literal["auto", "bfloat16", "float32"] = train.option("auto", "model weights (auto: bfloat16 on "
                                                                        "a GPU, float32 on a CPU); sets TRL's bf16")
    cpu_threads: int | None = train.option(None, "torch threads on a CPU (default: torch's choice; tiny: 1)")
    reward: str | None = train.option(None, "the task's reward r(x, y), MODULE:FUNCTION or PATH.py:FUNCTION taking "
                                            "(problem, completion_text) -> float, as train.py's (default: the math "
                                            "grader)")
    data_columns: str | None = train.option(None, "columns of --dataset_name: problem=COL,answer=COL,id=COL (as "
                                                  "train.py's --data-columns)")


# train.TrainConfig field -> TRL's name for it. TRL's flag takes train.py's (preset's) value as its default.
TRL_NAMES = {"steps": "max_steps", "out": "output_dir", "seed": "seed", "lr": "learning_rate",
             "temperature": "temperature", "max_new_tokens": "max_completion_length", "weight_decay": "weight_decay",
             "adam_beta1": "adam_beta1", "adam_beta2": "adam_beta2", "adam_eps": "adam_epsilon",
             "max_grad_norm": "max_grad_norm", "gradient_checkpointing": "gradient_checkpointing",
             "save_every": "save_steps"}
SPIRAL_NAMES = {"model_name_or_path": "model", "dataset_name": "data", "lora_r": "lora_rank"}  # the rest: same name

# ----------------------------------------------------------------------------------------------------------------------
# Every GRPOConfig field of trl 1.16.0, and what SPIRAL does with it (tests/test_trl_spiral.py walks
# dataclasses.fields(GRPOConfig): a field TRL adds fails that test until it is classified here).
#   honoured    used with TRL's meaning (by TRL's Trainer machinery that SpiralGRPOTrainer keeps, or by SPIRAL itself)
#   pinned      only the listed values are accepted (the first is what trl_spiral.py sets): another value would change
#               the update away from Algorithm 1's, or would be ignored because SPIRAL replaces what it configures
#   derived     follows from N1, K, N2, |B|, --gradient_accumulation_steps and --dtype (derived_settings)
#   irrelevant  no effect in any configuration SPIRAL accepts, as in TRL's own GRPOTrainer (the reason says why)


@dataclass(frozen=True)
class Rule:
    kind: str  # "honoured", "pinned", "derived" or "irrelevant"
    why: str
    values: tuple = ()  # pinned: the accepted values, the first is trl_spiral.py's
    only_if: str | None = None  # pinned: the pin holds only while this boolean field is true


def honoured(why: str) -> Rule:
    return Rule("honoured", why)


def pinned(*values, why: str, only_if: str | None = None) -> Rule:
    return Rule("pinned", why, values, only_if)


def derived(why: str) -> Rule:
    return Rule("derived", why)


def irrelevant(why: str) -> Rule:
    return Rule("irrelevant", why)


_PLAIN = "the loss is for plain sampling from softmax(logits / T)"
_LOSS = "SPIRAL's loss (train.importance_sampling_loss) replaces TRL's loss, which this configures"
_NO_EVAL = "evaluation never runs (eval_strategy and eval_on_start are pinned; evaluate.py evaluates)"
_TRL = "TRL's Trainer, as in TRL"
_VLLM = "TRL's vLLM engine samples both stages (--use_vllm; not run here: no GPU)"
_HUB = "TRL's Hub upload of the checkpoints (not run here: no network)"
_CLI_LOADS = ("when the model is given by name, TRL loads it with this (trl_spiral.py loads the model itself and "
              "refuses it)")
FIELDS: dict[str, Rule] = {
    "output_dir": honoured("the run directory (train.py's --out)"),
    "per_device_train_batch_size": derived("|B| (N1 + K N2) / gradient_accumulation_steps rows per micro-batch"),
    "num_train_epochs": pinned(3.0, why="SPIRAL counts optimizer steps (max_steps), and TRL ignores epochs then"),
    "max_steps": honoured("optimizer steps (train.py's --steps); must be positive"),
    "learning_rate": honoured("AdamW's learning rate (train.py's --lr; TRL's default 1e-6, the paper's 2e-5)"),
    "lr_scheduler_type": honoured("TRL's schedule (SPIRAL's default: constant, the paper's; constant_with_warmup when "
                                  "--warmup_steps asks for a warm-up and no schedule is named)"),
    "warmup_steps": honoured("the schedule's warm-up; refused with a schedule that has none (constant)"),
    "lr_scheduler_kwargs": honoured("the schedule's own settings; refused where transformers would ignore them or "
                                    "fail on them at the first step"),
    "optim": honoured("TRL builds the optimizer (SPIRAL's default adamw_torch: train.py's AdamW)"),
    "weight_decay": honoured("train.py's --weight-decay"),
    "adam_beta1": honoured("train.py's --adam-beta1"),
    "adam_beta2": honoured("train.py's --adam-beta2 (TRL's default 0.999, SPIRAL's 0.95)"),
    "adam_epsilon": honoured("train.py's --adam-eps"),
    "gradient_accumulation_steps": honoured("micro-batches per optimizer step; a divisor of |B| (N1 + K N2)"),
    "average_tokens_across_devices": irrelevant("only scales TRL's num_items_in_batch, which GRPOTrainer's loss never "
                                                "reads (SPIRAL's divides by the constant C)"),
    "max_grad_norm": honoured("train.py's --max-grad-norm"),
    "label_smoothing_factor": pinned(0.0, why=_LOSS),
    "bf16": derived("--dtype: bfloat16 weights on a GPU (or under accelerate's mixed_precision bf16)"),
    "fp16": pinned(False, why="SPIRAL trains in bfloat16 or float32 (--dtype)"),
    "bf16_full_eval": pinned(False, why=_NO_EVAL),
    "fp16_full_eval": pinned(False, why=_NO_EVAL),
    "activation_checkpointing": honoured("gradient_checkpointing's name in transformers 5.2x"),
    "activation_checkpointing_kwargs": honoured("gradient_checkpointing_kwargs's name in transformers 5.2x"),
    "gradient_checkpointing": honoured("train.py's --gradient-checkpointing"),
    "gradient_checkpointing_kwargs": honoured("SPIRAL's default: use_reentrant False, as train.py"),
    "torch_compile": pinned(False, why="not checked: the rollout samples from the model TRL would compile"),
    "torch_compile_backend": pinned(None, why="sets torch_compile, which is pinned"),
    "torch_compile_mode": pinned(None, why="sets torch_compile, which is pinned"),
    "use_liger_kernel": pinned(False, why="Liger's fused GRPO loss would replace SPIRAL's"),
    "liger_kernel_config": pinned(None, why="Liger's kernels are off (use_liger_kernel)"),
    "use_cache": irrelevant("the rollout always decodes with a KV cache; the learner's forward needs none"),
    "neftune_noise_alpha": pinned(None, why="NEFTune's noise on the embeddings would make the learner's log-probs "
                                            "another policy's than the sampler's"),
    "auto_find_batch_size": pinned(False, why="the batch must hold whole problems (TRL refuses it too)"),
    "logging_strategy": pinned("steps", why="metrics.jsonl has one row per optimizer step, as train.py's"),
    "logging_steps": pinned(1, why="metrics.jsonl has one row per optimizer step, as train.py's"),
    "logging_first_step": irrelevant("every step is logged (logging_steps 1), the first included"),
    "logging_nan_inf_filter": honoured("TRL's logged loss"),
    "include_num_input_tokens_seen": pinned("no", False, why="SpiralGRPOTrainer counts num_tokens itself, as "
                                                              "GRPOTrainer"),
    "disable_tqdm": honoured("SPIRAL's default True: one line per step instead"),
    "report_to": honoured("TRL's trackers; a tracker that is not installed is refused before anything is written"),
    "eval_strategy": pinned("no", why="SPIRAL's evaluation is evaluate.py (GRPOTrainer's would score GRPO groups)"),
    "eval_on_start": pinned(False, why="SPIRAL's evaluation is evaluate.py"),
    "save_only_model": honoured("TRL's checkpoints then hold no optimizer state, so a resume is not an unbroken run"),
    "save_steps": honoured("train.py's --save-every"),
    "load_best_model_at_end": pinned(False, why="needs evaluation, which is evaluate.py's"),
    "ignore_data_skip": honoured("True: a resumed run reads other problems than the unbroken run would"),
    "seed": honoured("train.py's --seed: LoRA's initialisation, the problem order, the set draws"),
    "data_seed": pinned(None, why="GRPOTrainer's sampler draws the problems with `seed`"),
    "use_cpu": honoured("train.py's --device cpu"),
    "parallelism_config": pinned(None, why="context, sequence and tensor parallelism are not checked with SPIRAL's "
                                           "rollout"),
    "remove_unused_columns": pinned(False, why="every column must reach the reward (the answer, the user's columns)"),
    "label_names": irrelevant("no labels: the loss is SPIRAL's"),
    "train_sampling_strategy": pinned("random", why="GRPOTrainer's own sampler draws the problems (shuffle_dataset)"),
    "length_column_name": irrelevant("only with train_sampling_strategy group_by_length, which is pinned"),
    "fsdp": honoured("with --use_vllm only (FSDP's per-layer gathers would deadlock the rollout)"),
    "fsdp_config": honoured("with --use_vllm only, as fsdp"),
    "deepspeed": honoured("ZeRO-3 (recipe/trl/zero3.yaml); needs the deepspeed package"),
    "do_train": irrelevant("read by scripts, not by the Trainer: trl_spiral.py always trains"),
    "do_eval": irrelevant("read by scripts, not by the Trainer; " + _NO_EVAL),
    "do_predict": irrelevant("read by scripts, not by the Trainer"),
    "resume_from_checkpoint": honoured("trl_spiral.py resumes from it (in a script of your own, pass it to "
                                       "trainer.train(), as TRL's scripts do)"),
    "local_rank": irrelevant("set by the launcher"),
    "model_init_kwargs": honoured(_CLI_LOADS),
    "trust_remote_code": honoured(_CLI_LOADS),
    "router_aux_loss_coef": pinned(None, 0.0, why="SPIRAL's loss has no MoE load-balancing term"),
    "cast_lm_head_to_fp32": honoured("TRL casts the model's lm_head, which the rollout and the learner share"),
    "num_generations": derived("N1 + K N2: each problem's rows are one TRL group"),
    "max_completion_length": honoured("L, train.py's --max-new-tokens"),
    "ds3_gather_for_generation": pinned(True, why="ZeRO-3's weights are gathered once for the whole rollout, whose "
                                                  "forward calls differ in number between processes"),
    "shuffle_dataset": honoured("TRL's sampler shuffles the problems, or reads them in order"),
    "pad_to_multiple_of": pinned(None, why="only TRL's own generation pads to it; SPIRAL's rollout does not"),
    "generation_batch_size": derived("per_device_train_batch_size x processes x steps_per_generation: one "
                                     "generation per optimizer step"),
    "steps_per_generation": derived("gradient_accumulation_steps: one generation per optimizer step"),
    "temperature": honoured("T, train.py's --temperature (the loss's log-probs use it too)"),
    "top_p": pinned(1.0, why=_PLAIN),
    "top_k": pinned(0, why=_PLAIN),
    "min_p": pinned(None, why=_PLAIN),
    "generation_kwargs": pinned(None, why=_PLAIN + "; the rollout takes no other generation settings"),
    "chat_template_kwargs": pinned(None, why="the rollout applies the model's chat template as train.py does"),
    "repetition_penalty": pinned(1.0, why=_PLAIN),
    "cache_implementation": pinned(None, why="only TRL's own generation uses it; SPIRAL's rollout keeps its cache"),
    "vllm_structured_outputs_regex": pinned(None, why=_PLAIN),
    "beta": pinned(0.0, why="SPIRAL has no KL term"),
    "num_iterations": pinned(1, why="one optimizer step per batch of rollouts (the PPO ratio stays 1)"),
    "epsilon": pinned(0.2, why=_LOSS + " (its clip; the ratio is untruncated)"),
    "delta": pinned(None, why=_LOSS + " (its two-sided clip)"),
    "epsilon_high": pinned(None, why=_LOSS + " (its upper clip)"),
    "sapo_temperature_neg": pinned(1.05, why=_LOSS),
    "sapo_temperature_pos": pinned(1.0, why=_LOSS),
    "vespo_k_pos": pinned(2.0, why=_LOSS),
    "vespo_lambda_pos": pinned(3.0, why=_LOSS),
    "vespo_k_neg": pinned(3.0, why=_LOSS),
    "vespo_lambda_neg": pinned(2.0, why=_LOSS),
    "importance_sampling_level": pinned("token", why="SPIRAL's ratio pi_theta / pi_sampler is per token"),
    "reward_weights": honoured("the weights of reward_funcs, summed as TRL sums them (None skipped)"),
    "multi_objective_aggregation": pinned("sum_then_normalize", why="the weighted rewards are summed, then SPIRAL's "
                                                                    "advantages centre them (no normalisation)"),
    "scale_rewards": pinned("none", why="SPIRAL's advantages are never divided by a std (TRL's default: group)"),
    "loss_type": pinned("dr_grpo", why=_LOSS + ", with a constant normaliser as dr_grpo's (TRL's default: dapo)"),
    "mask_truncated_completions": pinned(False, why="truncated traces are trained as train.py trains them"),
    "sync_ref_model": pinned(False, why="no reference model (beta 0)"),
    "ref_model_mixup_alpha": irrelevant("only with sync_ref_model, which is pinned off"),
    "ref_model_sync_steps": irrelevant("only with sync_ref_model, which is pinned off"),
    "top_entropy_quantile": pinned(1.0, why="every completion token is trained"),
    "entropy_coef": pinned(0.0, why="SPIRAL has no entropy bonus"),
    "use_adaptive_entropy": pinned(False, why="SPIRAL has no entropy bonus"),
    "entropy_coef_min": irrelevant("only with use_adaptive_entropy, which is pinned off"),
    "entropy_coef_max": irrelevant("only with use_adaptive_entropy, which is pinned off"),
    "entropy_coef_delta": irrelevant("only with use_adaptive_entropy, which is pinned off"),
    "entropy_target": irrelevant("only with use_adaptive_entropy, which is pinned off"),
    "max_tool_calling_iterations": pinned(None, why="SPIRAL's rollout calls no tools"),
    "vllm_importance_sampling_correction": pinned(False, why="the loss already weights each token by pi_theta / "
                                                            "pi_sampler", only_if="use_vllm"),
    "vllm_importance_sampling_mode": irrelevant("only with vllm_importance_sampling_correction, pinned off"),
    "vllm_importance_sampling_clip_max": irrelevant("only with vllm_importance_sampling_correction, pinned off"),
    "vllm_importance_sampling_clip_min": irrelevant("only with vllm_importance_sampling_correction, pinned off"),
    "vllm_importance_sampling_cap": irrelevant("only with vllm_importance_sampling_correction, pinned off"),
    "off_policy_mask_threshold": pinned(None, why="SPIRAL's loss masks no sequence"),
    "use_bias_correction_kl": irrelevant("only with a KL term, and beta is pinned to 0"),
    "log_completions": honoured("TRL's completions table, with SPIRAL's rewards and advantages"),
    "log_multimodal": irrelevant("SPIRAL's prompts are text"),
    "use_transformers_continuous_batching": pinned(False, why="generation is spiral.collect_spiral's"),
    "transformers_continuous_batching_config": irrelevant("only with continuous batching, which is pinned off"),
    "use_transformers_paged": pinned(False, why="generation is spiral.collect_spiral's"),
    **dict.fromkeys([
        "optim_args", "optim_target_modules", "tf32",
        "torch_empty_cache_steps", "log_on_each_node", "log_level", "log_level_replica", "run_name", "project",
        "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "save_strategy", "save_on_each_node",
        "save_total_limit", "enable_jit_checkpoint", "restore_callback_states_from_checkpoint", "full_determinism",
        "accelerator_config", "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
        "dataloader_persistent_workers", "dataloader_prefetch_factor", "dataloader_multiprocessing_context",
        "dataloader_in_order", "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
        "ddp_static_graph", "ddp_backend", "ddp_timeout", "debug", "skip_memory_metrics", "disable_dropout",
        "num_completions_to_print", "log_unique_prompts"], honoured(_TRL)),
    **dict.fromkeys([
        "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
        "hub_revision", "log_completions_hub_repo"], honoured(_HUB)),
    **dict.fromkeys([
        "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_server_base_url",
        "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
        "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size"], honoured(_VLLM)),
    **dict.fromkeys([
        "eval_steps", "eval_delay", "per_device_eval_batch_size", "prediction_loss_only", "eval_do_concat_batches",
        "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics",
        "metric_for_best_model", "greater_is_better", "num_generations_eval"], irrelevant(_NO_EVAL)),
}
PINNED = {name: (rule.values[0], rule.why) for name, rule in FIELDS.items() if rule.kind == "pinned"}
DERIVED = tuple(name for name, rule in FIELDS.items() if rule.kind == "derived")


def derived_settings(cfg: train.TrainConfig, gradient_accumulation_steps: int) -> dict:
    """TRL settings that follow from SPIRAL's: num_generations = N1 + K N2 (each problem's rows are one TRL group),
    |B| (N1 + K N2) rows per process and optimizer step (--gradient_accumulation_steps must divide them: ConfigError),
    generated once per step, bf16 as --dtype says."""
    G = cfg.num_search + cfg.num_sets * cfg.num_aggregations  # rows per problem: 24 in the paper
    rows = cfg.batch_problems * G  # per process and optimizer step
    if not (isinstance(gradient_accumulation_steps, int) and gradient_accumulation_steps >= 1
            and rows % gradient_accumulation_steps == 0):
        raise cli.ConfigError(f"--gradient_accumulation_steps must be a divisor of the {rows} rows per step "
                              f"(--batch_problems x (N1 + K N2)), got {gradient_accumulation_steps}")
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return {"num_generations": G, "per_device_train_batch_size": rows // gradient_accumulation_steps,
            "steps_per_generation": gradient_accumulation_steps,
            "bf16": rollout.resolve_dtype(cfg.dtype, device) == torch.bfloat16}


def check_grpo_config(args, cfg: train.TrainConfig) -> None:
    """The one check of a GRPOConfig against SPIRAL, for trl_spiral.py's command line and SpiralGRPOTrainer alike:
    every pinned field holds an accepted value, every derived one its derived value, and TRL's names for train.py's
    settings (TRL_NAMES) agree with the SPIRAL config `cfg`. cli.ConfigError (one line) says which and why."""
    check_pins(lambda name: getattr(args, name))
    if args.max_steps <= 0:
        raise cli.ConfigError(f"--max_steps {args.max_steps}: SPIRAL counts optimizer steps; set a positive max_steps "
                              "(train.py's --steps)")
    expected = derived_settings(cfg, args.gradient_accumulation_steps)
    expected["generation_batch_size"] = expected["per_device_train_batch_size"] * args.world_size * \
        expected["steps_per_generation"]
    for name, value in expected.items():
        if getattr(args, name) != value:
            raise cli.ConfigError(f"--{name} {getattr(args, name)}: SPIRAL derives it as {value} from N1, K, N2, "
                                  "--batch_problems, --gradient_accumulation_steps and --dtype; leave it unset (or "
                                  f"set {name}={value})")
    for name, trl_name in TRL_NAMES.items():
        if name != "save_every" and getattr(cfg, name) != getattr(args, trl_name):
            raise cli.ConfigError(f"--{trl_name} {getattr(args, trl_name)} differs from the SPIRAL config's {name} "
                                  f"{getattr(cfg, name)}; set one of them only")
    check_schedule(args)
    fsdp = bool(args.fsdp) or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")
    if fsdp and not args.use_vllm:  # FSDP gathers each layer at every forward, a collective every process must join
        raise cli.ConfigError("FSDP needs --use_vllm: SPIRAL's rollout makes a different number of forward calls on "
                              "each process, which FSDP's per-layer gathers would deadlock; use ZeRO-3 "
                              "(recipe/trl/zero3.yaml) or DDP, or sample with vLLM")


def check_schedule(args) -> None:
    """--lr_scheduler_type with --warmup_steps and --lr_scheduler_kwargs as transformers' get_scheduler takes them
    (built here on a stand-in optimizer), or cli.ConfigError: a warm-up on a schedule without one, settings a schedule
    ignores (constant, constant_with_warmup) or fails on (an unknown keyword, at the first step otherwise)."""
    from transformers.optimization import get_scheduler
    from transformers.trainer_utils import SchedulerType

    kind, settings = _plain(args.lr_scheduler_type), args.lr_scheduler_kwargs or {}
    if kind not in {t.value for t in SchedulerType}:  # GRPOConfig refuses it when built
        return
    if args.warmup_steps and kind in ("constant", "reduce_lr_on_plateau", "greedy"):
        raise cli.ConfigError(f"--warmup_steps {args.warmup_steps:g}: the {kind} schedule has no warm-up (transformers "
                              "would ignore it); use --lr_scheduler_type constant_with_warmup (or another with one)")
    if settings and kind in ("constant", "constant_with_warmup"):
        raise cli.ConfigError(f"--lr_scheduler_kwargs {json.dumps(settings)}: the {kind} schedule takes no settings "
                              "(transformers would ignore them)")
    try:
        get_scheduler(kind, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
                      num_warmup_steps=args.get_warmup_steps(args.max_steps), num_training_steps=args.max_steps,
                      scheduler_specific_kwargs=dict(settings))
    except (TypeError, ValueError) as exc:
        raise cli.ConfigError(f"--lr_scheduler_kwargs {json.dumps(settings)}: the {kind} schedule refuses them "
                              f"({checkpoint.first_line(exc)})") from None


def check_pins(value_of) -> None:
    """Every pinned field's value (value_of(name): a GRPOConfig's, or the command line's before TRL's post-init can
    raise on it) among the accepted ones, else cli.ConfigError naming the field, the pin and why."""
    for name, rule in FIELDS.items():
        if rule.kind != "pinned" or (rule.only_if and not value_of(rule.only_if)):
            continue
        value = _plain(value_of(name))
        if value not in rule.values:  # == (a bool is its int: fp16=0 is fp16=False)
            also = f" (or {', '.join(map(str, rule.values[1:]))})" if len(rule.values) > 1 else ""
            raise cli.ConfigError(f"--{name} {value}: SPIRAL pins it to {rule.values[0]}{also} ({rule.why})")


def _plain(value):
    """An enum (TRL's post-init turns "steps" into IntervalStrategy.STEPS) as its value."""
    return getattr(value, "value", value)


def spiral_train_config(spiral=None, args=None) -> train.TrainConfig:
    """The train.TrainConfig of a run: `spiral` as given (a TrainConfig), or from a SpiralArguments (None: the paper
    preset's) with TRL's names for train.py's settings read from the GRPOConfig `args` when given."""
    if isinstance(spiral, train.TrainConfig):
        return spiral
    spiral = spiral if spiral is not None else SpiralArguments()
    explicit = {SPIRAL_NAMES.get(f.name, f.name): getattr(spiral, f.name) for f in dataclasses.fields(SpiralArguments)
                if getattr(spiral, f.name) is not None}
    if args is not None:
        explicit |= {name: getattr(args, trl) for name, trl in TRL_NAMES.items() if name != "save_every"}
        explicit["device"] = "cpu" if args.use_cpu else None
    cfg = train.resolve_config(explicit)
    if not 1 <= cfg.set_size <= cfg.num_search or cfg.num_sets > math.comb(cfg.num_search, cfg.set_size):
        raise cli.ConfigError(f"N1 = {cfg.num_search}, n = {cfg.set_size}, K = {cfg.num_sets}: K sets of n distinct "
                              "search traces must exist among the C(N1, n) possible")
    return cfg


def grpo_config(spiral=None, **overrides):
    """SPIRAL's GRPOConfig, as trl_spiral.py's command line builds it: train.py's values under TRL's names, the pinned
    and derived settings, then `overrides` (GRPOConfig keywords; checked by check_grpo_config). `spiral`: a
    SpiralArguments or train.TrainConfig (None: the paper preset)."""
    cfg = spiral_train_config(spiral)
    if "use_cpu" in overrides:
        cfg.device = "cpu" if overrides["use_cpu"] else cfg.device
    values = trl_defaults(cfg) | {name: rule.values[0] for name, rule in FIELDS.items() if rule.kind == "pinned"}
    if isinstance(spiral, train.TrainConfig):  # its own run directory
        values["output_dir"] = cfg.out
    values |= derived_settings(cfg, overrides.get("gradient_accumulation_steps", 1)) | overrides
    args = _construct(values)
    check_grpo_config(args, cfg if isinstance(spiral, train.TrainConfig) else spiral_train_config(spiral, args))
    return args


def _construct(values: dict):
    """GRPOConfig(**values), its ValueErrors one line (cli.ConfigError)."""
    try:
        with warnings.catch_warnings():  # TRL 1.16 sets transformers 5.24's deprecated gradient_checkpointing alias
            warnings.filterwarnings("ignore", "`gradient_checkpointing", FutureWarning)  # itself: 4 lines every run
            return GRPOConfig(**values)
    except ValueError as exc:
        raise cli.ConfigError(checkpoint.first_line(exc).removeprefix("ValueError: ")) from None


def trl_defaults(cfg: train.TrainConfig) -> dict:
    """SPIRAL's defaults for TRL's settings: train.py's values (TRL's own in brackets in PORTING.md, "The loss")."""
    defaults = {TRL_NAMES[name]: getattr(cfg, name) for name in TRL_NAMES}
    return defaults | {"output_dir": os.path.join("runs", f"{cfg.preset}-trl"), "lr_scheduler_type": "constant",
                       "warmup_steps": 0, "optim": "adamw_torch", "use_cpu": cfg.device == "cpu", "disable_tqdm": True,
                       "gradient_checkpointing_kwargs": {"use_reentrant": False}}


# ----------------------------------------------------------------------------------------------------------------------
# The command line


class Parser(TrlParser or object):
    def error(self, message):  # one line, no usage block (cli.OneLineParser's rule)
        raise cli.ConfigError(message)


def _peek_preset(argv: list[str], config: dict) -> str:
    for i, arg in enumerate(argv):
        if arg == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--preset="):
            return arg.split("=", 1)[1]
    return config.get("preset", "paper")


def _read_config(argv: list[str]) -> dict:
    """--config PATH removed from argv and read: a YAML mapping of settings, with an optional `env:` mapping."""
    if "--config" not in argv:
        return {}
    i = argv.index("--config")
    if i + 1 >= len(argv):
        raise cli.ConfigError("--config expects a YAML file")
    path = argv[i + 1]
    del argv[i:i + 2]
    try:
        import yaml
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except Exception as exc:  # noqa: BLE001 - a missing or malformed file: one line
        raise cli.ConfigError(f"--config {path}: {checkpoint.first_line(exc)}") from None
    if not isinstance(config, dict):
        raise cli.ConfigError(f"--config {path}: expected a YAML mapping of settings")
    if not isinstance(config.get("env") or {}, dict):
        raise cli.ConfigError(f"--config {path}: env: must be a mapping of NAME: value (environment variables), got "
                              f"{type(config['env']).__name__}")
    return config


ACCELERATE_ENV = {"deepspeed": "ACCELERATE_USE_DEEPSPEED", "mixed_precision": "ACCELERATE_MIXED_PRECISION"}


def _launcher_settings(ns: dict) -> None:
    """What `accelerate launch --config_file` set in the environment, checked before TRL reads it: DeepSpeed needs its
    package; accelerate's mixed_precision bf16 makes --dtype auto bfloat16 (float32 contradicts it), fp16 is refused."""
    deepspeed = bool(ns["deepspeed"]) or os.environ.get(ACCELERATE_ENV["deepspeed"], "false").lower() in ("1", "true")
    if deepspeed and importlib.util.find_spec("deepspeed") is None:
        raise cli.ConfigError("DeepSpeed (recipe/trl/zero3.yaml, --deepspeed) needs the deepspeed package: pip install "
                              "deepspeed")
    precision = os.environ.get(ACCELERATE_ENV["mixed_precision"], "no").lower()
    if precision == "fp16":
        raise cli.ConfigError("accelerate's mixed_precision fp16: SPIRAL trains in bfloat16 or float32; use a config "
                              "with mixed_precision bf16 or no")
    if precision == "bf16" and ns["dtype"] == "float32":
        raise cli.ConfigError("--dtype float32 contradicts accelerate's mixed_precision bf16 (its --config_file); pass "
                              "--dtype bfloat16, or use a config with mixed_precision: no")
    if precision == "bf16":
        ns["dtype"] = "bfloat16"  # TRL's bf16 must then be True (DeepSpeed: "ds bf16.enabled=True vs hf bf16=False")


def _check_report_to(args) -> None:
    """Every tracker in --report_to installed: else one line now, not a traceback after config.json is written."""
    from transformers.integrations.integration_utils import get_available_reporting_integrations

    available = get_available_reporting_integrations()
    for name in args.report_to or []:
        if name not in available:
            package = {"comet_ml": "comet-ml", "azure_ml": "azureml-core", "flyte": "flytekit"}.get(name, name)
            raise cli.ConfigError(f"--report_to {name}: it is not installed (pip install {package})")


def parse_args(argv: list[str]):
    """Flags and --config YAML -> (SpiralArguments, GRPOConfig, TrainConfig); precedence: flags > YAML > the preset's
    train.py values > TRL's defaults. Checked by check_grpo_config (as SpiralGRPOTrainer checks a GRPOConfig) and the
    launcher's settings; ConfigError if bad; nothing written."""
    argv = list(argv)
    parser = Parser([SpiralArguments, GRPOConfig], prog="trl_spiral.py",
                    description="SPIRAL on TRL: Algorithm 1 with TRL's GRPOTrainer doing the optimisation")
    config = _read_config(argv)
    preset = _peek_preset(argv, config)
    if preset not in ("paper", "tiny"):
        raise cli.ConfigError(f"--preset {preset}: expected paper or tiny")
    base = train.resolve_config({"preset": preset})  # train.py's values for this preset
    parser.set_defaults(**trl_defaults(base), **{k: v for k, (v, _) in PINNED.items()}, **dict.fromkeys(DERIVED),
                        **{f.name: getattr(base, SPIRAL_NAMES.get(f.name, f.name))
                           for f in dataclasses.fields(SpiralArguments) if f.name not in ("preset", "overwrite")})
    unknown = parser.set_defaults_with_config(**{k: v for k, v in config.items() if k != "env"})
    if unknown:
        raise cli.ConfigError(f"--config: unknown setting {unknown[0].lstrip('-')}")
    for key, value in (config.get("env") or {}).items():  # TrlParser's `env:` block
        os.environ[key] = str(value)
    ns = vars(parser.parse_args(argv))
    check_pins(ns.get)  # before GRPOConfig's post-init, whose own errors would not say why SPIRAL pins them
    for name in ("model_init_kwargs", "trust_remote_code"):  # TRL's, for a model TRL loads; this script loads its own
        if ns[name]:
            raise cli.ConfigError(f"--{name}: trl_spiral.py loads the model itself (--model_name_or_path, --dtype)")
    _launcher_settings(ns)
    explicit = {SPIRAL_NAMES.get(f.name, f.name): ns[f.name] for f in dataclasses.fields(SpiralArguments)}
    explicit |= {name: ns[trl_name] for name, trl_name in TRL_NAMES.items() if name != "save_every"}
    explicit |= {"device": "cpu" if ns["use_cpu"] else None, "resume": ns["resume_from_checkpoint"] is not None}
    cfg = train.resolve_config(explicit)
    for name, value in derived_settings(cfg, ns["gradient_accumulation_steps"]).items():  # checks the division too
        if ns[name] is not None and ns[name] != value:
            raise cli.ConfigError(f"--{name} {ns[name]}: SPIRAL derives it as {value} from N1, K, N2, "
                                  "--batch_problems, --gradient_accumulation_steps and --dtype; leave it unset")
        ns[name] = value
    if ns["generation_batch_size"] is not None:  # TRL derives it from steps_per_generation, which SPIRAL sets
        raise cli.ConfigError(f"--generation_batch_size {ns['generation_batch_size']}: SPIRAL derives it (rows per "
                              "step x processes); leave it unset")
    named = "lr_scheduler_type" in config or any(a.split("=")[0] == "--lr_scheduler_type" for a in argv)
    if ns["warmup_steps"] and not named and ns["lr_scheduler_type"] == "constant":  # SPIRAL's default, with a warm-up
        ns["lr_scheduler_type"] = "constant_with_warmup"
    spiral_args = SpiralArguments(**{f.name: ns[f.name] for f in dataclasses.fields(SpiralArguments)})
    args = _construct({f.name: ns[f.name] for f in dataclasses.fields(GRPOConfig) if f.init})
    check_grpo_config(args, cfg)
    _check_report_to(args)
    return spiral_args, args, cfg


def trl_flag_names(message: str) -> str:
    """A message of cli.validate's with train.py's flags (--steps, --out, --lr, --lora-rank, ...) renamed to the ones
    trl_spiral.py takes (--max_steps, --output_dir, --learning_rate, --lora_r, ...)."""
    spiral_names = {f.name for f in dataclasses.fields(SpiralArguments)}
    ours = {train_name: trl_name for trl_name, train_name in SPIRAL_NAMES.items()} | TRL_NAMES
    ours |= {name: name for name in spiral_names if name not in SPIRAL_NAMES}
    return re.sub(r"(?<![\w-])--([a-z0-9]+(?:-[a-z0-9]+)*)(?![\w-])",
                  lambda m: "--" + ours.get(m[1].replace("-", "_"), m[1]), message)


def engine_versions() -> dict:
    """The engine's packages as config.json records them (None: not installed)."""
    import importlib.metadata

    found = {}
    for package in ("trl", "peft", "accelerate", "deepspeed"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "trl_args.py", "trl_spiral.py uses")
