"""tests/mutate.py, the mutation harness: its list format, that every mutation list still applies to its module
(a list that no longer matches the code is found here, not when someone runs it), and how a run's outcome is told."""

import pathlib
import subprocess

import pytest

import mutate

ROOT = pathlib.Path(__file__).resolve().parents[1]
LISTS = sorted((ROOT / "tests" / "mutations").glob("*.txt"))


def test_the_list_format():
    tests, mutations = mutate.parse("""# a comment
tests: tests/test_a.py tests/test_b.py

@ off by one
<     if n > limit:
>     if n >= limit:
@ two lines become one, then a deletion
< a = 1
<
< b = 2
> a = b = 2
@ deleted
< x()
""")
    assert tests == ["tests/test_a.py", "tests/test_b.py"]
    assert [(m.description, m.old, m.new, m.line) for m in mutations] == [
        ("off by one", "    if n > limit:", "    if n >= limit:", 4),
        ("two lines become one, then a deletion", "a = 1\n\nb = 2", "a = b = 2", 7),
        ("deleted", "x()", "", 12)]
    assert mutate.apply("a = 1\n\nb = 2\nprint(a)\n", mutations[1]) == "a = b = 2\nprint(a)\n"


@pytest.mark.parametrize("text, message", [
    ("@ no old text\n> new\n", "line 1: mutation 'no old text' has no '<' line"),
    ("< old before any @\n", "line 1: expected"),
    ("@ x\n<old without its space\n", "line 2: expected"),
])
def test_a_malformed_list_names_its_line(text, message):
    with pytest.raises(ValueError, match=message):
        mutate.parse(text, "list")


def test_old_text_must_occur_exactly_once():
    (mutation,) = mutate.parse("@ m\n< x = 1\n> x = 2\n")[1]
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutate.apply("y = 1\n", mutation)
    with pytest.raises(ValueError, match="occurs 2 times"):
        mutate.apply("x = 1\nx = 1\n", mutation)


def module_of(stem: str) -> pathlib.Path:
    """The module a list NAME.txt mutates: NAME.py at the root, else the one tracked NAME.py elsewhere (runner.txt:
    benchmarks/runner.py, run as `python tests/mutate.py benchmarks/runner.py`)."""
    if (ROOT / f"{stem}.py").is_file():
        return ROOT / f"{stem}.py"
    tracked = subprocess.run(["git", "ls-files", f"*/{stem}.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    found = [name for name in tracked if not name.startswith("tests/")]
    assert len(found) == 1, f"{stem}.txt: which module does it mutate? {found}"
    return ROOT / found[0]


@pytest.mark.parametrize("path", LISTS, ids=lambda p: p.name)
def test_every_mutation_list_applies_to_its_module_and_names_existing_tests(path):
    tests, mutations = mutate.parse(path.read_text(), path.name)
    source = module_of(path.stem).read_text()
    assert mutations and tests
    for m in mutations:
        mutated = mutate.apply(source, m)  # raises unless the '<' text occurs exactly once
        assert mutated != source
        compile(mutated, f"{path.stem}.py", "exec")  # a planted bug, not a syntax error
    assert all((ROOT / t).is_file() for t in tests), tests


def test_outcomes_are_told_apart(tmp_path, monkeypatch):
    """One real pytest run (its summary line format), then the other outcomes from stand-in runs."""
    (tmp_path / "test_x.py").write_text("def test_ok():\n    pass\ndef test_bad():\n    assert 1 == 2\n")
    assert mutate.run_tests(str(tmp_path), ["test_x.py"], ["-k", "ok or bad"], 120)[:2] == (
        "failed", "FAILED test_x.py::test_bad")

    def stand_in(returncode, stdout="", timeout=False):
        def run(command, **kwargs):
            if timeout:
                raise mutate.subprocess.TimeoutExpired(command, kwargs["timeout"])
            assert kwargs["env"]["PYTHONDONTWRITEBYTECODE"] == "1"  # no stale .pyc of a mutant
            return mutate.subprocess.CompletedProcess(command, returncode, stdout, "")
        monkeypatch.setattr(mutate.subprocess, "run", run)
    stand_in(0, "1 passed in 0.01s\n")
    assert mutate.run_tests(".", ["t.py"], [], 9)[:2] == ("passed", "")
    stand_in(2, "ERROR t.py - ModuleNotFoundError: No module named 'x'\n1 error in 0.1s\n")
    assert mutate.run_tests(".", ["t.py"], [], 9)[:2] == ("error", "ERROR t.py")
    stand_in(4, "ERROR: file or directory not found: t.py\n")
    assert mutate.run_tests(".", ["t.py"], [], 9)[:2] == ("error", "pytest exit 4: ERROR: file or directory not "
                                                          "found: t.py")
    stand_in(None, timeout=True)
    assert mutate.run_tests(".", ["t.py"], [], 9)[:2] == ("timeout", "over 9 s")


@pytest.mark.parametrize("argv, message", [
    (["cli.py", "--bogus"], "unrecognized arguments: --bogus"),
    (["cli.py", "--only", "x"], "--only expects comma-separated mutation numbers, got 'x'"),
    (["cli.py", "--only", "999"], "numbers its mutations 1 to"),
    (["cli.py", "--timeout", "-1"], "--timeout must be positive"),
    (["cli.py", "--mutations", "{tmp}/notes.txt"], "notes.txt, line 1: expected"),  # not a mutation list
    (["cli.py", "--mutations", "tests/mutations/train.txt"], "occurs 0 times in the module"),  # another module's list
    ([str(ROOT.parent / "elsewhere" / "cli.py")], "is outside the repository"),  # copy/../elsewhere: not the copy
])
def test_a_bad_argument_is_one_line_before_anything_runs(argv, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("some notes\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    monkeypatch.setattr(mutate, "copy_repository", lambda *a: pytest.fail("started work"))
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        mutate.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("tests/mutate.py: error: "), err
    assert message in err, err
