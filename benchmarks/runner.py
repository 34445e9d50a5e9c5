"""Training runs for the benchmark scripts (reproduce.py, second_task.py): which runs to reuse, resume or refuse,
and train.py jobs in parallel with their logs and one progress display; and the mean ± sd cell of their tables.

A run directory is reused only when its config.json holds exactly the settings the script asks for, it was trained
by this checkout's code (checkpoint.code_digest: a run trained by earlier code would put that code's figures in the
tables) and its metrics reach the last step with the adapter saved; a run with the same settings and code stopped
part-way is resumed (from its last checkpoint, or from step 0 if it stopped before its first: train.py --resume
restarts such a run, which saved nothing to continue from); any other run (an earlier `--steps 1` trial, another
seed, other code) is never taken for a finished one: the script stops before anything runs unless told --overwrite,
which trains those again (and only those). So after Ctrl-C, the same command continues where the runs stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import checkpoint  # noqa: E402
import figures  # noqa: E402

class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2, no usage block), as train.py and evaluate.py."""

    def error(self, message):
        fail(self.prog, message)


def fail(who: str, message: str, code: int = 2):
    """Print "WHO: error: MESSAGE" on stderr and exit with `code` (2: bad input, found before anything ran)."""
    print(f"{who}: error: {message}", file=sys.stderr)
    sys.exit(code)


def user_path(path: str | None) -> str | None:
    """A path from the command line, absolute against the user's working directory (the scripts then os.chdir to
    the checkout, where train.py and evaluate.py run); None or an empty one as it is (a default, or refused)."""
    return os.path.abspath(path) if path and path.strip() else path


# What train.py --overwrite renames a run directory to until the new run's first checkpoint (checkpoint.move_aside)
MOVED_ASIDE = r"\.old-\d{8}-\d{6}(-\d+)?"


def runs_dir_problem(runs_dir: str, writes: str) -> str | None:
    """Why a script may not use `runs_dir`, or None: it is not writable, or it holds an entry whose name is not one
    the script writes (`writes`, a regular expression; its train.py runs may leave NAME.old-TIME, see MOVED_ASIDE): a
    folder of the user's, whose files a run would replace."""
    why = checkpoint.out_path_problem(runs_dir)
    if why:
        return f"--runs-dir {runs_dir!r}: {why}"
    ours = re.compile(rf"(?:{writes})(?:{MOVED_ASIDE})?")
    foreign = sorted(e for e in os.listdir(runs_dir) if not ours.fullmatch(e)) if os.path.isdir(runs_dir) else []
    if foreign:
        return (f"--runs-dir {runs_dir}: it holds {foreign[0]}, which this script does not write; choose another "
                "--runs-dir (a script replaces only what it made)")
    return None


def parse_seeds(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """--seeds "0,1,2": the distinct training seeds, sorted; at least 2 (a spread), each one train.py takes
    (cli.check_seed: [0, 2**64)). Anything else is the parser's one-line error, before any run starts (a seed train.py
    refuses would otherwise stop the script only when its run came up, after the others had trained)."""
    import cli

    try:
        seeds = sorted({int(s) for s in text.split(",")})
    except ValueError:
        parser.error(f"--seeds expects comma-separated integers, got {text!r}")
    if len(seeds) < 2:
        parser.error(f"--seeds needs at least 2 distinct seeds (a spread), got {text!r}")
    for seed in seeds:
        try:
            cli.check_seed(seed)
        except cli.ConfigError as e:
            parser.error(f"--seeds: {str(e).replace('--seed must be', 'each seed must be')}")
    return seeds


def result_out_problem(prefix: str, script: str) -> str | None:
    """Why a script's OUT.{md,json,png} may not be written, or None: the folder must be writable, and an existing
    OUT.md must be one `script` wrote (its first line says so); a user's file of that name is never replaced."""
    why = checkpoint.out_path_problem(prefix)
    if why:
        return f"--out {prefix!r}: {why}"
    md = f"{prefix}.md"
    if os.path.exists(md):
        with open(md, encoding="utf-8", errors="replace") as f:
            if not f.readline().startswith(f"<!-- written by benchmarks/{script}"):
                return f"--out {prefix}: {md} exists and was not written by {script}; refusing to replace it"
    for path in (f"{prefix}.json", f"{prefix}.png"):
        if os.path.exists(path) and not os.path.exists(md):
            return f"--out {prefix}: {path} exists without {md} (not this script's result); refusing to replace it"
    return None


def spread(values, digits: int) -> str:
    """mean ± sample sd [min, max] of `values`, the cells of the scripts' tables over seeds (one value: itself)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f} [{v.min():.{digits}f}, {v.max():.{digits}f}]"


def ignored_settings() -> set[str]:
    """Settings that do not change what a run computes, or that name where it is: train.RESUME_MUTABLE (what a
    --resume may change) except --steps, and what config.json records besides the settings."""
    import train

    return (set(train.RESUME_MUTABLE) - {"steps"}) | {"versions", "gradient_scale_M", "warm_start_only"}


@dataclasses.dataclass
class Run:
    name: str  # e.g. tiny-spiral-s0; its log is RUNS/NAME.log
    out: str  # the run directory, relative to the repository root
    flags: list[str]  # train.py's flags, without --out, --resume, --overwrite

    def settings(self) -> dict:
        """The run's resolved TrainConfig as config.json records it, less ignored_settings()."""
        import train

        cfg = train.resolve_config(vars(train.build_parser().parse_args([*self.flags, "--out", self.out])))
        return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ignored_settings()}


