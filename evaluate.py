"""Test-time compute evaluation of the SPIRAL paper (Section 4): policies side by side, the paper's figure kinds.

Each policy (the base model, or a LoRA adapter saved by train.py, each with a label) runs on the same problems with
the methods of testtime.py; figures.plot_evaluation overlays the policies in one PNG next to the JSON:

    passk       pass@k vs k (Chen et al. 2021)        figure "Pass@k evaluation on test sets"
    majority    majority@k vs k                       figure "Comparison of inference methods scaling parallel traces"
    rsa         pass@1 vs RSA step, per population P  figure "Pass@1 evaluation under RSA"; its last step vs P in
                                                      "... scaling parallel traces"
    sequential  pass@1 vs max_new_tokens              figure "Comparison of models under scaling sequential compute"

Every curve records the maximum token budget per problem (traces x max_new_tokens, the x-axis of "Comparison of
inference compute scaling ... against token usage") and the tokens actually generated, by search traces and by
aggregation traces apart. Set-level measures (testtime.py note 4) tell what sets of candidates held from what the
aggregator made of them: the sets RSA step t drew over step t-1, measured without generating anything more.

Choices where the paper is silent, or where this code departs from it (more in testtime.py):
 1. One pool of search traces per (problem, trace length L): pass@k, RSA step 1 and sequential at L =
    --max-new-tokens read the same samples; majority@k reads the pool at --majority-max-new-tokens (paper: >= 4
    traces of up to 16k tokens, so a budget >= 64k). Estimates are correlated, each one unbiased.
 2. Plain temperature sampling (1.0, top-k/top-p off), as in training. Sequential scaling samples afresh at each L.
 3. Budgets count every trace: RSA through step t costs P x t x L, so the paper's 36k minimum for RSA (P=8, k=4)
    does not follow (8 x 4096 = 32,768 at step 1; 65,536 through step 2).
 4. Batching and the cache: each stage (one pool, one RSA step) of all problems goes to rollout.generate in calls
    of at most --tokens-per-call, each seeded from its content. The same command twice gives the same results and
    the second run generates nothing; more samples, steps, budgets or problems generate only what is missing; a
    run resumed after Ctrl-C repeats the calls it had not finished; a corrupted cache file's call is drawn again
    from trace 0 with the first run's seed (its traces come back the same). A trace depends on which problems share its
    call (--limit, --tokens-per-call, --micro-batch-size): every variant is a valid i.i.d. draw.

The result JSON (--out) and what a consumer may rely on: OPERATING.md, "The result JSON".

Cross-aggregation (--cross A=B, --cross-all): RSA whose step 1 is policy A's search traces (the pool A's own RSA
reads) and whose steps >= 2 are policy B's aggregation traces, so a table of search policy x aggregator policy
says which half made a gain. Step 2 aggregates the very sets A's own RSA drew; B's traces are cached under keys
naming A as well; a pair (A, A) is A's own RSA, read from the cache (nothing is generated for it).

Run:
    python evaluate.py --preset tiny                                                  # seconds on a CPU
    python evaluate.py --preset tiny --policy base=data/tiny_warmstart \\
        --policy grpo=runs/tiny-grpo/adapter --policy spiral=runs/tiny-spiral/adapter  # the README's comparison
    python evaluate.py --policy base=Qwen/Qwen3-4B-Instruct-2507 --policy spiral=runs/paper-spiral/adapter
    python evaluate.py --preset tiny --policy base=data/tiny_warmstart --policy spiral=runs/tiny-spiral/adapter \\
        --cross-all                                   # + every search policy x aggregator policy pair
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import operator
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

import checkpoint
import cli
import figures
import instruments
import reward as grader
import problemset
import rollout
import task
import tiny
import tiny_parts
import tiny_walk
from checkpoint import quiet_libraries, versions
from lora import ADAPTER_CONFIG, load_adapter, lora_parameters, read_adapter_config, use_adapter
from reward import extract_answer, reward
from testtime import (SetCounts, cluster_answers, count_sets, derive_seed, expected_distinct_answers, majority_at_k,
                      pass_at_k, recursive_self_aggregation, set_measures)
from tracecache import Sampler, Trace, TraceCache, plan_calls  # noqa: F401  (plan_calls: evaluate.plan_calls)

METHODS = ("passk", "majority", "rsa", "sequential")

# The presets. Values the paper states are marked; the rest are our choices (one GPU, HF generate).
PRESETS = {
    "paper": dict(
        model=rollout.DEFAULT_MODEL, data="math500", limit=None,  # paper: Qwen3-4B-Instruct-2507
        num_samples=16, max_new_tokens=4096, temperature=1.0,  # 4096: the paper's training length
        majority_max_new_tokens=16384,  # paper: majority voting over traces of up to 16k tokens
        rsa_populations=[4, 8, 16], rsa_set_size=4, rsa_steps=5,  # paper: P=8, k=4; the P sweep and T are ours
        max_tokens_list=[1024, 2048, 4096, 8192, 16384, 32768],  # paper: sequential scaling up to 32k tokens
        majority_subsets=32),
    "tiny": dict(  # seconds on a CPU: the tiny preset's warm-started base on its sums task
        model=tiny.WARM_START_DIR, data="tiny_sums", limit=20, temperature=1.0, majority_subsets=32,
        num_samples=8, max_new_tokens=12, majority_max_new_tokens=12,  # a tiny trace is 8 tokens ("3 + 5 = \\boxed{8}")
        rsa_populations=[4, 8], rsa_set_size=4, rsa_steps=3, max_tokens_list=[4, 8, 12],
        micro_batch_size=128),  # on a CPU, batches of ~1,000 short sequences spill the caches (benchmarks/)
    "tiny_parts": dict(  # the second CPU task (tiny_parts.py); a trace is 14 tokens ("352 + 416 = \\boxed{768}")
        model=tiny_parts.WARM_START_DIR, data=tiny_parts.HELDOUT_FILE, limit=100, temperature=1.0,  # not RL's
        majority_subsets=32, num_samples=8, max_new_tokens=16, majority_max_new_tokens=16,
        rsa_populations=[4, 8], rsa_set_size=4, rsa_steps=3, max_tokens_list=[16], micro_batch_size=128),
    "tiny_parts6": dict(  # its 6-digit variant; a trace is 23 tokens; held-out problems as tiny_parts
        model=tiny_parts.TASKS["tiny_parts6"].warm_start_dir, data=tiny_parts.TASKS["tiny_parts6"].heldout_file,
        limit=100, temperature=1.0, majority_subsets=32, num_samples=8, max_new_tokens=28, majority_max_new_tokens=28,
        rsa_populations=[4, 8], rsa_set_size=4, rsa_steps=3, max_tokens_list=[28], micro_batch_size=128),
}

PRESETS["tiny_walk"] = tiny_walk.EVALUATE_PRESET  # held-out walk problems, its checker

RSA_PRESETS = {
    "spiral": dict(rsa_populations=[8], rsa_set_size=4),  # the SPIRAL paper's RSA figure
    "rsa-paper": dict(rsa_populations=[16], rsa_set_size=4, rsa_steps=10),  # Venkatraman et al. (2025) defaults
}


UsageError = cli.ConfigError  # bad input: one line on stderr, exit code 2, before anything is generated


class PolicyDiverged(Exception):
    """Sampling met non-finite probabilities: one line on stderr, exit code 1."""


# ----------------------------------------------------------------------------------------------------------------------
# 1. One policy: every method, stage by stage over all problems


def _graded(traces: list[Trace], problem, reward_fn=None) -> list[dict]:
    """Each trace graded. The math task: its \\boxed{} answer, correct iff math-verify says it equals the gold. A
    user's task (--reward): its reward r(x, y), correct iff r = 1; no answer (majority@k is the math task's)."""
    if reward_fn is None:
        return [{"answer": extract_answer(t.text), "correct": reward(t.text, problem.answer) == 1.0,
                 "tokens": t.num_tokens, "truncated": t.truncated} for t in traces]
    scores = [reward_fn(problem, t.text) for t in traces]
    return [{"answer": None, "reward": r, "correct": r == 1.0, "tokens": t.num_tokens, "truncated": t.truncated}
            for t, r in zip(traces, scores)]


def pool_sizes(cfg) -> dict[int, int]:
    """Search traces needed per problem at each trace length L (note 1)."""
    need: dict[int, int] = {}
    wants = [(cfg.max_new_tokens, cfg.num_samples)] if "passk" in cfg.methods else []
    wants += [(cfg.majority_max_new_tokens, cfg.num_samples)] if "majority" in cfg.methods else []
    wants += [(cfg.max_new_tokens, max(cfg.rsa_populations))] if "rsa" in cfg.methods else []
    wants += [(length, cfg.num_samples) for length in cfg.max_tokens_list] if "sequential" in cfg.methods else []
    for length, count in wants:
        need[length] = max(need.get(length, 0), count)
    return need


def _rewards(records: list[dict]) -> list[float]:
    """Every reward a user's task gave: the search pools' and every RSA step's."""
    pools = [s["reward"] for r in records for pool in r["pools"].values() for s in pool]
    steps = [step for r in records for runs in r.get("rsa", {}).values() for step in runs]
    return pools + [s["reward"] for step in steps for s in step["samples"]]


