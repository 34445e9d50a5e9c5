"""evaluate.py and testtime.py: the estimators against slow obvious versions, RSA bookkeeping, the cache, and the CLI."""

import copy
import importlib.util
import itertools
import json
import math
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import evaluate
import lora
import reward
import rollout
import testtime
import tiny

ROOT = Path(__file__).resolve().parent.parent


def fake_load(shared_model, tokenizer):
    """A stand-in for rollout.load_policy that hands out copies of one model, in the dtype asked for."""
    return lambda name, dtype="auto": (copy.deepcopy(shared_model).to(rollout.resolve_dtype(dtype, "cpu")), tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# pass@k


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.booleans(), min_size=1, max_size=10), st.data())
def test_pass_at_k_is_the_mean_over_all_k_subsets(correct, data):
    k = data.draw(st.integers(1, len(correct)))
    subsets = list(itertools.combinations(correct, k))
    brute = sum(any(s) for s in subsets) / len(subsets)
    assert testtime.pass_at_k(len(correct), sum(correct), k) == pytest.approx(brute, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(5000, 1, 1), (5000, 3, 64), (4096, 100, 1024), (3000, 2990, 5), (2000, 0, 7)])
def test_pass_at_k_is_exact_for_thousands_of_samples(n, c, k):
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert testtime.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(4, 1, 5), (4, 5, 1), (4, 1, 0), (4, -1, 1)]:
        with pytest.raises(ValueError):
            testtime.pass_at_k(n, c, k)


# ---------------------------------------------------------------------------------------------------------------------
# majority@k


def test_majority_groups_equivalent_answers_written_differently():
    # Gold 1/2 in three spellings (1 vote each) against "3" (2 votes): string voting elects 3, math-verify 1/2.
    texts = ["so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "we get \\boxed{1/2}.", "\\boxed{3}", "\\boxed{3}", "no idea"]
    answers = [reward.extract_answer(t) for t in texts]
    correct = [reward.reward(t, "\\frac{1}{2}") == 1.0 for t in texts]
    assert answers[-1] is None and correct == [True, True, True, False, False, False]
    assert testtime.cluster_answers(answers) == [0, 0, 0, 1, 1, None]
    result = testtime.majority_at_k(answers, correct, [6], rng=np.random.default_rng(0))[6]
    assert result == {"accuracy": 1.0, "votes": 1, "ties": 0}
    string_equality = testtime.majority_at_k(answers, correct, [6], rng=np.random.default_rng(0),
                                             equivalent=lambda a, b: a == b)[6]
    assert string_equality["accuracy"] == 0.0


def test_majority_ties_are_random_seeded_and_counted_and_none_casts_no_vote():
    same = lambda a, b: a == b  # noqa: E731
    answers, correct = ["a", "b", None, None], [True, False, False, False]
    # k = 4: one subset, a 1-1 tie (the Nones do not vote); the draw depends only on the seed.
    draws = [testtime.majority_at_k(answers, correct, [4], rng=np.random.default_rng(s), equivalent=same)[4]
             for s in range(200)]
    assert all(d["ties"] == 1 and d["votes"] == 1 for d in draws)
    assert 0.35 < np.mean([d["accuracy"] for d in draws]) < 0.65
    assert draws[7] == testtime.majority_at_k(answers, correct, [4], rng=np.random.default_rng(7), equivalent=same)[4]
    # k = 2 enumerates all 6 pairs: {a,b} ties; {a,None}x2 -> a; {b,None}x2 -> b; {None,None} -> no vote (wrong).
    r = testtime.majority_at_k(answers, correct, [2], rng=np.random.default_rng(0), equivalent=same, num_subsets=6)[2]
    assert r["votes"] == 6 and r["ties"] == 1 and r["accuracy"] in (2 / 6, 3 / 6)
    assert testtime.majority_at_k([None] * 3, [False] * 3, [3], rng=np.random.default_rng(0), equivalent=same)[3] == {
        "accuracy": 0.0, "votes": 1, "ties": 0}


def test_an_answer_joins_the_first_group_it_is_equivalent_to_not_only_the_latest():
    same_letter = lambda a, b: a[0] == b[0]  # noqa: E731
    assert testtime.cluster_answers(["a1", "b1", "a2", None, "c1", "b2"], same_letter) == [0, 1, 0, None, 2, 1]


def test_a_group_is_graded_by_its_first_member():
    same_letter = lambda a, b: a[0] == b[0]  # noqa: E731  (a stand-in for a non-transitive math-verify)
    r = testtime.majority_at_k(["a1", "a2", "b"], [True, False, False], [3], rng=np.random.default_rng(0),
                               equivalent=same_letter)[3]
    assert r == {"accuracy": 1.0, "votes": 1, "ties": 0}


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=1, max_size=7), st.data())
def test_majority_without_ties_equals_a_plain_loop_over_all_subsets(answers, data):
    k = data.draw(st.integers(1, len(answers)))
    correct = [a == "2" for a in answers]
    r = testtime.majority_at_k(answers, correct, [k], rng=np.random.default_rng(0), equivalent=lambda a, b: a == b,
                               num_subsets=10**6)[k]
    wins = ties = 0
    subsets = list(itertools.combinations(answers, k))
    for s in subsets:
        counts = {a: s.count(a) for a in set(s) if a is not None}
        best = [a for a, v in counts.items() if v == max(counts.values(), default=0)]
        ties += len(best) > 1
        wins += best == ["2"]
    assert r["votes"] == len(subsets) and r["ties"] == ties
    assert wins / len(subsets) <= r["accuracy"] <= (wins + ties) / len(subsets)


