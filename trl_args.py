"""trl_spiral.py's settings: SPIRAL's own arguments, TRL's (GRPOConfig) under TRL's names with train.py's values as
defaults, and the TRL settings that SPIRAL pins or derives; `parse_args` reads them through TRL's TrlParser, with
`--config recipe.yaml` as TRL scripts take it.

Precedence: command-line flags > the --config YAML > the preset's train.py values > TRL's defaults. A pinned setting
given another value, or a derived one set to something else, is a one-line error that says why (cli.ConfigError).
Plumbing, not SPIRAL: trl_spiral.py holds the algorithm's side.
"""

from __future__ import annotations

import dataclasses
import os
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
    lora_r: int | None = train.option(None, "LoRA rank r (paper: 32)")
    lora_alpha: float | None = train.option(None, "LoRA alpha, update scaled by alpha / r")
    dtype: typing.Literal["auto", "bfloat16", "float32"] = train.option("auto", "model weights (auto: bfloat16 on "
                                                                        "a GPU, float32 on a CPU); sets TRL's bf16")
    cpu_threads: int | None = train.option(None, "torch threads on a CPU (default: torch's choice; tiny: 1)")


# train.TrainConfig field -> TRL's name for it. TRL's flag takes train.py's (preset's) value as its default.
TRL_NAMES = {"steps": "max_steps", "out": "output_dir", "seed": "seed", "lr": "learning_rate",
             "temperature": "temperature", "max_new_tokens": "max_completion_length", "weight_decay": "weight_decay",
             "adam_beta1": "adam_beta1", "adam_beta2": "adam_beta2", "adam_eps": "adam_epsilon",
             "max_grad_norm": "max_grad_norm", "gradient_checkpointing": "gradient_checkpointing",
             "save_every": "save_steps"}
SPIRAL_NAMES = {"model_name_or_path": "model", "dataset_name": "data", "lora_r": "lora_rank"}  # the rest: same name

# TRL settings that must keep these values for the update to be Algorithm 1's; another value is a one-line error.
PINNED = {
    "num_iterations": (1, "one optimizer step per batch of rollouts (the PPO ratio stays 1)"),
    "beta": (0.0, "SPIRAL has no KL term"),
    "top_k": (0, "the loss is for plain sampling from softmax(logits / T)"),
    "top_p": (1.0, "the loss is for plain sampling from softmax(logits / T)"),
    "min_p": (None, "the loss is for plain sampling from softmax(logits / T)"),
    "repetition_penalty": (1.0, "the loss is for plain sampling from softmax(logits / T)"),
    "vllm_importance_sampling_correction": (False, "the loss already weights each token by pi_theta / pi_sampler"),
    "use_liger_kernel": (False, "Liger's fused GRPO loss would replace SPIRAL's"),
    "use_transformers_continuous_batching": (False, "generation is spiral.collect_spiral's"),
    "top_entropy_quantile": (1.0, "every completion token is trained"),
    "entropy_coef": (0.0, "SPIRAL has no entropy bonus"),
    "use_adaptive_entropy": (False, "SPIRAL has no entropy bonus"),
    "mask_truncated_completions": (False, "truncated traces are trained as train.py trains them"),
    "remove_unused_columns": (False, "the dataset's answer column must reach the rollout"),
    "logging_steps": (1, "metrics.jsonl has one row per optimizer step, as train.py's"),
    "generation_batch_size": (None, "one generation per optimizer step: --steps_per_generation decides"),
    "ds3_gather_for_generation": (True, "ZeRO-3's weights are gathered once for the whole rollout, whose forward calls "
                                        "differ in number between processes"),
}
DERIVED = ("num_generations", "per_device_train_batch_size", "steps_per_generation", "bf16")


