"""evaluate.py: the estimators against slow obvious versions, RSA bookkeeping, the cache, and the CLI."""

import copy
import itertools
import json
import math
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
import rollout
import lora
import reward
import tiny

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------------------------------
# pass@k


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=10), st.data())
def test_pass_at_k_is_the_mean_over_all_k_subsets(correct, data):
    k = data.draw(st.integers(1, len(correct)))
    subsets = list(itertools.combinations(correct, k))
    brute = sum(any(s) for s in subsets) / len(subsets)
    assert evaluate.pass_at_k(len(correct), sum(correct), k) == pytest.approx(brute, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(5000, 1, 1), (5000, 3, 64), (4096, 100, 1024), (3000, 2990, 5), (2000, 0, 7)])
def test_pass_at_k_is_exact_for_thousands_of_samples(n, c, k):
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert evaluate.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(4, 1, 5), (4, 5, 1), (4, 1, 0), (4, -1, 1)]:
        with pytest.raises(ValueError):
            evaluate.pass_at_k(n, c, k)


# ---------------------------------------------------------------------------------------------------------------------
# majority@k


def test_majority_groups_equivalent_answers_written_differently():
    # Gold 1/2 in three spellings (1 vote each) against "3" (2 votes): string voting elects 3, math-verify 1/2.
    texts = ["so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "we get \\boxed{1/2}.", "\\boxed{3}", "\\boxed{3}", "no idea"]
    answers = [reward.extract_answer(t) for t in texts]
    correct = [reward.reward(t, "\\frac{1}{2}") == 1.0 for t in texts]
    assert answers[-1] is None and correct == [True, True, True, False, False, False]
    assert evaluate.cluster_answers(answers) == [0, 0, 0, 1, 1, None]
    result = evaluate.majority_at_k(answers, correct, [6], rng=np.random.default_rng(0))[6]
    assert result == {"accuracy": 1.0, "votes": 1, "ties": 0}
    string_equality = evaluate.majority_at_k(answers, correct, [6], rng=np.random.default_rng(0),
                                             equivalent=lambda a, b: a == b)[6]
    assert string_equality["accuracy"] == 0.0


def test_majority_ties_are_random_seeded_and_counted_and_none_casts_no_vote():
    same = lambda a, b: a == b  # noqa: E731
    answers, correct = ["a", "b", None, None], [True, False, False, False]
    # k = 4: one subset, a 1-1 tie (the Nones do not vote); the draw depends only on the seed.
    draws = [evaluate.majority_at_k(answers, correct, [4], rng=np.random.default_rng(s), equivalent=same)[4]
             for s in range(200)]
    assert all(d["ties"] == 1 and d["votes"] == 1 for d in draws)
    assert 0.35 < np.mean([d["accuracy"] for d in draws]) < 0.65
    assert draws[7] == evaluate.majority_at_k(answers, correct, [4], rng=np.random.default_rng(7), equivalent=same)[4]
    # k = 2 enumerates all 6 pairs: {a,b} ties; {a,None}x2 -> a; {b,None}x2 -> b; {None,None} -> no vote (wrong).
    r = evaluate.majority_at_k(answers, correct, [2], rng=np.random.default_rng(0), equivalent=same, num_subsets=6)[2]
    assert r["votes"] == 6 and r["ties"] == 1 and r["accuracy"] in (2 / 6, 3 / 6)
    assert evaluate.majority_at_k([None] * 3, [False] * 3, [3], rng=np.random.default_rng(0), equivalent=same)[3] == {
        "accuracy": 0.0, "votes": 1, "ties": 0}


def test_a_group_is_graded_by_its_first_member():
    same_letter = lambda a, b: a[0] == b[0]  # noqa: E731  (a stand-in for a non-transitive math-verify)
    r = evaluate.majority_at_k(["a1", "a2", "b"], [True, False, False], [3], rng=np.random.default_rng(0),
                               equivalent=same_letter)[3]
    assert r == {"accuracy": 1.0, "votes": 1, "ties": 0}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=1, max_size=7), st.data())
