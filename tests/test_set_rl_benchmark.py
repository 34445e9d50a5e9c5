"""benchmarks/set_rl.py: its seven arms and their budgets, the learning-rate grid's rule and split, every output
checked before any work, the statistics of its verdicts, and the tables and figure it makes from finished runs and
evaluations (stand-ins for train.py and evaluate.py: nothing trains)."""

import json
import os
import sys

import numpy as np
import pytest

from tests.test_benchmark_scripts import _fake_run
from tests.test_user_files import _load, _one_line, _snapshot, nothing_runs  # noqa: F401 (a fixture)
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # as the script runs: its modules import each other
import runner  # noqa: E402
import set_rl  # noqa: E402
import set_rl_report as report  # noqa: E402
import stats  # noqa: E402
TASK = set_rl.TASKS["tiny_parts6"]


def _config(run):
    return train.resolve_config(vars(train.build_parser().parse_args([*run.flags, "--out", run.out])))


def test_the_arms_differ_only_where_they_should_and_state_their_budgets():
    """Each SPIRAL-family arm differs from SPIRAL in its one switch; GRPO's two arms in G and L; every arm has the
    draw cap, the task's steps and the given rate; budgets: SPIRAL-family and GRPO equal, the oracle arms N1 L."""
    cfgs = {arm: _config(set_rl.make_run(arm, 0.004, 3, TASK, None, "runs/x")) for arm in set_rl.ARMS}
    spiral = vars(cfgs["spiral"])
    differ = {arm: {k for k in spiral if vars(c)[k] != spiral[k]} - {"out"} for arm, c in cfgs.items()}
    assert differ["own"] == {"search_advantage"} and differ["none"] == {"search_advantage"}
    assert differ["oracle"] == {"aggregator"} and differ["passn"] == {"aggregator", "num_sets"}
    assert (cfgs["none"].search_advantage, cfgs["passn"].num_sets) == ("none", "all")
    budgets = {arm: train.token_budget_per_problem(c) for arm, c in cfgs.items()}
    assert budgets == {"spiral": 672, "own": 672, "none": 672, "grpo": 672, "grpo_tok": 672, "oracle": 224,
                       "passn": 224}
    assert (cfgs["grpo"].group_size, cfgs["grpo"].max_new_tokens) == (12, 56)
    assert (cfgs["grpo_tok"].group_size, cfgs["grpo_tok"].max_new_tokens) == (24, 28)
    assert all((c.max_draws, c.steps, c.lr, c.seed, c.preset) == (64, 50, 0.004, 3, "tiny_parts6")
               for c in cfgs.values())
    assert set_rl.run_name("own", 0.002, 1) == "own-lr2e-03-s1"


def test_the_grid_rule_and_its_score():
    """All grid arms within the tolerance of their best at the default rate: one shared rate; one arm clearly
    better elsewhere: a grid for every arm. The score is the mean of pass@1, 2, 4, 8."""
    near = {"spiral": {0.001: 0.50, 0.002: 0.51, 0.004: 0.525}, "own": {0.001: 0.4, 0.002: 0.6, 0.004: 0.55}}
    rates, why = set_rl.choose_rates(near)
    assert set(rates) == set(set_rl.ARMS) and set(rates.values()) == {set_rl.DEFAULT_LR} and "share" in why
    far = {"spiral": {0.001: 0.50, 0.002: 0.51, 0.004: 0.54}, "own": near["own"]}
    rates, why = set_rl.choose_rates(far)
    assert rates is None and "spiral (best 0.004)" in why and "own" not in why.split(":")[0].replace("spiral", "")
    summary = {"passk": {"k": [1, 2, 4, 8, 16], "pass_at_k": [0.1, 0.2, 0.4, 0.6, 0.9]}}
    assert set_rl.grid_score(summary) == pytest.approx((0.1 + 0.2 + 0.4 + 0.6) / 4)


def test_the_validation_split_is_the_held_out_file_after_the_evaluated_problems(tmp_path):
    path = set_rl.validation_file(TASK, str(tmp_path), 100)
    heldout = [json.loads(line)["id"] for line in open(os.path.join(ROOT, TASK.heldout_file))]
    validation = [json.loads(line)["id"] for line in open(path)]
    assert validation == heldout[100:] and len(validation) == 100 and not set(validation) & set(heldout[:100])