# ---------------------------------------------------------------------------------------------------------------------
# RSA bookkeeping (pure, with a fake sampler)


def _fake_rsa(steps, runs=(("What is 2+2?", 5),), set_size=3):
    calls = []

    def search(r):
        calls.append(("search", r))
        return [evaluate.Trace(f"search-{r}-{i}", 1 + i, 10, False) for i in range(runs[r][1])]

    def aggregate(t, prompts_run):
        calls.append((t, prompts_run))
        return [[evaluate.Trace(f"step{t}-{r}-{j}", 2, len(p), False) for j, p in enumerate(prompts)]
                for r, prompts in enumerate(prompts_run)]

    histories = testtime.recursive_self_aggregation(list(runs), set_size=set_size, steps=steps, seed=3,
                                                    search=search, aggregate=aggregate)
    return histories, calls


def test_rsa_each_step_aggregates_distinct_members_of_the_previous_population():
    (history,), calls = _fake_rsa(steps=4)
    assert [h.step for h in history] == [1, 2, 3, 4] and calls[0] == ("search", 0)
    assert all(len(h.traces) == 5 for h in history) and history[0].sets_pop_k is None
    for h, (t, (prompts,)), previous in zip(history[1:], calls[1:], history):
        assert t == h.step and np.shape(h.sets_pop_k) == (5, 3)
        for row, prompt in zip(h.sets_pop_k, prompts):
            assert len(set(row)) == 3 and all(0 <= i < 5 for i in row)  # without replacement, in range
            assert prompt == rollout.aggregation_prompt("What is 2+2?", [previous.traces[i].text for i in row])


def test_rsa_set_draws_are_fixed_per_step_so_longer_runs_extend_shorter_ones():
    (short,), _ = _fake_rsa(steps=2)
    (long,), _ = _fake_rsa(steps=4)
    assert short[1].sets_pop_k == long[1].sets_pop_k
    assert long[2].sets_pop_k != long[3].sets_pop_k  # fresh draws at every step (not one fixed pattern)
    for population, set_size in [(3, 4), (3, 0)]:  # numpy's own error for (3, 4) would not name the sizes
        with pytest.raises(ValueError, match=f"got set_size={set_size}, population={population}"):
            testtime.draw_rsa_sets(population, set_size, np.random.default_rng(0))


