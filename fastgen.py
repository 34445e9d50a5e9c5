"""Fast sampling y ~ softmax(logits / T) for Qwen3 policies: rollout.generate(..., engine="fast").

The design of gpt-fast's generate.py (pytorch-labs/gpt-fast), on the Hugging Face model's own weights:
  1. `prefill` runs each prompt once and writes its keys and values into every copy's rows of a KV cache allocated
     up front for prompt + max_new_tokens (`KVCache`); nothing is concatenated or reallocated afterwards.
  2. `decode_one_token` is one step: write this token's K and V into the cache in place, attend, sample, and record
     the sampler's log pi(y_t) and entropy H_t. It is one graph for torch.compile(fullgraph=True): on CUDA it runs
     with mode="reduce-overhead" (CUDA graphs: one launch per step, no host sync).
  3. Grouped-query attention without expanding K and V: the G = heads / kv_heads query heads that share a KV head
     become G query rows of that head, so each cached byte is read once. The only mask is one additive (B, 1, 1, S)
     bias per step (0 or -inf: the prompt's left padding and the slots not yet written), shared by every layer.
  4. LoRA: the adapter's fp32 A and B are cast to the model's dtype once per call (`Linear.of`), not at every
     projection of every step as lora.LoRALinear.forward does; the frozen base is never modified.
Sampling is gpt-fast's exponential race, argmax_v p_v / E_v with E_v ~ Exponential(1) i.i.d.: token v wins with
probability exactly p_v, so log p_v is the right importance-weight denominator; it is what torch.multinomial(p, 1)
computes on a CPU, so for the same torch seed the tokens match the Hugging Face reference up to float rounding of
the logits, and unlike multinomial it needs no host sync inside a CUDA graph. Log-probs and entropies are those of
softmax(logits / T) computed in fp32 from the very logits the token was drawn from (as rollout.SamplerLogprobs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import lora
from logprobs import attention_backends

STOP_CHECK_EVERY = 32  # decode steps between checks that every row has stopped (each check is a host sync)
SLOT_MULTIPLE = 64  # cache lengths rounded up to this: fewer distinct shapes, so fewer recompilations


@dataclass
class Linear:
    """x W^T + b + s (x A^T) B^T: an nn.Linear, or a LoRALinear with its active adapter (A, B cast once)."""

    weight: torch.Tensor  # (out, in), the frozen base, never copied
    bias: torch.Tensor | None
    A: torch.Tensor | None = None  # (r, in) in the base's dtype
    B: torch.Tensor | None = None  # (out, r)
    scale: float = 1.0

    @staticmethod
    def of(module, dtype: torch.dtype) -> "Linear":
        if isinstance(module, lora.LoRALinear):
            base, name = module.base_layer, module.active_adapter
            if name is None:
                return Linear(base.weight, base.bias)
            A, B = module.lora_A[name].weight.detach().to(dtype), module.lora_B[name].weight.detach().to(dtype)
            return Linear(base.weight, base.bias, _static(A), _static(B), module.scaling[name])
        return Linear(module.weight, module.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)  # (..., out)
        if self.A is not None:
            y = y + F.linear(F.linear(x, self.A), self.B) * self.scale  # same order as LoRALinear.forward
        return y


@dataclass
class Layer:
    input_norm: torch.nn.Module  # the HF RMSNorm modules, called as they are
    post_norm: torch.nn.Module
    q_norm: torch.nn.Module
    k_norm: torch.nn.Module
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear
    act: torch.nn.Module


@dataclass
class Weights:
    """A Qwen3ForCausalLM's weights as the decode step reads them (references, no copies)."""

    embed: torch.Tensor  # (V, d)
    layers: list[Layer]
    norm: torch.nn.Module
    lm_head: Linear
    rotary: torch.nn.Module  # the HF rotary embedding: (x, positions) -> (cos, sin)
    kv_heads: int
    head_dim: int
    scaling: float


