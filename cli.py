"""Command-line plumbing shared by train.py, evaluate.py and benchmarks/bench.py: one-line errors, the bounds every
flag is checked against (one constant each, so the scripts agree), train.py's and evaluate.py's validation, and
--warm-start-only.

Nothing here is in the paper. The house rule it serves: bad input is one line `<script>: error: ...` and exit code 2,
raised before anything is loaded or written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import typing
from pathlib import Path

import torch

import checkpoint
import reward
import problemset
import rollout
import setsample
import task
import tiny
from lora import PEFT_PREFIX, resolve_base_path

# Sampling and the loss divide logits by T: at 1e-300 they overflow, and already below ~1e-3 the importance ratio
# exp((logit - sampler logit) / T) overflows fp32 for the logit differences bf16 rounding makes.
MIN_TEMPERATURE = 1e-3
SEED_LIMIT = 2**64  # seeds in [0, 2**64): the range torch.manual_seed accepts
MAX_TRACES_PER_PROBLEM = 4096  # N1 + K N2 or G (paper: 24); more sits in one step for hours with no output
MAX_NEW_TOKENS = 2**18  # per trace (paper: 4096 and 8192; majority@k 16,384)
MAX_COUNT = 2**31 - 1  # any other count (steps, tokens per batch, ...): beyond this it is a typo
MAX_MODEL_SETS = 256  # --num-sets all with a model aggregator: N2 aggregation traces for each of C(N1, n) sets


class ConfigError(Exception):
    """Bad input, reported as one line `<script>: error: ...` and exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise ConfigError(message)


