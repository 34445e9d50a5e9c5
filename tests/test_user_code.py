"""A user's code cannot fool a run (issue 40, item 4): a reward that calls sys.exit, changes directory, returns a
numpy bool or a value that would overflow the loss; a user's module named like one of the project's; one column
mapped to two roles; a flag that would be accepted and ignored; an --out name too long for the file system; the
benchmark scripts' relative paths; Ctrl-C while train.py imports torch. Each is one line and a non-zero exit, or
does what the user meant, and each of these tests failed before its fix."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cli
import evaluate
import task
import train
from problemset import Columns, Problem
from tests.test_set_rl_benchmark import set_rl  # its import puts benchmarks/ first on sys.path, as the script runs
from tests.test_task import SMALL, user_files  # noqa: F401 (a fixture)
from tests.test_user_files import _load, _one_line, _snapshot, nothing_runs  # noqa: F401 (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"reproduce": _load("reproduce"), "second_task": _load("second_task"), "set_rl": set_rl}

HOSTILE = '''
import os, sys
import numpy as np
CALLS = []

def exits(problem, completion):
    sys.exit(0)

def exits_later(problem, completion):
    CALLS.append(1)
    if len(CALLS) > 3:
        sys.exit(0)
    return 0.0

def moves(problem, completion):
    os.chdir({elsewhere!r})
    return float(len(completion) % 2)

def numpy_bool(problem, completion):
    return np.array(len(completion)) % 2 == 0

def huge(problem, completion):
    return 1e308

def huge_later(problem, completion):
    return 1e308 if completion else 0.0
'''


@pytest.fixture
def hostile(user_files):
    """user_files (test_task.py) with the hostile rewards in hostile.py and an empty directory `elsewhere`."""
    (user_files / "elsewhere").mkdir()
    (user_files / "hostile.py").write_text(HOSTILE.format(elsewhere=str(user_files / "elsewhere")))
    return user_files


def _train(files, *flags, out="run"):
    return train.main(SMALL + ["--data", str(files / "chat.jsonl"), "--data-columns", "problem=question,id=uid",
                               "--out", str(out), *flags])


def _evaluate(files, *flags, out):
    return evaluate.main(["--preset", "tiny", "--data", str(files / "chat.jsonl"), "--data-columns",
                          "problem=question,id=uid", "--max-new-tokens", "6", "--max-tokens-list", "6",
                          "--rsa-populations", "4", "--rsa-steps", "2", "--method", "passk", "--out", str(out),
                          *flags])


# ----------------------------------------------------------------------------------------------------------------------
# sys.exit, os.chdir, numpy bools and overflowing values from a reward


def test_a_reward_that_calls_sys_exit_is_a_reward_error_not_a_clean_exit(hostile, capsys, one_thread):
    assert _train(hostile, "--reward", f"{hostile}/hostile.py:exits", out=hostile / "a") == 2  # at the probe
    _one_line(capsys, "train.py", "raised SystemExit: 0 on problem q1 (probed before any work")
    assert _train(hostile, "--steps", "3", "--reward", f"{hostile}/hostile.py:exits_later", out=hostile / "b") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("train.py: error: the reward ")
    assert "raised SystemExit: 0" in err
    assert _evaluate(hostile, "--reward", f"{hostile}/hostile.py:exits", out=hostile / "e.json") == 2
    _one_line(capsys, "evaluate.py", "raised SystemExit: 0")


def test_a_reward_that_changes_directory_moves_nothing_the_run_writes(hostile, monkeypatch, one_thread):
    """Relative --out and --cache-dir: train.py's run and evaluate.py's result, cache and lock stay where the user
    is, the reward's directory gets nothing, and config.json and the result name them absolutely (made so before the
    reward first ran)."""
    monkeypatch.chdir(hostile)
    assert _train(hostile, "--steps", "2", "--save-every", "1", "--reward", "hostile.py:moves", out="run") == 0
    rows = (hostile / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and (hostile / "run" / "adapter").is_dir()
    assert json.loads((hostile / "run" / "config.json").read_text())["out"] == str(hostile / "run")
    assert os.getcwd() == str(hostile) and not os.listdir(hostile / "elsewhere")
    assert _evaluate(hostile, "--reward", "hostile.py:moves", out="ev/r6.json") == 0
    result = json.loads((hostile / "ev" / "r6.json").read_text())
    assert result["config"]["out"] == str(hostile / "ev" / "r6.json")
    assert result["config"]["cache_dir"] == str(hostile / "ev" / ".cache")
    assert (hostile / "ev" / ".cache").is_dir() and not (hostile / "ev" / "r6.json.lock").exists()
    assert os.getcwd() == str(hostile) and not os.listdir(hostile / "elsewhere")


def test_the_checked_reward_restores_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other").mkdir()
    moves = task.checked(lambda p, c: os.chdir(tmp_path / "other") or 1.0, "moves")
    assert moves(Problem("x", None), "") == 1.0 and os.getcwd() == str(tmp_path)


def test_numpy_bools_are_0_or_1_and_values_that_overflow_the_loss_are_refused():
    problem = Problem("x", None, "7")
    assert task.checked(lambda p, c: np.array(3) == 3, "f")(problem, "") == 1.0
    assert task.checked(lambda p, c: np.bool_(False), "f")(problem, "") == 0.0
    assert task.checked(lambda p, c: -task.MAX_REWARD, "f")(problem, "") == -task.MAX_REWARD
    for value in (1e308, -1e16, np.float64(1e300), 10**400):
        with pytest.raises(task.RewardError, match="on problem 7; expected a finite number of at most 1e\\+15"):
            task.checked(lambda p, c: value, "f")(problem, "")
    with pytest.raises(task.RewardError, match="returned array"):  # an array is still not a number
        task.checked(lambda p, c: np.array([True]), "f")(problem, "")


def test_train_py_takes_a_numpy_bool_reward(hostile, one_thread):
    assert _train(hostile, "--steps", "1", "--reward", f"{hostile}/hostile.py:numpy_bool", out=hostile / "run") == 0
    assert (hostile / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_a_reward_that_would_overflow_the_loss_is_one_line(hostile, capsys, one_thread):
    assert _train(hostile, "--reward", f"{hostile}/hostile.py:huge", out=hostile / "a") == 2
    _one_line(capsys, "train.py", "returned 1e+308 on problem q1", "overflow the loss")
    assert _train(hostile, "--reward", f"{hostile}/hostile.py:huge_later", out=hostile / "b") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "returned 1e+308" in err.strip().splitlines()[-1]


# ----------------------------------------------------------------------------------------------------------------------
# The user's module named like one of the project's


@pytest.mark.parametrize("name", ["reward", "task"])
def test_a_user_module_named_like_a_project_module_is_the_user_s(name, tmp_path, monkeypatch):
    (tmp_path / f"{name}.py").write_text("def my_reward(problem, completion):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    project = sys.modules[name]
    r = task.resolve(f"{name}:my_reward", [Problem("x", None)])
    assert r(Problem("x", None), "y") == 0.25
    assert sys.modules[name] is project and os.path.dirname(project.__file__) == ROOT  # the project's stays


def test_a_user_package_named_like_a_project_module_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "__init__.py").write_text("")
    (tmp_path / "reward" / "mine.py").write_text("def f(problem, completion):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(task.RewardError, match="reward is both your package and one of this project's modules"):
        task.load_reward("reward.mine:f")


def test_from_the_checkout_a_project_module_is_the_project_s(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert task.load_reward("task:math_reward") is task.math_reward


# ----------------------------------------------------------------------------------------------------------------------
# Flags: one column in two roles, a flag that would be ignored, an --out name too long


@pytest.mark.parametrize("text, roles", [("problem=question,answer=question", "answer and problem|problem and answer"),
                                         ("answer=problem", "problem and answer|answer and problem"),
                                         ("problem=q,id=q", "problem and id|id and problem")])
def test_one_column_in_two_roles_is_refused(text, roles):
    with pytest.raises(ValueError, match=f"is mapped to both ({roles})"):
        Columns.parse(text)


def test_train_py_refuses_one_column_as_problem_and_answer(hostile, capsys):
    code = train.main(SMALL + ["--data", str(hostile / "chat.jsonl"), "--data-columns",
                               "problem=question,answer=question", "--out", str(hostile / "run")])
    assert code == 2 and not (hostile / "run").exists()
    _one_line(capsys, "train.py", "column 'question' is mapped to both")


def test_keep_attention_outputs_without_gradient_checkpointing_is_refused(hostile, capsys):
    assert _train(hostile, "--keep-attention-outputs", out=hostile / "run") == 2  # the tiny preset: no checkpointing
    _one_line(capsys, "train.py", "--keep-attention-outputs", "--gradient-checkpointing")
    assert not (hostile / "run").exists()
    cfg = train.resolve_config({"preset": "tiny", "keep_attention_outputs": True, "gradient_checkpointing": True,
                                "out": str(hostile / "run2")})
    assert cli.validate(cfg)  # with checkpointing it is what it says


@pytest.mark.parametrize("script", ["train", "evaluate"])
def test_an_out_name_too_long_for_the_file_system_is_one_line(script, hostile, capsys):
    name = "x" * 300
    if script == "train":
        code = _train(hostile, out=hostile / name)
    else:
        code = _evaluate(hostile, out=hostile / f"{name}.json")
    assert code == 2
    _one_line(capsys, f"{script}.py", "a name of 30", "bytes; this file system allows 255")
    assert not [p for p in hostile.iterdir() if p.name.startswith("xxx")]


# ----------------------------------------------------------------------------------------------------------------------
# The benchmark scripts: relative paths are the user's


def _exit_code(main, argv):
    try:
        return main(argv)
    except SystemExit as exit_info:
        return exit_info.code


@pytest.mark.parametrize("script", ["reproduce", "second_task", "set_rl"])
def test_a_benchmark_script_reads_a_relative_runs_dir_from_the_user_s_directory(script, tmp_path, monkeypatch,
                                                                                nothing_runs, capsys):
    if script == "reproduce":
        pytest.importorskip("matplotlib")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    assert _exit_code(SCRIPTS[script].main, ["--seeds", "0,1", "--runs-dir", "results"]
                      + ([] if script == "reproduce" else ["--out", str(tmp_path / "t")])) == 2
    _one_line(capsys, f"{script}.py", f"--runs-dir {tmp_path}/results: it holds notes.txt")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("script", ["second_task", "set_rl"])
def test_a_benchmark_script_writes_a_relative_out_in_the_user_s_directory(script, tmp_path, monkeypatch,
                                                                          nothing_runs, capsys):
    (tmp_path / "t.md").write_text("my notes")
    monkeypatch.chdir(tmp_path)
    assert _exit_code(SCRIPTS[script].main, ["--seeds", "0,1", "--runs-dir", str(tmp_path / "r"), "--out", "t"]) == 2
    _one_line(capsys, f"{script}.py", f"--out {tmp_path}/t: {tmp_path}/t.md exists and was not written by")
    assert (tmp_path / "t.md").read_text() == "my notes"


# ----------------------------------------------------------------------------------------------------------------------
# Ctrl-C while train.py imports torch

CTRL_C_AT_IMPORT = """
import runpy, sys
class CtrlC:  # Ctrl-C arrives while torch is being imported
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = ["train.py", "--preset", "tiny"]
runpy.run_path("train.py", run_name="__main__")
"""


def test_ctrl_c_while_train_py_imports_torch_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", CTRL_C_AT_IMPORT], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "train.py: interrupted while starting; nothing was written\n"
