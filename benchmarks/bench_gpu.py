"""Rows 1-4 of bench.py, the GPU part (any device; --size 4b needs CUDA): one LoRA training micro-step, generate
throughput against the HBM floor, the aggregation stage with and without the shared-prefix prefill, and a full
SPIRAL step against the GRPO step at equal budget. bench.py's docstring states what each row counts."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import sys
import time
import zlib
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

import fastgen  # noqa: E402
import logprobs  # noqa: E402
import lora  # noqa: E402
import problemset  # noqa: E402
import rollout  # noqa: E402
import shared_prompt  # noqa: E402
import spiral  # noqa: E402
import train  # noqa: E402
from bench_kit import (GB, SPECIAL_TOKENS, Meter, build_policy, datasheet_tflops, floor_seconds,  # noqa: E402
                       grouped_step_flops, kv_bytes_per_token, lora_params, measure_floors, prefill_flops,
                       random_words, train_step_flops, weight_bytes, write_json)


# ----------------------------------------------------------------------------------------------------------------------
# The shapes of rows 1-4 (Scale), the rows, and the GPU part that runs them


@dataclass
class Scale:
    """Sequence lengths and counts of the four GPU measurements."""

    problem_tokens: int  # a problem (paper: prompts of at most 1,024 tokens)
    candidate_tokens: int  # each of the n candidates in an aggregation prompt (a full-length search trace)
    train_completion_tokens: int  # 1: the completion of the training sample
    gen_prompts: int  # 2: prompts x samples = the generate batch
    gen_samples: int
    gen_new_tokens: int
    agg_prompts: int  # 3
    agg_samples: int
    agg_new_tokens: int
    step_problems: int  # 4
    step_new_tokens: int
    grpo_group: int
    grpo_new_tokens: int
    num_search: int = 8  # N1, n, K, N2 of the paper
    set_size: int = 4
    num_sets: int = 4
    num_aggregations: int = 4


SCALES = {
    "4b": Scale(1024, 4096, 4096, 8, 8, 4096, 16, 4, 4096, 1, 4096, 12, 8192),
    "toy": Scale(24, 32, 32, 2, 4, 8, 2, 4, 8, 1, 8, 12, 16),
}


def aggregation_prompt_text(scale: Scale, vocab_size: int, rng) -> str:
    """The paper's aggregation prompt for a problem and n full-length candidates (random words)."""
    problem = random_words(scale.problem_tokens, vocab_size, rng)
    return rollout.aggregation_prompt(problem, [random_words(scale.candidate_tokens, vocab_size, rng)
                                                for _ in range(scale.set_size)])


def measure_train_step(model, tokenizer, scale: Scale, device: str, floors: dict) -> dict:
    """1. One LoRA micro-step (train.accumulate_gradients: forward + backward) on the longest aggregation sample."""
    rng = np.random.default_rng(1)
    cfg, V = model.config, model.config.vocab_size
    prompt_ids = rollout.chat_prompt_ids(tokenizer, aggregation_prompt_text(scale, V, rng))
    completion_ids = rng.integers(len(SPECIAL_TOKENS), V, scale.train_completion_tokens).tolist()
    # sampler log-probs ~ a random model's (-log V), so the importance ratio is ~1
    sample = spiral.Sample(prompt_ids, completion_ids, [-math.log(V)] * len(completion_ids), 1.0, "aggregation")
    T = len(prompt_ids) + len(completion_ids)
    defaults = train.TrainConfig()
    # Row 1 as measured on 2026-11-25: the per-sample path, flash attention unless a caller (decode.py --mfu) adds
    # cuDNN to logprobs.ATTENTION_BACKENDS. The learner's own variants are measure_learner's.
    cudnn = SDPBackend.CUDNN_ATTENTION in logprobs.ATTENTION_BACKENDS
    kwargs = dict(loss_normalizer=float(len(completion_ids)), temperature=1.0,
                  micro_batch_tokens=T, chunk_size=defaults.logprob_chunk_size,
                  pad_token_id=tokenizer.pad_token_id, learner="per-sample",
                  learner_attention="cudnn" if cudnn else "flash")
    optimizer = torch.optim.AdamW(lora.lora_parameters(model), lr=1e-9)
    model.train()
    train.train_step(model, optimizer, [sample], **kwargs)  # warm-up; allocates AdamW's state as in training
    model.train()
    with Meter(device) as meter:
        train.accumulate_gradients(model, [sample], **kwargs)
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    flops = train_step_flops(cfg, T, len(completion_ids), lora_params(model))
    rate = floors["matmul_TFLOPs"] * 1e12
    return {
        "prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids), "seconds": meter.seconds,
        "peak_memory_GB": meter.peak_bytes / GB, "goal_peak_memory_GB": 24.0,
        "model_TFLOP": flops["model_flops"] / 1e12, "hardware_TFLOP": flops["hardware_flops"] / 1e12,
        "attention_share_of_model_flops": flops["attention_share"],
        "mfu": flops["model_flops"] / meter.seconds / rate, "hfu": flops["hardware_flops"] / meter.seconds / rate,
        "goal_mfu": 0.40, "floor_seconds": flops["model_flops"] / rate,
    }


