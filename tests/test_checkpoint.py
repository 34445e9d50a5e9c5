"""train.py end to end on the tiny policy: one GRPO step, SPIRAL steps with the two-model variant, and an interrupted
and resumed run that ends with exactly the adapters and metrics of an unbroken one.

The tiny policy is untrained, so math-verify would grade every trace 0 and dynamic sampling would keep nothing.
spiral.reward is replaced by a deterministic pseudo-random grade of the text, so advantages are non-zero and the
optimizer really steps."""

import json
import os
import zlib

import pytest
import torch
from safetensors.torch import load_file

import spiral
import train
import checkpoint
import lora


@pytest.fixture(autouse=True)
def pseudo_reward(monkeypatch):
    monkeypatch.setattr(spiral, "reward", lambda text, gold: float(zlib.crc32(text.encode()) % 2))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "problems.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(5)))
    return str(path)


SMALL = ["--preset", "tiny", "--model", "tiny",  # the code-built tiny policy (its base is saved to OUT/base)
         "--batch-problems", "1", "--num-search", "3", "--set-size", "2", "--num-sets", "2",
         "--num-aggregations", "2", "--group-size", "3", "--max-new-tokens", "6", "--no-plot"]


def _run(data, out, *extra):
    assert train.main(SMALL + ["--data", data, "--out", str(out), *extra]) == 0


def _tensors(out):
    """Every adapter tensor in OUT/adapter/, keyed by (sub-directory, PEFT key)."""
    found = {}
    for root, _, names in os.walk(os.path.join(out, "adapter")):
        if "adapter_model.safetensors" in names:
            sub = os.path.relpath(root, os.path.join(out, "adapter"))
            found.update({(sub, k): v for k, v in load_file(os.path.join(root, "adapter_model.safetensors")).items()})
    return found


def _metrics(out):
    rows = checkpoint.read_metrics(os.path.join(out, "metrics.jsonl"))
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def test_one_grpo_step_end_to_end(data, tmp_path):
    _run(data, tmp_path / "grpo", "--algo", "grpo", "--steps", "1")
    (row,) = _metrics(tmp_path / "grpo")
    assert row["step"] == 1 and row["train/samples_trained"] > 0
    assert {"accuracy", "train/loss", "train/grad_norm", "train/entropy_grpo", "rollout/entropy_grpo"} <= set(row)
    assert abs(row["train/importance_ratio_mean"] - 1) < 1e-3  # learner and sampler agree on-policy
    B = [v for (_, k), v in _tensors(tmp_path / "grpo").items() if k.endswith("lora_B.weight")]
    assert len(B) == 2 * 7 * 2 and any(b.abs().max() > 0 for b in B)  # B started at 0: the step moved it
    config = lora.read_adapter_config(str(tmp_path / "grpo" / "adapter"))
    assert config["base_model_name_or_path"] == "../base"  # relative: the run directory moves with its base
    assert lora.resolve_base_path(str(tmp_path / "grpo" / "adapter")) == str(tmp_path / "grpo" / "base")
    assert os.path.exists(tmp_path / "grpo" / "base" / "config.json")
    assert open(tmp_path / "grpo" / "checkpoint" / "latest").read().strip() == "step-000001"


def test_interrupted_and_resumed_spiral_run_equals_an_unbroken_one(data, tmp_path):
    flags = ["--separate-aggregator", "--save-every", "1"]
    _run(data, tmp_path / "unbroken", *flags, "--steps", "2")

    _run(data, tmp_path / "resumed", *flags, "--steps", "1")
    # Simulate a crash after step 2 was logged but before its checkpoint was written.
    with open(tmp_path / "resumed" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "aggregation_accuracy": -1.0}) + "\n")
    assert train.main(["--out", str(tmp_path / "resumed"), "--resume", "--steps", "2"]) == 0

    unbroken, resumed = _metrics(tmp_path / "unbroken"), _metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [1, 2]  # each step exactly once
    assert resumed == unbroken
    assert unbroken[0]["train/samples_trained"] > 0
    assert {"search_accuracy", "aggregation_accuracy", "train/entropy_search", "train/grad_norm"} <= set(unbroken[1])

    a, b = _tensors(tmp_path / "unbroken"), _tensors(tmp_path / "resumed")
    assert {sub for sub, _ in a} == {".", "aggregator"}  # theta and phi, in peft's multi-adapter layout
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    phi = [v for (sub, k), v in a.items() if sub == "aggregator" and k.endswith("lora_B.weight")]
    assert any(v.abs().max() > 0 for v in phi)  # the aggregator adapter trained too
    assert sorted(os.listdir(tmp_path / "resumed" / "checkpoint")) == ["latest", "step-000002"]