def run_state(run: Run, accept_code: tuple[str, ...] = ()) -> tuple[str, str]:
    """("new", ""), ("finished", ""), ("resume", "") or ("differs", why) for the run directory run.out. `accept_code`:
    code digests besides this checkout's whose runs count as the same code (a script's --trained-by: runs trained
    at an earlier commit whose training code is unchanged, the report names the digest)."""
    out = os.path.join(REPO, run.out)
    if not os.path.isdir(out) or not os.listdir(out):
        return "new", ""
    try:
        saved, latest = checkpoint.saved_config(out), checkpoint.latest_checkpoint(out)
    except (checkpoint.CheckpointError, OSError, ValueError) as e:
        return "differs", f"its config cannot be read ({e})"
    if saved is None:
        return "differs", "it holds no run (no config.json)"
    wanted = run.settings()
    ignored = ignored_settings()
    changed = sorted(k for k in set(wanted) | set(saved) if k not in ignored and saved.get(k) != wanted.get(k))
    if changed:
        key = changed[0]
        return "differs", f"it was trained with {key}={saved.get(key)!r}, not {wanted.get(key)!r}"
    try:
        made_by = trained_by(out, latest)
    except (checkpoint.CheckpointError, AttributeError) as e:  # AttributeError: a config.json that is not a dict
        return "differs", f"its record of the code that trained it cannot be read ({e})"
    if not made_by or not made_by <= {checkpoint.code_digest(), *accept_code}:
        return "differs", (f"it was trained by other code ({', '.join(sorted(made_by)) or 'not recorded'}; this "
                           f"checkout's is {checkpoint.code_digest()}), so its figures are not this code's")
    rows = checkpoint.read_metrics(os.path.join(out, "metrics.jsonl"))
    if rows and rows[-1]["step"] >= wanted["steps"] and os.path.isfile(os.path.join(out, "adapter",
                                                                                    "adapter_config.json")):
        return "finished", ""
    return "resume", ""  # from its checkpoint, or (none yet: nothing was saved) from step 0 with the same config


def trained_by(out: str, latest: str | None) -> set[str]:
    """The code digests (checkpoint.code_digest) a run directory records: config.json's (where it started) and its
    `latest` checkpoint's (where it last saved); empty for a run from before digests were recorded."""
    config = os.path.join(out, "config.json")
    records = [checkpoint._reading(config, checkpoint._read_json, config)]
    if latest:
        records.append(checkpoint.read_trainer_state(latest))
    return {(record.get("versions") or {}).get("code") for record in records} - {None}


def plan(runs: list[Run], overwrite: bool, who: str, accept_code: tuple[str, ...] = ()
         ) -> tuple[list[tuple[Run, list[str]]], list[Run]]:
    """(runs to train with the extra flags each needs, finished runs to reuse); exits 2 with one line if a run's
    settings are ones train.py refuses (check_run), or if a run directory holds something else and `overwrite` is off
    (`overwrite` trains those again; a finished or resumable run of the same settings and code is kept either way).
    Writes nothing."""
    for run in runs:
        why = check_run(run)
        if why:
            fail(who, f"{run.name}: {why}")
    todo, reused = [], []
    for run in runs:
        state, why = run_state(run, accept_code)
        if state == "finished":
            reused.append(run)
        elif state == "resume":
            todo.append((run, ["--resume"]))
        elif state == "new":
            todo.append((run, []))
        elif overwrite:
            todo.append((run, ["--overwrite"]))
        else:
            fail(who, f"{run.out} exists and cannot be reused: {why}; pass --overwrite to train it again, or "
                      "choose another --runs-dir")
    return todo, reused


def check_run(run: Run) -> str | None:
    """What train.py would refuse in a run's settings when it started (after the runs before it had trained), as
    train.py words it, or None: the seed and the step count, the values a script passes through from its flags."""
    import cli

    settings = run.settings()
    try:
        cli.check_seed(settings["seed"])
        cli.check_count("steps", settings["steps"])
    except cli.ConfigError as e:
        return str(e)
    return None


