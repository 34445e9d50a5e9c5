"""Test-time compute evaluations of the SPIRAL paper (Section 4, "Experiments").

The paper's claims are about how each model turns inference compute into accuracy. This script measures
that for a base model plus an optional LoRA adapter saved by train.py, with four methods:

    passk       pass@k, the unbiased estimator of Chen et al. (2021)       figure "Pass@k evaluation on test sets"
    majority    majority@k (self-consistency) over k search traces          figure "Comparison of inference methods
                                                                                    scaling parallel traces"
    rsa         recursive self-aggregation (Venkatraman et al., 2025)       figure "Pass@1 evaluation under RSA"
    sequential  pass@1 as max_new_tokens grows                              figure "... scaling sequential compute"

Every method records the tokens it generated per problem, and the budget it was allowed (traces x
max_new_tokens, the x-axis of the figure "Comparison of inference compute scaling ... against token usage").

Choices where the paper is silent, or where this code departs from it:
 1. One pool of search traces per problem. pass@k, majority@k, RSA step 1 and sequential scaling at
    L = --max-new-tokens all read the same cached samples of the Search Trace Prompt. They are draws from
    the same distribution, so each estimate is unbiased; the methods' estimates become correlated, which
    makes comparisons between them less noisy, and the shared traces are generated once.
 2. majority@k with n > k samples averages over k-subsets of the n samples: all of them when there are at
    most --majority-subsets, else that many uniformly random ones. A single "first k" draw has the same
    expectation and more variance.
 3. majority@k groups answers by math-verify equivalence (\\frac{1}{2}, 0.5 and 1/2 are one answer), greedily:
    an answer joins the first group whose first member it is equivalent to (math-verify's equivalence is
    not guaranteed transitive). A trace without a \\boxed{} answer casts no vote; a subset without any vote
    counts as wrong. Ties are broken uniformly at random with a seeded generator and counted. The group is
    graded by its first member's reward.
 4. RSA sets: the paper says it "partition[s] the traces from the previous level into groups", yet keeps a
    population of 8 with sets of 4, which a partition cannot do (it gives 2 groups). We follow the RSA paper:
    each of the P new members independently draws k distinct members of the previous population, so
    different members may see overlapping or identical sets.
 5. Sampling is plain temperature sampling (1.0, top-k/top-p off), as in training; the paper does not state
    its evaluation sampler.
 6. Sequential scaling samples fresh traces at every budget L (a trace cut at L tokens would be an equally
    valid sample; we keep the obvious reading of the figure).
 7. Generations are cached on disk (see TraceCache), keyed by everything that determines them. Torch's RNG
    is seeded per (key, first sample index) before every generate call, so adding k values, RSA steps or
    budgets generates only what is missing. Samples 8..15 drawn after 0..7 differ from samples 8..15 of a
    cold run of 16 (both are valid i.i.d. draws); GPU kernels and batch shapes can change bits anyway.
 8. Token budgets count every trace generated: RSA through step t costs P * t * max_new_tokens. The paper
    quotes a 36k minimum for RSA with P=8, k=4 and at least one step, which this accounting does not give
    (8 x 4096 = 32,768 at step 1, 16 x 4096 = 65,536 through step 2; 9 x 4096 = 36,864 would be 8 search
    traces plus a single aggregation). Its majority voting used at least 4 traces of up to 16k tokens.

Run:
    python evaluate.py --preset tiny                                      # seconds on a CPU
    python evaluate.py --adapter runs/paper-spiral/adapter --data math500 # the paper's settings, one GPU
    python evaluate.py --method rsa --rsa-preset rsa-paper --data aime2024 --out runs/eval/rsa.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import figures
import rollout
import tiny
from lora import load_adapter, resolve_base_path, use_adapter
from reward import answers_equivalent, extract_answer, reward

METHODS = ("passk", "majority", "rsa", "sequential")

# The two presets. Values the paper states are marked; the rest are our choices (one GPU, HF generate).
PRESETS = {
    "paper": dict(
        model=rollout.DEFAULT_MODEL,  # paper: Qwen3-4B-Instruct-2507
        data="math500", limit=None,
        num_samples=16, max_new_tokens=4096,  # 4096: the paper's training length (majority used up to 16384)
        temperature=1.0,
        rsa_population=8, rsa_set_size=4, rsa_steps=5,  # paper: P=8, k=4 (steps: the figure's range is not stated)
        max_tokens_list=[1024, 2048, 4096, 8192, 16384, 32768],  # paper: sequential scaling up to 32k tokens
        majority_subsets=32, micro_batch_size=None,
    ),
    "tiny": dict(  # seconds on a CPU: the tiny preset's warm-started base (train.warm_start_tiny) on its sums task
        model=tiny.WARM_START_DIR, data="tiny_sums", limit=20,
        num_samples=8, max_new_tokens=12, temperature=1.0,  # a tiny-task trace is 8 tokens ("3 + 5 = \\boxed{8}")
        rsa_population=8, rsa_set_size=4, rsa_steps=3,
        max_tokens_list=[4, 8, 12],
        majority_subsets=32, micro_batch_size=None,
    ),
}

RSA_PRESETS = {
    "spiral": dict(rsa_population=8, rsa_set_size=4),  # the SPIRAL paper's RSA figure
    "rsa-paper": dict(rsa_population=16, rsa_set_size=4, rsa_steps=10),  # Venkatraman et al. (2025) defaults
}


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2, before any model is loaded."""