def evaluate_policy(problems, sampler: Sampler, cfg, reward_fn=None) -> list[dict]:
    """Raw per-problem results of every method in cfg.methods (token counts and set-level counts included);
    `reward_fn`: the task's r(x, y) (None: the math grader)."""
    texts, n = [p.problem for p in problems], cfg.num_samples
    pools = {length: sampler.search(texts, count, length) for length, count in pool_sizes(cfg).items()}
    records = []
    for i, problem in enumerate(problems):
        graded = {length: _graded(pool[i], problem, reward_fn) for length, pool in pools.items()}
        record = {"id": problem.id, "problem": problem.problem, "answer": problem.answer, "pools": graded}
        if "passk" in cfg.methods:
            samples = graded[cfg.max_new_tokens][:n]
            correct = sum(s["correct"] for s in samples)
            record["pass_at_k"] = {k: pass_at_k(n, correct, k) for k in cfg.k_list}
            groups = cluster_answers([s["answer"] for s in samples])  # coverage@k of the pool is pass@k
            record["sets"] = {"search": {"distinct_answers": {k: expected_distinct_answers(groups, k)
                                                              for k in cfg.k_list}}}
        if "majority" in cfg.methods:
            samples = graded[cfg.majority_max_new_tokens][:n]
            rng = np.random.default_rng(derive_seed("majority", cfg.seed, problem.problem))
            record["majority"] = majority_at_k([s["answer"] for s in samples], [s["correct"] for s in samples],
                                               cfg.k_list, rng=rng, num_subsets=cfg.majority_subsets)
        if "sequential" in cfg.methods:
            record["sequential"] = {L: {"pass_at_1": float(np.mean([s["correct"] for s in graded[L][:n]])),
                                        "truncated": sum(s["truncated"] for s in graded[L][:n])}
                                    for L in cfg.max_tokens_list}
        records.append(record)
    if "rsa" in cfg.methods:
        aggregate = lambda t, prompts_run: sampler.aggregate(t, prompts_run, cfg.max_new_tokens)  # noqa: E731
        pool = pools[cfg.max_new_tokens]
        for record, (rsa, sets) in zip(records, run_rsa(problems, pool, aggregate, cfg, reward_fn)):
            record["rsa"] = rsa
            record.setdefault("sets", {})["rsa"] = sets
    return records


