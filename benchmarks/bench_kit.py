"""What every row of bench.py is built from: Qwen3 with random weights and a tokenizer that round-trips every id,
Meter (wall time and peak memory of a block), the device's floors (copy bandwidth, matmul rate), and the FLOP and
byte counts the goals are judged by (bench.py's docstring states them)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import re
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config  # noqa: E402

import lora  # noqa: E402
import tiny  # noqa: E402

GB = 1e9

# ----------------------------------------------------------------------------------------------------------------------
# The model (random weights) and a tokenizer that round-trips every id

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



def random_words(count: int, vocab_size: int, rng: np.random.Generator) -> str:
    """`count` random non-special words: exactly `count` tokens of the synthetic tokenizer."""
    return " ".join(f"w{i}" for i in rng.integers(len(SPECIAL_TOKENS), vocab_size, count))


# ----------------------------------------------------------------------------------------------------------------------
# Timing, peak memory and the device's floors


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


def write_json(path: str, results: dict) -> None:
    """bench.py's --json: through a temporary file and a rename, so a kill in mid-write leaves the last whole file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"written_by": "bench.py", **results}, f, indent=2)
    os.replace(tmp, path)


def floor_seconds(bytes_read: float, flops: float, floors: dict) -> float:
    """The time no call can beat on this device: its bytes at the copy bandwidth plus its FLOPs at the matmul rate
    (`floors` as measure_floors returns them)."""
    return bytes_read / (floors["copy_bandwidth_GBps"] * GB) + flops / (floors["matmul_TFLOPs"] * 1e12)


# Datasheet dense bf16 rates, for reference next to the measured ones (not used for the goals).
DATASHEET_BF16_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4}


def datasheet_tflops(device_name: str) -> float | None:
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in device_name), None)


# ----------------------------------------------------------------------------------------------------------------------
# FLOP and byte counts


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


def prefill_flops(cfg, prompt_lengths: list[int]) -> int:
    """The prefill of one prompt per length L: 2 N L through the decoder's linears plus A(L) of causal attention."""
    N = decoder_matmul_params(cfg)
    return sum(2 * N * L + attention_flops(cfg, L) for L in prompt_lengths)


def train_step_flops(cfg, T: int, completion_tokens: int, n_lora: int) -> dict:
    """Model FLOPs (what MFU divides by) and hardware FLOPs (adds checkpointing's recomputation) of one forward +
    backward over a T-token sequence whose last `completion_tokens` tokens go through lm_head (module docstring).
    Its attention is one square causal call, on the kernel --learner-attention chooses (flash_attention_flops 0)."""
    N, A = decoder_matmul_params(cfg), attention_flops(cfg, T)
    head = 2 * cfg.hidden_size * cfg.vocab_size * completion_tokens  # one lm_head matmul over the completion
    forward = 2 * N * T + 2 * n_lora * T + A + head
    backward = 2 * N * T + 4 * n_lora * T + 2 * A + head  # input gradients only for the frozen base and lm_head
    recompute = 2 * N * T + 2 * n_lora * T + A + head  # checkpointed decoder layers and lm_head chunks, once more
    return {"model_flops": forward + backward, "hardware_flops": forward + backward + recompute,
            "attention_share": 3 * A / (forward + backward), "attention_flops": A, "flash_attention_flops": 0,
            "tokens": T}


def grouped_step_flops(cfg, prompt_tokens: int, completion_tokens: list[int], n_lora: int) -> dict:
    """train_step_flops for one prompt trained once with its completions (shared_prompt.py): the linears, LoRA and
    norms see P + sum L tokens; attention computes P(P+1)/2 query-key pairs for the prompt and L (P + (L+1)/2) for
    each completion (its own causal part and the whole prompt), per head and layer. "flash_attention_flops": the
    completions' part, which runs torch's flash kernel whatever --learner-attention chooses for the prompt's (and
    the per-sample learner's rows: train_step_flops has none)."""
    N, T = decoder_matmul_params(cfg), prompt_tokens + sum(completion_tokens)
    completion_pairs = sum(L * prompt_tokens + L * (L + 1) // 2 for L in completion_tokens)
    pairs = prompt_tokens * (prompt_tokens + 1) // 2 + completion_pairs
    A = cfg.num_hidden_layers * 4 * cfg.num_attention_heads * cfg.head_dim * pairs
    head = 2 * cfg.hidden_size * cfg.vocab_size * sum(completion_tokens)
    forward = 2 * N * T + 2 * n_lora * T + A + head
    backward = 2 * N * T + 4 * n_lora * T + 2 * A + head
    recompute = 2 * N * T + 2 * n_lora * T + A + head
    flash = cfg.num_hidden_layers * 4 * cfg.num_attention_heads * cfg.head_dim * completion_pairs
    return {"model_flops": forward + backward, "hardware_flops": forward + backward + recompute,
            "attention_share": 3 * A / (forward + backward), "attention_flops": A, "flash_attention_flops": flash,
            "tokens": T}


def kv_bytes_per_token(cfg, element_size: int) -> int:
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * element_size


def weight_bytes(model) -> int:
    """Bytes of every distinct parameter (the tied embedding once: it is read as lm_head every step)."""
    seen = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "bench_kit.py", "bench.py, bench_cpu.py, bench_gpu.py and decode.py use")
