"""dev.py, the two commands of a fresh machine: the environment is made once and installed again only when the pins
change, a .venv that is not a virtual environment is never touched, a second demo continues the first, and the tests
run as CI runs them (the default selection, then the slow one)."""

import os
import subprocess
import shutil
import sys

import pytest

import dev


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """dev.py pointed at a copy of the two requirement files, with venv creation and commands recorded."""
    for name in ("requirements.txt", "constraints.txt"):
        shutil.copy(os.path.join(dev.ROOT, name), tmp_path / name)
    venv_dir = tmp_path / ".venv"
    python = venv_dir / "bin" / "python"
    monkeypatch.setattr(dev, "ROOT", str(tmp_path))
    monkeypatch.setattr(dev, "VENV", str(venv_dir))
    monkeypatch.setattr(dev, "STAMP", str(venv_dir / "spiral-ref-installed"))
    monkeypatch.setattr(dev, "PYTHON", str(python))
    commands = []

    def create(path, with_pip):
        os.makedirs(os.path.dirname(python))
        (venv_dir / "pyvenv.cfg").write_text("home = /usr/bin\n")
        python.write_text("")

    monkeypatch.setattr(dev.venv, "create", create)
    monkeypatch.setattr(dev, "run", lambda command: commands.append(command[1:]))
    return tmp_path, commands


def test_the_environment_is_made_once_and_reinstalled_only_when_the_pins_change(checkout):
    root, commands = checkout
    assert dev.main(["test"]) == 0
    install = ["-m", "pip", "install", "--quiet", "-r", "requirements.txt", "-c", "constraints.txt", "matplotlib"]
    assert commands == [install, ["-m", "pytest", "-q", "tests"], ["-m", "pytest", "-q", "-m", "slow", "tests"]]
    commands.clear()
    assert dev.main(["test", "-x"]) == 0
    assert commands == [["-m", "pytest", "-q", "-x", "tests"], ["-m", "pytest", "-q", "-m", "slow", "-x", "tests"]]
    commands.clear()
    with open(root / "constraints.txt", "a") as f:
        f.write("# a moved pin\n")
    assert dev.main(["demo"]) == 0
    assert commands == [install, ["train.py", "--preset", "tiny"]]


def test_a_second_demo_continues_the_first_run(checkout):
    root, commands = checkout
    (root / "runs" / "tiny-spiral").mkdir(parents=True)
    (root / "runs" / "tiny-spiral" / "config.json").write_text("{}")
    assert dev.main(["demo"]) == 0
    assert commands[-1] == ["train.py", "--preset", "tiny", "--resume"]  # prints the table of a finished run


def test_a_folder_named_venv_that_is_not_one_is_left_alone(checkout, capsys):
    root, commands = checkout
    (root / ".venv").mkdir()
    (root / ".venv" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        dev.main(["demo"])
    assert exit_info.value.code == 2 and commands == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a virtual environment" in err
    assert os.listdir(root / ".venv") == ["notes.txt"]


def test_a_checkout_where_the_venv_cannot_be_made_is_one_line(checkout, monkeypatch, capsys):
    _, commands = checkout

    def read_only(path, with_pip):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(dev.venv, "create", read_only)
    with pytest.raises(SystemExit) as exit_info:
        dev.main(["demo"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and commands == [] and err.count("\n") == 1
    assert err == f"dev.py: error: cannot create {dev.VENV}: Permission denied\n"


def test_a_venv_left_half_made_is_removed_and_the_failure_is_one_line(checkout, monkeypatch, capsys):
    """ensurepip failing (a full disk) after pyvenv.cfg and bin/python exist: the next run would take the venv for
    made and fail in pip, so dev.py removes what it made."""
    _, commands = checkout

    def half_made(path, with_pip):
        os.makedirs(os.path.join(path, "bin"))
        for name in ("pyvenv.cfg", os.path.join("bin", "python")):
            open(os.path.join(path, name), "w").close()
        raise subprocess.CalledProcessError(1, ["python", "-m", "ensurepip"])

    monkeypatch.setattr(dev.venv, "create", half_made)
    with pytest.raises(SystemExit) as exit_info:
        dev.main(["demo"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and commands == [] and err.count("\n") == 1
    assert err.startswith(f"dev.py: error: cannot create {dev.VENV}: Command ") and not os.path.lexists(dev.VENV)


@pytest.mark.parametrize("argv,code", [([], 2), (["tset"], 2), (["--help"], 0)])
def test_anything_else_runs_nothing(argv, code, checkout, capsys):
    _, commands = checkout
    if code:
        with pytest.raises(SystemExit) as exit_info:
            dev.main(argv)
        assert exit_info.value.code == code
        assert capsys.readouterr().err.startswith("dev.py: error: expected `python3.11 dev.py demo`")
    else:
        assert dev.main(argv) == 0 and "python3.11 dev.py test" in capsys.readouterr().out
    assert commands == [] and not os.path.exists(dev.VENV)


def test_an_old_python_is_told_which_it_needs(checkout, monkeypatch, capsys):
    monkeypatch.setattr(sys, "version_info", (3, 10, 12))
    with pytest.raises(SystemExit):
        dev.main(["demo"])
    assert "needs Python 3.11 or newer" in capsys.readouterr().err and not os.path.exists(dev.VENV)
