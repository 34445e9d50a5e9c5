"""What a user sees: train.py's progress bar and closing table, the training dashboard from metrics.jsonl, and
evaluate.py's test-time scaling curves.

matplotlib is optional: without it every function prints a one-line notice and returns, and the JSON files hold
all the numbers.
"""

from __future__ import annotations

import sys
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
    ("can line 13 act? (spiral.py)", [("line13/set_scores_differ", "problems whose set scores differ"),
                                      ("line13/wrong_positive", "wrong traces with A#_marg > 0"),
                                      ("line13/corr_set_own", "corr(A#_marg, own-reward advantage)")]),
    ("token entropy, all traces (nats)", [("rollout/entropy_search", "search"), ("rollout/entropy_grpo", "GRPO"),
                                          ("rollout/entropy_aggregation", "aggregation (dashed)")]),
    ("mean length (tokens)", [("search_length", "search"), ("aggregation_length", "aggregation"),
                              ("length", "GRPO")]),
    ("truncation rate", [("search_truncation_rate", "search"), ("aggregation_truncation_rate", "aggregation"),
                         ("truncation_rate", "GRPO")]),
    ("problems per step", [("problems_drawn", "drawn"), ("problems_kept", "kept (non-zero advantage)"),
                           ("draw_cap_hit", "max_draws hit (0/1)")]),
    ("gradient norm (before clipping)", [("train/grad_norm", "theta"), ("train/grad_norm_aggregator", "phi")]),
    ("importance ratio", [("train/importance_ratio_max", "max"), ("train/importance_ratio_mean", "mean"),
                          ("train/importance_ratio_min", "min")]),
    ("seconds per step", [("time/search_s", "search"), ("time/aggregation_s", "aggregation"),
                          ("time/rollout_s", "rollout (all)"), ("time/train_s", "train")]),
]


# train.py's closing table, as the README's: (row label, metrics.jsonl key); a run prints the rows it has.
FIRST_LAST_ROWS = [("search accuracy", "search_accuracy"), ("aggregation accuracy", "aggregation_accuracy"),
                   ("GRPO accuracy", "accuracy"), ("search-trace token entropy (nats)", "rollout/entropy_search"),
                   ("GRPO token entropy (nats)", "rollout/entropy_grpo")]


def generated_tokens_line(rows: list[dict], by_level: bool, budget: str) -> str:
    """Completion tokens actually generated per drawn problem, the mean over the logged steps (search and aggregation
    apart when `by_level`, as for SPIRAL), next to the maximum `budget`: equal maximum budgets need not mean equal
    tokens generated."""
    rows = [r for r in rows if "tokens_per_problem" in r]
    if not rows:
        return "no steps logged"
    mean = lambda key: sum(r.get(key, 0.0) for r in rows) / len(rows)  # noqa: E731
    parts = (f" (search {mean('tokens_per_problem_search'):.0f}, aggregation "
             f"{mean('tokens_per_problem_aggregation'):.0f})" if by_level else "")
    return (f"tokens generated per drawn problem, mean over steps {rows[0]['step']}-{rows[-1]['step']}: "
            f"{mean('tokens_per_problem'):.0f}{parts}, of at most {budget}")


def first_last_table(rows: list[dict]) -> str:
    """The README's demo table (Markdown): each metric's mean over the first and the last 10% of steps (at least
    one step each), so a run compares with the README without reading metrics.jsonl."""
    if not rows:
        return "no steps logged"
    tenth = max(1, round(len(rows) / 10))
    first, last = rows[:tenth], rows[-tenth:]
    lines = [f"| mean over | first 10% of steps ({first[0]['step']}-{first[-1]['step']}) "
             f"| last 10% of steps ({last[0]['step']}-{last[-1]['step']}) |", "|---|---|---|"]
    for label, key in FIRST_LAST_ROWS:
        if all(isinstance(r.get(key), (int, float)) for r in first + last):
            means = [sum(r[key] for r in part) / len(part) for part in (first, last)]
            lines.append(f"| {label} | {means[0]:.2f} | {means[1]:.2f} |")
    return "\n".join(lines)


