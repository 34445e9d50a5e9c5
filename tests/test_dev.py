"""dev.py, the two commands of a fresh machine: the environment is made once and installed again only when the pins
change, a .venv that is not a virtual environment is never touched, a second demo continues the first, the tests
run as CI runs them (the default selection, then the slow one, both reported), a full disk is named, and Ctrl-C lets
the command under way finish its own line before dev.py exits 130."""

import errno
import os
import signal
import subprocess
import shutil
import sys
import textwrap

import pytest

import dev


class Commands(list):
    """The commands dev.py ran (without the interpreter); `codes`: the exit status of the n-th one (from 1), else 0."""

    def __init__(self):
        super().__init__()
        self.codes = {}


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

    def run(command, stderr_seen=None):  # exit status 0 unless a test sets commands.codes[len(commands)]
        commands.append(command[1:])
        return commands.codes.get(len(commands), 0)

    commands = Commands()
    monkeypatch.setattr(dev, "run", run)
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
    # With arguments for train.py it is another run (--algo grpo writes runs/tiny-grpo, which does not exist yet):
    # passed as they are, never with a --resume of a run that is not there.
    assert dev.main(["demo", "--algo", "grpo"]) == 0
    assert commands[-1] == ["train.py", "--preset", "tiny", "--algo", "grpo"]


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


def test_a_failed_venv_creation_leaves_a_venv_the_user_already_had(checkout, monkeypatch, capsys):
    """A .venv of the user's (pyvenv.cfg, no bin/python yet: made by hand, or with another layout) that venv.create
    cannot finish: one line, and the folder with everything in it stays (only a .venv dev.py made is removed)."""
    root, commands = checkout
    (root / ".venv").mkdir()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / ".venv" / "notes.txt").write_text("mine")

    def read_only(path, with_pip):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(dev.venv, "create", read_only)
    with pytest.raises(SystemExit) as exit_info:
        dev.main(["demo"])
    assert exit_info.value.code == 2 and commands == []
    assert capsys.readouterr().err == f"dev.py: error: cannot create {dev.VENV}: Permission denied\n"
    assert sorted(os.listdir(root / ".venv")) == ["notes.txt", "pyvenv.cfg"]
    assert (root / ".venv" / "notes.txt").read_text() == "mine"


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


def test_both_suites_run_and_each_is_reported_when_the_first_fails(checkout, capsys):
    """A failure in the default suite (a load-dependent test on a busy machine, say) does not skip the slow suite:
    both run, both are reported, and the exit status is the failure's."""
    root, commands = checkout
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("")
    (root / ".venv" / "bin" / "python").write_text("")
    (root / ".venv" / "spiral-ref-installed").write_text(dev.wanted_stamp())
    commands.codes = {1: 1}
    assert dev.main(["test"]) == 1
    assert commands == [["-m", "pytest", "-q", "tests"], ["-m", "pytest", "-q", "-m", "slow", "tests"]]
    out, err = capsys.readouterr()
    assert "dev.py: the default suite FAILED" in err and "dev.py: the slow suite passed" in out
    commands.clear()
    commands.codes = {2: 1}
    assert dev.main(["test"]) == 1 and len(commands) == 2
    assert "dev.py: the slow suite FAILED" in capsys.readouterr().err
    commands.clear()
    commands.codes = {1: 5}  # -k selecting only slow tests: the default suite selects none, which is no failure
    assert dev.main(["test", "-k", "resume"]) == 0


def test_the_install_says_what_it_is_about_to_do_before_pip_starts(checkout, capsys):
    """pip --quiet prints nothing for minutes: the line before it says how many packages and that it is quiet."""
    root, commands = checkout
    assert dev.main(["demo"]) == 0
    out = capsys.readouterr().out
    named = len(dev.requirements())
    assert named == 1 + sum(1 for line in (root / "requirements.txt").read_text().splitlines()
                            if line.strip() and not line.startswith("#"))
    assert f"dev.py: creating {dev.VENV}" in out and f"dev.py: installing {named} packages (torch, " in out
    assert out.index("installing") < out.index("$ pip install") < out.index("$ python train.py")


def _enospc(path, with_pip):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def _ensurepip_enospc(path, with_pip):  # venv runs ensurepip with check_output: its output holds the cause
    os.makedirs(os.path.join(path, "bin"))
    raise subprocess.CalledProcessError(1, ["python", "-m", "ensurepip"], output=b"OSError: [Errno 28] No space left "
                                        b"on device: '/x/.venv/lib/python3.11/site-packages/pip'\n")


