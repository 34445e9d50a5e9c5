"""The step model: how long one SPIRAL (or GRPO) step of train.py takes on one GPU, stage by stage, COMPUTED from
per-step costs measured on an H100 (benchmarks/h100-2026-11-25/: fastgen at 463a395, the learner at 7eda6e9).

    decode step   t(s) = fixed + kv_read(s) / kv_bandwidth, fitted to the two profiled search-shaped steps (64 rows,
                  suffix 256 and 4,096); kv_read = the unique KV bytes (each prompt once, each row's suffix) times
                  the read amplification counted at the 4B shape (1.064 search, 1.052 aggregation; README row 8)
    prefill       prefill FLOPs at a rate fitted to the aggregation_4096 call (its warm time minus its steps)
    captures      the CUDA graphs of a call shape (16 at 4,096 new tokens), at the measured seconds per graph;
                  today fastgen.release() after every collection makes every step capture them again
    learner       per micro-step: the linears' hardware FLOPs at LINEAR_EFFICIENCY of the measured matmul rate, plus
                  attention's (4 A: forward, the recomputation, a backward of 2 A) at a rate fitted to row 1
                  (17,596 + 4,096 tokens: 3.79 s with flash, 2.99 s with cuDNN), per segment on the kernel the
                  code runs it with: a per-sample row and a grouped micro-step's prompt (shared_prompt.py) on the
                  --learner-attention kernel, a grouped completion's segment always on flash (its lower-right
                  causal mask); LoRA r = 32 on the 7 projections, counted from the model (lora.add_lora on Qwen3-4B
                  built on the meta device: 66,060,288 parameters)
    roofline      decode: weights + unique KV bytes per step at the copy bandwidth, prefill at the matmul rate;
                  learner: model FLOPs at 40-50 % MFU

`python benchmarks/step_model.py` prints the fit, its error on the calls it was not fitted on, the step table at
train.py's defaults (8 problems, N1 = 8, n = 4, K = 4, N2 = 4, every trace 4,096 tokens: random weights' worst
case) and the largest levers left (`levers`: seconds a step would save). on_gpu.py prints this model's prediction
beside each measurement. Every figure here is computed.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3Config  # noqa: E402

import fastgen  # noqa: E402
import lora  # noqa: E402
from bench_kit import (QWEN3_4B, decoder_matmul_params, grouped_step_flops, kv_bytes_per_token,  # noqa: E402
                       lora_params, prefill_flops, train_step_flops)

MEASURED = os.path.join(HERE, "h100-2026-11-25")
CONFIG = Qwen3Config(**QWEN3_4B)
KV = kv_bytes_per_token(CONFIG, 2)  # 147,456 bytes per token in bf16
WEIGHT_BYTES = 2 * (decoder_matmul_params(CONFIG) + CONFIG.vocab_size * CONFIG.hidden_size)  # read once a step
AMPLIFICATION = {"search": 1.064, "aggregation": 1.052}  # KV bytes read / unique bytes, counted (README row 8)
SEARCH_PROMPT, AGGREGATION_PROMPT, NEW_TOKENS = 1031, 17_596, 4096  # the measured rows' prompt lengths
LINEAR_EFFICIENCY = 0.81  # dense matmuls of the learner against the 8192^3 matmul floor (assumed)
AGG_PROMPTS_PER_CALL = 13  # what rollout.generate plans for 17.6k-token prompts x 4 on an 80 GB card


@functools.cache
def lora_count(rank: int = 32) -> int:
    """LoRA parameters train.py adds to Qwen3-4B (lora.add_lora on every projection), counted on the model itself,
    built from its config on the meta device: r (in + out) per projection, 7 projections x 36 layers."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(CONFIG)
    lora.add_lora(model, rank=rank, alpha=float(rank))
    return lora_params(model)


def _load(name: str) -> dict:
    with open(os.path.join(MEASURED, name)) as f:
        return json.load(f)


def _sum_kv(prompts: int, prompt_tokens: int, rows: int, steps: int, amplification: float) -> float:
    """KV bytes read over decode steps 1..steps: each prompt once, each row's suffix of s tokens at step s."""
    return KV * amplification * (steps * prompts * prompt_tokens + rows * steps * (steps + 1) / 2)


