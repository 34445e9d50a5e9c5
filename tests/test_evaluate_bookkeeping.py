"""evaluate.py's bookkeeping, each test written against a bug a careful engineer could make: majority@k's subsets
drawn per problem, grader statistics per policy, calls planned on the whole request, the cache's identity of a
policy, what the cache hands back and counts, and each generate call's own seed (the lock's order is in
tests/test_user_files.py)."""

import copy
import itertools
import json
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import evaluate
import rollout
import tracecache
from problemset import Problem
from testtime import digest


def _trace(answer: str) -> evaluate.Trace:
    return evaluate.Trace(f"1 + 1 = \\boxed{{{answer}}}", 8, 20, False)


class PoolSampler:
    """Hands every problem the same pool of answers: only the problem's text differs."""

    def __init__(self, answers):
        self.answers = answers

    def search(self, problems, count, max_new_tokens):
        return [[_trace(a) for a in self.answers[:count]] for _ in problems]


def _majority_cfg(seed=0):
    return SimpleNamespace(num_samples=8, methods=["majority"], majority_max_new_tokens=12, max_new_tokens=12,
                           k_list=[4], seed=seed, majority_subsets=32, max_tokens_list=[], rsa_populations=[])


def test_majority_draws_its_own_subsets_for_each_problem():
    """C(8, 4) = 70 subsets > 32: majority@4 averages 32 random ones. With one random stream for all problems,
    problems with the same answers would get the same subsets and so exactly the same accuracy."""
    problems = [Problem(f"What is {a} + {2 - a}?", "2") for a in range(-3, 3)]  # six texts, one gold answer
    sampler = PoolSampler(["2", "2", "2", "3", "3", "4", "4", "5"])
    accuracy = lambda cfg: [r["majority"][4]["accuracy"] for r in evaluate.evaluate_policy(problems, sampler, cfg)]  # noqa: E731
    first = accuracy(_majority_cfg())
    assert len(set(first)) > 1  # the subsets differ between problems
    assert accuracy(_majority_cfg()) == first  # and are seeded: the same command, the same numbers
    assert accuracy(_majority_cfg(seed=1)) != first
    def expected(subset):  # ties broken uniformly: the share of the tie that is right
        votes = Counter(sampler.answers[i] for i in subset)
        leaders = [a for a, v in votes.items() if v == max(votes.values())]
        return ("2" in leaders) / len(leaders)
    exact = np.mean([expected(s) for s in itertools.combinations(range(8), 4)])  # the mean over all 70 subsets
    assert abs(np.mean(first) - exact) < 0.1


def _pool_cfg(methods, **settings):
    return SimpleNamespace(**{"num_samples": 4, "methods": methods, "max_new_tokens": 12, "majority_max_new_tokens": 12,
                              "k_list": [1, 4], "seed": 0, "majority_subsets": 8, "max_tokens_list": [12],
                              "rsa_populations": [8], "rsa_set_size": 2, "rsa_steps": 1, **settings})


def test_pass_at_k_reads_the_first_n_traces_of_a_pool_rsa_made_larger():
    """RSA's population P = 8 > n = 4 makes the pool 8 traces long; pass@k and its answer sets are over its first n
    (here all wrong), never the rest (here all right), which would be a pass@k over other samples than asked for."""
    sampler = PoolSampler(["3", "3", "4", "5", "2", "2", "2", "2"])
    (record,) = evaluate.evaluate_policy([Problem("What is 1 + 1?", "2")], sampler, _pool_cfg(["passk", "rsa"]))
    assert record["pass_at_k"] == {1: 0.0, 4: 0.0}
    assert record["sets"]["search"]["distinct_answers"][4] == 3.0
    assert len(record["rsa"][8][0]["samples"]) == 8  # RSA's step 1: the whole population


