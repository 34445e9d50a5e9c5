"""What a run records and shows: package versions in config.json, checkpoints and evaluate.py's result (a resume on
other versions warns in one line and goes on), train.py's closing table and progress bar, and the comparison
figure's line styles. The demo's output without library noise is checked in test_fingerprint.py."""

import json
import os
import platform
import zlib

import numpy as np
import pytest
import torch

import checkpoint
import evaluate
import figures
import rollout
import spiral
import train

SMALL = ["--preset", "tiny", "--model", "tiny", "--batch-problems", "1", "--num-search", "3", "--set-size", "2",
         "--num-sets", "2", "--num-aggregations", "2", "--max-new-tokens", "6", "--no-plot"]
KEYS = {"python", "code", "torch", "transformers", "numpy", "math-verify", "device"}


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setattr(spiral, "reward", lambda text, gold: float(zlib.crc32(text.encode()) % 2))  # non-zero A
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(5)))
    return str(path)


def test_versions_are_this_process_s():
    found = checkpoint.versions("cpu")
    assert set(found) == KEYS
    assert found["python"] == platform.python_version() and found["torch"] == torch.__version__
    assert found["numpy"] == np.__version__ and found["device"].startswith("cpu")
    assert found["code"] == checkpoint.code_digest() and len(found["code"]) == 12


def test_a_run_records_versions_and_a_resume_on_other_versions_warns_once(data, tmp_path, capsys, one_thread):
    out = tmp_path / "run"
    assert train.main(SMALL + ["--data", data, "--out", str(out), "--steps", "1"]) == 0
    config = json.loads((out / "config.json").read_text())
    state_path = out / "checkpoint" / "step-000001" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    assert config["versions"] == state["versions"] == checkpoint.versions("cpu")
    capsys.readouterr()
    state["versions"] |= {"torch": "0.0.1", "transformers": "4.0.0", "code": "0123456789ab"}  # started elsewhere
    state_path.write_text(json.dumps(state))
    assert train.main(["--out", str(out), "--resume", "--steps", "2"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"torch 0.0.1 -> {torch.__version__}" in warnings[0]
    assert "transformers 4.0.0 ->" in warnings[0] and f"code 0123456789ab -> {checkpoint.code_digest()}" in warnings[0]
    assert [r["step"] for r in checkpoint.read_metrics(str(out / "metrics.jsonl"))] == [1, 2]
    # Same versions: no warning.
    assert train.main(["--out", str(out), "--resume", "--steps", "3"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_evaluate_records_versions(tmp_path, monkeypatch, one_thread):
    policy = rollout.load_policy("tiny")
    monkeypatch.setattr(rollout, "load_policy", lambda name, dtype="auto": policy)
    (tmp_path / "p.jsonl").write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    out = tmp_path / "eval.json"
    assert evaluate.main(["--preset", "tiny", "--data", str(tmp_path / "p.jsonl"), "--method", "passk",
                          "--num-samples", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["versions"] == checkpoint.versions("cpu")


def _rows(algo, n):
    rng = np.random.default_rng(0)
    keys = ["search_accuracy", "aggregation_accuracy", "rollout/entropy_search"] if algo == "spiral" else \
        ["accuracy", "rollout/entropy_grpo"]
    return [{"step": s, **{k: float(rng.random()) for k in keys}} for s in range(1, n + 1)]


@pytest.mark.parametrize("algo,n,tenth", [("spiral", 100, 10), ("grpo", 30, 3), ("spiral", 4, 1)])
def test_closing_table_is_the_mean_of_the_first_and_last_tenth(algo, n, tenth):
    rows = _rows(algo, n)
    table = figures.first_last_table(rows).splitlines()
    assert table[0] == (f"| mean over | first 10% of steps (1-{tenth}) | last 10% of steps ({n - tenth + 1}-{n}) |")
    body = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    for label, key in figures.FIRST_LAST_ROWS:
        if key in rows[0]:
            first = np.mean([r[key] for r in rows[:tenth]])
            last = np.mean([r[key] for r in rows[-tenth:]])
            assert body.pop(label) == f"| {label} | {first:.2f} | {last:.2f} |"
    assert body == {}  # no row for a metric the run does not have


def test_progress_bar_names_its_accuracy_and_shows_a_step_s_stage(capsys):
    bar = figures.StepBar("spiral", 2, 0)
    draw = bar.counting(lambda: "x")
    assert [draw(), draw(), draw()] == ["x"] * 3
    assert bar.bar.postfix.endswith("step 1: rollouts, problems drawn: 3")
    bar.stage("gradient")
    assert bar.bar.postfix.endswith("step 1: gradient")
    bar.step_done({"aggregation_accuracy": 0.25, "search_accuracy": 0.5, "time/generated_tokens_per_s": 10.0})
    assert bar.bar.n == 1 and "aggregation acc 0.250, search acc 0.500" in bar.bar.postfix
    bar.counting(lambda: "x")()  # a new step counts from 1 and keeps the last step's accuracy in view
    assert bar.bar.postfix == "aggregation acc 0.250, search acc 0.500 | step 2: rollouts, problems drawn: 1"
    bar.close()
    grpo = figures.StepBar("grpo", 1, 0)
    grpo.step_done({"accuracy": 0.75, "time/generated_tokens_per_s": 10.0})
    assert grpo.bar.postfix.startswith("GRPO acc 0.750")
    grpo.close()


def test_comparison_figure_tells_rsa_populations_apart_by_line_style(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    rsa = [{"population": P, "set_size": 2, "step": [1, 2], "max_new_tokens": 4, "pass_at_1": [0.5, 0.6],
            "tokens": [1.0, 2.0], "budget": [4 * P, 8 * P]} for P in (4, 8)]
    figures.plot_evaluation({"a": {"rsa": rsa}, "b": {"rsa": rsa}}, tmp_path / "f.png")
    (fig,) = figs
    rsa_axis = fig.axes[1]
    styles = {(line.get_color(), line.get_linestyle()) for line in rsa_axis.lines}
    assert len(styles) == 4  # two policies (colour) x two populations (line style), not markers alone
    assert len({line.get_linestyle() for line in rsa_axis.lines}) == 2