def _timed_generate(model, tokenizer, prompts, *, samples, new_tokens, device, micro_batch_size=None,
                    share_prefix=True, adapter=True):
    context = contextlib.nullcontext() if adapter else lora.use_adapter(model, None)
    with context, Meter(device) as meter:
        out = rollout.generate(model, tokenizer, prompts, samples_per_prompt=samples, max_new_tokens=new_tokens,
                               micro_batch_size=micro_batch_size, share_prefix=share_prefix)
    return out, meter


def measure_generate(model, tokenizer, scale: Scale, device: str, floors: dict, adapter: bool = True) -> dict:
    """2. rollout.generate throughput at batch gen_prompts x gen_samples, against the HBM floor."""
    rng = np.random.default_rng(2)
    V, cfg = model.config.vocab_size, model.config
    prompts = [rollout.search_prompt(random_words(scale.problem_tokens, V, rng)) for _ in range(scale.gen_prompts)]
    batch = scale.gen_prompts * scale.gen_samples
    if getattr(model, "generation_engine", "hf") == "fast":  # graphs captured per shape and bucket: warm up at both
        _timed_generate(model, tokenizer, prompts, samples=scale.gen_samples, new_tokens=scale.gen_new_tokens,
                        device=device, micro_batch_size=batch, adapter=adapter)
    else:
        _timed_generate(model, tokenizer, prompts[:1], samples=2, new_tokens=4, device=device, adapter=adapter)
    out, meter = _timed_generate(model, tokenizer, prompts, samples=scale.gen_samples,
                                 new_tokens=scale.gen_new_tokens, device=device, micro_batch_size=batch,
                                 adapter=adapter)
    completions = [c for row in out for c in row]
    L = max(len(c.prompt_ids) for c in completions)
    steps = max(len(c.completion_ids) for c in completions)  # generate runs until the longest row stops
    # Floor: the prefill at the matmul rate (one prefill per prompt: shared prefix), then steps-1 decode steps that
    # each read every weight once and the KV cache of every row (L + s tokens at step s).
    element = next(model.parameters()).element_size()
    kv_read = batch * kv_bytes_per_token(cfg, element) * sum(L + s for s in range(1, steps))
    weights = weight_bytes(model) - (0 if adapter else lora_params(model) * 4)  # fp32 LoRA read only when active
    decode_bytes = (steps - 1) * weights + kv_read
    floor_s = floor_seconds(decode_bytes, prefill_flops(cfg, [L] * scale.gen_prompts), floors)
    return {
        "batch": batch, "prompt_tokens": L, "new_tokens": scale.gen_new_tokens, "decode_steps": steps,
        "tokens_generated": sum(len(c.completion_ids) for c in completions),
        "rows_stopped_by_eos": sum(not c.truncated for c in completions),
        "seconds": meter.seconds, "tokens_per_s": batch * steps / meter.seconds,
        "floor_tokens_per_s": batch * steps / floor_s, "fraction_of_floor": floor_s / meter.seconds,
        "goal_fraction_of_floor": 0.40, "decode_GB_read": decode_bytes / GB, "peak_memory_GB": meter.peak_bytes / GB,
        "lora_adapter_active": adapter,
    }


