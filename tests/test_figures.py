"""What figures.py prints and draws, read back by content: which row and column of a table hold which policy's
value, which way a min-max bar points, and the points a curve over several seeds of unequal length draws (each
figure read from its matplotlib artists, never only its existence)."""

import numpy as np
import pytest

import figures
from testtime import SetCounts, set_measures


def _cells(line: str, width: int) -> list[str]:
    """The right-aligned cells of a table line, each `width` characters, two spaces apart."""
    return [line[i: i + width].strip() for i in range(0, len(line), width + 2)]


# ---------------------------------------------------------------------------------------------------------------------
# Printed tables


def _curve(P, pass_at_1, search=10.0, aggregation=20.0):
    steps = list(range(1, len(pass_at_1) + 1))
    return {"population": P, "set_size": 2, "step": steps, "pass_at_1": pass_at_1,
            "search_tokens": [search] * len(steps), "aggregation_tokens": [aggregation * (t - 1) for t in steps]}


def test_the_cross_table_has_the_search_policy_in_rows_and_the_aggregator_in_columns():
    """Three pairs of two policies with different values each (a -> b is not b -> a); two populations. Row a,
    column b is RSA with a's search traces and b's aggregator; a pair not evaluated shows '-'; each pair's curve
    and tokens follow, named search -> aggregator."""
    last = {("a", "a"): 0.1, ("a", "b"): 0.2, ("b", "a"): 0.7}
    cross = [{"search": s, "aggregator": g, "summary": {"rsa": [
        _curve(2, [0.05, v / 2, v], search=10.0 * (1 + (s == "b"))), _curve(4, [0.05, 0.5, v + 0.01])]}}
        for (s, g), v in last.items()]
    lines = figures.cross_table(cross).splitlines()
    for P, shift in ((2, 0.0), (4, 0.01)):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"cross-aggregation, population P={P},"))
        assert "(rows: search policy, columns: aggregator policy)" in lines[at]
        assert _cells(lines[at + 1], 14) == ["search \\ agg", "a", "b"]
        rows = {cells[0]: cells[1:] for cells in (_cells(line, 14) for line in lines[at + 2: at + 4])}
        assert rows == {"a": [f"{0.1 + shift:.3f}", f"{0.2 + shift:.3f}"], "b": [f"{0.7 + shift:.3f}", "-"]}
        curves = {cells[0]: cells[1:] for cells in (_cells(line, 14) for line in lines[at + 5: at + 8])}
        assert curves["b -> a"][:3] == (["0.050", "0.350", "0.700"] if P == 2 else ["0.050", "0.500", "0.710"])
        assert curves["b -> a"][3:] == (["20.0", "40.0"] if P == 2 else ["10.0", "40.0"])  # search, aggregation
        assert curves["a -> b"][2] == f"{0.2 + shift:.3f}"
    assert figures.cross_table([]) == ""