def _digest(obj) -> str:
    """A stable hex digest of any JSON-able object (Python's hash() changes between processes)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def derive_seed(*parts) -> int:
    """A 63-bit seed determined by `parts`, so that each (problem, stage, step) has its own random stream."""
    return int(_digest(parts)[:16], 16) & (2**63 - 1)


# ----------------------------------------------------------------------------------------------------------------------
# 1. The estimators (pure functions)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k (paper figure "Pass@k evaluation"; Chen et al. 2021, eq. 1): 1 - C(n-c, k) / C(n, k).

    The probability that k of the n samples, drawn without replacement, contain a correct one. Computed as
    1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials (n in the thousands is fine).
    """
    n, c = num_samples, num_correct
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= num_correct <= num_samples, got num_correct={c}, num_samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= num_samples, got k={k}, num_samples={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def cluster_answers(answers: list[str | None], equivalent=None) -> list[int | None]:
    """Group id per answer by math-verify equivalence (None stays None: no answer, no vote). See note 3."""
    equivalent = equivalent or answers_equivalent
    representatives: list[str] = []  # first member of each group
    group_of: dict[str, int] = {}  # exact strings seen before (saves math-verify calls)
    ids: list[int | None] = []
    for answer in answers:
        if answer is not None and answer not in group_of:
            match = (g for g, rep in enumerate(representatives) if equivalent(rep, answer))
            group_of[answer] = next(match, len(representatives))
            if group_of[answer] == len(representatives):
                representatives.append(answer)
        ids.append(None if answer is None else group_of[answer])
    return ids


def majority_vote(group_ids: list[int | None], rng: np.random.Generator) -> tuple[int | None, bool]:
    """(winning group, whether a tie was broken at random); (None, False) when nobody voted."""
    votes = Counter(g for g in group_ids if g is not None)
    if not votes:
        return None, False
    top = max(votes.values())
    leaders = sorted(g for g, v in votes.items() if v == top)
    return int(rng.choice(leaders)), len(leaders) > 1


def majority_at_k(answers, correct, ks, *, rng, equivalent=None, num_subsets=32) -> dict[int, dict]:
    """majority@k (paper figure "Comparison of inference methods scaling parallel traces"), for each k in ks.

    answers[i] is sample i's extracted answer (or None), correct[i] its reward. Returns, per k, the accuracy
    of the majority answer averaged over k-subsets (note 2), the number of subsets voted on, and how many of
    those votes were ties broken at random.
    """
    n = len(answers)
    group_ids = cluster_answers(answers, equivalent)
    group_correct: dict[int, bool] = {}
    for g, ok in zip(group_ids, correct):
        if g is not None:
            group_correct.setdefault(g, bool(ok))  # a group is graded by its first member
    results = {}
    for k in ks:
        if not 1 <= k <= n:
            raise ValueError(f"need 1 <= k <= number of samples, got k={k}, samples={n}")
        if math.comb(n, k) <= num_subsets:
            subsets_S_k = list(itertools.combinations(range(n), k))
        else:
            subsets_S_k = [rng.choice(n, size=k, replace=False) for _ in range(num_subsets)]
        hits = ties = 0
        for subset in subsets_S_k:
            winner, tied = majority_vote([group_ids[i] for i in subset], rng)
            hits += winner is not None and group_correct[winner]
            ties += tied
        results[k] = {"accuracy": hits / len(subsets_S_k), "votes": len(subsets_S_k), "ties": ties}
    return results


# ----------------------------------------------------------------------------------------------------------------------
# 2. Generation with an on-disk cache


@dataclass
class Trace:
    """What evaluation keeps of a rollout.Completion."""

    text: str
    num_tokens: int  # completion tokens generated, including the EOS
    prompt_tokens: int
    truncated: bool


class TraceCache:
    """Generations on disk: one JSON file per key, holding a list of traces that only ever grows.

    get(key, count, make) returns the first `count` traces, calling make(start, count) for the missing
    ones. The key holds everything that determines a trace (model, adapter, seed, temperature, stage,
    prompt hash, max_new_tokens, ...). root=None keeps nothing.
    """

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root is not None else None
        self.generated = 0  # traces generated by this object
        self.reused = 0  # traces it read from disk

    def get(self, key: dict, count: int, make) -> list[Trace]:
        path = self.root / f"{_digest(key)[:32]}.json" if self.root else None
        traces = []
        if path is not None and path.exists():
            traces = [Trace(**t) for t in json.loads(path.read_text())["traces"]]
        self.reused += min(len(traces), count)
        if len(traces) < count:
            new = make(len(traces), count)
            traces += new
            self.generated += len(new)
            if path is not None:  # write-then-rename: an interrupted run never leaves a broken file
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps({"key": key, "traces": [asdict(t) for t in traces]}))
                os.replace(tmp, path)
        return traces[:count]


