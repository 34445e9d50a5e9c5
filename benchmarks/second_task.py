"""SPIRAL against GRPO at equal maximum token budget on the second CPU task (tiny_parts.py), over several seeds.

For each algorithm and seed: `python train.py --preset tiny_parts --algo ALGO --seed S [--steps N]` (reused when
a run with exactly these settings has finished, resumed when one stopped part-way, refused when the run directory
holds another run, such as an earlier --steps 1 trial: see benchmarks/runner.py), then one `python evaluate.py
--preset tiny_parts` call with the warm start and every run side by side (pass@k, majority@k, RSA), from an empty
cache. Writes the table of means and spreads over seeds (Markdown and JSON, both naming the
seeds and steps) and a figure (PNG, needs matplotlib):

    python benchmarks/second_task.py                       # 5 seeds x 2 algorithms, then the evaluation
    python benchmarks/second_task.py --seeds 0,1,2,3,4,5,6,7  # more seeds; finished runs are reused
    python benchmarks/second_task.py --out benchmarks/second_task   # replace the shipped result (README)

Outputs: OUT.{md,json,png} (default runs/second_task/second_task; the shipped result is replaced only when named);
runs and the evaluation under --runs-dir (runs/second_task/). Every output is checked before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import runner  # noqa: E402
from figures import _pyplot, min_max_band, plot_seed_mean  # noqa: E402

ALGOS = ("grpo", "spiral")
# (column, how to read it from one policy's evaluate.py summary)
COLUMNS = [
    ("pass@1", lambda s: s["passk"]["pass_at_k"][s["passk"]["k"].index(1)]),
    ("pass@4", lambda s: s["passk"]["pass_at_k"][s["passk"]["k"].index(4)]),
    ("pass@8", lambda s: s["passk"]["pass_at_k"][s["passk"]["k"].index(8)]),
    ("majority@4", lambda s: s["majority"]["accuracy"][s["majority"]["k"].index(4)]),
    ("majority@8", lambda s: s["majority"]["accuracy"][s["majority"]["k"].index(8)]),
    *[(f"RSA P={P} step {t}", lambda s, P=P, t=t: next(r for r in s["rsa"] if r["population"] == P)["pass_at_1"][t - 1])
      for P in (4,) for t in (2, 3)],
]


def training_runs(seeds: list[int], steps: int | None, runs_dir: str) -> list[runner.Run]:
    """One runner.Run per (algorithm, seed): train.py --preset tiny_parts --algo ALGO --seed S [--steps N]."""
    return [runner.Run(f"{algo}-s{seed}", os.path.join(runs_dir, f"{algo}-s{seed}"),
                       ["--preset", "tiny_parts", "--algo", algo, "--seed", str(seed), "--no-plot",
                        *(["--steps", str(steps)] if steps else [])]) for seed in seeds for algo in ALGOS]


def evaluate(seeds: list[int], runs_dir: str, limit: int) -> dict:
    """One evaluate.py call over the warm start and every run, from an empty cache (a cache kept from an earlier
    version of the code once gave a table this code does not reproduce); returns its result JSON."""
    out = os.path.join(runs_dir, "eval", "results.json")
    args = ["--preset", "tiny_parts", "--limit", str(limit), "--method", "all",
            "--rsa-populations", "4",  # P=8 would triple the CPU time of the evaluation
            "--out", out, "--policy", "base=data/tiny_parts_warmstart"]
    args += [f"--policy={algo}-s{seed}={os.path.join(runs_dir, f'{algo}-s{seed}', 'adapter')}" for algo in ALGOS
             for seed in seeds]
    runner.evaluate_cold(args, "second_task.py")
    with open(os.path.join(REPO, out)) as f:
        return json.load(f)


def table(results: dict, seeds: list[int]) -> tuple[str, dict]:
    """Markdown table (mean ± sample std over seeds, [min, max]) and the same numbers as a dict."""
    policies = results["policies"]
    cells = {"base": {c: [fn(policies["base"]["summary"])] for c, fn in COLUMNS}}
    for algo in ALGOS:
        cells[algo] = {c: [fn(policies[f"{algo}-s{s}"]["summary"]) for s in seeds] for c, fn in COLUMNS}
    lines = ["| policy | " + " | ".join(c for c, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, row in cells.items():
        algo_name = name.upper() if name == "grpo" else "SPIRAL"
        label = "warm start" if name == "base" else f"{algo_name} ({len(seeds)} seeds)"
        lines.append(f"| {label} | " + " | ".join(runner.spread(row[c], 3) for c, _ in COLUMNS) + " |")
    return "\n".join(lines), cells


def figure(results: dict, seeds: list[int], runs_dir: str, path: str) -> bool:
    """Three panels: accuracy vs token budget per problem (pass@1 and majority@k; RSA P=4 through each step), RSA
    pass@1 per step (P=4), and the training curves. Mean over seeds, bars: min to max."""
    plt = _pyplot("second_task.py")
    if plt is None:
        return False
    import checkpoint

    policies = results["policies"]
    colors = {"base": "tab:gray", "grpo": "tab:blue", "spiral": "tab:red"}
    names = {"base": "warm start", "grpo": "GRPO", "spiral": "SPIRAL"}
    members = {"base": ["base"], **{a: [f"{a}-s{s}" for s in seeds] for a in ALGOS}}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))


    for key, labels in members.items():
        sums = [policies[m]["summary"] for m in labels]
        maj = sums[0]["majority"]
        min_max_band(axes[0], maj["budget"], [s["majority"]["accuracy"] for s in sums], color=colors[key], marker="o",
                     label=f"{names[key]} majority@k")
        rsa4 = [next(r for r in s["rsa"] if r["population"] == 4) for s in sums]
        min_max_band(axes[0], rsa4[0]["budget"], [r["pass_at_1"] for r in rsa4], color=colors[key], marker="s",
                     linestyle="--", label=f"{names[key]} RSA P=4, steps 1-3")
        for P, style in ((4, "-"),):
            rs = [next(r for r in s["rsa"] if r["population"] == P) for s in sums]
            min_max_band(axes[1], rs[0]["step"], [r["pass_at_1"] for r in rs], color=colors[key], marker="o",
                         linestyle=style, label=f"{names[key]} P={P}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xticks([16, 32, 64, 128, 192], labels=["16", "32", "64", "128", "192"], minor=False)
    axes[0].minorticks_off()
    axes[0].set(xlabel="max tokens per problem (traces x 16)", ylabel="accuracy",
                title="test-time compute: majority@k (k=1..8) and RSA")
    axes[1].set(xlabel="RSA step (1 = the search traces)", ylabel="pass@1", title="RSA, set size 4")
    axes[1].set_xticks([1, 2, 3])
    for algo in ALGOS:
        for key, style, what in [("accuracy", "-", "reward"), ("search_accuracy", ":", "search"),
                                 ("aggregation_accuracy", "-", "aggregation")]:
            curves = []
            for s in seeds:
                rows = checkpoint.read_metrics(os.path.join(runs_dir, f"{algo}-s{s}", "metrics.jsonl"))
                if rows and key in rows[0]:
                    curves.append([r[key] for r in rows])
            if curves:
                plot_seed_mean(axes[2], curves, color=colors[algo], linestyle=style, label=f"{names[algo]} {what}")
    axes[2].set(xlabel="training step", ylabel="mean reward (5-step mean, over seeds)", title="training")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"tiny_parts: SPIRAL vs GRPO at equal maximum budget (384 tokens per problem), "
                 f"{len(seeds)} seeds, {results['config']['limit']} problems x 8 samples; bars: min-max over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True



def main(argv=None) -> int:
    parser = runner.Parser(prog="second_task.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds (default 0,1,2,3,4)")
    parser.add_argument("--steps", type=int, help="training steps per run (default: the preset's, 30)")
    parser.add_argument("--limit", type=int, default=50, help="evaluation problems (default 50)")
    parser.add_argument("--runs-dir", help="default runs/second_task (in the checkout)")
    parser.add_argument("--jobs", type=int, default=1, help="training runs at a time (default 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="train again the runs in --runs-dir that hold other settings or code; finished runs "
                             "are reused, stopped ones resumed, with or without it")
    parser.add_argument("--out", help="prefix of the .md, .json and .png (default runs/second_task/second_task in "
                        "the checkout; the shipped result: benchmarks/second_task)")
    args = parser.parse_args(argv)
    args.runs_dir = "runs/second_task" if args.runs_dir is None else runner.user_path(args.runs_dir)  # the user's
    args.out = "runs/second_task/second_task" if args.out is None else runner.user_path(args.out)  # paths: their cwd
    seeds = runner.parse_seeds(parser, args.seeds)
    if (args.steps is not None and args.steps < 1) or args.limit < 1 or args.jobs < 1:
        parser.error("--steps, --limit and --jobs must be positive integers")
    os.chdir(REPO)
    writes = r"(grpo|spiral)-s\d+(\.log)?|eval"  # all that it writes in --runs-dir, and OUT.* if it is there
    if os.path.abspath(os.path.dirname(args.out) or ".") == os.path.abspath(args.runs_dir):
        writes += rf"|{re.escape(os.path.basename(args.out))}\.(md|json|png)"
    why = runner.result_out_problem(args.out, "second_task.py") or runner.runs_dir_problem(args.runs_dir, writes)
    if why:
        print(f"second_task.py: error: {why}", file=sys.stderr)
        return 2
    runs = training_runs(seeds, args.steps, args.runs_dir)
    todo, reused = runner.plan(runs, args.overwrite, "second_task.py")  # refuses a directory holding another run
    steps = runs[0].settings()["steps"]
    os.makedirs(args.runs_dir, exist_ok=True)
    for run in reused:
        print(f"second_task.py: reusing {run.out} (finished, same settings and code)", file=sys.stderr)
    try:
        seconds = runner.train_all(todo, args.runs_dir, args.jobs, {run.name: steps for run, _ in todo},
                                   "second_task.py")
        results = evaluate(seeds, args.runs_dir, args.limit)
    except KeyboardInterrupt:
        print("second_task.py: interrupted; rerun the same command to continue (finished runs are reused)",
              file=sys.stderr)
        return 130
    markdown, cells = table(results, seeds)
    print(markdown)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(f"{args.out}.md", "w") as f:
        f.write(f"<!-- written by benchmarks/second_task.py --seeds {','.join(map(str, seeds))} --steps {steps} "
                f"--limit {args.limit} -->\n{markdown}\n")
    with open(f"{args.out}.json", "w") as f:
        json.dump({"seeds": seeds, "steps": steps, "limit": args.limit, "cells": cells,
                   "train_seconds_this_call": seconds}, f, indent=1)
    if figure(results, seeds, args.runs_dir, f"{args.out}.png"):
        print(f"second_task.py: wrote {args.out}.md, .json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