def test_rsa_runs_in_lockstep_are_the_runs_done_alone():
    # Problems and populations batched into one aggregate call per step draw the sets each would draw alone.
    runs = (("What is 2+2?", 5), ("What is 3+4?", 4), ("What is 2+2?", 4))
    together, calls = _fake_rsa(steps=3, runs=runs)
    assert [len(prompts_run) for _, prompts_run in calls[len(runs):]] == [3, 3]  # one call per step, every run in it
    for r, run in enumerate(runs):
        (alone,), _ = _fake_rsa(steps=3, runs=(run,))
        assert [h.sets_pop_k for h in together[r]] == [h.sets_pop_k for h in alone]
    assert together[1][1].sets_pop_k != together[2][1].sets_pop_k  # same P, another problem: other sets


@pytest.mark.parametrize("seed", range(6))
def test_batched_rsa_equals_the_per_problem_loop_of_the_paper(seed):
    """recursive_self_aggregation (every problem and population in one call per step) draws the same sets and
    builds the same prompts, step by step, as rsa_by_definition run on each problem alone."""
    rng = np.random.default_rng(seed)
    runs = [(f"problem {int(rng.integers(100))} + {i}", int(rng.integers(2, 9))) for i in range(int(rng.integers(1, 5)))]
    set_size = int(rng.integers(1, min(P for _, P in runs) + 1))
    trace = lambda text: evaluate.Trace(text, 1, 1, False)  # noqa: E731
    aggregated = lambda prompt: trace(testtime.digest(prompt)[:12])  # noqa: E731  (a pure function of the prompt)
    batched = testtime.recursive_self_aggregation(
        runs, set_size=set_size, steps=4, seed=seed,
        search=lambda r: [trace(f"{runs[r][0]} | search {i}") for i in range(runs[r][1])],
        aggregate=lambda t, prompts_run: [[aggregated(p) for p in prompts] for prompts in prompts_run])
    for (problem, P), history in zip(runs, batched):
        searched = iter(range(P))
        alone = testtime.rsa_by_definition(problem, population=P, set_size=set_size, steps=4, seed=seed,
                                           sample_search=lambda: trace(f"{problem} | search {next(searched)}"),
                                           sample_aggregation=aggregated)
        assert [(s.step, s.sets_pop_k, [t.text for t in s.traces]) for s in history] == \
            [(s.step, s.sets_pop_k, [t.text for t in s.traces]) for s in alone]


# ---------------------------------------------------------------------------------------------------------------------
# Batching: the call plan and the sampler's cache


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=30), st.integers(1, 40))
def test_plan_calls_packs_consecutive_jobs_greedily(sizes, per_call):
    calls = evaluate.plan_calls(sizes, per_call)
    assert [j for call in calls for j in call] == list(range(len(sizes)))
    for call, following in zip(calls, calls[1:] + [None]):
        total = sum(sizes[j] for j in call)
        assert total <= per_call or len(call) == 1  # a job larger than a call gets one alone
        if following:
            assert total + sizes[following[0]] > per_call  # greedy: the next job did not fit


# ---------------------------------------------------------------------------------------------------------------------
# End to end on the tiny policy: RSA token counts, batching and the cache


