"""The run directory: config.json, metrics.jsonl, checkpoints that resume a run exactly, and the adapters.

    OUT/config.json                  the TrainConfig of the run, and the versions it started on (`versions`)
    OUT/metrics.jsonl                one JSON object per step
    OUT/adapter/                     the latest adapters, PEFT format (lora.py); aggregator/ for the two-model variant
    OUT/base/                        the base model, only for the code-built --model tiny (and BASE_RECORD)
    OUT/checkpoint/step-NNNNNN/      adapter/, optimizer.pt, rng.pt, trainer_state.json (step, data, config, versions)
    OUT/checkpoint/latest            one line naming the newest complete step directory

Every file is written under a temporary name and renamed, so a crash at any point leaves `latest` naming a complete
checkpoint. A run writes nothing else (RUN_ENTRY), which is how --overwrite tells a run directory from a user's, and
deletes nothing else: a user's files in OUT or OUT/checkpoint stay. One process writes OUT at a time (lock_run_dir).
Plumbing, not SPIRAL: train.py calls these.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

from lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_names, export_adapters, load_adapter, lora_parameters, \
    read_adapter_config, replace_dir, write_json_atomic

# Every name a run writes in OUT and in OUT/checkpoint, with the temporary names of lora.write_json_atomic,
# lora.replace_dir, lora.export_adapters and save_checkpoint (left behind by a crash).
# trl_spiral.py's run directories also hold what TRL writes there: checkpoint-N, completions/, runs/ (TensorBoard) and,
# from its first version, trl/.
RUN_ENTRY = re.compile(r"(config\.json|metrics\.jsonl|metrics\.png|adapter|base|checkpoint|checkpoint-\d+|completions|"
                       r"runs|trl)(\.(tmp|tmp-all|old)-\d+)?")
CHECKPOINT_ENTRY = re.compile(r"latest(\.tmp-\d+)?|step-\d+(\.old-\d+)?|\.step-\d+\.tmp-\d+")
STEP_DIR = re.compile(r"step-(\d+)")


class CheckpointError(Exception):
    """A run-directory file that cannot be read or does not fit this run; the message names the file."""


def first_line(exc: BaseException) -> str:
    """The exception as "Type: first line of its message", for one-line errors."""
    text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _reading(path: str, read, *args):
    """read(*args), with any failure turned into a CheckpointError naming `path`."""
    try:
        return read(*args)
    except Exception as exc:  # noqa: BLE001 - a corrupt file fails in many ways (pickle, zip, JSON, shapes)
        raise CheckpointError(f"{path} is missing, corrupt or does not fit this run ({first_line(exc)})") from exc


def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_name(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(256).decode().strip()


def within(path: str, root: str) -> bool:
    """True if `path` (after symlinks) is `root` or inside it."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def code_digest(root: str | None = None) -> str:
    """Which code made a run: sha256 (12 hex digits) of the project's top-level .py files (in `root`, default this
    checkout), names and bytes. The same digest, versions and machine train the same way; benchmarks/runner.py reuses
    a run only with this checkout's."""
    root = root or os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(e for e in os.listdir(root) if e.endswith(".py")):
        with open(os.path.join(root, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:12]


def versions(device=None) -> dict:
    """The software, code (code_digest) and device a run or an evaluation ran on, recorded in config.json, every
    checkpoint and evaluate.py's result. Informative only: the figures were made with constraints.txt's pins, and a
    resume on other versions or code warns (it is then not bit-exact) instead of refusing."""
    found = {"python": platform.python_version(), "code": code_digest()}
    for package in ("torch", "transformers", "numpy", "math-verify"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    device = torch.device(device or "cpu")
    found["device"] = (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else f"{device.type} ({platform.machine() or 'unknown'}, {os.cpu_count()} cores)")
    return found


def warn_if_versions_differ(saved: dict | None, current: dict, what: str) -> None:
    """One line on stderr when `saved` (a checkpoint's versions) differs from `current`; never an error."""
    saved = saved if isinstance(saved, dict) else {}  # a checkpoint from before versions were recorded: no warning
    changed = [f"{k} {saved[k]} -> {v}" for k, v in current.items() if k in saved and saved[k] != v]
    if changed:
        print(f"warning: {what} was made with other versions ({'; '.join(changed)}); it continues, but not "
              "bit-exactly", file=sys.stderr)


def quiet_libraries() -> None:
    """No library progress bars (transformers' "Loading weights", huggingface_hub's downloads) in train.py's and
    evaluate.py's output. Library warnings stay: a missing-weights report is a signal, not noise."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints


def rng_state(np_rng: np.random.Generator) -> dict:
    """Every random stream the loop uses: python, numpy (set sampling), torch CPU and CUDA (token sampling)."""
    state = {"python": random.getstate(), "numpy": np_rng.bit_generator.state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, np_rng: np.random.Generator) -> None:
    random.setstate(state["python"])
    np_rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_MOVED_ASIDE: dict[str, str] = {}  # abspath(OUT) -> the old run that --overwrite moved aside (see move_aside)


def save_checkpoint(out_dir: str, *, model, optimizer, step: int, data_state: dict, np_rng, config: dict,
                    base_model_name_or_path: str) -> str:
    """Write OUT/checkpoint/step-NNNNNN/ whole, then point `latest` at it, then delete the other step directories and
    temporary names a run writes (CHECKPOINT_ENTRY; nothing else, so a user's copy such as best-step5/ stays), and
    the old run that --overwrite moved aside (the new run has now saved its first checkpoint)."""
    root = os.path.join(out_dir, "checkpoint")
    os.makedirs(root, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = os.path.join(root, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        export_adapters(model, os.path.join(tmp, "adapter"), base_model_name_or_path)
        torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
        torch.save(rng_state(np_rng), os.path.join(tmp, "rng.pt"))
        state = {"step": step, "data": data_state, "config": config,
                 "versions": versions(next(model.parameters()).device)}
        write_json_atomic(os.path.join(tmp, "trainer_state.json"), state)
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
        raise write_failed(os.path.join(root, name), tmp, exc) from None
    replace_dir(tmp, os.path.join(root, name))
    latest_tmp = os.path.join(root, f"latest.tmp-{os.getpid()}")
    with open(latest_tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(root, "latest"))
    for entry in os.listdir(root):
        if entry not in (name, "latest") and CHECKPOINT_ENTRY.fullmatch(entry):
            path = os.path.join(root, entry)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    delete_moved_aside(out_dir)
    return os.path.join(root, name)


def delete_moved_aside(out_dir: str) -> None:
    """Delete the old run that --overwrite moved aside (move_aside), once the new run has saved a checkpoint."""
    old_run = _MOVED_ASIDE.pop(os.path.abspath(out_dir), None)
    if old_run:
        shutil.rmtree(old_run, ignore_errors=True)


def latest_checkpoint(out_dir: str) -> str | None:
    """The step directory that `latest` names, or, with no `latest` (a crash before the first one was written), the
    newest step-N holding a trainer_state.json; None if there is none. `latest` must name a step-N inside
    OUT/checkpoint, else CheckpointError."""
    root = os.path.join(out_dir, "checkpoint")
    latest = os.path.join(root, "latest")
    if os.path.exists(latest):
        name = _reading(latest, _read_name, latest)
        path = os.path.join(root, name)
        if not STEP_DIR.fullmatch(name) or not within(path, root) or not os.path.isdir(path):
            raise CheckpointError(f"{latest} names {name[:80]!r}, not a step directory inside {root}")
        return path
    steps = [e for e in (os.listdir(root) if os.path.isdir(root) else []) if STEP_DIR.fullmatch(e)
             and within(os.path.join(root, e), root) and os.path.isfile(os.path.join(root, e, "trainer_state.json"))]
    return os.path.join(root, max(steps, key=lambda e: int(e[5:]))) if steps else None


def read_trainer_state(checkpoint_dir: str) -> dict:
    """trainer_state.json: {"step", "data": {"epoch", "index"}, "config"}, else CheckpointError."""
    path = os.path.join(checkpoint_dir, "trainer_state.json")
    state = _reading(path, _read_json, path)
    count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    if not (isinstance(state, dict) and count(state.get("step")) and isinstance(state.get("config"), dict)
            and isinstance(state.get("data"), dict) and count(state["data"].get("epoch"))
            and count(state["data"].get("index")) and isinstance(state["data"].get("sha256", ""), str)):
        raise CheckpointError(f"{path} is corrupt (no step, data position or config)")
    return state


def data_fingerprint(problems) -> str:
    """sha256 of the training problems (text, answer, id) in their order: a resume checks it (data_position)."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p.problem, p.answer, p.id]).encode() + b"\n")
    return h.hexdigest()


def data_position(state: dict, problems) -> dict:
    """trainer_state.json's {"epoch", "index"} in `problems`, checked against the fingerprint it was saved with: a
    resume on changed data (answers edited, file shrunk) is refused instead of training on something else."""
    data = state["data"]
    saved = data.get("sha256")
    if saved is not None and saved != data_fingerprint(problems):
        raise CheckpointError("--resume: the training data differ from the checkpoint's (sha256 of the problems and "
                              "answers); resume with the run's --data unchanged, or start a new run")
    if data["index"] > len(problems):
        raise CheckpointError(f"--resume: the checkpoint's data position {data['index']} is past the "
                              f"{len(problems)} problems")
    return {"epoch": data["epoch"], "index": data["index"]}


def load_checkpoint(path: str, *, model, optimizer, np_rng) -> dict:
    """Restore adapters, optimizer and RNG streams from a checkpoint directory; returns trainer_state.json.
    A file that is corrupt or does not fit the model raises CheckpointError naming it."""
    state = read_trainer_state(path)
    for name in adapter_names(model):
        adapter_dir = os.path.join(path, "adapter", "" if name == "default" else name)
        _reading(os.path.join(adapter_dir, ADAPTER_CONFIG), read_adapter_config, adapter_dir)
        _reading(os.path.join(adapter_dir, ADAPTER_WEIGHTS), load_adapter, model, adapter_dir, name)
    optimizer_path, rng_path = os.path.join(path, "optimizer.pt"), os.path.join(path, "rng.pt")
    _reading(optimizer_path, lambda: optimizer.load_state_dict(torch.load(optimizer_path, weights_only=True)))
    _reading(rng_path, lambda: set_rng_state(torch.load(rng_path, weights_only=True), np_rng))
    for name in adapter_names(model):
        if not all(bool(torch.isfinite(p).all()) for p in lora_parameters(model, name)):
            raise CheckpointError(f"{path}/adapter holds non-finite LoRA weights (the run diverged); resume from an "
                                  "earlier checkpoint or start a new run")
    warn_if_versions_differ(state.get("versions"), versions(next(model.parameters()).device), f"checkpoint {path}")
    return state


def saved_config(out_dir: str) -> dict | None:
    """The config --resume continues: the latest checkpoint's, or for a run that crashed before its first checkpoint
    config.json's (that run restarts at step 0). None if OUT holds neither."""
    path = latest_checkpoint(out_dir)
    if path is not None:
        return read_trainer_state(path)["config"]
    config_path = os.path.join(out_dir, "config.json")
    if not os.path.isfile(config_path):
        return None
    config = _reading(config_path, _read_json, config_path)
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is corrupt (not a JSON object)")
    return config


# ----------------------------------------------------------------------------------------------------------------------
# The run directory: what --overwrite may replace, and how


def out_dir_problem(out_dir: str, *, resume: bool, overwrite: bool, keep: dict[str, str],
                    resume_flag: str = "--resume") -> str | None:
    """Why a run may not write to out_dir, or None. A new run needs an absent or empty directory; --resume needs a
    checkpoint (or the config.json of a run that crashed before one); --overwrite needs a directory holding only
    what a run writes and none of `keep` (flag -> path: the model it trains, ...). All need write access."""
    if out_dir and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        return f"--out {out_dir} is a file, not a run directory"
    if out_dir and os.path.islink(out_dir) and not os.path.exists(out_dir):
        return f"--out {out_dir} is a symbolic link to {os.readlink(out_dir)}, which does not exist"
    linked = [e for e in ("adapter", "base", "checkpoint", "config.json", "metrics.jsonl", "metrics.png")
              if resume and os.path.islink(os.path.join(out_dir, e))]
    if linked:
        return (f"--out {out_dir}: {linked[0]} is a symbolic link, and a run replaces it with its own; remove the "
                "link (what it points to is not touched)")
    why = out_path_problem(out_dir)
    if why:
        return f"--out {out_dir!r}: {why}"
    if resume and saved_config(out_dir) is None:
        return f"{resume_flag}: no checkpoint in {out_dir}"
    if resume and (why := base_problem(out_dir)):
        return f"{resume_flag}: {why}"
    if not resume and os.path.isdir(out_dir) and os.listdir(out_dir):
        if not overwrite:
            return f"--out {out_dir} already exists; pass {resume_flag} to continue it or --overwrite to replace it"
        foreign = foreign_entries(out_dir)
        if foreign:
            return (f"--overwrite: {out_dir} does not look like a run directory (a run does not write {foreign[0]}); "
                    "refusing to replace it")
        for flag, path in keep.items():
            if os.path.exists(path) and within(path, out_dir):
                return f"--overwrite: {out_dir} contains {flag} ({path}); refusing to replace it"
    # --overwrite renames OUT, or for OUT a link to a run directory the directory it names, within its parent
    why = unwritable(os.path.dirname(os.path.realpath(out_dir)) if overwrite else out_dir)
    return f"--out {out_dir}: {why}" if why else None


def foreign_entries(out_dir: str) -> list[str]:
    """Entries of OUT and OUT/checkpoint that a run does not write (a user's files): --overwrite refuses those."""
    foreign = [e for e in sorted(os.listdir(out_dir)) if not RUN_ENTRY.fullmatch(e)]
    root = os.path.join(out_dir, "checkpoint")
    if os.path.isdir(root) and not os.path.islink(root):
        foreign += [os.path.join("checkpoint", e) for e in sorted(os.listdir(root))
                    if not CHECKPOINT_ENTRY.fullmatch(e)]
    return foreign


def unwritable(path: str) -> str | None:
    """Why a run could not create or write `path`: a name too long (room kept for a run's .lock and .tmp<pid>), or no
    directory to create it in where a file really can be (os.access says yes to root everywhere, /proc included)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    name, limit = max(os.path.abspath(path)[len(probe):].split(os.sep), key=len), os.pathconf(probe, "PC_NAME_MAX")
    if len(name.encode()) > limit - 16:
        return f"a name of {len(name.encode())} bytes; this file system allows {limit}, less 16 for a run's suffixes"
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".write-test-")
        os.close(fd)
        os.remove(name)
    except OSError as exc:
        return f"{probe} is not writable ({exc.strerror or type(exc).__name__})"
    return None


def out_path_problem(path: str) -> str | None:
    """Why `path` cannot be an output path: empty, or not writable (see unwritable)."""
    return "an empty path; expected a directory" if not path or not path.strip() else unwritable(path)


# One writer per run directory: an exclusive flock on the directory itself, held while the process runs. The kernel
# drops it when the process ends however it ends (SIGKILL included), so no stale lock survives a crash, and no file
# is written for it.
_LOCKS: dict[str, tuple[int, bool]] = {}  # abspath(OUT) -> (descriptor, whether lock_run_dir created OUT)


def lock_run_dir(out_dir: str) -> None:
    """Create OUT if needed and lock it for this process; CheckpointError if another process holds it."""
    key = os.path.abspath(out_dir)
    created = not os.path.isdir(out_dir)
    os.makedirs(os.path.realpath(out_dir), exist_ok=True)  # OUT a link whose run --overwrite moved aside: its target
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CheckpointError(f"--out {out_dir} is in use by another train.py run (one writer per run directory); "
                              "wait for it to finish") from None
    old = _LOCKS.get(key)
    _LOCKS[key] = (fd, created or (old is not None and old[1]))
    if old is not None:  # --overwrite: the old run, moved aside, stays locked until now
        os.close(old[0])


LOCK_MARK = b"evaluate.py lock: one writer per result; removed when that run ends\n"


def lock_file(path: str) -> None:
    """evaluate.py's one writer per result: RESULT.json.lock, a file this process creates (its content LOCK_MARK)
    and holds an exclusive flock on until unlock_file deletes it. It appears whole and locked at once (a finished
    temporary file hard-linked into place), so another process never sees it half made. A lock file that is not
    held (its run was killed) is taken over; any other file at that path is a user's: CheckpointError, untouched.
    The result's folder is created first: `--out runs/eval/r.json` on a fresh clone has no runs/eval yet."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    busy = CheckpointError(f"{path[:-5]} is being written by another evaluate.py (its lock {path} is held); wait "
                           "for it to finish")
    foreign = CheckpointError(f"{path} exists and is not an evaluate.py lock file; move it away (evaluate.py neither "
                              "uses nor deletes a file it did not create)")
    while True:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".evaluate-lock-")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        os.write(fd, LOCK_MARK)
        try:
            os.link(tmp, path)  # fails if anything is at `path`: never takes a file it did not make
            made = True
        except FileExistsError:
            made = False
        os.remove(tmp)
        if made:
            _LOCKS[os.path.abspath(path)] = (fd, True)
            return
        os.close(fd)
        try:  # something is at `path`: a running evaluate.py's lock, a killed one's, or a user's file
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # its run finished in between: try again
        except OSError:  # a symbolic link (O_NOFOLLOW), something unreadable
            raise foreign from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise busy from None
        try:
            ours = os.read(fd, len(LOCK_MARK) + 1) == LOCK_MARK
        except OSError:  # a directory
            ours = False
        if not ours:
            os.close(fd)
            raise foreign
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # still that file: a killed run's lock, now ours
                _LOCKS[os.path.abspath(path)] = (fd, True)
                return
        os.close(fd)


def unlock_file(path: str) -> None:
    """Delete lock_file's lock file, then release it: deleted while still held, so a process that opened the old
    file in between finds it gone (or held) and starts over on a new one; never two holders at once."""
    fd, _ = _LOCKS.pop(os.path.abspath(path), (None, False))
    if fd is None:
        return
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:  # only the file it created
            os.remove(path)
    os.close(fd)


def unlock_run_dir(out_dir: str) -> None:
    """Release lock_run_dir's lock; remove OUT if lock_run_dir created it and nothing was written in it."""
    fd, created = _LOCKS.pop(os.path.abspath(out_dir), (None, False))
    if fd is None:
        return
    os.close(fd)
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(out_dir)  # fails, as it should, unless OUT is empty


def prepare_run_dir(out_dir: str, *, config: dict, overwrite: bool, resume_step: int | None) -> None:
    """A run's first write, once every input has been checked and loaded: --overwrite moves an old run aside, a new
    run writes config.json, a resumed run drops the metrics of the steps after its checkpoint (it redoes them)."""
    if overwrite and os.path.isdir(out_dir) and os.listdir(out_dir):
        old = move_aside(out_dir)
        print(f"train.py: moved the old run to {old}; it is deleted once this run saves its first checkpoint")
        if os.path.abspath(out_dir) in _LOCKS:
            lock_run_dir(out_dir)  # the lock moved aside with the old run: lock the new OUT
    os.makedirs(os.path.realpath(out_dir), exist_ok=True)
    if resume_step is None:
        write_json_atomic(os.path.join(out_dir, "config.json"), config)
    else:
        truncate_metrics(os.path.join(out_dir, "metrics.jsonl"), resume_step)


def move_aside(out_dir: str) -> str:
    """--overwrite: rename OUT to OUT.old-<time>. save_checkpoint deletes it once the new run has saved its first
    checkpoint; until then (a crash, a diverged first step) the old run stays there, whole. OUT a symbolic link to a
    run directory: that directory is renamed, and the new run is made where the link points (the link stays)."""
    stamp, real = time.strftime("%Y%m%d-%H%M%S"), os.path.realpath(out_dir)
    old = f"{real}.old-{stamp}"
    for n in range(2, 1000):
        if not os.path.exists(old):
            break
        old = f"{real}.old-{stamp}-{n}"
    os.rename(real, old)
    _MOVED_ASIDE[os.path.abspath(out_dir)] = old
    return old


# ----------------------------------------------------------------------------------------------------------------------
# metrics.jsonl


def read_metrics(path: str) -> list[dict]:
    """The rows of metrics.jsonl. A torn last line (a crash in mid-write) is dropped with a note on stderr; any other
    line that is not a JSON object with an integer "step" is a CheckpointError naming the file and line."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(n, line) for n, line in enumerate(f, start=1) if line.strip()]
    rows = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            if n != lines[-1][0]:
                raise CheckpointError(f"{path}, line {n}: not a JSON object with a step")
            print(f"note: {path}, line {n}: dropped a torn last line (a crash while it was written)", file=sys.stderr)
    return rows


def append_metrics(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_metrics(path: str, last_step: int) -> None:
    """Keep the metrics of steps <= last_step (a resumed run redoes the later ones, so each step appears once)."""
    rows = [r for r in read_metrics(path) if r["step"] <= last_step]
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)


BASE_RECORD = "spiral-ref-base.json"  # in OUT/base: {file: [bytes, sha256]} of what save_base wrote


def base_problem(out_dir: str) -> str | None:
    """Why OUT/base is not what save_base wrote, or None: a file missing, or of another size or sha256 than
    BASE_RECORD says (a truncated copy). A resume never rewrites OUT/base, and its adapters would point at it.
    A base written before the record existed is not checked."""
    base = os.path.join(out_dir, "base")
    record = os.path.join(base, BASE_RECORD)
    if not os.path.isfile(record):
        return None
    files = _reading(record, lambda: [(n, int(b), str(d)) for n, (b, d) in _read_json(record).items()])
    for name, size, digest in files:
        path = os.path.join(base, name)
        found = (os.path.getsize(path), _sha256(path)) if os.path.isfile(path) else None
        if found != (size, digest):
            what = "missing" if found is None else f"{found[0]:,} bytes, sha256 {found[1][:12]}"
            return (f"{path} is not what the run wrote ({what}; written: {size:,} bytes, sha256 {digest[:12]}); "
                    f"remove {base} and resume again: the run writes it anew from --model")
    return None


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save_base(out_dir: str, model: str, base_model, tokenizer, in_checkout: str) -> str:
    """base_model_name_or_path for the adapters: a Hub id or a local directory as given; OUT/base for a base that
    exists only in memory (--model tiny, built in code) or inside the checkout (`in_checkout`, the tiny warm start),
    so that such a run directory can be moved or copied with its base. OUT/base records its files' sizes and
    digests (BASE_RECORD), which a resume checks (base_problem)."""
    local = os.path.abspath(os.path.expanduser(model))
    if model != "tiny" and local != in_checkout:
        return local if os.path.isdir(local) else model
    base_path = os.path.join(os.path.abspath(out_dir), "base")
    if not os.path.isdir(base_path):
        tmp = f"{base_path}.tmp-{os.getpid()}"
        try:
            if model == "tiny":
                base_model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            else:
                shutil.copytree(in_checkout, tmp)
            write_json_atomic(os.path.join(tmp, BASE_RECORD), {
                name: [os.path.getsize(os.path.join(tmp, name)), _sha256(os.path.join(tmp, name))]
                for name in sorted(os.listdir(tmp)) if os.path.isfile(os.path.join(tmp, name))})
        except (OSError, shutil.Error) as exc:  # shutil.Error: copytree's list of failed files
            raise write_failed(base_path, tmp, exc) from None
        replace_dir(tmp, base_path)
    return base_path


def write_failed(path: str, tmp: str, exc: BaseException) -> CheckpointError:
    """The one-line error for a write to `path` (through the temporary `tmp`) that failed, after deleting `tmp`:
    a full disk is named as such (torch.save and copytree do not say it), with the free space measured before the
    half-written `tmp` is deleted."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        why = str(exc.args[0][0][-1])  # copytree: [(source, destination, reason), ...]
    else:
        why = getattr(exc, "strerror", None) or first_line(exc)
    probe = os.path.abspath(tmp)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(probe).free
        if getattr(exc, "errno", None) == errno.ENOSPC or free < 16 * 2**20:
            why = f"the disk is full ({free / 2**20:.0f} MiB free)"
    shutil.rmtree(tmp, ignore_errors=True)
    return CheckpointError(f"could not write {path}: {why}; nothing half-written was left behind")


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (cli.library_main: an import cycle)
    print(__doc__)