class Sampler:
    """Samples traces from one policy through the cache; `identity` names the policy and sampling settings."""

    def __init__(self, model, tokenizer, cache: TraceCache, identity: dict, micro_batch_size: int | None = None,
                 aggregation_adapter=None):
        self.model, self.tokenizer, self.cache = model, tokenizer, cache
        self.identity, self.micro_batch_size = identity, micro_batch_size
        # Two-model variant (train.py --separate-aggregator): aggregation traces come from adapter phi.
        self.aggregation_adapter = aggregation_adapter or contextlib.nullcontext

    def _generate(self, key, prompts, samples_per_prompt, max_new_tokens, start) -> list[Trace]:
        torch.manual_seed(derive_seed(key, start))  # also seeds CUDA: the same key and start give the same traces
        completions = rollout.generate(
            self.model, self.tokenizer, prompts, samples_per_prompt=samples_per_prompt,
            max_new_tokens=max_new_tokens, temperature=self.identity["temperature"],
            micro_batch_size=self.micro_batch_size,
        )
        return [Trace(c.text, len(c.completion_ids), len(c.prompt_ids), c.truncated)
                for row in completions for c in row]

    def search(self, problem: str, count: int, max_new_tokens: int) -> list[Trace]:
        """Traces 0..count-1 from the Search Trace Prompt (shared by every method, note 1)."""
        prompt = rollout.search_prompt(problem)
        key = {**self.identity, "stage": "search", "prompt": _digest(prompt), "max_new_tokens": max_new_tokens}
        return self.cache.get(key, count, lambda start, stop: self._generate(key, [prompt], stop - start,
                                                                             max_new_tokens, start))

    def aggregate(self, step: int, prompts: list[str], max_new_tokens: int) -> list[Trace]:
        """One trace per aggregation prompt (one RSA step). The key hashes the prompts: it covers the history."""
        key = {**self.identity, "stage": f"rsa-step{step}", "prompts": _digest(prompts),
               "max_new_tokens": max_new_tokens}
        with self.aggregation_adapter():
            return self.cache.get(key, len(prompts), lambda start, stop: self._generate(key, prompts[start:stop], 1,
                                                                                        max_new_tokens, start))