def test_sequential_reports_the_share_of_its_traces_that_hit_the_length():
    """summary["sequential"]["truncated"]: per length, the truncated traces' share of the n read, averaged over
    problems (1 of 4, then 3 of 4: 0.5)."""
    class Truncating(PoolSampler):
        def search(self, problems, count, max_new_tokens):
            return [[evaluate.Trace("\\boxed{2}", 12, 20, i < cut) for i in range(count)] for cut in (1, 3)]

    cfg = _pool_cfg(["sequential"])
    records = evaluate.evaluate_policy([Problem("What is 1 + 1?", "2"), Problem("What is 0 + 2?", "2")],
                                       Truncating([]), cfg)
    assert [r["sequential"][12]["truncated"] for r in records] == [1, 3]
    assert evaluate.summarize(records, cfg)["sequential"]["truncated"] == [0.5]


class Scored(PoolSampler):
    """Search traces "a", "b", "c", "d" (a user's task grades them by their text); every aggregation trace "c"."""

    def search(self, problems, count, max_new_tokens):
        return [[evaluate.Trace(t, 8, 20, False) for t in "abcd"[:count]] for _ in problems]

    def aggregate(self, step, prompts_R, max_new_tokens):
        return [[evaluate.Trace("c", 8, 20, False) for _ in prompts] for prompts in prompts_R]


def test_a_users_reward_counts_a_trace_as_solved_only_at_one():
    """--reward with rewards in (0, 1): a = 1, b = 0.5, c = 0.99, d = 0. pass@k, sequential's pass@1 and RSA's
    pass@1 count only r = 1 as solved (1 of 4); each trace keeps the reward it was given. Counted right at any
    positive reward, pass@1 would be 3/4 and RSA's step 2 (all "c") 1."""
    scores = {"a": 1.0, "b": 0.5, "c": 0.99, "d": 0.0}
    cfg = _pool_cfg(["passk", "rsa", "sequential"], k_list=[1, 2, 4], rsa_populations=[4], rsa_steps=2)
    (record,) = evaluate.evaluate_policy([Problem("What is 1 + 1?", None)], Scored([]), cfg,
                                         reward_fn=lambda problem, text: scores[text])
    assert [(s["reward"], s["correct"]) for s in record["pools"][12]] == [
        (1.0, True), (0.5, False), (0.99, False), (0.0, False)]
    assert record["pass_at_k"] == {1: 0.25, 2: 0.5, 4: 1.0}  # n = 4, c = 1: 1 - C(3, 2) / C(4, 2) at k = 2
    assert record["sequential"][12]["pass_at_1"] == 0.25
    assert [step["pass_at_1"] for step in record["rsa"][4]] == [0.25, 0.0]
    assert [s["reward"] for s in record["rsa"][4][1]["samples"]] == [0.99] * 4


def test_tokens_per_trace_are_those_of_the_n_traces_read_where_rsa_makes_the_pool_larger():
    """RSA's P = 8 > n = 2 makes the pool at --max-new-tokens 8 traces long, trace j of j + 1 tokens. pass@k,
    majority@k and sequential read its first n = 2 (1.5 tokens a trace), and their tokens are those 2's, not the
    whole pool's (4.5 a trace); RSA's step 1 generated all 8 (36 tokens)."""
    class Lengths(PoolSampler):
        def search(self, problems, count, max_new_tokens):
            return [[evaluate.Trace("\\boxed{2}", j + 1, 20, False) for j in range(count)] for _ in problems]

    cfg = _pool_cfg(["passk", "majority", "rsa", "sequential"], num_samples=2, k_list=[1, 2], rsa_populations=[8])
    summary = evaluate.summarize(evaluate.evaluate_policy([Problem("What is 1 + 1?", "2")], Lengths([]), cfg), cfg)
    assert summary["passk"]["tokens"] == summary["majority"]["tokens"] == [1.5, 3.0]
    assert summary["passk"]["search_tokens"] == [1.5, 3.0] and summary["sequential"]["tokens"] == [1.5]
    assert summary["rsa"][0]["tokens"] == [36.0]


