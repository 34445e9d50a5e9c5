"""Memory and speed of SPIRAL-ref at the 4B scale on one GPU, and of the chunked log-probs on CPU.

What it measures (issue 7), always through the project's own code paths (rollout.generate, spiral.collect_*,
lora.add_lora / completion_logprobs / accumulate_gradients / train_step), on Qwen3-4B's architecture built from
its published configuration with RANDOM weights (no download). Random weights almost never emit an EOS (3 of
151,936 ids), so sequences run to their maximum length: a worst case.

GPU part (bf16, sdpa attention, LoRA rank 32 on every projection, gradient checkpointing: train.py's setup).
Each figure is printed next to its goal and next to a floor measured in the same run: the device's copy bandwidth
(a 1 GiB device-to-device copy, bytes read + written / time) and its dense bf16 matmul rate (8192^3 matmuls).
  1. train    one training micro-step (forward + backward) on the paper's longest aggregation sample:
              a 1,024-token problem + 4 candidates of 4,096 tokens + the template (~17.6k prompt tokens) and a
              4,096-token completion. Peak memory (goal <= 24 GB) and MFU (goal >= 40%).
              FLOP count (`train_step_flops`): the base is frozen, so its backward computes input gradients only,
                model FLOPs = 4 N T                      decoder linears: forward 2NT + input gradients 2NT
                            + 6 N_lora T                 LoRA: forward, input and weight gradients
                            + 3 A(T)                     attention: forward A(T), backward 2 A(T)
                            + 4 d V T_c                  lm_head on the completion positions only, forward + input grad
              with N = 3.63e9 decoder matmul weights, A(T) = 4 (heads x head_dim) T(T+1)/2 per layer (causal
              QK^T and PV). MFU = model FLOPs / (time x measured matmul rate). The recomputation that
              checkpointing adds (one more forward of every layer and of each lm_head chunk) is NOT counted in MFU;
              it is reported separately as hardware FLOPs utilisation (HFU).
  2. generate rollout.generate at batch 64 (8 prompts x 8 samples, the search stage of 8 problems) with 4,096 new
              tokens: tokens/s, and the fraction of the HBM floor (goal >= 40%). Floor: each decode step reads every
              weight once (the tied embedding once, as lm_head) and the whole KV cache of every sequence once,
              floor time = sum over steps of those bytes / copy bandwidth + prefill FLOPs / matmul rate.
  3. aggregation  the aggregation stage: 16 prompts of ~17.6k tokens x N2 = 4 samples x 4,096 new tokens, with and
              without the shared-prefix prefill of rollout.generate (share_prefix=True/False): time, peak memory.
  4. spiral   a full SPIRAL step at the paper's settings (N1=8, n=4, K=4, N2=4, 4,096 tokens) for a small batch of
              problems: wall time split into search / aggregation / other collection work / training, and tokens
              generated; then the GRPO step at equal budget (G=12 x 8,192 tokens) the same way. Random weights never
              solve a problem, so every reward would be 0 and dynamic sampling would keep nothing to train on: the
              benchmark grades with seeded coin flips instead (`_coin_flip_rewards`), the worst case for training.
CPU part (runs in CI at --small size):
  5. logprobs peak memory of completion_logprobs (chunked lm_head, the training path) against a naive
              full-logits path, forward + backward of the importance-sampling loss, at vocabulary 151,936 and
              4,096 completion tokens, as a ratio measured in one run (goal >= 8x lower), and the time ratio.
              Method: each path runs in a fresh subprocess; after building the model and inputs, free memory is
              returned to the OS (malloc_trim), the kernel's peak-RSS counter is reset (/proc/self/clear_refs 5),
              and the path's peak is VmHWM - VmRSS measured before it (fallback: ru_maxrss delta). tracemalloc
              would see none of torch's allocations, and torch has no CPU peak-memory counter.
  7. decode   one decode step of rollout.generate(engine="hf") and engine="fast" (fastgen.py, eager on a CPU) on the
              tiny model at batch 64 (8 prompts x 8 samples, LoRA r=32 active): milliseconds per step (generate
              with 1 + n new tokens minus with 1, over n; minimum of repeats), a proxy for per-step overhead; and the
              bytes a step copies besides reading the weights and the cache (CopyCounter: concatenations such as a
              DynamicCache growing, copies such as expanded K/V heads or the logits' fp32 copy, masks).
GPU rows 2-4 take --engine hf|fast (fast: the decode step compiled with CUDA graphs).

Run it (from the repository root):
    python benchmarks/bench.py --cpu --json cpu.json                   # 5, at 4,096 tokens (~4 min, shared 2-core CPU)
    python benchmarks/bench.py --cpu --small                           # 5, at 512 tokens, and 7 (what CI runs)
    python benchmarks/bench.py --cpu --cpu-parts decode --json d.json  # 7 alone (~1 min)
    python benchmarks/bench.py --only generate --engine fast           # 2 with fastgen.py
    python benchmarks/bench.py --json gpu.json                         # 1-4 on a CUDA GPU (see README for time)
    python benchmarks/bench.py --only train,generate                   # a subset
    python benchmarks/bench.py --size toy --device cpu                 # the GPU code path on a toy model, on CPU
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config  # noqa: E402

import checkpoint  # noqa: E402
import cli  # noqa: E402
import fastgen  # noqa: E402
import problemset  # noqa: E402
import rollout  # noqa: E402
import spiral  # noqa: E402
import train  # noqa: E402
from logprobs import TokenBatch, completion_logprobs, position_ids_from_mask  # noqa: E402
import lora  # noqa: E402
import tiny  # noqa: E402

GB = 1e9

# ----------------------------------------------------------------------------------------------------------------------
# 1. The model (random weights) and a tokenizer that round-trips every id

# Qwen3-4B-Instruct-2507's config.json (architecture only; the weights here are random).
QWEN3_4B = dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=9728, vocab_size=151_936, tie_word_embeddings=True, max_position_embeddings=262_144,
                rope_theta=5_000_000.0, rms_norm_eps=1e-6)
# The same code path at a size a CPU runs in seconds (tests, --size toy).
TOY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
           intermediate_size=128, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=8192,
           rope_theta=5_000_000.0, rms_norm_eps=1e-6)
MODEL_CONFIGS = {"4b": QWEN3_4B, "toy": TOY}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]  # ids 0..3


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer over the model's whole vocabulary: id i <-> the word "w{i}" (ids 0-3 are special).

    decode joins words with spaces and encoding splits on whitespace, so a random model's completion, decoded and
    put into an aggregation prompt, costs exactly as many prompt tokens as it had completion tokens: the prompt
    lengths of the real pipeline, without Qwen's 151k-token BPE. Every English word of the paper's templates is
    one [UNK] token. Special tokens, ChatML template, EOS and pad are Qwen3's (as in tiny.build_tiny_tokenizer).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", unk_token="[UNK]",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = tiny.CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_policy(size: str, device: str, dtype: torch.dtype):
    """(model, tokenizer): Qwen3 at `size` with random weights (initialised on `device`) and the synthetic tokenizer."""
    tokenizer = synthetic_tokenizer(MODEL_CONFIGS[size]["vocab_size"])
    eos_ids = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(**MODEL_CONFIGS[size], bos_token_id=None, eos_token_id=eos_ids,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
    return model.eval(), tokenizer


def save_random_model(out_dir: str, size: str, device: str | None) -> int:
    """build_policy at `size`, saved with save_pretrained: a model directory train.py and evaluate.py load like any
    other (random weights never answer, so every reward is 0: it measures the pipeline, not learning)."""
    if os.path.exists(out_dir) and os.listdir(out_dir):
        print(f"bench.py: error: --save-model {out_dir} exists and is not empty", file=sys.stderr)
        return 2
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = build_policy(size, device, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    print(f"bench.py: saved Qwen3 ({size}, random weights) and the synthetic tokenizer to {out_dir}")
    return 0


def random_words(count: int, vocab_size: int, rng: np.random.Generator) -> str:
    """`count` random non-special words: exactly `count` tokens of the synthetic tokenizer."""
    return " ".join(f"w{i}" for i in rng.integers(len(SPECIAL_TOKENS), vocab_size, count))


# ----------------------------------------------------------------------------------------------------------------------
# 2. Timing, peak memory and the device's floors


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return None


def _reset_cpu_peak() -> bool:
    """Return freed heap memory to the OS, then reset the kernel's peak-RSS counter (VmHWM := VmRSS)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Meter:
    """Wall time and peak memory of a block. CUDA: torch's peak allocated bytes (absolute, weights included).
    CPU: the process's peak resident set (VmHWM after a reset; ru_maxrss if the reset is unavailable)."""

    def __init__(self, device: str):
        self.device = device
        self.seconds = self.peak_bytes = self.start_bytes = None
        self.method = "torch.cuda.max_memory_allocated" if device.startswith("cuda") else None

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.start_bytes = torch.cuda.memory_allocated()
        else:
            self.method = "VmHWM" if _reset_cpu_peak() else "ru_maxrss"
            self.start_bytes = (_rss_kib("VmRSS") or 0) * 1024
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        _sync(self.device)
        self.seconds = time.perf_counter() - self._t0
        if self.device.startswith("cuda"):
            self.peak_bytes = torch.cuda.max_memory_allocated()
        elif self.method == "VmHWM":
            self.peak_bytes = (_rss_kib("VmHWM") or 0) * 1024
        else:
            self.peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return False