class TinyRuns:
    """main() on the tiny policy and two short problems, recording the prompts sent to rollout.generate."""

    FLAGS = ["--preset", "tiny", "--max-new-tokens", "8", "--majority-max-new-tokens", "8", "--max-tokens-list", "4,8",
             "--rsa-populations", "3", "--rsa-set-size", "2", "--rsa-steps", "3"]

    def __init__(self, root: Path):
        self.root, self.data, self.out = root, root / "problems.jsonl", root / "eval.json"
        self.prompts, self.calls = [], []
        self.data.write_text("".join(json.dumps({"problem": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n"
                                     for a in (1, 2)))

    def __call__(self, *flags, out=None):
        self.prompts, self.calls = [], []
        assert evaluate.main([*self.FLAGS, "--data", str(self.data), "--out", str(out or self.out), *flags]) == 0
        return json.loads((out or self.out).read_text()), self.prompts

    def record(self, prompts, kw):
        self.prompts += prompts
        self.calls.append((len(prompts), kw["samples_per_prompt"], kw["max_new_tokens"]))


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """One TinyRuns (one cache) for the module, and the result of its first, cold run of every method."""
    policy = rollout.load_policy("tiny")  # built once (about 3 s)
    runs = TinyRuns(tmp_path_factory.mktemp("eval"))
    generate = rollout.generate

    def recording_generate(model, tokenizer, prompts, **kw):
        runs.record(prompts, kw)
        return generate(model, tokenizer, prompts, **kw)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 0.9M-parameter model gains nothing from threads; on a busy 2-core box it loses 3x
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "load_policy", lambda name, dtype="auto": policy)
        mp.setattr(rollout, "generate", recording_generate)
        result, prompts = runs("--method", "all")
        yield runs, result, prompts, list(runs.calls)
    torch.set_num_threads(threads)


def test_rsa_on_the_tiny_policy_counts_populations_and_tokens(tiny_runs):
    _, result, prompts, _ = tiny_runs
    # Per problem: one search prompt (8 samples, shared by pass@k, majority, RSA step 1 and sequential at 8
    # tokens), one for sequential at 4 tokens, then 3 aggregation prompts at each of RSA steps 2 and 3.
    assert len(prompts) == 2 * (2 + 3 + 3)
    problems = result["policies"]["base"]["problems"]
    for record in problems:
        steps = record["rsa"]["3"]
        assert [s["step"] for s in steps] == [1, 2, 3]
        assert steps[0]["samples"] == record["pools"]["8"][:3]  # RSA step 1 = the first P shared search traces
        for s in steps:
            assert len(s["samples"]) == 3
            assert s["tokens"] == sum(x["tokens"] for x in s["samples"]) and 0 < s["tokens"] <= 3 * 8
            assert s["pass_at_1"] == np.mean([x["correct"] for x in s["samples"]])
        for s in steps[1:]:
            assert np.shape(s["sets"]) == (3, 2) and all(len(set(row)) == 2 for row in s["sets"])
            assert s["prompt_tokens"] > steps[0]["prompt_tokens"]  # aggregation prompts hold the candidates
    summary = result["policies"]["base"]["summary"]
    (rsa,) = summary["rsa"]
    assert rsa["population"] == 3 and rsa["budget"] == [3 * 8, 6 * 8, 9 * 8]
    cumulative = [np.mean([sum(s["tokens"] for s in r["rsa"]["3"][:t]) for r in problems]) for t in (1, 2, 3)]
    assert rsa["tokens"] == pytest.approx(cumulative)
    assert summary["passk"]["k"] == [1, 2, 4, 8] and summary["passk"]["budget"] == [8, 16, 32, 64]
    assert summary["sequential"]["budget"] == [4, 8]


def test_every_stage_of_every_problem_is_one_generate_call(tiny_runs):
    calls = tiny_runs[3]
    # Pools at L=4 and L=8 (2 prompts x 8 samples each), then RSA steps 2 and 3 (2 problems x 3 prompts, 1 sample).
    assert sorted(calls) == sorted([(2, 8, 4), (2, 8, 8), (6, 1, 8), (6, 1, 8)])


def test_second_run_reuses_cached_generations_and_only_new_steps_are_generated(tiny_runs):
    runs, first, _, _ = tiny_runs
    base = lambda result: result["policies"]["base"]  # noqa: E731
    second, prompts = runs("--method", "all")
    assert prompts == [] and base(second)["summary"] == base(first)["summary"]
    # One more RSA step: only step 4 is new (3 aggregation prompts for each of the 2 problems).
    longer, prompts = runs("--method", "rsa", "--rsa-steps", "4")
    assert len(prompts) == 2 * 3 and all(p.startswith("You are given a problem") for p in prompts)
    assert base(longer)["summary"]["rsa"][0]["pass_at_1"][:3] == base(first)["summary"]["rsa"][0]["pass_at_1"]
    # More samples: only samples 8 and 9 are new (one search prompt per problem, one call).
    more, prompts = runs("--method", "passk", "--num-samples", "10")
    assert len(prompts) == 2 and runs.calls == [(2, 2, 8)] and base(more)["summary"]["passk"]["k"] == [1, 2, 4, 8, 10]
    assert base(more)["problems"][0]["pools"]["8"][:8] == base(first)["problems"][0]["pools"]["8"]
    # A new population: RSA with P=3 and P=2 together; only P=2's steps are new, P=3 is read back unchanged.
    sweep, prompts = runs("--method", "rsa", "--rsa-populations", "2,3")
    assert sum(n * copies for n, copies, _ in runs.calls) == 2 * 2 * 2  # 2 problems x P=2 x steps 2 and 3
    assert all(p.startswith("You are given a problem") for p in prompts)
    assert [r["population"] for r in base(sweep)["summary"]["rsa"]] == [2, 3]
    assert base(sweep)["summary"]["rsa"][1] == base(first)["summary"]["rsa"][0]
    # One more problem: only its traces are new; the first two problems' results are read back unchanged.
    data = runs.root / "three.jsonl"
    data.write_text(runs.data.read_text() + json.dumps({"problem": "What is 3 + 3?", "answer": "6"}) + "\n")
    three, prompts = runs("--data", str(data))
    assert prompts and all("3 + 3" in p for p in prompts)
    assert base(three)["problems"][:2] == base(first)["problems"]


def test_a_cold_run_an_interrupted_run_and_its_resumption_agree(tiny_runs, monkeypatch, capsys):
    """Same command, fresh caches: identical traces. Ctrl-C: one line, exit 130; the rerun finishes the calls it had
    not written and matches the uninterrupted run (calls are planned on the whole request, cached or not)."""
    runs = tiny_runs[0]
    flags = ["--method", "rsa", "--tokens-per-call", "8"]  # a call per problem and stage: 2 per stage
    cold, _ = runs(*flags, "--cache-dir", str(runs.root / "cold"), out=runs.root / "cold.json")
    generate, count = rollout.generate, []

    def interrupted(*args, **kw):
        count.append(1)
        if len(count) == 4:  # calls: 2 pools, RSA step 2 of the first problem; the second's is interrupted
            raise KeyboardInterrupt
        return generate(*args, **kw)

    monkeypatch.setattr(rollout, "generate", interrupted)
    command = [*runs.FLAGS, "--data", str(runs.data), *flags, "--cache-dir", str(runs.root / "resumed"),
               "--out", str(runs.root / "resumed.json")]
    # Progress lines share stderr (figures.Progress: one per 30 s, so a busy machine prints some): here one per
    # update, so that the interruption is shown to be the last line and the only other one whatever the load
    import re

    import figures

    with monkeypatch.context() as every_update:
        every_update.setitem(figures.Progress.__init__.__kwdefaults__, "every_s", 0.0)
        assert evaluate.main(command) == 130
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if not re.fullmatch(r".+: \d+/\d+ traces.*, \d+:\d\d(:\d\d)? elapsed.*", line)]
    assert len(lines) > 1 and said == lines[-1:] and "interrupted" in said[0], lines
    assert str(runs.root / "resumed") in said[0]
    monkeypatch.setattr(rollout, "generate", generate)
    resumed, prompts = runs(*flags, "--cache-dir", str(runs.root / "resumed"), out=runs.root / "resumed.json")
    assert len(prompts) == 3 + 3 * 2  # the second problem's step 2, then both problems' step 3
    assert resumed["policies"]["base"]["summary"] == cold["policies"]["base"]["summary"]
    assert resumed["policies"]["base"]["problems"] == cold["policies"]["base"]["problems"]


