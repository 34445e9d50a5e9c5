"""Rows 5 and 7 of bench.py, the CPU part: peak memory and time of the chunked log-probs against the naive
full-logits path (each in a fresh subprocess), and the cost of one decode step of each generate engine (time, and
bytes copied by category: CopyCounter). bench.py's docstring states the method."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3Config  # noqa: E402

import lora  # noqa: E402
import rollout  # noqa: E402
import shared_prompt  # noqa: E402
import spiral  # noqa: E402
import tiny  # noqa: E402
import train  # noqa: E402
from bench_kit import GB, SPECIAL_TOKENS, Meter, kv_bytes_per_token  # noqa: E402
from logprobs import TokenBatch, completion_logprobs, position_ids_from_mask  # noqa: E402

BENCH = os.path.join(HERE, "bench.py")  # the log-prob worker runs as `bench.py --logprob-worker SPEC`


# ----------------------------------------------------------------------------------------------------------------------
# Row 5, CPU: chunked log-probs against the naive full-logits path


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
    proc = subprocess.run([sys.executable, BENCH, "--logprob-worker", json.dumps(spec)],
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
# Row 7, CPU: one decode step of each generate engine (tiny model, batch 64, LoRA active); README row 6: eval_batching.py

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
# Row 9, CPU: the grouped learner against the per-sample learner on the demo's own batch


def run_learner_part(args) -> dict:
    """9. train.accumulate_gradients with learner="grouped" (each prompt once per group) and "per-sample" (one row per
    sample) on one SPIRAL step's samples of `train.py --preset tiny` (the warm start, its settings: no checkpointing,
    8,192-token micro-batches), timed alternately in one process: the ratio is what this measures."""
    import numpy as np

    import problemset

    repeats = 2 if args.small else 7
    cfg = train.resolve_config({"preset": "tiny"})
    torch.manual_seed(0)
    model, tokenizer = rollout.load_policy(cfg.model, device="cpu")
    lora.add_lora(model, cfg.lora_rank, cfg.lora_alpha)
    with torch.no_grad():  # B != 0: as after a few steps of training, every LoRA matmul matters
        for p in lora.lora_parameters(model):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.01)
    model.eval()
    stream = train.ProblemStream(problemset.load_problems(cfg.data), cfg.seed)
    with torch.no_grad():
        rollouts = train.collect(cfg, model, tokenizer, stream, np.random.default_rng(cfg.seed))
    samples = rollouts.samples
    kwargs = dict(loss_normalizer=train.loss_normalizer(cfg, rollouts.metrics["problems_kept"]),
                  temperature=cfg.temperature, micro_batch_tokens=cfg.micro_batch_tokens,
                  chunk_size=cfg.logprob_chunk_size, pad_token_id=tokenizer.pad_token_id)
    times, grads = {"grouped": [], "per-sample": []}, {}
    model.train()
    for _ in range(repeats):
        for learner in times:
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            train.accumulate_gradients(model, samples, learner=learner, **kwargs)
            times[learner].append(time.perf_counter() - t0)
            grads[learner] = [p.grad.clone() for p in lora.lora_parameters(model)]
    trained = [s for s in samples if s.advantage != 0]
    tokens_in = {"per-sample": sum(len(s.prompt_ids) + len(s.completion_ids) for s in trained),
                 "grouped": sum(len(g[0].prompt_ids) + sum(len(s.completion_ids) for s in g)
                                for g in shared_prompt.group_by_prompt(trained))}
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads(), "repeats": repeats,
              "samples_trained": len(trained), "groups": len(shared_prompt.group_by_prompt(trained)),
              "tokens_through_the_model": tokens_in, "seconds": times, "median_s": median,
              "time_ratio_per_sample_over_grouped": median["per-sample"] / median["grouped"],
              "max_rel_grad_diff": max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                                       for a, b in zip(grads["grouped"], grads["per-sample"]))}
    print(f"[9 learner] tiny preset, one SPIRAL step's {len(trained)} samples in {result['groups']} groups: grouped "
          f"{median['grouped']:.3f} s, per-sample {median['per-sample']:.3f} s (medians of {repeats}, alternating, "
          f"{result['torch_threads']} threads): x{result['time_ratio_per_sample_over_grouped']:.2f}; tokens through "
          f"the model {tokens_in['grouped']:,} / {tokens_in['per-sample']:,} (without padding); max rel. gradient "
          f"difference {result['max_rel_grad_diff']:.1e}")
    return result


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "bench_cpu.py", "benchmarks/bench.py uses")