def derived_settings(cfg: train.TrainConfig, gradient_accumulation_steps: int) -> dict:
    """TRL settings that follow from SPIRAL's: num_generations = N1 + K N2 (each problem's rows are one TRL group),
    |B| (N1 + K N2) rows per process and optimizer step (--gradient_accumulation_steps must divide them: ConfigError),
    generated once per step, bf16 as --dtype says."""
    G = cfg.num_search + cfg.num_sets * cfg.num_aggregations  # rows per problem: 24 in the paper
    rows = cfg.batch_problems * G  # per process and optimizer step
    cli.need(gradient_accumulation_steps >= 1, "gradient_accumulation_steps", gradient_accumulation_steps,
             "a positive integer")
    cli.need(rows % gradient_accumulation_steps == 0, "gradient_accumulation_steps", gradient_accumulation_steps,
             f"a divisor of the {rows} rows per step (--batch_problems x (N1 + K N2))")
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return {"num_generations": G, "per_device_train_batch_size": rows // gradient_accumulation_steps,
            "steps_per_generation": gradient_accumulation_steps,
            "bf16": rollout.resolve_dtype(cfg.dtype, device) == torch.bfloat16}


def trl_defaults(cfg: train.TrainConfig) -> dict:
    """SPIRAL's defaults for TRL's settings: train.py's values (TRL's own in brackets in PORTING.md, section 5)."""
    defaults = {TRL_NAMES[name]: getattr(cfg, name) for name in TRL_NAMES}
    return defaults | {"output_dir": os.path.join("runs", f"{cfg.preset}-trl"), "lr_scheduler_type": "constant",
                       "warmup_steps": 0, "optim": "adamw_torch", "use_cpu": cfg.device == "cpu", "disable_tqdm": True,
                       "gradient_checkpointing_kwargs": {"use_reentrant": False}, "scale_rewards": "none",
                       "loss_type": "dr_grpo"}



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


def parse_args(argv: list[str]):
    """Flags and --config YAML -> (SpiralArguments, GRPOConfig, TrainConfig); precedence: flags > YAML > the preset's
    train.py values > TRL's defaults. Pinned and derived settings checked; ConfigError if bad; nothing written."""
    argv, config = list(argv), {}
    parser = Parser([SpiralArguments, GRPOConfig], prog="trl_spiral.py",
                    description="SPIRAL on TRL: Algorithm 1 with TRL's GRPOTrainer doing the optimisation")
    if "--config" in argv:
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
    for name, (value, why) in PINNED.items():
        if ns[name] != value:
            raise cli.ConfigError(f"--{name} {ns[name]}: SPIRAL pins it to {value} ({why})")
    fsdp = ns["fsdp"] or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")
    if fsdp and not ns["use_vllm"]:  # FSDP gathers each layer at every forward, a collective every process must join
        raise cli.ConfigError("FSDP needs --use_vllm: SPIRAL's rollout makes a different number of forward calls on "
                              "each process, which FSDP's per-layer gathers would deadlock; use ZeRO-3 "
                              "(recipe/trl/zero3.yaml) or DDP, or sample with vLLM")
    explicit = {SPIRAL_NAMES.get(f.name, f.name): ns[f.name] for f in dataclasses.fields(SpiralArguments)}
    explicit |= {name: ns[trl_name] for name, trl_name in TRL_NAMES.items() if name != "save_every"}
    explicit |= {"device": "cpu" if ns["use_cpu"] else None, "resume": ns["resume_from_checkpoint"] is not None}
    cfg = train.resolve_config(explicit)
    for name, value in derived_settings(cfg, ns["gradient_accumulation_steps"]).items():  # checks the division too
        if ns[name] is not None and ns[name] != value:
            raise cli.ConfigError(f"--{name} {ns[name]}: SPIRAL derives it as {value} from N1, K, N2, "
                                  "--batch_problems, --gradient_accumulation_steps and --dtype; leave it unset")
        ns[name] = value
    spiral_args = SpiralArguments(**{f.name: ns[f.name] for f in dataclasses.fields(SpiralArguments)})
    try:
        with warnings.catch_warnings():  # TRL 1.16 sets transformers 5.24's deprecated gradient_checkpointing alias
            warnings.filterwarnings("ignore", "`gradient_checkpointing", FutureWarning)  # itself: 4 lines every run
            args = GRPOConfig(**{f.name: ns[f.name] for f in dataclasses.fields(GRPOConfig) if f.init})
    except ValueError as exc:
        raise cli.ConfigError(checkpoint.first_line(exc).removeprefix("ValueError: ")) from None
    return spiral_args, args, cfg


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "trl_args.py", "trl_spiral.py uses")