def measure_aggregation(model, tokenizer, scale: Scale, device: str, floors: dict, micro_batch_size=None,
                        adapter: bool = True) -> dict:
    """3. The aggregation stage (agg_prompts prompts x N2 samples), with and without the shared-prefix prefill."""
    rng = np.random.default_rng(3)
    V = model.config.vocab_size
    prompts = [aggregation_prompt_text(scale, V, rng) for _ in range(scale.agg_prompts)]
    prompt_tokens = [len(rollout.chat_prompt_ids(tokenizer, p)) for p in prompts]
    _timed_generate(model, tokenizer, [rollout.search_prompt("w5")], samples=2, new_tokens=4, device=device,
                    adapter=adapter)  # warm-up
    result = {"prompts": scale.agg_prompts, "samples_per_prompt": scale.agg_samples,
              "prompt_tokens_mean": float(np.mean(prompt_tokens)), "new_tokens": scale.agg_new_tokens,
              "micro_batch_size": micro_batch_size or max(1, rollout.DEFAULT_TOKENS_PER_MICRO_BATCH
                                                          // (max(prompt_tokens) + scale.agg_new_tokens))}
    for share in (True, False):
        out, meter = _timed_generate(model, tokenizer, prompts, samples=scale.agg_samples,
                                     new_tokens=scale.agg_new_tokens, device=device,
                                     micro_batch_size=micro_batch_size, share_prefix=share, adapter=adapter)
        key = "shared_prefix" if share else "no_shared_prefix"
        result[key] = {"seconds": meter.seconds, "peak_memory_GB": meter.peak_bytes / GB,
                       "tokens_generated": sum(len(c.completion_ids) for row in out for c in row)}
    result["speedup_from_sharing"] = result["no_shared_prefix"]["seconds"] / result["shared_prefix"]["seconds"]
    return result


@contextlib.contextmanager
def _coin_flip_rewards(seed: int = 0):
    """spiral's grader replaced by seeded coin flips: random weights never solve anything, and with all rewards 0
    dynamic sampling would leave nothing to train on. Coin flips keep every problem: the worst case for training."""
    rng = np.random.default_rng(seed)
    saved = spiral.reward
    spiral.reward = lambda text, gold: float(rng.integers(0, 2))
    try:
        yield
    finally:
        spiral.reward = saved


def coin_flip_reward(problem, completion_text: str) -> float:
    """A task reward (train.py --reward bench_gpu:coin_flip_reward) for the train.py step: a coin flip seeded by the
    completion's text, so the same command grades alike. Random weights never solve a problem; this keeps every
    problem, and the math grader (math-verify, absent on the GPU machine unless carried) is never started."""
    return float(zlib.crc32(completion_text.encode()) % 2)


@contextlib.contextmanager
def _timed_generate_calls(calls: list, announce: str | None = None):
    """Record the wall time of each rollout.generate call that spiral makes (search first, then aggregation);
    `announce`: also print each as it ends (a run cut short keeps them in its log)."""
    saved = spiral.generate

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = saved(*args, **kwargs)  # returns Python lists: the device is synchronised
        calls.append(time.perf_counter() - t0)
        if announce:
            print(f"{announce} {len(calls)}: {len(out)} prompt(s) x {len(out[0]) if out else 0} in "
                  f"{calls[-1]:.1f} s", flush=True)
        return out

    spiral.generate = timed
    try:
        yield
    finally:
        spiral.generate = saved


def _one_step(model, tokenizer, scale: Scale, device: str, algo: str, adapter: bool) -> dict:
    rng = np.random.default_rng(4)
    V = model.config.vocab_size
    problems = [problemset.Problem(random_words(scale.problem_tokens, V, rng), "1") for _ in range(scale.step_problems)]
    stream = iter(problems * 2)
    draw = lambda: next(stream)  # noqa: E731
    calls: list[float] = []
    context = contextlib.nullcontext() if adapter else lora.use_adapter(model, None)
    common = dict(batch_problems=scale.step_problems, max_draws=scale.step_problems, rng=rng)
    with _coin_flip_rewards(), _timed_generate_calls(calls), Meter(device) as collect, torch.no_grad(), context:
        if algo == "spiral":
            rollouts = spiral.collect_spiral(model, tokenizer, draw, num_search=scale.num_search,
                                             set_size=scale.set_size, num_sets=scale.num_sets,
                                             num_aggregations=scale.num_aggregations,
                                             max_new_tokens=scale.step_new_tokens, **common)
            budget = (scale.num_search + scale.num_sets * scale.num_aggregations) * scale.step_new_tokens
        else:
            rollouts = spiral.collect_grpo(model, tokenizer, draw, group_size=scale.grpo_group,
                                           max_new_tokens=scale.grpo_new_tokens, **common)
            budget = scale.grpo_group * scale.grpo_new_tokens
    defaults = train.TrainConfig()
    optimizer = torch.optim.AdamW(lora.lora_parameters(model), lr=1e-9)
    fastgen.release()  # as train.py: the learner gets the fast engine's KV arena back
    with Meter(device) as training:
        stats = train.train_step(model, optimizer, rollouts.samples, loss_normalizer=scale.step_problems * budget,
                                 micro_batch_tokens=defaults.micro_batch_tokens,
                                 chunk_size=defaults.logprob_chunk_size, pad_token_id=tokenizer.pad_token_id)
    model.eval()
    times = {"search_s": sum(calls[0::2]), "aggregation_s": sum(calls[1::2])} if algo == "spiral" \
        else {"generate_s": sum(calls)}
    times["other_collection_s"] = collect.seconds - sum(calls)
    times["training_s"] = training.seconds
    return {**times, "total_s": collect.seconds + training.seconds,
            "tokens_generated": rollouts.metrics["tokens_generated"], "token_budget": scale.step_problems * budget,
            "samples_trained": stats["train/samples_trained"], "tokens_trained": stats["train/tokens_trained"],
            "peak_memory_GB": max(collect.peak_bytes, training.peak_bytes) / GB}


def measure_spiral_step(model, tokenizer, scale: Scale, device: str, floors: dict, adapter: bool = True,
                        grpo: bool = True) -> dict:
    """4. A full SPIRAL step (collect_spiral + train_step), and the GRPO step at equal budget."""
    result = {"problems": scale.step_problems, "spiral": _one_step(model, tokenizer, scale, device, "spiral", adapter)}
    if grpo:
        result["grpo"] = _one_step(model, tokenizer, scale, device, "grpo", adapter)
        result["time_ratio_spiral_over_grpo"] = result["spiral"]["total_s"] / result["grpo"]["total_s"]
    return result


# ----------------------------------------------------------------------------------------------------------------------
# The learner's figures: its variants, train.py's aggregation call, one train.py step. Each prints the step
# model's prediction (benchmarks/step_model.py, fitted on an H100) beside the measurement at the 4B size.


def _step_model():
    """benchmarks/step_model.py (imported when used: its fit reads the H100 session's files)."""
    import step_model

    return step_model


def _aggregation_group(model, tokenizer, scale: Scale) -> list:
    """The paper's longest aggregation group: a ~17.6k-token prompt and N2 completions of 4,096 random tokens, with
    advantages +-1 (none zero: all are trained)."""
    rng = np.random.default_rng(1)
    V = model.config.vocab_size
    prompt_ids = rollout.chat_prompt_ids(tokenizer, aggregation_prompt_text(scale, V, rng))
    L = scale.train_completion_tokens
    return [spiral.Sample(prompt_ids, rng.integers(len(SPECIAL_TOKENS), V, L).tolist(), [-math.log(V)] * L,
                          (-1.0) ** i, "aggregation") for i in range(scale.num_aggregations)]


def measure_learner(model, tokenizer, scale: Scale, device: str, floors: dict, size: str = "4b") -> dict:
    """The learner on one aggregation group, 8 ways: grouped (shared_prompt.py: the group in one micro-step) and
    per-sample (the reference: one of the group's N2 micro-steps, row 1's shape; a group costs N2 of them), each with
    flash or cuDNN attention, recomputing or keeping attention outputs. Time and peak memory of
    train.accumulate_gradients after a warm-up (grouped on CUDA: beside the peak its memory plan counts); MFU from
    bench_kit's model FLOPs. A grouped row where the grouped learner did not run is an error, never a per-sample
    time under the grouped name."""
    whole = _aggregation_group(model, tokenizer, scale)
    P, L = len(whole[0].prompt_ids), len(whole[0].completion_ids)
    rate = floors["matmul_TFLOPs"] * 1e12
    n_lora = lora_params(model)
    result = {"prompt_tokens": P, "completion_tokens": L, "completions": len(whole)}
    for learner in ("grouped", "per-sample"):
        group = whole if learner == "grouped" else whole[:1]
        flops = ([grouped_step_flops(model.config, P, [L] * len(group), n_lora)] if learner == "grouped"
                 else [train_step_flops(model.config, P + L, L, n_lora)])
        model_flops = sum(f["model_flops"] for f in flops)
        for attention in ("flash", "cudnn"):
            for keep in (False, True):
                key = f"{learner}_{attention}" + ("_keep" if keep else "")
                kwargs = dict(loss_normalizer=float(L), micro_batch_tokens=train.TrainConfig.micro_batch_tokens,
                              chunk_size=train.TrainConfig.logprob_chunk_size, pad_token_id=tokenizer.pad_token_id,
                              learner=learner, learner_attention=attention)
                try:
                    train.enable_gradient_checkpointing(model, keep_attention_outputs=keep)
                    model.train()
                    metrics = train.accumulate_gradients(model, group, **kwargs)  # warm-up: kernels, memory cached
                    model.zero_grad(set_to_none=True)
                    planned = _planned_peak_bytes(model, group, device) if learner == "grouped" else None
                    with Meter(device) as meter:
                        metrics = train.accumulate_gradients(model, group, **kwargs)
                    r = {"completions_trained": len(group), "seconds": meter.seconds,
                         "peak_memory_GB": meter.peak_bytes / GB, "model_TFLOP": model_flops / 1e12,
                         "mfu": model_flops / meter.seconds / rate}
                    if planned is not None:
                        r["planned_peak_memory_GB"] = planned / GB
                    if "train/learner_fallback" in metrics:  # a row labelled grouped never reports per-sample time
                        r = {"error": f"the grouped learner did not run ({metrics['train/learner_fallback']})"}
                except Exception as e:  # noqa: BLE001 - an out-of-memory or a kernel failure is a result too
                    r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                finally:
                    model.zero_grad(set_to_none=True)
                    model.eval()
                if size == "4b":  # the step model describes Qwen3-4B on an H100
                    r["model_seconds"] = _step_model().predict_learner(flops, attention, keep)
                result[key] = r
                print_result("learner_row", {"key": key, **result, **r})
    train.enable_gradient_checkpointing(model)
    return result


def _planned_peak_bytes(model, group: list, device: str) -> int | None:
    """On CUDA, the peak memory the grouped learner's plan counts for `group` (shared_prompt.LearnerMemory, over the
    micro-batches it plans from the free memory now), what is allocated already included; None elsewhere."""
    if not device.startswith("cuda"):
        return None
    groups = shared_prompt.group_by_prompt(group)
    memory = shared_prompt.LearnerMemory.of(model, train.TrainConfig.logprob_chunk_size)
    batches = shared_prompt.plan(model, groups, None, shared_prompt.free_learner_memory(device),
                                 train.TrainConfig.logprob_chunk_size)
    return torch.cuda.memory_allocated(device) + max(memory.peak_bytes(b) for b in batches)


def measure_aggregation_call(model, tokenizer, scale: Scale, device: str, floors: dict, size: str = "4b") -> dict:
    """train.py's aggregation call: agg_prompts prompts (13 at 4B: what rollout.generate plans for 17.6k-token
    prompts x 4 on an 80 GB card) x N2 samples x agg_new_tokens, planned by rollout.generate itself (the free GPU
    memory decides the calls, as in train.py). Calls made, time (the first call: compilation and graph captures
    included), peak memory."""
    rng = np.random.default_rng(3)
    prompts = [aggregation_prompt_text(scale, model.config.vocab_size, rng) for _ in range(scale.agg_prompts)]
    calls = []
    real = fastgen.sample_micro_batch

    def counted(model_, prompt_ids, copies, *args):
        calls.append(len(prompt_ids))
        return real(model_, prompt_ids, copies, *args)

    fastgen.sample_micro_batch = counted
    try:
        with Meter(device) as meter:
            out = rollout.generate(model, tokenizer, prompts, samples_per_prompt=scale.agg_samples,
                                   max_new_tokens=scale.agg_new_tokens)
    finally:
        fastgen.sample_micro_batch = real
        fastgen.release()
    P = int(np.mean([len(row[0].prompt_ids) for row in out]))
    r = {"prompts": scale.agg_prompts, "samples_per_prompt": scale.agg_samples, "prompt_tokens": P,
         "new_tokens": scale.agg_new_tokens, "prompts_per_call": calls, "seconds": meter.seconds,
         "peak_memory_GB": meter.peak_bytes / GB,
         "tokens_generated": sum(len(c.completion_ids) for row in out for c in row)}
    if size == "4b":
        r["model_seconds"] = _step_model().predict_generate_calls(calls, P, scale.agg_samples, scale.agg_new_tokens)
    return r


def measure_train_py_step(model, tokenizer, scale: Scale, device: str, floors: dict, size: str = "4b") -> dict:
    """One `train.py` step (train.main, in this process, on this model: no model written to disk) at step_problems
    problems x step_new_tokens, rewards by coin flips given as train.py's own --reward (coin_flip_reward: no math
    grader needed); --generation fast, the rest train.py's defaults (the grouped learner). Stage times from the
    run's metrics.jsonl; an error if train.py failed or its learner fell back to per sample."""
    import tempfile

    import checkpoint

    rng = np.random.default_rng(5)
    name = f"bench-{size}-random"
    for path, module in lora.lora_modules(model):  # train.py adds its own LoRA: hand it the bare model
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent), child, module.base_layer)
    rollout.CODE_BUILT_POLICIES[name] = lambda _device: (model, tokenizer)
    problemset.CODE_BUILT_PROBLEMS[name] = lambda: [
        problemset.Problem(random_words(scale.problem_tokens, model.config.vocab_size, rng), "1") for _ in range(8)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--model", name, "--data", name, "--steps", "1", "--batch-problems", str(scale.step_problems),
                "--max-draws", str(scale.step_problems), "--max-new-tokens", str(scale.step_new_tokens),
                "--max-prompt-tokens", str(scale.problem_tokens + 256), "--generation", "fast", "--no-plot",
                "--reward", f"{__name__}:coin_flip_reward",
                "--out", os.path.join(tmp, "run")] + ([] if device.startswith("cuda") else ["--device", "cpu"])
        t0 = time.perf_counter()
        calls: list = []
        with _timed_generate_calls(calls, announce="[train.py step] generate call"):
            code = train.main(argv)
        seconds = time.perf_counter() - t0
        if os.path.exists(os.path.join(tmp, "run", "metrics.jsonl")):
            rows = checkpoint.read_metrics(os.path.join(tmp, "run", "metrics.jsonl"))
    if code != 0 or not rows:
        return {"error": f"train.main exited {code}", "seconds": seconds}
    row = rows[0]
    if "train/learner_fallback" in row:  # this row is labelled the grouped learner's: never a per-sample time
        return {"error": f"the grouped learner did not run ({row['train/learner_fallback']})", "seconds": seconds}
    r = {"problems": scale.step_problems, "new_tokens": scale.step_new_tokens, "seconds": seconds,
         "search_s": row["time/search_s"], "aggregation_s": row["time/aggregation_s"], "learner_s": row["time/train_s"],
         "tokens_generated": row["tokens_generated"], "samples_trained": row.get("train/samples_trained"),
         "tokens_trained": row.get("train/tokens_trained")}
    if size == "4b":
        r["model"] = _step_model().predict_train_step(scale.step_problems, scale.step_new_tokens)
    return r


