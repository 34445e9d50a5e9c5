"""The figures: a training dashboard from metrics.jsonl, and evaluate.py's test-time scaling curves.

matplotlib is optional: without it every function prints a one-line notice and returns, and the JSON files hold
all the numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

from checkpoint import read_metrics


def _pyplot(who: str):
    """matplotlib.pyplot with the file-only Agg backend, or None (after a notice) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{who}: matplotlib is not installed; skipping the plot (pip install matplotlib)")
        return None
    return plt


# The training dashboard: (panel title, [(metrics.jsonl key, legend label)]); a run plots the keys it has, so one
# layout serves SPIRAL, GRPO and the two-model variant. Every other metric stays in metrics.jsonl. The entropy panel
# is the paper's "token-level entropy over training": SPIRAL's search traces against GRPO's traces.
DASHBOARD = [
    ("accuracy (mean reward)", [("search_accuracy", "search"), ("aggregation_accuracy", "aggregation"),
                                ("accuracy", "GRPO")]),
    ("token entropy, all traces (nats)", [("rollout/entropy_search", "search"), ("rollout/entropy_grpo", "GRPO"),
                                          ("rollout/entropy_aggregation", "aggregation (dashed)")]),
    ("mean length (tokens)", [("search_length", "search"), ("aggregation_length", "aggregation"),
                              ("length", "GRPO")]),
    ("truncation rate", [("search_truncation_rate", "search"), ("aggregation_truncation_rate", "aggregation"),
                         ("truncation_rate", "GRPO")]),
    ("problems per step", [("problems_drawn", "drawn"), ("problems_kept", "kept (non-zero advantage)")]),
    ("gradient norm (before clipping)", [("train/grad_norm", "theta"), ("train/grad_norm_aggregator", "phi")]),
    ("importance ratio", [("train/importance_ratio_max", "max"), ("train/importance_ratio_mean", "mean"),
                          ("train/importance_ratio_min", "min")]),
    ("seconds per step", [("time/search_s", "search"), ("time/aggregation_s", "aggregation"),
                          ("time/rollout_s", "rollout (all)"), ("time/train_s", "train")]),
]


def training_figure(rows: list[dict], title: str = ""):
    """The dashboard of DASHBOARD's panels over steps as a matplotlib Figure, or None without matplotlib."""
    plt = _pyplot("train.py")
    if plt is None:
        return None
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 4, figsize=(17, 6.5), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, DASHBOARD):
        for key, label in series:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points), marker=".", label=label, ls="--" if "dashed" in label else "-")
        if panel.startswith(("accuracy", "truncation")):
            ax.set_ylim(-0.03, 1.03)
        if panel == "importance ratio" and ax.lines:  # at least 1 +- 0.01: fp32's ratio ~ 1 +- 1e-6 reads as flat
            low, high = ax.get_ylim()
            ax.set_ylim(min(low, 0.99), max(high, 1.01))
            ax.ticklabel_format(axis="y", useOffset=False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(title + "  (every metric: metrics.jsonl)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_training(metrics_path: str, png_path: str) -> bool:
    """metrics.jsonl as the dashboard PNG; False (after a notice) without matplotlib or rows."""
    rows = read_metrics(metrics_path)
    if not rows:
        print(f"train.py: {metrics_path} has no rows; no plot")
        return False
    fig = training_figure(rows, title=str(Path(metrics_path).parent))
    if fig is None:
        return False
    fig.savefig(png_path, dpi=100)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return True


def plot_evaluation(summary: dict, path: Path) -> None:
    """One PNG: accuracy against k, RSA step and max_new_tokens, and every method against tokens generated."""
    plt = _pyplot("evaluate.py")
    if plt is None:
        path.unlink(missing_ok=True)  # not a stale plot of an earlier run next to this run's JSON
        return
    import matplotlib.ticker

    curves = {"passk": ("k", "pass_at_k", "pass@k"), "majority": ("k", "accuracy", "majority@k"),
              "rsa": ("step", "pass_at_1", "RSA pass@1"), "sequential": ("max_new_tokens", "pass_at_1", "sequential")}
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for method, (x, y, label) in curves.items():
        if method not in summary:
            continue
        s = summary[method]
        ax = axes[{"passk": 0, "majority": 0, "rsa": 1, "sequential": 2}[method]]
        ax.plot(s[x], s[y], marker="o", label=label)
        ax.set_xlabel({"k": "k (samples)", "step": "RSA step", "max_new_tokens": "max new tokens"}[x])
        axes[3].plot(s["tokens"], s[y], marker="o", label=label)
    titles = ["parallel: pass@k, majority@k", "recursive self-aggregation", "sequential compute", "token usage"]
    for ax, title in zip(axes, titles):
        ax.set(ylabel="accuracy", title=title)
        if ax.lines:
            ax.legend()
    for ax in (axes[0], axes[2], axes[3]):
        ax.set_xscale("log", base=2)
    axes[1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[3].set_xlabel("tokens generated per problem")
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")
