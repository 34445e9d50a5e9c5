"""Decode benchmarks of fastgen.py: KV bytes a decode step reads, and on a GPU tokens/s against two floors.

Definitions (per decode step s = 1..steps-1, B = P x copies rows, prompts of lengths L_p, kv = bytes per token):
  unique KV bytes     = kv x (sum_p L_p + B x s)            each prompt once, each row's filled suffix once
  per-row KV bytes    = kv x sum_rows (L_p + s)             what a cache with one copy of the prompt per row reads
  fastgen reads       = kv x (P x n_chunks x chunk + B x round_up(s, SUFFIX_BUCKET))   (CallShape; counted)
  fastgen at 7eca28c  = kv x B x round_up(max L + max_new_tokens, 64)                  (whole cache, every step)
  unique floor        = sum_s (weights + unique KV bytes) / copy bandwidth + prefill FLOPs / matmul rate
  per-row floor       = the same with per-row KV bytes (row 2's floor in benchmarks/README.md before the cascade)
"Counted" is measured: `count_attention_bytes` wraps fastgen's calls of attention.attend and adds up the bytes of
the K and V it is handed, while the real decode step runs (on a CPU, or on the meta device at the 4B shape, where
no arithmetic happens: the same code path, shapes only).

    python benchmarks/decode.py --bytes                       # the byte table, counted at the 4B shape (meta device)
    python benchmarks/decode.py --kernels                     # kernels of a decode step at the 4B shape (meta device)
    python benchmarks/decode.py --gpu --json decode-gpu.json  # CUDA checks, then the search- and aggregation-
                                                              # shaped rows on Qwen3-4B's architecture
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import weakref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import attention  # noqa: E402
import bench  # noqa: E402  (benchmarks/, on the path when this file runs)
import checkpoint  # noqa: E402
import cli  # noqa: E402
import fastgen  # noqa: E402
import rollout  # noqa: E402
from bench_kit import GB, floor_seconds, kv_bytes_per_token, prefill_flops  # noqa: E402
SEARCH_SHAPE = dict(prompts=8, copies=8, prompt_tokens=1054)  # 8 problems x N1 = 8, ~1k-token search prompts
AGGREGATION_SHAPE = dict(prompts=4, copies=4, prompt_tokens=17_596)  # 4 sets x N2 = 4, the paper's 17.6k tokens
TOY_SHAPES = {"search": dict(prompts=2, copies=4, prompt_tokens=60),  # --size toy: the same code paths on a CPU
              "aggregation": dict(prompts=2, copies=2, prompt_tokens=300)}


def fastgen_slots(shape, s: int) -> int:
    """KV slots fastgen's decode step s (1-based) attends to: every prompt's chunks, every row's suffix bucket."""
    return shape.P * shape.n_chunks * shape.chunk + shape.B * fastgen._round_up(s, fastgen.SUFFIX_BUCKET)


def byte_model(prompt_lengths: list[int], shape, max_new_tokens: int, kv: int) -> dict:
    """Per-step KV bytes averaged over the decode steps of a call of `shape` (fastgen.CallShape.of(prompt_lengths,
    copies, max_new_tokens)): unique, per-row, fastgen's and the old fastgen's."""
    steps = range(1, max_new_tokens)
    B, old_slots = shape.B, fastgen._round_up(max(prompt_lengths) + max_new_tokens, 64)
    mean = lambda f: kv * float(np.mean([f(s) for s in steps]))  # noqa: E731
    unique = mean(lambda s: sum(prompt_lengths) + B * s)
    return {"unique_GB": unique / GB,
            "per_row_GB": mean(lambda s: shape.copies * sum(prompt_lengths) + B * s) / GB,
            "fastgen_GB": mean(lambda s: fastgen_slots(shape, s)) / GB,
            "old_fastgen_GB": kv * B * old_slots / GB}


@contextlib.contextmanager
def count_attention_bytes(totals: list):
    """Add the bytes of K and V that each fastgen attention call reads to totals[-1] (append 0 to start a step)."""
    real = fastgen.attend

    def counting(q, k, v, bias, scale):
        totals[-1] += (k.numel() + v.numel()) * k.element_size()
        return real(q, k, v, bias, scale)

    fastgen.attend = counting
    try:
        yield
    finally:
        fastgen.attend = real


