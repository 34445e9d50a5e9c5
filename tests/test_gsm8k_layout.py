"""verl's usual data graded right or refused (issue 40, item 3), without verl: gsm8k's layout, a prompt asking for the
answer after "####" and a gold answer of one number ("openai/gsm8k", as verl's examples/data_preprocess/gsm8k.py
writes it), is graded on the "#### 72" answer as verl's own gsm8k scorer reads it; a gold answer that is still
gsm8k's worked solution is graded on its number after "####", refused in one line for verl's default_compute_score
(which would compare it whole), and made into that number by prepare_data, which says so. Each test failed before."""

import json

import pytest

from recipe.spiral import prepare_data, verl_task
from recipe.spiral.reward_fn import compute_score
from reward import hash_answer

WORKED = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in "
          "April and May.\n#### 72")  # gsm8k's answer column, as the dataset holds it


@pytest.mark.parametrize("text, number", [("so #### 72", "72"), ("#### 1,234", "1234"), ("#### $5", "5"),
                                          ("#### -3.5 apples", "-3.5"), ("#### 3\nthen #### 4.", "4"),
                                          ("no answer", None), ("####", None), ("#### x", None), (WORKED, "72")])
def test_hash_answer_is_the_number_after_the_last_hashes(text, number):
    assert hash_answer(text) == number


@pytest.mark.parametrize("solution, score", [
    ("48/2 = 24 in May, 72 in all.\n#### 72", 1.0),  # verl's gsm8k format: was 0.0 (the \boxed{} grader)
    ("#### 72.0", 1.0),
    ("#### 1,000", 0.0),
    ("#### 71", 0.0),
    ("the answer is \\boxed{72}", 1.0),  # the Aggregation Trace Prompt asks for \boxed{}
    ("\\boxed{72} and then #### 71", 0.0),  # the #### answer, as verl reads it, comes first
    ("72", 0.0),  # no answer line at all
])
def test_the_shipped_reward_reads_gsm8k_answers(solution, score):
    assert compute_score("openai/gsm8k", solution, "72") == score


def test_a_worked_gold_answer_is_graded_on_its_number_and_math_rows_stay_boxed():
    assert compute_score("spiral/train", "\\boxed{72}", WORKED) == 1.0
    assert compute_score("spiral/train", "#### 72", WORKED) == 1.0
    assert compute_score("spiral/train", "\\boxed{71}", WORKED) == 0.0
    assert compute_score("spiral/math500", "#### 72", "72") == 0.0  # MATH rows: the \boxed{} answer only
    assert compute_score("spiral/math500", "so \\boxed{72}", "72") == 1.0


def _row(gold):
    return {"prompt": [{"role": "user", "content": "How many clips?"}], "data_source": "openai/gsm8k",
            "reward_model": {"style": "rule", "ground_truth": gold}}


def test_verl_s_default_scorer_on_a_worked_gold_answer_is_refused_in_one_line():
    why = verl_task.gold_problem(_row(WORKED), default_grader=True)
    assert why and "\n" not in why and "is a worked solution" in why and "number after '####'" in why
    assert verl_task.gold_problem(_row("#### 72"), default_grader=True)
    assert verl_task.gold_problem(_row("72"), default_grader=True) is None  # verl's own gsm8k rows
    assert verl_task.gold_problem(_row(WORKED), default_grader=False) is None  # reward_fn or the user's function


def test_prepare_data_takes_the_number_after_the_hashes_and_says_so(tmp_path, capsys):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps({"question": f"Question {i}?", "answer": WORKED.replace("72", str(70 + i))})
                            + "\n" for i in range(3)))
    rows = prepare_data.rows(str(path), "train", prepare_data.problemset.Columns.parse("problem=question"))
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["70", "71", "72"]
    out = capsys.readouterr()
    assert out.out.count("\n") == 1 and "3 of 3 gold answers are gsm8k worked solutions" in out.out
    assert out.err == ""


def test_prepare_data_says_when_a_gold_answer_looks_like_a_worked_solution(tmp_path, capsys):
    path = tmp_path / "math.jsonl"
    solutions = ["We add.\nSo the answer is $\\boxed{4}$.", "5", "Since x = 2, \\boxed{2}."]
    path.write_text("".join(json.dumps({"problem": f"P{i}", "solution": s}) + "\n" for i, s in enumerate(solutions)))
    rows = prepare_data.rows(str(path), "test", prepare_data.problemset.Columns.parse("answer=solution"))
    assert [r["reward_model"]["ground_truth"] for r in rows] == solutions  # kept as they are
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: prepare_data.py: --test ")
    assert "2 of 3 gold answers look like worked solutions (row 0" in err
    capsys.readouterr()
    prepare_data.rows("math500", "test")  # the bundled sets hold final answers only
    assert capsys.readouterr().err == ""
