"""Regenerate the README's CPU-demo figures and tables over several seeds, with the README's own commands.

    python benchmarks/reproduce.py                   # seeds 0-4; writes runs/reproduce/report.md (~25 min, 2 cores)
    python benchmarks/reproduce.py --update-readme   # the same, then rewrites the README's blocks and figures

Training is deterministic on one machine but not across machines (floating-point differences that 100 RL steps
amplify), so every figure that comes from training is reported over seeds as mean ± sample sd [min, max]; the
warm start's evaluation involves no training and is the same on every run. It runs, from the repository root:
    python train.py --preset tiny --seed S --out RUNS/tiny-spiral-sS               for S in --seeds
    python train.py --preset tiny --algo grpo --seed S --out RUNS/tiny-grpo-sS
    python evaluate.py --preset tiny --limit 100 --policy base=data/tiny_warmstart --policy grpo-sS=RUNS/...
        --policy spiral-sS=RUNS/... --out RUNS/eval/comparison.json --cache-dir (a fresh temporary folder)
A run already in RUNS with the same settings, code and all its steps is reused, one stopped part-way is resumed, and
one with other settings or code stops the script before anything runs (--overwrite trains it again; runner.py).

Writes in RUNS (--runs-dir, default runs/reproduce): report.md (the tables and how they were made), seeds.png
(training curves, mean and range over seeds), eval/comparison.json and .png (evaluate.py's figure of the means).
--update-readme also rewrites README.md between its "<!-- reproduce.py: NAME -->" and "<!-- /reproduce.py -->"
markers (demo, comparison, provenance) and benchmarks/tiny_seeds.png, tiny_comparison.png and tiny_metrics.png
(seed 0's dashboard). Nothing else is written; every output is checked before the first run starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import checkpoint  # noqa: E402
import figures  # noqa: E402
import runner  # noqa: E402

ALGOS = {"spiral": ["--preset", "tiny"], "grpo": ["--preset", "tiny", "--algo", "grpo"]}
LABELS = {"base": "warm start", "grpo": "GRPO", "spiral": "SPIRAL"}
# The demo table's rows: (label, metrics.jsonl key, algorithm whose runs have it)
DEMO_ROWS = [("search accuracy", "search_accuracy", "spiral"),
             ("aggregation accuracy", "aggregation_accuracy", "spiral"),
             ("search-trace token entropy (nats)", "rollout/entropy_search", "spiral"),
             ("GRPO accuracy", "accuracy", "grpo"), ("GRPO token entropy (nats)", "rollout/entropy_grpo", "grpo")]
RUNS_DIR_ENTRIES = r"tiny-(spiral|grpo)-s\d+(\.log)?|report\.md|seeds\.png|eval"  # all that it writes in RUNS
README_BLOCKS = ("demo", "comparison", "provenance")
KEPT_FIGURES = {"seeds.png": "benchmarks/tiny_seeds.png", "eval/comparison.png": "benchmarks/tiny_comparison.png",
                "tiny-spiral-s{seed0}/metrics.png": "benchmarks/tiny_metrics.png"}


def first_last(rows: list[dict], key: str) -> tuple[float, float]:
    """Means of `key` over the first and the last 10% of steps (at least one step each), as train.py's table."""
    tenth = max(1, round(len(rows) / 10))
    return tuple(float(np.mean([r[key] for r in part])) for part in (rows[:tenth], rows[-tenth:]))


def demo_table(rows_of: dict[str, list[list[dict]]]) -> str:
    """The README's demo table: each metric's first and last 10% of steps, over seeds (rows_of[algo][seed])."""
    seeds = len(rows_of["spiral"])
    steps = len(rows_of["spiral"][0])
    tenth = max(1, round(steps / 10))
    lines = [f"| {seeds} seeds: mean ± sd [min, max] | first 10% of steps (1-{tenth}) "
             f"| last 10% of steps ({steps - tenth + 1}-{steps}) |", "|---|---|---|"]
    for label, key, algo in DEMO_ROWS:
        pairs = [first_last(rows, key) for rows in rows_of[algo]]
        first, last = (runner.spread([p[i] for p in pairs], 2) for i in (0, 1))
        lines.append(f"| {label} | {first} | {last} |")
    return "\n".join(lines)


