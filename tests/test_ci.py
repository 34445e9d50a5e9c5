"""Nothing is lost by the default test run's speed: what pytest.ini leaves out (the `slow` tests), CI runs as a second
command, and the README names both."""

import configparser
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT, SLOW = "python -m pytest -q tests", "python -m pytest -q -m slow tests"


def test_ci_runs_the_default_command_and_then_the_slow_tests_it_leaves_out():
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    assert ini["pytest"]["addopts"].split() == ["-m", '"not', 'slow"']
    assert "slow:" in ini["pytest"]["markers"]
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert DEFAULT in commands and SLOW in commands and commands.index(DEFAULT) < commands.index(SLOW)
    assert commands[-1] == "bash .ci/engines"
    readme = (ROOT / "README.md").read_text()
    assert DEFAULT in readme and SLOW in readme
