"""trl_spiral.py's run directory: SPIRAL's sampling state in TRL's checkpoints, which checkpoint a resume takes (checked
against the run's settings), and a resume that has nothing left to train. Plumbing, not SPIRAL: trl_spiral.py holds
the algorithm's side, trl_args.py the settings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import checkpoint
import cli
import train

STATE_FILE = "spiral_state.json"  # in each OUT/checkpoint-N: the set draws' and problem redraws' state, per process


def read_spiral_states(checkpoint_dir: str, processes: int) -> list[dict]:
    """spiral_state.json's per-process states, checked: CheckpointError if missing, corrupt or for another number of
    processes (each process's set draws continue its own stream)."""
    path = os.path.join(checkpoint_dir, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as exc:
        raise checkpoint.CheckpointError(f"{path} is missing or corrupt ({checkpoint.first_line(exc)})") from None
    states = saved.get("processes") if isinstance(saved, dict) else None
    if not isinstance(states, list) or not all(isinstance(s, dict) and {"numpy", "data"} <= set(s) for s in states):
        raise checkpoint.CheckpointError(f"{path} is corrupt (no per-process SPIRAL state)")
    if len(states) != processes:
        raise checkpoint.CheckpointError(f"{path} was written by {len(states)} processes, this run has {processes}; "
                                         "resume with the same number of processes")
    return states


def resume_checkpoint(cfg: train.TrainConfig, args) -> str | None:
    """--resume_from_checkpoint: `true`/`latest` for the newest OUT/checkpoint-N holding spiral_state.json, or a path;
    that checkpoint and OUT/config.json are checked against this run's settings (ConfigError / CheckpointError)."""
    if args.resume_from_checkpoint is None:
        return None
    if args.resume_from_checkpoint.lower() in ("true", "latest"):
        steps = [e for e in os.listdir(cfg.out) if e.startswith("checkpoint-") and e[11:].isdigit()
                 and os.path.isfile(os.path.join(cfg.out, e, STATE_FILE))]
        if not steps:
            raise cli.ConfigError(f"--resume_from_checkpoint: no complete checkpoint-N in {cfg.out}")
        path = os.path.join(cfg.out, max(steps, key=lambda e: int(e[11:])))
    else:
        path = args.resume_from_checkpoint
        if not os.path.isfile(os.path.join(path, "trainer_state.json")):
            raise cli.ConfigError(f"--resume_from_checkpoint {path}: not a TRL checkpoint (no trainer_state.json)")
    read_spiral_states(path, args.world_size)
    saved = checkpoint.saved_config(cfg.out) or {}
    for key, value in dataclasses.asdict(cfg).items():
        if key not in train.RESUME_MUTABLE and key in saved and saved[key] != value:
            raise cli.ConfigError(f"--resume_from_checkpoint: {key} = {value} differs from the run's {saved[key]}; "
                                  "resume with the run's settings, or start a new run")
    return path



def check_resume_path(resume: str | None, out: str) -> None:
    """--resume_from_checkpoint PATH (not true/latest): a TRL checkpoint of the run in --output_dir, else one line
    naming PATH (before the output directory's own checks, which would name the directory)."""
    if resume is None or resume.lower() in ("true", "latest"):
        return
    if not os.path.isfile(os.path.join(resume, "trainer_state.json")):
        raise cli.ConfigError(f"--resume_from_checkpoint {resume}: " + (
            "not a TRL checkpoint (no trainer_state.json)" if os.path.isdir(resume) else "no such directory"))
    if os.path.realpath(os.path.dirname(os.path.normpath(resume))) != os.path.realpath(out):
        raise cli.ConfigError(f"--resume_from_checkpoint {resume} is not in --output_dir {out}; resume a run in its "
                              "own output directory")


TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", STATE_FILE}  # not the adapter


def finish(checkpoint_dir: str, out: str) -> None:
    """A resume from a checkpoint at --max_steps: nothing is trained and the run stays as it was; OUT/adapter, if the
    run stopped after its last save but before writing it, is the checkpoint's adapter (the files TRL's save_model
    writes: every file of the checkpoint but TRL's and SPIRAL's training state)."""
    adapter = os.path.join(out, "adapter")
    if os.path.isdir(adapter):
        return
    partial = adapter + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(checkpoint_dir, partial, ignore=lambda _, names: [n for n in names if n in TRAINING_STATE])
    os.replace(partial, adapter)  # whole or not at all


def check_hub(args) -> None:
    """--push_to_hub: the Hub repository TRL's Trainer creates at its start (transformers' init_hf_repo), created or
    found now, before anything is written; cli.ConfigError of one line if the Hub cannot be reached or refuses."""
    if not args.push_to_hub:
        return
    from huggingface_hub import create_repo

    name = args.hub_model_id or Path(args.output_dir).absolute().name
    try:
        create_repo(name, token=args.hub_token, private=args.hub_private_repo, exist_ok=True)
    except Exception as exc:  # noqa: BLE001 - no network, no token, a refused name: one line, nothing written
        raise cli.ConfigError(f"--push_to_hub: the Hub repository {name} cannot be created or reached "
                              f"({checkpoint.first_line(exc)}); nothing was written (log in with `hf auth login`, or "
                              "leave --push_to_hub out)") from None


def hub_error(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it came from, is the Hub's or the network's (an upload that failed)."""
    while exc is not None:
        if type(exc).__module__.startswith(("huggingface_hub", "httpx", "httpcore", "requests", "urllib3")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import cli

    cli.library_main(__doc__, "trl_run.py", "trl_spiral.py uses")