def run_rsa(problems, pool: list[list[Trace]], aggregate, cfg, reward_fn=None) -> list[tuple[dict, dict]]:
    """RSA at every population P of cfg, all problems in lockstep: step 1 is the first P traces of pool[i] (problem
    i's search traces), steps >= 2 come from aggregate(t, prompts_run). Per problem: ({P: graded steps 1..T},
    {P: SetCounts of steps 2..T, each over the sets of step t and the population of step t-1, as dicts})."""
    texts = [p.problem for p in problems]
    runs = [(text, P) for P in cfg.rsa_populations for text in texts]  # every P and problem in one stage
    histories = recursive_self_aggregation(runs, set_size=cfg.rsa_set_size, steps=cfg.rsa_steps, seed=cfg.seed,
                                           search=lambda r: pool[r % len(texts)][: runs[r][1]], aggregate=aggregate)
    results = [({}, {}) for _ in problems]
    for r, history in enumerate(histories):
        steps = []
        for step in history:
            graded = _graded(step.traces, problems[r % len(texts)], reward_fn)
            steps.append({"step": step.step, "sets": step.sets_pop_k,
                          "pass_at_1": float(np.mean([g["correct"] for g in graded])),
                          "tokens": sum(g["tokens"] for g in graded),
                          "prompt_tokens": sum(t.prompt_tokens for t in step.traces), "samples": graded})
        counts = [asdict(count_sets([s["correct"] for s in before["samples"]],
                                    cluster_answers([s["answer"] for s in before["samples"]]),
                                    after["sets"], [s["correct"] for s in after["samples"]]))
                  for before, after in zip(steps, steps[1:])]
        results[r % len(texts)][0][runs[r][1]], results[r % len(texts)][1][runs[r][1]] = steps, counts
    return results


