"""The second CPU task (tiny_parts.py): generator and grader, the noisy solver and the plurality
aggregator it imitates, the shipped files, the warm start's measured property (a set knows more than a trace), and
a short run of each algorithm on `--preset tiny_parts`."""

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import reward
import problemset
import rollout
import tiny_parts
import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_problems_are_deterministic_distinct_carry_free_and_graded_by_the_reward():
    problems = tiny_parts.parts_problems()
    assert problems == tiny_parts.parts_problems() and len({p.id for p in problems}) == len(problems) == 1000
    for p in problems:
        a, b = p.problem.removeprefix("What is ").removesuffix("?").split(" + ")
        assert len(a) == len(b) == tiny_parts.DIGITS and a[0] != "0" and b[0] != "0"
        assert all(int(x) + int(y) <= 9 for x, y in zip(a, b))  # no carry: each digit of the answer is one part
        assert p.answer == str(int(a) + int(b)) and p.id == f"parts-{a}-{b}"
    assert len({p.problem[8] for p in problems[:20]}) >= 5  # a spread of first digits within --limit 20
    gold = problems[0].answer
    assert reward.reward(tiny_parts.parts_trace(problems[0].problem, gold), gold) == 1.0
    wrong = gold[:2] + str((int(gold[2]) + 1) % 10)
    assert reward.reward(tiny_parts.parts_trace(problems[0].problem, wrong), gold) == 0.0  # one wrong part: wrong
    assert reward.reward(tiny_parts.parts_trace(problems[0].problem, gold[::-1]), gold) == float(gold == gold[::-1])  # order matters


def test_shipped_problem_file_is_the_generator_output():
    assert problemset.load_problems(tiny_parts.PROBLEMS_FILE) == tiny_parts.parts_problems()
    with open(tiny_parts.PROBLEMS_FILE, encoding="utf-8") as f:
        shipped = f.read()
    assert json.loads(shipped.splitlines()[0]) == {"problem": "What is 643 + 111?", "answer": "754",
                                                   "id": "parts-643-111"}


def test_noisy_solver_gets_each_digit_right_independently_and_errs_uniformly():
    rng = np.random.default_rng(0)
    answers = [tiny_parts.noisy_parts_answer("754", rng, 0.6) for _ in range(20000)]
    right_D = np.array([[a[i] == "754"[i] for i in range(3)] for a in answers])  # (20000, 3)
    assert np.allclose(right_D.mean(0), 0.6, atol=0.015)
    assert abs(right_D.all(1).mean() - 0.6**3) < 0.015  # independent parts: a whole trace is right 0.216 of the time
    wrong_last = Counter(a[2] for a in answers if a[2] != "4")
    assert sorted(wrong_last) == [d for d in "012356789"]  # every other digit
    assert max(wrong_last.values()) / min(wrong_last.values()) < 1.25  # uniformly


def _plurality_slow(answers, position):
    counts = {d: sum(a[position] == d for a in answers) for d in "0123456789"}
    return {d for d, c in counts.items() if c == max(counts.values())}


def test_plurality_aggregator_takes_each_part_from_the_candidates_that_agree():
    rng = np.random.default_rng(1)
    assert tiny_parts.plurality_parts(["154", "724", "750", "954"], rng) == "754"  # right part from each
    for _ in range(300):
        answers = [tiny_parts.noisy_parts_answer("754", rng, 0.5) for _ in range(4)]
        out = tiny_parts.plurality_parts(answers, rng)
        assert all(out[i] in _plurality_slow(answers, i) for i in range(3))
    ties = Counter(tiny_parts.plurality_parts(["12", "34"], rng) for _ in range(400))
    assert set(ties) == {"12", "14", "32", "34"}  # ties broken at random, per part


def test_tokenizer_makes_each_part_one_token():
    tokenizer = tiny_parts.build_parts_tokenizer()
    pieces = [tokenizer.decode([i]) for i in tokenizer(tiny_parts.parts_trace("What is 352 + 416?", "768"), add_special_tokens=False)
              ["input_ids"]]
    assert pieces[-4:] == ["7", "6", "8", "}"]
    prompt = tokenizer.decode(rollout.chat_prompt_ids(tokenizer, rollout.search_prompt("What is 352 + 416?")))
    assert "What is 352 + 416?" in prompt


