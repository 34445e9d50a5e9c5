"""LoRA by hand (Hu et al. 2021), with adapters saved and loaded in the PEFT on-disk format.

    y = W x + (alpha / r) B A x        W frozen; A (r x in) Kaiming-uniform, B (out x r) zero, so B A = 0 at start

A side path on every targeted nn.Linear, never merged into W (merging into bf16 weights rounds the frozen model a
little on every switch). A LoRALinear holds any number of named adapters (peft's layout, `lora_A.<name>.weight`),
at most one active; none active is the base model bit for bit. The adapter weights are fp32 master weights: an
AdamW step of lr 2e-5 vanishes in bf16. Only torch and safetensors are imported: copy this file on its own.

On disk (as peft 0.21's PeftModel.save_pretrained writes a LoraConfig(task_type="CAUSAL_LM")):
  adapter_config.json        the LoraConfig fields of `peft_config`
  adapter_model.safetensors  "base_model.model.<module path>.lora_A.weight" / ".lora_B.weight", metadata format=pt
A second adapter goes to a sub-directory named after it (OUT/adapter/aggregator/), as peft does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."  # peft wraps the model twice: PeftModel.base_model (LoraModel).model
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoRALinear(nn.Module):
    """base_layer(x) + scaling[name] * B_name(A_name(x)) for the active adapter `name` (None: the base alone)."""

    def __init__(self, base_layer: nn.Linear):
        super().__init__()
        self.base_layer = base_layer
        self.lora_A = nn.ModuleDict()  # name -> Linear(in, r): weight (r, in)
        self.lora_B = nn.ModuleDict()  # name -> Linear(r, out): weight (out, r)
        self.scaling: dict[str, float] = {}
        self.active_adapter: str | None = None
        self.sampling_casts: dict | None = None  # (name, dtype) -> (A, B) cast once; only inside cast_once()

    def add_adapter(self, name: str, rank: int, alpha: float) -> None:
        weight = self.base_layer.weight
        A = nn.Linear(self.base_layer.in_features, rank, bias=False, device=weight.device, dtype=torch.float32)
        B = nn.Linear(rank, self.base_layer.out_features, bias=False, device=weight.device, dtype=torch.float32)
        nn.init.kaiming_uniform_(A.weight, a=math.sqrt(5))  # loralib's and peft's initialisation
        nn.init.zeros_(B.weight)
        self.lora_A[name], self.lora_B[name], self.scaling[name] = A, B, alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)  # (..., out) in the base dtype
        name = self.active_adapter
        if name is None:
            return y
        # Cast the fp32 masters to the input's dtype, as autocast would: bf16 tensor-core matmuls on a GPU.
        A, B = self.lora_A[name].weight, self.lora_B[name].weight  # (r, in), (out, r)
        if self.sampling_casts is None:
            A, B = A.to(x.dtype), B.to(x.dtype)
        else:  # sampling: one cast per generate call, not one per projection per decoding step
            if (name, x.dtype) not in self.sampling_casts:
                self.sampling_casts[name, x.dtype] = A.detach().to(x.dtype), B.detach().to(x.dtype)
            A, B = self.sampling_casts[name, x.dtype]
        return y + F.linear(F.linear(x, A), B) * self.scaling[name]  # (..., out)


def lora_modules(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    """(module path, LoRALinear) pairs in registration order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


def adapter_names(model: nn.Module) -> list[str]:
    modules = lora_modules(model)
    return list(modules[0][1].lora_A.keys()) if modules else []


def lora_parameters(model: nn.Module, adapter_name: str = "default") -> list[nn.Parameter]:
    """One adapter's trainable parameters: [A_0, B_0, A_1, B_1, ...] in module order."""
    return [p for _, m in lora_modules(model) for p in (m.lora_A[adapter_name].weight, m.lora_B[adapter_name].weight)]