def comparison_cells(summary: dict) -> dict[str, float]:
    """{column: value} of one policy's evaluate.py summary: pass@1/4/8, majority@4/8, RSA per population and step."""
    cells = {f"pass@{k}": summary["passk"]["pass_at_k"][summary["passk"]["k"].index(k)] for k in (1, 4, 8)}
    cells.update({f"majority@{k}": summary["majority"]["accuracy"][summary["majority"]["k"].index(k)] for k in (4, 8)})
    for r in summary["rsa"]:
        cells.update({f"RSA P={r['population']}, step {t}": v for t, v in zip(r["step"], r["pass_at_1"])})
    return cells


def comparison_table(result: dict, seeds: list[int]) -> str:
    """The README's side-by-side table, one row per measure: the warm start, then GRPO and SPIRAL over seeds."""
    policies = result["policies"]
    base = comparison_cells(policies["base"]["summary"])
    per_algo = {algo: [comparison_cells(policies[f"{algo}-s{s}"]["summary"]) for s in seeds] for algo in ("grpo",
                                                                                                        "spiral")}
    lines = [f"| {len(seeds)} seeds: mean ± sd [min, max] | warm start | GRPO | SPIRAL |", "|---|---|---|---|"]
    for column in base:
        cells = [runner.spread([c[column] for c in per_algo[algo]], 3) for algo in ("grpo", "spiral")]
        lines.append(f"| {column} | {base[column]:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_summary(summaries: list):
    """Element-wise mean of evaluate.py summaries (numbers that agree, such as k or budgets, stay as they are)."""
    first = summaries[0]
    if isinstance(first, dict):
        return {k: mean_summary([s[k] for s in summaries]) for k in first}
    if isinstance(first, list):
        return [mean_summary(list(items)) for items in zip(*summaries)]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return first if all(s == first for s in summaries) else float(np.mean(summaries))
    return first


def span(values: list[float]) -> str:
    """ "2.1-2.4", or "0.7" when the values round alike: the provenance line's range of minutes."""
    low, high = f"{min(values):.1f}", f"{max(values):.1f}"
    return low if low == high else f"{low}-{high}"


def replace_block(text: str, name: str, content: str) -> str:
    """text with the lines between "<!-- reproduce.py: name -->" and the next "<!-- /reproduce.py -->" replaced."""
    pattern = re.compile(rf"(<!-- reproduce\.py: {name} -->\n).*?(<!-- /reproduce\.py -->)", re.S)
    if not pattern.search(text):
        runner.fail("reproduce.py", f"README.md has no <!-- reproduce.py: {name} --> block")
    return pattern.sub(lambda m: m.group(1) + content.rstrip("\n") + "\n" + m.group(2), text, count=1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = runner.Parser(prog="reproduce.py", description=__doc__.split("\n\n")[0],
                           epilog="\n".join(__doc__.split("\n\n")[1:]),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds (default 0,1,2,3,4)")
    parser.add_argument("--runs-dir", help="where the runs, evaluation and report go (default runs/reproduce in the "
                        "checkout)")
    parser.add_argument("--jobs", type=int, default=1, help="training runs at a time (default 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="train again the runs in --runs-dir that cannot be reused or resumed (other settings "
                             "or code); finished runs are reused, stopped ones resumed, with or without it")
    parser.add_argument("--update-readme", action="store_true",
                        help="also rewrite README.md's demo, comparison and provenance blocks and the three figures "
                             "in benchmarks/")
    args = parser.parse_args(argv)
    args.seeds = runner.parse_seeds(parser, args.seeds)
    args.runs_dir = "runs/reproduce" if args.runs_dir is None else runner.user_path(args.runs_dir)  # main() chdirs
    if args.jobs < 1:
        parser.error(f"--jobs must be a positive integer, got {args.jobs}")
    return args


def check_outputs(args) -> None:
    """Every place this run will write, before anything runs: exit 2 with one line if one is unusable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        runner.fail("reproduce.py", "needs matplotlib for the figures (pip install -r requirements.txt -c "
                    "constraints.txt matplotlib)")
    why = runner.runs_dir_problem(args.runs_dir, RUNS_DIR_ENTRIES)
    if why:
        runner.fail("reproduce.py", why)
    if args.update_readme:
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        for name in README_BLOCKS:
            replace_block(readme, name, "")  # exits naming a missing block
        for path in ["README.md", *KEPT_FIGURES.values()]:
            full = os.path.join(ROOT, path)
            if not os.access(full if os.path.exists(full) else os.path.dirname(full), os.W_OK):
                runner.fail("reproduce.py", f"cannot write {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)
    check_outputs(args)
    runs = {(algo, s): runner.Run(f"tiny-{algo}-s{s}", os.path.join(args.runs_dir, f"tiny-{algo}-s{s}"),
                                  [*flags, "--seed", str(s)]) for s in args.seeds for algo, flags in ALGOS.items()}
    todo, reused = runner.plan(list(runs.values()), args.overwrite, "reproduce.py")  # refuses before any work
    os.makedirs(args.runs_dir, exist_ok=True)
    for run in reused:
        print(f"reproduce.py: reusing {run.out} (finished, same settings and code)", file=sys.stderr)
    try:
        runner.train_all(todo, args.runs_dir, args.jobs, {run.name: run.settings()["steps"] for run, _ in todo},
                         "reproduce.py")
        out = os.path.join(args.runs_dir, "eval", "comparison.json")
        flags = ["--preset", "tiny", "--limit", "100", "--policy", "base=data/tiny_warmstart", "--out", out]
        flags += [f"--policy={algo}-s{s}={run.out}/adapter" for (algo, s), run in sorted(runs.items(),
                                                                                         key=lambda x: x[0][::-1])]
        evaluation_s = runner.evaluate_cold(flags, "reproduce.py")
    except KeyboardInterrupt:
        print("reproduce.py: interrupted; rerun the same command to continue (finished runs are reused)",
              file=sys.stderr)
        return 130

    rows_of = {algo: [checkpoint.read_metrics(os.path.join(runs[algo, s].out, "metrics.jsonl")) for s in args.seeds]
               for algo in ALGOS}
    with open(out) as f:
        result = json.load(f)
    tables = {"demo": demo_table(rows_of), "comparison": comparison_table(result, args.seeds)}
    figures.plot_seed_curves({f"{LABELS[algo]}": rows_of[algo] for algo in ALGOS},
                             os.path.join(args.runs_dir, "seeds.png"),
                             title=f"python benchmarks/reproduce.py: {len(args.seeds)} seeds, mean and range")
    summaries = {"warm start": result["policies"]["base"]["summary"]}
    summaries.update({f"{LABELS[algo]} (mean of {len(args.seeds)} seeds)": mean_summary(
        [result["policies"][f"{algo}-s{s}"]["summary"] for s in args.seeds]) for algo in ("grpo", "spiral")})
    figures.plot_evaluation(summaries, Path(out).with_suffix(".png"),
                            title=f"tiny sums, 100 problems; trained policies: mean over seeds {args.seeds}")
    v = checkpoint.versions("cpu")
    minutes = {algo: [runner.seconds_of(runs[algo, s]) / 60 for s in args.seeds] for algo in ALGOS}
    tables["provenance"] = textwrap.fill(
        f"Measured by `python benchmarks/reproduce.py` (seeds {', '.join(map(str, args.seeds))}) on "
        f"{time.strftime('%Y-%m-%d')} ({v['device']}; Python {v['python']}, torch {v['torch']}, transformers "
        f"{v['transformers']}, numpy {v['numpy']}, math-verify {v['math-verify']}). 100 steps took "
        f"{span(minutes['spiral'])} min per SPIRAL run and {span(minutes['grpo'])} min per GRPO run (the runs' own "
        f"step times, loading excluded), the evaluation of {len(result['policies'])} policies "
        f"{evaluation_s / 60:.1f} min from an empty cache (load average at the end {os.getloadavg()[1]:.1f} on "
        f"{os.cpu_count()} cores: a busy machine is slower).", 116, break_on_hyphens=False)
    report = os.path.join(args.runs_dir, "report.md")
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n\n".join(f"## {name}\n\n{content}" for name, content in tables.items()) + "\n")
    for name, content in tables.items():
        print(f"\n{name}:\n{content}")
    written = [report, os.path.join(args.runs_dir, "seeds.png"), str(Path(out).with_suffix(".png"))]
    if args.update_readme:
        with open("README.md", encoding="utf-8") as f:
            readme = f.read()
        for name in README_BLOCKS:
            readme = replace_block(readme, name, tables[name])
        with open("README.md", "w", encoding="utf-8") as f:
            f.write(readme)
        for made, kept in KEPT_FIGURES.items():
            shutil.copyfile(os.path.join(args.runs_dir, made.format(seed0=args.seeds[0])), kept)
        written += ["README.md", *KEPT_FIGURES.values()]
    print(f"\nreproduce.py: wrote {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
