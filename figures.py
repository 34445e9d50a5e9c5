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


def plot_evaluation(summaries: dict[str, dict], path: Path, title: str = "") -> None:
    """evaluate.py's PNG: the paper's test-time figure kinds, one colour per policy ({label: summary}).

    Panels: pass@k vs k; RSA pass@1 vs step (one line style per population P); accuracy vs the number of
    parallel traces (majority@k at k, RSA after its last step at P, pass@1 for reference); sequential pass@1 vs
    max_new_tokens; and every method against the maximum token budget per problem (the paper's x-axis).
    """
    plt = _pyplot("evaluate.py")
    if plt is None:
        path.unlink(missing_ok=True)  # not a stale plot of an earlier run next to this run's JSON
        return
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 5, figsize=(22, 4.4))
    dashes = ["-", "--", ":", "-."]
    for colour, (label, s) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], summaries.items()):
        line = dict(color=colour, marker="o", markersize=4)
        if "passk" in s:
            axes[0].plot(s["passk"]["k"], s["passk"]["pass_at_k"], label=label, **line)
            axes[2].axhline(s["passk"]["pass_at_k"][0], color=colour, linestyle=":", linewidth=1)
        for i, r in enumerate(s.get("rsa", [])):
            axes[1].plot(r["step"], r["pass_at_1"], linestyle=dashes[i % 4], label=f"{label} P={r['population']}",
                         **line)
            axes[4].plot(r["budget"], r["pass_at_1"], linestyle="-", **line)
        if s.get("rsa"):
            rsa = s["rsa"]
            axes[2].plot([r["population"] for r in rsa], [r["pass_at_1"][-1] for r in rsa], linestyle="-",
                         label=f"{label} RSA", **line)
        if "majority" in s:
            axes[2].plot(s["majority"]["k"], s["majority"]["accuracy"], linestyle="--", label=f"{label} majority",
                         **{**line, "marker": "s"})
            axes[4].plot(s["majority"]["budget"], s["majority"]["accuracy"], linestyle="--", **{**line, "marker": "s"})
        if "sequential" in s:
            axes[3].plot(s["sequential"]["max_new_tokens"], s["sequential"]["pass_at_1"], label=label, **line)
            axes[4].plot(s["sequential"]["budget"], s["sequential"]["pass_at_1"], linestyle=":",
                         **{**line, "marker": "^"})
    panels = [("pass@k (paper: Pass@k evaluation)", "k, independent attempts", "pass@k (coverage)"),
              ("RSA (paper: Pass@1 under RSA)", "RSA step", "pass@1"),
              ("parallel traces (paper: inference methods)", "parallel traces (k or P)",
               "accuracy (dotted: pass@1)"),
              ("sequential compute (paper: sequential scaling)", "max new tokens per trace", "pass@1"),
              ("token usage (paper: compute vs tokens)", "maximum token budget per problem (paper's x-axis)",
               "accuracy (- RSA, -- majority, : sequential)")]
    for ax, (name, xlabel, ylabel) in zip(axes, panels):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in (axes[0], axes[2], axes[3], axes[4]):
        if ax.lines:
            ax.set_xscale("log", base=2)
    axes[1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def evaluation_curves(summaries: dict[str, dict]):
    """(curve name, x key, y key, {label: curve}) for every curve that all the summaries hold."""
    first = next(iter(summaries.values()))
    names = [("passk", "k", "pass_at_k"), ("majority", "k", "accuracy"), ("sequential", "max_new_tokens", "pass_at_1")]
    for method, x, y in names:
        if method in first:
            curve_of = {label: s[method] for label, s in summaries.items()}
            yield f"{method} (max_new_tokens {first[method]['max_new_tokens'] if method != 'sequential' else 'L'})", \
                x, y, curve_of
    for i, r in enumerate(first.get("rsa", [])):
        yield f"rsa P={r['population']} k={r['set_size']}", "step", "pass_at_1", \
            {label: s["rsa"][i] for label, s in summaries.items()}
