"""The README's demo figures hold on any machine: a fresh run of the README's commands, with a seed that
is not among the table's, lands inside the range the README states for every figure that comes from training: the
prediction interval of one new run from n seeds at 99% for a whole table at once (stated_range); the warm start's
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
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from stats import t_quantile  # noqa: E402  Student's t quantile, by bisection on the incomplete beta
FRESH_SEED = 7  # not one of the seeds in the README's tables
DEMO_PROBLEMS, SECOND_TASK_PROBLEMS = 100, 50  # the evaluations' --limit, as the tables were made
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


ALPHA = 0.01  # the chance that a fresh run falls outside any cell of a table, the whole table at once


def unseen_errors(n_seeds: int, problems: int, alpha: float) -> int:
    """The most problems a fresh run may get wrong, at level alpha, in a cell where n runs got all P right: e with
    P(X > e) <= alpha for X the errors of a new run of P problems, X ~ BetaBinomial(P, 1, nP + 1) (a uniform prior on
    the per-problem error rate, updated with the nP right answers). Roughly, k errors have chance (n + 1)^-k: five
    seeds all right on 50 problems leave a fresh run 3 errors at alpha = 0.01/14 (four have chance 0.0007)."""
    b = n_seeds * problems + 1
    log_norm = math.lgamma(1) + math.lgamma(b) - math.lgamma(1 + b)  # log B(1, b)

    def pmf(x: int) -> float:
        log_choose = math.lgamma(problems + 1) - math.lgamma(x + 1) - math.lgamma(problems - x + 1)
        log_beta = math.lgamma(x + 1) + math.lgamma(problems - x + b) - math.lgamma(problems + 1 + b)
        return math.exp(log_choose + log_beta - log_norm)

    tail, e = 1.0, -1
    while tail > alpha:  # tail = P(X > e)
        e += 1
        tail -= pmf(e)
    return e


def stated_range(cell: str, n_seeds: int, cells: int, problems: int | None = None) -> tuple[float, float]:
    """The stated range for one new run of a cell "mean ± sd [min, max]" over n seeds, in a table of `cells` trained
    cells checked at once: mean ± max(t sd sqrt(1 + 1/n), floor) with t Student's t(n - 1) quantile 1 - alpha/(2 cells),
    the prediction interval at 1 - alpha for the whole table if runs spread normally (Bonferroni: each cell at
    alpha/cells; t pays for n seeds estimating sd only roughly). The floor, where the seeds agree: 0.02 for a training
    curve's cells; for an evaluation on P problems, the errors a fresh run may make that n seeds with none cannot rule
    out (unseen_errors), over P, at least 0.02."""
    mean, sd = (float(v) for v in CELL.match(cell).groups()[:2])
    floor = 0.02 if problems is None else max(unseen_errors(n_seeds, problems, ALPHA / cells) / problems, 0.02)
    half = max(t_quantile(1 - ALPHA / (2 * cells), n_seeds - 1) * sd * (1 + 1 / n_seeds) ** 0.5, floor)
    return mean - half, mean + half


def seeds_in(label: str) -> int:
    """n from a table label such as "5 seeds: mean ± sd [min, max]" or "SPIRAL (5 seeds)"."""
    return int(re.search(r"(\d+) seeds", label).group(1))


def outside(checks: list[tuple[str, float, float, float]]) -> list[str]:
    """The (what, value, low, high) checks whose value is outside [low, high], each as a line."""
    return [f"{what}: {value:.3f} outside [{low:.3f}, {high:.3f}]" for what, value, low, high in checks
            if not low <= value <= high]


def test_the_stated_range_is_the_table_wide_99_percent_prediction_interval():
    """Fast (not slow): the quantiles are right and the rule is the one EXPERIMENTS.md states."""
    # Student's t from a printed table (two-sided 99%, 99.9%, and 95% at df = 1)
    for p, df, t in [(0.995, 4, 4.604), (0.995, 2, 9.925), (0.9995, 4, 8.610), (0.975, 1, 12.706)]:
        assert abs(t_quantile(p, df) - t) < 2e-3, (p, df)
    # unseen_errors against the beta-binomial by its definition: integrate the rate r against the posterior
    # (nP + 1)(1 - r)^(nP) (uniform prior, nP right answers), the midpoint rule
    n, problems, level = 5, 50, ALPHA / 14
    steps = 200_000

    def tail(e: int) -> float:  # P(X > e)
        total = 0.0
        for i in range(steps):
            r = (i + 0.5) / steps
            right = sum(math.comb(problems, x) * r ** x * (1 - r) ** (problems - x) for x in range(e + 1))
            total += (1 - right) * (n * problems + 1) * (1 - r) ** (n * problems) / steps
        return total

    e = unseen_errors(n, problems, level)
    assert e == 3 and tail(e) <= level < tail(e - 1), (e, tail(e), tail(e - 1))
    # the rule on the second task's cells (14 trained cells, 50 problems, 5 seeds)
    assert stated_range("1.000 ± 0.000 [1.000, 1.000]", 5, cells=14, problems=50) == (0.94, 1.06)  # 3 errors of 50
    low, high = stated_range("0.986 ± 0.008 [0.979, 0.995]", 5, cells=14, problems=50)
    assert (round(low, 3), round(high, 3)) == (0.904, 1.068)  # t(4) at 1 - 0.01/28 = 9.398; x 0.008 x sqrt(6/5)
    assert stated_range("0.26 ± 0.00 [0.26, 0.27]", 5, cells=8) == pytest.approx((0.24, 0.28))  # a curve's floor
    # it still tells a trained run from an untrained one where the seeds agree: the warm start's pass@1 and majority@8
    # are outside both trained rows' ranges (RSA's are not: GRPO's seeds spread 0.645-0.940 at step 2)
    table = second_task_table()
    for column in ("pass@1", "majority@8"):
        trained = [cell for row, cells in table.items() if row != "warm start" for cell in [cells[column]]]
        for cell in trained:
            low, high = stated_range(cell, 5, cells=14, problems=50)
            assert not low <= float(table["warm start"][column]) <= high, (column, cell)
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
    subprocess.run([sys.executable, "evaluate.py", "--preset", "tiny", "--limit", str(DEMO_PROBLEMS), "--policy",
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
            checks.append((f"{label}, {part} of steps", value,
                           *stated_range(table[label][i], seeds_in(header[0]), cells=2 * len(table))))
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
            checks.append((f"{label}, {column}", cells[label][column],
                           *stated_range(cell, seeds_in(header[0]), cells=2 * len(table), problems=DEMO_PROBLEMS)))
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
    subprocess.run([sys.executable, "evaluate.py", "--preset", "tiny_parts", "--limit", str(SECOND_TASK_PROBLEMS), "--method", "all",
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
                checks.append((f"{label}, {column}", value,
                               *stated_range(cell, seeds_in(row), cells=2 * len(second_task.COLUMNS), problems=SECOND_TASK_PROBLEMS)))
    assert not outside(checks), "\n".join(outside(checks))