def cross_aggregate(problems, searcher: Sampler, aggregator: Sampler, cfg, reward_fn=None) -> list[dict]:
    """Cross-aggregation: RSA whose step 1 is the searcher's search traces (its pool, as its own RSA reads it) and
    whose steps >= 2 are the aggregator's (Algorithm 1's two halves from two policies, A = searcher, B =
    aggregator). Step 2 draws the sets A's own RSA draws, so B aggregates the very sets A aggregated; B's traces are
    cached under keys naming A too (tracecache.Sampler.aggregate). A pair (A, A) is A's own RSA, read from the cache.
    Per problem: {id, rsa: {P: graded steps 1..T}, sets: {rsa: {P: SetCounts of steps 2..T}}}."""
    pool = searcher.search([p.problem for p in problems], max(cfg.rsa_populations), cfg.max_new_tokens)
    aggregate = lambda t, prompts_run: aggregator.aggregate(  # noqa: E731
        t, prompts_run, cfg.max_new_tokens, search_identity=searcher.identity)
    return [{"id": p.id, "rsa": rsa, "sets": {"rsa": sets}}
            for p, (rsa, sets) in zip(problems, run_rsa(problems, pool, aggregate, cfg, reward_fn))]


def _mean(values) -> float:
    return float(np.mean(list(values)))


def summarize(records: list[dict], cfg) -> dict:
    """Means over problems. tokens: generated per problem (search_tokens + aggregation_tokens); budget: traces x
    max_new_tokens per problem; sets: the set-level measures (module docstring, "The result JSON")."""
    n, summary = cfg.num_samples, {}

    def per_trace(length):  # mean tokens of one trace of the pool at this length
        return _mean(s["tokens"] for r in records for s in r["pools"][length][:n])

    if "passk" in cfg.methods:
        L = cfg.max_new_tokens
        summary["passk"] = {"k": cfg.k_list,
                            "pass_at_k": [_mean(r["pass_at_k"][k] for r in records) for k in cfg.k_list],
                            "tokens": [k * per_trace(L) for k in cfg.k_list], "budget": [k * L for k in cfg.k_list],
                            "max_new_tokens": L}
    if "majority" in cfg.methods:
        L, ks = cfg.majority_max_new_tokens, cfg.k_list
        summary["majority"] = {
            "k": ks, "accuracy": [_mean(r["majority"][k]["accuracy"] for r in records) for k in ks],
            "ties": [sum(r["majority"][k]["ties"] for r in records) for k in ks],
            "votes": [sum(r["majority"][k]["votes"] for r in records) for k in ks],
            "tokens": [k * per_trace(L) for k in ks], "budget": [k * L for k in ks], "max_new_tokens": L}
    if "rsa" in cfg.methods:
        summary["rsa"] = rsa_curves(records, cfg)
    if "sequential" in cfg.methods:
        Ls = cfg.max_tokens_list
        summary["sequential"] = {
            "max_new_tokens": Ls, "pass_at_1": [_mean(r["sequential"][L]["pass_at_1"] for r in records) for L in Ls],
            "tokens": [per_trace(L) for L in Ls],
            "truncated": [_mean(r["sequential"][L]["truncated"] / n for r in records) for L in Ls], "budget": Ls}
    for curve in (summary.get(m) for m in ("passk", "majority", "sequential")):
        if curve:  # every trace of these is a search trace
            curve.update(search_tokens=list(curve["tokens"]), aggregation_tokens=[0.0] * len(curve["tokens"]))
    if "passk" in cfg.methods or "rsa" in cfg.methods:
        summary["sets"] = {}
    if "passk" in cfg.methods:
        distinct = [_mean(r["sets"]["search"]["distinct_answers"][k] for r in records) for k in cfg.k_list]
        summary["sets"]["search"] = {"k": cfg.k_list, "max_new_tokens": cfg.max_new_tokens,
                                     "coverage": list(summary["passk"]["pass_at_k"]), "distinct_answers": distinct}
    if "rsa" in cfg.methods:
        summary["sets"]["rsa"] = rsa_set_measures(records, cfg)
    return summary


def rsa_curves(records: list[dict], cfg) -> list[dict]:
    """One curve per population P: pass@1 after each step, and the tokens generated through it (cumulative)."""
    steps = list(range(1, cfg.rsa_steps + 1))
    return [{"population": P, "set_size": cfg.rsa_set_size, "step": steps, "max_new_tokens": cfg.max_new_tokens,
             "pass_at_1": [_mean(r["rsa"][P][t - 1]["pass_at_1"] for r in records) for t in steps],
             "tokens": [_mean(sum(s["tokens"] for s in r["rsa"][P][:t]) for r in records) for t in steps],
             "budget": [P * t * cfg.max_new_tokens for t in steps],
             "search_tokens": [_mean(r["rsa"][P][0]["tokens"] for r in records)] * len(steps),  # step 1
             "aggregation_tokens": [_mean(sum(s["tokens"] for s in r["rsa"][P][1:t]) for r in records)
                                    for t in steps]}
            for P in cfg.rsa_populations]