@dataclass
class Fit:
    fixed_s: float  # per decode step, besides the KV reads
    kv_Bps: float  # KV bytes read per second inside a decode step
    prefill_Fps: float  # prefill FLOP/s
    capture_s_per_graph: float
    matmul_Fps: float  # the measured matmul floor and copy bandwidth (same session)
    copy_Bps: float
    attention_Fps: dict  # learner attention FLOP/s by kernel: "flash", "cudnn"

    def decode_s(self, prompts: int, prompt_tokens: int, copies: int, steps: int, shape: str) -> float:
        kv = _sum_kv(prompts, prompt_tokens, prompts * copies, steps, AMPLIFICATION[shape])
        return steps * self.fixed_s + kv / self.kv_Bps

    def call_s(self, prompts: int, prompt_tokens: int, copies: int, steps: int, shape: str,
               captures: bool = False) -> float:
        """One generate call: prefill, decode steps, and (captures=True) its CUDA graphs (16 per 4,096 steps)."""
        return sum(self.call_parts(prompts, prompt_tokens, copies, steps, shape, captures).values())

    def call_parts(self, prompts: int, prompt_tokens: int, copies: int, steps: int, shape: str,
                   captures: bool = False) -> dict:
        """call_s by part: prefill, the decode steps' fixed cost and KV reads, graph captures (seconds)."""
        kv = _sum_kv(prompts, prompt_tokens, prompts * copies, steps, AMPLIFICATION[shape])
        return {"prefill": prefill_flops(CONFIG, [prompt_tokens] * prompts) / self.prefill_Fps,
                "decode_fixed": steps * self.fixed_s, "decode_kv": kv / self.kv_Bps,
                "captures": 16 * steps / 4096 * self.capture_s_per_graph if captures else 0.0}

    def call_floor_s(self, prompts: int, prompt_tokens: int, copies: int, steps: int) -> float:
        kv = _sum_kv(prompts, prompt_tokens, prompts * copies, steps, 1.0)
        prefill = prefill_flops(CONFIG, [prompt_tokens] * prompts) / self.matmul_Fps
        return prefill + (steps * WEIGHT_BYTES + kv) / self.copy_Bps

    def micro_step_s(self, flops: dict, kernel: str, keep_attention_outputs: bool = False) -> float:
        """One learner micro-step from its FLOP count (bench_kit.train_step_flops or grouped_step_flops), under
        checkpointing; keep_attention_outputs: the backward does not run the attention forward again. Attention on
        `kernel` but for the grouped completions' segments ("flash_attention_flops"), which always run flash."""
        A, A_flash = flops["attention_flops"], flops["flash_attention_flops"]
        linear = flops["hardware_flops"] - 4 * A  # the attention's 4 A: forward, recomputation, backward (2 A)
        passes = 3 if keep_attention_outputs else 4
        return linear / (LINEAR_EFFICIENCY * self.matmul_Fps) + passes * (
            (A - A_flash) / self.attention_Fps[kernel] + A_flash / self.attention_Fps["flash"])


def fit() -> Fit:
    """The model's constants from the session's JSON files."""
    decode, learner = _load("3-decode-463a395.json"), _load("1-decode-7eda6e9.json")
    profile, row = decode["profile_fuse_True"], decode["rows"]["search_4096"]
    kv_256, kv_4096 = (KV * AMPLIFICATION["search"] * (row["prompts"] * row["prompt_tokens"] + 64 * s)
                       for s in (256, 4096))
    ms_256, ms_4096 = profile["graph_ms_per_step_suffix_256"], profile["graph_ms_per_step_suffix_4096"]
    kv_Bps = (kv_4096 - kv_256) / ((ms_4096 - ms_256) / 1000)
    fixed_s = ms_256 / 1000 - kv_256 / kv_Bps
    agg = decode["rows"]["aggregation_4096"]
    steps_s = (agg["new_tokens"] * fixed_s
               + _sum_kv(agg["prompts"], agg["prompt_tokens"], agg["prompts"] * agg["copies"], agg["new_tokens"],
                         AMPLIFICATION["aggregation"]) / kv_Bps)
    prefill_Fps = prefill_flops(CONFIG, [agg["prompt_tokens"]] * agg["prompts"]) / (agg["warm_call_s"] - steps_s)
    rows = [r for r in decode["rows"].values() if r["captures"]]
    capture = sum(r["capture_s"] for r in rows) / sum(r["captures"] for r in rows)
    floors = decode["floors"]
    partial = Fit(fixed_s, kv_Bps, prefill_Fps, capture, floors["matmul_TFLOPs"] * 1e12,
                  floors["copy_bandwidth_GBps"] * 1e9, {})
    for kernel, key in (("flash", "train"), ("cudnn", "train_cudnn")):
        r = learner[key]
        flops = train_step_flops(CONFIG, r["prompt_tokens"] + r["completion_tokens"], r["completion_tokens"],
                                 lora_count())
        linear_s = (flops["hardware_flops"] - 4 * flops["attention_flops"]) / (LINEAR_EFFICIENCY * partial.matmul_Fps)
        partial.attention_Fps[kernel] = 4 * flops["attention_flops"] / (r["seconds"] - linear_s)
    return partial