def test_a_corrupted_cache_file_is_named_and_regenerated(tiny_runs, capsys):
    runs = tiny_runs[0]
    cache = runs.root / "corrupt"
    first, _ = runs("--method", "passk", "--cache-dir", str(cache), out=runs.root / "corrupt.json")
    files = sorted(cache.glob("*.json"))
    assert len(files) == 2  # one pool per problem
    drawn = json.loads(files[0].read_text())["traces"]
    files[0].write_text('{"key": {"stage": "sea')  # a torn file
    capsys.readouterr()
    second, prompts = runs("--method", "passk", "--cache-dir", str(cache), out=runs.root / "corrupt.json")
    assert f"corrupted cache file {files[0]}" in capsys.readouterr().err
    assert json.loads(files[0].read_text())["traces"] == drawn  # that problem's pool, rewritten with the same traces
    assert len(prompts) == 2  # its whole call again (both problems), seeded as the first run seeded it
    assert second["policies"]["base"] == first["policies"]["base"]  # so the same traces: the same result


def _random_adapter(shared_model, directory, names=("default",)):
    """A LoRA adapter in train.py's format with non-zero B (B = 0 would be the base model exactly)."""
    model = copy.deepcopy(shared_model)
    for name in names:
        lora.add_lora(model, rank=2, alpha=2.0, adapter_name=name)
        with torch.no_grad():
            for p in lora.lora_parameters(model, name)[1::2]:
                p.normal_(0, 0.5)
    lora.save_adapter(model, directory, "tiny")
    for name in names[1:]:
        lora.save_adapter(model, directory / name, "tiny", name)
    return directory