def test_majority_without_ties_equals_a_plain_loop_over_all_subsets(answers, data):
    k = data.draw(st.integers(1, len(answers)))
    correct = [a == "2" for a in answers]
    r = evaluate.majority_at_k(answers, correct, [k], rng=np.random.default_rng(0), equivalent=lambda a, b: a == b,
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


def _fake_rsa(steps, population=5, set_size=3):
    calls = []

    def search(count):
        calls.append(("search", count))
        return [evaluate.Trace(f"search-{i}", 1 + i, 10, False) for i in range(count)]

    def aggregate(t, prompts):
        calls.append((t, prompts))
        return [evaluate.Trace(f"step{t}-{j}", 2, len(p), False) for j, p in enumerate(prompts)]

    history = evaluate.recursive_self_aggregation("What is 2+2?", population=population, set_size=set_size,
                                                  steps=steps, seed=3, search=search, aggregate=aggregate)
    return history, calls


def test_rsa_each_step_aggregates_distinct_members_of_the_previous_population():
    history, calls = _fake_rsa(steps=4)
    assert [h.step for h in history] == [1, 2, 3, 4] and calls[0] == ("search", 5)
    assert all(len(h.traces) == 5 for h in history) and history[0].sets_P_k is None
    for h, (t, prompts), previous in zip(history[1:], calls[1:], history):
        assert t == h.step and np.shape(h.sets_P_k) == (5, 3)
        for row, prompt in zip(h.sets_P_k, prompts):
            assert len(set(row)) == 3 and all(0 <= i < 5 for i in row)  # without replacement, in range
            assert prompt == rollout.aggregation_prompt("What is 2+2?", [previous.traces[i].text for i in row])


def test_rsa_set_draws_are_fixed_per_step_so_longer_runs_extend_shorter_ones():
    short, _ = _fake_rsa(steps=2)
    long, _ = _fake_rsa(steps=4)
    assert short[1].sets_P_k == long[1].sets_P_k
    assert long[2].sets_P_k != long[3].sets_P_k  # fresh draws at every step (not one fixed pattern)
    with pytest.raises(ValueError):
        evaluate.draw_rsa_sets(3, 4, np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------------------------------
# End to end on the tiny policy: RSA token counts and the cache


class TinyRuns:
    """main() on the tiny policy and two short problems, recording the prompts sent to rollout.generate."""

    FLAGS = ["--preset", "tiny", "--max-new-tokens", "8", "--max-tokens-list", "4,8",
             "--rsa-population", "3", "--rsa-set-size", "2", "--rsa-steps", "3"]

    def __init__(self, root: Path):
        self.data, self.out, self.prompts = root / "problems.jsonl", root / "eval.json", []
        self.data.write_text("".join(json.dumps({"problem": f"What is {a} + {a}?", "answer": str(2 * a)}) + "\n"
                                     for a in (1, 2)))

    def __call__(self, *flags):
        self.prompts = []
        assert evaluate.main([*self.FLAGS, "--data", str(self.data), "--out", str(self.out), *flags]) == 0
        return json.loads(self.out.read_text()), self.prompts


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """One TinyRuns (one cache) for the module, and the result of its first, cold run of every method."""
    policy = rollout.load_policy("tiny")  # built once (about 3 s)
    runs = TinyRuns(tmp_path_factory.mktemp("eval"))
    generate = rollout.generate

    def recording_generate(model, tokenizer, prompts, **kw):
        runs.prompts += prompts
        return generate(model, tokenizer, prompts, **kw)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 0.9M-parameter model gains nothing from threads; on a busy 2-core box it loses 3x
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "load_policy", lambda name: policy)
        mp.setattr(rollout, "generate", recording_generate)
        yield runs, *runs("--method", "all")
    torch.set_num_threads(threads)


def test_rsa_on_the_tiny_policy_counts_populations_and_tokens(tiny_runs):
    _, result, prompts = tiny_runs
    # Per problem: one search prompt (8 samples, shared by pass@k, majority, RSA step 1 and sequential at 8
    # tokens), one for sequential at 4 tokens, then 3 aggregation prompts at each of RSA steps 2 and 3.
    assert len(prompts) == 2 * (2 + 3 + 3)
    for record in result["problems"]:
        steps = record["rsa"]
        assert [s["step"] for s in steps] == [1, 2, 3]
        assert steps[0]["samples"] == record["samples"][:3]  # RSA step 1 = the first P shared search traces
        for s in steps:
            assert len(s["samples"]) == 3
            assert s["tokens"] == sum(x["tokens"] for x in s["samples"]) and 0 < s["tokens"] <= 3 * 8
            assert s["pass_at_1"] == np.mean([x["correct"] for x in s["samples"]])
        for s in steps[1:]:
            assert np.shape(s["sets"]) == (3, 2) and all(len(set(row)) == 2 for row in s["sets"])
            assert s["prompt_tokens"] > steps[0]["prompt_tokens"]  # aggregation prompts hold the candidates
    summary = result["summary"]["rsa"]
    assert summary["budget"] == [3 * 8, 6 * 8, 9 * 8]
    cumulative = [np.mean([sum(s["tokens"] for s in r["rsa"][:t]) for r in result["problems"]]) for t in (1, 2, 3)]
    assert summary["tokens"] == pytest.approx(cumulative)
    assert result["summary"]["passk"]["k"] == [1, 2, 4, 8]  # --preset tiny: 8 samples


def test_second_run_reuses_cached_generations_and_only_new_steps_are_generated(tiny_runs):
    runs, first, _ = tiny_runs
    second, prompts = runs("--method", "all")
    assert prompts == [] and second["summary"] == first["summary"]
    # One more RSA step: only step 4 is new (3 aggregation prompts for each of the 2 problems).
    longer, prompts = runs("--method", "rsa", "--rsa-steps", "4")
    assert len(prompts) == 2 * 3 and all(p.startswith("You are given a problem") for p in prompts)
    assert longer["summary"]["rsa"]["pass_at_1"][:3] == first["summary"]["rsa"]["pass_at_1"]
    # More samples: only samples 8 and 9 are new (one search prompt per problem).
    more, prompts = runs("--method", "passk", "--num-samples", "10")
    assert len(prompts) == 2 and more["summary"]["passk"]["k"] == [1, 2, 4, 8, 10]
    assert more["problems"][0]["samples"][:8] == first["problems"][0]["samples"]  # the first 8 are the cached ones


def test_adapter_is_a_new_policy_and_the_aggregator_writes_rsa_steps(tiny_runs, tmp_path, monkeypatch):
    import train

    runs, _, _ = tiny_runs
    shared_model, tokenizer = rollout.load_policy("tiny")  # the fixture's policy: LoRA goes on copies only
    model = copy.deepcopy(shared_model)
    for name in ("default", "aggregator"):
        lora.add_lora(model, rank=2, alpha=2.0, adapter_name=name)
        with torch.no_grad():
            for p in lora.lora_parameters(model, name)[1::2]:  # B = 0 would be the base model exactly
                p.normal_(0, 0.5)
    lora.save_adapter(model, tmp_path / "adapter", "tiny")
    lora.save_adapter(model, tmp_path / "adapter" / "aggregator", "tiny", "aggregator")
    monkeypatch.setattr(rollout, "load_policy", lambda name: (copy.deepcopy(shared_model), tokenizer))
    active = []
    generate = rollout.generate

    def recording_generate(model, tokenizer, prompts, **kw):
        active.append(lora.lora_modules(model)[0][1].active_adapter)
        return generate(model, tokenizer, prompts, **kw)

    monkeypatch.setattr(rollout, "generate", recording_generate)
    result, prompts = runs("--method", "rsa", "--rsa-steps", "2", "--adapter", str(tmp_path / "adapter"))
    assert result["config"]["model"] == "tiny" and result["config"]["policy"]["adapter"]
    assert len(prompts) == 2 * (1 + 3)  # the base model's cached traces are not reused
    assert active == ["default", "aggregator"] * 2  # per problem: search with theta, aggregation with phi


def test_paper_settings_are_one_flag_away():
    paper = evaluate.parse_args([])
    assert (paper.model, paper.rsa_population, paper.rsa_set_size) == ("Qwen/Qwen3-4B-Instruct-2507", 8, 4)
    assert paper.k_list == [1, 2, 4, 8, 16] and paper.methods == list(evaluate.METHODS)
    rsa = evaluate.parse_args(["--rsa-preset", "rsa-paper"])
    assert (rsa.rsa_population, rsa.rsa_set_size, rsa.rsa_steps) == (16, 4, 10)
    explicit = evaluate.parse_args(["--preset", "tiny", "--rsa-preset", "rsa-paper", "--rsa-steps", "2"])
    assert (explicit.model, explicit.rsa_population, explicit.rsa_steps) == \
        (tiny.WARM_START_DIR, 16, 2)  # a flag beats presets


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2, before any model is loaded


@pytest.mark.parametrize("flags,message", [
    (["--data", "no/such/file.jsonl"], "cannot load --data"),
    (["--adapter", "no/such/adapter"], "--adapter"),
    (["--num-samples", "4", "--k-list", "1,8"], "k=8"),
    (["--method", "rsa", "--rsa-population", "2", "--rsa-set-size", "4"], "P=2"),
    (["--num-samples", "0"], "--num-samples"),
    (["--max-tokens-list", "8,-1"], "--max-tokens-list"),
    (["--temperature", "0"], "--temperature"),
    (["--k-list", "1,x"], "comma-separated"),
])
def test_bad_input_is_one_line_and_exit_code_2(flags, message, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_policy", lambda *a, **k: pytest.fail("loaded a model on bad input"))
    assert evaluate.main(["--preset", "tiny", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("evaluate.py: error:") and message in err


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "evaluate.py", "--preset", "tiny", "--adapter", str(tmp_path / "none")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