class StepBar:
    """train.py's progress bar over steps. After each step it names the accuracy it shows (SPIRAL: aggregation,
    the rewarded level, and search; GRPO: its traces'); inside a step, its stage: the rollouts with the problems
    drawn so far (dynamic sampling may draw more than |B|), then the gradient."""

    def __init__(self, algo: str, total: int, initial: int):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=algo, dynamic_ncols=True)
        self.last = ""

    def stage(self, text: str) -> None:
        self.bar.set_postfix_str(f"{self.last}{self.last and ' | '}step {self.bar.n + 1}: {text}", refresh=True)

    def counting(self, draw):
        """`draw` (a draw_problem callable) that shows how many problems this step has drawn."""
        drawn = 0

        def draw_counted():
            nonlocal drawn
            drawn += 1
            self.stage(f"rollouts, problems drawn: {drawn}")
            return draw()
        return draw_counted

    def step_done(self, row: dict) -> None:
        if "aggregation_accuracy" in row:
            self.last = f"aggregation acc {row['aggregation_accuracy']:.3f}, search acc {row['search_accuracy']:.3f}"
        elif "search_accuracy" in row:  # --aggregator oracle: no aggregation trace
            self.last = f"search acc {row['search_accuracy']:.3f}"
        else:
            self.last = f"GRPO acc {row['accuracy']:.3f}"
        self.bar.set_postfix_str(f"{self.last}, {row['time/generated_tokens_per_s']:.0f} tok/s", refresh=False)
        self.bar.update(1)

    def write(self, line: str) -> None:
        """A warning line printed above the bar (to stderr), not through it."""
        self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


_LAST_PROGRESS_LINE = {"at": None}  # time.monotonic() of the last line any Progress printed (or of the first start)


class Progress:
    """Progress of a long stage, on a terminal and in a log file alike: a tqdm bar when `stream` (default stderr)
    is a terminal; otherwise plain lines, "DESC: 120/800 traces (15%), 1:20 elapsed, about 7:30 left", at most one
    per `every_s` seconds across all the stages of a process (so a run of many short stages reports on the one under
    way), also while one long call runs (`heartbeat`: a timer thread), and a last one at the end of a stage that
    printed; a short run prints nothing. (A redirected tqdm bar prints nothing, or one endless line of \\r.)"""

    def __init__(self, total: int, desc: str, unit: str = "", *, every_s: float = 30.0, stream=None, clock=None,
                 heartbeat: bool = True, shared: bool | None = None):
        import threading
        import time

        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.shared = clock is None if shared is None else shared  # the every_s spacing holds across stages
        self.clock = clock or time.monotonic
        self.done, self.start, self.note = 0, self.clock(), ""
        self.last_line, self.lines, self.printed_done = self.start, 0, None
        if self.shared and _LAST_PROGRESS_LINE["at"] is None:
            _LAST_PROGRESS_LINE["at"] = self.start
        self.bar, self.lock, self.stopped = None, threading.Lock(), threading.Event()
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=f" {unit}" if unit else "it", file=self.stream,
                            dynamic_ncols=True)
        elif heartbeat and every_s > 0:
            threading.Thread(target=self._beat, daemon=True).start()

    def _due(self) -> bool:
        last = _LAST_PROGRESS_LINE["at"] if self.shared else self.last_line
        return self.clock() - last >= self.every_s

    def _beat(self) -> None:
        while not self.stopped.wait(min(1.0, self.every_s)):
            with self.lock:
                if not self.stopped.is_set() and self._due():
                    self._line()

    def _line(self) -> None:
        def clock_text(seconds: float) -> str:
            minutes, seconds = divmod(int(seconds), 60)
            return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"

        elapsed = self.clock() - self.start
        text = f"{self.desc}: {self.done}/{self.total}{' ' + self.unit if self.unit else ''}"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        text += f", {self.note}" if self.note else ""
        text += f", {clock_text(elapsed)} elapsed"
        if 0 < self.done < self.total:
            text += f", about {clock_text(elapsed * (self.total - self.done) / self.done)} left"
        print(text, file=self.stream, flush=True)
        self.last_line, self.lines, self.printed_done = self.clock(), self.lines + 1, self.done
        if self.shared:
            _LAST_PROGRESS_LINE["at"] = self.last_line

    def update(self, n: int = 1, note: str = "") -> None:
        """n more done; `note` (a loss, say) is shown after the count from now on."""
        with self.lock:
            self.done, self.note = self.done + n, note or self.note
            if self.bar is not None:
                if note:
                    self.bar.set_postfix_str(note, refresh=False)
                self.bar.update(n)
            elif self._due():
                self._line()

    def close(self) -> None:
        self.stopped.set()
        with self.lock:
            if self.bar is not None:
                self.bar.close()
            elif self.lines and self.printed_done != self.done:  # the last line of a stage that printed
                self._line()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def dashboard_series(rows: list[dict]) -> list[tuple[str, list[tuple[str, list, list]]]]:
    """[(panel title, [(legend label, steps, values)])]: what the dashboard draws, for the keys the rows have."""
    panels = []
    for panel, series in DASHBOARD:
        drawn = []
        for key, label in series:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                drawn.append((label, [x for x, _ in points], [y for _, y in points]))
        panels.append((panel, drawn))
    return panels


