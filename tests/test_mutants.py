"""Behaviours a mutation review found unpinned: each test fails on the plausible bug named in its
docstring, and each was seen failing with that bug planted.

Algorithm 1's gradient as a token sum over the constant C at T != 1; the loop's temperature and |B| with a problem
skipped; dynamic sampling keeping set-RL-only signal; the collector with K != N2; LoRA's alpha/r and rsLoRA's
alpha/sqrt(r); majority@k's random subsets; evaluate.py's pass@k and RSA pass@1 as values."""

import copy
import itertools
import json
import math
import re
import zlib
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import evaluate
import lora
import problemset
import rollout
import spiral
import testtime
import train
from logprobs import TokenBatch, completion_logprobs
from rollout import Completion
from problemset import Problem

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    return rollout.load_policy("tiny", device="cpu")


# ----------------------------------------------------------------------------------------------------------------------
# Algorithm 1, lines 14-18: the gradient


def _slow_loss(model, samples, C, temperature):
    """-(1/C) sum over samples and their tokens of exp(log pi_theta - log pi_sampler) A, one unpadded sequence at a
    time with the full softmax: the obviously correct version of train.accumulate_gradients."""
    loss = 0.0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])  # (1, T)
        logits = model(input_ids=ids, use_cache=False).logits.float()[0, :-1] / temperature  # (T-1, V)
        logp = torch.log_softmax(logits, -1)[len(s.prompt_ids) - 1:]  # (L, V): the positions predicting completions
        logp = logp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)  # (L,)
        loss = loss - (torch.exp(logp - torch.tensor(s.sampler_logprobs)) * s.advantage).sum() / C
    return loss