GPU_MEASUREMENTS = {"train": measure_train_step, "generate": measure_generate, "aggregation": measure_aggregation,
                    "spiral": measure_spiral_step, "learner": measure_learner,
                    "aggregation_call": measure_aggregation_call, "train_py": measure_train_py_step}


def run_gpu_part(args) -> dict:
    device = args.device or "cuda"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    scale = dataclasses.replace(SCALES[args.size])
    if args.max_new_tokens:
        n = args.max_new_tokens
        scale = dataclasses.replace(scale, gen_new_tokens=n, agg_new_tokens=n, step_new_tokens=n, grpo_new_tokens=2 * n)
    if args.agg_prompts:
        scale = dataclasses.replace(scale, agg_prompts=args.agg_prompts)
    if args.step_problems:
        scale = dataclasses.replace(scale, step_problems=args.step_problems)
    torch.manual_seed(0)
    model, tokenizer = build_policy(args.size, device, dtype)
    lora.add_lora(model, rank=32, alpha=32.0)  # train.py's setup: rank 32 on every projection, checkpointing
    train.enable_gradient_checkpointing(model)
    model.generation_engine = args.engine  # rollout.generate's default engine for this model (rows 2-4)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    floors = measure_floors(device, dtype, args.size)
    results = {"device": name, "date": time.strftime("%Y-%m-%d"), "size": args.size, "dtype": str(dtype),
               "engine": args.engine,
               "torch": torch.__version__, "scale": dataclasses.asdict(scale), "floors": floors,
               "datasheet_bf16_TFLOPs": datasheet_tflops(name)}
    print(f"bench.py: {args.size} on {name}: copy {floors['copy_bandwidth_GBps']:.0f} GB/s, "
          f"matmul {floors['matmul_TFLOPs']:.3g} TFLOP/s ({floors['matmul_dtype']})", flush=True)
    for key in args.only:
        kwargs = {}
        if key in ("generate", "aggregation", "spiral"):
            kwargs["adapter"] = args.rollout_adapter
        if key == "aggregation":
            kwargs["micro_batch_size"] = args.agg_micro_batch
        if key == "spiral":
            kwargs["grpo"] = not args.skip_grpo
        if key in ("learner", "aggregation_call", "train_py"):
            kwargs["size"] = args.size
        try:
            results[key] = GPU_MEASUREMENTS[key](model, tokenizer, scale, device, floors, **kwargs)
        except Exception as e:  # noqa: BLE001 - recorded; the next measurement runs (an out-of-memory is a result)
            import traceback

            traceback.print_exc()
            results[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            fastgen.release()
        print_result(key, results[key])
        if args.json:
            write_json(args.json, results)  # after every measurement: a run cut short keeps what it measured
    return results


def _vs_model(measured: float, predicted: float | None) -> str:
    return "" if predicted is None else f" (step model: {predicted:.1f} s, measured/model {measured / predicted:.2f})"


def print_result(key: str, r: dict) -> None:
    if "error" in r and key != "learner_row":
        print(f"[{key}] error: {r['error']}", flush=True)
    elif key == "learner":
        pass  # printed row by row (learner_row) as it runs
    elif key == "learner_row":
        if "error" in r:
            print(f"[learner {r['key']}] error: {r['error']}", flush=True)
            return
        planned = f" (planned {r['planned_peak_memory_GB']:.1f} GB)" if "planned_peak_memory_GB" in r else ""
        print(f"[learner {r['key']}] {r['prompt_tokens']:,} + {r['completions_trained']} x "
              f"{r['completion_tokens']:,} tokens: "
              f"{r['seconds']:.2f} s{_vs_model(r['seconds'], r.get('model_seconds'))}, peak "
              f"{r['peak_memory_GB']:.1f} GB{planned}, MFU {100 * r['mfu']:.1f}% ({r['model_TFLOP']:.4g} model "
              "TFLOP)", flush=True)
    elif key == "aggregation_call":
        print(f"[aggregation call] {r['prompts']} prompts x {r['samples_per_prompt']} (~{r['prompt_tokens']:,} prompt "
              f"tokens, {r['new_tokens']:,} new) in calls of {r['prompts_per_call']} prompts: {r['seconds']:.1f} s"
              f"{_vs_model(r['seconds'], r.get('model_seconds'))} (first call: compilation and captures included), "
              f"peak {r['peak_memory_GB']:.1f} GB", flush=True)
    elif key == "train_py":
        m = r.get("model") or {}
        print(f"[train.py step] {r['problems']} problem(s) x {r['new_tokens']:,} new tokens, coin-flip rewards: "
              f"search {r['search_s']:.1f} s{_vs_model(r['search_s'], m.get('search_s'))}, aggregation "
              f"{r['aggregation_s']:.1f} s{_vs_model(r['aggregation_s'], m.get('aggregation_s'))}, learner "
              f"{r['learner_s']:.1f} s{_vs_model(r['learner_s'], m.get('learner_s'))}; {r['samples_trained']} "
              f"samples trained; whole run {r['seconds']:.0f} s", flush=True)
    elif key == "train":
        print(f"[1 train] {r['prompt_tokens']} + {r['completion_tokens']} tokens: {r['seconds']:.2f} s, "
              f"peak {r['peak_memory_GB']:.1f} GB (goal <= {r['goal_peak_memory_GB']:.0f}), "
              f"MFU {100 * r['mfu']:.1f}% (goal >= {100 * r['goal_mfu']:.0f}%; {r['model_TFLOP']:.3g} model TFLOP, "
              f"floor {r['floor_seconds']:.2f} s at the measured matmul rate), HFU {100 * r['hfu']:.1f}%")
    elif key == "generate":
        print(f"[2 generate] batch {r['batch']} x {r['decode_steps']} steps (prompt {r['prompt_tokens']}): "
              f"{r['tokens_per_s']:.0f} tokens/s in {r['seconds']:.1f} s; HBM floor {r['floor_tokens_per_s']:.0f} "
              f"tokens/s; {100 * r['fraction_of_floor']:.1f}% of floor (goal >= "
              f"{100 * r['goal_fraction_of_floor']:.0f}%); peak {r['peak_memory_GB']:.1f} GB")
    elif key == "aggregation":
        s, n = r["shared_prefix"], r["no_shared_prefix"]
        print(f"[3 aggregation] {r['prompts']} prompts x {r['samples_per_prompt']} (~{r['prompt_tokens_mean']:.0f} "
              f"prompt tokens, {r['new_tokens']} new, micro-batch {r['micro_batch_size']}): shared prefix "
              f"{s['seconds']:.1f} s / {s['peak_memory_GB']:.1f} GB, without {n['seconds']:.1f} s / "
              f"{n['peak_memory_GB']:.1f} GB (x{r['speedup_from_sharing']:.2f})")
    elif key == "spiral":
        s = r["spiral"]
        print(f"[4 spiral] {r['problems']} problem(s): search {s['search_s']:.1f} s, aggregation "
              f"{s['aggregation_s']:.1f} s, other {s['other_collection_s']:.1f} s, training {s['training_s']:.1f} s; "
              f"{s['tokens_generated']} tokens generated (budget {s['token_budget']}); "
              f"peak {s['peak_memory_GB']:.1f} GB")
        if "grpo" in r:
            g = r["grpo"]
            print(f"[4 grpo]   {r['problems']} problem(s): generate {g['generate_s']:.1f} s, training "
                  f"{g['training_s']:.1f} s; {g['tokens_generated']} tokens generated (budget {g['token_budget']}); "
                  f"SPIRAL / GRPO time x{r['time_ratio_spiral_over_grpo']:.2f}")


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "bench_gpu.py", "benchmarks/bench.py uses")