def check(f: Fit) -> list[tuple[str, float, float]]:
    """(row, measured warm seconds, predicted seconds) for the calls the fit did not use."""
    out = []
    for name, r in _load("3-decode-463a395.json")["rows"].items():
        if name == "aggregation_4096":
            continue  # the prefill rate was fitted on it
        shape = name.split("_")[0]
        out.append((name, r["warm_call_s"], f.call_s(r["prompts"], r["prompt_tokens"], r["copies"], r["new_tokens"],
                                                      shape)))
    return out


# ----------------------------------------------------------------------------------------------------------------------
# A step at train.py's defaults


def aggregation_prompt(new_tokens: int = NEW_TOKENS, n: int = 4) -> int:
    """Tokens of an aggregation prompt whose n candidates are full traces of `new_tokens` (17,596 at 4,096)."""
    return AGGREGATION_PROMPT - n * (NEW_TOKENS - new_tokens)


def spiral_groups(problems: int, new_tokens: int = NEW_TOKENS, n1: int = 8, k: int = 4, n2: int = 4) -> list:
    """(prompt tokens, completion lengths) of every group the learner trains in a SPIRAL step (every trace full)."""
    return problems * ([(SEARCH_PROMPT, [new_tokens] * n1)] + [(aggregation_prompt(new_tokens), [new_tokens] * n2)] * k)


def learner_s(f: Fit, groups: list, kernel: str, grouped: bool) -> tuple[float, float]:
    """(seconds, model FLOPs) of the learner over `groups`: one micro-step per sample, or per group (grouped)."""
    seconds = flops = 0.0
    for prompt, completions in groups:
        parts = ([grouped_step_flops(CONFIG, prompt, completions, lora_count())] if grouped else
                 [train_step_flops(CONFIG, prompt + L, L, lora_count()) for L in completions])
        seconds += sum(f.micro_step_s(p, kernel) for p in parts)
        flops += sum(p["model_flops"] for p in parts)
    return seconds, flops


def aggregation_calls(problems: int, k: int = 4) -> list[int]:
    prompts = problems * k
    return [min(AGG_PROMPTS_PER_CALL, prompts - i) for i in range(0, prompts, AGG_PROMPTS_PER_CALL)]


def spiral_step(f: Fit, problems: int = 8, new_tokens: int = NEW_TOKENS, kernel: str = "flash",
                captures: bool = True) -> dict:
    """Seconds per stage of one SPIRAL step (the per-sample learner, and train.py's default, the grouped one), and
    floors."""
    search = f.call_s(problems, SEARCH_PROMPT, 8, new_tokens, "search", captures)
    calls, P = aggregation_calls(problems), aggregation_prompt(new_tokens)
    # a call of a new shape captures its graphs (today every step: fastgen.release() drops them after a collection)
    aggregation = sum(f.call_s(p, P, 4, new_tokens, "aggregation", captures and (i == 0 or p != calls[0]))
                      for i, p in enumerate(calls))
    groups = spiral_groups(problems, new_tokens)
    per_sample, flops_old = learner_s(f, groups, kernel, grouped=False)
    grouped, flops_new = learner_s(f, groups, kernel, grouped=True)
    floor_gen = (f.call_floor_s(problems, SEARCH_PROMPT, 8, new_tokens)
                 + sum(f.call_floor_s(p, P, 4, new_tokens) for p in calls))
    return {"search_s": search, "aggregation_s": aggregation, "aggregation_calls": calls,
            "learner_per_sample_s": per_sample, "learner_grouped_s": grouped,
            "learner_PFLOP_per_sample": flops_old / 1e15, "learner_PFLOP_grouped": flops_new / 1e15,
            "step_s": search + aggregation + per_sample, "step_grouped_s": search + aggregation + grouped,
            "roofline_generation_s": floor_gen,
            "roofline_learner_s": [flops_old / (m * f.matmul_Fps) for m in (0.5, 0.4)],
            "roofline_learner_grouped_s": [flops_new / (m * f.matmul_Fps) for m in (0.5, 0.4)]}