def test_the_evaluations_hold_every_run_the_probe_the_paper_s_rsa_and_same_seed_cross_pairs():
    runs = {arm: [set_rl.make_run(arm, 0.002, s, TASK, None, "runs/x") for s in (0, 1)] for arm in set_rl.ARMS}
    calls = set_rl.evaluation_calls(TASK, runs, "runs/x", 50, cross=True)
    main = calls["heldout"]
    policies = [a.split("=")[1] for a in main if a.startswith("--policy=")]
    assert sorted(policies) == sorted(set_rl.run_name(a, 0.002, s) for a in set_rl.ARMS for s in (0, 1))
    assert "base=data/tiny_parts6_warmstart" in main and "--probe-aggregators" in main
    assert main[main.index("--rsa-populations") + 1] == "8" and main[main.index("--rsa-set-size") + 1] == "4"
    assert main[main.index("--num-samples") + 1] == "16" and main[main.index("--limit") + 1] == "50"
    cross = [a.split("=", 1)[1] for a in main if a.startswith("--cross=")]
    assert len(cross) == 2 * 4 * 3 and "spiral-lr2e-03-s1=own-lr2e-03-s1" in cross
    assert all(a.split("=")[0][-1] == a.split("=")[1][-1] for a in cross if "base" not in a)  # never mixes seeds
    assert calls["greedy"][calls["greedy"].index("--temperature") + 1] == "0.001"
    assert calls["t0.5"][calls["t0.5"].index("--temperature") + 1] == "0.5"
    assert not any(a.startswith("--cross") for a in set_rl.evaluation_calls(TASK, runs, "r", 5, False)["heldout"])
    ceiling = {arm: runs[arm] for arm in ("oracle", "passn")}  # no arm of CROSS_ARMS but the warm start
    main = set_rl.evaluation_calls(TASK, ceiling, "r", 5, cross=True)["heldout"]
    assert not any(a.startswith("--cross") for a in main) and len([a for a in main if "=oracle-" in a]) == 2


