"""benchmarks/set_rl.py: its four arms and their budgets, every output checked before any work, and the tables and
figure it makes from finished runs and an evaluation (stand-ins for train.py and evaluate.py: nothing trains)."""

import json
import os

import numpy as np
import pytest

from tests.test_benchmark_scripts import _fake_run
from tests.test_user_files import _load, _one_line, _snapshot, nothing_runs  # noqa: F401 (a fixture)
import figures
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
set_rl, runner = _load("set_rl"), _load("runner")


def test_the_arms_differ_only_where_they_should_and_share_the_maximum_budget():
    """SPIRAL and the ablation differ in --search-advantage alone; GRPO's two arms in G and L; all four have the same
    maximum budget per problem, and the equal-tokens arm has the group size the script states."""
    cfgs = {run.name.split("-s")[0]: train.resolve_config(vars(train.build_parser().parse_args(
        [*run.flags, "--out", run.out]))) for run in set_rl.training_runs([3], None, "runs/x")}
    assert set(cfgs) == set(set_rl.ARMS) and {c.seed for c in cfgs.values()} == {3}
    budgets = {arm: train.token_budget_per_problem(c) for arm, c in cfgs.items()}
    assert set(budgets.values()) == {(8 + 4 * 4) * 28}, budgets
    spiral, own = (vars(cfgs[a]) for a in ("spiral", "own"))
    assert {k for k in spiral if spiral[k] != own[k]} == {"search_advantage", "out"}
    assert own["search_advantage"] == "own"
    assert (cfgs["grpo"].group_size, cfgs["grpo"].max_new_tokens) == (12, 56)
    assert (cfgs["grpo24"].group_size, cfgs["grpo24"].max_new_tokens) == (set_rl.GROUP_EQUAL_TOKENS, 28)
    assert all(c.preset == "tiny_parts6" and c.steps == 40 for c in cfgs.values())


def test_the_evaluation_holds_every_run_and_the_cross_pairs_of_each_seed():
    args = set_rl.evaluation_args([0, 1], "runs/x", 50, "runs/x/eval/results.json", cross=True)
    policies = [a.split("=")[1] for a in args if a.startswith("--policy=")]
    assert sorted(policies) == sorted(f"{arm}-s{s}" for arm in set_rl.ARMS for s in (0, 1))
    assert args[args.index("--preset") + 1] == "tiny_parts6" and "base=data/tiny_parts6_warmstart" in args
    cross = [a.split("=", 1)[1] for a in args if a.startswith("--cross=")]
    assert len(cross) == 2 * 4 * 3 and "spiral-s1=own-s1" in cross and "base=spiral-s0" in cross
    assert not any(a.split("=")[0].split("-s")[-1] != a.split("=")[1].split("-s")[-1] for a in cross
                   if "base" not in a)  # a pair never mixes seeds
    assert not any(a.startswith("--cross") for a in set_rl.evaluation_args([0, 1], "r", 5, "o", cross=False))