def measure_floors(device: str, dtype: torch.dtype, size: str) -> dict:
    """The device's copy bandwidth (bytes read + written per second) and dense matmul rate (FLOP/s), measured."""
    big = size == "4b"
    n_bytes, n = (1 << 30, 8192) if big else (1 << 24, 256)
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def best_of(fn, repeats):
        fn()
        _sync(device)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            _sync(device)
            times.append((time.perf_counter() - t0) / repeats)
        return min(times)

    copy_s = best_of(lambda: dst.copy_(src), 10)
    matmul_s = best_of(lambda: torch.mm(a, b), 10)
    del src, dst, a, b
    return {"copy_bandwidth_GBps": 2 * n_bytes / copy_s / GB, "matmul_TFLOPs": 2 * n ** 3 / matmul_s / 1e12,
            "matmul_dtype": str(dtype).replace("torch.", "")}


# Datasheet dense bf16 rates, for reference next to the measured ones (not used for the goals).
DATASHEET_BF16_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4}


def datasheet_tflops(device_name: str) -> float | None:
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in device_name), None)


# ----------------------------------------------------------------------------------------------------------------------
# 3. FLOP and byte counts


def decoder_matmul_params(cfg) -> int:
    """N: weights of the decoder's linears (q, k, v, o, gate, up, down), which every token passes through."""
    d, q, kv, m = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, \
        cfg.intermediate_size
    return cfg.num_hidden_layers * (d * q + 2 * d * kv + q * d + 3 * d * m)


