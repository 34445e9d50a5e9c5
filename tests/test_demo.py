"""The CPU demo: the tiny task has the properties SPIRAL needs, the warm start that ships in
data/tiny_warmstart/ is reproducible, and `python train.py --preset tiny` visibly learns (slow; CI runs it)."""

import json
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import problemset

import rollout
import train
import checkpoint
import reward
import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tiny_task_is_graded_by_the_real_reward():
    problems = problemset.load_problems("tiny_sums")
    assert len(problems) == 100 and len({p.problem for p in problems}) == 100
    assert problems == problemset.load_problems("tiny_sums")  # deterministic
    assert sorted(p.problem for p in problems) == sorted(f"What is {a} + {b}?" for a in range(10) for b in range(10))
    assert len({p.problem.split()[2] for p in problems[:20]}) >= 5  # shuffled: --limit 20 sees many first digits
    p = next(p for p in problems if p.problem == "What is 3 + 7?")
    assert p.answer == "10" and p.id == "sum-3-7"
    assert reward.reward(tiny.tiny_trace(p.problem, "10"), p.answer) == 1.0
    assert reward.reward(tiny.tiny_trace(p.problem, "11"), p.answer) == 0.0
    assert reward.reward(tiny.tiny_trace(p.problem, "10")[:-1], p.answer) == 0.0  # unclosed \boxed{: no answer


def test_shipped_warm_start_matches_the_code():
    """data/tiny_warmstart/ must be what tiny.warm_start writes: same tokenizer as tiny.build_tiny_tokenizer and
    the same architecture as tiny.build_tiny_model (regenerate it with --warm-start-only if either changes)."""
    model, tokenizer = rollout.load_policy(tiny.WARM_START_DIR, device="cpu")
    fresh_tokenizer = tiny.build_tiny_tokenizer()
    assert tokenizer.get_vocab() == fresh_tokenizer.get_vocab()
    message = rollout.aggregation_prompt("What is 3 + 5?", [tiny.tiny_trace("What is 3 + 5?", "8")] * 4)
    assert rollout.chat_prompt_ids(tokenizer, message) == rollout.chat_prompt_ids(fresh_tokenizer, message)
    fresh = tiny.build_tiny_model(fresh_tokenizer)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in fresh.state_dict().items()}
    with open(os.path.join(tiny.WARM_START_DIR, "warm_start.json")) as f:
        recipe = json.load(f)["recipe"]
    assert recipe["steps"] == 700 and recipe["seed"] == 0  # tiny.warm_start's defaults, as --warm-start-only runs it


def test_warm_start_is_deterministic(tmp_path, one_thread):
    """Two short runs of the warm-start script give bit-identical weights (the full run is the same code, longer)."""
    for name in ("a", "b"):
        tiny.warm_start(str(tmp_path / name), steps=3, batch_size=8, progress=False)
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    initial = tiny.build_tiny_model(tiny.build_tiny_tokenizer()).state_dict()
    assert not all(torch.equal(a[k], initial[k]) for k in a)  # it did train
    model, tokenizer = rollout.load_policy(str(tmp_path / "a"), device="cpu")  # a loadable model directory
    assert tokenizer.padding_side == "left" and tokenizer.eos_token == "<|im_end|>"


