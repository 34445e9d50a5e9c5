"""The open GPU figures, most important first, within one device session's budget.

    python benchmarks/on_gpu.py OUT_DIR                    # the plan below on a CUDA GPU, within --budget-s (570 s)
    python benchmarks/on_gpu.py OUT_DIR fastgen train      # some steps, in the order given
    python benchmarks/on_gpu.py OUT_DIR --toy              # the plan at toy size on a CPU (tests run this)

The plan, each step a subprocess under its own time limit, started only while the budget leaves it MIN_STEP_S:
  learner  bench.py --only learner: one aggregation group (17.6k + 4 x 4,096 tokens), the per-sample learner and
           the grouped one (shared_prompt.py), each with flash and cuDNN attention, recomputing or keeping the
           attention outputs: 8 rows of time, peak memory and MFU
  fastgen  decode.py --gpu --skip-checks --shapes search --new-tokens 512: fastgen's decode step at the search shape
  train    bench.py --only aggregation_call,train_py, one process and one model: the aggregation call train.py
           plans on this card (13 prompts x 4 at 17.6k prompt tokens, 4,096 new), then one train.py step (1 problem,
           4,096 new tokens, rewards by seeded coin flips, so the learner trains every trace)
Only when named: hf (rows 2-4 with the Hugging Face engine at 512 new tokens). The byte table needs no GPU:
`python benchmarks/decode.py --bytes` anywhere. Beside each measurement the step model's prediction is printed
(benchmarks/step_model.py, fitted to the H100 session of 2026-11-25).

OUT_DIR gets each step's JSON and log, and after every step gpu.json (device, date, commit, command, the plan, per
step its commands, exit status, seconds and results) and gpu.md (the same as a table). A step that fails or runs out
of time is recorded as such (it is sent Ctrl-C first, so it writes what it measured) and the next one runs. Ctrl-C
reaches the running step the same way; on_gpu.py then keeps what was measured and ends with one line, exit 130.
math-verify must be importable (benchmarks/README.md: carry its wheels to a machine without network).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # checkpoint and cli, imported where needed (torch: seconds)
    sys.path.insert(0, ROOT)
BUDGET_S = 570  # a 15-minute device session: start-up, this command (at most 10 minutes), a margin
MIN_STEP_S = 60  # a step is not started with less time than this left in the budget
GRACE_S = 20  # after Ctrl-C (or the time limit), seconds a step gets to write its results and its own line
PLAN = ("learner", "fastgen", "train")
STEPS = {  # name: (time limit in seconds, what it measures)
    "learner": (170, "the learner 8 ways on one aggregation group"),
    "fastgen": (130, "fastgen's decode step, search shape, 512 new tokens"),
    "train": (420, "train.py's 13 x 4 aggregation call, then one train.py step at 4,096 tokens"),
    "hf": (420, "rows 2-4 with the Hugging Face engine, 512 new tokens"),
}


def step_commands(step: str, out: str, toy: bool) -> list[list[str]]:
    """The commands of one step (run in order; the last one's JSON is the step's result)."""
    py, b, d = sys.executable, "benchmarks/bench.py", "benchmarks/decode.py"
    size = ["--size", "toy", "--device", "cpu"] if toy else []
    json_of = ["--json", os.path.join(out, f"{step}.json")]
    if step == "learner":
        return [[py, b, "--only", "learner", *size, *json_of]]
    if step == "fastgen":
        return [[py, d, "--gpu", "--skip-checks", "--shapes", "search", "--new-tokens", "8" if toy else "512",
                 *size, *json_of]]
    if step == "train":
        return [[py, b, "--only", "aggregation_call,train_py", "--engine", "fast", "--agg-prompts",
                 "2" if toy else "13", *size, *json_of]]
    if step == "hf":
        return [[py, b, "--only", "generate,aggregation,spiral", "--engine", "hf", "--max-new-tokens",
                 "8" if toy else "512", "--agg-prompts", "2" if toy else "4", "--skip-grpo", *size, *json_of]]
    raise ValueError(step)


def _wait_or_kill(proc: subprocess.Popen, seconds: float) -> None:
    """Wait for a step that was sent Ctrl-C to finish writing; kill it after `seconds` (or at a second Ctrl-C)."""
    try:
        proc.wait(timeout=seconds)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        proc.wait()


def _sigint_at_default() -> None:
    """Popen's preexec_fn: a step takes the SIGINT that tells it to stop. Why: on_gpu.py started in the background
    (`nohup ... &`, a device session's script) inherits SIGINT ignored, and exec would pass that on to its steps.
    (benchmarks/runner.py has the same; importing it here would load torch.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(cmd: list[str], log, limit_s: float):
    """Run one command, output to `log`: its exit status, or "timeout". In its own session, so that a terminal's
    Ctrl-C reaches it once, forwarded from here, while this process records what it wrote."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_sigint_at_default)
    try:
        return proc.wait(timeout=max(1.0, limit_s))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        _wait_or_kill(proc, GRACE_S)
        return "timeout"
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        _wait_or_kill(proc, GRACE_S)
        raise


def run_step(step: str, out: str, toy: bool, limit_s: float, record: dict) -> dict:
    """Run a step's commands into OUT/<step>.log, filling `record` as it goes (so an interrupted step is recorded)."""
    t0, log_path = time.perf_counter(), os.path.join(out, f"{step}.log")
    record.update({"commands": [], "rc": "running", "limit_s": round(limit_s)})
    try:
        with open(log_path, "w") as log:
            for cmd in step_commands(step, out, toy):
                record["commands"].append(shlex.join(cmd))
                print(f"on_gpu.py: [{step}] {shlex.join(cmd)}", flush=True)
                record["rc"] = _run(cmd, log, limit_s - (time.perf_counter() - t0))
                if record["rc"] != 0:
                    break
    except KeyboardInterrupt:
        record["rc"] = "interrupted"
        raise
    finally:
        record["seconds"] = round(time.perf_counter() - t0, 1)
        with open(log_path, errors="replace") as f:
            record["result_lines"] = [line.rstrip() for line in f if line.startswith("[")]
        read_result(step, out, record, toy)
    print(f"on_gpu.py: [{step}] exit {record['rc']} in {record['seconds']} s", flush=True)
    return record


def read_result(step: str, out: str, record: dict, toy: bool) -> None:
    """record["result"] = the step's JSON. A file cut off in mid-write is an error of this step (record["error"]),
    not of the whole run. For fastgen's rows, the step model's prediction is added to the result lines."""
    path = os.path.join(out, f"{step}.json")
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            record["result"] = json.load(f)
    except ValueError as e:
        record["error"] = f"{os.path.relpath(path, out)} unreadable: {str(e)[:300]}"
        record["result_lines"].append(f"[{step}] {record['error']}")
        return
    if step == "fastgen" and not toy:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import step_model

        fit = step_model.fit()
        for name, r in (record["result"].get("rows") or {}).items():
            if "warm_call_s" in r:
                model_s = fit.call_s(r["prompts"], r["prompt_tokens"], r["copies"], r["new_tokens"], "search")
                record["result_lines"].append(f"[fastgen {name}] warm call {r['warm_call_s']:.1f} s, step model "
                                              f"(463a395) {model_s:.1f} s, measured/model "
                                              f"{r['warm_call_s'] / model_s:.2f}")


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head.stdout.strip() + ("+uncommitted changes" if dirty else "") if head.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def write_summary(out: str, summary: dict) -> None:
    """gpu.json and gpu.md, rewritten after every step."""
    with open(os.path.join(out, "gpu.json"), "w") as f:
        json.dump(summary, f, indent=1)
    lines = [f"# GPU figures: {summary['device']}, {summary['date']}, commit {summary['commit']}", "",
             f"Command: `{summary['command']}` (budget {summary['budget_s']} s)", "",
             "| step | exit | seconds | results |", "|---|---|---|---|"]
    for step, r in summary["steps"].items():
        results = "<br>".join(x.replace("|", "/") for x in r.get("result_lines", [])) or "(see the step's log)"
        lines.append(f"| {step} | {r['rc']} | {r.get('seconds', '')} | {results} |")
    with open(os.path.join(out, "gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def parse(argv):
    """The arguments, checked before any work: cli.ConfigError (one line, exit 2) on bad input."""
    import checkpoint
    import cli

    p = cli.OneLineParser(prog="on_gpu.py", description=__doc__.split("\n")[0])
    p.add_argument("out", help="a new or empty directory for the results")
    p.add_argument("steps", nargs="*", help=f"steps to run, in order (default: {' '.join(PLAN)}; also: hf)")
    p.add_argument("--toy", action="store_true", help="every step at toy size on a CPU (what the tests run)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"seconds for all steps (default {BUDGET_S})")
    args = p.parse_intermixed_args(argv)  # steps may come after an option: OUT --toy learner
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        raise cli.ConfigError(f"unknown step(s) {', '.join(unknown)}: choose from {', '.join(STEPS)}")
    if not args.budget_s > 0:
        raise cli.ConfigError(f"--budget-s must be positive, got {args.budget_s}")
    if os.path.lexists(args.out) and (not os.path.isdir(args.out) or os.path.islink(args.out)
                                      or os.listdir(args.out)):
        raise cli.ConfigError(f"{args.out} exists and is not an empty directory (results are never overwritten)")
    why = checkpoint.out_path_problem(args.out)
    if why:
        raise cli.ConfigError(f"{args.out!r}: {why}")
    return args


def main(argv=None) -> int:
    summary, out, current = None, None, None
    try:
        import cli
        import torch

        try:
            args = parse(argv)
            if not args.toy and not torch.cuda.is_available():
                raise cli.ConfigError("no CUDA device (--toy runs every step at toy size on a CPU)")
        except cli.ConfigError as exc:
            print(f"on_gpu.py: error: {exc}", file=sys.stderr)
            return 2
        os.makedirs(args.out, exist_ok=True)
        out, start = os.path.abspath(args.out), time.perf_counter()
        plan = args.steps or list(PLAN)
        summary = {"device": torch.cuda.get_device_name() if not args.toy else "cpu (toy)",
                   "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(), "budget_s": args.budget_s,
                   "command": shlex.join([os.path.relpath(sys.argv[0], ROOT)]
                                         + (argv if argv is not None else sys.argv[1:])),
                   "plan": {s: STEPS[s][1] for s in plan}, "steps": {}}
        for step in plan:
            left = args.budget_s - (time.perf_counter() - start)
            if left < min(MIN_STEP_S, STEPS[step][0]):
                summary["steps"][step] = {"rc": "skipped", "result_lines": [f"[{step}] skipped: {left:.0f} s of the "
                                                                           "budget left"]}
                print(f"on_gpu.py: [{step}] skipped: {left:.0f} s of the budget left", flush=True)
                continue
            current = step
            summary["steps"][step] = {}
            run_step(step, out, args.toy, min(STEPS[step][0], left), summary["steps"][step])
            current = None
            write_summary(out, summary)
    except KeyboardInterrupt as exc:
        exc.__traceback__ = None
        if summary is not None:
            write_summary(out, summary)
        where = f" in step {current}" if current else ""
        print(f"on_gpu.py: interrupted{where}; " + (f"what was measured is in {os.path.join(out, 'gpu.json')}"
                                                     if summary is not None else "nothing was measured"),
              file=sys.stderr)
        return 130
    failed = [s for s, r in summary["steps"].items() if r["rc"] != 0 or "error" in r]
    print(f"on_gpu.py: wrote {os.path.join(args.out, 'gpu.json')} and gpu.md"
          + (f"; not done: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