def lora_params(model) -> int:
    return sum(p.numel() for name in lora.adapter_names(model) for p in lora.lora_parameters(model, name))


def attention_flops(cfg, T: int) -> int:
    """A(T): forward QK^T and PV of causal attention over one sequence of T tokens, all layers."""
    return cfg.num_hidden_layers * 4 * cfg.num_attention_heads * cfg.head_dim * T * (T + 1) // 2


def train_step_flops(cfg, T: int, completion_tokens: int, n_lora: int) -> dict:
    """Model FLOPs (what MFU divides by) and hardware FLOPs (adds checkpointing's recomputation) of one forward +
    backward over a T-token sequence whose last `completion_tokens` tokens go through lm_head (module docstring)."""
    N, A = decoder_matmul_params(cfg), attention_flops(cfg, T)
    head = 2 * cfg.hidden_size * cfg.vocab_size * completion_tokens  # one lm_head matmul over the completion
    forward = 2 * N * T + 2 * n_lora * T + A + head
    backward = 2 * N * T + 4 * n_lora * T + 2 * A + head  # input gradients only for the frozen base and lm_head
    recompute = 2 * N * T + 2 * n_lora * T + A + head  # checkpointed decoder layers and lm_head chunks, once more
    return {"model_flops": forward + backward, "hardware_flops": forward + backward + recompute,
            "attention_share": 3 * A / (forward + backward)}