def converter(tp, flag):
    """argparse `type` for int, float, str and their optionals ("none" -> None)."""
    base = next(a for a in typing.get_args(tp) if a is not type(None)) if typing.get_args(tp) else tp

    def convert(text):
        if base is not tp and text.lower() == "none":
            return None
        try:
            return base(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects {base.__name__}, got {text!r}")
    return convert


def count_or_all(text: str):
    """argparse `type` of --num-sets: a count, or "all" (every one of the C(N1, n) sets)."""
    if text == "all":
        return "all"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--num-sets expects an integer or all, got {text!r}") from None


def need(ok: bool, name: str, value, what: str) -> None:
    """ConfigError "--name must be <what>, got <value>" unless ok."""
    if not ok:
        raise ConfigError(f"--{name.replace('_', '-')} must be {what}, got {value}")


def check_seed(seed, name: str = "seed") -> None:
    need(isinstance(seed, int) and 0 <= seed < SEED_LIMIT, name, seed, "in [0, 2**64), the range torch.manual_seed "
         "accepts")


def check_temperature(temperature: float) -> None:
    need(math.isfinite(temperature), "temperature", temperature, "a finite number")
    need(temperature >= MIN_TEMPERATURE, "temperature", temperature, f"at least {MIN_TEMPERATURE:g}")


def check_count(name: str, value, limit: int = MAX_COUNT, why: str = "") -> None:
    """A positive integer up to `limit` (None passes: the flag's default)."""
    if value is not None:
        need(value >= 1, name, value, "a positive integer")
        need(value <= limit, name, value, f"at most {limit:,}{why}")


# ----------------------------------------------------------------------------------------------------------------------
# train.py


def validate(cfg, resume_flag: str = "--resume") -> list:
    """Every check of a TrainConfig that needs no model; raises ConfigError, returns the training problems, touches
    nothing (the run directory's lock comes after, in train.main). `resume_flag`: the flag errors name (trl_spiral.py's
    is --resume_from_checkpoint)."""
    all_sets = getattr(cfg, "num_sets", None) == "all"  # every one of the C(N1, n) sets (train.py)
    aggregator = getattr(cfg, "aggregator", "model")  # trl_spiral.py's config has neither field
    counts = ["steps", "save_every", "batch_problems", "num_search", "set_size", *([] if all_sets else ["num_sets"]),
              "num_aggregations",
              "group_size", "max_new_tokens", "max_prompt_tokens", "lora_rank", "micro_batch_tokens",
              "logprob_chunk_size", "max_draws", "target_length", "generation_batch_size", "generation_tokens",
              "cpu_threads"]
    for name in counts:
        check_count(name, getattr(cfg, name))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        need(not isinstance(value, float) or math.isfinite(value), f.name, value, "a finite number")
    check_seed(cfg.seed)
    check_temperature(cfg.temperature)
    # K as a number: C(N1, n) for --num-sets all (1 while n > N1, which the check below refuses)
    num_sets = (math.comb(cfg.num_search, cfg.set_size) if cfg.set_size <= cfg.num_search else 1) if all_sets \
        else cfg.num_sets
    traces = (cfg.num_search + (num_sets * cfg.num_aggregations if aggregator == "model" else 0)
              if cfg.algo == "spiral" else cfg.group_size)
    for name, ok, what in [
            ("num_search" if cfg.algo == "spiral" else "group_size", traces <= MAX_TRACES_PER_PROBLEM,
             f"such that a problem has at most {MAX_TRACES_PER_PROBLEM} traces (N1 + K N2 or G; paper: 24)"),
            ("max_new_tokens", cfg.max_new_tokens <= MAX_NEW_TOKENS, f"at most {MAX_NEW_TOKENS:,}"),
            ("lora_rank", cfg.lora_rank <= 4096, "at most 4,096"),
            ("cpu_threads", (cfg.cpu_threads or 1) <= (os.cpu_count() or 1), f"at most {os.cpu_count()}, the CPUs"),
            ("lr", cfg.lr > 0, "positive"), ("lr", cfg.lr <= 1, "at most 1 (AdamW moves each weight by ~lr a step)"),
            ("lora_alpha", cfg.lora_alpha > 0, "positive"), ("adam_eps", cfg.adam_eps > 0, "positive"),
            ("adam_beta1", 0 <= cfg.adam_beta1 < 1, "in [0, 1)"), ("adam_beta2", 0 <= cfg.adam_beta2 < 1, "in [0, 1)"),
            ("weight_decay", cfg.weight_decay >= 0, ">= 0"), ("max_grad_norm", cfg.max_grad_norm >= 0, ">= 0"),
            ("weight_decay", cfg.lr * cfg.weight_decay < 1, "below 1 / --lr (AdamW scales weights by 1 - lr x wd)")]:
        need(ok, name, getattr(cfg, name), what)
    if getattr(cfg, "keep_attention_outputs", False) and not cfg.gradient_checkpointing:  # else nothing to keep
        raise ConfigError("--keep-attention-outputs chooses what gradient checkpointing keeps, and it is off (this "
                          "preset, or --no-gradient-checkpointing): add --gradient-checkpointing or drop the flag "
                          "(--no-keep-attention-outputs)")
    if cfg.dtype not in ("auto", *rollout.DTYPES):  # argparse checks the flag; this, a resumed config.json
        raise ConfigError(f"--dtype {cfg.dtype}: expected auto, bfloat16 or float32")
    search_advantage = getattr(cfg, "search_advantage", "set")  # trl_spiral.py's config may not have the field
    if search_advantage not in ("set", "own", "none"):
        raise ConfigError(f"--search-advantage {search_advantage}: expected set, own or none")
    if aggregator not in ("model", "oracle"):
        raise ConfigError(f"--aggregator {aggregator}: expected model or oracle")
    if cfg.algo == "spiral":
        if cfg.set_size > cfg.num_search:
            raise ConfigError(f"--set-size {cfg.set_size} is larger than --num-search {cfg.num_search}")
        total = setsample.count_possible_sets(cfg.num_search, cfg.set_size)
        if all_sets and aggregator == "model" and total > MAX_MODEL_SETS:
            raise ConfigError(f"--num-sets all with --aggregator model: C({cfg.num_search}, {cfg.set_size}) = "
                              f"{total:,} aggregation prompts per problem, more than {MAX_MODEL_SETS} (use "
                              "--aggregator oracle, or a number of sets)")
        if aggregator == "oracle" and search_advantage != "set":
            raise ConfigError(f"--aggregator oracle trains the search traces by line 13 alone; --search-advantage "
                              f"{search_advantage} would leave nothing to train")
        if aggregator == "oracle" and cfg.separate_aggregator:
            raise ConfigError("--separate-aggregator with --aggregator oracle: no aggregation trace is written")
        if not all_sets and cfg.num_sets > total:
            raise ConfigError(f"--num-sets {cfg.num_sets} exceeds the C({cfg.num_search}, {cfg.set_size}) = {total} "
                              "possible sets")
        if cfg.unbiased_set_rl and setsample.gradient_scale(cfg.num_search, cfg.set_size, num_sets) == 0:
            raise ConfigError(f"--unbiased-set-rl: M = 0 for --num-sets {cfg.num_sets} (K = 1 or N1 = n: the search "
                              "traces get no set-RL gradient to rescale)")
        if cfg.unbiased_set_rl and search_advantage != "set":
            raise ConfigError(f"--unbiased-set-rl rescales the set-RL advantage; --search-advantage "
                              f"{search_advantage} has none")
    elif search_advantage != "set":
        raise ConfigError(f"--search-advantage {search_advantage} needs --algo spiral (GRPO has no "
                          "search/aggregation split)")
    elif aggregator != "model" or all_sets:
        raise ConfigError(f"{'--aggregator oracle' if aggregator != 'model' else '--num-sets all'} needs --algo "
                          "spiral (GRPO has no sets)")
    elif cfg.separate_aggregator or cfg.unbiased_set_rl:
        raise ConfigError(f"--{'separate-aggregator' if cfg.separate_aggregator else 'unbiased-set-rl'} needs "
                          "--algo spiral (GRPO has no aggregation traces)")
    if cfg.resume and cfg.overwrite:
        raise ConfigError(f"{resume_flag} and --overwrite exclude each other")
    problem = checkpoint.out_dir_problem(cfg.out, resume=cfg.resume, overwrite=cfg.overwrite,
                                         keep={"--model": cfg.model, "--data": cfg.data, "the current directory": "."},
                                         resume_flag=resume_flag)
    if problem:
        raise ConfigError(problem)
    if cfg.resume:
        _check_resume_step(cfg)
    _check_device_and_model(cfg)
    if cfg.reward is None:  # the math task; a user's reward never starts the grader
        why = reward.check_grader()  # a grader that cannot start would score every trace 0: say so now
        if why:
            raise ConfigError(f"the math-verify grader cannot start: {why}")
    problems = load_problems(cfg.data, cfg.data_columns, need_answer=cfg.reward is None)
    need(cfg.batch_problems <= len(problems), "batch_problems", cfg.batch_problems,
         f"at most the {len(problems)} problems of --data {cfg.data}")
    check_count("max_draws", cfg.max_draws, 100 * len(problems), f" (100 x the {len(problems)} problems)")
    return problems


def task_reward(spec: str | None, problems: list):
    """--reward SPEC: the task's r(x, y), imported, checked and probed on the first problem (task.resolve); None for
    the math task. A missing module or function, or a reward that fails the probe, is one ConfigError line."""
    try:
        return task.resolve(spec, problems)
    except task.RewardError as exc:
        raise ConfigError(str(exc)) from None


def _check_resume_step(cfg) -> None:
    """The checkpoint's trainer_state.json, read in full now (not after metrics.jsonl was cut), against --steps."""
    path = checkpoint.latest_checkpoint(cfg.out)
    if path is None:  # a run that crashed before its first checkpoint restarts at step 0
        return
    step = checkpoint.read_trainer_state(path)["step"]
    if step > cfg.steps:
        raise ConfigError(f"--steps {cfg.steps}: the run in {cfg.out} is already at step {step}; --resume continues "
                          f"it to a larger --steps")


def check_device(device: str | None) -> None:
    """--device is None (the script's default), cpu, cuda or cuda:N; else ConfigError."""
    if device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ConfigError(f"--device {device}: expected cpu, cuda or cuda:N")


def _check_device_and_model(cfg) -> None:
    if cfg.device is None and cfg.model != "tiny" and not torch.cuda.is_available():
        raise ConfigError(f"no CUDA GPU found, and {cfg.model} needs one; try --preset tiny (a tiny policy on CPU)")
    check_device(cfg.device)
    if cfg.device is not None and cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {cfg.device}: no CUDA GPU found; " + (
            "leave --device out or pass --device cpu" if cfg.preset.startswith("tiny") else "try --preset tiny"))
    if os.path.abspath(cfg.model) == tiny.WARM_START_DIR and not os.path.isfile(f"{tiny.WARM_START_DIR}/config.json"):
        raise ConfigError(f"--model {cfg.model}: the tiny preset's warm start is missing; recreate it with "
                          f"python train.py --preset tiny --warm-start-only --out {tiny.WARM_START_DIR}")
    try:
        rollout.check_model(cfg.model)
    except ValueError as exc:
        raise ConfigError(f"--model {cfg.model}: {exc}")


