"""The tables, verdicts and figure of benchmarks/set_rl.py, from its runs' metrics.jsonl and its evaluations.

Every cell is mean ± sample sd [min, max] over seeds (the warm start: its one value); OUT.json holds each cell's
values per seed. Each comparison of two arms on a headline measure gives Welch's p, the paired p (seed i against
seed i), the smallest difference the seeds detect (stats.detectable, 80% power, 5% level) and a verdict:
"A ahead" / "B ahead" (Welch p < 0.05 and a difference the tables show: at least RESOLUTION), "no difference detected" (the headroom left, 1 - the better mean, is more
than the detectable difference), "untestable at the ceiling" (it is not, and it is at most CEILING_BAND: two arms
at 1.0 on every seed included; no outcome could have shown the worse arm ahead), or "too few seeds to detect" (there
is room, but the seeds' spread puts the detectable difference beyond it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict

import numpy as np

import runner
import stats
from set_rl_design import ARMS, GRID_KS, LR_GRID, REPO, RSA_K, RSA_P, SAMPLES

HEADLINE = ["pass@1", "pass@4", "pass@16", "majority@16", "RSA step 2", "RSA step 3", "pass@1 greedy"]
COMPARISONS = [  # (a, b, what the difference says)
    ("spiral", "own", "set RL's own contribution: line 13 against each trace's own reward"),
    ("spiral", "none", "line 13 against the floor (transfer through shared weights)"),
    ("own", "none", "own-reward search against the floor"),
    ("oracle", "own", "line 13 with a perfect selector against own-reward search"),
    ("passn", "own", "exact pass@n against own-reward search"),
    ("oracle", "none", "line 13 with a perfect selector against the floor"),
    ("passn", "none", "exact pass@n against the floor"),
    ("passn", "spiral", "line 13 at its limit (perfect selector, every set) against SPIRAL's"),
    ("passn", "oracle", "every set against K = 4 sampled sets: what line 13's sampling noise costs"),
    ("spiral", "grpo", "the paper's comparison: SPIRAL against GRPO at equal maximum budget"),
    ("spiral", "grpo_tok", "SPIRAL against GRPO at equal generated tokens"),
]
ACCURACY_BINS = [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.01)]
COLORS = {"base": "tab:gray", "spiral": "tab:red", "oracle": "tab:orange", "passn": "tab:brown",
          "own": "tab:purple", "none": "tab:olive", "grpo": "tab:blue", "grpo_tok": "tab:cyan"}


def _at(curve, key, x_key, x):
    return curve[key][curve[x_key].index(x)]


def _rsa(summary):
    return next(r for r in summary["rsa"] if r["population"] == RSA_P)


def columns(evaluations: dict) -> list[tuple[str, callable]]:
    """(column, how to read it from a policy's label) over the three evaluations."""
    def main(fn):
        return lambda label: fn(evaluations["heldout"]["policies"][label]["summary"])

    cols = [(f"pass@{k}", main(lambda s, k=k: _at(s["passk"], "pass_at_k", "k", k))) for k in (1, 2, 4, 8, 16)]
    cols += [(f"majority@{k}", main(lambda s, k=k: _at(s["majority"], "accuracy", "k", k))) for k in (4, 16)]
    cols += [(f"RSA step {t}", main(lambda s, t=t: _rsa(s)["pass_at_1"][t - 1])) for t in (1, 2, 3)]
    cols += [("pass@1 greedy", lambda label: _at(evaluations["greedy"]["policies"][label]["summary"]["passk"],
                                                 "pass_at_k", "k", 1)),
             ("pass@1 T=0.5", lambda label: _at(evaluations["t0.5"]["policies"][label]["summary"]["passk"],
                                                "pass_at_k", "k", 1)),
             ("distinct answers per 4", main(lambda s: _at(s["sets"]["search"], "distinct_answers", "k", 4))),
             ("tokens/problem RSA step 3", main(lambda s: _rsa(s)["tokens"][2]))]
    return cols


def _value(fn, *args):
    try:
        return fn(*args)
    except (KeyError, IndexError, ValueError, StopIteration, TypeError):  # an instrument this evaluation lacks
        return None


def _cell(values, digits: int = 3) -> str:
    return "-" if not values or None in values else runner.spread(values, digits)


def _table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|---" * len(head) + "|"] + ["| " + " | ".join(r) + " |"
                                                                                   for r in rows])