def kv_bytes_per_token(cfg, element_size: int) -> int:
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * element_size


def weight_bytes(model) -> int:
    """Bytes of every distinct parameter (the tied embedding once: it is read as lm_head every step)."""
    seen = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


# ----------------------------------------------------------------------------------------------------------------------
# 4. GPU measurements (any device; the 4b size needs CUDA)


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
    kwargs = dict(loss_normalizer=float(len(completion_ids)), temperature=1.0,
                  micro_batch_tokens=max(defaults.micro_batch_tokens, T), chunk_size=defaults.logprob_chunk_size,
                  pad_token_id=tokenizer.pad_token_id)
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
    if getattr(model, "generation_engine", "hf") == "fast":  # compiled per (batch, cache length): warm up at both
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
    prefill_flops = 2 * decoder_matmul_params(cfg) * L * scale.gen_prompts + attention_flops(cfg, L) * scale.gen_prompts
    floor_s = decode_bytes / (floors["copy_bandwidth_GBps"] * GB) + prefill_flops / (floors["matmul_TFLOPs"] * 1e12)
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


@contextlib.contextmanager
def _timed_generate_calls(calls: list):
    """Record the wall time of each rollout.generate call that spiral makes (search first, then aggregation)."""
    saved = spiral.generate

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = saved(*args, **kwargs)  # returns Python lists: the device is synchronised
        calls.append(time.perf_counter() - t0)
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


GPU_MEASUREMENTS = {"train": measure_train_step, "generate": measure_generate, "aggregation": measure_aggregation,
                    "spiral": measure_spiral_step}


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
        results[key] = GPU_MEASUREMENTS[key](model, tokenizer, scale, device, floors, **kwargs)
        print_result(key, results[key])
    return results


def print_result(key: str, r: dict) -> None:
    if key == "train":
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


# ----------------------------------------------------------------------------------------------------------------------
# 5. CPU: chunked log-probs against the naive full-logits path


def naive_completion_logprobs(model, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """The obvious path: full (B, T, V) fp32 logits, log_softmax, gather at completion positions.

    Kept lean so the comparison does not flatter the chunked path: no entropy, and no division at temperature 1.
    """
    position_ids = position_ids_from_mask(batch.attention_mask)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids,
                   use_cache=False).logits.float()[:, :-1]  # (B, T-1, V)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    del logits
    targets = batch.input_ids[:, 1:, None]  # (B, T-1, 1)
    return logp_all.gather(-1, targets).squeeze(-1)[batch.completion_mask[:, 1:]]  # (N,)


