"""Every GPU figure of benchmarks/README.md from one command (issue 25), in steps of under 10 minutes each.

    python benchmarks/on_gpu.py OUT_DIR                      # all steps, on a CUDA GPU (about 25 minutes)
    python benchmarks/on_gpu.py OUT_DIR decode spiral        # some steps (a device session of 15 minutes)
    python benchmarks/on_gpu.py OUT_DIR --toy                # every step at toy size on a CPU (tests run this)

Each step is a subprocess with a time limit (STEP_LIMIT_S); its JSON and log land in OUT_DIR. At the end OUT_DIR
holds gpu.json (device, date, commit, the command, and per step its command, exit status, seconds and results) and
gpu.md (the same as a table, with the result lines each step printed). A step that fails or runs out of time is
recorded as such and the next one runs. Steps:
  bytes    KV bytes per decode step and prefill memory at the 4B shape (meta device; no GPU needed)
  decode   CUDA checks, the decode-step profile, fastgen's search- and aggregation-shaped rows at 512 and 4,096
           new tokens, the HF engine's row 2 at 512, row 1 (MFU) without and with cuDNN attention in the learner
  spiral   row 4, one SPIRAL step (search, aggregation, training) with the fast engine, 2,048 new tokens
  hf       rows 2-4 with the Hugging Face engine at 512 new tokens (aggregation: 4 prompts)
  train    `python train.py --model <4B random weights> --generation fast` for one step at 4,096 new tokens
math-verify must be importable (benchmarks/README.md: carry its wheels to a machine without network).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # checkpoint and cli, imported where needed (torch: seconds)
    sys.path.insert(0, ROOT)
STEP_LIMIT_S = 590
STEPS = ("bytes", "decode", "spiral", "hf", "train")


def step_commands(step: str, out: str, toy: bool, model_dir: str) -> list[list[str]]:
    """The commands of one step (run in order; the last one's JSON is the step's result)."""
    py, b, d = sys.executable, "benchmarks/bench.py", "benchmarks/decode.py"
    size = ["--size", "toy", "--device", "cpu"] if toy else []
    n_short, n_long = ("8", "24") if toy else ("512", "4096")
    json_of = os.path.join(out, f"{step}.json")
    if step == "bytes":
        return [[py, d, "--bytes", "--json", json_of]]
    if step == "decode":
        return [[py, d, "--gpu", *size, "--profile", "--hf-baseline", n_short, "--mfu", "--new-tokens",
                 f"{n_short},{n_long}", "--json", json_of]]
    if step == "spiral":
        return [[py, b, "--only", "spiral", "--engine", "fast", "--skip-grpo", "--max-new-tokens",
                 "16" if toy else "2048", *size, "--json", json_of]]
    if step == "hf":
        return [[py, b, "--only", "generate,aggregation,spiral", "--engine", "hf", "--max-new-tokens", n_short,
                 "--agg-prompts", "2" if toy else "4", "--skip-grpo", *size, "--json", json_of]]
    if step == "train":
        save = [py, b, "--save-model", model_dir, "--size", "toy" if toy else "4b"]
        save += ["--device", "cpu"] if toy else []
        run = os.path.join(out, "train-run")
        return [save, [py, "train.py", "--model", model_dir, "--generation", "fast", "--data", "math500", "--steps",
                       "1", "--batch-problems", "1", "--max-draws", "1", "--max-new-tokens", n_long, "--out", run,
                       "--no-plot"] + (["--device", "cpu"] if toy else [])]
    raise ValueError(step)


def run_step(step: str, out: str, toy: bool, model_dir: str) -> dict:
    t0, log_path = time.perf_counter(), os.path.join(out, f"{step}.log")
    record = {"commands": [], "rc": 0}
    with open(log_path, "w") as log:
        for cmd in step_commands(step, out, toy, model_dir):
            record["commands"].append(shlex.join(cmd))
            print(f"on_gpu.py: [{step}] {shlex.join(cmd)}", flush=True)
            remaining = STEP_LIMIT_S - (time.perf_counter() - t0)
            try:
                proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=max(1, remaining),
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
                record["rc"] = proc.returncode
            except subprocess.TimeoutExpired:
                record["rc"] = "timeout"
            if record["rc"] != 0:
                break
    record["seconds"] = round(time.perf_counter() - t0, 1)
    with open(log_path) as f:
        record["result_lines"] = [line.rstrip() for line in f if line.startswith("[")]
    read_result(step, out, record)
    print(f"on_gpu.py: [{step}] exit {record['rc']} in {record['seconds']} s", flush=True)
    return record


def read_result(step: str, out: str, record: dict) -> None:
    """record["result"] = the step's JSON (train: the rows of train-run/metrics.jsonl). A file the time limit cut off
    in mid-write is an error of this step (record["error"]), not of the whole run: the next step still runs."""
    import checkpoint

    path = os.path.join(out, "train-run", "metrics.jsonl") if step == "train" else os.path.join(out, f"{step}.json")
    if not os.path.exists(path):
        return
    try:
        if step == "train":
            record["result"] = checkpoint.read_metrics(path)  # drops a torn last line
        else:
            with open(path) as f:
                record["result"] = json.load(f)
    except (ValueError, checkpoint.CheckpointError) as e:
        record["error"] = f"{os.path.relpath(path, out)} unreadable: {str(e)[:300]}"
        record["result_lines"].append(f"[{step}] {record['error']}")
        return
    if step == "train":
        record["result_lines"] += [
            f"[train] step {r['step']}: search {r['time/search_s']:.1f} s, aggregation {r['time/aggregation_s']:.1f}"
            f" s, learner {r['time/train_s']:.1f} s; {r['tokens_generated']:,} tokens generated"
            for r in record["result"]]


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head.stdout.strip() + ("+uncommitted changes" if dirty else "") if head.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def write_markdown(path: str, summary: dict) -> None:
    lines = [f"# GPU figures: {summary['device']}, {summary['date']}, commit {summary['commit']}", "",
             f"Command: `{summary['command']}`", "", "| step | exit | seconds | results |", "|---|---|---|---|"]
    for step, r in summary["steps"].items():
        results = "<br>".join(x.replace("|", "/") for x in r["result_lines"]) or "(see the step's log)"
        lines.append(f"| {step} | {r['rc']} | {r['seconds']} | {results} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    import checkpoint
    import cli
    import torch

    p = cli.OneLineParser(prog="on_gpu.py", description=__doc__.split("\n")[0])
    p.add_argument("out", help="a new or empty directory for the results")
    p.add_argument("steps", nargs="*", help=f"steps to run, in order (default: {' '.join(STEPS)})")
    p.add_argument("--toy", action="store_true", help="every step at toy size on a CPU (what the tests run)")
    try:
        args = p.parse_args(argv)
        unknown = [s for s in args.steps if s not in STEPS]
        if unknown:
            raise cli.ConfigError(f"unknown step(s) {', '.join(unknown)}: choose from {', '.join(STEPS)}")
        if os.path.lexists(args.out) and (not os.path.isdir(args.out) or os.path.islink(args.out)
                                          or os.listdir(args.out)):
            raise cli.ConfigError(f"{args.out} exists and is not an empty directory (results are never overwritten)")
        why = checkpoint.out_path_problem(args.out)
        if why:
            raise cli.ConfigError(f"{args.out!r}: {why}")
        if not args.toy and not torch.cuda.is_available():
            raise cli.ConfigError("no CUDA device (--toy runs every step at toy size on a CPU)")
    except cli.ConfigError as exc:
        print(f"on_gpu.py: error: {exc}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    summary = {"device": torch.cuda.get_device_name() if not args.toy else "cpu (toy)",
               "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(),
               "command": shlex.join([os.path.relpath(sys.argv[0], ROOT)]
                                     + (argv if argv is not None else sys.argv[1:])),
               "steps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for step in args.steps or STEPS:
            summary["steps"][step] = run_step(step, out, args.toy, os.path.join(tmp, "model"))
            with open(os.path.join(out, "gpu.json"), "w") as f:
                json.dump(summary, f, indent=1)
            write_markdown(os.path.join(out, "gpu.md"), summary)
    failed = [s for s, r in summary["steps"].items() if r["rc"] != 0 or "error" in r]
    print(f"on_gpu.py: wrote {os.path.join(args.out, 'gpu.json')} and gpu.md"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