def test_gradient_is_the_token_sum_over_C_at_the_temperature(tiny):
    """Bugs: a per-sequence mean (length bias: each sample's token sum divided by its length); the log-probs at
    T = 1 instead of the rollout temperature; ratio or advantage dropped. Samples of lengths 1..9, off-policy."""
    model = copy.deepcopy(tiny[0])
    torch.manual_seed(0)
    lora.add_lora(model, rank=4, alpha=8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lora.lora_parameters(model):
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    T, C = 0.6, 37.0
    samples = []
    for i, length in enumerate([1, 9, 3, 6]):
        ids = torch.randint(3, 1000, (4 + i + length,), generator=g).tolist()
        samples.append(spiral.Sample(ids[:4 + i], ids[4 + i:], [], advantage=[1.0, -0.5, 0.75, 2.0][i], role="search"))
    with torch.no_grad():  # sampler log-probs near the learner's, so the ratio is not 1 but not huge either
        for s in samples:
            lp = completion_logprobs(model, TokenBatch.from_samples([s], 0, "cpu"), T)[0]
            s.sampler_logprobs = (lp + 0.2 * torch.randn(lp.shape, generator=g)).tolist()
    model.train()
    model.zero_grad(set_to_none=True)
    metrics = train.accumulate_gradients(model, samples, loss_normalizer=C, temperature=T, micro_batch_tokens=10**4)
    fast = [p.grad.clone() for p in lora.lora_parameters(model)]
    model.zero_grad(set_to_none=True)
    slow_loss = _slow_loss(model, samples, C, T)
    slow_loss.backward()
    slow = [p.grad.clone() for p in lora.lora_parameters(model)]
    assert metrics["train/loss"] == pytest.approx(slow_loss.item(), rel=1e-4)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_logprobs_of_an_absolute_position_model_equal_its_unpadded_forward():
    """Bug: position ids cumsum(mask) instead of cumsum(mask) - 1. Qwen3's RoPE only sees relative positions, so a
    shift is invisible there; GPT-2's learned absolute positions are not. Each sample alone, unpadded, with the
    model's own default positions 0..T-1, is the reference."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    g = torch.Generator().manual_seed(1)
    samples = [spiral.Sample(torch.randint(1, 64, (p,), generator=g).tolist(),
                             torch.randint(1, 64, (c,), generator=g).tolist(), [], 1.0, "search")
               for p, c in [(3, 5), (6, 2), (1, 4)]]  # different lengths: padding is exercised
    with torch.no_grad():
        fast, _ = completion_logprobs(model, TokenBatch.from_samples(samples, 0, "cpu"), 0.9)
        slow = []
        for s in samples:
            logits = model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0, :-1] / 0.9  # (T-1, V)
            logp = torch.log_softmax(logits, -1)[len(s.prompt_ids) - 1:]  # (L, V)
            slow.append(logp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1))
    torch.testing.assert_close(fast, torch.cat(slow), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# The loop: --temperature reaches the learner's log-probs; |B| counts problems kept when one is skipped


def test_loop_uses_the_temperature_and_counts_kept_problems(tmp_path, monkeypatch):
    """Bugs: train_step called without temperature=cfg.temperature (every other loop test runs at T = 1); C built
    from problems_drawn. At T = 0.5 the learner's log-probs equal the sampler's (importance ratio 1 within fp32),
    and in a step where a problem gave no signal, C = kept x budget."""
    def grade(text, gold):  # problems with gold 0 or 2 always score 0 (skipped); others pseudo-randomly
        return 0.0 if gold in ("0", "2") else float(zlib.crc32(text.encode()) % 2)

    monkeypatch.setattr(spiral, "reward", grade)
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(5)))
    out = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--model", "tiny", "--data", str(data), "--out", str(out), "--steps", "2",
                       "--batch-problems", "2", "--num-search", "4", "--set-size", "2", "--num-sets", "2",
                       "--num-aggregations", "3", "--max-new-tokens", "6", "--temperature", "0.5", "--no-plot"]) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    budget = (4 + 2 * 3) * 6
    assert any(r["problems_drawn"] > r["problems_kept"] >= 1 for r in rows)  # a problem was skipped inside a step
    for r in rows:
        assert r["train/loss_normalizer"] == r["problems_kept"] * budget
        assert 1 - 1e-3 < r["train/importance_ratio_min"] <= r["train/importance_ratio_max"] < 1 + 1e-3


# ----------------------------------------------------------------------------------------------------------------------
# The collector: dynamic sampling and K != N2


def _fake_generate(good):
    """Search trace j of problem x is right iff j in good[x]; aggregation sample i of a prompt is right iff
    i < (right candidates in the prompt) x `per_good` (so a set may be constant inside or not)."""
    per_good = {}

    def generate(model, tokenizer, prompts, *, samples_per_prompt, **kwargs):
        rows = []
        for prompt in prompts:
            if prompt.startswith("You are given a problem"):
                right = prompt.count("RIGHT") * per_good["n"]
                texts = [f"\\boxed{{{int(i < right)}}}" for i in range(samples_per_prompt)]
            else:
                x = prompt.split("\n")[0]
                texts = [f"{'RIGHT' if j in good[x] else 'WRONG'} \\boxed{{{int(j in good[x])}}}"
                         for j in range(samples_per_prompt)]
            rows.append([Completion([3, 4], [5 + k] * (1 + k % 3), [-1.0] * (1 + k % 3), t, False, [0.5] * (1 + k % 3))
                         for k, t in enumerate(texts)])
        return rows
    return generate, per_good


@pytest.fixture
def scripted(monkeypatch):
    def setup(good, per_good, sets=None):
        generate, knob = _fake_generate(good)
        knob["n"] = per_good
        monkeypatch.setattr(spiral, "generate", generate)
        monkeypatch.setattr(spiral, "reward", lambda text, gold: float(text.endswith(f"\\boxed{{{gold}}}")))
        drawn = []
        real = spiral.sample_sets

        def recording(*args, **kwargs):
            drawn.append(np.array(sets.pop(0)) if sets else real(*args, **kwargs))
            return drawn[-1]
        monkeypatch.setattr(spiral, "sample_sets", recording)
        return drawn
    return setup


def test_dynamic_sampling_keeps_a_problem_whose_only_signal_is_set_rl(scripted):
    """Bug: keeping a problem only if some aggregation advantage is non-zero. Here every set's N2 = 3 aggregation
    traces agree (all right with a right candidate, all wrong without), but the two sets differ: the aggregation
    advantages are all 0, the search traces' set-RL advantages are +-1/2, and the problem must be kept."""
    scripted({"x": {0}}, per_good=3, sets=[[[0, 1], [2, 3]]])
    queue = [Problem("x", "1")]
    out = spiral.collect_spiral(None, None, lambda: queue.pop(0), batch_problems=1, num_search=4, set_size=2,
                                num_sets=2, num_aggregations=3, max_new_tokens=8, rng=np.random.default_rng(0),
                                max_draws=1)
    assert out.metrics["problems_kept"] == 1
    assert [s.advantage for s in out.samples if s.role == "search"] == [0.5, 0.5, -0.5, -0.5]
    assert [s.advantage for s in out.samples if s.role == "aggregation"] == [0.0] * 6


def test_collector_with_K_not_N2_gives_each_sample_its_advantage(scripted):
    """Bugs: slicing the flat aggregation rows per problem by N2 instead of K, or reshaping rewards to (N2, K). Two
    problems in one round, N1 = 5, n = 2, K = 3, N2 = 2; every advantage recomputed with plain loops."""
    good = {"a": {0, 3}, "b": {1, 2, 4}}
    drawn = scripted(good, per_good=1)
    queue = [Problem("a", "1"), Problem("b", "1")]
    N1, n, K, N2 = 5, 2, 3, 2
    out = spiral.collect_spiral(None, None, lambda: queue.pop(0), batch_problems=2, num_search=N1, set_size=n,
                                num_sets=K, num_aggregations=N2, max_new_tokens=8, rng=np.random.default_rng(3),
                                max_draws=2)
    assert out.metrics["problems_kept"] == 2 and len(out.samples) == 2 * (N1 + K * N2)
    expected = []
    for x, sets_K_n in zip("ab", drawn):
        right_K = [sum(j in good[x] for j in G) for G in sets_K_n]
        rewards = [[float(i < right) for i in range(N2)] for right in right_K]  # (K, N2)
        f = [sum(r) / N2 for r in rewards]
        set_adv = [fl - sum(f) / K for fl in f]
        for j in range(N1):
            member = [set_adv[l] for l, G in enumerate(sets_K_n) if j in G]
            expected.append(("search", sum(member) / len(member) if member else 0.0, None))
        expected += [("aggregation", r - f[l], r) for l in range(K) for r in rewards[l]]
    assert len({tuple(map(tuple, s)) for s in drawn}) == 2  # the two problems drew different sets
    got = [(s.role, s.advantage, s.reward) for s in out.samples]
    assert [g[0] for g in got] == [e[0] for e in expected] and [g[2] for g in got] == [e[2] for e in expected]
    np.testing.assert_allclose([g[1] for g in got], [e[1] for e in expected], atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# LoRA: alpha != r, rsLoRA


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(5, 4)

    def forward(self, x):
        return self.q_proj(x)


def test_lora_forward_scales_by_alpha_over_r_and_rslora_loads_with_alpha_over_sqrt_r(tmp_path):
    """Bugs: scaling alpha, r / alpha or alpha / sqrt(r) for plain LoRA (every preset has alpha = r); rsLoRA adapters
    loaded with alpha / r. Forward against W x + b + s B A x by hand, s = 6/3 and 6/sqrt(3)."""
    torch.manual_seed(0)
    model = _Toy()
    W, b = model.q_proj.weight.detach().clone(), model.q_proj.bias.detach().clone()
    lora.add_lora(model, rank=3, alpha=6.0, target_modules=["q_proj"])
    with torch.no_grad():
        model.q_proj.lora_B["default"].weight.normal_()
    A, B = model.q_proj.lora_A["default"].weight.detach(), model.q_proj.lora_B["default"].weight.detach()
    x = torch.randn(7, 5)
    torch.testing.assert_close(model(x), x @ W.T + b + (6.0 / 3) * (x @ A.T @ B.T))

    lora.save_adapter(model, str(tmp_path / "ad"), "toy")
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert config["r"] == 3 and config["lora_alpha"] == 6
    config["use_rslora"] = True
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps(config))
    fresh = _Toy()
    with torch.no_grad():
        fresh.q_proj.weight.copy_(W)
        fresh.q_proj.bias.copy_(b)
    lora.load_adapter(fresh, str(tmp_path / "ad"))
    assert fresh.q_proj.scaling["default"] == pytest.approx(6.0 / math.sqrt(3))
    torch.testing.assert_close(fresh(x), x @ W.T + b + (6.0 / math.sqrt(3)) * (x @ A.T @ B.T))


# ----------------------------------------------------------------------------------------------------------------------
# Test time: majority@k's random subsets, evaluate.py's values


def test_majority_random_subsets_hold_distinct_samples():
    """Bug: rng.choice(..., replace=True). With 12 different answers every k-subset of distinct samples is a k-way
    tie; a subset that repeats a sample elects it. C(12, 3) = 220 > 32 subsets: the random branch."""
    answers, correct = [str(i) for i in range(12)], [True] + [False] * 11
    result = testtime.majority_at_k(answers, correct, [3], rng=np.random.default_rng(0), num_subsets=32,
                                    equivalent=lambda a, b: a == b)[3]
    assert result["votes"] == 32 and result["ties"] == 32


class _ScriptedSampler:
    """evaluate.Sampler's interface with known traces: search trace j of a problem is right iff j < right[problem];
    an RSA aggregation trace is right iff its prompt's digest is even. Records what it returned."""

    def __init__(self, answers, right):
        self.answers, self.right, self.aggregated = answers, right, []

    def search(self, problems, count, max_new_tokens):
        return [[evaluate.Trace(f"\\boxed{{{self.answers[p] if j < self.right[p] else 'no'}}}", 3, 5, False)
                 for j in range(count)] for p in problems]

    def aggregate(self, step, prompts_run, max_new_tokens):
        out = []
        for prompts in prompts_run:
            answer = re.search(r"What is (\d+)", prompts[0]).group(1)
            gold = str(2 * int(answer))
            row = [evaluate.Trace(f"\\boxed{{{gold if zlib.crc32(p.encode()) % 2 == 0 else 'no'}}}", 2, 9, False)
                   for p in prompts]
            self.aggregated.append((step, gold, [t.text for t in row]))
            out.append(row)
        return out


def test_evaluate_policy_reports_the_unbiased_pass_at_k_and_each_rsa_step_s_population_mean():
    """Bugs: pass@k as c/n or from the first k samples, RSA pass@1 of the wrong step or of another problem's
    population. Values through evaluate_policy against 1 - C(n-c, k)/C(n, k) and the recorded populations."""
    problems = [Problem(f"What is {a} + {a}?", str(2 * a), id=str(a)) for a in (1, 2, 3)]
    right = {p.problem: c for p, c in zip(problems, [1, 4, 0])}
    sampler = _ScriptedSampler({p.problem: p.answer for p in problems}, right)
    cfg = SimpleNamespace(methods=["passk", "rsa"], num_samples=6, k_list=[1, 2, 4, 6], max_new_tokens=8,
                          majority_max_new_tokens=8, rsa_populations=[4], rsa_set_size=2, rsa_steps=3, seed=0,
                          max_tokens_list=[8], majority_subsets=32)
    records = evaluate.evaluate_policy(problems, sampler, cfg)
    for record, p in zip(records, problems):
        c = right[p.problem]
        for k in cfg.k_list:
            exact = 1 - Fraction(math.comb(6 - c, k), math.comb(6, k))
            assert record["pass_at_k"][k] == pytest.approx(float(exact), abs=1e-12)
        steps = record["rsa"][4]
        assert steps[0]["pass_at_1"] == min(c, 4) / 4  # step 1: the first P = 4 search traces
        for t in (2, 3):
            (texts,) = [texts for step, gold, texts in sampler.aggregated if step == t and gold == p.answer]
            assert steps[t - 1]["pass_at_1"] == sum(x == f"\\boxed{{{p.answer}}}" for x in texts) / 4
    later = [s["pass_at_1"] for r in records for s in r["rsa"][4][1:]]
    assert 0 < np.mean(later) < 1 and len(set(later)) > 1  # the scripted populations are mixed, so the test can fail
    summary = evaluate.summarize(records, cfg)
    assert summary["passk"]["pass_at_k"] == pytest.approx(
        [np.mean([r["pass_at_k"][k] for r in records]) for k in cfg.k_list])
    assert summary["rsa"][0]["pass_at_1"] == pytest.approx(
        [np.mean([r["rsa"][4][t]["pass_at_1"] for r in records]) for t in range(3)])
