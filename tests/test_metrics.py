"""Training metrics: line 18's |B| is the number of problems kept, also when max_draws ends a step early;
and metrics.png is a dashboard of the curves that tell whether training works, for SPIRAL, GRPO and two models."""

import json
import math
import sys

import numpy as np
import pytest
import torch

import figures
import spiral
import train
from lora import add_lora, lora_parameters
from rollout import Completion
from problemset import Problem
from tiny import build_tiny_model, build_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------------------------------------
# The normaliser C = |B| x budget, |B| = problems kept


def scripted_generate(good):
    """A fake rollout.generate: search trace j of problem x is correct iff j in good[x]; an aggregation sample i is
    correct iff i < the number of correct candidates in its prompt. Token ids are real tiny-vocabulary ids."""
    def generate(model, tokenizer, prompts, *, samples_per_prompt, **kwargs):
        rows = []
        for prompt in prompts:
            if prompt.startswith("You are given a problem"):
                right = prompt.count("RIGHT")
                texts = [f"\\boxed{{{int(i < right)}}}" for i in range(samples_per_prompt)]
            else:
                x = prompt.split("\n")[0]
                texts = [f"{'RIGHT' if j in good[x] else 'WRONG'} \\boxed{{{int(j in good[x])}}}"
                         for j in range(samples_per_prompt)]
            rows.append([Completion([3, 4, 5], [10 + (k + n) % 7 for n in range(3 + k % 3)], [-1.0] * (3 + k % 3),
                                    t, False, [0.5] * (3 + k % 3)) for k, t in enumerate(texts)])
        return rows
    return generate


def grads(model, samples, normalizer):
    params = lora_parameters(model)
    for p in params:
        p.grad = None
    train.accumulate_gradients(model, samples, loss_normalizer=normalizer, micro_batch_tokens=64)
    return [p.grad.clone() for p in params]


def test_normalizer_counts_kept_problems_when_max_draws_ends_the_step(monkeypatch):
    """|B| = 3 requested, max_draws = 3, one drawn problem without signal: C = 2 x budget, and the gradient is the
    average of the two kept problems' gradients g(x) (Algorithm 1, line 18), not two thirds of it."""
    good = {"none": set(), "a": {0, 1, 2}, "b": {5}}
    monkeypatch.setattr(spiral, "generate", scripted_generate(good))
    monkeypatch.setattr(spiral, "reward", lambda text, gold: float(text.endswith(f"\\boxed{{{gold}}}")))
    queue = [Problem(x, "1") for x in ["a", "none", "b"]]
    cfg = train.resolve_config({"preset": "tiny", "batch_problems": 3, "max_draws": 3})
    rollouts = train.collect(cfg, None, None, lambda: queue.pop(0), np.random.default_rng(0))
    assert rollouts.metrics["problems_drawn"] == 3 and rollouts.metrics["problems_kept"] == 2
    budget = train.token_budget_per_problem(cfg)
    C = train.loss_normalizer(cfg, rollouts.metrics["problems_kept"])
    assert C == 2 * budget

    torch.manual_seed(0)
    model = build_tiny_model(build_tiny_tokenizer())
    add_lora(model, 4, 4.0)
    with torch.no_grad():  # B != 0, so that every LoRA weight has a gradient
        for p in lora_parameters(model):
            p.normal_(0, 0.05)
    per_problem = len(rollouts.samples) // 2  # N1 + K N2 samples per kept problem, problem by problem
    g_a = grads(model, rollouts.samples[:per_problem], budget)  # g(x) / budget: one problem, |B| = 1
    g_b = grads(model, rollouts.samples[per_problem:], budget)
    g = grads(model, rollouts.samples, C)
    for total, a, b in zip(g, g_a, g_b):
        torch.testing.assert_close(total, (a + b) / 2, rtol=1e-4, atol=1e-9)
    assert any(t.abs().sum() > 0 for t in g)


def test_loss_metrics_are_the_ratio_and_entropy_over_trained_tokens():
    """train.loss_metrics, shared by train.py and trl_spiral.py: ratios and entropies pooled over micro-batches."""
    ratios = [torch.tensor([1.0, 2.0]), torch.tensor([]), torch.tensor([0.5])]
    entropy = {"search": [torch.tensor([1.0]), torch.tensor([3.0, 5.0])], "aggregation": [torch.tensor([])]}
    assert train.loss_metrics(-0.5, 3, 40, ratios, entropy) == {
        "train/loss": -0.5, "train/samples_trained": 3, "train/tokens_trained": 40,
        "train/importance_ratio_mean": pytest.approx(3.5 / 3), "train/importance_ratio_min": 0.5,
        "train/importance_ratio_max": 2.0, "train/entropy_search": 3.0}  # a role with no token: no column
    assert set(train.loss_metrics(0.0, 0, 0, [], {})) == {"train/loss", "train/samples_trained", "train/tokens_trained"}


def test_train_loop_logs_the_kept_normalizer(tmp_path):
    """The loop itself: with max_draws = 2 of |B| = 8 requested, train/loss_normalizer = problems_kept x budget."""
    out = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--steps", "1", "--batch-problems", "8", "--max-draws", "2",
                       "--out", str(out), "--no-plot"]) == 0
    (row,) = [json.loads(line) for line in open(out / "metrics.jsonl")]
    budget = train.token_budget_per_problem(train.resolve_config({"preset": "tiny"}))
    assert row["problems_drawn"] == 2 and 1 <= row["problems_kept"] <= 2
    assert row["train/loss_normalizer"] == row["problems_kept"] * budget