def evaluation_table(runs, evaluations) -> tuple[str, dict]:
    cols = columns(evaluations)
    cells = {"base": {c: [_value(fn, "base")] for c, fn in cols}}
    for arm in runs:
        cells[arm] = {c: [_value(fn, r.name) for r in runs[arm]] for c, fn in cols}
    rows = [[("warm start" if name == "base" else f"{ARMS[name][0]} ({len(runs[name])} seeds)")]
            + [_cell(row[c], 0 if c.startswith("tokens") else 3) for c, _ in cols] for name, row in cells.items()]
    return _table(["policy", *[c for c, _ in cols]], rows), cells


CEILING_BAND = 0.05  # headroom at most this: "at the ceiling"; more, yet below the detectable difference: too few seeds
RESOLUTION = 0.0005  # the tables' three digits: a difference they print as +0.000 is never "ahead", whatever its p


def verdict(a: list[float], b: list[float], names: tuple[str, str], ceiling: float = 1.0) -> dict:
    """Welch's and the paired p, the detectable difference, the headroom left and the verdict (module docstring)."""
    mean_a, mean_b = float(np.mean(a)), float(np.mean(b))
    p_welch, p_paired = stats.welch(a, b), stats.paired(a, b)
    smallest = stats.detectable(a, b)
    headroom = ceiling - max(mean_a, mean_b)
    if p_welch < 0.05 and abs(mean_a - mean_b) >= RESOLUTION:
        said = f"{names[0] if mean_a > mean_b else names[1]} ahead"
    elif headroom <= smallest and headroom <= CEILING_BAND:  # both at 1.0 on every seed: 0 <= 0 too
        said = "untestable at the ceiling"
    elif headroom <= smallest:  # room left, but the seeds' spread hides any difference that fits in it
        said = "too few seeds to detect"
    else:
        said = "no difference detected"
    return {"difference": mean_a - mean_b, "p_welch": p_welch, "p_paired": p_paired, "detectable": smallest,
            "headroom": headroom, "verdict": said}


def comparison_table(eval_cells: dict) -> tuple[str, dict]:
    rows, cells = [], {}
    for a, b, what in COMPARISONS:
        if a not in eval_cells or b not in eval_cells:
            continue
        for measure in HEADLINE:
            va, vb = eval_cells[a].get(measure), eval_cells[b].get(measure)
            if not va or not vb or None in va or None in vb or len(va) < 2:
                continue
            v = verdict(va, vb, (a, b))
            cells[f"{a}|{b}|{measure}"] = v
            rows.append([f"{a} − {b}", measure, f"{v['difference']:+.3f}", f"{v['p_welch']:.3f}",
                         f"{v['p_paired']:.3f}", f"{v['detectable']:.3f}", f"{v['headroom']:.3f}", v["verdict"]])
    table = _table(["comparison", "measure", "difference of means", "Welch p", "paired p",
                    "smallest detectable (80%)", "headroom", "verdict"], rows)
    legend = "\n".join(f"- {a} − {b}: {what}" for a, b, what in COMPARISONS)
    return legend + "\n\n" + table, cells


def read_rows(runs) -> dict[str, list[list[dict]]]:
    import checkpoint

    return {arm: [checkpoint.read_metrics(os.path.join(REPO, r.out, "metrics.jsonl")) for r in rs]
            for arm, rs in runs.items()}


def _keys(arm: str) -> tuple[str, str]:
    """(search accuracy key, search-trace entropy key) of an arm's metrics.jsonl."""
    return ("accuracy", "rollout/entropy_grpo") if arm.startswith("grpo") else ("search_accuracy",
                                                                               "rollout/entropy_search")


