"""A Qwen3 policy's weights as fastgen's decode step reads them: plain tensors, the HF model's own (no copies), and
the active LoRA adapters in persistent buffers of the model's dtype (a captured CUDA graph reads their addresses).

    y_j = x W_j^T + b_j + s_j (x A_j^T) B_j^T          s_j = alpha / r_j (lora.py), never merged into W_j

Projections that read one input (q, k, v of the attention; gate, up of the MLP) stack their A_j by rows, so that
x [A_q; A_k; A_v]^T is one matmul for all of them; each output then adds its columns times B_j^T in one addmm
(fp32 accumulation, one rounding): 4 A matmuls a layer instead of 7, the same sums. `Weights.signature` names what
a captured graph depends on. `supports` refuses a model whose layers fastgen would misread (peft's LoRA layers among
them: read as their base weight, their adapter would be silently ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import lora


def _where(t: torch.Tensor | None):
    """What a captured CUDA graph knows of a tensor it reads: its address and shape (the values it reads anew)."""
    return None if t is None else (t.data_ptr(), tuple(t.shape))


@dataclass
class Linear:
    """x W^T + b + s (x A^T) B^T: an nn.Linear, or a LoRALinear with its active adapter (A, B: persistent buffers
    in the base's dtype, refreshed by `Engine.weights` at each call)."""

    weight: torch.Tensor  # (out, in), the frozen base
    bias: torch.Tensor | None
    A: torch.Tensor | None = None  # (r, in): rows of its Stacked's A buffer
    B: torch.Tensor | None = None  # (out, r)
    scale: float = 1.0

    def __call__(self, x: torch.Tensor, xA: torch.Tensor | None = None) -> torch.Tensor:
        """xA: x A^T (N, r), if already computed (by `Stacked`, for several linears at once)."""
        y = F.linear(x, self.weight, self.bias)  # (..., out)
        if self.A is None:
            return y
        x_2d, y_2d = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        xA = F.linear(x_2d, self.A) if xA is None else xA  # (N, r)
        # One kernel for y + s (xA^T) B^T (fp32 accumulation, one rounding); LoRALinear rounds three times.
        return torch.addmm(y_2d, xA, self.B.t(), alpha=self.scale).view(y.shape)

    def signature(self) -> tuple:
        return _where(self.weight), _where(self.bias), _where(self.A), _where(self.B), self.scale


@dataclass
class Stacked:
    """Linears that read the same x (q, k, v; gate, up), their adapters' A_j stacked in one (sum_j r_j, in) buffer:
    x A^T is one matmul for all of them, and linear j adds s_j (x A^T)[:, its r_j columns] B_j^T. The same sum as
    each Linear alone (one A matmul each: the reference the tests compare with)."""

    linears: tuple[Linear, ...]
    A: torch.Tensor | None  # (sum_j r_j, in); None: no adapter active on any of them

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.A is None:
            return [linear(x) for linear in self.linears]
        xA = F.linear(x.reshape(-1, x.shape[-1]), self.A)  # (N, sum_j r_j): every x A_j^T in one matmul
        out, col = [], 0
        for linear in self.linears:
            r = 0 if linear.A is None else linear.A.shape[0]
            out.append(linear(x, xA[:, col: col + r]) if r else linear(x))
            col += r
        return out

    def signature(self) -> tuple:
        return _where(self.A), tuple(linear.signature() for linear in self.linears)


@dataclass
class Layer:
    input_norm: torch.nn.Module  # the HF RMSNorm modules (their weight and eps)
    post_norm: torch.nn.Module
    q_norm: torch.nn.Module
    k_norm: torch.nn.Module
    qkv: Stacked
    o: Linear
    gate_up: Stacked
    down: Linear  # the activation is SiLU's (`supports` checks; `_silu_mul`)


@dataclass
class Weights:
    embed: torch.Tensor  # (V, d)
    layers: list[Layer]
    norm: torch.nn.Module
    lm_head: Linear
    rotary: torch.nn.Module  # the HF rotary embedding: (x, positions) -> (cos, sin)
    kv_heads: int
    head_dim: int
    scaling: float

    def signature(self) -> tuple:
        """Every tensor a captured decode step reads from the model and its adapters, as (address, shape), and the
        numbers baked into the graph (LoRA scales, eps): graphs captured with one signature serve only that one."""
        norm = lambda n: (_where(n.weight), n.variance_epsilon)  # noqa: E731
        layers = tuple((*map(norm, (x.input_norm, x.post_norm, x.q_norm, x.k_norm)), x.qkv.signature(),
                        x.o.signature(), x.gate_up.signature(), x.down.signature()) for x in self.layers)
        rotary = _where(getattr(self.rotary, "inv_freq", None)), getattr(self.rotary, "attention_scaling", None)
        return (_where(self.embed), layers, norm(self.norm), self.lm_head.signature(), rotary, self.kv_heads,
                self.head_dim, self.scaling)


PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def _linear_problem(module) -> str:
    """"" if the engine reads `module` right: an nn.Linear, or a lora.LoRALinear around one. Anything else (peft's
    LoraLayer, a quantized linear) would be read as its base weight, its adapter or scales silently dropped."""
    if type(module) is torch.nn.Linear or (type(module) is lora.LoRALinear
                                           and type(module.base_layer) is torch.nn.Linear):
        return ""
    return f"is a {type(module).__module__}.{type(module).__qualname__}"


def supports(model) -> str:
    """"" if `model` is a Qwen3 causal LM that this file can run, else why not (rollout.generate raises it; "auto"
    then picks the reference)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "qwen3" or not hasattr(model, "lm_head"):
        return f"fast generation supports Qwen3 causal LMs; this is {type(model).__name__}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]):
        return "fast generation does not support sliding-window layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"fast generation supports SiLU MLPs; this one uses {config.hidden_act}"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return f"fast generation reads model.model.layers of a Qwen3ForCausalLM; {type(model).__name__} has none"
    try:
        paths = [(f"model.layers.{i}.{p}", layer.get_submodule(p))
                 for i, layer in enumerate(layers) for p in PROJECTIONS]
    except AttributeError as e:
        return f"fast generation reads Qwen3's decoder layers; {e}"
    for path, module in paths + [("lm_head", model.lm_head)]:
        if _linear_problem(module):
            return (f"fast generation reads torch.nn.Linear and lora.LoRALinear layers only; {path} "
                    f"{_linear_problem(module)} (its adapter would be ignored)")
    return ""


class AdapterBuffers:
    """Each active adapter's weights in the model's dtype, per group of projections sharing an input: A stacked (the
    rows of its members in order), one B each. Made on first use and when a rank changes; their values refreshed at
    every `weights` call (after each optimizer step); their addresses otherwise fixed (a graph reads them)."""

    def __init__(self, dtype, device):
        self.dtype, self.device = dtype, device
        self.buffers: dict = {}  # (module ids, adapter names) -> (ranks' shapes, stacked A, [B or None])

    def stacked(self, modules) -> Stacked:
        """The linears `modules` (all reading one input), their active adapters copied into persistent buffers: A
        stacked by rows in module order, one B each."""
        bases = [m.base_layer if isinstance(m, lora.LoRALinear) else m for m in modules]
        names = [m.active_adapter if isinstance(m, lora.LoRALinear) else None for m in modules]
        if all(name is None for name in names):
            return Stacked(tuple(Linear(b.weight, b.bias) for b in bases), None)
        masters = [None if name is None else (m.lora_A[name].weight, m.lora_B[name].weight, m.scaling[name])
                   for m, name in zip(modules, names)]  # fp32 masters (r, in), (out, r); alpha / r
        key = (tuple(map(id, modules)), tuple(names))
        shapes = tuple(None if a is None else (a[0].shape, a[1].shape) for a in masters)
        if key not in self.buffers or self.buffers[key][0] != shapes:  # new, or a rank changed: new buffers
            rows = sum(a[0].shape[0] for a in masters if a is not None)
            A = torch.empty((rows, bases[0].in_features), dtype=self.dtype, device=self.device)
            Bs = [None if a is None else torch.empty(a[1].shape, dtype=self.dtype, device=self.device) for a in masters]
            self.buffers[key] = (shapes, A, Bs)
        _, A_buffer, B_buffers = self.buffers[key]
        linears, row = [], 0
        for base, master, B_buffer in zip(bases, masters, B_buffers):
            if master is None:
                linears.append(Linear(base.weight, base.bias))
                continue
            A, B, scale = master
            A_rows = A_buffer[row: row + A.shape[0]]
            A_rows.copy_(A.detach())  # in place, cast: the addresses a captured graph reads stay the same
            B_buffer.copy_(B.detach())
            linears.append(Linear(base.weight, base.bias, A_rows, B_buffer, scale))
            row += A.shape[0]
        return Stacked(tuple(linears), A_buffer)

    def linear(self, module) -> Linear:
        return self.stacked((module,)).linears[0]

    def weights(self, model) -> Weights:
        """The model's weights as the step reads them, the active adapters copied into their buffers."""
        inner, layers = model.model, []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(Layer(layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm,
                                self.stacked((attn.q_proj, attn.k_proj, attn.v_proj)), self.linear(attn.o_proj),
                                self.stacked((mlp.gate_proj, mlp.up_proj)), self.linear(mlp.down_proj)))
        attn = inner.layers[0].self_attn
        return Weights(inner.embed_tokens.weight, layers, inner.norm, self.linear(model.lm_head), inner.rotary_emb,
                       model.config.num_key_value_heads, attn.head_dim, attn.scaling)


if __name__ == "__main__":  # a library (fastgen imports it): --help prints what it holds; nothing runs
    print(__doc__)