def training_figure(rows: list[dict], title: str = ""):
    """dashboard_series drawn as a matplotlib Figure (3 x 3 panels over steps), or None without matplotlib."""
    plt = _pyplot("train.py")
    if plt is None:
        return None
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(3, 3, figsize=(15, 10), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, dashboard_series(rows)):
        for label, steps, values in series:
            ax.plot(steps, values, marker=".", label=label, ls="--" if "dashed" in label else "-")
        if panel.startswith(("accuracy", "truncation", "can line 13")):
            ax.set_ylim(-1.03 if panel.startswith("can") else -0.03, 1.03)  # a correlation may be negative
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


# The seeds figure of benchmarks/reproduce.py: (panel title, [(metrics.jsonl key, legend label)])
SEED_PANELS = [("accuracy (mean reward)", [("search_accuracy", "search"), ("aggregation_accuracy", "aggregation"),
                                           ("accuracy", "")]),
               ("token entropy of the traces (nats)", [("rollout/entropy_search", "search"),
                                                        ("rollout/entropy_grpo", "")])]


def min_max_band(ax, x, ys, **kw) -> None:
    """The mean over seeds of ys (seeds, points) at x, with bars from the smallest to the largest seed's value."""
    import numpy as np

    ys = np.array(ys, dtype=float)  # (seeds, points)
    mean = ys.mean(0)
    ax.errorbar(x, mean, yerr=[mean - ys.min(0), ys.max(0) - mean], capsize=3, **kw)


def plot_seed_mean(ax, curves: list[list[float]], **kw) -> None:
    """One line: the mean over seeds of per-step curves (cut to the shortest), as a 5-step moving average; markers
    when it has fewer than 5 points, so that a short run's few points stay visible."""
    import numpy as np

    n = min(len(c) for c in curves)
    x, y = smoothed(list(np.mean([c[:n] for c in curves], 0)))
    ax.plot(x, y, marker="o" if len(x) < 5 else "", **kw)


def smoothed(values: list[float], window: int = 5):
    """(steps, moving average over `window` steps, shorter for a short run): each point is the mean of real steps,
    placed at the middle one (steps count from 1)."""
    import numpy as np

    window = max(1, min(window, len(values)))
    y = np.convolve(values, np.ones(window) / window, mode="valid")
    return np.arange(len(y)) + (window + 1) / 2, y