def test_adapter_is_a_new_policy_and_the_aggregator_writes_rsa_steps(tiny_runs, tmp_path, monkeypatch):
    runs = tiny_runs[0]
    shared_model, tokenizer = rollout.load_policy("tiny")  # the fixture's policy: LoRA goes on copies only
    adapter = _random_adapter(shared_model, tmp_path / "adapter", ("default", "aggregator"))
    monkeypatch.setattr(rollout, "load_policy", fake_load(shared_model, tokenizer))
    active = []
    generate = rollout.generate

    def recording_generate(model, tokenizer, prompts, **kw):
        active.append(lora.lora_modules(model)[0][1].active_adapter)
        return generate(model, tokenizer, prompts, **kw)

    monkeypatch.setattr(rollout, "generate", recording_generate)
    result, prompts = runs("--method", "rsa", "--rsa-steps", "2", "--adapter", str(adapter))
    identity = result["policies"]["adapter"]["policy"]
    assert identity["model"] == "tiny" and identity["adapter"]  # the adapter's own base model
    assert len(prompts) == 2 * (1 + 3)  # the base model's cached traces are not reused
    assert active == ["policy:adapter", "aggregator:adapter"]  # search with theta, aggregation with phi, one call each


def test_policies_are_compared_on_the_same_problems(tiny_runs, tmp_path, monkeypatch, capsys):
    runs, first, _, _ = tiny_runs
    shared_model, tokenizer = rollout.load_policy("tiny")
    loads = []
    load = fake_load(shared_model, tokenizer)
    monkeypatch.setattr(rollout, "load_policy", lambda name, dtype="auto": loads.append(name) or load(name, dtype))
    adapter = _random_adapter(shared_model, tmp_path / "a")
    capsys.readouterr()
    result, _ = runs("--policy", "base=tiny", "--policy", f"lora={adapter}", "--policy", f"again={adapter}",
                     out=tmp_path / "cmp.json")
    assert loads == ["tiny"]  # one base model; the adapters are named LoRA adapters on it
    assert list(result["policies"]) == ["base", "lora", "again"]
    base, tuned, again = (result["policies"][k] for k in ("base", "lora", "again"))
    assert base["summary"] == first["policies"]["base"]["summary"]  # same weights, same seeds: the model's path
    # ("tiny" here, the warm start's directory in the first run) is not part of a seed
    assert [r["problem"] for r in tuned["problems"]] == [r["problem"] for r in base["problems"]]
    assert tuned["problems"] != base["problems"] and again["summary"] == tuned["summary"]  # same policy, same key
    table = capsys.readouterr().out
    assert "base acc" in table and "lora acc" in table and "rsa, population P=3, set size k=2" in table
    if importlib.util.find_spec("matplotlib"):  # optional (CI installs it, as dev.py does)
        assert (tmp_path / "cmp.png").stat().st_size > 10_000
    else:
        assert "matplotlib is not installed" in table and not (tmp_path / "cmp.png").exists()


