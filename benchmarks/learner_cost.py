"""The learner's FLOPs and peak memory at Qwen3-4B's shape, COUNTED on the meta device (no GPU, no weights).

The real code runs (shared_prompt's packing and attention, logprobs' chunked head, LoRA, activation checkpointing,
the importance-sampling loss and its backward) on meta tensors, which carry shapes and no data, under a dispatch
mode that counts:
  - FLOPs: every matmul (mm, addmm, bmm: 2 M N K) and every flash-attention call, forward 4 H D x pairs and backward
    8 H D x pairs, pairs = the query-key pairs its causal mask keeps (lower-right aligned when L < S, as the flash
    kernel does). Counted with checkpointing off (and the lm_head chunks run without theirs): model FLOPs, the
    definition of bench.py's MFU.
  - memory: the bytes of every storage an op creates, while it is alive, plus the weights, the LoRA parameters,
    their gradients and AdamW's two moments, which exist before the step. The micro-batches are the ones train.py's
    learner plans (shared_prompt.plan) on a card of 80 GB (or 24 GB, or at a token cap), and each row prints the
    plan's own count (shared_prompt.LearnerMemory) beside this one.
  - the kernels' inputs: whether any attention call got a mask or K/V repeated to every query head.
F.scaled_dot_product_attention is replaced by the flash kernel's meta function for the count (on the meta device
it would decompose into the math path and allocate (L, L) scores). Samples are every trace full (4,096 tokens):
the worst case random weights produce. The per-sample learner cannot run on the meta device (its gather of
completion positions by a boolean mask has a data-dependent size), so it is counted through the same code with
one completion per group: the same linears and the same pairs; its padded micro-batches (none here: equal lengths)
are not modelled. Both are checked against bench_kit's formulas.

    python benchmarks/learner_cost.py [--json PATH]       # 13 minutes on a 2-core CPU at load ~9
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import logprobs  # noqa: E402
import lora  # noqa: E402
import shared_prompt  # noqa: E402
import spiral  # noqa: E402
import train  # noqa: E402
from bench_kit import GB, build_policy, grouped_step_flops, lora_params, train_step_flops  # noqa: E402

FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
SEARCH_PROMPT, AGGREGATION_PROMPT, NEW_TOKENS = 1031, 17_596, 4096  # as benchmarks/step_model.py


def _pairs(L: int, S: int, causal: bool) -> int:
    """Query-key pairs of L queries over S keys: all, or causal aligned to the lower right (query t: S-L+t+1 keys)."""
    return L * (S - L) + L * (L + 1) // 2 if causal else L * S


class Cost(TorchDispatchMode):
    """FLOPs, live and peak bytes of the tensors ops create, and what the attention kernels were handed."""

    def __init__(self):
        super().__init__()
        self.flops = self.live = self.peak = self.largest = 0
        self.attention_calls = self.masked_calls = self.repeated_kv_calls = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMULS:
            a, b = args[-2], args[-1]
            self.flops += 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        elif func in (FLASH, FLASH_BACKWARD):
            q, k = (args[1], args[2]) if func is FLASH_BACKWARD else (args[0], args[1])
            causal = args[9] if func is FLASH_BACKWARD else (args[4] if len(args) > 4 else kwargs.get("is_causal"))
            B, H, L, D = q.shape
            self.flops += (8 if func is FLASH_BACKWARD else 4) * B * H * D * _pairs(L, k.shape[2], bool(causal))
            if func is FLASH:
                self.attention_calls += 1
                self.repeated_kv_calls += k.shape[1] == H and H != self.kv_heads
        out = func(*args, **kwargs)
        for t, ret in zip(out if isinstance(out, (tuple, list)) else [out], func._schema.returns):
            if isinstance(t, torch.Tensor) and ret.alias_info is None:
                storage = t.untyped_storage()
                n = storage.nbytes()
                self.live += n
                self.peak, self.largest = max(self.peak, self.live), max(self.largest, n)
                # on the storage, not the tensor: a detached alias (selective checkpointing keeps one) holds it
                weakref.finalize(storage, self._free, n)
        return out


def _flash_sdpa(counter: Cost):
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        """The flash kernel's meta function in place of F.scaled_dot_product_attention (meta tensors only)."""
        counter.masked_calls += attn_mask is not None
        return FLASH(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    return sdpa


@contextlib.contextmanager
def counting():
    """A Cost mode with F.scaled_dot_product_attention replaced by the flash kernel's meta function."""
    counter, real = Cost(), torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _flash_sdpa(counter)
    try:
        with counter:
            yield counter
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


def build(checkpointing: bool, keep_attention_outputs: bool = False):
    """Qwen3-4B on the meta device with train.py's LoRA (r = 32 on every projection) and checkpointing setting."""
    model, _ = build_policy("4b", "meta", torch.bfloat16)
    lora.add_lora(model, rank=32, alpha=32.0)
    model._logprobs_probe = ""  # logprobs' numeric probe needs data; its verdict is known for Qwen3
    if checkpointing:
        train.enable_gradient_checkpointing(model, keep_attention_outputs)
    model.train()
    return model


def train_parts(model, parts: list[list]) -> Cost:
    """One grouped micro-batch (parts: lists of samples sharing a prompt), forward + backward as
    train.accumulate_gradients runs it, counted. Returns the Cost."""
    batch = shared_prompt.PackedBatch.from_parts(parts, "meta")
    lengths = [len(s.completion_ids) for s in batch.samples]
    adv_N = torch.tensor([s.advantage for s in batch.samples]).repeat_interleave(torch.tensor(lengths)).to("meta")
    sampler_N = torch.tensor([lp for s in batch.samples for lp in s.sampler_logprobs]).to("meta")
    with counting() as cost, shared_prompt.sharing_prompts(model):
        logprobs_N, _ = shared_prompt.grouped_logprobs(model, batch, 1.0, train.TrainConfig.logprob_chunk_size)
        loss, _ = train.importance_sampling_loss(logprobs_N, sampler_N, adv_N, 1.0)
        loss.backward()
        del loss, logprobs_N
    model.zero_grad(set_to_none=True)
    cost.kv_heads = model.config.num_key_value_heads
    return cost


Cost.kv_heads = 8  # Qwen3-4B's (checked against the model in train_parts)


def _samples(prompt: int, completions: int, role: str, new_tokens: int = NEW_TOKENS) -> list:
    ids = [5] * prompt
    return [spiral.Sample(ids, [6] * new_tokens, [-1.0] * new_tokens, 1.0, role) for _ in range(completions)]


def step_flops(grouped: bool, problems: int = 8) -> dict:
    """Model FLOPs of the learner over one SPIRAL step at train.py's defaults, counted for one problem (its search
    group and 4 aggregation groups; the 8 problems have equal shapes) and times `problems`."""
    model = build(checkpointing=False)
    real = logprobs.checkpoint  # the lm_head chunks' recomputation is hardware work, not model FLOPs
    logprobs.checkpoint = lambda function, *args, use_reentrant: function(*args)
    try:
        return _step_flops(model, grouped, problems)
    finally:
        logprobs.checkpoint = real


def _step_flops(model, grouped: bool, problems: int) -> dict:
    groups = [_samples(SEARCH_PROMPT, 8, "search")] + [_samples(AGGREGATION_PROMPT, 4, "aggregation")] * 4
    units = groups if grouped else [[s] for g in groups for s in g]
    counted = masked = repeated = 0
    for unit in units:
        cost = train_parts(model, [unit])
        counted, masked, repeated = counted + cost.flops, masked + cost.masked_calls, repeated + cost.repeated_kv_calls
    n = lora_params(model)
    formula = sum(grouped_step_flops(model.config, len(u[0].prompt_ids), [len(s.completion_ids) for s in u], n)
                  ["model_flops"] if grouped else
                  train_step_flops(model.config, len(u[0].prompt_ids) + NEW_TOKENS, NEW_TOKENS, n)["model_flops"]
                  for u in units)
    return {"PFLOP": problems * counted / 1e15, "formula_PFLOP": problems * formula / 1e15,
            "masked_attention_calls": masked, "repeated_kv_calls": repeated}


def resident_bytes(model) -> int:
    """What exists before a step: bf16 weights and fp32 LoRA (parameters() counts the tied embedding once), the LoRA
    gradients and AdamW's two moments."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) + 3 * 4 * lora_params(model)


def group_memory(keep_attention_outputs: bool, card_GB: float | None = 80, max_tokens: int | None = None,
                 completions: int = 4, new_tokens: int = NEW_TOKENS, grouped: bool = True) -> dict:
    """Peak bytes of training one aggregation group (17,596 + completions x new_tokens tokens) under checkpointing,
    in the micro-batches train.py makes of it: planned by memory on a card of `card_GB` (shared_prompt.plan, the
    free memory being the card less what is resident), or at `max_tokens` tokens (--micro-batch-tokens)."""
    model = build(checkpointing=True, keep_attention_outputs=keep_attention_outputs)
    group = _samples(AGGREGATION_PROMPT, completions, "aggregation", new_tokens)
    resident = resident_bytes(model)
    free = None if max_tokens else int(shared_prompt.LEARNER_MEMORY_FRACTION * (card_GB * GB - resident))
    batches = shared_prompt.plan(model, [group], max_tokens, free) if grouped else [[[s]] for s in group]
    memory = shared_prompt.LearnerMemory.of(model)
    peaks, planned, largest = [], [], 0
    for parts in batches:
        cost = train_parts(model, parts)
        peaks.append(cost.peak)
        planned.append(memory.peak_bytes(parts))
        largest = max(largest, cost.largest)
    tokens = [sum(len(p[0].prompt_ids) + sum(len(s.completion_ids) for s in p) for p in b) for b in batches]
    return {"micro_batches": len(batches), "tokens": tokens, "peak_beyond_resident_GB": max(peaks) / GB,
            "planned_beyond_resident_GB": max(planned) / GB, "resident_GB": resident / GB,
            "peak_GB": (resident + max(peaks)) / GB, "largest_tensor_GB": largest / GB}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="learner_cost.py", description=__doc__.split("\n")[0])
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    results = {"per_sample": step_flops(grouped=False), "grouped": step_flops(grouped=True)}
    for key, r in results.items():
        print(f"[learner FLOPs] {key}: {r['PFLOP']:.1f} PFLOP per SPIRAL step at train.py's defaults (formula "
              f"{r['formula_PFLOP']:.1f}); attention calls with a mask: {r['masked_attention_calls']}, with K/V "
              f"repeated to every head: {r['repeated_kv_calls']}", flush=True)
    cases = {"grouped, planned on an 80 GB card": dict(keep_attention_outputs=False),
             "grouped keeping attention outputs, 80 GB card": dict(keep_attention_outputs=True),
             "grouped, split at 32,768 tokens": dict(keep_attention_outputs=False, max_tokens=32_768),
             "grouped, 8,192 new tokens, 80 GB card": dict(keep_attention_outputs=False, new_tokens=8192),
             "grouped, 8,192 new tokens, 24 GB card": dict(keep_attention_outputs=False, new_tokens=8192, card_GB=24),
             "per sample": dict(keep_attention_outputs=False, grouped=False),
             "per sample keeping attention outputs": dict(keep_attention_outputs=True, grouped=False)}
    for key, kwargs in cases.items():
        r = results[f"memory: {key}"] = group_memory(**kwargs)
        new = kwargs.get("new_tokens", NEW_TOKENS)
        print(f"[learner memory] one aggregation group ({AGGREGATION_PROMPT:,} + 4 x {new:,} tokens), {key}: "
              f"{r['micro_batches']} micro-batch(es) of {r['tokens']} tokens, peak {r['peak_GB']:.1f} GB "
              f"({r['resident_GB']:.1f} GB weights, LoRA and AdamW + {r['peak_beyond_resident_GB']:.1f} GB; the "
              f"plan's count {r['planned_beyond_resident_GB']:.1f} GB; largest tensor {r['largest_tensor_GB']:.2f} "
              "GB)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"written_by": "learner_cost.py", "device": "meta (counted, not measured)", **results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