def logprob_worker(spec: dict) -> dict:
    """One path, in its own process: build a small Qwen3 body with the full vocabulary, add LoRA, then measure the
    peak memory and time of log-probs + importance-sampling loss + backward. Saves log-probs and LoRA gradients."""
    torch.manual_seed(spec["seed"])
    V = spec["vocab_size"]
    config = Qwen3Config(hidden_size=spec["hidden_size"], num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=spec["hidden_size"] // 4,
                         intermediate_size=3 * spec["hidden_size"], vocab_size=V, tie_word_embeddings=True,
                         max_position_embeddings=8192)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    params = lora.add_lora(model, rank=32, alpha=32.0)
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():  # B != 0, so every LoRA parameter gets a gradient
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    train.enable_gradient_checkpointing(model)
    model.train()
    P, L = spec["prompt_tokens"], spec["completion_tokens"]
    ids = torch.randint(len(SPECIAL_TOKENS), V, (P + L,), generator=g).tolist()
    sample = spiral.Sample(ids[:P], ids[P:], [-math.log(V)] * L, 1.0, "search")
    batch = TokenBatch.from_samples([sample], 0, "cpu")
    advantages = torch.randn(L, generator=g)  # (N,) a different advantage per token: a non-trivial gradient
    sampler = torch.tensor(sample.sampler_logprobs)  # (N,)

    with Meter("cpu") as meter:
        if spec["path"] == "chunked":
            logprobs, _ = completion_logprobs(model, batch, spec["temperature"], spec["chunk_size"])
        else:
            logprobs = naive_completion_logprobs(model, batch, spec["temperature"])
        loss, _ = train.importance_sampling_loss(logprobs, sampler, advantages, float(L))
        loss.backward()
    torch.save({"logprobs": logprobs.detach(), "grads": [p.grad for p in params]}, spec["out"])
    return {"path": spec["path"], "chunk_size": spec.get("chunk_size"), "seconds": meter.seconds,
            "peak_bytes": meter.peak_bytes - meter.start_bytes, "baseline_bytes": meter.start_bytes,
            "method": meter.method}


def _run_worker(spec: dict) -> dict:
    """logprob_worker in a fresh interpreter (nothing allocated by an earlier path can hide in its heap)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--logprob-worker", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"log-prob worker ({spec['path']}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cpu_part(args) -> dict:
    """5. Peak memory and time of the chunked path for each chunk size, against one naive run."""
    completion = 512 if args.small else 4096
    chunk_sizes = args.chunk_sizes or ([128] if args.small else [train.TrainConfig().logprob_chunk_size])
    base = dict(vocab_size=151_936, hidden_size=256, prompt_tokens=32, completion_tokens=completion,
                temperature=1.0, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        naive = _run_worker({**base, "path": "naive", "out": os.path.join(tmp, "naive.pt")})
        reference = torch.load(os.path.join(tmp, "naive.pt"))
        chunked = []
        for c in chunk_sizes:
            out = os.path.join(tmp, f"chunked{c}.pt")
            r = _run_worker({**base, "path": "chunked", "chunk_size": c, "out": out})
            got = torch.load(out)
            r["max_abs_logprob_diff"] = float((got["logprobs"] - reference["logprobs"]).abs().max())
            r["max_rel_grad_diff"] = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                                         for a, b in zip(got["grads"], reference["grads"]))
            r["memory_ratio"] = naive["peak_bytes"] / r["peak_bytes"]
            r["time_ratio"] = r["seconds"] / naive["seconds"]
            chunked.append(r)
    first = chunked[0]
    results = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "date": time.strftime("%Y-%m-%d"), **base, "model": "Qwen3 body: 1 layer, hidden 256, LoRA r=32, fp32",
        "method": "fresh subprocess per path; peak RSS (VmHWM after clear_refs) minus RSS before the path",
        "naive": naive, "chunked": chunked,
        "logprob_memory_ratio": first["memory_ratio"],  # naive peak / chunked peak (at the first chunk size)
        "logprob_time_ratio": first["time_ratio"],  # chunked time / naive time
        "logprob_chunk_size": first["chunk_size"], "goal_memory_ratio": 8.0,
    }
    print(f"[5 logprobs] vocab {base['vocab_size']}, {completion} completion tokens, forward + backward: "
          f"naive {naive['peak_bytes'] / GB:.2f} GB in {naive['seconds']:.1f} s")
    for r in chunked:
        print(f"[5 logprobs] chunked (chunk {r['chunk_size']}): {r['peak_bytes'] / GB:.2f} GB in {r['seconds']:.1f} s: "
              f"{r['memory_ratio']:.1f}x less memory (goal >= 8x), {r['time_ratio']:.2f}x the time; "
              f"max |d logprob| {r['max_abs_logprob_diff']:.1e}, max rel. grad diff {r['max_rel_grad_diff']:.1e}")
    return results


# ----------------------------------------------------------------------------------------------------------------------
# 7. CPU: one decode step of each generate engine (tiny model, batch 64, LoRA active); README row 6: eval_batching.py

COPY_OPS = {"cat": "concatenation", "stack": "concatenation", "clone": "copy", "_to_copy": "copy", "copy_": "copy",
            "contiguous": "copy", "repeat_interleave": "copy", "index_select": "copy", "where": "mask",
            "masked_fill": "mask", "masked_fill_": "mask"}
NECESSARY_OPS = {"index_copy_", "index_copy", "index_put_", "embedding"}  # the new token's K, V and embedding


class CopyCounter(TorchDispatchMode):
    """Bytes written by data-movement ops, by category: concatenations (cat, stack), copies (clone, casts, copy_,
    repeat_interleave: expanded K/V heads land here), masks (any boolean result, where, masked_fill). Matmuls,
    norms, activations and the sampler's (B, V) arithmetic are compute, not copies; writing the new token's K and V
    into a static cache (index_copy_) is necessary and counted apart."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.by_op: dict[str, int] = {}

    SOURCE_ARG = {"copy_": 1, "index_copy_": 3, "index_put_": 2}  # in-place writes of part of a tensor: the source

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view:  # a view writes nothing
            return out
        result = args[self.SOURCE_ARG.get(name, 0)] if name.endswith("_") else out
        results = result if isinstance(result, (tuple, list)) else [result]
        tensors = [t for t in results if isinstance(t, torch.Tensor)]
        written = sum(t.numel() * t.element_size() for t in tensors)
        category = ("necessary" if name in NECESSARY_OPS else COPY_OPS.get(name)
                    or ("mask" if tensors and tensors[0].dtype == torch.bool else None))
        if category and written:
            self.bytes[category] = self.bytes.get(category, 0) + written
            self.by_op[f"{category}:{name}"] = self.by_op.get(f"{category}:{name}", 0) + written
        return out