@pytest.mark.parametrize("where", ["venv", "ensurepip", "pip", "stamp"])
def test_a_full_disk_is_named_in_one_line(where, checkout, monkeypatch, capsys):
    root, commands = checkout
    if where == "venv":
        monkeypatch.setattr(dev.venv, "create", _enospc)
    elif where == "ensurepip":
        monkeypatch.setattr(dev.venv, "create", _ensurepip_enospc)
    elif where == "pip":
        def pip(command, stderr_seen=None):
            commands.append(command[1:])
            stderr_seen.append("ERROR: Could not install packages due to an OSError: [Errno 28] No space left on "
                               "device\n")
            return 1
        monkeypatch.setattr(dev, "run", pip)
    else:
        real_open = open

        def full(path, mode="r", *args, **kwargs):
            if path == dev.STAMP and "w" in mode:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            return real_open(path, mode, *args, **kwargs)
        monkeypatch.setattr("builtins.open", full)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        dev.main(["demo"])
    err = capsys.readouterr().err
    assert exit_info.value.code in (1, 2) and err.count("\n") == 1 and err.startswith("dev.py: error: "), err
    assert "the disk is full (" in err and "MiB free for " in err, err
    assert not os.path.exists(dev.STAMP) and ["train.py", "--preset", "tiny"] not in commands
    if where in ("venv", "ensurepip"):
        assert not os.path.lexists(dev.VENV)  # half made by dev.py: removed


def test_run_returns_the_status_and_relays_the_stderr_it_collects(capfd):
    seen = []
    code = dev.run([sys.executable, "-c", "import sys; print('to the screen', file=sys.stderr); sys.exit(3)"], seen)
    assert code == 3 and seen == ["to the screen\n"] and capfd.readouterr().err == "to the screen\n"


# The command dev.py runs, in a test: records its arguments, says it is ready, and on Ctrl-C takes a second to finish
# its own line, as train.py saves nothing half-written and then prints "continue with --resume".
FAKE_COMMAND = """\
import sys, time
with open(sys.argv[1] + ".calls", "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
try:
    print("ready", flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    time.sleep(1)  # longer than the 0.25 s subprocess.run gives a command before killing it
    print("fake: interrupted; continue with --resume", file=sys.stderr, flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("command", ["demo", "test"])
def test_ctrl_c_lets_the_command_finish_its_line_then_exits_130_without_a_traceback(command, tmp_path):
    """A terminal's Ctrl-C: SIGINT to the whole process group, dev.py and its command. The command's own line is
    the only one on stderr, dev.py exits 130, and `test` does not go on to the slow suite."""
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_COMMAND)
    python = tmp_path / "python"  # what environment() returns: the fake command, named after itself
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} {python} \"$@\"\n")
    python.chmod(0o755)
    driver = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {dev.ROOT!r})
        import dev
        dev.ROOT = {str(tmp_path)!r}
        dev.environment = lambda: {str(python)!r}
        sys.exit(dev.main([{command!r}]))
    """)
    # A session of its own (so that the signal goes to its group only), SIGINT at its default as a terminal starts a
    # process: run in the background (nohup), pytest has it ignored and dev.py would inherit that.
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:
            if line == "ready\n":
                break
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and err == "fake: interrupted; continue with --resume\n", err
    assert len((tmp_path / "python.calls").read_text().splitlines()) == 1  # not the slow suite after the default


def test_requirements_ask_only_for_extras_the_installed_packages_define():
    """A requested extra that the package does not define (`math-verify[antlr4_13_2]` against math-verify 0.9.0, whose
    metadata says antlr4-13-2, which the pip of a fresh `python3.11 -m venv` does not match to it) makes every install
    warn; each requirement is also met by what is installed here, the ANTLR runtime included."""
    import importlib.metadata

    from packaging.requirements import Requirement

    with open(os.path.join(dev.ROOT, "requirements.txt"), encoding="utf-8") as f:
        wanted = [Requirement(line.split("#")[0].strip()) for line in f if line.split("#")[0].strip()]
    assert "antlr4-python3-runtime" in {r.name for r in wanted}  # math-verify's LaTeX parser
    for requirement in wanted:
        metadata = importlib.metadata.metadata(requirement.name)
        assert requirement.extras <= set(metadata.get_all("Provides-Extra") or []), requirement
        assert requirement.specifier.contains(metadata["Version"], prereleases=True), requirement
