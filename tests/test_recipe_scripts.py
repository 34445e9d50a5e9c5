"""The verl recipe's scripts as a user runs them, without verl (recipe/spiral/run_*.sh, main_spiral.py,
prepare_data.py): --help prints help and does nothing else; without verl, the entry point and the scripts say in one
line what to install; a bad argument or an unwritable --out is one line, exit 2, before any work, nothing written.
tests/test_verl_recipe.py runs them with verl (main_spiral's own checks, prepare_data's parquet)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.spiral import prepare_data

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["run_spiral_qwen3_4b_8gpu.sh", "run_spiral_qwen3_4b_multinode.sh"]


@pytest.fixture
def python_log(tmp_path):
    """A `python` first on PATH that records its arguments and fails: what a script would have run."""
    bin_dir, log = tmp_path / "bin", tmp_path / "python.log"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 3\n')
    (bin_dir / "python").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_scripts_help_prints_the_header_and_runs_nothing(script, flag, python_log, tmp_path):
    env, log = python_log
    env.pop("NNODES", None)
    done = subprocess.run(["bash", str(ROOT / "recipe/spiral" / script), "trainer.x=1", flag], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert "Hydra overrides" in done.stdout and "prepare_data" in done.stdout and "#" not in done.stdout
    assert not log.exists()


def test_run_script_hands_its_arguments_to_the_entry_point_first(python_log, tmp_path):
    """No data preparation (or anything else) before main_spiral has checked the overrides: its first command."""
    env, log = python_log
    done = subprocess.run(["bash", str(ROOT / "recipe/spiral" / SCRIPTS[0]), "trainer.bogus=1"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 3
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("-m recipe.spiral.main_spiral ") and "trainer.bogus=1" in calls[0]


@pytest.mark.parametrize("nnodes", [None, "", "x", "0", "2.5", "010", "10000", "99999999999999999999"])
def test_multinode_refuses_a_bad_nnodes_in_one_line(nnodes, python_log, tmp_path):
    env, log = python_log
    env.pop("NNODES", None)
    if nnodes is not None:
        env["NNODES"] = nnodes
    done = subprocess.run(["bash", str(ROOT / "recipe/spiral" / SCRIPTS[1])], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"{SCRIPTS[1]}: error: set NNODES") and not log.exists()


def test_multinode_hands_a_good_nnodes_on_with_the_batch_it_makes(python_log, tmp_path):
    """256 prompts per node and the mini-batch 24 rows per prompt, computed without overflow at the largest NNODES."""
    env, log = python_log
    env["NNODES"] = "9999"
    done = subprocess.run(["bash", str(ROOT / "recipe/spiral" / SCRIPTS[1])], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 3
    call = log.read_text().split()
    assert "trainer.nnodes=9999" in call and f"data.train_batch_size={256 * 9999}" in call
    assert f"actor_rollout_ref.actor.ppo_mini_batch_size={256 * 9999 * 24}" in call


NO_VERL = importlib.util.find_spec("hydra") is None or importlib.util.find_spec("verl") is None


@pytest.fixture
def python_without_verl(tmp_path):
    """A `python` first on PATH that is this environment's (without verl), as a user's would be."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NNODES": "2"}
    env.pop("PYTHONPATH", None)
    return env


def one_line_naming_required_verl(done):
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("main_spiral.py: error: No module named ")
    assert "recipe/spiral/REQUIRED_VERL.txt" in done.stderr and done.stdout == ""


@pytest.mark.skipif(not NO_VERL, reason="verl and hydra are installed here: --help is Hydra's")
@pytest.mark.parametrize("args", [["--help"], ["trainer.total_epochs=1"]])
def test_the_entry_point_without_verl_names_required_verl_in_one_line(args, python_without_verl, tmp_path):
    done = subprocess.run(["python", "-m", "recipe.spiral.main_spiral", *args], capture_output=True, text=True,
                          env={**python_without_verl, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=120)
    one_line_naming_required_verl(done)


@pytest.mark.skipif(not NO_VERL, reason="verl and hydra are installed here")
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_run_scripts_without_verl_name_required_verl_in_one_line(script, python_without_verl, tmp_path):
    done = subprocess.run(["bash", str(ROOT / "recipe/spiral" / script)], capture_output=True, text=True,
                          env=python_without_verl, cwd=tmp_path, timeout=120)
    one_line_naming_required_verl(done)


def test_prepare_data_help_prints_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        prepare_data.main(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("usage: prepare_data.py")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--out", "FILE/data"], "is not a directory"),
    (["--out", ""], "an empty path"),
    (["--train", "a/sums.jsonl", "--test", "b/sums.jsonl"], "--train a/sums.jsonl and --test b/sums.jsonl would both "
     "be written to runs/verl-data/sums.parquet: give the files different names"),
    (["--train", "math500", "--test", "math500"], "would both be written to runs/verl-data/math500.parquet"),
    (["--data-columns", "question"], "--data-columns 'question': expected ROLE=COLUMN pairs"),
])
def test_prepare_data_bad_input_is_one_line_before_reading(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("mine")
    monkeypatch.setattr(prepare_data, "rows", lambda *a: pytest.fail("read the problems on bad input"))
    assert prepare_data.main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare_data.py: error: ") and message in err and err.count("\n") == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["FILE"] and (tmp_path / "FILE").read_text() == "mine"