def load_problems(data: str, columns: str | None = None, need_answer: bool = True) -> list:
    """problemset.load_problems with --data-columns COLUMNS, any failure one ConfigError line. need_answer=False for
    a user's reward (task.py): a row may lack the answer column."""
    try:
        mapping = problemset.Columns.parse(columns)
    except ValueError as exc:
        raise ConfigError(f"--data-columns {exc}") from None
    try:
        problems = problemset.load_problems(data, mapping, need_answer)
    except Exception as exc:  # noqa: BLE001 - any loader failure is a one-line input error
        raise ConfigError(f"--data {data}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    if not problems:
        raise ConfigError(f"--data {data}: no problems")
    return problems


def warm_start_only(explicit: dict, cpu_threads: int | None) -> int:
    """train.py --preset tiny --warm-start-only --out DIR: build the tiny preset's base model (tiny.warm_start) in
    DIR and exit. --out is required: the shipped data/tiny_warmstart is replaced only when named."""
    if explicit.get("preset") != "tiny":
        raise ConfigError("--warm-start-only needs --preset tiny (it builds the tiny preset's base model)")
    allowed = {"preset", "warm_start_only", "out", "seed", "cpu_threads", "overwrite", "plot"}
    other = sorted(set(explicit) - allowed)
    if other:
        raise ConfigError(f"--warm-start-only takes --out, --seed and --cpu-threads only, not --{other[0]}".replace(
            "_", "-"))
    out = explicit.get("out")
    if out is None:
        raise ConfigError(f"--warm-start-only needs --out DIR (to replace the shipped warm start, name it: --out "
                          f"{os.path.relpath(tiny.WARM_START_DIR)})")
    check_seed(explicit.get("seed", 0))
    check_count("cpu_threads", cpu_threads, os.cpu_count() or 1, " (the CPUs)")
    why = checkpoint.out_path_problem(out)
    if why:
        raise ConfigError(f"--out {out!r}: {why}")
    why = tiny.warm_start_problem(out, "tiny_sums")
    if why:
        raise ConfigError(f"--warm-start-only: {why}")
    torch.set_num_threads(cpu_threads or torch.get_num_threads())
    out = tiny.rebuild_warm_start(out, seed=explicit.get("seed", 0))
    print(f"train.py: wrote the warm start to {out}")
    return 0


# ----------------------------------------------------------------------------------------------------------------------
# evaluate.py


def validate_evaluation(cfg) -> None:
    """evaluate.py's flags after its presets: bounds, policies (their files), --out (ConfigError, one line)."""
    bounds = {"num_samples": MAX_TRACES_PER_PROBLEM, "max_new_tokens": MAX_NEW_TOKENS,
              "majority_max_new_tokens": MAX_NEW_TOKENS, "rsa_set_size": MAX_TRACES_PER_PROBLEM,
              "rsa_steps": 1000, "majority_subsets": 100_000, "limit": MAX_COUNT, "micro_batch_size": MAX_COUNT,
              "tokens_per_call": MAX_COUNT, "max_prompt_tokens": MAX_COUNT}
    for name, limit in bounds.items():
        check_count(name, getattr(cfg, name), limit)
    check_seed(cfg.seed)
    if cfg.k_list is None:  # 1, 2, 4, ... and the number of samples itself
        cfg.k_list = sorted({2**i for i in range(cfg.num_samples.bit_length())} | {cfg.num_samples})
    for name, limit in [("k_list", MAX_TRACES_PER_PROBLEM), ("max_tokens_list", MAX_NEW_TOKENS),
                        ("rsa_populations", MAX_TRACES_PER_PROBLEM)]:
        if min(getattr(cfg, name)) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} values must be positive, got {getattr(cfg, name)}")
        check_count(name, max(getattr(cfg, name)), limit)
        setattr(cfg, name, sorted(set(getattr(cfg, name))))
    check_temperature(cfg.temperature)  # the floor train.py has: the same constant
    if {"passk", "majority"} & set(cfg.methods) and max(cfg.k_list) > cfg.num_samples:
        raise ConfigError(f"k={max(cfg.k_list)} in --k-list is larger than the {cfg.num_samples} samples drawn "
                         f"(--num-samples)")
    if "rsa" in cfg.methods and min(cfg.rsa_populations) < cfg.rsa_set_size:
        raise ConfigError(f"RSA population P={min(cfg.rsa_populations)} is smaller than the set size "
                         f"k={cfg.rsa_set_size}")
    cfg.policies = _resolve_policies(cfg)
    _check_out(cfg)