# ----------------------------------------------------------------------------------------------------------------------
# The dashboard

COMMON = ["problems_drawn", "problems_kept", "train/grad_norm", "train/importance_ratio_min",
          "train/importance_ratio_mean", "train/importance_ratio_max", "time/rollout_s", "time/train_s",
          "train/loss", "tokens_generated", "train/samples_trained", "train/entropy_search"]
SPIRAL = COMMON + ["search_accuracy", "aggregation_accuracy", "rollout/entropy_search", "rollout/entropy_aggregation",
                   "search_length", "aggregation_length", "search_truncation_rate", "aggregation_truncation_rate",
                   "time/search_s", "time/aggregation_s"]
GRPO = COMMON + ["accuracy", "rollout/entropy_grpo", "length", "truncation_rate"]


def synthetic_rows(keys, steps=5):
    rng = np.random.default_rng(0)
    return [{"step": s, **{k: float(rng.random()) for k in keys}} for s in range(1, steps + 1)]


def panels(rows):
    """{panel title: {legend label: y values}} of the dashboard (panels with no data left out)."""
    return {panel: {label: values for label, _, values in series}
            for panel, series in figures.dashboard_series(rows) if series}


def drawn_panels(fig):
    """The same read back from a drawn figure (then closed)."""
    import matplotlib.pyplot as plt

    shown = {ax.get_title(): {line.get_label(): list(line.get_ydata()) for line in ax.lines}
             for ax in fig.axes if ax.lines}
    plt.close(fig)
    return shown


def test_dashboard_panels_for_spiral_grpo_and_two_models(tmp_path):
    spiral_rows = synthetic_rows(SPIRAL + ["train/grad_norm_aggregator"])
    shown = panels(spiral_rows)
    assert len(shown) == 8  # a few panels, not one per metric
    assert shown["accuracy (mean reward)"]["search"] == [r["search_accuracy"] for r in spiral_rows]
    assert set(shown["accuracy (mean reward)"]) == {"search", "aggregation"}
    entropy = shown["token entropy, all traces (nats)"]
    assert entropy["search"] == [r["rollout/entropy_search"] for r in spiral_rows]
    assert entropy["aggregation (dashed)"] == [r["rollout/entropy_aggregation"] for r in spiral_rows]
    assert set(shown["gradient norm (before clipping)"]) == {"theta", "phi"}  # the two-model variant
    assert shown["gradient norm (before clipping)"]["phi"] == [r["train/grad_norm_aggregator"] for r in spiral_rows]
    assert set(shown["importance ratio"]) == {"min", "mean", "max"}
    assert shown["importance ratio"]["min"] == [r["train/importance_ratio_min"] for r in spiral_rows]
    assert set(shown["seconds per step"]) == {"search", "aggregation", "rollout (all)", "train"}
    assert set(shown["problems per step"]) == {"drawn", "kept (non-zero advantage)"}
    assert set(shown["mean length (tokens)"]) == set(shown["truncation rate"]) == {"search", "aggregation"}
    plotted = {label for series in shown.values() for label in series}
    assert "train/loss" not in plotted and "tokens_generated" not in plotted  # the rest stays in metrics.jsonl

    grpo_rows = synthetic_rows(GRPO)
    shown = panels(grpo_rows)
    assert shown["accuracy (mean reward)"] == {"GRPO": [r["accuracy"] for r in grpo_rows]}
    assert shown["token entropy, all traces (nats)"] == {"GRPO": [r["rollout/entropy_grpo"] for r in grpo_rows]}
    assert set(shown["seconds per step"]) == {"rollout (all)", "train"}
    assert set(shown["gradient norm (before clipping)"]) == {"theta"}


@pytest.mark.parametrize("keys", [SPIRAL, GRPO], ids=["spiral", "grpo"])
def test_the_figure_draws_the_dashboard_series(keys):
    pytest.importorskip("matplotlib")  # optional: CI installs requirements.txt only
    rows = synthetic_rows(keys + ["train/grad_norm_aggregator"])
    assert drawn_panels(figures.training_figure(rows)) == panels(rows)


def test_without_matplotlib_the_plot_is_skipped_with_a_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(GRPO)))
    assert not figures.plot_training(str(path), str(tmp_path / "metrics.png"))
    assert "matplotlib is not installed" in capsys.readouterr().out and not (tmp_path / "metrics.png").exists()


@pytest.mark.parametrize("keys", [SPIRAL, GRPO], ids=["spiral", "grpo"])
def test_plot_training_writes_a_png(tmp_path, keys):
    pytest.importorskip("matplotlib")
    rows = synthetic_rows(keys)
    rows[2].pop("train/grad_norm")  # a step that trained nothing has no gradient norm: a gap, not a crash
    rows[3]["train/importance_ratio_max"] = math.nan
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert figures.plot_training(str(path), str(tmp_path / "metrics.png"))
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert not figures.plot_training(str(empty), str(tmp_path / "none.png"))
    assert not (tmp_path / "none.png").exists()