def test_a_short_evaluation_in_bfloat16_runs_on_cpu(tiny_runs, tmp_path, monkeypatch):
    """The GPU path's dtype on a CPU: a bf16 base with fp32 LoRA masters, through generate and RSA."""
    runs = tiny_runs[0]
    shared_model, tokenizer = rollout.load_policy("tiny")
    adapter = _random_adapter(shared_model, tmp_path / "a", ("default", "aggregator"))
    monkeypatch.setattr(rollout, "load_policy", fake_load(shared_model, tokenizer))
    dtypes, generate = [], rollout.generate

    def recording_generate(model, tokenizer, prompts, **kw):
        dtypes.append(model.get_input_embeddings().weight.dtype)
        return generate(model, tokenizer, prompts, **kw)

    monkeypatch.setattr(rollout, "generate", recording_generate)
    result, _ = runs("--dtype", "bfloat16", "--policy", "base=tiny", "--policy", f"lora={adapter}",
                     out=tmp_path / "bf16.json")
    assert set(dtypes) == {torch.bfloat16} and len(dtypes) >= 8
    for policy in result["policies"].values():
        assert policy["policy"]["dtype"] == "bfloat16"  # its own cache key: bf16 traces are not fp32 traces
        summary = policy["summary"]
        curves = [summary["passk"]["pass_at_k"], summary["majority"]["accuracy"], summary["rsa"][0]["pass_at_1"],
                  summary["sequential"]["pass_at_1"]]
        assert all(0.0 <= v <= 1.0 for curve in curves for v in curve)
        assert all(0 < s["tokens"] <= 8 for r in policy["problems"] for s in r["pools"]["8"])
    assert result["policies"]["base"]["summary"]["passk"]["pass_at_k"] == sorted(
        result["policies"]["base"]["summary"]["passk"]["pass_at_k"])  # pass@k never falls with k


def test_paper_settings_are_one_flag_away():
    paper = evaluate.parse_args([])
    assert (paper.model, paper.rsa_set_size, paper.majority_max_new_tokens) == ("Qwen/Qwen3-4B-Instruct-2507", 4, 16384)
    assert 8 in paper.rsa_populations and paper.policies == [
        {"label": "base", "model": "Qwen/Qwen3-4B-Instruct-2507", "adapter": None}]
    assert paper.k_list == [1, 2, 4, 8, 16] and paper.methods == list(evaluate.METHODS)
    assert evaluate.pool_sizes(paper) == {4096: 16, 16384: 16, 1024: 16, 2048: 16, 8192: 16, 32768: 16}
    rsa = evaluate.parse_args(["--rsa-preset", "rsa-paper"])
    assert (rsa.rsa_populations, rsa.rsa_set_size, rsa.rsa_steps) == ([16], 4, 10)
    explicit = evaluate.parse_args(["--preset", "tiny", "--rsa-preset", "rsa-paper", "--rsa-steps", "2",
                                    "--rsa-populations", "5,4,5"])
    assert (explicit.model, explicit.rsa_populations, explicit.rsa_steps) == \
        (tiny.WARM_START_DIR, [4, 5], 2)  # a flag beats presets


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2, before any model is loaded or anything generated