# ----------------------------------------------------------------------------------------------------------------------
# 3. Recursive self-aggregation


def draw_rsa_sets(population: int, set_size: int, rng: np.random.Generator) -> np.ndarray:
    """RSA's subsampling (note 4): row j lists the k distinct members of the previous population that new
    member j aggregates. Rows are drawn independently. Returns int array sets_P_k of shape (P, k)."""
    if not 1 <= set_size <= population:
        raise ValueError(f"need 1 <= set_size <= population, got set_size={set_size}, population={population}")
    return np.stack([rng.choice(population, size=set_size, replace=False) for _ in range(population)])


@dataclass
class RSAStep:
    step: int  # 1 = independent search traces
    sets_P_k: list[list[int]] | None  # row j: indices into step t-1's population that trace j aggregated
    traces: list[Trace]  # the P members of this step's population


def recursive_self_aggregation(problem: str, *, population: int, set_size: int, steps: int, seed: int,
                               search, aggregate) -> list[RSAStep]:
    """Recursive self-aggregation (paper figure "Pass@1 evaluation under RSA"; Venkatraman et al. 2025).

    Step 1: P independent search traces, search(P). Step t > 1: P new traces, aggregate(t, prompts), each from
    the Aggregation Trace Prompt over k members of step t-1. Set draws are seeded per (problem, step), so
    a longer run repeats the shorter run's steps exactly (and finds them in the cache).
    """
    history = [RSAStep(1, None, search(population))]
    for t in range(2, steps + 1):
        rng = np.random.default_rng(derive_seed("rsa-sets", seed, problem, population, set_size, t))
        sets_P_k = draw_rsa_sets(population, set_size, rng)
        previous = history[-1].traces
        prompts = [rollout.aggregation_prompt(problem, [previous[i].text for i in row]) for row in sets_P_k]
        history.append(RSAStep(t, sets_P_k.tolist(), aggregate(t, prompts)))
    return history


# ----------------------------------------------------------------------------------------------------------------------
# 4. One problem, every requested method


def _graded(traces: list[Trace], gold: str) -> list[dict]:
    return [{"answer": extract_answer(t.text), "correct": reward(t.text, gold) == 1.0,
             "tokens": t.num_tokens, "truncated": t.truncated} for t in traces]


def evaluate_problem(problem, sampler: Sampler, cfg) -> dict:
    """Raw per-problem results of every method in cfg.methods (token counts included)."""
    record = {"id": problem.id, "problem": problem.problem, "answer": problem.answer}
    if {"passk", "majority"} & set(cfg.methods):
        samples = _graded(sampler.search(problem.problem, cfg.num_samples, cfg.max_new_tokens), problem.answer)
        correct = [s["correct"] for s in samples]
        record["samples"] = samples
        record["tokens"] = sum(s["tokens"] for s in samples)
        if "passk" in cfg.methods:
            record["pass_at_k"] = {k: pass_at_k(len(samples), sum(correct), k) for k in cfg.k_list}
        if "majority" in cfg.methods:
            rng = np.random.default_rng(derive_seed("majority", cfg.seed, problem.problem))
            record["majority"] = majority_at_k([s["answer"] for s in samples], correct, cfg.k_list, rng=rng,
                                               num_subsets=cfg.majority_subsets)
    if "rsa" in cfg.methods:
        history = recursive_self_aggregation(
            problem.problem, population=cfg.rsa_population, set_size=cfg.rsa_set_size, steps=cfg.rsa_steps,
            seed=cfg.seed, search=lambda count: sampler.search(problem.problem, count, cfg.max_new_tokens),
            aggregate=lambda t, prompts: sampler.aggregate(t, prompts, cfg.max_new_tokens))
        record["rsa"] = []
        for step in history:
            graded = _graded(step.traces, problem.answer)
            record["rsa"].append({
                "step": step.step, "sets": step.sets_P_k, "pass_at_1": float(np.mean([g["correct"] for g in graded])),
                "tokens": sum(g["tokens"] for g in graded),
                "prompt_tokens": sum(t.prompt_tokens for t in step.traces), "samples": graded})
    if "sequential" in cfg.methods:
        record["sequential"] = {}
        for budget in cfg.max_tokens_list:
            graded = _graded(sampler.search(problem.problem, cfg.num_samples, budget), problem.answer)
            record["sequential"][budget] = {
                "pass_at_1": float(np.mean([g["correct"] for g in graded])),
                "tokens": sum(g["tokens"] for g in graded), "truncated": sum(g["truncated"] for g in graded),
                "samples": graded}
    return record