def test_help_typos_and_bad_outputs_run_nothing(tmp_path, nothing_runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        set_rl.main(["--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out
    for argv, message in ((["--sedes", "1"], "unrecognized arguments: --sedes"),
                          (["--seeds", "0"], "need at least 2 non-negative seeds"),
                          (["--out", "/proc/x/set_rl"], "--out '/proc/x/set_rl': /proc is not writable")):
        with pytest.raises(SystemExit) as exit_info:
            set_rl.main(argv)
        assert exit_info.value.code == 2
        _one_line(capsys, "set_rl.py", message)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (tmp_path / "t.md").write_text("my notes")
    before = _snapshot(tmp_path)
    for argv, message in ((["--runs-dir", str(folder), "--out", str(tmp_path / "u")], "it holds notes.txt"),
                          (["--runs-dir", str(tmp_path / "r"), "--out", str(tmp_path / "t")],
                           "was not written by set_rl.py")):
        with pytest.raises(SystemExit) as exit_info:
            set_rl.main(["--seeds", "0,1", *argv])
        assert exit_info.value.code == 2
        _one_line(capsys, "set_rl.py", message)
    assert _snapshot(tmp_path) == before


def test_a_run_with_other_settings_stops_the_script_before_any_work(tmp_path, nothing_runs, capsys):
    runs = tmp_path / "runs"
    _fake_run(runs / "own-s0", ["--preset", "tiny_parts6", "--algo", "spiral", "--seed", "0"], 40)  # not "own"
    before = _snapshot(runs)
    with pytest.raises(SystemExit) as exit_info:
        set_rl.main(["--seeds", "0,1", "--runs-dir", str(runs), "--out", str(tmp_path / "t")])
    assert exit_info.value.code == 2
    _one_line(capsys, "set_rl.py", "own-s0 exists and cannot be reused", "search_advantage='set', not 'own'")
    assert _snapshot(runs) == before


def _summary(x):
    """One policy's evaluate.py summary (the documented schema) with every accuracy x."""
    return {"passk": {"k": [1, 2, 4, 8], "pass_at_k": [x, x, x, x]},
            "majority": {"k": [1, 2, 4, 8], "accuracy": [x] * 4},
            "rsa": [{"population": 4, "step": [1, 2, 3], "pass_at_1": [x, x + 0.01, x + 0.02],
                     "tokens": [92.0, 184.0, 276.0], "search_tokens": [92.0] * 3,
                     "aggregation_tokens": [0.0, 92.0, 184.0]}],
            "sets": {"search": {"k": [1, 2, 4, 8], "distinct_answers": [1.0, 1.5, 2.0 + x, 3.0]},
                     "rsa": [{"population": 4, "set_size": 4, "step": [2, 3], "coverage": [x, x],
                              "sets_by_correct": [[10, 0, 0, 0, 30], [0] * 5],
                              "hits_by_correct": [[round(10 * x), 0, 0, 0, 30], [0] * 5]}]}}


def _metrics(arm, seed, steps=40):
    """metrics.jsonl rows: search accuracy 0.01 t + 0.1 s, entropy 1 - accuracy; SPIRAL-like arms by level."""
    rows = []
    for t in range(1, steps + 1):
        acc = 0.01 * t + 0.1 * seed
        if arm.startswith("grpo"):
            row = {"accuracy": acc, "rollout/entropy_grpo": 1 - acc, "tokens_per_problem": 276.0 + seed,
                   "token_budget_per_problem": 672, "problems_kept": 4}
        else:
            row = {"search_accuracy": acc, "aggregation_accuracy": acc + 0.1, "rollout/entropy_search": 1 - acc,
                   "tokens_per_problem": 552.0, "tokens_per_problem_search": 184.0,
                   "tokens_per_problem_aggregation": 368.0, "token_budget_per_problem": 672, "problems_kept": 8}
        rows.append({"step": t, **row})
    return rows


def test_tables_and_figure_from_finished_runs_and_a_stand_in_evaluation(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    runs, seeds = tmp_path / "runs", [0, 1]
    for run in set_rl.training_runs(seeds, None, str(runs)):
        _fake_run(runs / run.name, run.flags, 0)
        arm, seed = run.name.split("-s")
        (runs / run.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _metrics(arm, int(seed))))
    calls = []

    def fake_evaluate(cmd, *args, **kwargs):
        calls.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        os.makedirs(os.path.dirname(out), exist_ok=True)
        values = {"base": 0.05, **{f"{a}-s{s}": 0.2 + 0.1 * i + 0.05 * s for i, a in enumerate(set_rl.ARMS)
                                   for s in seeds}}
        policies = {name: {"summary": _summary(x)} for name, x in values.items()}
        open(out, "w").write(json.dumps({"config": {"limit": 7}, "policies": policies}))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(runner.subprocess, "run", fake_evaluate)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("trained a finished run"))
    out = tmp_path / "result" / "r"
    assert set_rl.main(["--seeds", "0,1", "--runs-dir", str(runs), "--out", str(out), "--no-cross"]) == 0
    assert len(calls) == 1 and "--cross" not in " ".join(calls[0])
    md = (tmp_path / "result" / "r.md").read_text()
    assert md.startswith("<!-- written by benchmarks/set_rl.py --seeds 0,1 --steps 40 --limit 100 --no-cross -->")
    sections = {part.split("\n")[0]: {line.split(" | ")[0].strip("| "): line for line in part.splitlines()
                                       if line.startswith("| ")} for part in md.split("## ")[1:]}
    rows = {k: v for table in sections.values() for k, v in table.items()}  # first-column labels, last table wins
    rows |= next(t for title, t in sections.items() if title.startswith("Held-out"))
    # pass@1 of SPIRAL (arm 0): 0.20 and 0.25; of GRPO (arm 2): 0.40 and 0.45
    assert "| 0.225 ± 0.035 [0.200, 0.250] |" in rows["SPIRAL (2 seeds)"]
    assert rows["GRPO, equal max budget (2 seeds)"].split(" | ")[1] == "0.425 ± 0.035 [0.400, 0.450]"
    assert rows["warm start"].split(" | ")[1] == "0.050"
    assert "| 276 ± 0 [276, 276] |" in rows["SPIRAL (2 seeds)"]  # evaluation tokens at RSA step 3
    # training: SPIRAL's tokens by level, GRPO's its own; accuracies over the first/last 4 steps (10% of 40)
    assert rows["tokens generated per drawn problem (mean over steps)"].split(" | ")[1:] == [
        "552 ± 0 [552, 552]", "552 ± 0 [552, 552]", "276 ± 1 [276, 277]", "276 ± 1 [276, 277] |"]
    assert "| 368 ± 0 [368, 368] | 368 ± 0 [368, 368] | - | - |" in rows["of which aggregation traces"]
    assert "0.075 ± 0.071 [0.025, 0.125]" in rows["search accuracy, first 10% of steps"]
    # matched accuracy: steps with accuracy in [0.2, 0.4): seed 0 steps 20-39, seed 1 steps 10-29 -> 40 steps
    entropy = next(t for title, t in sections.items() if title.startswith("Search-trace entropy"))
    assert entropy["SPIRAL"].split(" | ")[2] == "0.705 (40)"
    # the sets of step 2 pooled over seeds: SPIRAL's c = 0 sets hit 2 + 2 of 20 (x = 0.20, 0.25)
    sets = next(t for title, t in sections.items() if title.startswith("The sets RSA step 2"))
    assert sets["SPIRAL"].split(" | ")[1:4] == ["80", "0.225", "0.200 (20)"]
    assert sets["warm start"].split(" | ")[1:4] == ["40", "0.050", "0.000 (10)"]  # round(10 x 0.05) = 0 hits
    saved = json.loads((tmp_path / "result" / "r.json").read_text())
    assert saved["cells"]["sets_step2"]["SPIRAL"]["hits_by_correct"] == [4, 0, 0, 0, 60]
    assert saved["cells"]["evaluation"]["spiral"]["pass@1"] == [0.2, 0.25]
    assert saved["cells"]["training"]["maximum budget per problem"]["grpo24"] == [672, 672]
    assert (tmp_path / "result" / "r.png").stat().st_size > 10_000


def test_entropy_at_matched_accuracy_bins_every_step_of_every_seed():
    runs = {arm: [_metrics(arm, 0, 10)] for arm in set_rl.ARMS}  # accuracies 0.01 .. 0.10: all in the first bin
    runs["spiral"] = [[{"step": 1, "search_accuracy": 0.1, "rollout/entropy_search": 0.9},
                       {"step": 2, "search_accuracy": 0.5, "rollout/entropy_search": 0.3}],
                      [{"step": 1, "search_accuracy": 0.15, "rollout/entropy_search": 0.7}]]
    _, cells = set_rl.entropy_at_matched_accuracy(runs)
    assert cells["spiral"][0] == [pytest.approx(0.8), 2] and cells["spiral"][2] == [0.3, 1]
    assert cells["spiral"][1] == [None, 0]
    assert cells["grpo"][0] == [pytest.approx(1 - 0.055), 10]  # GRPO reads accuracy and entropy_grpo


def test_entropy_points_pair_each_step_s_smoothed_accuracy_and_entropy():
    rows = [{"step": t, "search_accuracy": 0.1 * t, "rollout/entropy_search": 1.0 - 0.05 * t} for t in range(1, 8)]
    rows.insert(3, {"step": 99, "search_accuracy": 0.3})  # no entropy: left out
    (x, y), = figures.entropy_accuracy_points([rows], "search_accuracy", "rollout/entropy_search", window=3)
    assert np.allclose(x, [0.2, 0.3, 0.4, 0.5, 0.6]) and np.allclose(y, [0.9, 0.85, 0.8, 0.75, 0.7])
    assert figures.entropy_accuracy_points([rows], "accuracy", "rollout/entropy_grpo") == []


def test_cross_table_reads_each_pair_of_each_seed_and_the_diagonal_from_the_policies():
    """Rows: whose search traces; columns: whose aggregator; RSA P=4 step 2 over seeds. The diagonal is the policy's
    own RSA; a pair the evaluation lacks shows '-'."""
    seeds, arms = [0, 1], set_rl.CROSS_ARMS
    names = ["base", *[f"{a}-s{s}" for a in arms[1:] for s in seeds]]
    value = {name: 0.1 * i for i, name in enumerate(names)}
    policies = {n: {"summary": {"rsa": [{"population": 4, "pass_at_1": [0.0, value[n], 0.0]}]}} for n in names}
    cross = [{"search": a, "aggregator": b, "summary": {"rsa": [
        {"population": 8, "pass_at_1": [0, 0.99, 0]}, {"population": 4, "pass_at_1": [0, value[a] + value[b], 0]}]}}
        for a in names for b in names if a != b and (a == "base" or b == "base" or a[-1] == b[-1])
        and (a, b) != ("own-s1", "spiral-s1")]
    assert set_rl.cross_table({"policies": policies}, seeds) is None  # no cross block: no table
    markdown, cells = set_rl.cross_table({"policies": policies, "cross": cross}, seeds)
    assert cells["spiral|own"] == [pytest.approx(value["spiral-s0"] + value["own-s0"]),
                                   pytest.approx(value["spiral-s1"] + value["own-s1"])]
    assert cells["base|grpo"] == [pytest.approx(value["grpo-s0"]), pytest.approx(value["grpo-s1"])]
    assert cells["own|own"] == [value["own-s0"], value["own-s1"]] and cells["base|base"] == [0.0]
    assert cells["own|spiral"][1] is None
    rows = markdown.splitlines()
    assert rows[0] == "| search traces of \\ aggregator of | base | spiral | own | grpo |"
    assert rows[4].startswith("| own | ") and rows[4].split(" | ")[2] == "-"