def test_help_typos_and_bad_outputs_run_nothing(tmp_path, nothing_runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        set_rl.main(["--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out
    for argv, message in ((["--sedes", "1"], "unrecognized arguments: --sedes"),
                          (["--seeds", "0"], "--seeds needs at least 2 distinct seeds"),
                          (["--task", "sums"], "invalid choice: 'sums'"),
                          (["--out", "/proc/x/set_rl"], "--out '/proc/x/set_rl': /proc is not writable"),
                          (["--arms", "spiral,gpro"], "(unknown: gpro)"),
                          (["--arms", "spiral,spiral"], "expected distinct names"),
                          (["--arms", ","], "expected distinct names"),
                          (["--lr", "0"], "--lr 0: expected a rate in (0, 1)"),
                          (["--lr", "2e-3", "--stop-after", "grid"], "no grid to stop after")):
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
    wrong = set_rl.make_run("own", 0.001, 0, TASK, None, str(runs))
    _fake_run(runs / wrong.name, [f for f in wrong.flags if f != "own"][:0] + ["--preset", "tiny_parts6", "--algo",
                                                                            "spiral", "--seed", "0"], 50)
    before = _snapshot(runs)
    with pytest.raises(SystemExit) as exit_info:
        set_rl.main(["--seeds", "0,1", "--runs-dir", str(runs), "--out", str(tmp_path / "t")])
    assert exit_info.value.code == 2
    _one_line(capsys, "set_rl.py", "own-lr1e-03-s0 exists and cannot be reused")
    assert _snapshot(runs) == before


def test_arms_and_one_rate_train_only_those_arms_and_no_grid(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(set_rl, "_train", lambda runs, args, runs_dir: trained.append([r.name for r in runs]))
    monkeypatch.setattr(set_rl, "evaluate_grid", lambda *a: pytest.fail("the grid ran although --lr was given"))
    code = set_rl.main(["--arms", "none,spiral", "--lr", "2e-3", "--seeds", "0,1", "--stop-after", "train",
                        "--runs-dir", str(tmp_path / "r"), "--out", str(tmp_path / "t")])
    assert code == 0
    assert trained == [["spiral-lr2e-03-s0", "spiral-lr2e-03-s1", "none-lr2e-03-s0", "none-lr2e-03-s1"]]


def test_runs_trained_by_named_other_code_are_reused_only_when_named(tmp_path):
    run = set_rl.make_run("spiral", 0.002, 0, TASK, 2, str(tmp_path))
    _fake_run(tmp_path / run.name, run.flags, 2, code="0123456789ab")
    assert runner.run_state(run)[0] == "differs"
    assert runner.run_state(run, ("0123456789ab",)) == ("finished", "")
    assert runner.run_state(run, ("ffffffffffff",))[0] == "differs"


# ----------------------------------------------------------------------------------------------------------------------
# The statistics and the verdicts


def test_t_distribution_and_tests_match_tabulated_values():
    """Against scipy 1.17 (computed once, by hand): t quantiles, Welch's and the paired p."""
    assert stats.t_quantile(0.975, 4) == pytest.approx(2.7764451051977934, abs=1e-9)
    assert stats.t_quantile(0.8, 8) == pytest.approx(0.8888895177670202, abs=1e-9)
    assert stats.t_quantile(0.975, 4.3) == pytest.approx(2.70169489828223, abs=1e-9)  # Welch's df are fractional
    a, b = [0.81, 0.86, 0.72, 0.93, 0.85], [0.99, 0.98, 0.995, 0.97, 0.99]
    assert stats.welch(a, b) == pytest.approx(0.01131488414921627, abs=1e-9)
    assert stats.paired(a, b) == pytest.approx(0.017193511345316385, abs=1e-9)
    assert stats.welch([0.5, 0.5], [0.5, 0.5]) == 1.0 and stats.welch([1.0, 1.0], [0.5, 0.5]) == 0.0
    with pytest.raises(ValueError, match="equally long"):
        stats.paired([1.0, 2.0], [1.0])


def test_the_detectable_difference_is_found_80_percent_of_the_time():
    """Simulated: normal seeds with the arms' sds and a true difference equal to detectable(): Welch's test at 5%
    rejects about 80% of the time (Welch's approximation; 2,000 simulated experiments)."""
    rng = np.random.default_rng(0)
    a, b = list(rng.normal(0.5, 0.05, 5)), list(rng.normal(0.5, 0.08, 5))
    delta = stats.detectable(a, b)
    rejected = np.mean([stats.welch(list(rng.normal(0.5 + delta, 0.05, 5)), list(rng.normal(0.5, 0.08, 5))) < 0.05
                        for _ in range(2000)])
    assert 0.7 < rejected < 0.9


def test_verdicts_say_ahead_no_difference_or_untestable_at_the_ceiling():
    assert report.verdict([0.6, 0.62, 0.61], [0.4, 0.41, 0.43], ("a", "b"))["verdict"] == "a ahead"
    assert report.verdict([0.4, 0.41, 0.43], [0.6, 0.62, 0.61], ("a", "b"))["verdict"] == "b ahead"
    ceiling = report.verdict([0.99, 1.0, 0.98], [1.0, 0.99, 0.995], ("a", "b"))
    assert ceiling["verdict"] == "untestable at the ceiling" and ceiling["headroom"] < ceiling["detectable"]
    middle = report.verdict([0.50, 0.51, 0.52], [0.505, 0.515, 0.51], ("a", "b"))
    assert middle["verdict"] == "no difference detected" and middle["headroom"] >= middle["detectable"]
    # both arms at 1.0 on every seed: nothing could have differed (headroom 0 = detectable 0)
    assert report.verdict([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], ("a", "b"))["verdict"] == "untestable at the ceiling"
    # room left (0.18) but three spread-out seeds detect only 0.76: not a ceiling, too few seeds
    spread = report.verdict([0.978, 0.928, 0.554], [0.271, 0.716, 0.746], ("a", "b"))
    assert spread["verdict"] == "too few seeds to detect" and 0.05 < spread["headroom"] < spread["detectable"]
    # pass@4 of exact pass@n against the oracle, 5 seeds: p = 0.038 for a difference of 2.3e-5, which the table
    # prints as +0.000: at the ceiling, not "ahead"
    tiny = report.verdict([0.999989010989011, 0.999989010989011, 1.0, 0.9999670329670329, 1.0],
                          [0.999989010989011, 0.9999450549450549, 0.9999670329670329, 0.9999615384615385,
                           0.9999670329670329], ("passn", "oracle"))
    assert tiny["p_welch"] < 0.05 and tiny["verdict"] == "untestable at the ceiling", tiny
    # a difference the table shows, at the same spread, is still "ahead"
    assert report.verdict([0.95, 0.951, 0.949], [0.94, 0.941, 0.939], ("a", "b"))["verdict"] == "a ahead"


def test_parts_of_training_with_two_steps_are_each_one_step():
    rows = [{"step": 1, "x": 0.1}, {"step": 2, "x": 0.3}]
    assert report._reduce(rows, "x", "first") == 0.1 and report._reduce(rows, "x", "last") == 0.3
    assert report._reduce(rows, "x", "last half") == 0.3 and report._reduce(rows, "y", "mean") is None
    twenty = [{"step": t, "x": float(t)} for t in range(1, 21)]
    assert report._gain_last_quarter(twenty, "x") == pytest.approx(5.0)  # steps 16-20 against 11-15


# ----------------------------------------------------------------------------------------------------------------------
# The tables from finished runs and stand-in evaluations


def _summary(x, probe=None):
    """One policy's evaluate.py summary (the documented schema) with accuracies from x."""
    ks = list(range(1, 17))
    return {"passk": {"k": ks, "pass_at_k": [min(1.0, x + 0.02 * (k - 1)) for k in ks]},
            "majority": {"k": ks, "accuracy": [x] * 16},
            "rsa": [{"population": 8, "step": [1, 2, 3], "pass_at_1": [x, x + 0.01, x + 0.02],
                     "tokens": [184.0, 368.0, 552.0]}],
            "sets": {"search": {"k": ks, "distinct_answers": [1.0 + k / 16 for k in ks]},
                     "rsa": [{"population": 8, "set_size": 4, "step": [2, 3], "coverage": [x, x],
                              "sets_by_correct": [[10, 0, 0, 0, 30], [0] * 5],
                              "hits_by_correct": [[round(10 * x), 0, 0, 0, 30], [0] * 5]}]},
            **({"probe": probe} if probe else {})}


def _problems(x):
    """Two problems' records: the first one easy for the warm start (pass@8 = 1), the second hard (0)."""
    sets = [[0, 1, 2, 3], [3, 2, 1, 0], [0, 1, 2, 4], [4, 5, 6, 7]] * 2  # 3 distinct sets of 8 draws
    return [{"pass_at_k": {"1": v, "8": v}, "rsa": {"8": [{"pass_at_1": v}, {"pass_at_1": v, "sets": sets},
                                                         {"pass_at_1": v}]}} for v in (min(1.0, 2 * x), 0.0)]


def _metrics(arm, seed, steps):
    rows = []
    for t in range(1, steps + 1):
        acc = 0.01 * t + 0.1 * seed
        base = {"tokens_per_problem": 552.0, "token_budget_per_problem": 672, "problems_kept": 8,
                "problems_drawn": 10 + seed, "draw_cap_hit": int(t > steps - 2), "train/grad_norm": 0.01}
        if arm.startswith("grpo"):
            row = {"accuracy": acc, "rollout/entropy_grpo": 1 - acc}
        else:
            row = {"search_accuracy": acc, "rollout/entropy_search": 1 - acc, "tokens_per_problem_search": 184.0,
                   "tokens_per_problem_aggregation": 368.0, "line13/set_scores_differ": 0.4 + 0.1 * seed,
                   "line13/set_score_sd": 0.1, "line13/corr_set_own": 0.5, "line13/wrong_positive": 0.2}
        rows.append({"step": t, **base, **row})
    return rows


def _probe(dep):
    return {"all right": {"problems": 2, "accuracy": 0.9}, "one right": {"problems": 2, "accuracy": 0.8},
            "none right": {"problems": 2, "accuracy": 0.1},
            "wrong copies": {"problems": 2, "accuracy": 0.9 - dep, "copied": dep}}


def test_tables_and_figure_from_finished_runs_and_stand_in_evaluations(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    runs_dir, seeds, steps = tmp_path / "runs", [0, 1], 20
    value = {f"{a}-lr2e-03-s{s}": round(0.2 + 0.1 * i + 0.05 * s, 3) for i, a in enumerate(set_rl.ARMS)
             for s in seeds}
    value["base"] = 0.05
    for arm in set_rl.ARMS:
        for lr in set_rl.LR_GRID:
            for seed in (seeds if lr == 0.002 else [0] if arm in set_rl.GRID_ARMS else []):
                run = set_rl.make_run(arm, lr, seed, TASK, steps, str(runs_dir))
                _fake_run(runs_dir / run.name, run.flags, 0)
                (runs_dir / run.name / "metrics.jsonl").write_text(
                    "".join(json.dumps(r) + "\n" for r in _metrics(arm, seed, steps)))
    calls, real_run = [], runner.subprocess.run

    def fake_evaluate(cmd, *args, **kwargs):
        if cmd[0] == "git":  # the report names the commit its tables were written at
            return type("Done", (), {"returncode": 0, "stdout": "abc1234\n"})()
        if "evaluate.py" not in " ".join(cmd):  # matplotlib's first use in a fresh environment runs fc-list
            return real_run(cmd, *args, **kwargs)
        calls.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        os.makedirs(os.path.dirname(out), exist_ok=True)
        names = [a.split("=")[1] for a in cmd if a.startswith("--policy=")] + (["base"] if "--policy" in cmd else [])
        grid = "grid.json" in out
        policies = {n: {"summary": _summary(0.5 if grid and "2e-03" in n else 0.3 if grid else value[n],
                                            None if grid else _probe(0.8 if n.startswith("spiral") else 0.1)),
                        "problems": _problems(value.get(n, 0.3))} for n in names}
        open(out, "w").write(json.dumps({"config": {"limit": 2}, "policies": policies, "cross": []}))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(runner.subprocess, "run", fake_evaluate)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("trained a finished run"))
    out = tmp_path / "result" / "r"
    assert set_rl.main(["--seeds", "0,1", "--steps", str(steps), "--runs-dir", str(runs_dir), "--out", str(out),
                        "--no-cross"]) == 0
    assert [c[c.index("--out") + 1].rsplit("/", 1)[1] for c in calls] == ["grid.json", "heldout.json", "greedy.json",
                                                                           "t0.5.json"]
    md = (tmp_path / "result" / "r.md").read_text()
    assert md.startswith("<!-- written by benchmarks/set_rl.py --task tiny_parts6 --seeds 0,1 --steps 20")
    assert "tables written at commit abc1234" in md
    sections = {part.split("\n")[0]: [line for line in part.splitlines() if line.startswith("| ")]
                for part in md.split("## ")[1:]}

    def row(section, label):
        table = next(t for title, t in sections.items() if title.startswith(section))
        return next(line for line in table if line.split(" | ")[0].strip("| ") == label).split(" | ")

    assert row("Learning rate", "SPIRAL")[1:] == ["0.355", "0.555", "0.355", "0.002 |"]  # mean pass@1,2,4,8
    assert row("Held-out", "SPIRAL (2 seeds)")[1] == "0.225 ± 0.035 [0.200, 0.250]"  # pass@1, the first column
    assert row("Held-out", "warm start")[1] == "0.050"
    assert row("Held-out", "GRPO, equal max budget (2 seeds)")[1] == "0.725 ± 0.035 [0.700, 0.750]"
    # pass@1 of SPIRAL 0.20, 0.25 against own (arm 3) 0.50, 0.55: own ahead despite 2 seeds
    spiral_own = [line for line in sections["Comparisons over seeds"] if line.startswith("| spiral − own | pass@1")]
    assert spiral_own[0].split(" | ")[2] == "-0.300" and spiral_own[0].rstrip(" |").endswith("own ahead")
    training = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in sections["Training (metrics.jsonl)"]}
    first, last = training["search accuracy, first 10% of steps"], training["search accuracy, last 10% of steps"]
    assert first[1] == "0.065 ± 0.071 [0.015, 0.115]" and last[1] == "0.245 ± 0.071 [0.195, 0.295]"  # 2 of 20 steps
    assert training["steps ended by the draw cap"][1] == "0.10 ± 0.00 [0.10, 0.10]"
    assert training["line 13: problems whose set scores differ, last half"][6] == "-"  # GRPO: no sets
    probe = row("Does the aggregator", "SPIRAL")
    assert probe[1:3] == ["0.900 ± 0.000 [0.900, 0.900]", "0.800 ± 0.000 [0.800, 0.800]"]
    assert probe[-1].startswith("0.800 ± 0.000")  # dependence = all right - wrong copies
    criteria = {line.split(" | ")[0].strip("| ").split(":")[0]: line.split(" | ")[1]
                for line in sections["Can line 13 act here?"]}
    assert criteria["line 13 keeps acting (SPIRAL)"] == "yes"  # 0.45 in the last half
    assert criteria["the aggregator needs its candidates (spiral)"] == "yes"  # recovery 0.1, dependence 0.8
    assert criteria["the aggregator needs its candidates (own)"] == "**no**"  # dependence 0.1
    sets = row("The sets RSA step 2", "SPIRAL")
    assert sets[1:4] == ["80", "12", "0.225 ± 0.035 [0.200, 0.250]"]  # 3 distinct sets x 2 problems x 2 seeds
    easy = row("By difficulty", "0 < pass@8 < 0.5 (1 problems)")  # the warm start's 0.1: pass@8 of 2 x 0.05
    assert easy[1] == "pass@1" and easy[2] == "0.100" and easy[3] == "0.450 ± 0.071 [0.400, 0.500]"
    saved = json.loads((tmp_path / "result" / "r.json").read_text())
    assert saved["cells"]["evaluation"]["spiral"]["pass@1"] == [0.2, 0.25]
    assert saved["cells"]["grid"]["rates"]["grpo_tok"] == 0.002
    assert saved["cells"]["comparisons"]["spiral|own|pass@1"]["verdict"] == "own ahead"
    assert (tmp_path / "result" / "r.png").stat().st_size > 10_000


def test_line13_variance_table_limits():
    """K = all has no noise and the exact scale; K = 4 has Proposition 3.1's M (= M_K / M_all at N1 = 2n)."""
    variance = _load("line13_variance")
    rng = np.random.default_rng(0)
    exact = variance.measure("all", 2, 1, rng)
    assert exact == {"scale": pytest.approx(1.0), "noise_signal": 0.0, "wrong_sign": 0.0, "zero": 0.0}
    four = variance.measure(4, 2, 4000, rng)
    assert four["scale"] == pytest.approx(0.886, abs=0.03) and four["noise_signal"] > 1


def test_cross_table_rows_are_search_traces_columns_aggregators():
    runs = {arm: [runner.Run(f"{arm}-lr2e-03-s{s}", "x", []) for s in (0, 1)] for arm in ("spiral", "own")}
    rsa = lambda v: {"rsa": [{"population": 8, "step": [1, 2, 3], "pass_at_1": [0.0, v, 0.0]}]}  # noqa: E731
    names = ["base"] + [r.name for rs in runs.values() for r in rs]
    policies = {n: {"summary": rsa(0.5)} for n in names}
    cross = [{"search": f"spiral-lr2e-03-s{s}", "aggregator": f"own-lr2e-03-s{s}", "summary": rsa(0.9)} for s in (0, 1)]
    cross += [{"search": f"own-lr2e-03-s{s}", "aggregator": f"spiral-lr2e-03-s{s}", "summary": rsa(0.2)} for s in (0, 1)]
    _, cells = report.cross_table(runs, {"heldout": {"policies": policies, "cross": cross}})
    assert cells["spiral|own"] == [0.9, 0.9] and cells["own|spiral"] == [0.2, 0.2]  # search | aggregator
    assert cells["spiral|spiral"] == [0.5, 0.5]


def test_difficulty_buckets_split_at_the_warm_start_s_pass8_half_and_zero():
    values = [0.0, 0.25, 0.5, 0.75]
    problems = [{"pass_at_k": {"1": v, "8": v}, "rsa": {"8": [{}, {}, {"pass_at_1": v}]}} for v in values]
    runs = {"spiral": [runner.Run("spiral-lr2e-03-s0", "x", [])]}
    evaluations = {"heldout": {"policies": {n: {"problems": problems} for n in ("base", "spiral-lr2e-03-s0")}}}
    _, cells = report.difficulty_table(runs, evaluations)
    means = {bucket: by["pass@8"]["base"][0] for bucket, by in cells.items()}
    assert means == {"warm start pass@8 = 0": 0.0, "0 < pass@8 < 0.5": 0.25, "pass@8 >= 0.5": 0.625}


def test_criteria_hold_exactly_at_their_thresholds_and_fail_just_past_them():
    def checks(p1, p4, one, rec, dep, differ):
        evals = {arm: {"pass@1": [p1], "pass@4": [p4]} for arm in ("own", "grpo", "spiral")}
        probes = {arm: {"none right": [rec], "dependence": [dep], "one right": [one]} for arm in ("spiral", "own")}
        train = {"search accuracy gain over the last quarter (5-step means)": {"own": [0.03], "grpo": [0.03]},
                 "line 13: problems whose set scores differ, last half": {"spiral": [differ]}}
        return [c["met"] for c in report.criteria(evals, train, probes, {})[1].values()][:-1]  # not the headroom
    assert all(checks(0.5, 0.75, 0.875, 0.25, 0.5, 0.375))  # each at or inside its bound (exact in binary)
    assert not any(checks(0.625, 0.75, 0.875, 0.375, 0.25, 0.25)[i] for i in (0, 2, 4, 6, 8))
    assert checks(0.5, 0.6875, 0.875, 0.25, 0.5, 0.375)[1] is False  # pass@4 - pass@1 = 0.1875 < 0.2


def test_report_only_rewrites_the_tables_from_the_runs_and_evaluations_it_finds(tmp_path, monkeypatch, capsys):
    """--report-only trains and evaluates nothing, writes the same tables as the full command, and stops in one line
    when a run is unfinished or an evaluation lacks a run."""
    pytest.importorskip("matplotlib")
    runs_dir, steps = tmp_path / "runs", 20
    argv = ["--arms", "spiral,none", "--lr", "2e-3", "--seeds", "0,1", "--steps", str(steps), "--runs-dir",
            str(runs_dir), "--no-cross", "--out", str(tmp_path / "r")]
    for arm in ("spiral", "none"):
        for seed in (0, 1):
            run = set_rl.make_run(arm, 0.002, seed, TASK, steps, str(runs_dir))
            _fake_run(runs_dir / run.name, run.flags, 0)
            (runs_dir / run.name / "metrics.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in _metrics(arm, seed, steps)))
    evaluated, real_run = [], runner.subprocess.run

    def fake_evaluate(cmd, *args, **kwargs):
        if cmd[0] == "git":
            return type("Done", (), {"returncode": 0, "stdout": "abc1234\n"})()
        if "evaluate.py" not in " ".join(cmd):
            return real_run(cmd, *args, **kwargs)
        evaluated.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        names = [a.split("=")[1] for a in cmd if a.startswith("--policy=")] + ["base"]
        policies = {n: {"summary": _summary(0.3 + 0.01 * len(n), _probe(0.5)), "problems": _problems(0.3)}
                    for n in names}
        open(out, "w").write(json.dumps({"config": {"limit": 2}, "policies": policies, "cross": []}))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(runner.subprocess, "run", fake_evaluate)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("trained a finished run"))
    assert set_rl.main(argv) == 0 and len(evaluated) == 3
    full = (tmp_path / "r.md").read_text()
    for suffix in ("md", "json", "png"):
        (tmp_path / f"r.{suffix}").unlink()
    assert set_rl.main([*argv, "--report-only"]) == 0 and len(evaluated) == 3  # nothing evaluated again
    assert (tmp_path / "r.md").read_text() == full
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # the grid's choice is not kept: a rate must be given
        set_rl.main([a for a in argv if a not in ("--lr", "2e-3")] + ["--report-only"])
    assert exit_info.value.code == 2 and "--report-only needs --lr" in capsys.readouterr().err
    heldout = runs_dir / "eval" / "heldout.json"
    saved = json.loads(heldout.read_text())
    del saved["policies"]["none-lr2e-03-s1"]
    heldout.write_text(json.dumps(saved))
    with pytest.raises(SystemExit) as exit_info:
        set_rl.main([*argv, "--report-only"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "does not evaluate none-lr2e-03-s1" in err and len(err.splitlines()) == 1
    rows = (runs_dir / "spiral-lr2e-03-s1" / "metrics.jsonl").read_text().splitlines()
    (runs_dir / "spiral-lr2e-03-s1" / "metrics.jsonl").write_text("\n".join(rows[:5]) + "\n")  # stopped at step 5
    with pytest.raises(SystemExit) as exit_info:
        set_rl.main([*argv, "--report-only"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "spiral-lr2e-03-s1 is not finished" in err and len(err.splitlines()) == 1
    assert len(evaluated) == 3 and (tmp_path / "r.md").read_text() == full  # the refusals wrote nothing
