"""evaluate.py's cross-problem batching against the per-problem path it replaced, measured in one run.

Both modes run evaluate.evaluate_policy (every method of `--preset tiny`: pass@k, majority@k, RSA at each population,
sequential) on the same problems with the same policy, each from an empty cache:
  per-problem  --tokens-per-call 1: one rollout.generate call per problem and stage (the code before batching)
  batched      the default --tokens-per-call: one call per stage for all problems (rollout micro-batches it)
Each measurement runs in a fresh process (cold grader cache and worker, model loaded before the clock starts).
Reported: wall time of the whole evaluation (generation and grading), the time inside rollout.generate (all of it,
search pools, RSA aggregation steps), the number of generate calls, and the ratios. The modes draw different (equally valid) samples: accuracies differ a little.

    python benchmarks/eval_batching.py                        # 100 tiny_sums problems x 8 samples, 1 thread
    python benchmarks/eval_batching.py --limit 40 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import evaluate  # noqa: E402
import problemset  # noqa: E402
import rollout  # noqa: E402
from prompts import AGGREGATION_TRACE_PROMPT  # noqa: E402


def run_mode(name: str, args) -> dict:
    """One cold evaluation in this process (fresh cache); times and call counts."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as out:
        cfg = evaluate.parse_args(["--preset", "tiny", "--limit", str(args.limit), "--num-samples",
                                   str(args.num_samples), "--out", os.path.join(out, "r.json"),
                                   *(["--micro-batch-size", str(args.micro_batch_size)] if args.micro_batch_size else [])])
    problems = problemset.load_problems(cfg.data)[: cfg.limit]
    model, tokenizer = rollout.load_policy(cfg.model, device="cpu")
    tokens_per_call = 1 if name == "per-problem" else cfg.tokens_per_call
    generate, inside = rollout.generate, {"search": 0.0, "rsa": 0.0}

    def timed_generate(model, tokenizer, prompts, **kw):
        start = time.perf_counter()
        try:
            return generate(model, tokenizer, prompts, **kw)
        finally:
            stage = "rsa" if prompts[0].startswith(AGGREGATION_TRACE_PROMPT[:20]) else "search"
            inside[stage] += time.perf_counter() - start

    rollout.generate = timed_generate
    try:
        with tempfile.TemporaryDirectory() as cache_dir:
            sampler = evaluate.Sampler(model, tokenizer, evaluate.TraceCache(cache_dir), {"mode": name,
                                       "temperature": cfg.temperature}, tokens_per_call=tokens_per_call,
                                       micro_batch_size=cfg.micro_batch_size)
            start = time.perf_counter()
            records = evaluate.evaluate_policy(problems, sampler, cfg)
            wall = time.perf_counter() - start
    finally:
        rollout.generate = generate
    summary = evaluate.summarize(records, cfg)
    return {"mode": name, "wall_s": wall, "generate_s": sum(inside.values()), "search_generate_s": inside["search"],
            "rsa_generate_s": inside["rsa"], "generate_calls": sampler.calls,
            "traces": sampler.cache.generated, "pass@1": summary["passk"]["pass_at_k"][0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=100, help="tiny_sums problems (100 = all)")
    p.add_argument("--num-samples", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats; the median is reported")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the tiny preset trains with 1)")
    p.add_argument("--micro-batch-size", type=int, help="evaluate.py's flag: sequences per model.generate "
                                                         "(default: rollout.generate's choice)")
    p.add_argument("--json", help="write the measurements here")
    p.add_argument("--mode", choices=["per-problem", "batched"], help=argparse.SUPPRESS)  # one measurement
    args = p.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args)))
        return
    runs, flags = [], sys.argv[1:]
    for r in range(args.repeats):  # alternate the order: a busy machine's drift hits both modes alike
        for mode in ("per-problem", "batched") if r % 2 == 0 else ("batched", "per-problem"):
            proc = subprocess.run([sys.executable, __file__, *flags, "--mode", mode], capture_output=True, text=True,
                                  check=True)
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in runs[-1].items()}))
    median = lambda xs: sorted(xs)[(len(xs) - 1) // 2]  # noqa: E731  (the lower median of 2)
    result = {"limit": args.limit, "num_samples": args.num_samples, "threads": args.threads,
              "micro_batch_size": args.micro_batch_size, "load_average": os.getloadavg(),
              "torch": torch.__version__, "runs": runs}
    for key in ("wall_s", "generate_s", "search_generate_s", "rsa_generate_s"):
        per, batched = (median([r[key] for r in runs if r["mode"] == m]) for m in ("per-problem", "batched"))
        result[f"ratio_{key}"] = per / batched
        print(f"{key:>17}: per-problem {per:7.2f}  batched {batched:7.2f}  ratio {per / batched:5.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