def _decode_run(model, tokenizer, prompts, samples: int, new_tokens: int, engine: str, counter=None) -> float:
    torch.manual_seed(0)
    with counter or contextlib.nullcontext():
        t0 = time.perf_counter()
        rollout.generate(model, tokenizer, prompts, samples_per_prompt=samples, max_new_tokens=new_tokens,
                         micro_batch_size=len(prompts) * samples, engine=engine)
        return time.perf_counter() - t0


def measure_decode(model, tokenizer, prompts, samples: int, steps: int, repeats: int, engine: str) -> dict:
    """Milliseconds and bytes copied per decode step: generate with 1 + steps new tokens minus generate with 1 (the
    prefill and the first sample), over steps. Time: the minimum of `repeats`; bytes: CopyCounter, once."""
    times = {n: min(_decode_run(model, tokenizer, prompts, samples, n, engine) for _ in range(repeats))
             for n in (1, 1 + steps)}
    counts = {}
    for n in (1, 1 + steps):
        counts[n] = CopyCounter()
        _decode_run(model, tokenizer, prompts, samples, n, engine, counts[n])
    def per_step(table: str) -> dict:
        long, short = getattr(counts[1 + steps], table), getattr(counts[1], table)
        return {k: (v - short.get(k, 0)) / steps for k, v in long.items()}

    copied = per_step("bytes")
    return {"engine": engine, "ms_per_step": 1000 * (times[1 + steps] - times[1]) / steps,
            "seconds_1_token": times[1], f"seconds_{1 + steps}_tokens": times[1 + steps],
            "bytes_copied_per_step": sum(v for k, v in copied.items() if k != "necessary"),
            "bytes_per_step_by_category": copied, "bytes_per_step_by_op": per_step("by_op")}