def _part(rows: list[dict], how: str) -> list[dict]:
    """The rows of a part of training: all, the first or last 10% (at least one step), the last half or quarter."""
    tenth, half, quarter = max(1, round(len(rows) / 10)), max(1, len(rows) // 2), max(1, len(rows) // 4)
    return {"mean": rows, "first": rows[:tenth], "last": rows[-tenth:], "last half": rows[-half:],
            "last quarter": rows[-quarter:]}[how]


def _reduce(rows: list[dict], key: str | None, how: str) -> float | None:
    part = _part(rows, how) if rows else []
    if key is None or not part or any(key not in r for r in part):
        return None
    return float(np.mean([r[key] for r in part]))


def _gain_last_quarter(rows: list[dict], key: str, window: int = 5) -> float | None:
    """Plateau check: the 5-step mean at the end minus the one a quarter of training earlier."""
    values = [r[key] for r in rows if key in r]
    if len(values) < 2 * window:
        return None
    q = max(window, len(values) // 4)
    return float(np.mean(values[-window:]) - np.mean(values[-q - window:-q]))


TRAINING_ROWS = [  # (row, key, how, digits); the accuracy and entropy keys follow the arm (_keys)
    ("tokens generated per drawn problem", "tokens_per_problem", "mean", 0),
    ("  of which search traces", "tokens_per_problem_search", "mean", 0),
    ("  of which aggregation traces", "tokens_per_problem_aggregation", "mean", 0),
    ("maximum budget per problem", "token_budget_per_problem", "mean", 0),
    ("search accuracy, first 10% of steps", "ACC", "first", 3),
    ("search accuracy, last 10% of steps", "ACC", "last", 3),
    ("aggregation accuracy, last 10% of steps", "aggregation_accuracy", "last", 3),
    ("search-trace entropy (nats), first 10%", "ENT", "first", 3),
    ("search-trace entropy (nats), last 10%", "ENT", "last", 3),
    ("problems drawn per step", "problems_drawn", "mean", 1),
    ("problems kept per step (of 8)", "problems_kept", "mean", 1),
    ("steps ended by the draw cap", "draw_cap_hit", "mean", 2),
    ("line 13: problems whose set scores differ, last half", "line13/set_scores_differ", "last half", 3),
    ("line 13: sd of the set scores, last half", "line13/set_score_sd", "last half", 3),
    ("line 13: corr(A#_marg, own-reward advantage), last half", "line13/corr_set_own", "last half", 3),
    ("line 13: wrong traces with A#_marg > 0, last half", "line13/wrong_positive", "last half", 3),
    ("gradient norm, mean", "train/grad_norm", "mean", 4),
]


def training_table(rows_by_arm) -> tuple[str, dict]:
    cells, lines = {}, []
    for label, key, how, digits in TRAINING_ROWS:
        cells[label] = {arm: [_reduce(rows, {"ACC": _keys(arm)[0], "ENT": _keys(arm)[1]}.get(key, key), how)
                              for rows in seeds] for arm, seeds in rows_by_arm.items()}
        lines.append([label] + [_cell(cells[label][a], digits) for a in rows_by_arm])
    label = "search accuracy gain over the last quarter (5-step means)"
    cells[label] = {arm: [_gain_last_quarter(rows, _keys(arm)[0]) for rows in seeds] for arm, seeds in
                    rows_by_arm.items()}
    lines.append([label] + [_cell(cells[label][a]) for a in rows_by_arm])
    return _table(["training, per run", *[ARMS[a][0] for a in rows_by_arm]], lines), cells


def entropy_table(rows_by_arm) -> tuple[str, dict]:
    cells, lines = {}, []
    for arm, seeds in rows_by_arm.items():
        acc, ent = _keys(arm)
        points = [(r[acc], r[ent]) for rows in seeds for r in rows if acc in r and ent in r]
        cells[arm] = [[float(np.mean(e)) if (e := [h for a, h in points if lo <= a < hi]) else None, len(e)]
                      for lo, hi in ACCURACY_BINS]
        lines.append([ARMS[arm][0]] + ["-" if m is None else f"{m:.3f} ({n})" for m, n in cells[arm]])
    heads = [f"{lo:.1f}-{min(hi, 1.0):.1f}" for lo, hi in ACCURACY_BINS]
    return _table(["search accuracy of the step", *heads], lines), cells


def probe_table(runs, evaluations) -> tuple[str, dict]:
    """The aggregator probe (instruments.py): accuracy over each kind of candidate set, per arm."""
    import instruments

    policies = evaluations["heldout"]["policies"]
    labels = {"base": ["base"], **{arm: [r.name for r in runs[arm]] for arm in runs}}
    kinds = [*instruments.PROBE_KINDS, "copied", "dependence"]
    cells, lines = {}, []
    for arm, names in labels.items():
        probes = [policies[n]["summary"].get("probe") for n in names]
        if None in probes:
            continue
        cells[arm] = {k: [p[k]["accuracy"] for p in probes] for k in instruments.PROBE_KINDS}
        cells[arm]["copied"] = [p["wrong copies"].get("copied") for p in probes]
        cells[arm]["dependence"] = [instruments.dependence(p) for p in probes]
        cells[arm]["sets"] = [p[k]["problems"] for p in probes[:1] for k in instruments.PROBE_KINDS]
        lines.append(["warm start" if arm == "base" else ARMS[arm][0]] + [_cell(cells[arm][k]) for k in kinds])
    return _table(["aggregator of", *kinds], lines), cells


def set_table(runs, evaluations) -> tuple[str, dict]:
    """RSA step 2's sets (P = 8 members each drawing 4 of the 8 step-1 traces), pooled over seeds: distinct candidate
    sets (unordered, per problem), coverage, and the aggregator's accuracy by its right candidates."""
    policies = evaluations["heldout"]["policies"]
    labels = {"base": ["base"], **{arm: [r.name for r in runs[arm]] for arm in runs}}
    cells, lines = {}, []
    for arm, names in labels.items():
        measures = [next(m for m in policies[n]["summary"]["sets"]["rsa"] if m["population"] == RSA_P)
                    for n in names]
        distinct = sum(len({tuple(sorted(s)) for s in problem["rsa"][str(RSA_P)][1]["sets"]})
                       for n in names for problem in policies[n]["problems"])
        sets_c = np.sum([m["sets_by_correct"][0] for m in measures], axis=0)
        hits_c = np.sum([m["hits_by_correct"][0] for m in measures], axis=0)
        cells[arm] = {"distinct_sets": int(distinct), "sets_by_correct": sets_c.tolist(),
                      "hits_by_correct": hits_c.tolist(), "coverage": [m["coverage"][0] for m in measures]}
        lines.append(["warm start" if arm == "base" else ARMS[arm][0], str(int(sets_c.sum())), str(distinct),
                      _cell(cells[arm]["coverage"])]
                     + [f"{h / n:.3f} ({int(n)})" if n else "-" for h, n in zip(hits_c, sets_c)])
    return _table(["search traces and aggregator of", "sets drawn", "distinct sets", "coverage",
                   *[f"aggregator, {c} of {RSA_K} right" for c in range(RSA_K + 1)]], lines), cells


def cross_table(runs, evaluations) -> tuple[str, dict] | None:
    cross = evaluations["heldout"].get("cross")
    if not cross:
        return None
    by_pair = {(c["search"], c["aggregator"]): _rsa(c["summary"])["pass_at_1"][1] for c in cross}
    arms = ["base"] + [a for a in runs if any(r.name == c["search"] for c in cross for r in runs[a])]
    policies = evaluations["heldout"]["policies"]

    def name(arm, i):
        return "base" if arm == "base" else runs[arm][i].name

    seeds = range(len(next(iter(runs.values()))))
    cells, lines = {}, []
    for a in arms:
        for b in arms:
            values = [(_rsa(policies[name(a, i)]["summary"])["pass_at_1"][1] if a == b
                       else by_pair.get((name(a, i), name(b, i)))) for i in (range(1) if a == b == "base" else seeds)]
            cells[f"{a}|{b}"] = values
        lines.append([a] + [_cell(cells[f"{a}|{b}"]) for b in arms])
    return _table(["search traces of \\ aggregator of", *arms], lines), cells


def difficulty_table(runs, evaluations) -> tuple[str, dict]:
    """Per bucket of the warm start's per-problem pass@8 (from its 16 samples): pass@1, pass@8 and RSA step 3 of
    every arm, mean over seeds of the mean over the bucket's problems."""
    policies = evaluations["heldout"]["policies"]
    base = policies["base"]["problems"]
    buckets = {"warm start pass@8 = 0": [], "0 < pass@8 < 0.5": [], "pass@8 >= 0.5": []}
    for i, p in enumerate(base):
        v = p["pass_at_k"]["8"]
        buckets["warm start pass@8 = 0" if v == 0 else "0 < pass@8 < 0.5" if v < 0.5 else "pass@8 >= 0.5"].append(i)
    measures = {"pass@1": lambda p: p["pass_at_k"]["1"], "pass@8": lambda p: p["pass_at_k"]["8"],
                "RSA step 3": lambda p: p["rsa"][str(RSA_P)][2]["pass_at_1"]}
    cells, lines = {}, []
    labels = {"base": ["base"], **{arm: [r.name for r in runs[arm]] for arm in runs}}
    for bucket, members in buckets.items():
        for measure, fn in measures.items():
            row = [f"{bucket} ({len(members)} problems)", measure]
            for arm, names in labels.items():
                values = [float(np.mean([fn(policies[n]["problems"][i]) for i in members])) if members else None
                          for n in names]
                cells.setdefault(bucket, {}).setdefault(measure, {})[arm] = values
                row.append(_cell(values))
            lines.append(row)
    return _table(["problems", "measure", "warm start", *[ARMS[a][0] for a in runs]], lines), cells


def criteria(eval_cells, train_cells, probe_cells, comparisons) -> tuple[str, dict]:
    """Can line 13 act on this task? The checks of a task where sets stay imperfect after training, each with the
    figure it reads (means over seeds)."""
    def mean(arm, measure, source=eval_cells):
        values = source.get(arm, {}).get(measure)
        return None if not values or None in values else float(np.mean(values))

    gain = train_cells["search accuracy gain over the last quarter (5-step means)"]
    differ = train_cells["line 13: problems whose set scores differ, last half"]
    checks = []
    for arm in [a for a in ("own", "grpo") if a in eval_cells]:
        p1, g = mean(arm, "pass@1"), gain.get(arm)
        g = None if not g or None in g else float(np.mean(g))
        checks.append((f"one trace is not trained to the ceiling ({arm}): pass@1 <= 0.6, gain over the last "
                       f"quarter <= 0.03", p1 is not None and g is not None and p1 <= 0.6 and g <= 0.03,
                       f"pass@1 {p1}, gain {g}"))
        p4 = mean(arm, "pass@4")
        checks.append((f"a set holds more than a trace ({arm}): pass@4 - pass@1 >= 0.2, pass@4 <= 0.95",
                       None not in (p1, p4) and p4 - p1 >= 0.2 and p4 <= 0.95, f"pass@4 {p4}, pass@1 {p1}"))
    for arm in [a for a in ("spiral", "own") if a in probe_cells]:
        rec, dep = mean(arm, "none right", probe_cells), mean(arm, "dependence", probe_cells)
        checks.append((f"the aggregator needs its candidates ({arm}): recovery at 0 right <= 0.3, all right - "
                       f"copies of one wrong >= 0.5", None not in (rec, dep) and rec <= 0.3 and dep >= 0.5,
                       f"recovery {rec}, dependence {dep}"))
        one, p1 = mean(arm, "one right", probe_cells), mean(arm, "pass@1")
        checks.append((f"selecting is easier than solving ({arm}): accuracy with 1 of n right >= pass@1 + 0.3",
                       None not in (one, p1) and one >= p1 + 0.3, f"one right {one}, pass@1 {p1}"))
    d = differ.get("spiral")
    d = None if not d or None in d else float(np.mean(d))
    checks.append(("line 13 keeps acting (SPIRAL): >= 30% of drawn problems with set scores not all equal, last half "
                   "of training", d is not None and d >= 0.3, f"{d}"))
    room = [v for k, v in comparisons.items() if k.startswith("spiral|own|") and k.split("|")[2] in
            ("pass@4", "pass@16", "RSA step 3")]
    checks.append(("headroom on the headline measures >= 3 x the smallest detectable difference (SPIRAL vs own: "
                   "pass@4, pass@16, RSA step 3)", bool(room) and all(v["headroom"] >= 3 * v["detectable"]
                                                                      for v in room),
                   ", ".join(f"{v['headroom']:.3f} vs {v['detectable']:.3f}" for v in room)))
    lines = [[what, "yes" if ok else "**no**", figures] for what, ok, figures in checks]
    return _table(["criterion", "met", "figures (means over seeds)"], lines), {
        what: {"met": bool(ok), "figures": figures} for what, ok, figures in checks}


PLANNED_SEEDS = 5  # per arm, issue 39's experiment
ASSUMED_SD = 0.05  # the between-seed sd one seed cannot measure; stated before any RL run of tiny_countdown


def planned_detectable(sd: float = ASSUMED_SD, seeds: int = PLANNED_SEEDS) -> float:
    """The smallest difference Welch's test detects (80% power, 5% level) between two arms of `seeds` seeds each
    whose values have sample sd `sd`: (t_0.975 + t_0.8) x sd x sqrt(2 / seeds), df = 2 seeds - 2."""
    df = 2 * seeds - 2
    return (stats.t_quantile(0.975, df) + stats.t_quantile(0.8, df)) * sd * (2 / seeds) ** 0.5


def one_seed_criteria(runs, evaluations, seeds: int) -> tuple[str, dict]:
    """criteria() for set_rl.py --check, where one seed gives no spread: the headroom is compared with the
    difference PLANNED_SEEDS seeds per arm would detect at a between-seed sd of ASSUMED_SD, and the table says how
    many seeds per arm would make the headroom 3 x detectable."""
    _, eval_cells = evaluation_table(runs, evaluations)
    _, train_cells = training_table(read_rows(runs))
    _, probe_cells = probe_table(runs, evaluations)
    room = {}
    for measure in ("pass@4", "pass@16", "RSA step 3"):
        best = max(float(np.mean(eval_cells[a][measure])) for a in ("spiral", "own"))
        need = next((n for n in range(2, 101) if 3 * planned_detectable(seeds=n) <= 1 - best), None)
        room[f"spiral|own|{measure}"] = {"headroom": 1 - best, "detectable": planned_detectable(), "seeds": need}
    table, cells = criteria(eval_cells, train_cells, probe_cells, room)
    lines = [f"| {k.split('|')[2]} | {v['headroom']:.3f} | {v['detectable']:.3f} | {v['seeds']} |"
             for k, v in room.items()]
    evaluation, _ = evaluation_table(runs, evaluations)
    probe, _ = probe_table(runs, evaluations)
    training, _ = training_table(read_rows(runs))
    text = "\n\n".join([f"{seeds} seed(s); held-out problems", evaluation, probe, training, table,
                         f"headroom against {PLANNED_SEEDS} + {PLANNED_SEEDS} seeds at sd {ASSUMED_SD}:\n\n"
                         "| measure | headroom | detectable | seeds per arm for 3 x |\n|---|---|---|---|\n"
                         + "\n".join(lines)])
    return text, {"criteria": cells, "headroom": room, "evaluation": eval_cells, "probe": probe_cells,
                  "training": train_cells}


def grid_table(scores: dict, rates: dict, why: str) -> tuple[str, dict]:
    lines = [[ARMS[arm][0]] + [f"{by_lr[lr]:.3f}" if lr in by_lr else "-" for lr in LR_GRID]
             + [f"{rates[arm]:g}"] for arm, by_lr in scores.items()]
    head = ["arm (seed 0, validation split)", *[f"lr {lr:g}" for lr in LR_GRID], "rate used"]
    ks = ", ".join(map(str, GRID_KS))
    return (f"Score: the mean of pass@{{{ks}}} on the validation split. {why}.\n\n" + _table(head, lines),
            {"scores": {a: {f"{lr:g}": v for lr, v in s.items()} for a, s in scores.items()},
             "rates": {a: rates[a] for a in rates}, "rule": why})


def figure(runs, rows_by_arm, evaluations, probe_cells, path: str, title: str) -> bool:
    """Six panels: pass@k, RSA by step, search accuracy over training, line 13's set-score spread over training,
    the aggregator probe, and entropy against accuracy. Lines: mean over seeds; bars and bands: min to max."""
    from figures import _pyplot, min_max_band, plot_entropy_against_accuracy, plot_seed_mean

    plt = _pyplot("set_rl.py")
    if plt is None:
        return False
    import instruments

    policies = evaluations["heldout"]["policies"]
    members = {"base": ["base"], **{a: [r.name for r in runs[a]] for a in runs}}
    names = {"base": "warm start", **{a: ARMS[a][0] for a in runs}}
    fig, axes = plt.subplots(2, 3, figsize=(18, 9.5))
    for key, labels in members.items():
        sums = [policies[m]["summary"] for m in labels]
        style = dict(color=COLORS[key], marker="o", ms=3, label=names[key])
        min_max_band(axes[0, 0], sums[0]["passk"]["k"], [s["passk"]["pass_at_k"] for s in sums], **style)
        min_max_band(axes[0, 1], _rsa(sums[0])["step"], [_rsa(s)["pass_at_1"] for s in sums], **style)
    axes[0, 0].set(xscale="log", xlabel="k", ylabel="pass@k", title="pass@k (held-out problems)")
    axes[0, 0].set_xticks([1, 2, 4, 8, SAMPLES], labels=["1", "2", "4", "8", str(SAMPLES)])
    axes[0, 0].minorticks_off()
    axes[0, 1].set(xlabel="RSA step (1 = the search traces)", ylabel="pass@1", title=f"RSA, P={RSA_P}, sets of 4")
    for arm, seeds in rows_by_arm.items():
        acc = _keys(arm)[0]
        plot_seed_mean(axes[0, 2], [[r[acc] for r in rows] for rows in seeds], color=COLORS[arm], label=names[arm])
        differ = [[r["line13/set_scores_differ"] for r in rows if "line13/set_scores_differ" in r] for rows in seeds]
        if all(differ):
            plot_seed_mean(axes[1, 0], differ, color=COLORS[arm], label=names[arm])
    axes[0, 2].set(xlabel="training step", ylabel="search accuracy (5-step mean)", title="training")
    axes[1, 0].set(xlabel="training step", ylabel="fraction of drawn problems",
                   title="can line 13 act? problems whose set scores differ")
    kinds = list(instruments.PROBE_KINDS)
    shown = [a for a in members if a in probe_cells]
    for j, arm in enumerate(shown):
        means = [float(np.mean(probe_cells[arm][k])) for k in kinds]
        axes[1, 1].bar(np.arange(len(kinds)) + j / (len(shown) + 1), means, width=1 / (len(shown) + 1),
                       color=COLORS[arm], label=names[arm])
    axes[1, 1].set_xticks(np.arange(len(kinds)) + 0.4, labels=kinds)
    axes[1, 1].set(ylabel="aggregator accuracy", title="does the aggregator need its candidates?", ylim=(0, 1.05))
    plot_entropy_against_accuracy(axes[1, 2], {names[a]: (rows, *_keys(a), COLORS[a])
                                               for a, rows in rows_by_arm.items()})
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def provenance(runs) -> dict:
    """The code that trained the runs (their recorded digests), this checkout's commit and the training seconds."""
    import checkpoint

    digests = sorted({d for rs in runs.values() for r in rs
                      for d in runner.trained_by(os.path.join(REPO, r.out),
                                                 checkpoint.latest_checkpoint(os.path.join(REPO, r.out)))})
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    seconds = {r.name: runner.seconds_of(r) for rs in runs.values() for r in rs}
    return {"trained_by_code": digests, "evaluated_at_commit": commit, "train_seconds": seconds}


def write(out: str, header: str, task, runs, scores, rates, why_rates, evaluations, seeds) -> None:
    """OUT.md (every table), OUT.json (every cell per seed) and OUT.png."""
    rows_by_arm = read_rows(runs)
    evaluation, eval_cells = evaluation_table(runs, evaluations)
    training, train_cells = training_table(rows_by_arm)
    probe, probe_cells = probe_table(runs, evaluations)
    compared, comparisons = comparison_table(eval_cells)
    checks, check_cells = criteria(eval_cells, train_cells, probe_cells, comparisons)
    grid, grid_cells = grid_table(scores, rates, why_rates)
    entropy, entropy_cells = entropy_table(rows_by_arm)
    sets, set_cells = set_table(runs, evaluations)
    difficulty, difficulty_cells = difficulty_table(runs, evaluations)
    made = provenance(runs)
    parts = [header, f"Task {task.preset}, {len(seeds)} seeds, {task.steps} steps (unless --steps), held-out "
             f"problems; trained by code {', '.join(made['trained_by_code'])}, tables written at commit "
             f"{made['evaluated_at_commit']}; training took {sum(made['train_seconds'].values()) / 60:.0f} "
             "CPU-process minutes (the runs' own clocks).",
             "## Learning rate (validation split)", grid, "## Held-out evaluation", evaluation,
             "## Comparisons over seeds", compared, "## Can line 13 act here?", checks,
             "## Does the aggregator need its candidates? (the probe: accuracy over each kind of set)", probe,
             "## Training (metrics.jsonl)", training,
             "## Search-trace entropy at matched search accuracy (mean over the steps in the bin; steps)", entropy,
             f"## The sets RSA step 2 aggregates (P={RSA_P}), pooled over seeds", sets,
             "## By difficulty (the warm start's pass@8 on each problem)", difficulty]
    cells = {"evaluation": eval_cells, "comparisons": comparisons, "criteria": check_cells, "probe": probe_cells,
             "training": train_cells, "grid": grid_cells, "entropy_by_accuracy": entropy_cells,
             "sets_step2": set_cells, "difficulty": difficulty_cells}
    crossed = cross_table(runs, evaluations)
    if crossed:
        parts += [f"## Cross-aggregation: RSA P={RSA_P} pass@1 at step 2 (the diagonal: each policy's own RSA)",
                  crossed[0]]
        cells["cross_step2"] = crossed[1]
    markdown = "\n\n".join(parts) + "\n"
    print(markdown)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(f"{out}.md", "w") as f:
        f.write(markdown)
    with open(f"{out}.json", "w") as f:
        json.dump({"task": task.preset, "seeds": seeds, "steps": task.steps, "arms": {a: ARMS[a][1] for a in runs},
                   "provenance": made, "cells": cells}, f, indent=1, default=float)
    title = (f"{task.preset}: SPIRAL and the arms that bound line 13, {len(seeds)} seeds; held-out problems; "
             "bands: min-max over seeds")
    if figure(runs, rows_by_arm, evaluations, probe_cells, f"{out}.png", title):
        print(f"set_rl.py: wrote {out}.md, .json and .png")


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "set_rl_report.py", "set_rl.py uses")
