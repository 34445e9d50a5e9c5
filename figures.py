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


PLOT_GROUPS = {  # panels that overlay several metrics; every other numeric metric gets a panel of its own
    "accuracy": ["search_accuracy", "aggregation_accuracy", "accuracy"],
    "token entropy": ["train/entropy_search", "train/entropy_aggregation", "train/entropy_grpo"],
    "mean length (tokens)": ["search_length", "aggregation_length", "length"],
}


def plot_training(metrics_path: str, png_path: str) -> bool:
    """metrics.jsonl as a grid of panels over steps; returns False (and prints a notice) without matplotlib."""
    plt = _pyplot("train.py")
    if plt is None:
        return False
    rows = read_metrics(metrics_path)
    numeric = [k for k in dict.fromkeys(k for r in rows for k in r)
               if k != "step" and any(isinstance(r.get(k), (int, float)) for r in rows)]
    grouped = {title: [k for k in keys if k in numeric] for title, keys in PLOT_GROUPS.items()}
    panels = [(t, keys) for t, keys in grouped.items() if keys]
    panels += [(k, [k]) for k in numeric if not any(k in keys for keys in grouped.values())]
    cols, rows_n = 4, math.ceil(len(panels) / 4)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 2.6 * rows_n), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot(*zip(*points), marker=".", label=key)
        if len(keys) > 1:
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
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