def test_warm_start_only_flag(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(tiny, "warm_start", lambda out, seed: calls.append((out, seed)))
    assert train.main(["--preset", "tiny", "--warm-start-only"]) == 2  # the shipped warm start only when named
    assert f"--out {os.path.relpath(tiny.WARM_START_DIR)}" in capsys.readouterr().err
    assert train.main(["--preset", "tiny", "--warm-start-only", "--out", tiny.WARM_START_DIR]) == 0
    assert train.main(["--preset", "tiny", "--warm-start-only", "--out", str(tmp_path), "--seed", "3"]) == 0
    assert calls == [(tiny.WARM_START_DIR, 0), (str(tmp_path), 3)]
    assert train.main(["--warm-start-only"]) == 2 and "--preset tiny" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    assert train.main(["--preset", "tiny", "--warm-start-only", "--out", str(mine)]) == 2
    assert "not a warm start" in capsys.readouterr().err and (mine / "notes.txt").read_text() == "a user's file"
    assert len(calls) == 2  # refused before any work


def _majority_accuracy(answers: list, gold: str, set_size: int) -> float:
    """Exact expected majority@set_size over all subsets of `answers`, ties broken uniformly at random."""
    from itertools import combinations

    scores = []
    for subset in combinations(answers, set_size):
        counts = Counter(a for a in subset if a is not None)
        if not counts:
            scores.append(0.0)
            continue
        top = max(counts.values())
        best = [a for a, c in counts.items() if c == top]
        scores.append(float(gold in best) / len(best))
    return float(np.mean(scores))


def test_warm_start_has_the_properties_spiral_needs(one_thread):
    """(a) clearly non-zero but imperfect accuracy; (b) independent samples make different mistakes, so majority@4
    beats one sample by a wide margin; and the aggregator copies candidates (about as accurate as one trace)."""
    model, tokenizer = rollout.load_policy(tiny.WARM_START_DIR, device="cpu")
    problems = problemset.load_problems("tiny_sums")
    torch.manual_seed(0)
    search = rollout.generate(model, tokenizer, [rollout.search_prompt(p.problem) for p in problems],
                              samples_per_prompt=8, max_new_tokens=12)
    answers = [[reward.extract_answer(c.text) for c in row] for row in search]
    single = np.mean([[a == p.answer for a in row] for p, row in zip(problems, answers)])
    majority = np.mean([_majority_accuracy(row, p.answer, 4) for p, row in zip(problems, answers)])
    assert 0.2 <= single <= 0.6  # measured 0.34
    assert majority >= single + 0.07  # measured 0.46; if mistakes agreed, voting would gain little or lose

    rng = np.random.default_rng(0)
    sets = [rng.choice(8, size=4, replace=False) for _ in problems]
    prompts = [rollout.aggregation_prompt(p.problem, [row[j].text for j in s])
               for p, row, s in zip(problems, search, sets)]
    aggregated = rollout.generate(model, tokenizer, prompts, samples_per_prompt=2, max_new_tokens=12)
    agg_answers = [[reward.extract_answer(c.text) for c in row] for row in aggregated]
    aggregation = np.mean([[a == p.answer for a in row] for p, row in zip(problems, agg_answers)])
    copied = np.mean([[a in {answers[i][j] for j in s} for a in row]
                      for i, (row, s) in enumerate(zip(agg_answers, sets))])
    assert copied >= 0.6  # measured 0.81: the copy skill RL builds on
    assert abs(aggregation - single) <= 0.15  # measured 0.39: starts about as good as one trace; the rise is RL's


@pytest.mark.slow
def test_tiny_preset_learns(tmp_path):
    """`python train.py --preset tiny` logs search and aggregation accuracy at every step once, and averaged
    over the first vs the last 10% of steps aggregation accuracy rises by at least 0.2, ending above search accuracy.
    Fixed seed: the run is deterministic. (Its wall time, ~3 minutes on 2 cores, is printed, not asserted: timing
    goals belong in benchmarks, not in tests.)"""
    out = tmp_path / "run"
    start = time.monotonic()
    result = subprocess.run([sys.executable, "train.py", "--preset", "tiny", "--seed", "0", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=1200)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    rows = checkpoint.read_metrics(str(out / "metrics.jsonl"))
    steps = train.resolve_config({"preset": "tiny"}).steps
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step exactly once
    k = max(1, steps // 10)
    first = {key: np.mean([r[key] for r in rows[:k]]) for key in ("search_accuracy", "aggregation_accuracy")}
    last = {key: np.mean([r[key] for r in rows[-k:]]) for key in ("search_accuracy", "aggregation_accuracy")}
    print(f"wall {elapsed:.0f} s; first 10%: {first}; last 10%: {last}")
    assert last["aggregation_accuracy"] - first["aggregation_accuracy"] >= 0.2
    assert last["aggregation_accuracy"] > last["search_accuracy"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "metrics.png").stat().st_size > 0