def started_call(engine, model, prompt_lengths: list[int], shape) -> tuple:
    """(weights, fastgen.Call (cache, state, graphs)): `engine`'s call of `shape` for prompts of these lengths, set up
    as fastgen.sample_micro_batch sets one up (EOS ids [1, 2], temperature 1), its state started, its suffix cleared."""
    w = engine.weights(model)
    call = engine.call(w, shape, 2)
    call.state.start(shape, prompt_lengths, 1.0, [1, 2], w.kv_heads)
    call.cache.clear_suffix()
    return w, call


def counted_step_bytes(model, prompt_lengths: list[int], shape, steps: list[int]) -> list:
    """KV bytes that fastgen.decode_one_token hands to attention at each of `steps` (1-based decode steps) of a
    call of `shape`, from a real step of `model` (which may live on the meta device: then only shapes are computed)."""
    w, (cache, state, _) = started_call(fastgen.Engine(model), model, prompt_lengths, shape)
    totals: list[float] = []
    with torch.no_grad(), count_attention_bytes(totals):
        for s in steps:
            totals.append(0)
            state.t.fill_(s - 1)
            fastgen.decode_one_token(w, cache, state, shape, fastgen._round_up(s, fastgen.SUFFIX_BUCKET))
    return totals


def byte_table(model, kv: int, cases: dict, max_new_tokens: int) -> dict:
    """For each call shape: the modelled bytes, and fastgen's counted bytes at a few steps against the model."""
    table = {}
    for name, c in cases.items():
        lengths = [c["prompt_tokens"]] * c["prompts"]
        shape = fastgen.CallShape.of(lengths, c["copies"], max_new_tokens)
        row = byte_model(lengths, shape, max_new_tokens, kv)
        probe = [1, max_new_tokens // 2, max_new_tokens - 1]
        counted = counted_step_bytes(model, lengths, shape, probe)
        modelled = [kv * fastgen_slots(shape, s) for s in probe]
        row["counted_GB_at_steps"] = {s: b / GB for s, b in zip(probe, counted)}
        row["counted_equals_model"] = all(abs(a - b) < 1 for a, b in zip(counted, modelled))
        row["fastgen_over_unique"] = row["fastgen_GB"] / row["unique_GB"]
        row["old_over_unique"] = row["old_fastgen_GB"] / row["unique_GB"]
        table[name] = row
    return table


def print_byte_table(table: dict, max_new_tokens: int) -> None:
    print(f"KV bytes per decode step, mean over {max_new_tokens} new tokens (GB): unique | per row | fastgen | "
          f"fastgen at 7eca28c")
    for name, r in table.items():
        print(f"[bytes {name}] {r['unique_GB']:7.2f} | {r['per_row_GB']:7.2f} | {r['fastgen_GB']:7.2f} "
              f"({r['fastgen_over_unique']:.3f}x unique) | {r['old_fastgen_GB']:7.2f} ({r['old_over_unique']:.2f}x); "
              f"counted = model: {r['counted_equals_model']}")


class KernelCount(TorchDispatchMode):
    """Ops dispatched under it that would launch a CUDA kernel, by name: views, metadata and allocations excluded.
    `whole(fn, label)` wraps fn so that a call counts as one kernel under `label`, whatever it runs inside."""

    FREE = {"_unsafe_view", "empty", "empty_like", "empty_strided", "lift_fresh", "detach", "scalar_tensor"}

    def __init__(self):
        super().__init__()
        self.ops, self.inside = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name, returns = func._schema.name.split("::")[-1], func._schema.returns
        view = returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        if not (self.inside or view or name in self.FREE):
            self.ops[name] = self.ops.get(name, 0) + 1
        return out

    def whole(self, fn, label: str):
        def run(*args, **kwargs):
            self.ops[label] = self.ops.get(label, 0) + 1
            self.inside += 1
            try:
                return getattr(fn, "eager", fn)(*args, **kwargs)
            finally:
                self.inside -= 1
        run.eager = run
        return run


MATMULS = ("mm", "addmm", "bmm", "baddbmm")


def step_kernels(model, prompt_lengths: list[int], shape) -> dict:
    """The kernels of one fastgen decode step of `shape` as a CUDA graph would launch them: each aten op that is not
    a view one kernel, each compiled elementwise chain (fastgen._fused) and each attention call one. Runs the real
    step (on the meta device: shapes only). Returns {"kernels", "matmuls", "by_op": {op: count}}."""
    w, call = started_call(fastgen.Engine(model), model, prompt_lengths, shape)
    counter = KernelCount()
    names = ("_rms_norm_fn", "_rotate", "_silu_mul", "_merge", "attend")
    saved = {name: getattr(fastgen, name) for name in names}
    for name in names:
        setattr(fastgen, name, counter.whole(saved[name], "attention" if name == "attend" else f"fused{name}"))
    try:
        with torch.no_grad(), counter:
            call.state.t.fill_(fastgen.SUFFIX_BUCKET - 2)  # feeds slot 254 of the first bucket, writes column 255
            fastgen.decode_one_token(w, call.cache, call.state, shape, fastgen.SUFFIX_BUCKET)
    finally:
        for name, fn in saved.items():
            setattr(fastgen, name, fn)
    return {"kernels": sum(counter.ops.values()), "matmuls": sum(counter.ops.get(m, 0) for m in MATMULS),
            "by_op": dict(sorted(counter.ops.items(), key=lambda kv: -kv[1]))}


def kernel_table(model, cases: dict, max_new_tokens: int) -> dict:
    """step_kernels for each call shape, with the LoRA adapter active and with none (the side path's share)."""
    import lora

    table = {}
    for name, c in cases.items():
        lengths = [c["prompt_tokens"]] * c["prompts"]
        shape = fastgen.CallShape.of(lengths, c["copies"], max_new_tokens)
        row = step_kernels(model, lengths, shape)
        with lora.use_adapter(model, None):
            base = step_kernels(model, lengths, shape)
        row["lora_matmuls"], row["lora_kernels"] = row["matmuls"] - base["matmuls"], row["kernels"] - base["kernels"]
        table[name] = row
        print(f"[kernels {name}] {row['kernels']} kernels a decode step, {row['matmuls']} matmuls "
              f"({row['lora_matmuls']} of them LoRA's side path); by op: "
              + ", ".join(f"{k} {v}" for k, v in list(row["by_op"].items())[:12]), flush=True)
    return table


# ----------------------------------------------------------------------------------------------------------------------
# On a GPU


def cuda_checks() -> dict:
    """attention.attend's CUDA kernel against float64 full softmax, then fastgen (CUDA graphs) on the tiny Qwen3
    against teacher forcing through the HF model, in fp32 and bf16."""
    import copy

    import lora
    import tiny  # noqa: F401  registers "tiny"

    out = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    errors = []
    for N, H, M, S1, S2 in [(3, 8, 16, 1024, 256), (64, 8, 4, 512, 4096), (2, 16, 32, 64, 64)]:
        q, k1, v1 = (torch.randn(N, H, n, 128, device="cuda", generator=g, dtype=torch.bfloat16) for n in (M, S1, S1))
        k2, v2 = (torch.randn(N, H, S2, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
        mask1 = (torch.rand(N, 1, 1, S1, device="cuda", generator=g) < 0.7)
        mask1[..., 0] = True
        if N > 2:
            mask1[-1] = False  # a whole part masked for one batch row: must weigh 0 in the merge
            mask1[-1, ..., 0] = False
        bias1 = torch.where(mask1, 0.0, attention.MASKED).to(torch.bfloat16)
        bias2 = torch.zeros(S2, device="cuda", dtype=torch.bfloat16)
        o1, l1 = attention.attend(q, k1, v1, bias1, 0.088)
        o2, l2 = attention.attend(q, k2, v2, bias2, 0.088)
        o, _ = attention.merge(torch.stack([o1, o2], 2), torch.stack([l1, l2], 2), dim=2)
        full_bias = torch.cat([bias1.expand(N, 1, 1, S1), bias2.expand(N, 1, 1, S2)], -1)
        ref = attention.reference(q, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), full_bias, 0.088)
        errors.append(float((o.double() - ref).norm() / ref.norm()))
    out["attention_bf16_relative_error"] = max(errors)
    model, tokenizer = rollout.load_policy("tiny", device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        m = copy.deepcopy(model).to(dtype)
        params = lora.add_lora(m, rank=4, alpha=8.0)
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn_like(p) * 0.05)
        torch.manual_seed(0)
        prompts = ["What is 2 + 3?", "Compute 17 * 4 and explain.", "Hi"]
        got = rollout.generate(m, tokenizer, prompts, samples_per_prompt=3, max_new_tokens=40, temperature=0.7,
                               engine="fast")
        worst = 0.0
        with torch.no_grad():
            for group in got:
                for c in group:
                    ids = torch.tensor([c.prompt_ids + c.completion_ids], device="cuda")
                    logits = m(ids).logits[0, len(c.prompt_ids) - 1: -1].float() / 0.7
                    lp = torch.log_softmax(logits, -1).gather(1, ids[0, len(c.prompt_ids):, None])[:, 0]
                    worst = max(worst, float((lp.cpu() - torch.tensor(c.logprobs)).abs().max()))
        out[f"tiny_{str(dtype)[6:]}_max_logprob_error_vs_teacher_forcing"] = worst
        out[f"tiny_{str(dtype)[6:]}_captures"] = fastgen._ENGINE[0].captures
        fastgen.reset()
    return out


def timed_fast_call(model, tokenizer, prompts: list[str], copies: int, new_tokens: int) -> dict:
    engine_before = fastgen._ENGINE[0] if fastgen._ENGINE else None
    captures0 = engine_before.captures if engine_before else 0
    capture_s0 = engine_before.capture_seconds if engine_before else 0.0
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = rollout.generate(model, tokenizer, prompts, samples_per_prompt=copies, max_new_tokens=new_tokens,
                           micro_batch_size=len(prompts) * copies, engine="fast")
    seconds = time.perf_counter() - t0
    engine = fastgen._ENGINE[0]
    steps = max(len(c.completion_ids) for row in out for c in row)
    return {"seconds": seconds, "steps": steps, "captures": engine.captures - captures0,
            "capture_seconds": engine.capture_seconds - capture_s0,
            "peak_memory_GB": torch.cuda.max_memory_allocated() / GB if cuda else None,
            "prompt_tokens": [len(row[0].prompt_ids) for row in out]}


def gpu_row(model, tokenizer, floors: dict, key: str, prompts: list[str], c: dict, n: int) -> dict:
    """Row `key`, call shape c at n new tokens: a first call (graphs captured) and a second, warm one; tokens/s and the
    fraction of the unique and per-row floors reached by the warm call (capture time excluded)."""
    first = timed_fast_call(model, tokenizer, prompts, c["copies"], n)
    if n <= 1024:  # a second call of the same shape: its graphs are already captured
        warm = timed_fast_call(model, tokenizer, prompts, c["copies"], n)
    else:  # long calls once (device time): the first call's time less its graph captures
        warm = dict(first, seconds=first["seconds"] - first["capture_seconds"])
    cfg = model.config
    kv, weights = kv_bytes_per_token(cfg, 2), bench.weight_bytes(model)
    lengths, B = warm["prompt_tokens"], c["prompts"] * c["copies"]
    decode_steps = warm["steps"] - 1
    unique = sum(weights + kv * (sum(lengths) + B * s) for s in range(1, warm["steps"]))
    per_row = sum(weights + kv * (c["copies"] * sum(lengths) + B * s) for s in range(1, warm["steps"]))
    flops = prefill_flops(cfg, lengths)
    r = {
        "prompts": c["prompts"], "copies": c["copies"], "prompt_tokens": max(lengths), "new_tokens": n,
        "decode_steps": decode_steps,
        "first_call_s": first["seconds"], "captures": first["captures"],
        "capture_s": first["capture_seconds"], "warm_call_s": warm["seconds"],
        "tokens_per_s": B * warm["steps"] / warm["seconds"],
        "ms_per_decode_step": 1000 * warm["seconds"] / max(1, decode_steps),
        "fraction_of_unique_floor": floor_seconds(unique, flops, floors) / warm["seconds"],
        "fraction_of_per_row_floor": floor_seconds(per_row, flops, floors) / warm["seconds"],
        "peak_memory_GB": warm["peak_memory_GB"],
    }
    print(f"[{key}] B={B} L={max(lengths)} new={n}: warm {r['warm_call_s']:.1f} s "
          f"({r['tokens_per_s']:.0f} tok/s, {r['ms_per_decode_step']:.2f} ms/step), "
          f"{100 * r['fraction_of_unique_floor']:.1f}% of unique floor, "
          f"{100 * r['fraction_of_per_row_floor']:.1f}% of per-row floor; first call {r['first_call_s']:.1f} s "
          f"({r['captures']} graphs, {r['capture_s']:.1f} s); peak {r['peak_memory_GB'] or 0:.1f} GB", flush=True)
    return r


def gpu_rows(model, tokenizer, floors: dict, new_tokens_list: list[int], shapes: dict) -> dict:
    """gpu_row for each call shape at each length, keyed "{shape}_{new tokens}"; a row that raises (an
    out-of-memory is a result too) gets its error, and the other rows are still measured."""
    rng = np.random.default_rng(5)
    V = model.config.vocab_size
    results = {}
    for name, c in shapes.items():
        words = c["prompt_tokens"] - 40  # the chat template and the search prompt's instruction add ~40 tokens
        prompts = [rollout.search_prompt(bench.random_words(words, V, rng)) for _ in range(c["prompts"])]
        for n in new_tokens_list:
            key = f"{name}_{n}"
            recorded(results, key, lambda: gpu_row(model, tokenizer, floors, key, prompts, c, n))
    return results


def profile_step(model, tokenizer, c: dict, max_new_tokens: int) -> dict:
    """Where a decode step's time goes, at call shape c: the step's time per replay (CUDA graph; eager on a CPU)
    early and late in a call, and the kernels of three eager steps (torch.profiler), grouped by name."""
    from torch.profiler import ProfilerActivity, profile

    rng = np.random.default_rng(6)
    V, cuda = model.config.vocab_size, model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ids = [rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(bench.random_words(c["prompt_tokens"] - 40, V,
                                                                                       rng)))
           for _ in range(c["prompts"])]
    engine = fastgen.engine_for(model)
    shape = fastgen.CallShape.of([len(i) for i in ids], c["copies"], max_new_tokens)
    w, call = started_call(engine, model, [len(i) for i in ids], shape)
    s = call[1]
    result = {}
    activity, sort = (ProfilerActivity.CUDA, "cuda_time_total") if cuda else (ProfilerActivity.CPU, "cpu_time_total")
    with torch.no_grad():
        fastgen.prefill(w, call[0], ids, shape, 0)
        for t in (min(255, max_new_tokens - 2), max_new_tokens - 2):
            suffix_len = fastgen._round_up(t + 1, fastgen.SUFFIX_BUCKET)
            s.t.fill_(t)
            engine.step(w, call, shape, suffix_len)  # capture
            sync()
            t0 = time.perf_counter()
            for _ in range(20):
                s.t.fill_(t)
                engine.step(w, call, shape, suffix_len)
            sync()
            result[f"ms_per_step_suffix_{suffix_len}"] = 1000 * (time.perf_counter() - t0) / 20
            with profile(activities=[activity]) as prof:
                for _ in range(3):
                    s.t.fill_(t)
                    fastgen.decode_one_token(w, call[0], s, shape, suffix_len)
                sync()
            table = prof.key_averages().table(sort_by=sort, row_limit=30)
            print(f"--- eager step, suffix {suffix_len} (3 steps) ---\n{table}", flush=True)
            events = [e for e in prof.key_averages() if e.device_type.name == activity.name]
            result[f"ops_per_step_suffix_{suffix_len}"] = sum(e.count for e in events) / 3
            result[f"kernels_suffix_{suffix_len}"] = table  # in the JSON: no file beside it to overwrite
    print("profile:", json.dumps({k: v for k, v in result.items() if not k.startswith("kernels_")}), flush=True)
    return result


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors that ops run under this mode create (views and in-place results excluded) while they
    are alive, and the peak: what an allocator would hold for them, also on the meta device."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        for t, ret in zip(outs, func._schema.returns):
            if isinstance(t, torch.Tensor) and ret.alias_info is None:
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out


def flash_like_sdpa(q, k, v, **kwargs):
    """Stand-in for causal flash attention on the meta device (whose SDPA would decompose into the math path and
    build (L, L) scores): allocates what flash allocates, the output and its (heads, L) fp32 log-sum-exp."""
    q.new_empty(q.shape[:-1], dtype=torch.float32)
    return torch.empty_like(q)


def prefill_peak(model, prompt_tokens: int, prompts: int) -> dict:
    """Peak bytes that fastgen.prefill allocates beyond the weights and the KV arena, for `prompts` prompts of
    `prompt_tokens` tokens (counted by LiveBytes; flash attention's allocation for the attention itself)."""
    engine, ids = fastgen.Engine(model), [[5] * prompt_tokens for _ in range(prompts)]
    shape = fastgen.CallShape.of([prompt_tokens] * prompts, 4, 16)
    w, (cache, _, _) = started_call(engine, model, [prompt_tokens] * prompts, shape)
    real, counter = fastgen.F.scaled_dot_product_attention, LiveBytes()
    fastgen.F.scaled_dot_product_attention = flash_like_sdpa
    try:
        with torch.no_grad(), counter:
            fastgen.prefill(w, cache, ids, shape, 0)
    finally:
        fastgen.F.scaled_dot_product_attention = real
    return {"prompts": prompts, "prompt_tokens": prompt_tokens, "peak_GB": counter.peak / GB,
            "arena_GB": engine.arena.numel() * engine.arena.element_size() / GB,
            "group_size": max(1, fastgen.PREFILL_TOKENS // (shape.n_chunks * shape.chunk))}


def recorded(results: dict, key: str, measure, save=None) -> None:
    """results[key] = measure(), or the error it raised (an out-of-memory is a result too); then save(), if given,
    either way."""
    try:
        results[key] = measure()
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        results[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        fastgen.reset()
    if save:
        save()


def build_parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog="decode.py", description=__doc__.split("\n")[0])
    p.add_argument("--bytes", action="store_true", help="KV bytes per step and prefill memory, counted at the 4B "
                   "shape on the meta device")
    p.add_argument("--kernels", action="store_true", help="kernels and matmuls of one decode step, counted at the 4B "
                   "shape with LoRA r = 32 on the meta device")
    p.add_argument("--gpu", action="store_true", help="CUDA checks and the rows (needs CUDA unless --device cpu)")
    p.add_argument("--size", choices=["4b", "toy"], default="4b", help="--gpu: Qwen3-4B's architecture, or toy")
    p.add_argument("--device", default="cuda", help="--gpu: the device (cpu only with --size toy: tests)")
    p.add_argument("--new-tokens", default="512,4096", help="--gpu: new tokens per call, comma-separated")
    p.add_argument("--shapes", default="search,aggregation", help="--gpu: search, aggregation or both")
    p.add_argument("--skip-checks", action="store_true", help="--gpu: no CUDA checks")
    p.add_argument("--hf-baseline", type=int, default=0, metavar="N",
                   help="--gpu: also bench.py's row 2 (search shape) with the HF engine at N new tokens")
    p.add_argument("--profile", action="store_true", help="--gpu: graph replay time and kernels of one decode step")
    p.add_argument("--mfu", action="store_true", help="--gpu: also bench.py's row 1, without and with cuDNN "
                   "attention in the learner")
    p.add_argument("--json", help="write the results to this new file")
    return p


def check_args(args) -> list[int]:
    """Every flag, before any model is built: cli.ConfigError (one line, exit 2) on bad input. Returns --new-tokens
    as a list."""
    if not (args.bytes or args.kernels or args.gpu):
        raise cli.ConfigError("choose --bytes, --kernels and/or --gpu")
    if args.json is not None:
        why = ("it exists (results are never overwritten)" if os.path.lexists(args.json)
               else checkpoint.out_path_problem(args.json))
        if why:
            raise cli.ConfigError(f"--json {args.json!r}: {why}")
    try:
        new_tokens = [int(n) for n in args.new_tokens.split(",")]
    except ValueError:
        raise cli.ConfigError(f"--new-tokens {args.new_tokens!r}: expected integers separated by commas")
    for n in new_tokens:
        cli.check_count("new_tokens", n, cli.MAX_NEW_TOKENS)
    if args.hf_baseline:  # 0: no HF row
        cli.check_count("hf_baseline", args.hf_baseline, cli.MAX_NEW_TOKENS)
    unknown = [s for s in args.shapes.split(",") if s not in ("search", "aggregation")]
    if unknown:
        raise cli.ConfigError(f"--shapes {','.join(unknown)}: choose from search,aggregation")
    cli.check_device(args.device)
    if args.gpu and args.device.startswith("cuda") and not torch.cuda.is_available():
        raise cli.ConfigError("--gpu needs a CUDA device (or --size toy --device cpu)")
    if args.gpu and not args.device.startswith("cuda") and args.size != "toy":
        raise cli.ConfigError("--device cpu runs --size toy only")
    return new_tokens


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        new_tokens = check_args(args)
    except cli.ConfigError as exc:
        print(f"decode.py: error: {exc}", file=sys.stderr)
        return 2
    results = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "argv": sys.argv[1:] if argv is None
               else argv}

    def save():
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            tmp = f"{args.json}.tmp-{os.getpid()}"  # then a rename: a kill in mid-write leaves the last whole file
            with open(tmp, "w") as f:
                json.dump(results, f, indent=1)
            os.replace(tmp, args.json)

    if args.bytes:
        model, _ = bench.build_policy("4b", "meta", torch.bfloat16)  # initialised on the meta device: shapes only
        table = byte_table(model, kv_bytes_per_token(model.config, 2),
                           {"search": SEARCH_SHAPE, "aggregation": AGGREGATION_SHAPE}, 4096)
        results["bytes_4b_4096"] = table
        print_byte_table(table, 4096)
        results["prefill_4b"] = prefill_peak(model, AGGREGATION_SHAPE["prompt_tokens"], 5)
        r = results["prefill_4b"]
        print(f"[prefill] {r['prompts']} x {r['prompt_tokens']:,}-token prompts: peak {r['peak_GB']:.2f} GB beyond the "
              f"weights and the {r['arena_GB']:.1f} GB KV arena ({r['group_size']} prompt(s) per forward)")
        save()
    if args.kernels:
        import lora

        model, _ = bench.build_policy("4b", "meta", torch.bfloat16)
        lora.add_lora(model, rank=32, alpha=32.0)
        results["kernels_4b"] = kernel_table(model, {"search": SEARCH_SHAPE, "aggregation": AGGREGATION_SHAPE}, 4096)
        save()
    if args.gpu:
        cuda, device = args.device.startswith("cuda"), args.device
        dtype = torch.bfloat16 if cuda else torch.float32
        results["device"] = torch.cuda.get_device_name() if cuda else "cpu"
        if cuda and not args.skip_checks:
            recorded(results, "checks", cuda_checks, save)
            print("checks:", json.dumps(results["checks"]), flush=True)
        import lora

        torch.manual_seed(0)
        model, tokenizer = bench.build_policy(args.size, device, dtype)
        lora.add_lora(model, rank=32, alpha=32.0)
        results["floors"] = floors = bench.measure_floors(device, dtype, args.size)
        print("floors:", json.dumps(floors), flush=True)
        shapes = TOY_SHAPES if args.size == "toy" else {"search": SEARCH_SHAPE, "aggregation": AGGREGATION_SHAPE}
        if args.profile:  # fastgen.FUSE off, then on: the graph replay time per step of each
            for fuse in (False, True):
                fastgen.FUSE = fuse
                recorded(results, f"profile_fuse_{fuse}",
                         lambda: profile_step(model, tokenizer, shapes["search"], max(new_tokens)), save)
                fastgen.reset()  # the next setting captures its own graphs
        chosen = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
        recorded(results, "rows", lambda: gpu_rows(model, tokenizer, floors, new_tokens, chosen), save)
        fastgen.reset()
        scale = bench.SCALES[args.size]
        if args.hf_baseline:  # benchmarks/bench.py's row 2 with the Hugging Face engine, search shape
            import dataclasses

            model.generation_engine = "hf"
            hf_scale = dataclasses.replace(scale, gen_new_tokens=args.hf_baseline)
            recorded(results, "hf_row2", lambda: bench.measure_generate(model, tokenizer, hf_scale, device, floors),
                     save)
            if "error" not in results["hf_row2"]:
                bench.print_result("generate", results["hf_row2"])
        if args.mfu:  # row 1 with the learner's attention as train.py runs it, then with cuDNN allowed
            import logprobs
            import train
            from torch.nn.attention import SDPBackend

            train.enable_gradient_checkpointing(model)
            for key, extra in (("train", []), ("train_cudnn", [SDPBackend.CUDNN_ATTENTION] if cuda else [])):
                saved = logprobs.ATTENTION_BACKENDS
                logprobs.ATTENTION_BACKENDS = extra + list(saved)
                try:  # cuDNN attention crashed on H100s in generation: an error is recorded
                    recorded(results, key, lambda: bench.measure_train_step(model, tokenizer, scale, device, floors),
                             save)
                finally:
                    logprobs.ATTENTION_BACKENDS = saved
                if "error" not in results[key]:
                    bench.print_result("train", results[key])
    return 0


if __name__ == "__main__":
    sys.exit(main())
