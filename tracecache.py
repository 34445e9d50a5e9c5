"""evaluate.py's generation: an on-disk cache of traces, and a sampler that batches every problem of a stage.

A stage (one search pool, one RSA step) of all problems goes to rollout.generate in calls of at most
tokens_per_call traces x max_new_tokens, each seeded from its content, and every call's traces are written to the
cache before the next call starts: the same request twice generates nothing the second time, and a request
interrupted part-way repeats only the calls it had not written (evaluate.py, note 4).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import figures
import rollout
from testtime import derive_seed, digest


@dataclass
class Trace:
    """What evaluation keeps of a rollout.Completion."""

    text: str
    num_tokens: int  # completion tokens generated, including the EOS
    prompt_tokens: int
    truncated: bool


class TraceCache:
    """Generations on disk: one JSON file per key, a list of traces that only ever grows.

    A key holds everything that determines its traces (policy, seed, temperature, dtype, stage, prompt hash,
    max_new_tokens). An unreadable file is named in a warning and its traces are generated again.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.generated = 0  # traces generated through this object
        self.reused = 0  # traces read from disk
        self.corrupted: set[Path] = set()  # files found unreadable: their traces are drawn again as first drawn

    def path(self, key: dict) -> Path:
        return self.root / f"{digest(key)[:32]}.json"

    def read(self, key: dict) -> list[Trace]:
        path = self.path(key)
        if not path.exists():
            return []
        try:
            stored = json.loads(path.read_text())
            if stored["key"] != key:
                raise ValueError("it holds another key")
            return [Trace(**t) for t in stored["traces"]]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            print(f"warning: corrupted cache file {path} ({type(e).__name__}: {str(e)[:80]}); generating its traces "
                  "again", file=sys.stderr)
            self.corrupted.add(path)
            return []

    def write(self, key: dict, traces: list[Trace]) -> None:
        path, tmp = self.path(key), self.path(key).with_suffix(f".tmp{os.getpid()}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "traces": [asdict(t) for t in traces]}))
        os.replace(tmp, path)  # write-then-rename: an interrupted run never leaves a torn file


def seed_of(key: dict) -> str:
    """The digest a job's sampling is seeded from: its cache key without the models' names. Why: a local model's
    absolute path would make the samples depend on where the checkout lives (the same command gave other results in
    another directory)."""
    return digest({k: v for k, v in key.items() if k not in ("model", "search_model")})


def plan_calls(sizes: list[int], per_call: int) -> list[list[int]]:
    """Consecutive job indices packed into calls of at most `per_call` traces (a bigger job gets a call alone)."""
    calls, current, used = [], [], 0
    for j, size in enumerate(sizes):
        if current and used + size > per_call:
            calls.append(current)
            current, used = [], 0
        current.append(j)
        used += size
    return calls + [current] if current else calls


class Sampler:
    """Samples one policy's traces for many problems at once, through the cache (note 4)."""

    def __init__(self, model, tokenizer, cache: TraceCache, identity: dict, *, tokens_per_call: int,
                 micro_batch_size: int | None = None, search_adapter=None, aggregation_adapter=None, label=""):
        self.model, self.tokenizer, self.cache, self.identity = model, tokenizer, cache, identity
        self.label = f"{label}: " if label else ""  # named in the progress lines
        self.tokens_per_call, self.micro_batch_size = tokens_per_call, micro_batch_size
        self.search_adapter = search_adapter or contextlib.nullcontext  # which LoRA adapter is active (None: base)
        self.aggregation_adapter = aggregation_adapter or self.search_adapter  # two-model variant: phi != theta
        self.calls = 0  # rollout.generate calls made

    def _fill(self, jobs: list[tuple[dict, list[str]]], max_new_tokens: int, desc: str) -> list[list[Trace]]:
        """Each job's traces; job = (cache key, the prompt of each trace). The missing ones are generated."""
        unique = {digest(key): (key, prompts) for key, prompts in jobs}  # a repeated problem is one job
        digests, keys, wanted = list(unique), [k for k, _ in unique.values()], [p for _, p in unique.values()]
        seeds = [seed_of(key) for key in keys]
        traces = [self.cache.read(key) for key in keys]
        self.cache.reused += sum(min(len(t), len(p)) for t, p in zip(traces, wanted))
        missing = sum(max(0, len(p) - len(t)) for t, p in zip(traces, wanted))
        # Calls are planned on the whole request, cached or not: a resumed run repeats a cold run's calls exactly.
        calls = plan_calls([len(p) for p in wanted], max(1, self.tokens_per_call // max_new_tokens))
        with contextlib.nullcontext() if not missing else figures.Progress(missing, f"{self.label}{desc}",
                                                                           "traces") as bar:
            for call in calls:
                todo = [j for j in call if len(traces[j]) < len(wanted[j])]
                # A job whose cache file was corrupted is drawn again as a cold run drew it: the whole call from
                # trace 0, same prompts, same seed (the seed and the batch come from the call's content, never from
                # what the cache held); the other jobs' fresh traces are dropped, their cached ones kept.
                redo = any(self.cache.path(keys[j]) in self.cache.corrupted for j in todo)
                start = {j: 0 if redo else len(traces[j]) for j in (call if redo else todo)}
                runs = []  # (job, prompt, copies)
                for j in start:
                    rest = wanted[j][start[j]:]
                    if len(set(rest)) == 1:  # a search pool: copies of one prompt share one prefill in generate
                        runs.append((j, rest[0], len(rest)))
                    else:
                        runs += [(j, prompt, 1) for prompt in rest]
                new = [[] for _ in runs]  # each run's traces
                for copies in sorted({c for _, _, c in runs}):
                    group = [i for i, (_, _, c) in enumerate(runs) if c == copies]
                    torch.manual_seed(derive_seed([(seeds[j], start[j]) for j in start], copies))
                    completions = rollout.generate(
                        self.model, self.tokenizer, [runs[i][1] for i in group], samples_per_prompt=copies,
                        max_new_tokens=max_new_tokens, temperature=self.identity["temperature"],
                        micro_batch_size=self.micro_batch_size)
                    self.calls += 1
                    for i, row in zip(group, completions):
                        new[i] = [Trace(c.text, len(c.completion_ids), len(c.prompt_ids), c.truncated) for c in row]
                fresh = {j: [] for j in start}
                for (j, _, _), traces_of_run in zip(runs, new):  # in the job's own trace order
                    fresh[j] += traces_of_run
                for j in todo:
                    fresh[j] = fresh[j][len(traces[j]) - start[j]:]
                    traces[j] = traces[j] + fresh[j]
                    self.cache.write(keys[j], traces[j])
                    self.cache.generated += len(fresh[j])
                    bar.update(len(fresh[j]))
        result = {d: t[: len(p)] for d, t, p in zip(digests, traces, wanted)}
        return [result[digest(key)] for key, _ in jobs]

    def search(self, problems: list[str], count: int, max_new_tokens: int) -> list[list[Trace]]:
        """Traces 0..count-1 of the Search Trace Prompt for each problem: the pool at this L (note 1)."""
        jobs = []
        for problem in problems:
            prompt = rollout.search_prompt(problem)
            key = {**self.identity, "stage": "search", "prompt": digest(prompt), "max_new_tokens": max_new_tokens}
            jobs.append((key, [prompt] * count))
        with self.search_adapter():
            return self._fill(jobs, max_new_tokens, f"search L={max_new_tokens}")

    def aggregate(self, step: int, prompts_run: list[list[str]], max_new_tokens: int,
                  search_identity: dict | None = None, stage: str | None = None) -> list[list[Trace]]:
        """One trace per Aggregation Trace Prompt, for every RSA run of one step; the key hashes the prompts.
        `stage` names other aggregation draws in the key and the progress line (instruments.py's probe).

        search_identity: the policy whose search traces step 1 held, where it is another policy (cross-aggregation);
        the key names it, so these draws are not this policy's own RSA draws. Its own identity adds nothing: a pair
        (A, A) is A's own RSA, cached under the same keys.
        """
        crossed = {} if search_identity in (None, self.identity) else {
            "search": {k: v for k, v in search_identity.items() if k != "model"}, "search_model":
            search_identity["model"]}
        jobs = [({**self.identity, **crossed, "stage": stage or f"rsa-step{step}", "prompts": digest(prompts),
                  "max_new_tokens": max_new_tokens}, prompts) for prompts in prompts_run]
        with self.aggregation_adapter():
            return self._fill(jobs, max_new_tokens, stage or f"RSA step {step}")


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "tracecache.py", "evaluate.py uses")
