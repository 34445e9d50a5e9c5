"""What does set RL add? SPIRAL against the arms that bound line 13, over seeds, on held-out problems.

Seven arms, each `python train.py --preset TASK --seed S --lr LR --max-draws 64 ...` (runs reused, resumed or
refused as benchmarks/runner.py says):

    spiral    --algo spiral                                   SPIRAL: search traces on the marginal set advantage
    oracle    --aggregator oracle                             line 13 alone: f(G) = max over G, K = 4 sampled sets
    passn     --aggregator oracle --num-sets all              line 13's limit: every set, PKPO's exact pass@n
    own       --search-advantage own                          the ablation: search traces on their own reward
    none      --search-advantage none                         the floor: search traces learn only through the
                                                              weights they share with the trained aggregator
    grpo      --algo grpo                                     GRPO at equal MAXIMUM budget ((8 + 4 x 4) L = 12 x 2L)
    grpo_tok  --algo grpo --group-size G --max-new-tokens L   GRPO at equal GENERATED tokens (TASKS: G, measured)

Dynamic sampling as the paper runs it: each step draws problems until |B| = 8 carry signal, up to a safety cap of
--max-draws 64 (8 |B|), which metrics.jsonl logs as draw_cap_hit when it ends a step early.

Learning rate: one small grid, LR_GRID, for GRID_ARMS on seed 0, scored on a validation split disjoint from the
evaluation split (TASKS: the held-out file's second half; the evaluation reads its first --limit problems); the
score is the mean of pass@1, 2, 4 and 8. The rule, fixed before any run: if every grid arm's best rate is DEFAULT_LR
or scores within GRID_TOLERANCE of its best, all arms share DEFAULT_LR; otherwise every arm gets its own grid.

Then one evaluation of the warm start and every run on the held-out problems (evaluate.py, empty cache): pass@k and
majority@k for k = 1..16, RSA as the paper runs it (P = 8, sets of 4, 3 steps) with the set-level measures,
cross-aggregation for CROSS_ARMS, the aggregator's candidate dependence (--probe-aggregators), and pass@1 greedy
(T = 0.001) and at T = 0.5. benchmarks/set_rl_report.py turns it into the tables (mean ± sd [min, max] over seeds,
each comparison with Welch's and the paired t-test and the smallest difference the seeds detect), OUT.json and
OUT.png:

    python benchmarks/set_rl.py --jobs 2                           # tiny_parts6: grid, 7 arms x 5 seeds, tables
    python benchmarks/set_rl.py --task tiny_walk --check --seeds 0 # a new task's one-seed checks (own, SPIRAL)
    python benchmarks/set_rl.py --seeds 0,1 --steps 2 --limit 10 --runs-dir runs/set_rl_try   # a quick try
    python benchmarks/set_rl.py --arms spiral,none --lr 2e-3 --seeds 0,1,2 --jobs 2   # benchmarks/set_rl_floor.md
    python benchmarks/set_rl.py --arms spiral,none,oracle,passn --lr 2e-3 --seeds 0,1,2,3,4 --jobs 2
                                                        # line 13 between its floor and ceiling: set_rl_bounds.md

--arms runs a subset of the arms (the report compares the pairs present); --lr gives every arm one rate and skips the
grid (the report says so: a rate given, not chosen on the validation split). --report-only (with --lr) writes the
tables again from the finished runs and the evaluations in --runs-dir, training and evaluating nothing.

Outputs: OUT.{md,json,png} (default runs/set_rl/<task>/set_rl); runs, logs and evaluations under --runs-dir
(default runs/set_rl/<task>). Every output is checked before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import runner  # noqa: E402
from set_rl_design import (ARMS, CHECK_ARMS, CROSS_ARMS, DEFAULT_LR, GRID_ARMS, GRID_KS, GRID_SEED,  # noqa: E402,F401
                           GRID_TOLERANCE, LR_GRID, MAX_DRAWS, RSA_K, RSA_P, RSA_STEPS, SAMPLES, TASKS, Task)


def parse_arms(parser, text: str) -> list[str]:
    """--arms: known, distinct arms in ARMS' order; parser.error (one line, exit 2) otherwise."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if not names or unknown or len(set(names)) != len(names):
        parser.error(f"--arms {text!r}: expected distinct names from {', '.join(ARMS)}"
                     + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return [a for a in ARMS if a in names]


def arm_flags(arm: str, task: Task) -> list[str]:
    """train.py's flags of an arm on a task (without --seed, --lr, --out)."""
    extra = ["--group-size", str(task.group_equal_tokens), "--max-new-tokens", str(task.max_new_tokens)] \
        if arm == "grpo_tok" else []
    return ["--preset", task.preset, *ARMS[arm][1], *extra, "--max-draws", str(MAX_DRAWS), "--no-plot"]


def run_name(arm: str, lr: float, seed: int) -> str:
    """e.g. spiral-lr2e-03-s0: also evaluate.py's label for the run (letters, digits, _ and -)."""
    return f"{arm}-lr{lr:.0e}-s{seed}"


def make_run(arm: str, lr: float, seed: int, task: Task, steps: int | None, runs_dir: str) -> runner.Run:
    name = run_name(arm, lr, seed)
    return runner.Run(name, os.path.join(runs_dir, name),
                      [*arm_flags(arm, task), "--seed", str(seed), "--lr", f"{lr:g}",
                       "--steps", str(steps or task.steps)])


def grid_runs(task: Task, steps: int | None, runs_dir: str, arms=GRID_ARMS) -> list[runner.Run]:
    return [make_run(arm, lr, GRID_SEED, task, steps, runs_dir) for arm in arms for lr in LR_GRID]


def validation_file(task: Task, runs_dir: str, limit: int) -> str:
    """The held-out file's problems after the first max(limit, half): the validation split, written into runs_dir
    (disjoint from the evaluation's first `limit` problems)."""
    with open(os.path.join(REPO, task.heldout_file), encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    path = os.path.join(runs_dir, "validation.jsonl")
    with open(os.path.join(REPO, path), "w", encoding="utf-8") as f:
        f.writelines(lines[max(limit, len(lines) // 2):])
    return path


def grid_score(summary: dict) -> float:
    """The validation score: the mean of pass@k over GRID_KS (single traces and sets alike)."""
    passk = summary["passk"]
    return float(np.mean([passk["pass_at_k"][passk["k"].index(k)] for k in GRID_KS]))


def choose_rates(scores: dict[str, dict[float, float]]) -> tuple[dict[str, float] | None, str]:
    """The rule of the module docstring: ({arm: rate} for every arm, or None if each arm needs its own grid, why)."""
    best = {arm: max(by_lr, key=by_lr.get) for arm, by_lr in scores.items()}
    near = {arm: scores[arm][best[arm]] - scores[arm].get(DEFAULT_LR, -1.0) <= GRID_TOLERANCE for arm in scores}
    if all(near.values()):
        return {arm: DEFAULT_LR for arm in ARMS}, (f"every grid arm scores within {GRID_TOLERANCE} of its best at "
                                                   f"{DEFAULT_LR:g}: all arms share it")
    far = ", ".join(f"{a} (best {best[a]:g})" for a, ok in near.items() if not ok)
    return None, f"{far} score(s) more than {GRID_TOLERANCE} better away from {DEFAULT_LR:g}: a grid per arm"


def evaluate_grid(task: Task, runs: list[runner.Run], runs_dir: str, limit: int) -> dict[str, dict[float, float]]:
    """pass@k of each grid run on the validation split; {arm: {lr: score}}."""
    out = os.path.join(runs_dir, "eval", "grid.json")
    args = ["--preset", task.preset, "--data", validation_file(task, runs_dir, limit), "--method", "passk",
            "--num-samples", str(max(GRID_KS)), "--k-list", ",".join(map(str, GRID_KS)), "--out", out]
    args += [f"--policy={run.name}={os.path.join(run.out, 'adapter')}" for run in runs]
    runner.evaluate_cold(args, "set_rl.py")
    with open(os.path.join(REPO, out)) as f:
        policies = json.load(f)["policies"]
    scores: dict[str, dict[float, float]] = {}
    for run in runs:
        arm, lr = run.name.split("-lr")[0], float(run.name.split("-lr")[1].rsplit("-s", 1)[0])
        scores.setdefault(arm, {})[lr] = grid_score(policies[run.name]["summary"])
    return scores


def evaluation_calls(task: Task, runs: dict[str, list[runner.Run]], runs_dir: str, limit: int,
                     cross: bool) -> dict[str, list[str]]:
    """evaluate.py's arguments for each evaluation of the held-out problems: {name: args}."""
    base = ["--preset", task.preset, "--limit", str(limit), "--policy", f"base={_warm_start(task)}"]
    policies = [f"--policy={run.name}={os.path.join(run.out, 'adapter')}" for arm in runs for run in runs[arm]]
    main = [*base, *policies, "--method", "all", "--num-samples", str(SAMPLES),
            "--k-list", ",".join(str(k) for k in range(1, SAMPLES + 1)), "--majority-subsets", "32",
            "--rsa-populations", str(RSA_P), "--rsa-set-size", str(RSA_K), "--rsa-steps", str(RSA_STEPS),
            "--probe-aggregators", "--out", os.path.join(runs_dir, "eval", "heldout.json")]
    arms = [a for a in CROSS_ARMS if a == "base" or a in runs]
    if cross and len(arms) > 1:  # --arms oracle,passn: no trained arm of CROSS_ARMS, nothing to cross
        for i in range(len(runs[arms[1]])):
            names = {a: "base" if a == "base" else runs[a][i].name for a in arms}
            main += [f"--cross={names[a]}={names[b]}" for a in arms for b in arms if a != b]
    sampled = {name: [*base, *policies, "--method", "passk", "--num-samples", str(n), "--k-list", "1",
                      "--temperature", temperature, "--out", os.path.join(runs_dir, "eval", f"{name}.json")]
               for name, temperature, n in (("greedy", "0.001", 1), ("t0.5", "0.5", 8))}
    return {"heldout": main, **sampled}


def _warm_start(task: Task) -> str:
    import evaluate

    return os.path.relpath(evaluate.PRESETS[task.preset]["model"], REPO)


EVALUATIONS = ("heldout", "greedy", "t0.5")  # RUNS_DIR/eval/NAME.json: evaluation_calls' three outputs


def load_evaluations(runs_dir: str) -> dict[str, dict]:
    evaluations = {}
    for name in EVALUATIONS:
        with open(os.path.join(REPO, runs_dir, "eval", f"{name}.json")) as f:
            evaluations[name] = json.load(f)
    return evaluations


def main(argv=None) -> int:
    parser = runner.Parser(prog="set_rl.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--task", choices=list(TASKS), default="tiny_parts6")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds (default 0,1,2,3,4)")
    parser.add_argument("--steps", type=int, help="training steps per run (default: the task's)")
    parser.add_argument("--limit", type=int, default=100, help="held-out evaluation problems (default 100)")
    parser.add_argument("--runs-dir", help="default runs/set_rl/TASK")
    parser.add_argument("--jobs", type=int, default=1, help="training runs at a time (default 1)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default all: {','.join(ARMS)})")
    parser.add_argument("--lr", type=float, help="one learning rate for every arm, no grid (default: the grid's rule)")
    parser.add_argument("--no-cross", action="store_true", help="skip the cross-aggregation pairs")
    parser.add_argument("--stop-after", choices=("grid", "train"),
                        help="stop after the learning-rate grid, or after training every run (no evaluation)")
    parser.add_argument("--trained-by", default="", metavar="DIGEST,...",
                        help="also reuse finished runs trained by this code (checkpoint.code_digest of an earlier "
                             "commit whose training code is the same); the report names the digests")
    parser.add_argument("--overwrite", action="store_true",
                        help="train again the runs in --runs-dir that hold other settings")
    parser.add_argument("--out", help="prefix of the .md, .json and .png (default RUNS_DIR/set_rl)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the tables again from the finished runs and the evaluations already in --runs-dir "
                             "(no training, no evaluation; with --lr): after a change of set_rl_report.py")
    parser.add_argument("--check", action="store_true",
                        help=f"only the task's one-seed checks: {' and '.join(CHECK_ARMS)} at {DEFAULT_LR:g} for "
                             "--seeds (give one), one held-out evaluation, the criteria (no grid, no cross pairs)")
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    seeds = runner.parse_seeds(parser, args.seeds) if not args.check or "," in args.seeds else \
        runner.parse_seeds(parser, f"{args.seeds},{args.seeds}1")[:1]  # --check runs one seed; checked as any
    if (args.steps is not None and args.steps < 1) or args.limit < 1 or args.jobs < 1:
        parser.error("--steps, --limit and --jobs must be positive")
    arms = parse_arms(parser, args.arms)
    if args.lr is not None and not 0 < args.lr < 1:
        parser.error(f"--lr {args.lr:g}: expected a rate in (0, 1)")
    if args.lr is not None and args.stop_after == "grid":
        parser.error("--stop-after grid with --lr: there is no grid to stop after")
    if args.report_only and (args.lr is None or args.check or args.stop_after):
        parser.error("--report-only needs --lr (the grid's choice is not kept) and neither --check nor --stop-after")
    runs_dir = runner.user_path(args.runs_dir) or os.path.join("runs", "set_rl", args.task)  # defaults: the checkout's
    out = runner.user_path(args.out) or os.path.join(runs_dir, "set_rl")
    os.chdir(REPO)
    writes = rf"({'|'.join(ARMS)})-lr\de-\d\d-s\d+(\.log)?|eval|validation\.jsonl"
    if os.path.abspath(os.path.dirname(out) or ".") == os.path.abspath(runs_dir):
        writes += rf"|{re.escape(os.path.basename(out))}\.(md|json|png)"
    why = runner.result_out_problem(out, "set_rl.py") or runner.runs_dir_problem(runs_dir, writes)
    if why:
        runner.fail("set_rl.py", why)
    os.makedirs(os.path.join(runs_dir, "eval"), exist_ok=True)
    if args.check:
        return check(task, seeds, args, runs_dir)
    try:
        if args.lr is not None:  # one stated rate: no grid
            scores, rates = {}, {arm: args.lr for arm in ARMS}
            why_rates = f"no grid: every arm at --lr {args.lr:g}, a rate given, not chosen on the validation split"
        else:
            grid = grid_runs(task, args.steps, runs_dir)
            _train(grid, args, runs_dir)
            scores = evaluate_grid(task, grid, runs_dir, args.limit)
            rates, why_rates = choose_rates(scores)
            print(f"set_rl.py: learning-rate grid on the validation split: {json.dumps(scores)}; {why_rates}",
                  file=sys.stderr)
            if rates is None:  # a grid for every arm, the rule of the docstring
                rest = grid_runs(task, args.steps, runs_dir, [a for a in arms if a not in GRID_ARMS])
                _train(rest, args, runs_dir)
                scores |= evaluate_grid(task, rest, runs_dir, args.limit)
                rates = {arm: max(by_lr, key=by_lr.get) for arm, by_lr in scores.items()}
        if args.stop_after == "grid":
            return 0
        runs = {arm: [make_run(arm, rates[arm], s, task, args.steps, runs_dir) for s in seeds] for arm in arms}
        if args.report_only:
            report_only_problem(runs, args, runs_dir)
            return _report(args, task, seeds, arms, out, runs, scores, rates, why_rates, runs_dir)
        _train([run for arm in arms for run in runs[arm]], args, runs_dir)
        if args.stop_after == "train":
            return 0
        for call in evaluation_calls(task, runs, runs_dir, args.limit, not args.no_cross).values():
            runner.evaluate_cold(call, "set_rl.py")
    except KeyboardInterrupt:
        print("set_rl.py: interrupted; rerun the same command to continue (finished runs are reused)",
              file=sys.stderr)
        return 130
    return _report(args, task, seeds, arms, out, runs, scores, rates, why_rates, runs_dir)


def report_only_problem(runs: dict[str, list[runner.Run]], args, runs_dir: str) -> None:
    """--report-only: exits 2 with one line unless every run is finished (same settings and code) and the three
    evaluations in RUNS_DIR/eval hold every one of them."""
    todo, _ = runner.plan([run for arm in runs for run in runs[arm]], False, "set_rl.py", _accepted_code(args))
    if todo:
        runner.fail("set_rl.py", f"--report-only: {todo[0][0].out} is not finished; run the command without "
                                 "--report-only first")
    for name in EVALUATIONS:
        path = os.path.join(runs_dir, "eval", f"{name}.json")
        try:
            with open(path) as f:
                policies = json.load(f)["policies"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            runner.fail("set_rl.py", f"--report-only: {path} cannot be read ({e}); run without --report-only first")
        missing = [run.name for arm in runs for run in runs[arm] if run.name not in policies]
        if missing:
            runner.fail("set_rl.py", f"--report-only: {path} does not evaluate {missing[0]}; run without "
                                     "--report-only first")


def _report(args, task, seeds, arms, out, runs, scores, rates, why_rates, runs_dir) -> int:
    import set_rl_report

    steps = args.steps or task.steps
    header = (f"<!-- written by benchmarks/set_rl.py --task {args.task} --seeds {','.join(map(str, seeds))} --steps "
              f"{steps} --limit {args.limit}{' --no-cross' if args.no_cross else ''}"
              f"{'' if arms == list(ARMS) else ' --arms ' + ','.join(arms)}"
              f"{'' if args.lr is None else f' --lr {args.lr:g}'} -->")
    set_rl_report.write(out, header, task, runs, scores, rates, why_rates, load_evaluations(runs_dir), seeds)
    return 0


def check(task: Task, seeds: list[int], args, runs_dir: str) -> int:
    """--check: train CHECK_ARMS at DEFAULT_LR, evaluate them and the warm start on the held-out problems (pass@k,
    RSA, the aggregator probe) and print set_rl_report.one_seed_criteria."""
    import set_rl_report

    runs = {arm: [make_run(arm, DEFAULT_LR, s, task, args.steps, runs_dir) for s in seeds] for arm in CHECK_ARMS}
    _train([run for arm in CHECK_ARMS for run in runs[arm]], args, runs_dir)
    call = evaluation_calls(task, runs, runs_dir, args.limit, cross=False)["heldout"]
    runner.evaluate_cold(call, "set_rl.py")
    with open(os.path.join(REPO, runs_dir, "eval", "heldout.json")) as f:
        evaluations = {"heldout": json.load(f)}
    print(set_rl_report.one_seed_criteria(runs, evaluations, len(seeds))[0])
    return 0


def _accepted_code(args) -> tuple[str, ...]:
    """--trained-by's digests: runs trained by them count as this checkout's code (runner.run_state)."""
    return tuple(d for d in args.trained_by.split(",") if d)


def _train(runs: list[runner.Run], args, runs_dir: str) -> None:
    todo, reused = runner.plan(runs, args.overwrite, "set_rl.py", _accepted_code(args))  # refuses a directory holding another run
    for run in reused:
        print(f"set_rl.py: reusing {run.out} (finished, same settings and code)", file=sys.stderr)
    runner.train_all(todo, runs_dir, args.jobs, {run.name: run.settings()["steps"] for run, _ in todo}, "set_rl.py")


if __name__ == "__main__":
    sys.exit(main())