@pytest.mark.parametrize("k", [4, 5])
def test_the_set_table_counts_a_minority_below_half_of_the_set(k):
    """Per step t >= 2: the aggregator's accuracy and, in brackets, the sets it is over. A correct minority is
    0 < c < k / 2: for k = 4 the sets with c = 1 (c = 2 is a split, not a minority), for k = 5 those with c = 1, 2.
    Recovery counts the sets with no right candidate, no regression those with all k right."""
    sets_by_c = [3, 5, 7, 2, 1, 4][: k + 1]
    hits_by_c = [1, 2, 6, 2, 1, 3][: k + 1]
    measures = set_measures(SetCounts(sets_by_c, hits_by_c, 2 * sum(sets_by_c), 4, 3))
    summary = {"sets": {"rsa": [{"population": 8, "set_size": k, "step": [2],
                                 **{name: [value] for name, value in measures.items()}}]}}
    lines = figures.set_table({"p": summary}).splitlines()
    at = lines.index(f"sets of p, RSA population P=8, set size k={k} (c: right candidates)")
    head, row = _cells(lines[at + 1], 13), dict(zip(_cells(lines[at + 1], 13), _cells(lines[at + 2], 13)))
    assert head == ["step", "sets", "coverage", "distinct", "recovery c=0", "minority", "vs plurality",
                    f"all right c={k}"]
    minority = slice(1, (k + 1) // 2)  # k = 4: c = 1; k = 5: c = 1, 2
    below_half = sum(sets_by_c[minority])
    assert below_half == (5 if k == 4 else 12)
    assert row["minority"] == f"{sum(hits_by_c[minority]) / below_half:.3f} ({below_half})"
    assert row["recovery c=0"] == "0.333 (3)" and row["vs plurality"] == "0.750 (4)"
    assert row[f"all right c={k}"] == f"{hits_by_c[k] / sets_by_c[k]:.3f} ({sets_by_c[k]})"
    assert row["sets"] == str(sum(sets_by_c)) and row["step"] == "2"


def _summary(passk, tokens, rsa):
    return {"passk": {"k": [1, 2], "pass_at_k": passk, "tokens": tokens, "budget": [8, 16], "max_new_tokens": 8,
                      "search_tokens": tokens, "aggregation_tokens": [0.0, 0.0]},
            "rsa": [{**_curve(4, rsa), "budget": [32, 64], "tokens": [10.0, 30.0], "max_new_tokens": 8}]}


def test_the_evaluation_table_puts_each_policys_values_under_its_own_label():
    """Two policies, every value different: under "a acc" a's pass@k, under "b tokens" b's tokens, row by row; RSA's
    rows split each policy's tokens into its search and aggregation columns."""
    summaries = {"a": _summary([0.25, 0.5], [3.0, 6.0], [0.1, 0.2]),
                 "b": _summary([0.75, 0.875], [5.0, 10.0], [0.3, 0.4])}
    lines = figures.evaluation_table(summaries).splitlines()
    at = lines.index("passk, traces of up to 8 tokens")
    table = [dict(zip(_cells(lines[at + 1], 14), _cells(line, 14))) for line in lines[at + 2: at + 4]]
    assert table == [{"k": "1", "max budget": "8", "a acc": "0.250", "a tokens": "3.000", "b acc": "0.750",
                      "b tokens": "5.000"},
                     {"k": "2", "max budget": "16", "a acc": "0.500", "a tokens": "6.000", "b acc": "0.875",
                      "b tokens": "10.000"}]
    at = lines.index("rsa, population P=4, set size k=2")
    rsa = [dict(zip(_cells(lines[at + 1], 14), _cells(line, 14))) for line in lines[at + 2: at + 4]]
    assert [(r["step"], r["max budget"], r["a acc"], r["b acc"]) for r in rsa] == [("1", "32", "0.100", "0.300"),
                                                                                   ("2", "64", "0.200", "0.400")]
    assert [(r["b search tok"], r["b agg tok"]) for r in rsa] == [("10.000", "0.000"), ("10.000", "20.000")]


# ---------------------------------------------------------------------------------------------------------------------
# Figures, read back from their artists


@pytest.fixture
def plt():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    yield pyplot
    pyplot.close("all")


def test_min_max_bars_run_from_the_smallest_to_the_largest_seed(plt):
    """Three seeds at three x, each spread lopsided about its mean: the marker is at the mean, the bar's lower end
    at the smallest seed's value and its upper end at the largest's (a bar upside down would end at 2 mean - max)."""
    ys = [[0.1, 0.5, 0.9], [0.2, 0.6, 0.3], [0.6, 0.55, 0.3]]  # (seeds, points)
    _, ax = plt.subplots()
    figures.min_max_band(ax, [1, 2, 4], ys, color="red", marker="o")
    (bars,) = ax.containers
    line, _, (vertical,) = bars.lines
    assert list(line.get_xdata()) == [1, 2, 4]
    assert np.allclose(line.get_ydata(), np.mean(ys, 0))
    ends = np.array([[segment[:, 1].min(), segment[:, 1].max()] for segment in vertical.get_segments()])
    assert np.allclose(ends, np.column_stack([np.min(ys, 0), np.max(ys, 0)]))
    assert all(segment[0, 0] == segment[1, 0] == x for segment, x in zip(vertical.get_segments(), [1, 2, 4]))


def test_a_seed_mean_over_runs_of_unequal_length_is_over_the_steps_every_seed_has(plt):
    """Seeds of 8, 6 and 7 steps: the line is the mean over seeds of steps 1-6 (the shortest run; a later step
    averaged over the seeds that reached it would mix runs), smoothed over 5 steps, whichever seed comes first."""
    curves = [[0.0, 1, 2, 3, 4, 5, 6, 7], [10.0] * 6, [2.0] * 7]
    mean = np.mean([c[:6] for c in curves], 0)  # 4, 4.33, 4.67, 5, 5.33, 5.67
    for order in (curves, curves[::-1]):
        _, ax = plt.subplots()
        figures.plot_seed_mean(ax, order, color="blue")
        (line,) = ax.lines
        assert list(line.get_xdata()) == [3.0, 4.0]
        assert np.allclose(line.get_ydata(), [mean[:5].mean(), mean[1:].mean()])
        assert line.get_marker() == "o"  # fewer than 5 points: markers


def test_seed_curves_over_runs_of_unequal_length_draw_the_steps_every_seed_has(plt, tmp_path, monkeypatch):
    """plot_seed_curves: seeds of 7 and 5 steps; each metric's line is the mean over seeds of each seed's 5-step
    mean over the 5 steps both have, its band from the smaller to the larger seed's value."""
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    seeds = [[{"step": t, "search_accuracy": 0.1 * t, "rollout/entropy_search": 1.0} for t in range(1, 8)],
             [{"step": t, "search_accuracy": 0.5, "rollout/entropy_search": 2.0} for t in range(1, 6)]]
    assert figures.plot_seed_curves({"SPIRAL": seeds}, str(tmp_path / "s.png"))
    (fig,) = figs
    accuracy, entropy = fig.axes
    (line,) = [line for line in accuracy.lines if line.get_label() == "SPIRAL search"]
    assert list(line.get_xdata()) == [3.0] and np.allclose(line.get_ydata(), [(0.3 + 0.5) / 2])
    (band,) = accuracy.collections
    assert np.allclose(sorted({round(y, 9) for y in band.get_paths()[0].vertices[:, 1]}), [0.3, 0.5])
    (line,) = [line for line in entropy.lines if line.get_label() == "SPIRAL search"]
    assert np.allclose(line.get_ydata(), [1.5])


def test_the_evaluation_figure_draws_each_policy_at_its_own_values(plt, tmp_path, monkeypatch):
    """Per policy (its colour): pass@k against k; RSA's pass@1 against the step and against the maximum budget;
    and in the parallel-traces panel RSA after its last step at x = P, next to pass@1's reference line."""
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    summaries = {"a": _summary([0.25, 0.5], [3.0, 6.0], [0.1, 0.2]),
                 "b": _summary([0.75, 0.875], [5.0, 10.0], [0.3, 0.4])}
    figures.plot_evaluation(summaries, tmp_path / "e.png")
    (fig,) = figs
    passk, rsa, parallel, _, budget = fig.axes[:5]
    colours = [line.get_color() for line in passk.lines]
    assert len(set(colours)) == 2
    for colour, s in zip(colours, summaries.values()):
        def drawn(ax):
            return [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines if line.get_color() == colour]
        assert drawn(passk) == [([1, 2], s["passk"]["pass_at_k"])]
        assert drawn(rsa) == [([1, 2], s["rsa"][0]["pass_at_1"])]
        assert drawn(budget) == [([32, 64], s["rsa"][0]["pass_at_1"])]  # the maximum budget, not tokens generated
        assert sorted(drawn(parallel)) == sorted([([1, 2], [s["passk"]["pass_at_k"][0]] * 2),  # pass@1 reference
                                                  ([4], [s["rsa"][0]["pass_at_1"][-1]])])  # RSA after its last step
