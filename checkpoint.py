"""The run directory: config.json, metrics.jsonl, checkpoints that resume a run exactly, and the adapters.

    OUT/config.json                  the TrainConfig of the run
    OUT/metrics.jsonl                one JSON object per step
    OUT/adapter/                     the latest adapters, PEFT format (lora.py); aggregator/ for the two-model variant
    OUT/checkpoint/step-NNNNNN/      adapter/, optimizer.pt, rng.pt, trainer_state.json (step, data position, config)
    OUT/checkpoint/latest            one line naming the newest complete step directory

Every file is written under a temporary name and renamed, so a crash at any point leaves `latest` naming a complete
checkpoint. Plumbing, not SPIRAL: train.py's loop calls `save_checkpoint` and `load_checkpoint`.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import torch

from lora import adapter_names, export_adapters, load_adapter, replace_dir, write_json_atomic


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


def save_checkpoint(out_dir: str, *, model, optimizer, step: int, data_state: dict, np_rng, config: dict,
                    base_model_name_or_path: str) -> str:
    """Write OUT/checkpoint/step-NNNNNN/ whole, then point `latest` at it, then delete older steps."""
    root = os.path.join(out_dir, "checkpoint")
    os.makedirs(root, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = os.path.join(root, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    export_adapters(model, os.path.join(tmp, "adapter"), base_model_name_or_path)
    torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
    torch.save(rng_state(np_rng), os.path.join(tmp, "rng.pt"))
    write_json_atomic(os.path.join(tmp, "trainer_state.json"), {"step": step, "data": data_state, "config": config})
    replace_dir(tmp, os.path.join(root, name))
    latest_tmp = os.path.join(root, f"latest.tmp-{os.getpid()}")
    with open(latest_tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(root, "latest"))
    for entry in os.listdir(root):
        if entry != name and entry != "latest":
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return os.path.join(root, name)


def latest_checkpoint(out_dir: str) -> str:
    root = os.path.join(out_dir, "checkpoint")
    with open(os.path.join(root, "latest")) as f:
        return os.path.join(root, f.read().strip())


def load_checkpoint(path: str, *, model, optimizer, np_rng) -> dict:
    """Restore adapters, optimizer and RNG streams from a checkpoint directory; returns trainer_state.json."""
    adapter_dir = os.path.join(path, "adapter")
    for name in adapter_names(model):
        load_adapter(model, adapter_dir if name == "default" else os.path.join(adapter_dir, name), name)
    optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), weights_only=True))
    set_rng_state(torch.load(os.path.join(path, "rng.pt"), weights_only=True), np_rng)
    return read_trainer_state(path)


def looks_like_run_dir(path: str) -> bool:
    return os.path.exists(os.path.join(path, "metrics.jsonl")) or os.path.isdir(os.path.join(path, "checkpoint"))


def read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


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


def read_trainer_state(checkpoint_dir: str) -> dict:
    with open(os.path.join(checkpoint_dir, "trainer_state.json")) as f:
        return json.load(f)