@pytest.fixture
def tiny_policy(monkeypatch):
    model, tokenizer = rollout.load_policy("tiny")
    monkeypatch.setattr(rollout, "load_policy", lambda name, dtype="auto": (copy.deepcopy(model), tokenizer))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model, tokenizer
    torch.set_num_threads(previous)


def _problems(path: Path, count: int) -> str:
    path.write_text("".join(json.dumps({"problem": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n"
                            for a in range(1, count + 1)))
    return str(path)


SHORT = ["--preset", "tiny", "--method", "passk", "--num-samples", "2", "--max-new-tokens", "8"]


def test_grader_statistics_are_counted_per_policy(tiny_policy, tmp_path, monkeypatch):
    """Each policy reports the answers the grader left without a verdict while grading that policy only."""
    graded = {"n": 0}

    def reward_without_verdict(text, gold):
        graded["n"] += 1
        return 0.0

    monkeypatch.setattr(evaluate, "reward", reward_without_verdict)
    monkeypatch.setattr(evaluate.grader, "grader_stats", lambda: {"ungraded": graded["n"], "timeouts": 0,
                                                                  "worker_restarts": 0, "start_failures": 0})
    data = _problems(tmp_path / "p.jsonl", 2)
    assert evaluate.main([*SHORT, "--data", data, "--policy", "a=tiny", "--policy", "b=tiny", "--policy", "c=tiny",
                          "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    counts = [result["policies"][label]["grader"]["ungraded"] for label in "abc"]
    assert counts == [2 * 2] * 3 and graded["n"] == 3 * 2 * 2  # 2 problems x 2 traces each, per policy


def _cache_file_of(cache: Path, problem: str) -> Path:
    wanted = digest(rollout.search_prompt(problem))
    (path,) = [p for p in cache.glob("*.json") if json.loads(p.read_text())["key"].get("prompt") == wanted]
    return path


def test_a_corrupted_file_is_redrawn_in_the_call_a_cold_run_made(tiny_policy, tmp_path, capsys):
    """Calls are planned on the whole request, cached or not: 4 problems in calls of 2. When problem 3's file is
    corrupted, its call [3, 4] is drawn again with that call's seed. Planned on the missing traces only, the four
    problems would make one call [1, 2, 3, 4], another seed, other traces."""
    data, cache = _problems(tmp_path / "p.jsonl", 4), tmp_path / "cache"
    flags = [*SHORT, "--data", data, "--policy", "base=tiny", "--tokens-per-call", "32", "--cache-dir", str(cache)]
    assert evaluate.main([*flags, "--out", str(tmp_path / "cold.json")]) == 0
    cold = json.loads((tmp_path / "cold.json").read_text())["policies"]["base"]
    third = _cache_file_of(cache, "What is 3 + 3?")
    drawn = json.loads(third.read_text())["traces"]
    third.write_text('{"key": ')  # torn
    assert evaluate.main([*flags, "--out", str(tmp_path / "again.json")]) == 0
    assert "corrupted cache file" in capsys.readouterr().err
    assert json.loads(third.read_text())["traces"] == drawn
    assert json.loads((tmp_path / "again.json").read_text())["policies"]["base"]["problems"] == cold["problems"]


def _identity(adapter, engine="hf", **settings):
    cfg = SimpleNamespace(**{"seed": 0, "temperature": 1.0, "generation": "auto", **settings})
    return evaluate.policy_identity({"model": "tiny", "adapter": str(adapter) if adapter else None}, cfg,
                                    torch.float32, engine)


def test_the_cache_knows_a_policy_by_its_bytes_and_sampling_settings_not_its_path(tmp_path):
    from tests.test_evaluate import _random_adapter

    model, _ = rollout.load_policy("tiny")
    adapter = _random_adapter(model, tmp_path / "a", ("default", "aggregator"))
    moved = Path(shutil.copytree(adapter, tmp_path / "elsewhere" / "a"))
    assert _identity(moved) == _identity(adapter)  # a copy anywhere is the same policy: its traces are reused
    base = _identity(None)
    assert base["adapter"] is None and _identity(adapter) != base
    for setting in [{"seed": 1}, {"temperature": 0.7}, {"engine": "fast"}]:  # the engine --generation auto resolved
        assert _identity(adapter, **setting) != _identity(adapter)
    assert evaluate.policy_identity({"model": "tiny", "adapter": str(adapter)}, SimpleNamespace(
        seed=0, temperature=1.0, generation="hf"), torch.bfloat16) != _identity(adapter)
    weights = moved / "aggregator" / "adapter_model.safetensors"  # only phi changes: RSA's traces must change
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 1
    weights.write_bytes(bytes(raw))
    assert _identity(moved) != _identity(adapter)
    shutil.rmtree(moved)
    shutil.copytree(adapter, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["lora_alpha"] = 2 * config["lora_alpha"]  # same weights, another scale: another policy
    (moved / "adapter_config.json").write_text(json.dumps(config))
    assert _identity(moved) != _identity(adapter)
    # The same run trained in another checkout: its adapter_config.json names the base where that checkout has it
    # (train.py writes an absolute path). The same policy, so the same sampling seed: CI's clone draws the README's
    # traces. Before, the path seeded the sampling and a second-task cell moved by 0.02 between two checkouts.
    shutil.rmtree(moved)
    shutil.copytree(adapter, moved)
    for sub in ("", "aggregator"):
        path = moved / sub / "adapter_config.json"
        config = json.loads(path.read_text())
        config["base_model_name_or_path"] = "/another/checkout/data/tiny_warmstart"
        path.write_text(json.dumps(config, indent=4))
    assert _identity(moved) == _identity(adapter)


# ----------------------------------------------------------------------------------------------------------------------
# tracecache.py: what the cache hands back and counts, and each generate call's own seed

IDENTITY = {"format": 3, "model": "tiny", "adapter": None, "seed": 0, "temperature": 1.0, "dtype": "float32"}


def _search_key(problem: str, max_new_tokens: int = 8) -> dict:
    return {**IDENTITY, "stage": "search", "prompt": digest(rollout.search_prompt(problem)),
            "max_new_tokens": max_new_tokens}


def test_a_cache_file_holding_another_key_is_not_taken_for_this_one(tmp_path, capsys):
    """A file at this key's path whose key is another's (a copied or renamed file): named in a warning, and its
    traces are drawn again, never read as this key's."""
    cache = tracecache.TraceCache(tmp_path)
    mine, other = _search_key("What is 1 + 1?"), _search_key("What is 2 + 2?")
    cache.write(other, [_trace("4")])
    cache.path(other).rename(cache.path(mine))
    assert cache.read(mine) == [] and cache.path(mine) in cache.corrupted
    assert "holds another key" in capsys.readouterr().err
    cache.write(mine, [_trace("2")])
    assert cache.read(mine) == [_trace("2")]


def test_traces_read_from_the_cache_are_counted_as_asked_for(tmp_path):
    """A pool of 4 cached traces asked for 2: 2 returned, 2 counted as reused, nothing generated (no model)."""
    cache = tracecache.TraceCache(tmp_path)
    cache.write(_search_key("What is 1 + 1?"), [_trace(a) for a in "2345"])
    sampler = tracecache.Sampler(None, None, cache, IDENTITY, tokens_per_call=1024)
    assert sampler.search(["What is 1 + 1?"], 2, 8) == [[_trace("2"), _trace("3")]]
    assert (cache.reused, cache.generated, sampler.calls) == (2, 0, 0)


def _record_generate_seeds(monkeypatch) -> list[int]:
    """rollout.generate replaced by a stand-in recording the torch seed each call runs under (one trace "t" a copy)."""
    seeds = []

    def generate(model, tokenizer, prompts, *, samples_per_prompt, **_):
        seeds.append(torch.initial_seed())
        return [[rollout.Completion([1], [2], [0.0], "t", False)] * samples_per_prompt for _ in prompts]

    monkeypatch.setattr(tracecache.rollout, "generate", generate)
    return seeds


def test_each_generate_call_of_a_stage_draws_its_own_seed(tmp_path, monkeypatch):
    """One planned call whose jobs need different numbers of copies (one topped up from 1 cached trace to 3, one drawn
    from 0) is two generate calls; each is seeded from its own content, copies included, so the two never share a
    random stream."""
    seeds = _record_generate_seeds(monkeypatch)
    cache = tracecache.TraceCache(tmp_path)
    cache.write(_search_key("What is 1 + 1?"), [_trace("2")])
    sampler = tracecache.Sampler(None, None, cache, IDENTITY, tokens_per_call=1024)
    traces = sampler.search(["What is 1 + 1?", "What is 2 + 2?"], 3, 8)
    assert [len(t) for t in traces] == [3, 3] and sampler.calls == 2
    assert len(set(seeds)) == 2


def test_topping_up_a_pool_draws_a_stream_of_its_own(tmp_path, monkeypatch):
    """k more traces on top of a cached pool of k are drawn from a seed of where the job starts (trace k), not the
    first k's seed again: the top-up would repeat the pool's traces."""
    seeds = _record_generate_seeds(monkeypatch)
    cache = tracecache.TraceCache(tmp_path)
    first = tracecache.Sampler(None, None, cache, IDENTITY, tokens_per_call=1024)
    assert [len(t) for t in first.search(["What is 1 + 1?"], 2, 8)] == [2]
    topped_up = tracecache.Sampler(None, None, cache, IDENTITY, tokens_per_call=1024)
    assert [len(t) for t in topped_up.search(["What is 1 + 1?"], 4, 8)] == [4] and topped_up.calls == 1
    assert len(seeds) == 2 and seeds[0] != seeds[1]


def test_a_trace_keeps_the_tokens_it_generated_not_the_budget(tmp_path, monkeypatch):
    """Each Trace holds its completion's own token count (the EOS included), its prompt's, and rollout's truncated
    flag, for search and aggregation traces alike: what evaluate.py's token columns add up is what was generated,
    not max_new_tokens. Completions of 1, 3 and 8 tokens (an EOS at the last allowed token: not truncated), and one
    cut at 8 (truncated); the aggregation prompts' lengths differ."""
    lengths, cut = [1, 3, 8, 8], [False, False, False, True]

    def generate(model, tokenizer, prompts, *, samples_per_prompt, max_new_tokens, **_):
        assert max_new_tokens == 8
        return [[rollout.Completion([0] * (5 + i), [1] * lengths[j], [0.0] * lengths[j], f"t{j}", cut[j])
                 for j in range(samples_per_prompt)] for i in range(len(prompts))]

    monkeypatch.setattr(tracecache.rollout, "generate", generate)
    sampler = tracecache.Sampler(None, None, tracecache.TraceCache(tmp_path), IDENTITY, tokens_per_call=1024)
    (search,) = sampler.search(["What is 1 + 1?"], 4, 8)
    assert search == [evaluate.Trace(f"t{j}", n, 5, c) for j, (n, c) in enumerate(zip(lengths, cut))]
    (aggregation,) = sampler.aggregate(2, [["first prompt", "second prompt"]], 8)
    assert aggregation == [evaluate.Trace("t0", 1, 5, False), evaluate.Trace("t0", 1, 6, False)]
    again = tracecache.Sampler(None, None, tracecache.TraceCache(tmp_path), IDENTITY, tokens_per_call=1024)
    assert again.search(["What is 1 + 1?"], 4, 8) == [search] and again.calls == 0  # read back as written
