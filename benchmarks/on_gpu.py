"""The open GPU figures, most important first, within one device session with room for one rerun.

    python benchmarks/on_gpu.py OUT_DIR                    # pre-flight, then the plan below on a CUDA GPU (420 s)
    python benchmarks/on_gpu.py OUT_DIR train fastgen      # some steps, in the order given (a rerun of what failed)
    python benchmarks/on_gpu.py OUT_DIR --toy              # the plan at toy size on a CPU (tests run this)

Pre-flight, before any step and in seconds: CUDA present, and the grouped learner applies on this GPU (a Qwen3 with
the 4B layer shapes, 2 layers, LoRA r = 32, checkpointing: shared_prompt's probe, then one grouped training step
with cuDNN attention). Either failing stops on_gpu.py with one line, exit 2, nothing measured or written. No step
needs math-verify (absent from the GPU machine unless its wheels are carried): the train step's rewards are coin
flips given to train.py as its own --reward.

The plan, each step a subprocess under its own time limit, started only while the budget leaves it MIN_STEP_S:
  learner  bench.py --only learner: one aggregation group (17.6k + 4 x 4,096 tokens), the per-sample learner and
           the grouped one (shared_prompt.py), each with flash and cuDNN attention, recomputing or keeping the
           attention outputs: 8 rows of time, peak memory (and the grouped learner's planned peak) and MFU
  train    bench.py --only train_py --max-new-tokens 2048: one train.py step (1 problem, 2,048 new tokens,
           coin-flip rewards, --generation fast, the grouped learner with cuDNN): search, aggregation, learner
  fastgen  decode.py --gpu --skip-checks --shapes search --new-tokens 512: fastgen's decode step at the search shape
Only when named: aggregation (train.py's 13 x 4 aggregation call at 17.6k prompt tokens, 4,096 new) and hf (rows
2-4 with the Hugging Face engine at 512 new tokens). The byte table needs no GPU: `python benchmarks/decode.py
--bytes` anywhere. Beside each measurement the step model's prediction is printed (benchmarks/step_model.py, fitted
to the H100 session of 2026-11-25; the hf rows have none: it models fastgen).

Budget (benchmarks/README.md): a 15-minute device session holds a machine's start (~2 minutes), this command
(pre-flight + 420 s) and one rerun of the longest step (180 s) with a margin. OUT_DIR gets each step's JSON and log,
and after every step gpu.json (device, date, commit, command, the plan, per step its commands, exit status, seconds,
results and errors) and gpu.md (the same as a table). A step that fails, records an error in its JSON or runs out
of time is recorded as such (it is sent Ctrl-C first, so it writes what it measured) and the next one runs; at the
end on_gpu.py exits 1 naming every step not done and why. Ctrl-C reaches the running step the same way; on_gpu.py
then keeps what was measured and ends with one line, exit 130.
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
BUDGET_S = 420  # 15 device minutes: ~2 to start, this command (pre-flight + budget), one rerun of a step, a margin
MIN_STEP_S = 60  # a step is not started with less time than this left in the budget
GRACE_S = 20  # after Ctrl-C (or the time limit), seconds a step gets to write its results and its own line
PLAN = ("learner", "train", "fastgen")
STEPS = {  # name: (time limit in seconds, what it measures)
    "learner": (150, "the learner 8 ways on one aggregation group"),
    "train": (180, "one train.py step, 1 problem, 2,048 new tokens"),
    "fastgen": (90, "fastgen's decode step, search shape, 512 new tokens"),
    "aggregation": (240, "train.py's 13 x 4 aggregation call, 4,096 new tokens"),
    "hf": (420, "rows 2-4 with the Hugging Face engine, 512 new tokens"),
}
GROUPED = ("learner", "train")  # the steps that measure the grouped learner: pre-flight checks that it applies


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
        return [[py, b, "--only", "train_py", "--engine", "fast", "--max-new-tokens", "8" if toy else "2048", *size,
                 *json_of]]
    if step == "aggregation":
        return [[py, b, "--only", "aggregation_call", "--engine", "fast", "--agg-prompts", "2" if toy else "13",
                 *size, *json_of]]
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
    errors = recorded_errors(record["result"])
    if errors:  # a row that failed inside a step that exited 0 is still a failure of the step
        record["error"] = "; ".join(errors)
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


def recorded_errors(result, where: str = "") -> list[str]:
    """"WHERE: error" for every "error" a step's JSON records, at any depth (a bench.py row, a learner variant)."""
    if not isinstance(result, dict):
        return []
    found = [f"{where or 'result'}: {result['error']}"] if "error" in result else []
    for key, value in result.items():
        found += recorded_errors(value, f"{where} {key}".strip()) if key != "error" else []
    return found