def rsa_set_measures(records: list[dict], cfg) -> list[dict]:
    """Per population P: testtime.set_measures of each step t >= 2 (its sets over step t-1), over all problems;
    each field a list over the steps."""
    curves = []
    for P in cfg.rsa_populations:
        per_step = [set_measures(functools.reduce(operator.add, (SetCounts(**r["sets"]["rsa"][P][t - 2])
                                                                 for r in records)))
                    for t in range(2, cfg.rsa_steps + 1)]
        fields = set_measures(SetCounts([0] * (cfg.rsa_set_size + 1), [0] * (cfg.rsa_set_size + 1), 0, 0, 0))
        curves.append({"population": P, "set_size": cfg.rsa_set_size, "step": list(range(2, cfg.rsa_steps + 1)),
                       **{f: [m[f] for m in per_step] for f in fields}})
    return curves


# ----------------------------------------------------------------------------------------------------------------------
# 2. Command line


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, then preset values for every flag left unset, then validation (UsageError on bad input)."""
    p = cli.OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=PRESETS, default="paper", help="defaults for every flag below (default paper)")
    p.add_argument("--policy", action="append", metavar="LABEL=PATH",
                   help="a policy to evaluate (repeat to compare): an adapter directory from train.py, applied to "
                        "--model or its own base, or a model (Hub id, directory, 'tiny'); default: base=--model")
    p.add_argument("--adapter", help="shorthand for --policy adapter=PATH")
    p.add_argument("--model", help=f"base model of the adapters: Hub id, local directory, or 'tiny' (paper: "
                                   f"{rollout.DEFAULT_MODEL}); default: each adapter's own base")
    p.add_argument("--dtype", choices=["auto", *rollout.DTYPES], default="auto",
                   help="auto: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--data", help="bundled name (math500, aime2024), a JSONL file, or a Hub dataset id")
    p.add_argument("--data-columns", help="columns of --data: problem=COL,answer=COL,id=COL (as train.py's)")
    p.add_argument("--reward", help="the task's reward r(x, y), MODULE:FUNCTION or PATH.py:FUNCTION (as train.py's); "
                                    "a trace counts as solved iff r = 1, and majority@k (math answers) is left out")
    p.add_argument("--limit", type=int, help="evaluate the first N problems only")
    p.add_argument("--method", choices=[*METHODS, "all"], default="all")
    p.add_argument("--out", default="runs/eval/results.json", help="result JSON (the PNG goes next to it)")
    p.add_argument("--cache-dir", help="generation cache (default: .cache next to --out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, help="search traces per problem (pass@k, majority@k, sequential)")
    p.add_argument("--k-list", type=_ints, help="k values for pass@k/majority@k (default 1,2,4,... and n)")
    p.add_argument("--max-new-tokens", type=int, help="trace length L for pass@k and RSA")
    p.add_argument("--majority-max-new-tokens", type=int, help="trace length for majority@k (paper: 16384)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--rsa-preset", choices=RSA_PRESETS, help="spiral: P=8, k=4; rsa-paper: P=16, k=4, T=10")
    p.add_argument("--rsa-populations", type=_ints, help="population sizes P to sweep, e.g. 4,8,16")
    p.add_argument("--rsa-set-size", type=int, help="k, members aggregated by each new trace")
    p.add_argument("--rsa-steps", type=int, help="T, steps including the first (search) step")
    p.add_argument("--max-tokens-list", type=_ints, help="budgets L for sequential scaling, e.g. 1024,2048,4096")
    p.add_argument("--majority-subsets", type=int, help="k-subsets averaged per majority@k value")
    p.add_argument("--tokens-per-call", type=int, default=2**21,
                   help="traces x max_new_tokens per rollout.generate call; the cache is written after each call")
    p.add_argument("--generation", choices=("auto",) + rollout.ENGINES, default="auto",
                   help="sampler: hf (transformers generate), fast (fastgen.py, Qwen3 only) or auto (fast on a GPU "
                   "where it applies, else hf)")
    p.add_argument("--max-prompt-tokens", type=int, default=4096,
                   help="drop problems whose search prompt is longer, with a line saying so (train.py: 1024)")
    p.add_argument("--micro-batch-size", type=int,
                   help="sequences per model.generate (default: rollout.generate picks by token count)")
    p.add_argument("--cross", action="append", metavar="SEARCH=AGGREGATOR",
                   help="cross-aggregation (repeatable): RSA over policy SEARCH's search traces with policy "
                        "AGGREGATOR's aggregation traces (steps >= 2), two --policy labels")
    p.add_argument("--probe-aggregators", action="store_true",
                   help="each policy's aggregator over candidate sets built from every policy's search traces: all "
                        "right, one right, none right, n copies of one wrong trace (instruments.py)")
    p.add_argument("--cross-all", nargs="?", const="", metavar="LABEL,LABEL,...",
                   help="--cross for every ordered pair of these policies, each with itself included (its own RSA); "
                        "no value: of every policy")
    cfg = p.parse_args(argv)

    explicit = {k for k, v in vars(cfg).items() if v is not None}
    defaults = {**PRESETS[cfg.preset], **(RSA_PRESETS[cfg.rsa_preset] if cfg.rsa_preset else {})}
    for name, value in defaults.items():
        if name not in explicit:
            setattr(cfg, name, value)
    cfg.model_explicit = "model" in explicit
    cfg.methods = list(METHODS) if cfg.method == "all" else [cfg.method]
    if cfg.reward is not None and "majority" in cfg.methods:  # votes need answers and their equivalence: math's
        if cfg.method == "majority":
            raise UsageError("--method majority with --reward: majority@k votes on \\boxed{} answers compared by "
                             "math-verify, which are the math task's; use passk, rsa or sequential")
        cfg.methods.remove("majority")  # said in run(), once the reward has passed its probe
    cli.validate_evaluation(cfg)
    cfg.cross_pairs = _cross_pairs(cfg)
    return cfg


def _cross_pairs(cfg) -> list[list[str]]:
    """[[search label, aggregator label]] of --cross and --cross-all, in command order, each pair once."""
    labels = [p["label"] for p in cfg.policies]
    pairs = []
    for spec in cfg.cross or []:
        search, sep, aggregator = spec.partition("=")
        if not (sep and search and aggregator):
            raise UsageError(f"--cross {spec}: expected SEARCH=AGGREGATOR, two --policy labels")
        pairs.append((f"--cross {spec}", [search, aggregator]))
    if cfg.cross_all is not None:
        chosen = cfg.cross_all.split(",") if cfg.cross_all else labels
        pairs += [(f"--cross-all {cfg.cross_all}", [a, b]) for a in chosen for b in chosen]
    for flag, pair in pairs:
        for label in pair:
            if label not in labels:
                raise UsageError(f"{flag}: no policy is labelled {label!r} (the policies: {', '.join(labels)})")
    if pairs and cfg.rsa_steps < 2:
        raise UsageError(f"{pairs[0][0]}: cross-aggregation needs --rsa-steps of at least 2 (got {cfg.rsa_steps})")
    if pairs and min(cfg.rsa_populations) < cfg.rsa_set_size:
        raise UsageError(f"{pairs[0][0]}: RSA population P={min(cfg.rsa_populations)} is smaller than the set size "
                         f"k={cfg.rsa_set_size}")
    return [list(pair) for pair in dict.fromkeys(tuple(pair) for _, pair in pairs)]


# ----------------------------------------------------------------------------------------------------------------------
# 3. Policies and main


def policy_identity(policy: dict, cfg, dtype, engine: str = "hf") -> dict:
    """What the cache keys traces by: model, adapter (hash of its files), seed, sampling settings, dtype and the
    engine that samples them. Everything but the model's path also seeds the sampling (run_generation)."""
    model, adapter = policy["model"], None
    if policy["adapter"]:  # the adapter's bytes, so a retrained adapter in the same directory is a new policy
        h = hashlib.sha256()
        for f in sorted(Path(policy["adapter"]).rglob("*")):
            if f.suffix == ".safetensors":
                data = f.read_bytes()
            elif f.name == ADAPTER_CONFIG:  # less where its base was: the same run in another checkout (or CI's
                config = read_adapter_config(str(f.parent))  # clone) must draw the same traces; "model" names the base
                config.pop("base_model_name_or_path", None)
                data = json.dumps(config, sort_keys=True).encode()
            else:
                continue
            h.update(str(f.relative_to(policy["adapter"])).encode() + data)
        adapter = h.hexdigest()
    return {"format": 3, "model": model, "adapter": adapter, "seed": cfg.seed, "temperature": cfg.temperature,
            "dtype": str(dtype).removeprefix("torch."),
            **({"generation": "fast"} if engine == "fast" else {})}  # hf: keys as before