def add_lora(model: nn.Module, rank: int = 32, alpha: float = 32.0, target_modules=TARGET_MODULES,
             adapter_name: str = "default") -> list[nn.Parameter]:
    """Freeze the base and add adapter `adapter_name` to every nn.Linear whose name is in `target_modules`.

    A second call adds a second adapter to the same modules (the two-model variant's "aggregator"); the new
    adapter becomes active only if none was. A is drawn from torch's global RNG. Returns the new parameters.
    """
    if adapter_name in adapter_names(model):
        raise ValueError(f"adapter {adapter_name!r} already exists")
    existing = {id(p) for name in adapter_names(model) for p in lora_parameters(model, name)}
    for p in model.parameters():
        if id(p) not in existing:
            p.requires_grad_(False)  # the base is frozen; adapters added earlier stay trainable
    targets = set(target_modules)
    for name, linear in [(name, m) for name, m in model.named_modules()
                         if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets]:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, LoRALinear(linear))
    modules = lora_modules(model)
    if not modules:
        raise ValueError(f"no nn.Linear named {sorted(targets)} in {type(model).__name__}")
    for _, m in modules:
        m.add_adapter(adapter_name, rank, alpha)
        if m.active_adapter is None:
            m.active_adapter = adapter_name
    return lora_parameters(model, adapter_name)


@contextlib.contextmanager
def use_adapter(model: nn.Module, name: str | None):
    """Run the model with adapter `name` active (pi_phi = "aggregator" in the two-model variant); None runs the
    frozen base exactly."""
    modules = [m for _, m in lora_modules(model)]
    if name is not None and modules and name not in modules[0].lora_A:
        raise KeyError(f"no adapter named {name!r}; have {adapter_names(model)}")
    previous = [m.active_adapter for m in modules]
    for m in modules:
        m.active_adapter = name
    try:
        yield model
    finally:
        for m, p in zip(modules, previous):
            m.active_adapter = p


@contextlib.contextmanager
def cast_once(model: nn.Module):
    """Inside, every LoRALinear casts an adapter's fp32 A and B to the activations' dtype once and reuses the casts
    (bit for bit the same values, without gradients): for sampling, where the weights do not change. On exit the
    casts are dropped, so a later optimizer step or load_adapter is always seen."""
    modules = [m for _, m in lora_modules(model)]
    for m in modules:
        m.sampling_casts = {}
    try:
        yield model
    finally:
        for m in modules:
            m.sampling_casts = None


# ----------------------------------------------------------------------------------------------------------------------
# The PEFT on-disk format


def peft_state_dict(model: nn.Module, adapter_name: str = "default") -> dict[str, torch.Tensor]:
    """{peft key: tensor}, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight (name stripped)."""
    state = {}
    for path, m in lora_modules(model):
        state[f"{PEFT_PREFIX}{path}.lora_A.weight"] = m.lora_A[adapter_name].weight.detach().contiguous()
        state[f"{PEFT_PREFIX}{path}.lora_B.weight"] = m.lora_B[adapter_name].weight.detach().contiguous()
    return state


def peft_config(model: nn.Module, base_model_name_or_path: str, adapter_name: str = "default") -> dict:
    """adapter_config.json: the LoraConfig fields that describe what add_lora built (peft fills in the rest)."""
    modules = lora_modules(model)
    first = modules[0][1]
    rank = first.lora_A[adapter_name].weight.shape[0]
    alpha = first.scaling[adapter_name] * rank
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
        "revision": None, "inference_mode": True, "r": rank,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha, "lora_dropout": 0.0,
        "target_modules": sorted({path.rsplit(".", 1)[-1] for path, _ in modules}), "bias": "none",
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
        "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {},
    }


