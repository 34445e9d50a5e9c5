"""A user's task on every entry point without an engine: problem files with their own column names and chat-format
prompts, a reward function r(problem, completion) named MODULE:FUNCTION or PATH.py:FUNCTION, refused in one line before
any work when it cannot be imported or fails on one problem, and called by spiral.collect_spiral / collect_grpo,
train.py and evaluate.py instead of the math grader, which is then never called.

The rewards below can be satisfied only by calling them: "1 iff the completion is the problem reversed" (a scripted
sampler writes some reversed problems), or a CRC of the problem and the completion (the tiny model's own traces)."""

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

import evaluate
import problemset
import reward
import spiral
import task
import train
from advantages import group_advantages, spiral_advantages
from problemset import Columns, Problem
from rollout import Completion

SMALL = ["--preset", "tiny", "--batch-problems", "2", "--num-search", "3", "--set-size", "2", "--num-sets", "2",
         "--num-aggregations", "2", "--max-new-tokens", "6", "--no-plot"]

REWARDS = '''
import zlib
CALLS = []

def reversed_problem(problem, completion):
    return float(completion == problem.problem[::-1])

def crc(problem, completion):
    CALLS.append((problem.problem, problem.fields.get("level"), completion))
    return float(zlib.crc32((problem.problem + "|" + completion).encode()) % 2)

def raises(problem, completion):
    return {}["missing"]

def nan(problem, completion):
    return float("nan")

def none(problem, completion):
    return None

def text(problem, completion):
    return "1"

def fails_later(problem, completion):
    CALLS.append(1)
    if len(CALLS) > 60:
        raise ValueError("the judge went away")
    return float(zlib.crc32(completion.encode()) % 2)

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def user_files(tmp_path):
    """A reward module and a problem file with the user's own column names and chat-format prompts."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "broken.py").write_text("import no_such_package_anywhere\n")
    rows = [{"question": [{"role": "user", "content": f"What is {a} + {a}?"}], "level": a, "uid": f"q{a}"}
            for a in (1, 2, 3)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


@pytest.fixture
def no_math_grader(monkeypatch):
    """The math grader replaced by a counter that fails the test if it is ever asked."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the math grader was called on a user's task")

    for name in ("reward", "answers_equivalent", "check_grader"):
        monkeypatch.setattr(reward, name, counted)
    monkeypatch.setattr(spiral, "reward", counted)
    monkeypatch.setattr(evaluate, "reward", counted)
    return calls


# ---------------------------------------------------------------------------------------------------------------------
# Problems: columns and chat-format prompts


def test_columns_map_the_user_s_names_and_a_chat_prompt_is_its_user_message(user_files):
    problems = problemset.load_problems(str(user_files / "chat.jsonl"), Columns(problem="question", id="uid"),
                                        need_answer=False)
    assert [(p.problem, p.answer, p.id) for p in problems] == [(f"What is {a} + {a}?", None, f"q{a}")
                                                               for a in (1, 2, 3)]
    assert problems[1].fields["level"] == 2 and problems[1].fields["question"][0]["role"] == "user"
    assert Columns.parse("problem=question, answer=gold") == Columns(problem="question", answer="gold")
    with pytest.raises(problemset.ProblemFileError, match=r"line 1: missing field 'answer'"):  # the math task's
        problemset.load_problems(str(user_files / "chat.jsonl"), Columns(problem="question"))


@pytest.mark.parametrize("text", ["question", "problem=q,problem=r", "prompt=q", "problem="])
def test_a_bad_column_mapping_is_one_line(text):
    with pytest.raises(ValueError, match="problem=question|mapped twice"):
        Columns.parse(text)


@pytest.mark.parametrize("prompt, message", [
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}], "one user message"),
    ([{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "one user message"),
    ([{"role": "user", "content": [{"type": "text", "text": "1+1?"}]}], "content must be a string"),
    (["1+1?"], "chat prompt"),
])
def test_a_chat_prompt_that_is_not_one_user_message_is_refused_naming_line_and_column(tmp_path, prompt, message):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"q": [{"role": "user", "content": "ok"}], "answer": "2"}) + "\n"
                    + json.dumps({"q": prompt, "answer": "2"}) + "\n")
    with pytest.raises(problemset.ProblemFileError, match=f"p.jsonl, line 2: field 'q'.*{message}"):
        problemset.load_problems(str(path), Columns(problem="q"))


# ---------------------------------------------------------------------------------------------------------------------
# Loading and probing the reward


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "expected MODULE:FUNCTION"),
    ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
    ("{tmp}/missing.py:f", "no such file"),
    ("{tmp}/my_rewards.py:absent", "has no absent"),
    ("{tmp}/my_rewards.py:NOT_A_FUNCTION", "is a int, not a function"),
    ("{tmp}/broken.py:f", "importing {tmp}/broken.py failed (ModuleNotFoundError"),
    ("{tmp}/my_rewards.py:raises", "raised KeyError: 'missing' on problem q1 (probed before any work"),
    ("{tmp}/my_rewards.py:nan", "returned nan on problem q1; expected a finite number"),
    ("{tmp}/my_rewards.py:none", "returned None"),
    ("{tmp}/my_rewards.py:text", "returned '1'"),
])
def test_a_reward_that_cannot_be_used_stops_train_py_in_one_line_before_any_work(spec, message, user_files, capsys):
    spec, message = spec.format(tmp=user_files), message.format(tmp=user_files)
    out = user_files / "run"
    code = train.main(SMALL + ["--data", str(user_files / "chat.jsonl"), "--data-columns", "problem=question,id=uid",
                               "--reward", spec, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("train.py: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not out.exists()


def test_a_module_reward_is_imported_from_the_current_directory(user_files, monkeypatch):
    monkeypatch.chdir(user_files)
    monkeypatch.syspath_prepend(str(user_files))
    r = task.resolve("my_rewards:reversed_problem", [Problem("abc", None)])
    assert r(Problem("abc", None), "cba") == 1.0 and r(Problem("abc", None), "abc") == 0.0


def test_the_checked_reward_accepts_numbers_and_bools_as_floats():
    assert task.checked(lambda p, c: np.float32(0.5), "f")(Problem("x", None), "") == 0.5
    assert task.checked(lambda p, c: True, "f")(Problem("x", None), "") == 1.0
    with pytest.raises(task.RewardError, match="returned inf"):
        task.checked(lambda p, c: float("inf"), "f")(Problem("x", None, "7"), "")


# ---------------------------------------------------------------------------------------------------------------------
# spiral.collect_*: the rewards and advantages are the user's function's


def reversing_generate(reversed_traces):
    """A sampler that writes the problem reversed for the search traces in reversed_traces[problem], and for the
    first (number of reversed candidates in the set) aggregation traces of a set; otherwise "no"."""

    def generate(model, tokenizer, prompts, *, samples_per_prompt, **_):
        out = []
        for prompt in prompts:
            problem = next(p for p in reversed_traces if p in prompt)
            good = prompt.count(problem[::-1]) if prompt.startswith("You are given a problem") else None
            row = []
            for i in range(samples_per_prompt):
                right = i < good if good is not None else i in reversed_traces[problem]
                text = problem[::-1] if right else "no"
                row.append(Completion([1], [5, 6], [-0.1, -0.2], text, False))
            out.append(row)
        return out

    return generate


def test_collect_spiral_trains_on_the_user_s_reward_and_never_asks_the_math_grader(monkeypatch, no_math_grader):
    reversed_traces = {"first problem": {0, 2}, "second one": {1}}
    monkeypatch.setattr(spiral, "generate", reversing_generate(reversed_traces))
    problems = iter([Problem(p, None) for p in reversed_traces])
    sets = []
    sample_sets = spiral.sample_sets
    monkeypatch.setattr(spiral, "sample_sets", lambda *a, **k: sets.append(sample_sets(*a, **k)) or sets[-1])
    calls = []
    user = task.checked(lambda x, y: calls.append(y) or float(y == x.problem[::-1]), "reversed")
    rollouts = spiral.collect_spiral(None, None, lambda: next(problems), batch_problems=2, num_search=3, set_size=2,
                                     num_sets=2, num_aggregations=2, rng=np.random.default_rng(0), reward_fn=user)
    assert len(calls) == 2 * (3 + 2 * 2) and not no_math_grader
    expected = []
    for problem, sets_K_n in zip(reversed_traces, sets):
        rewards_K_N2 = np.array([[float(i < sum(j in reversed_traces[problem] for j in G)) for i in range(2)]
                                 for G in sets_K_n])
        search_N1, aggregation_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=3)
        expected += [*search_N1, *aggregation_K_N2.ravel()]
    assert np.abs(expected).max() > 0
    assert [s.advantage for s in rollouts.samples] == pytest.approx(expected, abs=0)
    assert rollouts.metrics["search_accuracy"] == pytest.approx(3 / 6)  # the logged reward is the user's


def test_collect_grpo_trains_on_the_user_s_reward(monkeypatch, no_math_grader):
    monkeypatch.setattr(spiral, "generate", reversing_generate({"abc": {1, 3}}))
    user = task.checked(lambda x, y: float(y == x.problem[::-1]), "reversed")
    rollouts = spiral.collect_grpo(None, None, lambda: Problem("abc", None), batch_problems=1, group_size=4,
                                   reward_fn=user)
    assert [s.reward for s in rollouts.samples] == [0.0, 1.0, 0.0, 1.0]
    assert [s.advantage for s in rollouts.samples] == pytest.approx(group_advantages(np.array([0, 1, 0, 1.0])))
    assert rollouts.metrics["accuracy"] == 0.5 and not no_math_grader


# ---------------------------------------------------------------------------------------------------------------------
# train.py and evaluate.py end to end


def test_trl_reward_rebuilds_each_completion_s_own_problem_from_a_batch():
    """task.trl_reward in TRL's signature, called with a batch as TRL calls it: completion i is scored against row i's
    problem (its prompt, `answer` as the gold, `id`, every column), a chat prompt as its user message."""
    seen = []

    def r(problem, completion):
        seen.append((problem.problem, problem.answer, problem.id, problem.fields["level"], completion))
        return float(completion == problem.answer)

    reward_fn = task.trl_reward(r)
    prompts = ["What is 1 + 1?", [{"role": "user", "content": "What is 2 + 2?"}], "What is 3 + 3?"]
    completions = ["2", [{"role": "assistant", "content": "5"}], "6"]
    values = reward_fn(prompts=prompts, completions=completions, completion_ids=[[1], [2], [3]], answer=["2", "4", 6],
                       id=["a", "b", 7], level=[1, 2, 3], trainer_state=None)
    assert values == [1.0, 0.0, 1.0] and reward_fn.__name__ == "r"
    assert seen == [("What is 1 + 1?", "2", "a", 1, "2"), ("What is 2 + 2?", "4", "b", 2, "5"),
                    ("What is 3 + 3?", "6", "7", 3, "6")]


def test_a_reward_file_that_failed_to_import_is_not_half_loaded_the_second_time(tmp_path):
    """A file whose import raised (after defining the function) is not left in sys.modules: a second load fails the
    same way instead of returning the half-run module's function."""
    (tmp_path / "half.py").write_text("def r(problem, completion):\n    return 1.0\n\nraise RuntimeError('no judge')\n")
    for _ in range(2):
        with pytest.raises(task.RewardError, match="importing .*half.py failed .*RuntimeError: no judge"):
            task.load_reward(f"{tmp_path}/half.py:r")


def _load_module_calls(user_files):
    import sys
    return next(m for m in sys.modules.values() if getattr(m, "__file__", None) == str(user_files / "my_rewards.py"))


def test_train_py_logs_and_trains_on_the_user_s_reward(user_files, no_math_grader, one_thread):
    """Two steps on the tiny model: every reward a step logs (search and aggregation accuracy, which are mean rewards)
    is the mean of what the user's function returned that step, the row's columns reach it, and it trains."""
    out = user_files / "run"
    assert train.main(SMALL + ["--steps", "2", "--data", str(user_files / "chat.jsonl"), "--data-columns",
                               "problem=question,id=uid", "--reward", f"{user_files}/my_rewards.py:crc",
                               "--out", str(out)]) == 0
    calls = _load_module_calls(user_files).CALLS[1:]  # the first: the probe, before training
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_problem = 3 + 2 * 2
    assert len(calls) == sum(r["problems_drawn"] for r in rows) * per_problem
    assert {level for _, level, _ in calls} <= {1, 2, 3} and None not in {level for _, level, _ in calls}
    done = 0
    for row in rows:
        n = row["problems_drawn"] * per_problem
        values = [zlib.crc32(f"{p}|{c}".encode()) % 2 for p, _, c in calls[done:done + n]]
        done += n
        logged = row["search_accuracy"] * row["problems_drawn"] * 3 + row["aggregation_accuracy"] * \
            row["problems_drawn"] * 4
        assert logged == pytest.approx(sum(values))
    assert sum(r["train/samples_trained"] for r in rows) > 0
    assert not no_math_grader
    config = json.loads((out / "config.json").read_text())
    assert config["reward"].endswith("my_rewards.py:crc") and config["data_columns"] == "problem=question,id=uid"


def test_a_reward_that_fails_during_training_stops_in_one_line_and_keeps_the_checkpoint(user_files, capsys,
                                                                                       one_thread):
    out = user_files / "run"
    code = train.main(SMALL + ["--steps", "5", "--save-every", "1", "--data", str(user_files / "chat.jsonl"),
                               "--data-columns", "problem=question", "--reward",
                               f"{user_files}/my_rewards.py:fails_later", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("train.py: error: the reward ") and "raised ValueError: the judge went away" in last
    assert f"The last good checkpoint is {out}/checkpoint" in last


def test_evaluate_py_grades_with_the_user_s_reward_and_leaves_majority_out(user_files, no_math_grader, capsys,
                                                                           one_thread):
    out = user_files / "eval.json"
    flags = ["--preset", "tiny", "--data", str(user_files / "chat.jsonl"), "--data-columns", "problem=question,id=uid",
             "--reward", f"{user_files}/my_rewards.py:crc", "--max-new-tokens", "6", "--max-tokens-list", "6",
             "--rsa-populations", "4", "--rsa-steps", "2", "--out", str(out)]
    assert evaluate.main(flags) == 0
    assert "majority@k left out" in capsys.readouterr().err
    result = json.loads(out.read_text())["policies"]["base"]
    assert set(result["summary"]) == {"passk", "rsa", "sequential", "sets"}  # no majority
    for record in result["problems"]:
        pool = record["pools"]["6"]
        assert all(s["correct"] == (s["reward"] == 1.0) and s["answer"] is None for s in pool)
        assert {s["reward"] for s in pool} <= {0.0, 1.0}
    calls = _load_module_calls(user_files).CALLS
    assert calls and not no_math_grader
    assert evaluate.main(flags + ["--method", "majority"]) == 2
    assert "--method majority with --reward" in capsys.readouterr().err


def test_the_default_task_is_the_math_grader_on_the_answer_column():
    graded = []
    original = spiral.reward
    try:
        spiral.reward = lambda text, gold: graded.append((text, gold)) or 1.0
        assert spiral._math_reward(Problem("1+1?", "2"), "\\boxed{2}") == 1.0
    finally:
        spiral.reward = original
    assert graded == [("\\boxed{2}", "2")]
    assert task.math_reward(Problem("1+1?", "2"), "so \\boxed{2}") == 1.0
    assert task.math_reward(Problem("1+1?", "2"), "so \\boxed{3}") == 0.0
    assert Path(task.__file__).name == "task.py"


def test_evaluate_names_a_reward_that_is_not_0_or_1(capsys):
    """pass@k counts only r = 1 as solved: a reward of 0.5 is said in one warning line, a 0/1 reward is not."""
    records = [{"pools": {6: [{"reward": 1.0}, {"reward": 0.0}]}, "rsa": {4: [{"samples": [{"reward": 0.5}]}]}}]
    task.warn_if_not_binary(evaluate._rewards(records), "policy base")
    assert "policy base: the reward gave values other than 0 and 1 (e.g. 0.5)" in capsys.readouterr().err
    records[0]["rsa"][4][0]["samples"][0]["reward"] = 1.0
    task.warn_if_not_binary(evaluate._rewards(records), "policy base")
    assert capsys.readouterr().err == ""


def test_a_reward_that_cannot_be_used_stops_evaluate_py_in_one_line_before_any_work(user_files, capsys):
    out = user_files / "eval.json"
    code = evaluate.main(["--preset", "tiny", "--data", str(user_files / "chat.jsonl"), "--data-columns",
                          "problem=question,id=uid", "--reward", f"{user_files}/my_rewards.py:nan", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("evaluate.py: error: --reward ") and err.count("\n") == 1, err
    assert "returned nan on problem q1" in err and not out.exists() and not (user_files / ".cache").exists()


# ----------------------------------------------------------------------------------------------------------------------
# task.trl_rewards (TRL's batch signature) meets a user's code as task.checked does


def _trl_batch(function):
    return task.trl_rewards([function], [1.0], ["p1", "p2"], ["c1", "c2"], [[1, 2], [3]], [{"answer": "1"}, {}])


def test_trl_rewards_take_numpy_bools_and_refuse_huge_values_sys_exit_in_one_line(tmp_path, monkeypatch):
    rewards, values, unscorable = _trl_batch(lambda completions, **_: list(np.array([1, 2]) == 1))
    assert rewards == [1.0, 0.0] and unscorable == []
    rewards, _, unscorable = _trl_batch(lambda completions, **_: [None, np.float32(0.5)])
    assert rewards == [0.0, 0.5] and unscorable == [0]
    for bad, said in ((lambda **_: [1e308, 0.0], "at most 1e\\+15"), (lambda **_: [10 ** 400, 0], "at most 1e\\+15"),
                      (lambda **_: [True, "1"], "'1'")):
        with pytest.raises(task.RewardError, match=said):
            _trl_batch(bad)

    def leaves(**_):
        raise SystemExit(0)
    with pytest.raises(task.RewardError, match="raised SystemExit"):  # not a silent exit 0 from the trainer
        _trl_batch(leaves)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()

    def wanders(completions, **_):
        import os
        os.chdir(tmp_path / "elsewhere")
        return [1.0] * len(completions)
    assert _trl_batch(wanders)[0] == [1.0, 1.0]
    assert Path.cwd() == tmp_path  # the run's relative paths are the user's again