def run_decode_part(args) -> dict:
    """7. Decode cost of engine="hf" against engine="fast": tiny model (random weights: rows rarely stop), LoRA r=32
    active as train.py samples, 8 prompts x 8 samples = batch 64."""
    steps, repeats = (8, 1) if args.small else (32, 5)
    torch.manual_seed(0)
    model, tokenizer = tiny.load_tiny_policy("cpu")
    lora.add_lora(model, rank=32, alpha=32.0)
    prompts = [rollout.search_prompt(p.problem) for p in tiny.tiny_sum_problems()[:8]]
    cache_tokens = max(len(rollout.chat_prompt_ids(tokenizer, p)) for p in prompts) + steps
    kv_step = 64 * kv_bytes_per_token(model.config, 4) * cache_tokens  # the cache one step reads, at the end
    results = {"date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads(), "batch": 64,
               "decode_steps": steps, "repeats": repeats, "kv_cache_bytes_read_last_step": kv_step,
               "model": "tiny Qwen3 (4 layers, hidden 128, 4 heads / 2 KV heads), random weights, LoRA r=32, fp32"}
    for engine in rollout.ENGINES:
        r = results[engine] = measure_decode(model, tokenizer, prompts, 8, steps, repeats, engine)
        print(f"[7 decode] {engine}: {r['ms_per_step']:.2f} ms per step at batch 64 ({results['torch_threads']} "
              f"threads, min of {repeats}); copies {r['bytes_copied_per_step'] / 1e6:.3f} MB per step "
              f"({', '.join(f'{k} {v / 1e6:.3f}' for k, v in r['bytes_per_step_by_category'].items())}); the KV "
              f"cache a step reads: {kv_step / 1e6:.3f} MB")
    return results


# ----------------------------------------------------------------------------------------------------------------------
# 8. Command line


def build_parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog="bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="run the CPU part (5: log-prob memory, 7: decode step cost) "
                                                        "instead of the GPU part")
    p.add_argument("--cpu-parts", type=lambda s: s.split(","), default=["logprobs", "decode"],
                   help="CPU part: comma-separated subset of logprobs,decode")
    p.add_argument("--small", action="store_true", help="CPU part at 512 completion tokens, chunk 128, and 8 decode "
                                                          "steps timed once (CI)")
    p.add_argument("--chunk-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="CPU part: chunk sizes to compare (the first gives logprob_memory_ratio); default: "
                        "train.py's logprob_chunk_size")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH (a new file or an earlier "
                                                  "bench.py result, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="let --json replace a file bench.py did not write")
    p.add_argument("--size", choices=sorted(SCALES), default="4b", help="GPU part: 4b (Qwen3-4B) or toy")
    p.add_argument("--device", default=None, help="GPU part: device (default cuda; toy may use cpu)")
    p.add_argument("--only", type=lambda s: s.split(","), default=list(GPU_MEASUREMENTS),
                   help=f"GPU part: comma-separated subset of {','.join(GPU_MEASUREMENTS)}")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="GPU part: new tokens for generate/aggregation/spiral (GRPO gets twice); default 4096")
    p.add_argument("--agg-prompts", type=int, default=None, help="GPU part: aggregation prompts (default 16)")
    p.add_argument("--agg-micro-batch", type=int, default=None,
                   help="GPU part: sequences per generate call in the aggregation stage (default: rollout's)")
    p.add_argument("--step-problems", type=int, default=None, help="GPU part: problems in the SPIRAL step (default 1)")
    p.add_argument("--skip-grpo", action="store_true", help="GPU part: no GRPO step in measurement 4")
    p.add_argument("--engine", choices=["hf", "fast"], default="hf",
                   help="GPU part: rollout.generate's engine for 2-4 (fast: fastgen.py, compiled with CUDA graphs)")
    p.add_argument("--rollout-adapter", action=argparse.BooleanOptionalAction, default=True,
                   help="GPU part: sample with the LoRA adapter active, as train.py does (default on)")
    p.add_argument("--save-model", metavar="DIR",
                   help="save Qwen3 at --size with random weights and the synthetic tokenizer to DIR (bf16 on a "
                        "GPU, fp32 on a CPU), so that `python train.py --model DIR` runs the user's own command")
    p.add_argument("--logprob-worker", help=argparse.SUPPRESS)
    return p