def _resolve_policies(cfg) -> list[dict]:
    """[{label, model, adapter}] from --policy/--adapter/--model, with the adapters' files checked."""
    specs = [(*s.partition("=")[::2], f"--policy {s}") if "=" in s else (None, s, f"--policy {s}")
             for s in cfg.policy or []]
    specs += [("adapter", cfg.adapter, f"--adapter {cfg.adapter}")] if cfg.adapter else []
    policies = []
    for label, path, flag in specs or [("base", cfg.model, f"--model {cfg.model}")]:
        if label is None or not re.fullmatch(r"[A-Za-z0-9_-]+", label):
            raise ConfigError(f"{flag}: expected LABEL=PATH with a label of letters, digits, _ or -")
        if label in (p["label"] for p in policies):
            raise ConfigError(f"{flag}: the label {label!r} is used twice")
        if not path:
            raise ConfigError(f"{flag}: the path after '=' is empty")
        if (Path(path) / "adapter" / "adapter_config.json").is_file():  # a likely slip: the run, not its adapter
            raise ConfigError(f"{flag}: {path} is a train.py run directory; its adapter is {Path(path) / 'adapter'}")
        adapter = Path(path) if (Path(path) / "adapter_config.json").is_file() else None
        if adapter is None and flag.startswith("--adapter"):
            raise ConfigError(f"{flag}: no adapter_config.json there (expected train.py's adapter directory)")
        if adapter is None:
            if Path(path).exists() and not (Path(path) / "config.json").is_file():
                raise ConfigError(f"{flag}: neither an adapter (adapter_config.json) nor a model (config.json)")
            if not Path(path).exists() and path != "tiny" and not problemset.HUB_ID.match(path):
                raise ConfigError(f"{flag}: no such adapter or model directory")
            policies.append({"label": label, "model": _canonical(path), "adapter": None})
            continue
        try:
            base = resolve_base_path(path)  # train.py stores a base inside the run directory as "../base"
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{flag}: adapter_config.json is not valid JSON ({e})") from None
        for sub in [adapter, *[d for d in [adapter / "aggregator"] if (d / "adapter_config.json").is_file()]]:
            _check_adapter_weights(sub, flag)
        model = _canonical(cfg.model if cfg.model_explicit or not base else base)
        if not cfg.model_explicit and base and not os.path.isabs(base) and base.startswith("."):
            raise ConfigError(f"{flag}: its base model {base!r} (relative to the adapter) is not there; an adapter "
                             "copied away from its run needs --model (the base it was trained on)")
        if base and model != _canonical(base):
            print(f"warning: {flag} was trained on {base}, evaluating it on {model}", file=sys.stderr)
        policies.append({"label": label, "model": model, "adapter": str(adapter)})
    return policies


