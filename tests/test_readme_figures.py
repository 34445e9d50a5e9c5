"""The README's demo figures hold on any machine: a fresh run of the README's commands, with a seed that
is not among the table's, lands inside the range the README states for every figure that comes from training: the
99% prediction interval of one new run from n seeds, mean ± max(t(n-1) sd sqrt(1 + 1/n), 0.02); the warm start's
column, which involves no training, to 0.01. The same for the second task's table. Each test reports every cell out
of its range, not only the first. Slow (CI runs them with `pytest -m slow`): the three tests took 12.5 minutes on a
busy 2-core machine, the second task's alone 2 minutes."""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest

import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRESH_SEED = 7  # not one of the seeds in the README's tables
CELL = re.compile(r"^(-?[\d.]+) ± ([\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]$")

spec = importlib.util.spec_from_file_location("reproduce", os.path.join(ROOT, "benchmarks", "reproduce.py"))
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)


def readme_block(name: str, header: bool = False) -> list[list[str]]:
    """The cells of the README's table between <!-- reproduce.py: NAME --> and <!-- /reproduce.py -->: its rows,
    after its header row when header=True."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(rf"<!-- reproduce\.py: {name} -->\n(.*?)<!-- /reproduce\.py -->", text, re.S).group(1)
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    return (rows[:1] if header else []) + rows[2:]  # past the |---| line


# t(df): Student's t quantile 0.995 with df degrees of freedom (two-sided 99%), from any t table
T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250}


def stated_range(cell: str, n_seeds: int) -> tuple[float, float]:
    """The README's range for one new run of a cell "mean ± sd [min, max]" over n seeds: mean ± max(t(n-1) sd
    sqrt(1 + 1/n), 0.02), the 99% prediction interval if runs spread normally (why so wide: n seeds estimate sd only
    roughly, and t pays for that), with a floor for cells the seeds agree on to the digit (pass@8 at 1.000)."""
    mean, sd = (float(v) for v in CELL.match(cell).groups()[:2])
    half = max(T_995[n_seeds - 1] * sd * (1 + 1 / n_seeds) ** 0.5, 0.02)
    return mean - half, mean + half


def seeds_in(label: str) -> int:
    """n from a table label such as "5 seeds: mean ± sd [min, max]" or "SPIRAL (5 seeds)"."""
    return int(re.search(r"(\d+) seeds", label).group(1))


def outside(checks: list[tuple[str, float, float, float]]) -> list[str]:
    """The (what, value, low, high) checks whose value is outside [low, high], each as a line."""
    return [f"{what}: {value:.3f} outside [{low:.3f}, {high:.3f}]" for what, value, low, high in checks
            if not low <= value <= high]


def test_the_stated_range_is_the_99_percent_prediction_interval():
    """Fast (not slow): the t table is right and the rule is the one the README states."""
    for df, t in T_995.items():  # P(|T| <= t) = 0.99 for Student's t with df degrees of freedom, by the midpoint rule
        density = lambda x: math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) * (
            1 + x * x / df) ** (-(df + 1) / 2)
        steps = 200_000
        mass = sum(density(-t + (i + 0.5) * 2 * t / steps) for i in range(steps)) * 2 * t / steps
        assert abs(mass - 0.99) < 2e-4, (df, mass)
    low, high = stated_range("0.990 ± 0.009 [0.985, 1.000]", 3)  # the cell a CI machine's fresh seed fell under
    assert (round(low, 3), round(high, 3)) == (0.887, 1.093)  # 9.925 x 0.009 x sqrt(4/3) = 0.103
    assert stated_range("1.000 ± 0.000 [1.000, 1.000]", 5) == (0.98, 1.02)  # the floor
    assert seeds_in("5 seeds: mean ± sd [min, max]") == 5 and seeds_in("SPIRAL (3 seeds)") == 3
    assert outside([("a", 0.5, 0.0, 1.0), ("b", 1.5, 0.0, 1.0)]) == ["b: 1.500 outside [0.000, 1.000]"]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The README's commands with --seed FRESH_SEED: both trainings, then the evaluation of both adapters."""
    root = tmp_path_factory.mktemp("fresh")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for algo, flags in reproduce.ALGOS.items():
        subprocess.run([sys.executable, "train.py", *flags, "--seed", str(FRESH_SEED), "--out", str(root / algo),
                        "--no-plot"], cwd=ROOT, check=True, env=env, capture_output=True)
    subprocess.run([sys.executable, "evaluate.py", "--preset", "tiny", "--limit", "100", "--policy",
                    "base=data/tiny_warmstart", "--policy", f"grpo={root / 'grpo' / 'adapter'}", "--policy",
                    f"spiral={root / 'spiral' / 'adapter'}", "--out", str(root / "eval.json"), "--cache-dir",
                    str(root / "cache")], cwd=ROOT, check=True, env=env, capture_output=True)
    rows = {algo: checkpoint.read_metrics(str(root / algo / "metrics.jsonl")) for algo in reproduce.ALGOS}
    with open(root / "eval.json") as f:
        return rows, json.load(f)["policies"]