def load_policies(cfg) -> dict[str, dict]:
    """{label: {model, tokenizer, search_adapter, aggregation_adapter}}: each base model is loaded once, cast to
    --dtype, and every adapter on it is a named LoRA adapter (lora.use_adapter switches; None is the base).

    An adapter directory with an aggregator/ sub-directory (train.py --separate-aggregator) holds two adapters:
    search traces use the top-level one (theta), RSA's aggregation traces the aggregator (phi).
    """
    bases, loaded = {}, {}
    for policy in cfg.policies:
        label, name = policy["label"], policy["model"]
        if name not in bases:
            try:
                model, tokenizer = rollout.load_policy(name, dtype=cfg.dtype)
            except Exception as e:  # unknown Hub id, missing directory, no network, not a model
                raise UsageError(f"cannot load the model {name} of policy {label}: {str(e).splitlines()[0]}") from None
            model = model.eval()
            engine = getattr(cfg, "generation", "hf")
            if engine == "fast" and rollout.fastgen.supports(model):
                raise UsageError(f"--generation fast: {rollout.fastgen.supports(model)}")
            # auto: per model (a Qwen3 on CUDA samples fast); the cache keys traces by the engine that drew them
            model.generation_engine = rollout.resolve_engine(engine, model)
            bases[name] = model, tokenizer, model.get_input_embeddings().weight.dtype
        model, tokenizer, dtype = bases[name]
        search = aggregation = lambda m=model: use_adapter(m, None)  # noqa: E731
        if policy["adapter"]:
            adapters = [(f"policy:{label}", policy["adapter"])]  # not a bare label: ModuleDict has .train
            aggregator_dir = Path(policy["adapter"]) / "aggregator"
            if (aggregator_dir / "adapter_config.json").is_file():
                adapters.append((f"aggregator:{label}", str(aggregator_dir)))
            for adapter_name, directory in adapters:
                try:  # LoRA weights stay fp32 masters (lora.py); its forward casts them to the input's dtype
                    load_adapter(model, directory, adapter_name)
                except Exception as e:  # wrong keys or shapes for this base, unsupported options
                    raise UsageError(f"policy {label}: cannot load the adapter {directory}: "
                                     f"{str(e).splitlines()[0][:300]}") from None
                if not all(bool(torch.isfinite(p).all()) for p in lora_parameters(model, adapter_name)):
                    raise UsageError(f"policy {label}: the adapter {directory} holds non-finite weights (a diverged "
                                     "run)")
            search = lambda m=model, a=adapters[0][0]: use_adapter(m, a)  # noqa: E731
            aggregation = lambda m=model, a=adapters[-1][0]: use_adapter(m, a)  # noqa: E731
        loaded[label] = {"model": model, "tokenizer": tokenizer, "search_adapter": search,
                         "aggregation_adapter": aggregation,
                         "identity": policy_identity(policy, cfg, dtype, model.generation_engine)}
    return loaded