def _canonical(model: str) -> str:
    """A local model directory as an absolute path (one load, one cache key, however it was written)."""
    return str(Path(model).resolve()) if Path(model).exists() else model


def _check_adapter_weights(adapter: Path, flag: str) -> None:
    from safetensors import safe_open

    weights = adapter / "adapter_model.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{flag}: {weights} is missing")
    try:
        with safe_open(str(weights), "pt") as f:
            keys = list(f.keys())
    except Exception as e:  # a torn or foreign file: safetensors raises its own error types
        raise ConfigError(f"{flag}: {weights} is not a readable safetensors file ({str(e)[:80]})") from None
    if not keys or not all(k.startswith(PEFT_PREFIX) and ".lora_" in k for k in keys):
        raise ConfigError(f"{flag}: {weights} holds no LoRA weights in the PEFT layout")


def _check_out(cfg) -> None:
    """--out must be a new file or an earlier result of this script, in a writable directory (before generating)."""
    if not cfg.out.strip():
        raise ConfigError("--out is empty; expected a JSON file path")
    why = None if os.path.lexists(cfg.out) else checkpoint.unwritable(cfg.out)  # first: a name too long makes
    if why:                                                                     # pathlib's exists() raise
        raise ConfigError(f"--out: cannot write {cfg.out} ({why})")
    out, png = Path(cfg.out), Path(cfg.out).with_suffix(".png")
    if out.is_dir() or out.suffix == ".png":
        raise ConfigError(f"--out {out}: expected a JSON file path (the PNG goes next to it)")
    ours = False
    if out.exists():
        try:
            stored = json.loads(out.read_text())
            ours = stored.get("written_by") == "evaluate.py" or {"config", "summary", "problems"} <= set(stored)
        except (OSError, ValueError, UnicodeDecodeError, AttributeError, TypeError):
            pass  # (the second test: a result written before "written_by" existed)
        if not ours:
            raise ConfigError(f"--out {out} exists and is not an evaluate.py result; choose another path")
    if png.exists() and not ours:
        raise ConfigError(f"--out {out}: {png} exists and was not written with {out.name}; choose another path")
    cfg.cache_dir = str(cfg.cache_dir or out.parent / ".cache")
    for flag, directory in (("--out", out.parent), ("--cache-dir", Path(cfg.cache_dir))):
        why = checkpoint.unwritable(str(directory))
        if why:
            raise ConfigError(f"{flag}: cannot write to {directory} ({why})")