def train_all(todo: list[tuple[Run, list[str]]], logs_dir: str, jobs: int, steps_of: dict[str, int],
              who: str) -> dict:
    """Run `python train.py FLAGS --out OUT [EXTRA]` for each run, `jobs` at a time (niced), output to
    LOGS/NAME.log; progress: the steps logged by all runs together. {name: seconds}. A failed run stops the rest
    (exit 1 naming its log); Ctrl-C stops them all (train.py saves nothing half-written; rerun to resume)."""
    total = sum(steps_of[run.name] for run, _ in todo)
    # Each run starts from step 0, or a resumed one from its checkpoint's step (0 if it stopped before its first).
    # train.py rewrites metrics.jsonl before its first new step (--overwrite: a new file; --resume: the steps up to its
    # checkpoint), so the steps the file holds beyond that count only once it has been rewritten.
    done_before = {run.name: _checkpoint_step(run) if "--resume" in extra else 0 for run, extra in todo}
    old = {run.name: _metrics_mtime(run) for run, _ in todo if _steps_logged(run) > done_before[run.name]}
    seconds, running, waiting = {}, [], list(todo)
    progress = figures.Progress(total - sum(done_before.values()), f"{who}: training {len(todo)} runs", "steps")
    counted = dict(done_before)
    interrupted = False
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                run, extra = waiting.pop(0)
                cmd = ["nice", "-n", "5", sys.executable, "train.py", *run.flags, "--out", run.out, *extra]
                log_path = os.path.join(logs_dir, f"{run.name}.log")
                print(f"{who}: $ python {' '.join(cmd[4:])}   (log: {log_path})", file=sys.stderr, flush=True)
                log = open(os.path.join(REPO, log_path), "w")
                running.append((run, subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                                      preexec_fn=sigint_stops),
                                time.perf_counter(), log, log_path))
            time.sleep(1)
            for item in list(running):
                run, proc, start, log, log_path = item
                now = done_before[run.name] if run.name in old and _metrics_mtime(run) == old[run.name] else \
                    _steps_logged(run)
                progress.update(max(0, now - counted[run.name]))
                counted[run.name] = max(counted[run.name], now)
                if proc.poll() is None:
                    continue
                log.close()
                running.remove(item)
                if proc.returncode != 0:
                    fail(who, f"training {run.name} failed (exit {proc.returncode}): {_last_line(log_path)} "
                              f"(log: {log_path})", code=1)
                seconds[run.name] = time.perf_counter() - start
    except KeyboardInterrupt:
        interrupted = True  # the terminal's Ctrl-C reached every train.py too: each stops as it does on its own
        raise
    finally:
        for _, proc, _, log, _ in running:
            if not interrupted and proc.poll() is None:  # another run failed: stop these as Ctrl-C would
                proc.send_signal(signal.SIGINT)
            proc.wait()
            log.close()
        progress.close()
    return seconds


def evaluate_cold(args: list[str], who: str) -> float:
    """`python evaluate.py ARGS` from the repository root with a fresh, empty --cache-dir (the tables come from this
    code's traces, not from a cache an earlier version filled); exits 1 if it fails; its wall seconds."""
    command = [sys.executable, "evaluate.py", *args]
    print(f"{who}: $ python {' '.join(command[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        if subprocess.run([*command, "--cache-dir", cache], cwd=REPO).returncode != 0:
            fail(who, "the evaluation failed (its message is above)", code=1)
    return time.perf_counter() - start


def sigint_stops() -> None:
    """For a child process (Popen's preexec_fn): SIGINT at its default, so that Python in it raises
    KeyboardInterrupt. Why: a script started in the background (`nohup ... &`, a CI job) inherits SIGINT ignored,
    and its train.py processes would then ignore the SIGINT that stops them when another run fails."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _steps_logged(run: Run) -> int:
    """The last step in the run's metrics.jsonl, read while train.py appends to it (a partial line is skipped)."""
    try:
        with open(os.path.join(REPO, run.out, "metrics.jsonl"), encoding="utf-8", errors="replace") as f:
            complete = f.read().split("\n")[:-1]  # the text after the last newline may be half written
        return int(json.loads(complete[-1])["step"]) if complete else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _checkpoint_step(run: Run) -> int:
    """The step of the run's latest checkpoint, where train.py --resume continues; 0 if it has none."""
    latest = checkpoint.latest_checkpoint(os.path.join(REPO, run.out))
    return checkpoint.read_trainer_state(latest)["step"] if latest else 0


def _metrics_mtime(run: Run) -> int | None:
    try:
        return os.stat(os.path.join(REPO, run.out, "metrics.jsonl")).st_mtime_ns
    except OSError:
        return None


def _last_line(path: str) -> str:
    try:
        with open(os.path.join(REPO, path), errors="replace") as f:
            lines = [line.strip() for line in f.read().replace("\r", "\n").splitlines() if line.strip()]
        return lines[-1][:300] if lines else "no output"
    except OSError:
        return "no log"


def seconds_of(run: Run) -> float:
    """Seconds the run's steps took by its own clock (metrics.jsonl: rollouts plus training, loading excluded)."""
    rows = checkpoint.read_metrics(os.path.join(REPO, run.out, "metrics.jsonl"))
    return sum(r.get("time/rollout_s", 0.0) + r.get("time/train_s", 0.0) for r in rows)


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "runner.py", "reproduce.py and second_task.py use")