def write_json_atomic(path: str, obj) -> None:
    """Write JSON under a temporary name, fsync, rename: a reader never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(tmp_dir: str, out_dir: str) -> None:
    """Move a finished `tmp_dir` to `out_dir`: one rename if out_dir is absent, else old aside, new in, old deleted."""
    if os.path.exists(out_dir):
        old = f"{out_dir}.old-{os.getpid()}"
        os.replace(out_dir, old)
        os.replace(tmp_dir, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp_dir, out_dir)


def portable_base_path(base_model_name_or_path: str, adapter_dir: str, base_root: str | None) -> str:
    """The base as adapter_config.json stores it: relative to the adapter directory (e.g. "../base") if it is a
    directory inside `base_root` (the run directory), so the two move together; otherwise unchanged."""
    if base_root is None or not os.path.isdir(base_model_name_or_path):
        return base_model_name_or_path
    base, root = os.path.realpath(base_model_name_or_path), os.path.realpath(base_root)
    if os.path.commonpath([base, root]) != root:
        return base_model_name_or_path
    return os.path.relpath(base, os.path.realpath(adapter_dir))


def resolve_base_path(adapter_dir: str) -> str | None:
    """base_model_name_or_path of a saved adapter, a relative directory resolved against adapter_dir (peft would
    resolve it against the working directory); a Hub id or an absolute path comes back unchanged."""
    stored = read_adapter_config(adapter_dir).get("base_model_name_or_path")
    if stored and not os.path.isabs(stored) and os.path.isdir(os.path.join(adapter_dir, stored)):
        return os.path.abspath(os.path.join(adapter_dir, stored))
    return stored


def save_adapter(model: nn.Module, out_dir: str, base_model_name_or_path: str, adapter_name: str = "default",
                 base_root: str | None = None) -> None:
    """Adapter `adapter_name` to `out_dir` in the PEFT format; each file is written then renamed.

    peft: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_base_path(out_dir)), out_dir).
    A base inside `base_root` is stored relative to out_dir (portable_base_path). Other files in out_dir (a second
    adapter's sub-directory) are kept.
    """
    from safetensors.torch import save_file

    out_dir = os.path.abspath(out_dir)
    base_model_name_or_path = portable_base_path(base_model_name_or_path, out_dir, base_root)
    os.makedirs(out_dir, exist_ok=True)
    weights = os.path.join(out_dir, ADAPTER_WEIGHTS)
    state = {k: v.cpu() for k, v in peft_state_dict(model, adapter_name).items()}
    save_file(state, f"{weights}.tmp-{os.getpid()}", metadata={"format": "pt"})
    os.replace(f"{weights}.tmp-{os.getpid()}", weights)
    write_json_atomic(os.path.join(out_dir, ADAPTER_CONFIG), peft_config(model, base_model_name_or_path, adapter_name))


def export_adapters(model: nn.Module, out_dir: str, base_model_name_or_path: str, base_root: str | None = None) -> None:
    """Every adapter at once: "default" at the top of out_dir, any other in out_dir/<name>, swapped in whole."""
    out_dir = os.path.abspath(out_dir)
    tmp = f"{out_dir}.tmp-all-{os.getpid()}"  # a sibling of out_dir: relative base paths written here stay right
    shutil.rmtree(tmp, ignore_errors=True)
    save_adapter(model, tmp, base_model_name_or_path, "default", base_root)
    for name in adapter_names(model):
        if name != "default":
            save_adapter(model, os.path.join(tmp, name), base_model_name_or_path, name, base_root)
    replace_dir(tmp, out_dir)


def read_adapter_config(in_dir: str) -> dict:
    with open(os.path.join(in_dir, ADAPTER_CONFIG)) as f:
        return json.load(f)


def load_adapter(model: nn.Module, in_dir: str, adapter_name: str = "default") -> None:
    """Load a PEFT-format LoRA adapter into `model` as `adapter_name`, adding the LoRA modules if needed.

    Every expected key must be present, with its shape, and no other: a mismatch is a ValueError.
    """
    from safetensors.torch import load_file

    config = read_adapter_config(in_dir)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{in_dir}: peft_type {config.get('peft_type')!r} is not LORA")
    unsupported = [k for k in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform")
                   if config.get(k)] + (["bias"] if config.get("bias", "none") != "none" else [])
    if unsupported:
        raise ValueError(f"{in_dir}: unsupported LoRA options {unsupported}")
    if adapter_name not in adapter_names(model):
        add_lora(model, config["r"], config["lora_alpha"], config["target_modules"], adapter_name)
    if config.get("use_rslora"):  # rsLoRA scales by alpha / sqrt(r)
        for _, m in lora_modules(model):
            m.scaling[adapter_name] = config["lora_alpha"] / math.sqrt(config["r"])
    state = load_file(os.path.join(in_dir, ADAPTER_WEIGHTS))
    expected = peft_state_dict(model, adapter_name)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{in_dir}: adapter keys do not match the model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]} ({len(missing)} missing, {len(unexpected)} unexpected)")
    with torch.no_grad():
        for key, param in expected.items():
            if state[key].shape != param.shape:
                raise ValueError(f"{in_dir}: {key} has shape {tuple(state[key].shape)}, expected {tuple(param.shape)}")
            param.copy_(state[key])  # `expected` holds detached views of the live parameters


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (copied alone: torch, safetensors only)
    print(__doc__)