def _graded_run(who: str, work):
    """work()'s records and the grader's statistics while it ran; sampling that met inf/nan is PolicyDiverged."""
    before = grader.grader_stats()
    try:
        records = work()
    except RuntimeError as e:  # torch.multinomial on inf/nan probabilities: NaN weights, a huge lora_alpha
        if not re.search(r"\binf\b|\bnan\b", str(e)):
            raise
        raise PolicyDiverged(f"{who}: sampling met non-finite probabilities (the model's logits overflow: a "
                             "diverged adapter, or a lora_alpha too large for its weights)") from None
    stats = {k: v - before[k] for k, v in grader.grader_stats().items()}
    if stats["ungraded"]:
        print(f"warning: {who}: {stats['ungraded']} answers scored 0 without a verdict ({stats['timeouts']} grader "
              "timeouts)", file=sys.stderr)
    return records, stats


def run(cfg) -> int:
    """Evaluate every policy on the same problems; write the JSON (atomically), print the tables, draw the PNG."""
    try:
        columns = problemset.Columns.parse(cfg.data_columns)
    except ValueError as e:
        raise UsageError(f"--data-columns {e}") from None
    try:
        problems = problemset.load_problems(cfg.data, columns, need_answer=cfg.reward is None)[: cfg.limit]
    except Exception as e:  # missing file, malformed line, unreachable Hub: one line, no traceback
        raise UsageError(f"cannot load --data {cfg.data}: {e}") from None
    if not problems:
        raise UsageError(f"--data {cfg.data} holds no problems")
    cfg.out, cfg.cache_dir = os.path.abspath(cfg.out), os.path.abspath(cfg.cache_dir)  # a reward's chdir moves none
    reward_fn = cli.task_reward(cfg.reward, problems)  # --reward: imported and probed on one problem now
    if reward_fn is not None and cfg.method == "all":
        print("evaluate.py: --reward: majority@k left out (it votes on \\boxed{} answers compared by math-verify, "
              "which are the math task's)", file=sys.stderr)
    for model in dict.fromkeys(p["model"] for p in cfg.policies):
        try:  # as train.py: an unreachable or unknown Hub id fails in seconds, not after ~50 s of retries
            rollout.check_model(model)
        except ValueError as e:
            raise UsageError(f"model {model}: {e}") from None
    checkpoint.lock_file(f"{cfg.out}.lock")  # one writer per result: a second evaluate.py on --out stops here
    policies = load_policies(cfg)  # all of them first: a bad adapter fails before anything is generated
    problems = cli.short_enough(problems, policies.values(), cfg.max_prompt_tokens)
    if not torch.cuda.is_available() and any(sum(p.numel() for p in pol["model"].parameters()) > 10**8
                                             for pol in policies.values()):
        print("warning: no GPU; a full-size model will be very slow on a CPU (--preset tiny runs in seconds)",
              file=sys.stderr)
    cache, results, samplers = TraceCache(cfg.cache_dir), {}, {}
    for label, pol in policies.items():
        samplers[label] = Sampler(pol["model"], pol["tokenizer"], cache, pol["identity"],
                                  tokens_per_call=cfg.tokens_per_call, micro_batch_size=cfg.micro_batch_size,
                                  search_adapter=pol["search_adapter"], aggregation_adapter=pol["aggregation_adapter"],
                                  label=f"policy {label} ({len(samplers) + 1} of {len(policies)})")
        records, stats = _graded_run(f"policy {label}",
                                     lambda: evaluate_policy(problems, samplers[label], cfg, reward_fn))
        if reward_fn is not None:  # pass@k and pass@1 count a trace as solved only at r = 1: say so if r was not 0/1
            task.warn_if_not_binary(_rewards(records), f"policy {label}")
        results[label] = {"policy": pol["identity"], "summary": summarize(records, cfg), "grader": stats,
                          "problems": records}
    cross = []
    for i, (search, aggregator) in enumerate(cfg.cross_pairs):
        sampler = copy.copy(samplers[aggregator])  # B's model and adapters, named as the pair in progress lines
        sampler.label = f"cross {search} -> {aggregator} ({i + 1} of {len(cfg.cross_pairs)}): "
        records, stats = _graded_run(f"cross {search} -> {aggregator}", lambda: cross_aggregate(
            problems, samplers[search], sampler, cfg, reward_fn))
        cross.append({"search": search, "aggregator": aggregator, "grader": stats,
                      "summary": {"rsa": rsa_curves(records, cfg), "sets": {"rsa": rsa_set_measures(records, cfg)}},
                      "problems": records})

    if cfg.probe_aggregators:  # the pools are read back from the cache: nothing new is sampled for them
        pools = {label: samplers[label].search([p.problem for p in problems], cfg.num_samples, cfg.max_new_tokens)
                 for label in samplers}
        probe = instruments.probe_aggregators(problems, pools, samplers, lambda traces, x: _graded(
            traces, x, reward_fn), cfg.rsa_set_size, cfg.max_new_tokens)
        for label, measured in probe.items():
            results[label]["summary"]["probe"] = measured
    out = Path(cfg.out)
    config = {k: v for k, v in vars(cfg).items() if k not in ("model_explicit", "policy", "adapter", "cross",
                                                              "cross_all")}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    device = next(next(iter(policies.values()))["model"].parameters()).device
    tmp.write_text(json.dumps({"written_by": "evaluate.py", "config": config, "versions": versions(device),
                               "policies": results, "cross": cross}, indent=1))
    os.replace(tmp, out)
    summaries = {label: r["summary"] for label, r in results.items()}
    print(figures.evaluation_table(summaries))
    print(figures.set_table(summaries))
    print(figures.cross_table(cross))
    print(f"\n{len(problems)} problems, {len(results)} policies, {len(cross)} cross pairs; traces generated: "
          f"{cache.generated}, read from the cache {cache.root}: {cache.reused}; wrote {out}")
    figures.plot_evaluation(summaries, out.with_suffix(".png"), title=f"{cfg.data}, {len(problems)} problems")
    return 0


def main(argv=None) -> int:
    cfg = None
    quiet_libraries()
    try:
        cfg = parse_args(argv)
        return run(cfg)
    except (UsageError, checkpoint.CheckpointError) as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        return 2
    except PolicyDiverged as e:
        print(f"evaluate.py: error: {e}; nothing was written to --out", file=sys.stderr)
        return 1
    except task.RewardError as e:  # the task's reward failed on a trace: the generated traces stay cached
        print(f"evaluate.py: error: {e}; nothing was written to --out (the traces are cached: rerun once it is "
              "fixed)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        where = f"; the traces generated so far are cached in {cfg.cache_dir}: rerun to continue" if cfg else ""
        print(f"evaluate.py: interrupted{where}", file=sys.stderr)
        return 130
    finally:
        if cfg is not None:
            checkpoint.unlock_file(f"{cfg.out}.lock")


if __name__ == "__main__":
    sys.exit(main())