def test_shipped_warm_start_matches_the_code():
    model, tokenizer = rollout.load_policy(tiny_parts.WARM_START_DIR, device="cpu")
    fresh = tiny_parts.build_parts_tokenizer()
    message = rollout.aggregation_prompt("What is 352 + 416?", [tiny_parts.parts_trace("What is 352 + 416?", "768")] * 4)
    assert rollout.chat_prompt_ids(tokenizer, message) == rollout.chat_prompt_ids(fresh, message)
    with open(os.path.join(tiny_parts.WARM_START_DIR, "warm_start.json")) as f:
        recipe = json.load(f)["recipe"]
    assert recipe["task"] == "tiny_parts" and recipe["steps"] == 400 and recipe["seed"] == 0 and \
        recipe["p_digit"] == 0.6  # tiny_parts.warm_start's defaults, as `python tiny_parts.py` runs it


def test_warm_start_is_deterministic(tmp_path, one_thread):
    for name in ("a", "b"):
        tiny_parts.warm_start(str(tmp_path / name), steps=2, batch_size=8, progress=False)
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_refuses_a_directory_that_is_not_a_warm_start(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("a user's file")
    assert tiny_parts.main(["--out", str(tmp_path)]) == 2
    assert "not a warm start" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "a user's file"
    with pytest.raises(SystemExit) as exit_info:
        tiny_parts.main(["--seed", "x"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1  # one line, no usage block


def test_warm_start_set_knows_more_than_a_trace(one_thread):
    """The property the task exists for, measured on the shipped warm start (fixed problems and seed)."""
    model, tokenizer = rollout.load_policy(tiny_parts.WARM_START_DIR, device="cpu")
    m = tiny_parts.measure(model, tokenizer, tiny_parts.parts_problems()[:60], samples=8, set_size=4, seed=0)
    assert m["single"] < 0.45  # hard for one trace
    assert m["any_right"] > m["single"] + 0.2  # a set of 4 often holds a right trace
    assert m["parts_right"] > m["any_right"] + 0.1  # and more often holds every part somewhere
    assert m["majority"] > m["single"] + 0.15  # majority@8: the right answer is the most frequent one
    assert m["aggregation"] > m["single"] + 0.15  # the aggregator combines parts


@pytest.mark.parametrize("algo, arm", [("spiral", "set"), ("grpo", "set"), ("spiral", "own")])
def test_preset_trains_a_few_steps(algo, arm, tmp_path, one_thread, capsys):
    cfg = train.resolve_config({"preset": "tiny_parts", "algo": algo})
    assert cfg.model == tiny_parts.WARM_START_DIR and cfg.data == tiny_parts.PROBLEMS_FILE
    assert train.token_budget_per_problem(cfg) == 384  # equal budget: (8 + 16) x 16 = 12 x 32
    out = tmp_path / algo
    assert train.main(["--preset", "tiny_parts", "--algo", algo, "--steps", "2", "--batch-problems", "2",
                       "--out", str(out), "--no-plot", *(["--search-advantage", arm] if arm == "own" else [])]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and (out / "adapter" / "adapter_model.safetensors").is_file()
    assert rows[0]["token_budget_per_problem"] == 384
    assert json.loads((out / "config.json").read_text())["search_advantage"] == arm
    printed = capsys.readouterr().out
    assert "at most " + ("(8 + 4 x 4) x 16" if algo == "spiral" else "12 x 32") + " = 384 completion tokens" in printed
    mean = sum(r["tokens_per_problem"] for r in rows) / 2
    assert f"tokens generated per drawn problem, mean over steps 1-2: {mean:.0f}" in printed
    if algo == "spiral":  # search and aggregation apart, and they add up
        assert all(r["tokens_per_problem_search"] + r["tokens_per_problem_aggregation"] == pytest.approx(
            r["tokens_per_problem"]) and r["tokens_per_problem_search"] > 0 for r in rows)


def test_benchmark_table_reports_mean_spread_and_range_over_seeds():
    import importlib.util

    spec = importlib.util.spec_from_file_location("second_task", os.path.join(REPO, "benchmarks", "second_task.py"))
    second_task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(second_task)

    def summary(x):  # every metric of a policy equal to x
        return {"passk": {"k": [1, 2, 4, 8], "pass_at_k": [x] * 4}, "majority": {"k": [1, 2, 4, 8], "accuracy": [x] * 4},
                "rsa": [{"population": 4, "pass_at_1": [x] * 3}]}

    values = {"base": 0.2, "grpo-s0": 0.9, "grpo-s1": 0.8, "spiral-s0": 0.5, "spiral-s1": 0.7}
    results = {"policies": {name: {"summary": summary(x)} for name, x in values.items()}}
    markdown, cells = second_task.table(results, [0, 1])
    assert cells["grpo"]["pass@1"] == [0.9, 0.8] and cells["spiral"]["RSA P=4 step 3"] == [0.5, 0.7]
    rows = markdown.splitlines()
    assert rows[2].startswith("| warm start | 0.200 |")
    assert "0.850 ± 0.071 [0.800, 0.900]" in rows[3] and "0.600 ± 0.141 [0.500, 0.700]" in rows[4]


# ----------------------------------------------------------------------------------------------------------------------
# measure() and the warm start's loss and aggregation target, against bugs a careful engineer could make


def test_measure_counts_each_figure_as_its_docstring_defines(monkeypatch):
    """Made-up traces with known answers: a tie that holds the answer is half a win, a set's parts may come from
    different traces, sets are consecutive and disjoint, and an aggregation trace is graded against its own problem."""
    p1, p2 = problemset.Problem("What is 352 + 402?", "754"), problemset.Problem("What is 210 + 111?", "321")
    pools = {p1.problem: ["754", "754", "154", "724", "750", "954", "954", "111"],  # 754 and 954 tie at 2 votes
             p2.problem: ["321", "321", "321", "999", "999", "999", "999", None]}  # None: no \boxed{} answer
    aggregated = ["754", "954", "321", "321"]  # one per set: (p1, traces 0-3), (p1, 4-7), (p2, 0-3), (p2, 4-7)
    text = lambda problem, a: "no answer" if a is None else tiny_parts.parts_trace(problem, a)  # noqa: E731
    calls = []

    def fake_generate(model, tokenizer, prompts, *, samples_per_prompt, max_new_tokens):
        calls.append((len(prompts), samples_per_prompt))
        if samples_per_prompt > 1:
            return [[rollout.Completion([], [], [], text(p, a), False) for a in pools[p]]
                    for p in (next(q for q in pools if q in prompt) for prompt in prompts)]
        return [[rollout.Completion([], [], [], text("What is 1 + 1?", a), False)] for a in aggregated]

    monkeypatch.setattr(rollout, "generate", fake_generate)
    m = tiny_parts.measure(None, None, [p1, p2], samples=8, set_size=4)
    assert calls == [(2, 8), (4, 1)]
    # right digits per trace: p1 3,3,2,2,2,2,2,0; p2 3,3,3,0,0,0,0,0 (None: no answer)
    assert m == {"single": 5 / 16,  # 2 + 3 right traces of 16
                 "digit": (16 + 9) / 48,
                 "majority": (0.5 + 0.0) / 2,  # p1: a two-way tie holding the answer; p2: 999 wins
                 "any_right": 2 / 4,  # the first set of each problem holds a right trace
                 "parts_right": 3 / 4,  # p1's second set: 7 from 750, 5 from 750/954, 4 from 954; p2's second: none
                 # per-position plurality: p1's first set 754 outright; its second (750 954 954 111): 9 beats 7;
                 # p2's first 321; its second (999 999 999 ''): 999
                 "plurality": (1 + 0 + 1 + 0) / 4,
                 "aggregation": 3 / 4}


def test_plurality_chance_is_the_mean_over_tie_breaks_of_plurality_parts():
    """_plurality_right (exact: 1/(digits tied) per position) against plurality_parts' random tie-breaks counted."""
    assert tiny_parts._plurality_right(["154", "724", "750", "954"], "754") == 1.0
    assert tiny_parts._plurality_right(["12", "34"], "14") == 0.25  # two 2-way ties
    assert tiny_parts._plurality_right(["12", "12", "34"], "34") == 0.0
    assert tiny_parts._plurality_right(["9", "12", "", "12"], "12") == 1.0  # other lengths ignored
    rng = np.random.default_rng(0)
    for _ in range(20):
        answers = [tiny_parts.noisy_parts_answer("754", rng, 0.4) for _ in range(4)]
        counted = np.mean([tiny_parts.plurality_parts(answers, rng) == "754" for _ in range(2000)])
        assert abs(counted - tiny_parts._plurality_right(answers, "754")) < 0.035


@pytest.mark.parametrize("task", list(tiny_parts.TASKS.values()), ids=list(tiny_parts.TASKS))
def test_training_and_heldout_splits_are_disjoint_and_shipped_as_generated(task):
    """Each task trains on one split and is evaluated on another: no problem text in both; the shipped files are
    the generator's output byte for byte; train.py's preset reads the training split, evaluate.py's the held-out."""
    import evaluate

    train_split = problemset.load_problems(task.problems_file)
    heldout = problemset.load_problems(task.heldout_file)
    assert len(train_split) == 1000 and len(heldout) == 200
    assert not {p.problem for p in train_split} & {p.problem for p in heldout}
    assert len({p.problem for p in heldout}) == 200
    assert all(len(p.answer) == task.digits for p in train_split + heldout)
    for path, split in ((task.problems_file, False), (task.heldout_file, True)):
        with open(path, encoding="utf-8") as f:
            assert f.read() == tiny_parts.problems_jsonl(task.digits, split)
    assert train.resolve_config({"preset": task.name}).data == task.problems_file
    assert evaluate.PRESETS[task.name]["data"] == task.heldout_file and evaluate.PRESETS[task.name]["model"] == \
        task.warm_start_dir == train.resolve_config({"preset": task.name}).model


def test_the_heldout_draw_skips_training_problems():
    """heldout_problems excludes the training ids (its seed alone would repeat some: 108,900 possible problems)."""
    train_ids = {p.id for p in tiny_parts.parts_problems()}
    plain = tiny_parts.parts_problems(5000, tiny_parts.HELDOUT_SEED)
    assert {p.id for p in plain} & train_ids  # the exclusion is needed
    assert [p for p in plain if p.id not in train_ids][:200] == tiny_parts.heldout_problems()


def test_search_credit_compares_both_line_13s_on_the_same_rollouts(monkeypatch):
    """A scripted world: search trace j writes answers[j] for every problem; an aggregation trace is right iff its
    set holds trace 0 (it writes 11). Problems "11" and "10" make the right digits differ by problem (k_j: 2,2,1,1,1,0,0,0 for
    "11"; 1,1,2,2,2,1,1,1 for "10"), so the score's P(right) is the mean over every trace of every problem. Both arms'
    figures are recomputed with plain loops."""
    from advantages import spiral_advantages

    answers = ["11", "11", "10", "10", "10", "00", "00", "00"]

    def fake_generate(model, tokenizer, prompts, *, samples_per_prompt, max_new_tokens):
        if samples_per_prompt == 8:
            return [[rollout.Completion([], [], [], f"t{j} \\boxed{{{a}}}", False) for j, a in enumerate(answers)]
                    for _ in prompts]
        return [[rollout.Completion([], [], [], "\\boxed{11}" if "t0 " in prompt else "\\boxed{0}", False)] * 4
                for prompt in prompts]

    monkeypatch.setattr(rollout, "generate", fake_generate)
    golds = ["11", "10", "11"]
    problems = [problemset.Problem(f"What is {g}?", g) for g in golds]
    out = tiny_parts.search_credit(None, None, problems, seed=0)
    right_P_N1 = np.array([[sum(x == y for x, y in zip(a, g)) for a in answers] for g in golds])  # (3, 8)
    assert out["traces_by_right_digits"] == np.bincount(right_P_N1.ravel(), minlength=3).tolist() == [6, 11, 7]
    rng = np.random.default_rng(0)
    expected = {"set": [], "own": []}
    for g in golds:
        sets = tiny_parts_sample_sets(rng)
        rewards_K_N2 = np.array([[float(0 in G and g == "11")] * 4 for G in sets])  # it writes 11: wrong for 10
        expected["set"].append(spiral_advantages(sets, rewards_K_N2=rewards_K_N2, N1=8)[0])
        r = np.array([float(a == g) for a in answers])
        expected["own"].append(r - r.mean())
    kbar = right_P_N1.mean()
    for arm, adv in expected.items():
        adv = np.array(adv)
        signal_P = [sum(adv[p, j] * (right_P_N1[p, j] - kbar) for j in range(8)) / 2 for p in range(3)]
        assert out[arm]["signal"] == pytest.approx(np.mean(signal_P))
        assert out[arm]["signal_sd"] == pytest.approx(np.std(signal_P, ddof=1))
        assert out[arm]["by_right_digits"][2] == pytest.approx(adv[right_P_N1 == 2].mean())
    assert out["own"]["by_right_digits"][2] == pytest.approx(np.mean([0.75] * 4 + [0.625] * 3))
    assert out["own"]["nonzero"] == 1.0


def test_measure_grades_a_digit_only_in_an_answer_of_the_right_length(monkeypatch):
    """"7540" holds 754's digits at their positions but is not a 3-digit answer: no digit of it counts, nor for the
    set's parts or plurality."""
    p = problemset.Problem("What is 352 + 402?", "754")

    def fake_generate(model, tokenizer, prompts, *, samples_per_prompt, max_new_tokens):
        if samples_per_prompt > 1:
            return [[rollout.Completion([], [], [], tiny_parts.parts_trace(p.problem, a), False)
                     for a in ["7540", "7540", "154", "111"]]]
        return [[rollout.Completion([], [], [], "x", False)]]

    monkeypatch.setattr(rollout, "generate", fake_generate)
    m = tiny_parts.measure(None, None, [p], samples=4, set_size=4)
    assert m["digit"] == pytest.approx(2 / 12) and m["parts_right"] == 0.0 and m["plurality"] == 0.0


def tiny_parts_sample_sets(rng):
    from setsample import sample_sets

    return sample_sets(8, 4, 4, rng=rng)


def test_warm_start_loss_is_the_mean_over_every_completion_token_of_the_batch(one_thread):
    """sft_backward (two forward passes, by role) equals one pass over the whole batch: -sum log pi / tokens, not
    a mean per example or per role; its gradient too."""
    from logprobs import TokenBatch, completion_logprobs

    tokenizer = tiny_parts.build_parts_tokenizer()
    model = tiny_parts.build_tiny_model(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = np.random.default_rng(0)
    examples = []
    for i in range(6):
        aggregation, problem, prompt, target = tiny_parts.training_example(rng, 0.6, 0.5, 4)
        completion = tokenizer(tiny_parts.parts_trace(problem, target), add_special_tokens=False)["input_ids"] + [eos]
        examples.append((aggregation, tiny_parts._SFTExample(rollout.chat_prompt_ids(tokenizer, prompt),
                                                             completion[: 4 + 2 * i])))  # lengths 4 to 14
    assert {a for a, _ in examples} == {True, False}
    model.zero_grad()
    loss = tiny_parts.sft_backward(model, examples, tokenizer.pad_token_id)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    batch = TokenBatch.from_samples([e for _, e in examples], tokenizer.pad_token_id, "cpu")
    logprobs = completion_logprobs(model, batch)[0]  # (tokens,)
    assert logprobs.numel() == sum(4 + 2 * i for i in range(6))
    naive = -logprobs.sum() / logprobs.numel()
    naive.backward()
    assert loss == pytest.approx(naive.item(), rel=1e-5)
    for g, p in zip(grads, model.parameters()):
        assert torch.allclose(g, p.grad, rtol=1e-4, atol=1e-7)


def test_warm_start_aggregation_target_is_the_per_digit_plurality_of_its_candidates():
    import re

    rng = np.random.default_rng(3)
    seen = Counter()
    for _ in range(400):
        aggregation, problem, prompt, target = tiny_parts.training_example(rng, 0.5, 0.5, 4)
        a, b = problem.removeprefix("What is ").removesuffix("?").split(" + ")
        gold = str(int(a) + int(b))
        if not aggregation:
            assert prompt == rollout.search_prompt(problem) and len(target) == len(gold)
            seen["search"] += 1
            continue
        candidates = re.findall(r"\\boxed\{(\d+)\}", prompt)
        assert len(candidates) == 4 and prompt == rollout.aggregation_prompt(
            problem, [tiny_parts.parts_trace(problem, c) for c in candidates])
        assert all(target[i] in _plurality_slow(candidates, i) for i in range(3))
        seen["aggregation"] += 1
        seen["target is not candidate 0"] += target != candidates[0]
    assert seen["search"] > 150 and seen["aggregation"] > 150
    assert seen["target is not candidate 0"] > 50  # the plurality is often no single candidate's answer


def test_warm_start_reports_its_progress_in_a_log_file(tmp_path, monkeypatch, capsys, one_thread):
    import figures

    progress = figures.Progress
    monkeypatch.setattr(tiny_parts, "Progress", lambda *a, **k: progress(*a, **{**k, "every_s": 0}))
    tiny_parts.warm_start(str(tmp_path / "w"), steps=2, batch_size=4)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tiny_parts.py")]
    assert [line.split(" (")[0] for line in lines] == ["tiny_parts.py: warm start: 1/2 steps",
                                                       "tiny_parts.py: warm start: 2/2 steps"]
    assert all(", loss " in line for line in lines)


def test_noisy_solver_credit_meets_the_closed_form_of_the_own_reward_arm():
    """For the noisy solver, E[sum_j (r_j - rbar)(k_j - kbar)] / D = (N1 - 1) Cov(r, k) / D = (N1 - 1) p^D (1 - p):
    only a wholly right trace (probability p^D, k = D) has r = 1. Set RL credits partial traces: its mean advantage
    rises with the right digits, and it gives signal on more problems than own's while traces are mostly wrong."""
    for digits, p in ((3, 0.6), (6, 0.5)):
        out = tiny_parts.noisy_solver_credit(digits, p, problems=3000, seed=1)
        expected = (8 - 1) * p**digits * (1 - p)
        assert abs(out["own"]["signal"] - expected) < 3 * out["own"]["signal_sd"] / np.sqrt(3000) + 0.01 * expected
        assert out["traces_by_right_digits"][digits] / (3000 * 8) == pytest.approx(p**digits, abs=0.01)
    by_digits = out["set"]["by_right_digits"]  # the last one: 6 digits at p = 0.5
    assert all(a < b for a, b in zip(by_digits, by_digits[1:]))  # credit for every right digit
    assert max(abs(a) for a in out["own"]["by_right_digits"][:-1]) < 0.05 < out["own"]["by_right_digits"][-1]
    assert out["set"]["nonzero"] > 3 * out["own"]["nonzero"]


def test_cli_builds_the_six_digit_task_from_the_three_digit_warm_start_only(tmp_path, monkeypatch, capsys):
    """--task tiny_parts6 writes its own problem files and calls warm_start with its digits, p_digit and init; it
    refuses to replace the tiny_parts warm start (another task's) and needs that warm start to continue from."""
    built = []
    monkeypatch.setattr(tiny_parts, "warm_start", lambda out, **kw: built.append((out, kw)))
    task = tiny_parts.TASKS["tiny_parts6"]
    monkeypatch.setitem(tiny_parts.TASKS, "tiny_parts6", tiny_parts.PartsTask(
        task.name, 6, 0.5, str(tmp_path / "p6.jsonl"), task.warm_start_dir, task.init, task.steps))
    assert tiny_parts.main(["--task", "tiny_parts6", "--out", str(tmp_path / "w")]) == 0
    assert built == [(str(tmp_path / "w"), dict(seed=0, digits=6, p_digit=0.5, init=tiny_parts.WARM_START_DIR,
                                                steps=400, task="tiny_parts6"))]
    assert (tmp_path / "p6_heldout.jsonl").read_text() == tiny_parts.problems_jsonl(6, heldout=True)
    shutil_copy = __import__("shutil").copytree
    shutil_copy(tiny_parts.WARM_START_DIR, tmp_path / "three")
    capsys.readouterr()
    assert tiny_parts.main(["--task", "tiny_parts6", "--out", str(tmp_path / "three")]) == 2
    assert "holds the tiny_parts warm start, not a tiny_parts6 one" in capsys.readouterr().err
    monkeypatch.setitem(tiny_parts.TASKS, "tiny_parts6", tiny_parts.PartsTask(
        task.name, 6, 0.5, str(tmp_path / "p6.jsonl"), task.warm_start_dir, str(tmp_path / "gone"), task.steps))
    assert tiny_parts.main(["--task", "tiny_parts6", "--out", str(tmp_path / "w2")]) == 2
    assert "continues from" in capsys.readouterr().err and len(built) == 1


def test_six_digit_warm_start_one_trace_is_almost_never_right_a_set_often_is(one_thread):
    """The property tiny_parts6 exists for, on its shipped warm start (fixed problems and seed): pass@1 near 0, a
    set holds every digit most of the time, and the aggregator makes several times one trace's accuracy."""
    task = tiny_parts.TASKS["tiny_parts6"]
    with open(os.path.join(task.warm_start_dir, "warm_start.json")) as f:
        recipe = json.load(f)["recipe"]
    assert (recipe["task"], recipe["digits"], recipe["p_digit"], recipe["steps"], recipe["init"]) == \
        ("tiny_parts6", 6, 0.5, 400, "tiny_parts_warmstart")
    model, tokenizer = rollout.load_policy(task.warm_start_dir, device="cpu")
    m = tiny_parts.measure(model, tokenizer, tiny_parts.parts_problems(digits=6)[:60], samples=8, set_size=4, seed=0,
                           max_new_tokens=28)
    assert m["single"] < 0.05 and 0.4 < m["digit"] < 0.6  # each digit right about half the time
    assert m["parts_right"] > 0.5 and m["plurality"] > m["single"] + 0.04
    assert m["aggregation"] > m["single"] + 0.03