def preflight(plan: list[str], toy: bool) -> str | None:
    """None if the plan can run here, else one line why not: no CUDA; or, for a plan that measures the grouped
    learner, that learner not applying on this device (shared_prompt.unsupported on a Qwen3 of the 4B layer shapes,
    2 layers, LoRA r = 32, checkpointing; then one grouped training step with cuDNN attention, which must train)."""
    import torch

    if not toy and not torch.cuda.is_available():
        return "no CUDA device (--toy runs every step at toy size on a CPU)"
    if not any(step in GROUPED for step in plan):
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from transformers import AutoModelForCausalLM, Qwen3Config

    import bench_kit
    import lora
    import shared_prompt
    import spiral
    import train

    device, dtype = ("cpu", torch.float32) if toy else ("cuda", torch.bfloat16)
    shape = dict(bench_kit.MODEL_CONFIGS["toy" if toy else "4b"], num_hidden_layers=2)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(Qwen3Config(**shape), dtype=dtype, attn_implementation="sdpa")
        lora.add_lora(model, rank=32, alpha=32.0)
        train.enable_gradient_checkpointing(model)
        why = shared_prompt.unsupported(model)
        if why:
            return f"the grouped learner does not apply on this device ({why})"
        model.train()
        if shared_prompt.checkpointing_mode(model) != (True, False):  # else the memory plan counts every layer's
            return "the learner's memory plan does not see the model's activation checkpointing on this version"
        prompt = list(range(10, 74))
        group = [spiral.Sample(prompt, list(range(100 + i, 116 + i)), [-10.0] * 16, (-1.0) ** i, "aggregation")
                 for i in range(2)]
        metrics = train.accumulate_gradients(model, group, loss_normalizer=32.0, learner="grouped",
                                             learner_attention="cudnn")
        if "train/learner_fallback" in metrics:
            return f"the grouped learner does not apply on this device ({metrics['train/learner_fallback']})"
        grads = [p.grad for p in lora.lora_parameters(model) if p.grad is not None]
        if not grads or not all(bool(torch.isfinite(g).all()) for g in grads):
            return "the grouped learner's training step gave no finite LoRA gradient on this device"
    except Exception as e:  # noqa: BLE001 - a kernel or an allocation that fails here would fail every step
        return f"the grouped learner's training step failed on this device: {type(e).__name__}: {str(e)[:200]}"
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    return None


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
             f"Command: `{summary['command']}` (budget {summary['budget_s']} s; pre-flight passed in "
             f"{summary['preflight_s']} s)", "",
             "| step | exit | seconds | results |", "|---|---|---|---|"]
    for step, r in summary["steps"].items():
        shown = r.get("result_lines", []) + ([f"error: {r['error']}"] if "error" in r else [])
        results = "<br>".join(x.replace("|", "/") for x in shown) or "(see the step's log)"
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
    summary, out, current, t0 = None, None, None, time.perf_counter()
    try:
        import cli
        import torch

        try:
            args = parse(argv)
            plan = args.steps or list(PLAN)
            why = preflight(plan, args.toy)
            if why:
                raise cli.ConfigError(why if why.startswith("no CUDA") else f"pre-flight: {why}")
        except cli.ConfigError as exc:
            print(f"on_gpu.py: error: {exc}", file=sys.stderr)
            return 2
        preflight_s = time.perf_counter() - t0
        os.makedirs(args.out, exist_ok=True)
        out, start = os.path.abspath(args.out), time.perf_counter()
        summary = {"device": torch.cuda.get_device_name() if not args.toy else "cpu (toy)",
                   "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(), "budget_s": args.budget_s,
                   "preflight_s": round(preflight_s, 1),
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
    write_summary(out, summary)  # a step skipped last is in it too
    failed = {s: r for s, r in summary["steps"].items() if r["rc"] != 0 or "error" in r}
    print(f"on_gpu.py: wrote {os.path.join(args.out, 'gpu.json')} and gpu.md", flush=True)
    if failed:
        why = "; ".join(f"{s} ({'exit ' if isinstance(r['rc'], int) else ''}{r['rc']}"
                        + (f": {r['error'][:200]}" if "error" in r else "") + ")" for s, r in failed.items())
        print(f"on_gpu.py: error: not done: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