def summarize(records: list[dict], cfg) -> dict:
    """Means over problems. tokens = generated per problem; budget = traces x max_new_tokens per problem."""
    mean = lambda xs: float(np.mean(list(xs)))  # noqa: E731
    summary = {}
    if "samples" in records[0]:
        per_trace = mean(r["tokens"] / cfg.num_samples for r in records)
        tokens = [k * per_trace for k in cfg.k_list]
        budget = [k * cfg.max_new_tokens for k in cfg.k_list]
    if "passk" in cfg.methods:
        summary["passk"] = {"k": cfg.k_list, "pass_at_k": [mean(r["pass_at_k"][k] for r in records)
                                                           for k in cfg.k_list], "tokens": tokens, "budget": budget}
    if "majority" in cfg.methods:
        summary["majority"] = {
            "k": cfg.k_list, "accuracy": [mean(r["majority"][k]["accuracy"] for r in records) for k in cfg.k_list],
            "ties": [sum(r["majority"][k]["ties"] for r in records) for k in cfg.k_list],
            "votes": [sum(r["majority"][k]["votes"] for r in records) for k in cfg.k_list],
            "tokens": tokens, "budget": budget}
    if "rsa" in cfg.methods:
        steps = list(range(1, cfg.rsa_steps + 1))
        summary["rsa"] = {
            "step": steps, "population": cfg.rsa_population, "set_size": cfg.rsa_set_size,
            "pass_at_1": [mean(r["rsa"][t - 1]["pass_at_1"] for r in records) for t in steps],
            "tokens": [mean(sum(s["tokens"] for s in r["rsa"][:t]) for r in records) for t in steps],  # cumulative
            "budget": [cfg.rsa_population * t * cfg.max_new_tokens for t in steps]}
    if "sequential" in cfg.methods:
        budgets = cfg.max_tokens_list
        summary["sequential"] = {
            "max_new_tokens": budgets,
            "pass_at_1": [mean(r["sequential"][b]["pass_at_1"] for r in records) for b in budgets],
            "tokens": [mean(r["sequential"][b]["tokens"] / cfg.num_samples for r in records) for b in budgets],
            "truncated": [mean(r["sequential"][b]["truncated"] / cfg.num_samples for r in records) for b in budgets],
            "budget": budgets}
    return summary


# ----------------------------------------------------------------------------------------------------------------------
# 5. Reporting


def format_table(summary: dict) -> str:
    """The summary as plain-text tables, one per method."""
    columns = {"passk": ("k", "pass_at_k"), "majority": ("k", "accuracy", "ties"),
               "rsa": ("step", "pass_at_1"), "sequential": ("max_new_tokens", "pass_at_1", "truncated")}
    lines = []
    for method, cols in columns.items():
        if method not in summary:
            continue
        s = summary[method]
        header = [*cols, "tokens/problem", "budget/problem"]
        lines += [f"\n{method}", "  ".join(f"{h:>14}" for h in header)]
        for row in zip(*(s[c] for c in cols), s["tokens"], s["budget"]):
            lines.append("  ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v:>14}" for v in row))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------------
