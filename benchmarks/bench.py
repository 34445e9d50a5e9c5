"""Memory and speed of SPIRAL-ref at the 4B scale on one GPU, and of the chunked log-probs on CPU.

What it measures, always through the project's own code paths (rollout.generate, spiral.collect_*,
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
  9. learner  train.accumulate_gradients with the grouped learner (shared_prompt.py: each prompt once per group)
              against the per-sample learner on one SPIRAL step's samples of `train.py --preset tiny`, timed
              alternately in one process (medians): the time ratio, and the tokens each passes through the model.
  7. decode   one decode step of rollout.generate(engine="hf") and engine="fast" (fastgen.py, eager on a CPU) on the
              tiny model at batch 64 (8 prompts x 8 samples, LoRA r=32 active): milliseconds per step (generate
              with 1 + n new tokens minus with 1, over n; minimum of repeats), a proxy for per-step overhead; and the
              bytes a step copies besides reading the weights and the cache (CopyCounter: concatenations such as a
              DynamicCache growing, copies such as expanded K/V heads or the logits' fp32 copy, masks).
GPU rows 2-4 take --engine hf|fast (fast: fastgen.py, the decode step replayed as CUDA graphs). A GPU row that
fails (an out-of-memory, a kernel error, train.py's exit status; a row labelled grouped where the grouped learner
did not apply) records its error in --json, the next row runs, and bench.py exits 1 naming every failed row.

Run it (from the repository root):
    python benchmarks/bench.py --cpu --json cpu.json                   # 5, at 4,096 tokens (~4 min, shared 2-core CPU)
    python benchmarks/bench.py --cpu --small                           # 5 at 512 tokens, 7 and 9 (what CI runs)
    python benchmarks/bench.py --cpu --cpu-parts decode --json d.json  # 7 alone (~1 min)
    python benchmarks/bench.py --cpu --cpu-parts learner               # 9 alone (~1 min)
    python benchmarks/bench.py --only generate --engine fast           # 2 with fastgen.py
    python benchmarks/bench.py --json gpu.json                         # 1-4 on a CUDA GPU (see README for time)
    python benchmarks/bench.py --only train,generate                   # a subset
    python benchmarks/bench.py --size toy --device cpu                 # the GPU code path on a toy model, on CPU

Files: this one is the command line; bench_kit.py builds the model and tokenizer and holds Meter, the floors and the
FLOP / byte counts; bench_gpu.py measures rows 1-4, bench_cpu.py rows 5 and 7. The names other scripts use
(benchmarks/decode.py, the tests) stay reachable as bench.<name>.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(HERE), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

import checkpoint  # noqa: E402
import cli  # noqa: E402
# Re-exported: benchmarks/decode.py and the tests reach these as bench.<name>.
from bench_cpu import (CopyCounter, logprob_worker, measure_decode, naive_completion_logprobs,  # noqa: E402,F401
                       run_cpu_part, run_decode_part, run_learner_part)
from bench_gpu import (GPU_MEASUREMENTS, SCALES, Scale, measure_aggregation, measure_generate,  # noqa: E402,F401
                       measure_spiral_step, measure_train_step, print_result, run_gpu_part)
from bench_kit import (GB, MODEL_CONFIGS, QWEN3_4B, TOY, Meter, attention_flops, build_policy,  # noqa: E402,F401
                       decoder_matmul_params, grouped_step_flops, kv_bytes_per_token, lora_params, measure_floors,
                       random_words, synthetic_tokenizer, train_step_flops, weight_bytes, write_json)


# ----------------------------------------------------------------------------------------------------------------------
# Command line

CPU_PARTS = ("logprobs", "decode", "learner")


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


def build_parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog="bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="run the CPU part (5: log-prob memory, 7: decode step cost, "
                                                        "9: grouped / per-sample learner) instead of the GPU part")
    p.add_argument("--cpu-parts", type=lambda s: s.split(","), default=list(CPU_PARTS),
                   help=f"CPU part: comma-separated subset of {','.join(CPU_PARTS)}")
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
                   help="GPU part: rollout.generate's engine for 2-4 (fast: fastgen.py, CUDA graphs)")
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
    cli.check_device(args.device)
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
        return _main(argv)
    except KeyboardInterrupt as exc:
        exc.__traceback__ = None
        print("bench.py: interrupted; the measurements finished so far are in --json (if given)", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
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
        unknown = [k for k in args.cpu_parts if k not in CPU_PARTS]
        if unknown:
            print(f"bench.py: error: --cpu-parts {','.join(unknown)}: choose from {','.join(CPU_PARTS)}",
                  file=sys.stderr)
            return 2
        results = run_cpu_part(args) if "logprobs" in args.cpu_parts else {}
        if "decode" in args.cpu_parts:
            results["decode"] = run_decode_part(args)
        if "learner" in args.cpu_parts:
            results["learner"] = run_learner_part(args)
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
        results = run_gpu_part(args)  # writes --json after every measurement too
    if args.json:
        write_json(args.json, results)
        print(f"bench.py: wrote {args.json}")
    failed = [] if args.cpu else failed_measurements(results)
    if failed:  # recorded in --json as results; the exit status says they are not measurements
        print(f"bench.py: error: {len(failed)} measurement(s) failed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def failed_measurements(results: dict) -> list[str]:
    """"ROW: error" for each GPU row, and each learner variant, that recorded an error instead of a figure."""
    failed = []
    for key in GPU_MEASUREMENTS:
        r = results.get(key)
        if isinstance(r, dict) and "error" in r:
            failed.append(f"{key}: {r['error']}")
        elif isinstance(r, dict) and key == "learner":
            failed += [f"learner {k}: {v['error']}" for k, v in r.items() if isinstance(v, dict) and "error" in v]
    return failed



if __name__ == "__main__":
    sys.exit(main())