def check_args(args) -> None:
    """Every flag, before anything is built or measured: cli.ConfigError (one line, exit 2) on bad input."""
    for name in ("max_new_tokens", "agg_prompts", "agg_micro_batch", "step_problems"):
        cli.check_count(name, getattr(args, name))
    for size in args.chunk_sizes or []:
        cli.check_count("chunk_sizes", size)
    if args.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise cli.ConfigError(f"--device {args.device}: expected cpu, cuda or cuda:N")
    if args.save_model is not None:
        path = args.save_model
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise cli.ConfigError(f"--save-model {path} exists and is not an empty directory")
        why = checkpoint.out_path_problem(path)
        if why:
            raise cli.ConfigError(f"--save-model {path!r}: {why}")
        if not (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
            config = Qwen3Config(**MODEL_CONFIGS[args.size])
            gigabytes = 4 * (decoder_matmul_params(config) + config.vocab_size * config.hidden_size) / 1e9  # fp32
            available = _meminfo_kib("MemAvailable")
            if available is not None and gigabytes > available * 1024 / 1e9:
                raise cli.ConfigError(f"--save-model at --size {args.size} on CPU builds {gigabytes:.0f} GB in fp32, "
                                      f"more than the {available * 1024 / 1e9:.0f} GB available; use --size toy, or "
                                      "a GPU (bf16, half the size)")
            if gigabytes > 1:
                print(f"bench.py: warning: --save-model builds {gigabytes:.0f} GB in fp32 on CPU", file=sys.stderr)
    if args.json is not None:
        if not args.json.strip() or os.path.isdir(args.json):
            raise cli.ConfigError(f"--json {args.json!r}: expected a file path")
        why = checkpoint.unwritable(os.path.dirname(os.path.abspath(args.json)))
        if why:
            raise cli.ConfigError(f"--json {args.json}: {why}")
        if os.path.exists(args.json) and not args.overwrite and not _written_by_bench(args.json):
            raise cli.ConfigError(f"--json {args.json} exists and was not written by bench.py; choose another path "
                                  "or pass --overwrite")


def _written_by_bench(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("written_by") == "bench.py"
    except (OSError, ValueError, AttributeError):
        return False


def _meminfo_kib(field: str) -> int | None:
    """A /proc/meminfo field in KiB (None where there is no /proc)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        check_args(args)
    except cli.ConfigError as exc:
        print(f"bench.py: error: {exc}", file=sys.stderr)
        return 2
    if args.logprob_worker:
        print(json.dumps(logprob_worker(json.loads(args.logprob_worker))))
        return 0
    if args.save_model:
        return save_random_model(args.save_model, args.size, args.device)
    if args.cpu:
        unknown = [k for k in args.cpu_parts if k not in ("logprobs", "decode")]
        if unknown:
            print(f"bench.py: error: --cpu-parts {','.join(unknown)}: choose from logprobs,decode", file=sys.stderr)
            return 2
        results = run_cpu_part(args) if "logprobs" in args.cpu_parts else {}
        if "decode" in args.cpu_parts:
            results["decode"] = run_decode_part(args)
    else:
        unknown = [k for k in args.only if k not in GPU_MEASUREMENTS]
        if unknown:
            print(f"bench.py: error: --only {','.join(unknown)}: choose from {','.join(GPU_MEASUREMENTS)}",
                  file=sys.stderr)
            return 2
        device = args.device or "cuda"
        if (device.startswith("cuda") or args.size == "4b") and not torch.cuda.is_available():
            print("bench.py: error: no CUDA GPU found; the GPU part needs one (run --cpu for the CPU part, or "
                  "--size toy --device cpu to run the GPU code path on a toy model)", file=sys.stderr)
            return 2
        if args.size == "4b" and not device.startswith("cuda"):
            print("bench.py: error: --size 4b needs --device cuda (use --size toy on CPU)", file=sys.stderr)
            return 2
        results = run_gpu_part(args)
    if args.json:
        tmp = f"{args.json}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"written_by": "bench.py", **results}, f, indent=2)
        os.replace(tmp, args.json)
        print(f"bench.py: wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
