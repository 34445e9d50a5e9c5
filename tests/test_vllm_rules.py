"""Adapters saved by lora.py against vLLM's LoRA loader rules, as PORTING.md, "Serving the adapters with vLLM",
states them and with the flags it gives (vLLM itself is not installed here). The rules, from vLLM's sources
(vllm/lora/peft_helper.py, lora_model.py, utils.py; vllm/config/lora.py):
  adapter_config.json  r, lora_alpha and target_modules present; no modules_to_save; no DoRA; bias "none";
                       r <= max_lora_rank, which is one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (default 16)
  safetensors keys     [base_model.model.]<module>.lora_A.weight / .lora_B.weight, the module's last name one that
                       the model supports (Qwen3: q/k/v_proj packed as qkv_proj, gate/up_proj as gate_up_proj,
                       o_proj, down_proj); here also: no embedding or lm_head keys (vLLM is phasing them out)."""

import copy
import json
import os
import pathlib
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

import lora
import rollout
import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "PORTING.md").read_text()
VLLM_MAX_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}
VLLM_DEFAULT_MAX_LORA_RANK = 16
# Qwen3ForCausalLM.packed_modules_mapping in vLLM, expanded: the module names a Qwen3 adapter may target.
VLLM_QWEN3_LORA_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def guide_flag(python_name, cli_name):
    """The value PORTING.md gives a vLLM setting, the same in the Python and the command-line form."""
    values = set(re.findall(rf"\b{python_name}=(\d+)", GUIDE)) | set(re.findall(rf"{cli_name} (\d+)", GUIDE))
    assert len(values) == 1, f"PORTING.md gives {python_name} as {values}"
    return int(values.pop())


def vllm_problems(adapter_dir, max_lora_rank):
    """Every rule of the module docstring that the adapter in `adapter_dir` breaks, as a list of messages."""
    config = json.loads((pathlib.Path(adapter_dir) / "adapter_config.json").read_text())
    problems = [f"missing {k}" for k in ("r", "lora_alpha", "target_modules") if k not in config]
    problems += ["modules_to_save"] if config.get("modules_to_save") else []
    problems += ["DoRA"] if config.get("use_dora") else []
    problems += [f"bias {config.get('bias')}"] if config.get("bias", "none") != "none" else []
    if max_lora_rank not in VLLM_MAX_LORA_RANKS:
        problems.append(f"max_lora_rank {max_lora_rank} is not one vLLM accepts")
    if config.get("r", 0) > max_lora_rank:
        problems.append(f"LoRA rank {config['r']} is greater than max_lora_rank {max_lora_rank}")
    for key, tensor in load_file(os.path.join(adapter_dir, "adapter_model.safetensors")).items():
        match = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.(lora_A|lora_B)\.weight", key)
        if "lora_embedding_" in key:
            problems.append(f"embedding or lm_head key {key}")
            continue
        if match is None:  # vLLM: "... is unsupported LoRA weight"
            problems.append(f"unsupported key {key}")
            continue
        module, kind = match.groups()
        if "embed_tokens" in module or "lm_head" in module:
            problems.append(f"embedding or lm_head key {key}")
        elif module.rsplit(".", 1)[-1] not in VLLM_QWEN3_LORA_MODULES:
            problems.append(f"unexpected module {module}")
        elif tensor.shape[0 if kind == "lora_A" else 1] != config.get("r"):
            problems.append(f"{key} has shape {tuple(tensor.shape)}, not rank {config.get('r')}")
    return problems


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Both adapters of the two-model variant at the paper's rank, exported as train.py exports them."""
    model, _ = rollout.load_policy("tiny", device="cpu")
    model = copy.deepcopy(model)
    rank = train.TrainConfig.lora_rank
    lora.add_lora(model, rank=rank, alpha=train.TrainConfig.lora_alpha)
    lora.add_lora(model, rank=rank, alpha=train.TrainConfig.lora_alpha, adapter_name="aggregator")
    out = tmp_path_factory.mktemp("adapters") / "adapter"
    lora.export_adapters(model, str(out), "Qwen/Qwen3-4B-Instruct-2507")
    return out


def test_the_guides_flags_serve_both_adapters(saved):
    max_lora_rank = guide_flag("max_lora_rank", "--max-lora-rank")
    assert guide_flag("max_loras", "--max-loras") >= 2  # theta and phi in one batch
    assert "enable_lora=True" in GUIDE and "--enable-lora" in GUIDE
    for adapter_dir in (saved, saved / "aggregator"):
        assert vllm_problems(adapter_dir, max_lora_rank) == []
    # vLLM's default rank limit would refuse them: the README's "unchanged" needed these flags.
    assert vllm_problems(saved, VLLM_DEFAULT_MAX_LORA_RANK) == ["LoRA rank 32 is greater than max_lora_rank 16"]


def _doctor(saved, tmp_path, config_changes=None, extra_key=None):
    """A copy of the saved adapter with its config changed or one more tensor."""
    out = tmp_path / "doctored"
    out.mkdir()
    config = {**lora.read_adapter_config(str(saved)), **(config_changes or {})}
    (out / "adapter_config.json").write_text(json.dumps(config))
    state = load_file(str(saved / "adapter_model.safetensors"))
    if extra_key:
        state[extra_key] = torch.zeros(config["r"], 8)
    save_file(state, str(out / "adapter_model.safetensors"))
    return out


@pytest.mark.parametrize("changes, extra_key, problem", [
    ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
    ({"use_dora": True}, None, "DoRA"),
    ({"bias": "all"}, None, "bias all"),
    ({"r": 64}, None, "LoRA rank 64 is greater than max_lora_rank 32"),
    (None, "base_model.model.lm_head.lora_A.weight", "embedding or lm_head key"),
    (None, "base_model.model.model.embed_tokens.lora_A.weight", "embedding or lm_head key"),
    (None, "base_model.model.model.layers.0.attn.c_attn.lora_A.weight", "unexpected module"),
    (None, "base_model.model.model.embed_tokens.lora_embedding_A", "embedding or lm_head key"),
    (None, "base_model.model.model.layers.0.self_attn.q_proj.weight", "unsupported key"),
])
def test_each_rule_catches_what_it_should(saved, tmp_path, changes, extra_key, problem):
    problems = vllm_problems(_doctor(saved, tmp_path, changes, extra_key), 32)
    assert any(problem in p for p in problems), problems