# 6. Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse would print the usage too)
        raise UsageError(message)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, then preset values for every flag left unset, then validation (UsageError on bad input)."""
    p = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=PRESETS, default="paper", help="defaults for every flag below (default paper)")
    p.add_argument("--model", help=f"Hub id, local directory, or 'tiny' (paper: {rollout.DEFAULT_MODEL}); "
                                   "with --adapter, defaults to the adapter's base model")
    p.add_argument("--adapter", help="LoRA adapter directory written by train.py (adapter_config.json + weights)")
    p.add_argument("--data", help="bundled name (math500, aime2024), a JSONL file, or a Hub dataset id")
    p.add_argument("--limit", type=int, help="evaluate the first N problems only")
    p.add_argument("--method", choices=[*METHODS, "all"], default="all")
    p.add_argument("--out", default="runs/eval/results.json", help="result JSON (the PNG goes next to it)")
    p.add_argument("--cache-dir", help="generation cache (default: .cache next to --out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, help="search traces per problem (pass@k, majority@k, sequential)")
    p.add_argument("--k-list", type=_ints, help="k values for pass@k/majority@k (default 1,2,4,... and n)")
    p.add_argument("--max-new-tokens", type=int, help="per-trace limit for pass@k, majority@k and RSA")
    p.add_argument("--temperature", type=float)
    p.add_argument("--rsa-preset", choices=RSA_PRESETS, help="spiral: P=8, k=4; rsa-paper: P=16, k=4, T=10")
    p.add_argument("--rsa-population", type=int, help="P, traces per RSA step")
    p.add_argument("--rsa-set-size", type=int, help="k, members aggregated by each new trace")
    p.add_argument("--rsa-steps", type=int, help="T, steps including the first (search) step")
    p.add_argument("--max-tokens-list", type=_ints, help="budgets for sequential scaling, e.g. 1024,2048,4096")
    p.add_argument("--majority-subsets", type=int, help="k-subsets averaged per majority@k value")
    p.add_argument("--micro-batch-size", type=int,
                   help="sequences per generate call (default: rollout.generate picks by token count)")
    cfg = p.parse_args(argv)

    explicit = {k for k, v in vars(cfg).items() if v is not None}
    defaults = {**PRESETS[cfg.preset], **(RSA_PRESETS[cfg.rsa_preset] if cfg.rsa_preset else {})}
    for name, value in defaults.items():
        if name not in explicit:
            setattr(cfg, name, value)
    cfg.model_explicit = "model" in explicit
    cfg.methods = list(METHODS) if cfg.method == "all" else [cfg.method]
    _validate(cfg)
    return cfg


def _validate(cfg) -> None:
    positive = ["num_samples", "max_new_tokens", "rsa_population", "rsa_set_size", "rsa_steps",
                "majority_subsets", "limit", "micro_batch_size"]
    for name in positive:
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if cfg.k_list is None:  # 1, 2, 4, ... and the number of samples itself
        cfg.k_list = sorted({2**i for i in range(cfg.num_samples.bit_length())} | {cfg.num_samples})
    for name in ["k_list", "max_tokens_list"]:
        if min(getattr(cfg, name)) < 1:
            raise UsageError(f"--{name.replace('_', '-')} values must be positive, got {getattr(cfg, name)}")
    if not cfg.temperature > 0:
        raise UsageError(f"--temperature must be positive, got {cfg.temperature}")
    if {"passk", "majority"} & set(cfg.methods) and max(cfg.k_list) > cfg.num_samples:
        raise UsageError(f"k={max(cfg.k_list)} in --k-list is larger than the {cfg.num_samples} samples drawn "
                         f"(--num-samples)")
    if "rsa" in cfg.methods and cfg.rsa_population < cfg.rsa_set_size:
        raise UsageError(f"RSA population P={cfg.rsa_population} is smaller than the set size k={cfg.rsa_set_size}")
    if cfg.adapter is not None:
        if not (Path(cfg.adapter) / "adapter_config.json").is_file():
            raise UsageError(f"--adapter {cfg.adapter}: no adapter_config.json there (expected train.py's adapter dir)")
        base = resolve_base_path(cfg.adapter)  # train.py stores a base inside the run directory as "../base"
        if not cfg.model_explicit and base:
            cfg.model = base
        elif base and base != cfg.model:
            print(f"warning: adapter was trained on {base}, evaluating it on {cfg.model}", file=sys.stderr)


def policy_identity(cfg) -> dict:
    """What the cache keys traces by: model, adapter (hash of its files), seed and sampling settings."""
    model = str(Path(cfg.model).resolve()) if Path(cfg.model).exists() else cfg.model
    adapter = None
    if cfg.adapter:  # the adapter's bytes, so a retrained adapter in the same directory is a new policy
        h = hashlib.sha256()
        for f in sorted(Path(cfg.adapter).rglob("*")):
            if f.name == "adapter_config.json" or f.suffix == ".safetensors":
                h.update(str(f.relative_to(cfg.adapter)).encode() + f.read_bytes())
        adapter = h.hexdigest()
    return {"format": 1, "model": model, "adapter": adapter, "seed": cfg.seed, "temperature": cfg.temperature}


def load_model(cfg):
    """(model, tokenizer, aggregation_adapter): rollout.load_policy(cfg.model) plus train.py's LoRA adapter.

    An adapter directory with an aggregator/ sub-directory (train.py --separate-aggregator) holds two adapters:
    search traces are sampled with the top-level one (theta), RSA's aggregation traces with the aggregator (phi).
    """
    model, tokenizer = rollout.load_policy(cfg.model)
    aggregation_adapter = None
    if cfg.adapter:
        load_adapter(model, cfg.adapter)
        if (Path(cfg.adapter) / "aggregator" / "adapter_config.json").is_file():
            load_adapter(model, str(Path(cfg.adapter) / "aggregator"), "aggregator")
            aggregation_adapter = lambda: use_adapter(model, "aggregator")  # noqa: E731
    return model.eval(), tokenizer, aggregation_adapter


def main(argv=None) -> int:
    try:
        cfg = parse_args(argv)
        try:
            problems = rollout.load_problems(cfg.data)[: cfg.limit]
        except Exception as e:  # missing file, malformed line, unreachable Hub: one line, no traceback
            raise UsageError(f"cannot load --data {cfg.data}: {e}") from None
        if not problems:
            raise UsageError(f"--data {cfg.data} holds no problems")
    except UsageError as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        return 2

    from tqdm import tqdm

    out = Path(cfg.out)
    cfg.cache_dir = str(cfg.cache_dir or out.parent / ".cache")
    cache = TraceCache(cfg.cache_dir)
    try:
        model, tokenizer, aggregation_adapter = load_model(cfg)
    except OSError as e:  # unknown Hub id, missing directory, no network
        print(f"evaluate.py: error: cannot load --model {cfg.model}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and sum(p.numel() for p in model.parameters()) > 10**8:
        print(f"warning: no GPU; {cfg.model} will be very slow on a CPU (--preset tiny runs in seconds)",
              file=sys.stderr)
    sampler = Sampler(model, tokenizer, cache, policy_identity(cfg), cfg.micro_batch_size, aggregation_adapter)
    records = [evaluate_problem(problem, sampler, cfg) for problem in tqdm(problems, desc="problems", disable=None)]
    summary = summarize(records, cfg)

    config = {k: v for k, v in vars(cfg).items() if k not in ("model_explicit",)}
    config["policy"] = sampler.identity
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": config, "summary": summary, "problems": records}, indent=1))
    print(format_table(summary))
    print(f"\n{len(problems)} problems; traces generated: {cache.generated}, read from the cache {cache.root} "
          f"(methods share search traces): {cache.reused}; wrote {out}")
    figures.plot_evaluation(summary, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