def grpo_step(f: Fit, problems: int = 8, group: int = 12, new_tokens: int = 8192, kernel: str = "flash",
              captures: bool = True) -> dict:
    """GRPO at equal budget: its calls are planned with the token budget that holds 13 aggregation prompts."""
    budget = AGG_PROMPTS_PER_CALL * fastgen.CallShape.of([AGGREGATION_PROMPT], 4, NEW_TOKENS).cache_tokens()
    per_call = max(1, fastgen.rows_per_call(budget, SEARCH_PROMPT, group, new_tokens) // group)
    calls = [min(per_call, problems - i) for i in range(0, problems, per_call)]
    generation = sum(f.call_s(p, SEARCH_PROMPT, group, new_tokens, "search", captures) for p in calls)
    groups = problems * [(SEARCH_PROMPT, [new_tokens] * group)]
    per_sample, flops_old = learner_s(f, groups, kernel, grouped=False)
    grouped, flops_new = learner_s(f, groups, kernel, grouped=True)
    return {"generation_s": generation, "calls": calls, "learner_per_sample_s": per_sample,
            "learner_grouped_s": grouped, "learner_PFLOP_per_sample": flops_old / 1e15,
            "learner_PFLOP_grouped": flops_new / 1e15, "step_s": generation + per_sample,
            "step_grouped_s": generation + grouped}


def levers(f: Fit, problems: int = 8, kernel: str = "cudnn") -> dict:
    """Seconds one SPIRAL step at train.py's defaults (grouped learner, `kernel`) would save, by what is left:

      decode fixed cost      each decode step's fixed cost down to reading the weights once at the copy bandwidth
      learner attention      the learner's attention at the linears' rate (LINEAR_EFFICIENCY of the matmul floor)
      prefill                the aggregation and search prefills at the matmul floor instead of the fitted rate
      graph captures         no CUDA-graph captures (graphs kept across steps)
      completions on cuDNN   the grouped completions' attention at the `kernel` rate instead of flash's
      learner linears        the learner's linears at the matmul floor instead of LINEAR_EFFICIENCY of it
      decode KV reads        the decode steps' KV reads at the copy bandwidth instead of the fitted rate
    """
    P, calls = aggregation_prompt(), aggregation_calls(problems)
    parts = [f.call_parts(problems, SEARCH_PROMPT, 8, NEW_TOKENS, "search", True)] + [
        f.call_parts(p, P, 4, NEW_TOKENS, "aggregation", i == 0 or p != calls[0]) for i, p in enumerate(calls)]
    steps = NEW_TOKENS * len(parts)
    flops = [grouped_step_flops(CONFIG, prompt, completions, lora_count())
             for prompt, completions in spiral_groups(problems)]
    A = sum(x["attention_flops"] for x in flops)
    A_flash = sum(x["flash_attention_flops"] for x in flops)
    attention_s = 4 * ((A - A_flash) / f.attention_Fps[kernel] + A_flash / f.attention_Fps["flash"])
    linear_s = sum(x["hardware_flops"] - 4 * x["attention_flops"] for x in flops) / (LINEAR_EFFICIENCY * f.matmul_Fps)
    prefill_flops_step = (prefill_flops(CONFIG, [SEARCH_PROMPT] * problems)
                          + prefill_flops(CONFIG, [P] * sum(calls)))
    return {
        "decode fixed cost": steps * (f.fixed_s - WEIGHT_BYTES / f.copy_Bps),
        "learner attention": attention_s - 4 * A / (LINEAR_EFFICIENCY * f.matmul_Fps),
        "prefill": sum(x["prefill"] for x in parts) - prefill_flops_step / f.matmul_Fps,
        "graph captures": sum(x["captures"] for x in parts),
        "completions on cuDNN": 4 * A_flash * (1 / f.attention_Fps["flash"] - 1 / f.attention_Fps[kernel]),
        "learner linears": linear_s * (1 - LINEAR_EFFICIENCY),
        "decode KV reads": sum(x["decode_kv"] for x in parts) * (1 - f.kv_Bps / f.copy_Bps),
    }


# ----------------------------------------------------------------------------------------------------------------------
# Predictions for what bench_gpu.py and on_gpu.py measure


def predict_learner(flops: list[dict], kernel: str, keep_attention_outputs: bool = False) -> float:
    """Seconds of learner micro-steps with these FLOP counts (one dict per micro-step)."""
    f = fit()
    return sum(f.micro_step_s(x, kernel, keep_attention_outputs) for x in flops)


def predict_generate_calls(prompts_per_call: list[int], prompt_tokens: int, copies: int, new_tokens: int,
                           shape: str = "aggregation") -> float:
    """Seconds of generate calls, graph captures included (each call a first call of its shape)."""
    f = fit()
    return sum(f.call_s(n, prompt_tokens, copies, new_tokens, shape, captures=True) for n in prompts_per_call)


def predict_train_step(problems: int, new_tokens: int, kernel: str = "cudnn") -> dict:
    """Stage seconds of one train.py step (grouped learner) at `problems` problems x `new_tokens`."""
    s = spiral_step(fit(), problems, new_tokens, kernel=kernel)
    return {"search_s": s["search_s"], "aggregation_s": s["aggregation_s"], "learner_s": s["learner_grouped_s"]}


def main() -> int:
    f = fit()
    print(f"fit (H100, 2026-11-25): decode step {1000 * f.fixed_s:.2f} ms + KV at {f.kv_Bps / 1e9:,.0f} GB/s; "
          f"prefill {f.prefill_Fps / 1e12:.0f} TFLOP/s; {f.capture_s_per_graph:.2f} s per CUDA graph; learner "
          f"attention {f.attention_Fps['flash'] / 1e12:.0f} (flash) / {f.attention_Fps['cudnn'] / 1e12:.0f} (cuDNN) "
          f"TFLOP/s, linears at {LINEAR_EFFICIENCY:.0%} of {f.matmul_Fps / 1e12:.0f} TFLOP/s")
    for name, measured, predicted in check(f):
        print(f"  check {name}: measured {measured:.1f} s, model {predicted:.1f} s ({predicted / measured - 1:+.1%})")
    for kernel in ("flash", "cudnn"):
        s, g = spiral_step(f, kernel=kernel), grpo_step(f, kernel=kernel)
        print(f"SPIRAL step at train.py's defaults, learner attention {kernel} (computed): "
              f"search {s['search_s']:.0f} s, "
              f"aggregation {s['aggregation_s']:.0f} s (calls of {' + '.join(map(str, s['aggregation_calls']))} "
              f"prompts x 4), learner {s['learner_per_sample_s']:.0f} s per sample "
              f"({s['learner_PFLOP_per_sample']:.1f} PFLOP) / {s['learner_grouped_s']:.0f} s grouped "
              f"({s['learner_PFLOP_grouped']:.1f} PFLOP); step {s['step_s']:.0f} s / {s['step_grouped_s']:.0f} s. "
              f"Roofline: generation {s['roofline_generation_s']:.0f} s, learner "
              f"{s['roofline_learner_s'][0]:.0f}-{s['roofline_learner_s'][1]:.0f} s / grouped "
              f"{s['roofline_learner_grouped_s'][0]:.0f}-{s['roofline_learner_grouped_s'][1]:.0f} s")
        print(f"GRPO step at equal budget (computed): generation {g['generation_s']:.0f} s (calls of "
              f"{' + '.join(map(str, g['calls']))} prompts x 12), learner {g['learner_per_sample_s']:.0f} s "
              f"({g['learner_PFLOP_per_sample']:.1f} PFLOP) / grouped {g['learner_grouped_s']:.0f} s "
              f"({g['learner_PFLOP_grouped']:.1f} PFLOP); SPIRAL / GRPO {s['step_s'] / g['step_s']:.2f} per "
              f"sample, {s['step_grouped_s'] / g['step_grouped_s']:.2f} both grouped")
    ranked = sorted(levers(f).items(), key=lambda kv: -kv[1])
    print("Levers left, seconds a SPIRAL step at train.py's defaults (grouped, cuDNN) would save (computed): "
          + "; ".join(f"{name} {seconds:.0f} s" for name, seconds in ranked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