@pytest.mark.slow
def test_training_figures_land_in_the_stated_range(fresh):
    rows, _ = fresh
    header, *body = readme_block("demo", header=True)
    table = {row[0]: row[1:] for row in body}
    assert [label for label, _, _ in reproduce.DEMO_ROWS] == list(table)
    checks = []
    for label, key, algo in reproduce.DEMO_ROWS:
        for i, (part, value) in enumerate(zip(("first 10%", "last 10%"), reproduce.first_last(rows[algo], key))):
            checks.append((f"{label}, {part} of steps", value, *stated_range(table[label][i], seeds_in(header[0]))))
    assert not outside(checks), "\n".join(outside(checks))


@pytest.mark.slow
def test_evaluation_figures_land_in_the_stated_range(fresh):
    _, policies = fresh
    header, *body = readme_block("comparison", header=True)
    table = {row[0]: row[1:] for row in body}
    cells = {label: reproduce.comparison_cells(policies[label]["summary"]) for label in ("base", "grpo", "spiral")}
    assert list(table) == list(cells["base"])
    checks = []
    for column, (warm, grpo, spiral) in table.items():
        value = cells["base"][column]  # no training in it: the same on every machine, to rounding
        checks.append((f"warm start, {column}", value, float(warm) - 0.01, float(warm) + 0.01))
        for label, cell in (("grpo", grpo), ("spiral", spiral)):
            checks.append((f"{label}, {column}", cells[label][column], *stated_range(cell, seeds_in(header[0]))))
    assert not outside(checks), "\n".join(outside(checks))


# ----------------------------------------------------------------------------------------------------------------------
# The second task's table (benchmarks/second_task.py, 5 seeds): a fresh seed lands in its range too


def second_task_table() -> dict[str, dict[str, str]]:
    """{policy label: {column: cell}} of EXPERIMENTS.md's table under "SPIRAL against GRPO" (tiny_parts)."""
    with open(os.path.join(ROOT, "EXPERIMENTS.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("**SPIRAL against GRPO**"):]
    lines = [line.strip() for line in section.splitlines() if line.startswith("| ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("| policy | pass@1 |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not cells[0] or cells[0].startswith("---"):
            continue
        if len(cells) != len(header):
            break
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


@pytest.mark.slow
def test_the_second_task_figures_land_in_the_stated_range(tmp_path):
    spec = importlib.util.spec_from_file_location("second_task", os.path.join(ROOT, "benchmarks", "second_task.py"))
    second_task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(second_task)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for algo in second_task.ALGOS:  # as second_task.py trains: the preset's 30 steps
        subprocess.run([sys.executable, "train.py", "--preset", "tiny_parts", "--algo", algo, "--seed",
                        str(FRESH_SEED), "--out", str(tmp_path / algo), "--no-plot"], cwd=ROOT, check=True, env=env,
                       capture_output=True)
    subprocess.run([sys.executable, "evaluate.py", "--preset", "tiny_parts", "--limit", "50", "--method", "all",
                    "--rsa-populations", "4", "--policy", "base=data/tiny_parts_warmstart", "--policy",
                    f"grpo={tmp_path / 'grpo' / 'adapter'}", "--policy", f"spiral={tmp_path / 'spiral' / 'adapter'}",
                    "--out", str(tmp_path / "eval.json")], cwd=ROOT, check=True, env=env, capture_output=True)
    with open(tmp_path / "eval.json") as f:
        policies = json.load(f)["policies"]
    table = second_task_table()
    labels = {"base": "warm start", **{label: next(row for row in table if row.lower().startswith(label + " ("))
                                       for label in ("grpo", "spiral")}}
    checks = []
    for label, row in labels.items():
        for column, read in second_task.COLUMNS:
            value, cell = read(policies[label]["summary"]), table[row][column]
            if label == "base":  # no training in it
                checks.append((f"warm start, {column}", value, float(cell) - 0.01, float(cell) + 0.01))
            else:
                checks.append((f"{label}, {column}", value, *stated_range(cell, seeds_in(row))))
    assert not outside(checks), "\n".join(outside(checks))