def short_enough(problems, policies, max_prompt_tokens: int) -> list:
    """The problems whose search prompt fits max_prompt_tokens for every policy's tokenizer (as train.py drops them:
    a 2 MB problem would ask generate for a terabyte attention mask)."""
    tokenizers = {id(p["tokenizer"]): p["tokenizer"] for p in policies}.values()
    kept = [p for p in problems if all(len(rollout.chat_prompt_ids(t, rollout.search_prompt(p.problem)))
                                       <= max_prompt_tokens for t in tokenizers)]
    if not kept:
        raise ConfigError(f"every problem's prompt is longer than --max-prompt-tokens {max_prompt_tokens}")
    if len(kept) < len(problems):
        print(f"evaluate.py: dropped {len(problems) - len(kept)} of {len(problems)} problems longer than "
              f"{max_prompt_tokens} prompt tokens", file=sys.stderr)
    return kept



class StepWatch:
    """train.py's warnings about a step's metrics row, as lines for stderr: comparisons the grader scored 0 without a
    verdict (timeouts), and a run that has kept no problem for `patience` steps in a row (no gradient step: every
    drawn problem's rewards were all equal; at accuracy 0, no trace is ever correct)."""

    def __init__(self, patience: int = 5):
        self.patience, self.streak, self.first = patience, 0, None

    def check(self, row: dict) -> list[str]:
        lines, step = [], row["step"]
        if row.get("grader/ungraded"):
            lines.append(f"train.py: warning: step {step}: {row['grader/ungraded']} rewards scored 0 without a verdict "
                         f"({row.get('grader/timeouts', 0)} grader timeouts; see reward.py)")
        self.streak, self.first = (self.streak + 1, self.first or step) if row.get("problems_kept") == 0 else (0, None)
        if self.streak == self.patience or (self.streak > self.patience and self.streak % (10 * self.patience) == 0):
            accuracies = [row[k] for k in ("accuracy", "search_accuracy", "aggregation_accuracy") if k in row]
            why = ("no trace was correct: can the model solve these problems (gold answers, --max-new-tokens)? Or did "
                   "training collapse (--lr, --max-grad-norm)?" if max(accuracies, default=0) == 0 else
                   "every trace was correct: the problems are too easy to learn from" if min(accuracies) == 1 else
                   "every problem's rewards were all equal")
            lines.append(f"train.py: warning: steps {self.first}-{step} kept no problem, so no gradient step was "
                         f"taken; {why}")
        return lines


def library_main(doc: str, name: str, used_by: str) -> None:
    """`python NAME.py` on a library module: --help prints its docstring (exit 0); anything else is one line naming
    who uses it (exit 2). Nothing runs either way."""
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(doc)
        sys.exit(0)
    print(f"{name}: error: a library that {used_by}; nothing to run here (--help: what it holds)", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    library_main(__doc__, "cli.py", "train.py, evaluate.py, trl_spiral.py and the benchmarks use")