def supports(model) -> str:
    """"" if `model` is a Qwen3 causal LM that this file can run, else why not (rollout falls back to nothing:
    asking for engine="fast" on another architecture is an error)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "qwen3" or not hasattr(model, "lm_head"):
        return f"fast generation supports Qwen3 causal LMs; this is {type(model).__name__}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]):
        return "fast generation does not support sliding-window layers"
    return ""


def weights_of(model) -> Weights:
    reason = supports(model)
    if reason:
        raise ValueError(reason)
    dtype, inner = model.dtype, model.model
    layers = []
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(Layer(layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm,
                            *(Linear.of(m, dtype) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                            mlp.gate_proj, mlp.up_proj, mlp.down_proj)), mlp.act_fn))
    attn = inner.layers[0].self_attn
    return Weights(inner.embed_tokens.weight, layers, inner.norm, Linear.of(model.lm_head, dtype), inner.rotary_emb,
                   model.config.num_key_value_heads, attn.head_dim, attn.scaling)


def _static(t: torch.Tensor) -> torch.Tensor:
    """Tell CUDA graphs that `t` keeps its address between steps, so it is not copied into the graph every replay."""
    if t.is_cuda:
        torch._dynamo.mark_static_address(t)
    return t


class KVCache:
    """Keys and values of every layer, (B, kv_heads, S, head_dim) each, allocated once and written in place."""

    def __init__(self, w: Weights, batch: int, slots: int, dtype: torch.dtype, device):
        shape = (batch, w.kv_heads, slots, w.head_dim)
        self.k = [_static(torch.zeros(shape, dtype=dtype, device=device)) for _ in w.layers]
        self.v = [_static(torch.zeros(shape, dtype=dtype, device=device)) for _ in w.layers]
        self.slot_S = torch.arange(slots, device=device)  # (S,)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _qkv(layer: Layer, w: Weights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Queries (B, H, T, D), keys and values (B, K, T, D) of hidden states x (B, T, d), rotated (as HF Qwen3)."""
    B, T, _ = x.shape
    h = layer.input_norm(x)
    q = layer.q_norm(layer.q(h).view(B, T, -1, w.head_dim)).transpose(1, 2)  # (B, H, T, D)
    k = layer.k_norm(layer.k(h).view(B, T, -1, w.head_dim)).transpose(1, 2)  # (B, K, T, D)
    v = layer.v(h).view(B, T, -1, w.head_dim).transpose(1, 2)  # (B, K, T, D)
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Grouped-query attention without repeating K, V: (B, H, T, D) queries over (B, K, S, D) keys -> (B, T, H D).

    Query head h uses KV head h // G (G = H / K, as HF's repeat_kv); the G heads of one KV head are stacked as
    G T query rows of it. mask (B, 1, T, S): an additive bias, 0 where a query may attend, -inf elsewhere.
    """
    B, H, T, D = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    q = q.reshape(B, K, G * T, D)  # rows (g, t); a view when T == 1
    if T > 1:  # prefill only: the mask's rows follow the queries' (g, t) order
        mask = mask[:, :, None].expand(B, 1, G, T, S).reshape(B, 1, G * T, S)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (B, K, G T, D)
    return out.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)


def _bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attention is allowed, -inf elsewhere: built once per step; a boolean mask would be converted to this
    inside every layer's attention call."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _mlp(layer: Layer, x: torch.Tensor) -> torch.Tensor:
    return layer.down(layer.act(layer.gate(x)) * layer.up(x))


def sample(logits_BV: torch.Tensor, temperature: float):
    """(token, log pi(token), H(pi)), each (B,), for pi = softmax(logits / T) in fp32; token by the exponential race
    argmax_v p_v / E_v, E ~ Exponential(1): P(token = v) = p_v exactly (torch.multinomial(p, 1) on a CPU)."""
    scores = logits_BV.float() / temperature  # (B, V)
    logp = torch.log_softmax(scores, dim=-1)  # (B, V)
    probs = torch.softmax(scores, dim=-1)  # (B, V): what HF generate samples from, bit for bit
    token = (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)  # (B,)
    entropy = torch.special.entr(logp.exp()).sum(-1)  # (B,): entr(0) = 0 where p log p would be nan
    return token, logp.gather(1, token[:, None]).squeeze(1), entropy


def prefill(w: Weights, cache: KVCache, ids_PL: torch.Tensor, start_P: torch.Tensor, copies: int) -> torch.Tensor:
    """Run P left-padded prompts (row p's tokens start at slot start_P[p]) once; write their K, V into the `copies`
    cache rows of each prompt (rows p0, p0, ..., p1, ...). Returns the last position's logits, (P copies, V)."""
    P, L = ids_PL.shape
    slot_L = cache.slot_S[:L]  # (L,)
    positions = (slot_L[None] - start_P[:, None]).clamp(min=0)  # (P, L): as generate's cumsum(mask) - 1
    # A pad query attends to itself only: a row with nothing to attend would give nan, which a cached value carries.
    mask = (slot_L[None, :] <= slot_L[:, None])[None] & (slot_L[None, None, :] >= start_P[:, None, None])
    x = F.embedding(ids_PL, w.embed)  # (P, L, d)
    mask = _bias((mask | torch.eye(L, dtype=torch.bool, device=ids_PL.device))[:, None], x.dtype)  # (P, 1, L, L)
    cos, sin = w.rotary(x, positions)  # (P, L, D)
    for i, layer in enumerate(w.layers):
        q, k, v = _qkv(layer, w, x, cos, sin)
        cache.k[i][:, :, :L] = k.repeat_interleave(copies, dim=0)
        cache.v[i][:, :, :L] = v.repeat_interleave(copies, dim=0)
        x = x + layer.o(_attend(q, k, v, mask, w.scaling))
        x = x + _mlp(layer, layer.post_norm(x))
    logits = w.lm_head(w.norm(x[:, -1]))  # (P, V): the lm_head only where the next token is sampled
    return logits.repeat_interleave(copies, dim=0)  # (B, V)


def decode_one_token(w: Weights, cache: KVCache, token_B: torch.Tensor, slot: torch.Tensor, start_B: torch.Tensor,
                     temperature: float):
    """Feed token_B (B,) at cache slot `slot` (a 0-d tensor), sample the next token: (token, log-prob, entropy)."""
    positions = (slot - start_B)[:, None]  # (B, 1): the token's position within its own row
    x = F.embedding(token_B[:, None], w.embed)  # (B, 1, d)
    mask = _bias(((cache.slot_S >= start_B[:, None]) & (cache.slot_S <= slot))[:, None, None], x.dtype)  # (B,1,1,S)
    cos, sin = w.rotary(x, positions)  # (B, 1, D)
    for i, layer in enumerate(w.layers):
        q, k, v = _qkv(layer, w, x, cos, sin)
        cache.k[i].index_copy_(2, slot.view(1), k)  # in place: the cache is never copied
        cache.v[i].index_copy_(2, slot.view(1), v)
        x = x + layer.o(_attend(q, cache.k[i], cache.v[i], mask, w.scaling))
        x = x + _mlp(layer, layer.post_norm(x))
    return sample(w.lm_head(w.norm(x[:, 0])), temperature)  # (B,) x 3


_COMPILED = {}


def compiled_decode_step():
    """decode_one_token under torch.compile(fullgraph=True), mode="reduce-overhead" (CUDA graphs), built once."""
    if "step" not in _COMPILED:
        _COMPILED["step"] = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    return _COMPILED["step"]


@torch.no_grad()
def sample_micro_batch(model, prompt_ids: list[list[int]], copies: int, max_new_tokens: int, temperature: float,
                       eos_ids: list[int], pad_id: int, compile: bool | None = None):
    """`copies` samples of each prompt: (token ids, log-probs, entropies) per row, rows prompt by prompt, not yet
    cut at EOS (rollout.generate cuts them): the contract of rollout._sample_micro_batch. compile: None means
    on CUDA only (torch.compile on a CPU costs more than it saves at the tiny model's size)."""
    device = model.device
    w = weights_of(model)
    P, L = len(prompt_ids), max(len(ids) for ids in prompt_ids)
    ids_PL = torch.full((P, L), pad_id, dtype=torch.long)  # (P, L) left-padded
    for p, ids in enumerate(prompt_ids):
        ids_PL[p, L - len(ids):] = torch.tensor(ids, dtype=torch.long)
    start_P = torch.tensor([L - len(ids) for ids in prompt_ids], device=device)  # (P,) first real slot
    B, slots = P * copies, -(-(L + max_new_tokens) // SLOT_MULTIPLE) * SLOT_MULTIPLE
    cache = KVCache(w, B, slots, model.dtype, device)
    start_B = start_P.repeat_interleave(copies)  # (B,)
    step = compiled_decode_step() if (device.type == "cuda" if compile is None else compile) else decode_one_token
    tokens, logprobs, entropies = (torch.empty((B, max_new_tokens), dtype=dt, device=device)
                                   for dt in (torch.long, torch.float32, torch.float32))
    eos = torch.tensor(eos_ids, device=device)
    with attention_backends():  # no cuDNN attention: it crashes on H100s (issue 18)
        token, logprob, entropy = sample(prefill(w, cache, ids_PL.to(device), start_P, copies), temperature)
        slot = torch.tensor(L, device=device)  # the slot of the token fed to the next step
        done = torch.zeros(B, dtype=torch.bool, device=device)
        steps = max_new_tokens
        for t in range(max_new_tokens):
            tokens[:, t], logprobs[:, t], entropies[:, t] = token, logprob, entropy
            done |= torch.isin(token, eos)
            if t + 1 == max_new_tokens or ((t + 1) % STOP_CHECK_EVERY == 0 and bool(done.all())):
                steps = t + 1
                break
            if step is not decode_one_token:
                torch.compiler.cudagraph_mark_step_begin()  # this step's outputs were copied above
            token, logprob, entropy = (a.clone() for a in step(w, cache, token, slot, start_B, temperature))
            slot += 1
    return tokens[:, :steps].tolist(), logprobs[:, :steps].tolist(), entropies[:, :steps].tolist()