def plot_seed_curves(runs: dict[str, list[list[dict]]], path: str, title: str = "") -> bool:
    """Training curves over seeds ({algorithm label: [each seed's metrics rows]}): per metric the mean over seeds
    (a line) and their range (a band), each smoothed over 5 steps. False (after a notice) without matplotlib."""
    plt = _pyplot("reproduce.py")
    if plt is None:
        return False
    import numpy as np

    fig, axes = plt.subplots(1, len(SEED_PANELS), figsize=(13, 4.2), squeeze=False)
    colours = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for name, seeds in runs.items():
        steps = min(len(rows) for rows in seeds)
        for ax, (_, series) in zip(axes.flat, SEED_PANELS):
            for key, what in series:
                if not all(isinstance(r.get(key), (int, float)) for rows in seeds for r in rows[:steps]):
                    continue
                smooth = [smoothed([r[key] for r in rows[:steps]]) for rows in seeds]
                x, values_S_T = smooth[0][0], np.array([y for _, y in smooth])  # (seeds, T)
                colour = next(colours)
                label = f"{name} {what}".strip()
                ax.plot(x, values_S_T.mean(0), color=colour, label=label)
                ax.fill_between(x, values_S_T.min(0), values_S_T.max(0), color=colour, alpha=0.2)
    for ax, (panel, _) in zip(axes.flat, SEED_PANELS):
        ax.set(title=panel, xlabel="step (5-step mean)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title + "  (line: mean over seeds, band: min to max)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def entropy_accuracy_points(seed_rows: list[list[dict]], accuracy_key: str, entropy_key: str, window: int = 5):
    """Per seed, (search accuracy, search-trace entropy) over training steps, both smoothed over `window` steps
    (the points of one seed's path); steps without either metric are left out."""
    paths = []
    for rows in seed_rows:
        rows = [r for r in rows if isinstance(r.get(accuracy_key), (int, float))
                and isinstance(r.get(entropy_key), (int, float))]
        if rows:
            paths.append((smoothed([r[accuracy_key] for r in rows], window)[1],
                          smoothed([r[entropy_key] for r in rows], window)[1]))
    return paths


def plot_entropy_against_accuracy(ax, series: dict[str, tuple]) -> None:
    """The paper's entropy figure read at matched accuracy: for each label, (seed_rows, accuracy key, entropy key,
    colour), every seed's path of (search accuracy, search-trace entropy) over training steps (5-step means), so two
    algorithms are compared where their search traces are equally accurate, not at the same step."""
    for label, (seed_rows, accuracy_key, entropy_key, colour) in series.items():
        for i, (x, y) in enumerate(entropy_accuracy_points(seed_rows, accuracy_key, entropy_key)):
            ax.plot(x, y, color=colour, alpha=0.6, linewidth=1, label=label if i == 0 else None)
            ax.plot(x[-1:], y[-1:], color=colour, marker="o", markersize=3)  # where the run ended
    ax.set(xlabel="search accuracy (5-step mean)", ylabel="search-trace token entropy (nats)",
           title="entropy against accuracy over training (dot: last step)")


def plot_evaluation(summaries: dict[str, dict], path: Path, title: str = "") -> None:
    """evaluate.py's PNG: the paper's test-time figure kinds, one colour per policy ({label: summary}).

    Panels: pass@k vs k; RSA pass@1 vs step (one marker per population P); accuracy vs the number of parallel
    traces (majority@k at k, RSA after its last step at P, pass@1 for reference); sequential pass@1 vs
    max_new_tokens; and every method against the maximum token budget per problem (the paper's x-axis).
    """
    plt = _pyplot("evaluate.py")
    if plt is None:
        path.unlink(missing_ok=True)  # not a stale plot of an earlier run next to this run's JSON
        return
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.2))
    (passk, rsa, parallel), (sequential, budget, key) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    populations = sorted({r["population"] for s in summaries.values() for r in s.get("rsa", [])})
    p_marker = dict(zip(populations, "oDvPX*h" * 3))
    # P's line style: none of majority@k's "--" and sequential's ":"
    p_style = dict(zip(populations, ["-", "-.", (0, (6, 1, 1, 1, 1, 1)), (0, (9, 3))] * 4))
    for colour, (label, s) in zip(colours, summaries.items()):
        c = dict(color=colour, markersize=4)
        if "passk" in s:
            passk.plot(s["passk"]["k"], s["passk"]["pass_at_k"], marker="o", **c)
            ks = s["passk"]["k"]  # pass@1 for reference, across the same range of traces
            parallel.plot([ks[0], ks[-1]], [s["passk"]["pass_at_k"][0]] * 2, color=colour, linestyle=":", linewidth=1)
        for r in s.get("rsa", []):  # P told apart by line style and marker, the policy by colour
            p = dict(marker=p_marker[r["population"]], linestyle=p_style[r["population"]], linewidth=1.8, **c)
            rsa.plot(r["step"], r["pass_at_1"], **p)
            budget.plot(r["budget"], r["pass_at_1"], **p)
        if s.get("rsa"):
            parallel.plot([r["population"] for r in s["rsa"]], [r["pass_at_1"][-1] for r in s["rsa"]], marker="o", **c)
        if "majority" in s:
            parallel.plot(s["majority"]["k"], s["majority"]["accuracy"], linestyle="--", marker="s", **c)
            budget.plot(s["majority"]["budget"], s["majority"]["accuracy"], linestyle="--", marker="s", **c)
        if "sequential" in s:
            sequential.plot(s["sequential"]["max_new_tokens"], s["sequential"]["pass_at_1"], marker="^", **c)
            budget.plot(s["sequential"]["budget"], s["sequential"]["pass_at_1"], linestyle=":", marker="^", **c)
    panels = [(passk, "Pass@k evaluation", "k, independent attempts", "pass@k (coverage)"),
              (rsa, "Pass@1 under recursive self-aggregation", "RSA step", "pass@1"),
              (parallel, "Inference methods scaling parallel traces", "parallel traces (majority: k, RSA: P)",
               "accuracy (RSA: after the last step)"),
              (sequential, "Scaling sequential compute", "maximum new tokens per trace", "pass@1"),
              (budget, "Inference compute against token usage", "maximum token budget per problem (paper's x-axis)",
               "accuracy")]
    tokens = FuncFormatter(lambda v, _: f"{v / 1024:g}k" if v >= 1024 else f"{v:g}")  # 16k, 64k as in the paper
    for ax, name, xlabel, ylabel in panels:
        ax.set_title(f"paper: {name}", fontsize=10)
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3)
        xs = sorted({x for line in ax.lines for x in line.get_xdata()})
        if xs and ax is not rsa:
            ax.set_xscale("log", base=2)
            if ax is not budget:  # few values: tick each one
                ax.set_xticks(xs)
            ax.xaxis.set_major_formatter(tokens)
            ax.xaxis.set_minor_formatter(NullFormatter())
    rsa.xaxis.set_major_locator(MaxNLocator(integer=True))
    black = dict(color="black", markersize=5)
    handles = [Line2D([], [], color=colour, linewidth=3, label=label) for colour, label in zip(colours, summaries)]
    handles += [Line2D([], [], marker=m, linestyle=p_style[p], linewidth=1.8, label=f"RSA, population P={p}", **black)
                for p, m in p_marker.items()]
    handles += [Line2D([], [], marker="s", linestyle="--", label="majority@k", **black),
                Line2D([], [], marker="^", linestyle=":", label="sequential", **black),
                Line2D([], [], linestyle=":", linewidth=1, label="pass@1 (reference)", **black)]
    key.legend(handles=handles, loc="center", fontsize=10, frameon=False)
    key.axis("off")
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    print(f"wrote {path}")