@pytest.fixture
def bad_files(tmp_path):
    """An adapter without weights, one with torn weights, a foreign JSON file, a directory, and a plain file."""
    for name in ("noweights", "torn"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (tmp_path / "torn" / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    (tmp_path / "notes.json").write_text('{"my": "thesis"}')
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "file").write_text("x")
    return tmp_path


@pytest.mark.parametrize("flags,message", [
    (["--data", "no/such/file.jsonl"], "cannot load --data"),
    (["--adapter", "no/such/adapter"], "--adapter"),
    (["--num-samples", "4", "--k-list", "1,8"], "k=8"),
    (["--method", "rsa", "--rsa-populations", "2", "--rsa-set-size", "4"], "P=2"),
    (["--num-samples", "0"], "--num-samples"),
    (["--max-tokens-list", "8,-1"], "--max-tokens-list"),
    (["--temperature", "0"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--k-list", "1,x"], "comma-separated"),
    (["--rsa-populations", "4,0"], "--rsa-populations"),
    (["--policy", "tiny"], "LABEL=PATH"),
    (["--policy", "a b=tiny"], "LABEL=PATH"),
    (["--policy", "x=tiny", "--policy", "x=tiny"], "used twice"),
    (["--policy", "x={d}/nothing/here"], "no such adapter or model"),
    (["--policy", "x={d}"], "neither an adapter"),
    (["--policy", "x={d}/noweights"], "adapter_model.safetensors is missing"),
    (["--policy", "x={d}/torn"], "not a readable safetensors file"),
    (["--dtype", "float16"], "--dtype"),
    (["--out", "{d}/notes.json"], "not an evaluate.py result"),
    (["--out", "{d}/dir.json"], "expected a JSON file"),
    (["--out", "{d}/file/results.json"], "--out: cannot write"),
    (["--out", "{d}/ok.json", "--cache-dir", "{d}/file/cache"], "--cache-dir: cannot write"),
])
def test_bad_input_is_one_line_and_exit_code_2(flags, message, bad_files, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("loaded a model on bad input"))
    flags = [f.format(d=bad_files) for f in flags]
    out = [] if "--out" in flags else ["--out", str(bad_files / "results.json")]
    assert evaluate.main(["--preset", "tiny", *out, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("evaluate.py: error:") and message in err
    assert (bad_files / "notes.json").read_text() == '{"my": "thesis"}'


def test_out_replaces_an_earlier_result_and_nothing_else(tmp_path):
    earlier = tmp_path / "earlier.json"  # the format before "written_by" existed
    earlier.write_text(json.dumps({"config": {}, "summary": {}, "problems": []}))
    (tmp_path / "earlier.png").write_text("its plot")
    assert evaluate.parse_args(["--preset", "tiny", "--out", str(earlier)]).cache_dir == str(tmp_path / ".cache")
    (tmp_path / "figure.png").write_text("someone's figure")
    with pytest.raises(evaluate.UsageError, match="figure.png exists"):
        evaluate.parse_args(["--preset", "tiny", "--out", str(tmp_path / "figure.json")])


def test_an_adapter_for_another_model_fails_before_generating(tiny_runs, tmp_path, monkeypatch, capsys):
    runs = tiny_runs[0]
    shared_model, tokenizer = rollout.load_policy("tiny")
    adapter = _random_adapter(shared_model, tmp_path / "a")
    from safetensors.torch import load_file, save_file
    weights = load_file(adapter / "adapter_model.safetensors")  # rename the keys: layer 0 -> layer 9
    save_file({k.replace("layers.0.", "layers.9."): v for k, v in weights.items()},
              str(adapter / "adapter_model.safetensors"))
    monkeypatch.setattr(rollout, "load_policy", fake_load(shared_model, tokenizer))
    monkeypatch.setattr(rollout, "generate", lambda *a, **k: pytest.fail("generated with a bad adapter"))
    capsys.readouterr()
    code = evaluate.main([*runs.FLAGS, "--data", str(runs.data), "--policy", "base=tiny", "--policy", f"x={adapter}",
                          "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"policy x: cannot load the adapter {adapter}" in err
    assert "do not match" in err and not (tmp_path / "x.json").exists()


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "evaluate.py", "--preset", "tiny", "--adapter", str(tmp_path / "none")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