def evaluation_curves(summaries: dict[str, dict]):
    """(title, x key, y key, {label: curve}) for each curve of evaluate.py's summaries (all hold the same curves)."""
    first = next(iter(summaries.values()))
    for method, x, y in [("passk", "k", "pass_at_k"), ("majority", "k", "accuracy"),
                         ("sequential", "max_new_tokens", "pass_at_1")]:
        if method in first:
            length = "" if method == "sequential" else f", traces of up to {first[method]['max_new_tokens']} tokens"
            yield method + length, x, y, {label: s[method] for label, s in summaries.items()}
    for i, r in enumerate(first.get("rsa", [])):
        yield (f"rsa, population P={r['population']}, set size k={r['set_size']}", "step", "pass_at_1",
               {label: s["rsa"][i] for label, s in summaries.items()})


def evaluation_table(summaries: dict[str, dict]) -> str:
    """Plain-text tables, one per curve: x, maximum budget, then accuracy and tokens generated of each policy (RSA:
    search and aggregation tokens apart)."""
    lines = []
    for name, x, y, curve_of in evaluation_curves(summaries):
        first = next(iter(curve_of.values()))
        split = any(any(c.get("aggregation_tokens", [])) for c in curve_of.values())  # RSA after step 1
        columns = [y, "search_tokens", "aggregation_tokens"] if split else [y, "tokens"]
        heads = ["acc", "search tok", "agg tok"] if split else ["acc", "tokens"]
        header = [x, "max budget", *(f"{label} {h}" for label in curve_of for h in heads)]
        lines += [f"\n{name}", "  ".join(f"{h:>14}" for h in header)]
        for i, (xv, budget) in enumerate(zip(first[x], first["budget"])):
            cells = [xv, budget, *(c[col][i] for c in curve_of.values() for col in columns)]
            lines.append("  ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v:>14}" for v in cells))
    return "\n".join(lines)


def set_table(summaries: dict[str, dict]) -> str:
    """evaluate.py's set-level measures as text: per policy and RSA population, one row per step t >= 2 (its sets
    over step t-1), the aggregator's accuracy with the number of sets it is over in brackets."""
    def cell(rate, count):
        return "-" if rate is None else f"{rate:.3f} ({count})"

    lines = []
    for label, summary in summaries.items():
        if "search" in summary.get("sets", {}):
            search = summary["sets"]["search"]
            lines.append(f"\nsets of {label}'s search traces: distinct answers per k-subset (coverage: pass@k) " +
                         ", ".join(f"k={k}: {d:.2f}" for k, d in zip(search["k"], search["distinct_answers"])))
        for m in summary.get("sets", {}).get("rsa", []):
            k = m["set_size"]
            lines += [f"\nsets of {label}, RSA population P={m['population']}, set size k={k} (c: right candidates)",
                      "  ".join(f"{h:>13}" for h in ["step", "sets", "coverage", "distinct", "recovery c=0",
                                                      "minority", "vs plurality", f"all right c={k}"])]
            for i, t in enumerate(m["step"]):
                by_c = m["sets_by_correct"][i]
                minority = sum(by_c[1:(k + 1) // 2])
                cells = [t, m["sets"][i], f"{m['coverage'][i]:.3f}", f"{m['distinct_answers'][i]:.2f}",
                         cell(m["recovery"][i], by_c[0]), cell(m["minority"][i], minority),
                         cell(m["against_plurality"][i], m["against_plurality_sets"][i]),
                         cell(m["no_regression"][i], by_c[k])]
                lines.append("  ".join(f"{v:>13}" for v in cells))
    return "\n".join(lines)


def cross_table(cross: list[dict]) -> str:
    """evaluate.py's cross-aggregation as text: per RSA population, a matrix of pass@1 after the last step (rows:
    the policy whose search traces step 1 held; columns: the policy that aggregated), then each pair's curve with the
    tokens its search and its aggregation generated."""
    lines = []
    searchers = list(dict.fromkeys(c["search"] for c in cross))
    aggregators = list(dict.fromkeys(c["aggregator"] for c in cross))
    for i, first in enumerate(cross[0]["summary"]["rsa"] if cross else []):
        T, P = first["step"][-1], first["population"]
        at = {(c["search"], c["aggregator"]): c["summary"]["rsa"][i] for c in cross}
        lines += [f"\ncross-aggregation, population P={P}, set size k={first['set_size']}: pass@1 after step {T} "
                  "(rows: search policy, columns: aggregator policy)",
                  "  ".join(f"{h:>14}" for h in ["search \\ agg", *aggregators])]
        lines += ["  ".join([f"{a:>14}", *(f"{at[a, b]['pass_at_1'][-1]:>14.3f}" if (a, b) in at else f"{'-':>14}"
                                           for b in aggregators)]) for a in searchers]
        lines.append("  ".join(f"{h:>14}" for h in ["search -> agg", *(f"step {t}" for t in first["step"]),
                                                     "search tok", "agg tok"]))
        for (a, b), curve in at.items():
            lines.append("  ".join([f"{a + ' -> ' + b:>14}", *(f"{v:>14.3f}" for v in curve["pass_at_1"]),
                                    f"{curve['search_tokens'][-1]:>14.1f}", f"{curve['aggregation_tokens'][-1]:>14.1f}"]))
    return "\n".join(lines)


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "figures.py", "train.py and evaluate.py use")
