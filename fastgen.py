"""Fast sampling y ~ softmax(logits / T) for Qwen3 policies: rollout.generate(..., engine="fast").

gpt-fast's design (a prefill, then one small `decode_one_token` over a KV cache allocated up front, sampling inside
the step) with cascade attention (attention.py) for SPIRAL's calls, where every prompt is sampled several times
(N1 copies of a search prompt, N2 copies of an aggregation prompt):
  1. The KV cache is split in two. The *prefix* holds each prompt's keys and values once, in chunks of C slots
     (P, n_chunks, kv_heads, C, head_dim); the *suffix* holds each row's own sampled tokens (B, kv_heads, T, head_dim).
     A decode step attends to the prefix with the queries of all copies of a prompt as rows of one attention call,
     to each row's suffix up to its filled length (rounded up to SUFFIX_BUCKET), and merges the parts by their
     log-sum-exp. Each cached byte is read once per step; nothing is copied per copy.
  2. `prefill` runs the prompts with plain causal attention, right-padded in groups of at most PREFILL_TOKENS:
     no (L, L) mask is ever built, so flash attention applies on a GPU, and pads sit after the real tokens, where
     no real query sees them (the decode step masks them by length).
  3. Grouped-query attention without expanding K and V: the G = heads / kv_heads query heads of a KV head are G
     query rows of it (times the copies, in the prefix).
  4. Everything a step reads persists across generate calls (`Engine`): one flat KV arena, grown only when a call
     needs more; the LoRA adapter copied into fixed bf16 buffers at each call (so after each optimizer step); and
     on CUDA one captured CUDA graph per (call shape, suffix bucket), replayed at every step: one launch per step,
     no host sync but a stop check every STOP_CHECK_EVERY steps. At most MAX_CALL_SHAPES call shapes are kept, so
     at most MAX_CALL_SHAPES x ceil(max_new_tokens / SUFFIX_BUCKET) graphs live. Graphs are captured from the
     step as written, its elementwise chains compiled with dynamic shapes (`_fused`: one compilation serves every
     call shape); the whole step is not torch.compile'd, which would recompile for each new call shape (train.py
     meets a new one at most steps) and guard on the cache's views. It still traces into one graph (tests).
Sampling is gpt-fast's exponential race, argmax_v p_v / E_v with E_v ~ Exponential(1) i.i.d.: token v wins with
probability exactly p_v, and it is what torch.multinomial(p, 1) computes on a CPU. On a CPU the stop check runs at
every step, as Hugging Face `generate` stops, so both engines consume the torch random stream identically: for the
same seed and the same micro-batches they return the same tokens (up to float rounding of the logits). Log-probs
and entropies are those of softmax(logits / T) in fp32 from the logits the token was drawn from.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import lora
from attention import MASKED, attend, merge
from logprobs import attention_backends

PREFIX_CHUNK = 1024  # at most this many prefix slots per chunk: chunks are attended in parallel (split-KV), merged
SLOT_MULTIPLE = 64  # a chunk's length is rounded up to this (the kernels' alignment; fewer distinct shapes)
SUFFIX_BUCKET = 256  # a decode step attends to the suffix up to its filled length rounded up to this
PREFILL_TOKENS = 16_384  # padded prompt tokens per prefill forward (activation memory)
STOP_CHECK_EVERY = 32  # CUDA: decode steps between checks that every row has stopped (each check is a host sync)
MAX_CALL_SHAPES = 4  # call shapes whose state and CUDA graphs are kept (search and aggregation alternate in train.py)


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def _round_up(n: int, multiple: int) -> int:
    return _ceil_div(n, multiple) * multiple


# ----------------------------------------------------------------------------------------------------------------------
# The model's weights as the decode step reads them (references to the HF model's tensors, no copies)


@dataclass
class Linear:
    """x W^T + b + s (x A^T) B^T: an nn.Linear, or a LoRALinear with its active adapter (A, B: persistent buffers
    in the base's dtype, refreshed by `Engine.weights` at each call)."""

    weight: torch.Tensor  # (out, in), the frozen base
    bias: torch.Tensor | None
    A: torch.Tensor | None = None  # (r, in)
    B: torch.Tensor | None = None  # (out, r)
    scale: float = 1.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)  # (..., out)
        if self.A is None:
            return y
        x_2d, y_2d = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        # One kernel for y + s (xA^T) B^T (fp32 accumulation, one rounding); LoRALinear rounds three times.
        return torch.addmm(y_2d, F.linear(x_2d, self.A), self.B.t(), alpha=self.scale).view(y.shape)


@dataclass
class Layer:
    input_norm: torch.nn.Module  # the HF RMSNorm modules (their weight and eps)
    post_norm: torch.nn.Module
    q_norm: torch.nn.Module
    k_norm: torch.nn.Module
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
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


def supports(model) -> str:
    """"" if `model` is a Qwen3 causal LM that this file can run, else why not (rollout.generate raises it)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "qwen3" or not hasattr(model, "lm_head"):
        return f"fast generation supports Qwen3 causal LMs; this is {type(model).__name__}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]):
        return "fast generation does not support sliding-window layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"fast generation supports SiLU MLPs; this one uses {config.hidden_act}"
    return ""


# ----------------------------------------------------------------------------------------------------------------------
# The cache of one call, and the per-call inputs a decode step reads (fixed buffers: a CUDA graph reads them)


@dataclass(frozen=True)
class CallShape:
    """P prompts x `copies` rows each (B = P copies), prompts padded to n_chunks x chunk prefix slots, T suffix
    slots per row (max_new_tokens rounded up to SUFFIX_BUCKET)."""

    P: int
    copies: int
    n_chunks: int
    chunk: int
    T: int

    @staticmethod
    def of(prompt_lengths: list[int], copies: int, max_new_tokens: int) -> "CallShape":
        L = max(prompt_lengths)
        n_chunks = _ceil_div(L, PREFIX_CHUNK)
        chunk = _round_up(_ceil_div(L, n_chunks), SLOT_MULTIPLE)  # equal chunks: at most SLOT_MULTIPLE - 1 pads each
        return CallShape(len(prompt_lengths), copies, n_chunks, chunk, _round_up(max_new_tokens, SUFFIX_BUCKET))

    @property
    def B(self) -> int:
        return self.P * self.copies

    def cache_tokens(self) -> int:
        """KV-cache slots of the call: each prompt once, each row's suffix once."""
        return self.P * self.n_chunks * self.chunk + self.B * self.T


class KVCache:
    """Views into the engine's arena, per layer: prefix K, V (P, n_chunks, kv_heads, chunk, D), suffix K, V
    (B, kv_heads, T, D)."""

    def __init__(self, arena: torch.Tensor, layers: int, shape: CallShape, kv_heads: int, head_dim: int):
        s, offset = shape, 0

        def take(*dims):
            nonlocal offset
            count = torch.Size(dims).numel()
            offset += count
            return arena[offset - count: offset].view(dims)

        self.prefix_k = [take(s.P, s.n_chunks, kv_heads, s.chunk, head_dim) for _ in range(layers)]
        self.prefix_v = [take(s.P, s.n_chunks, kv_heads, s.chunk, head_dim) for _ in range(layers)]
        self.suffix_k = [take(s.B, kv_heads, s.T, head_dim) for _ in range(layers)]
        self.suffix_v = [take(s.B, kv_heads, s.T, head_dim) for _ in range(layers)]

    @staticmethod
    def elements(layers: int, shape: CallShape, kv_heads: int, head_dim: int) -> int:
        return 2 * layers * shape.cache_tokens() * kv_heads * head_dim


class CallState:
    """What a decode step reads and writes besides the cache, in buffers that keep their addresses between calls of
    one shape: the sampled tokens (column t is fed, column t + 1 written), log-probs, entropies, the step t, each
    row's prompt length, the stop flags, the temperature, the EOS ids and the prefix's padding bias."""

    def __init__(self, shape: CallShape, kv_heads: int, eos_count: int, dtype, device):
        B, T = shape.B, shape.T
        self.tokens_BT = torch.zeros((B, T), dtype=torch.long, device=device)
        self.logprobs_BT = torch.zeros((B, T), dtype=torch.float32, device=device)
        self.entropies_BT = torch.zeros((B, T), dtype=torch.float32, device=device)
        self.t = torch.zeros((), dtype=torch.long, device=device)
        self.len_B = torch.zeros(B, dtype=torch.long, device=device)
        self.done_B = torch.zeros(B, dtype=torch.bool, device=device)
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.eos = torch.zeros(eos_count, dtype=torch.long, device=device)
        self.prefix_bias = torch.zeros((shape.P, shape.n_chunks * kv_heads, 1, shape.chunk), dtype=dtype,
                                       device=device)  # 0 for a prompt's slots, MASKED for its padding
        self.slot_T = torch.arange(T, device=device)  # (T,)

    def start(self, shape: CallShape, lengths_P: list[int], temperature: float, eos_ids: list[int], kv_heads: int):
        """Load one call's values into the fixed buffers."""
        len_P = torch.tensor(lengths_P, device=self.len_B.device)  # (P,)
        self.len_B.copy_(len_P.repeat_interleave(shape.copies))
        slot = torch.arange(shape.n_chunks * shape.chunk, device=len_P.device)  # (n_chunks chunk,)
        bias = torch.where(slot[None] < len_P[:, None], 0.0, MASKED).view(shape.P, shape.n_chunks, 1, shape.chunk)
        self.prefix_bias.copy_(bias.expand(-1, -1, kv_heads, -1).reshape(self.prefix_bias.shape))
        self.t.zero_()
        self.done_B.zero_()
        self.temperature.fill_(temperature)
        self.eos.copy_(torch.tensor(eos_ids))

    def record(self, column: torch.Tensor, token_B, logprob_B, entropy_B) -> None:
        """Write one sampled column (`column`: a (1,) index) of tokens, log-probs and entropies; a row that sampled
        an EOS is done. The prefill's sample and every decode step's write through here."""
        for buffer, value in ((self.tokens_BT, token_B), (self.logprobs_BT, logprob_B), (self.entropies_BT, entropy_B)):
            buffer.index_copy_(1, column, value[:, None])
        self.done_B.logical_or_(torch.isin(token_B, self.eos))

    def suffix_bias(self, suffix_len: int, dtype) -> torch.Tensor:
        """(suffix_len,): 0 on the suffix slots filled so far (0..t, the fed token's included), MASKED after."""
        return torch.where(self.slot_T[:suffix_len] <= self.t, 0.0, MASKED).to(dtype)


# ----------------------------------------------------------------------------------------------------------------------
# The model's computation (Qwen3, as transformers computes it)


FUSE = True  # compile the elementwise chains below (`_fused`) on these devices, with this torch.compile backend
FUSE_DEVICES, FUSE_BACKEND = ("cuda",), "inductor"  # (tests count dynamo's compilations on a CPU with another backend)


def _fused(fn):
    """fn, and on CUDA torch.compile(fn): one generated kernel for a chain of elementwise ops (a decode step is
    thousands of tiny kernels; fusing them is most of what torch.compile would gain). Shapes are dynamic, so one
    compilation serves every call shape; if compiling fails, fn runs as it is."""
    state = {"compiled": None, "ok": True}

    def run(*args):
        if FUSE and state["ok"] and args[0].device.type in FUSE_DEVICES:
            if state["compiled"] is None:
                state["compiled"] = torch.compile(fn, dynamic=True, fullgraph=True, backend=FUSE_BACKEND)
            try:
                return state["compiled"](*args)
            except Exception as e:  # noqa: BLE001 (a compiler failure must not stop sampling)
                state["ok"] = False
                print(f"fastgen: torch.compile failed ({type(e).__name__}); running {fn.__name__} eagerly")
        return fn(*args)

    run.eager, run.state = fn, state
    return run


@_fused
def _rms_norm_fn(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor, fuse: bool = False) -> torch.Tensor:
    """Qwen3RMSNorm: w * (x / sqrt(mean(x^2) + eps)) in fp32, rounded to x's dtype before the weight."""
    return (_rms_norm_fn if fuse else _rms_norm_fn.eager)(x, norm.weight, norm.variance_epsilon)


@_fused
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@_fused
def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


_merge = _fused(merge)


def _qkv(layer: Layer, w: Weights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fuse: bool = False):
    """Queries (N, H, T, D), keys and values (N, K, T, D) of hidden states x (N, T, d), rotated (as HF Qwen3).
    fuse: the decode step's compiled elementwise chains (the prefill's shapes vary too much to compile)."""
    N, T, _ = x.shape
    h = _rms_norm(layer.input_norm, x, fuse)
    q = _rms_norm(layer.q_norm, layer.q(h).view(N, T, -1, w.head_dim), fuse).transpose(1, 2)  # (N, H, T, D)
    k = _rms_norm(layer.k_norm, layer.k(h).view(N, T, -1, w.head_dim), fuse).transpose(1, 2)  # (N, K, T, D)
    v = layer.v(h).view(N, T, -1, w.head_dim).transpose(1, 2)  # (N, K, T, D)
    cos, sin = cos[:, None], sin[:, None]  # (N, 1, T, D)
    rotate = _rotate if fuse else _rotate.eager
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def _mlp(layer: Layer, x: torch.Tensor, fuse: bool = False) -> torch.Tensor:
    silu_mul = _silu_mul if fuse else _silu_mul.eager  # Qwen3's act is SiLU (`supports` checks)
    return layer.down(silu_mul(layer.gate(x), layer.up(x)))


def sample(logits_BV: torch.Tensor, temperature):
    """(token, log pi(token), H(pi)), each (B,), for pi = softmax(logits / T) in fp32; token by the exponential race
    argmax_v p_v / E_v, E ~ Exponential(1): P(token = v) = p_v exactly (torch.multinomial(p, 1) on a CPU)."""
    scores = logits_BV.float() / temperature  # (B, V)
    logp = torch.log_softmax(scores, dim=-1)  # (B, V)
    probs = torch.softmax(scores, dim=-1)  # (B, V): what HF generate samples from, bit for bit
    token = (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)  # (B,)
    entropy = torch.special.entr(logp.exp()).sum(-1)  # (B,): entr(0) = 0 where p log p would be nan
    return token, logp.gather(1, token[:, None]).squeeze(1), entropy


def prefill(w: Weights, cache: KVCache, prompt_ids: list[list[int]], shape: CallShape, pad_id: int) -> torch.Tensor:
    """Run each prompt once (right-padded groups, causal attention, no mask tensor) and write its K, V into its
    prefix slots. Returns the logits at each prompt's last token, (P, V)."""
    device, logits = w.embed.device, []
    group_size = max(1, PREFILL_TOKENS // (shape.n_chunks * shape.chunk))
    for p0 in range(0, len(prompt_ids), group_size):
        group = prompt_ids[p0: p0 + group_size]
        L = max(len(ids) for ids in group)
        ids = torch.tensor([ids + [pad_id] * (L - len(ids)) for ids in group], device=device)  # (g, L) right-padded
        x = F.embedding(ids, w.embed)  # (g, L, d)
        cos, sin = w.rotary(x, torch.arange(L, device=device)[None].expand(len(group), L))  # (g, L, D)
        pad = shape.n_chunks * shape.chunk - L  # the prefix's slots past the longest prompt
        for i, layer in enumerate(w.layers):
            q, k, v = _qkv(layer, w, x, cos, sin)
            for store, kv in ((cache.prefix_k[i], k), (cache.prefix_v[i], v)):  # (g, K, L, D) -> chunked slots
                g, K, _, D = kv.shape
                chunks = F.pad(kv, (0, 0, 0, pad)).view(g, K, shape.n_chunks, shape.chunk, D).transpose(1, 2)
                store[p0: p0 + g].copy_(chunks)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=w.scaling, enable_gqa=True)
            x = x + layer.o(attn.transpose(1, 2).reshape(len(group), L, -1))  # (g, L, d)
            x = x + _mlp(layer, _rms_norm(layer.post_norm, x))
        last = torch.tensor([len(ids) - 1 for ids in group], device=device)  # (g,)
        logits.append(w.lm_head(_rms_norm(w.norm, x[torch.arange(len(group), device=device), last])))  # (g, V)
    return torch.cat(logits)  # (P, V)


def cascade_attention(q: torch.Tensor, cache: KVCache, i: int, s: CallState, shape: CallShape, suffix_len: int,
                      suffix_bias: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step's attention of queries q (B, H, 1, D): the prompt prefix, chunk by chunk, for all copies of
    a prompt at once, plus each row's own suffix up to suffix_len slots; the parts merged by log-sum-exp
    (attention.merge). Returns (B, 1, H D)."""
    P, copies, n, B = shape.P, shape.copies, shape.n_chunks, shape.B
    K, D = cache.suffix_k[i].shape[1], q.shape[-1]
    G = q.shape[1] // K
    q_PKMD = q.view(P, copies, K, G, D).transpose(1, 2).reshape(P, 1, K, copies * G, D)  # rows (copy, g) of a head
    q_prefix = q_PKMD.expand(P, n, K, copies * G, D).reshape(P, n * K, copies * G, D)  # the same rows per chunk
    k_prefix, v_prefix = (c[i].view(P, n * K, shape.chunk, D) for c in (cache.prefix_k, cache.prefix_v))
    out, lse = attend(q_prefix, k_prefix, v_prefix, s.prefix_bias, scale)  # (P, n K, copies G, D), (P, n K, copies G)
    out = out.view(P, n, K, copies, G, D).permute(0, 3, 1, 2, 4, 5).reshape(B, n, K, G, D)  # back to rows
    lse = lse.view(P, n, K, copies, G).permute(0, 3, 1, 2, 4).reshape(B, n, K, G)
    out_s, lse_s = attend(q.view(B, K, G, D), cache.suffix_k[i][:, :, :suffix_len],
                          cache.suffix_v[i][:, :, :suffix_len], suffix_bias, scale)  # (B, K, G, D), (B, K, G)
    out, _ = _merge(torch.cat([out, out_s[:, None]], 1), torch.cat([lse, lse_s[:, None]], 1), 1)  # (B, K, G, D)
    return out.reshape(B, 1, K * G * D)


def decode_one_token(w: Weights, cache: KVCache, s: CallState, shape: CallShape, suffix_len: int) -> None:
    """Feed token column s.t of every row at suffix slot s.t, sample column s.t + 1 (token, log-prob, entropy),
    update the stop flags, advance s.t. Reads and writes only fixed buffers: one CUDA graph per suffix_len."""
    t = s.t.view(1)
    token_B = s.tokens_BT.index_select(1, t)  # (B, 1)
    x = F.embedding(token_B, w.embed)  # (B, 1, d)
    cos, sin = w.rotary(x, (s.len_B + s.t)[:, None])  # (B, 1, D): the token's position within its row
    suffix_bias = s.suffix_bias(suffix_len, x.dtype)  # (S,)
    for i, layer in enumerate(w.layers):
        q, k, v = _qkv(layer, w, x, cos, sin, fuse=True)
        cache.suffix_k[i].index_copy_(2, t, k)  # in place: the cache is never copied
        cache.suffix_v[i].index_copy_(2, t, v)
        x = x + layer.o(cascade_attention(q, cache, i, s, shape, suffix_len, suffix_bias, w.scaling))
        x = x + _mlp(layer, _rms_norm(layer.post_norm, x, fuse=True), fuse=True)
    token, logprob, entropy = sample(w.lm_head(_rms_norm(w.norm, x[:, 0], fuse=True)), s.temperature)  # (B,) x 3
    s.record(t + 1, token, logprob, entropy)
    s.t.add_(1)


# ----------------------------------------------------------------------------------------------------------------------
# What persists across calls: the KV arena, the adapter's buffers, per call shape its state and CUDA graphs


class Engine:
    """The persistent side of fastgen for one model (`engine_for`): see the module docstring, point 4."""

    def __init__(self, model):
        self.model = weakref.ref(model)
        self.device, self.dtype = model.device, model.dtype
        self.embed_ptr = model.model.embed_tokens.weight.data_ptr()
        self.arena = torch.zeros(0, dtype=self.dtype, device=self.device)
        self.adapters: dict = {}  # (module id, adapter name) -> (A, B) buffers in the model's dtype
        self.calls: OrderedDict = OrderedDict()  # key -> [KVCache, CallState, {suffix_len: CUDAGraph}]
        self.graph_pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.captures, self.capture_seconds = 0, 0.0  # CUDA graphs captured so far (a warm-up step plus a capture each)

    def matches(self, model) -> bool:
        return (self.model() is model and model.device == self.device and model.dtype == self.dtype
                and model.model.embed_tokens.weight.data_ptr() == self.embed_ptr)

    def linear(self, module) -> Linear:
        if not isinstance(module, lora.LoRALinear):
            return Linear(module.weight, module.bias)
        base, name = module.base_layer, module.active_adapter
        if name is None:
            return Linear(base.weight, base.bias)
        A, B = module.lora_A[name].weight, module.lora_B[name].weight  # fp32 masters (r, in), (out, r)
        key = (id(module), name)
        if key not in self.adapters or self.adapters[key][0].shape != A.shape:
            self.adapters[key] = (torch.empty(A.shape, dtype=self.dtype, device=self.device),
                                  torch.empty(B.shape, dtype=self.dtype, device=self.device))
        A_buffer, B_buffer = self.adapters[key]
        A_buffer.copy_(A.detach())  # in place, cast: the addresses a captured graph reads stay the same
        B_buffer.copy_(B.detach())
        return Linear(base.weight, base.bias, A_buffer, B_buffer, module.scaling[name])

    def weights(self, model) -> Weights:
        """The model's weights as the step reads them, the active adapter copied into its buffers."""
        inner, layers = model.model, []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(Layer(layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm,
                                *(self.linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                           mlp.gate_proj, mlp.up_proj, mlp.down_proj))))
        attn = inner.layers[0].self_attn
        return Weights(inner.embed_tokens.weight, layers, inner.norm, self.linear(model.lm_head), inner.rotary_emb,
                       model.config.num_key_value_heads, attn.head_dim, attn.scaling)

    def call(self, w: Weights, shape: CallShape, eos_count: int, adapters: tuple):
        """The cache and state of a call of this shape: reused (with its graphs) if seen among the last
        MAX_CALL_SHAPES shapes and the arena has not moved; the arena grows if the call needs more."""
        need = KVCache.elements(len(w.layers), shape, w.kv_heads, w.head_dim)
        if need > self.arena.numel():
            self.calls.clear()  # every view and graph points into the old arena
            if self.graph_pool is not None:  # no graph holds the old pool now: CUDA frees it, so start a new one
                self.graph_pool = torch.cuda.graph_pool_handle()
            self.arena = None  # free it before allocating the larger one
            self.arena = torch.zeros(_round_up(need, 1 << 20), dtype=self.dtype, device=self.device)
        key = (shape, eos_count, adapters)
        if key not in self.calls:
            cache = KVCache(self.arena, len(w.layers), shape, w.kv_heads, w.head_dim)
            self.calls[key] = [cache, CallState(shape, w.kv_heads, eos_count, self.dtype, self.device), {}]
            while len(self.calls) > MAX_CALL_SHAPES:
                self.calls.popitem(last=False)
        self.calls.move_to_end(key)
        return self.calls[key]

    def step(self, w: Weights, call, shape: CallShape, suffix_len: int) -> None:
        """One decode step: eager on a CPU; on CUDA the replay of this suffix bucket's graph, captured on first use
        (the warm-up before the capture is the real step, run on a side stream as CUDA graphs require)."""
        cache, state, graphs = call
        if self.graph_pool is None:  # eager; count the graphs a CUDA device would capture
            self.captures += suffix_len not in graphs
            graphs[suffix_len] = None
            return decode_one_token(w, cache, state, shape, suffix_len)
        if suffix_len in graphs:
            return graphs[suffix_len].replay()
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            decode_one_token(w, cache, state, shape, suffix_len)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            decode_one_token(w, cache, state, shape, suffix_len)  # recorded, not run
        graphs[suffix_len] = graph
        torch.cuda.synchronize()
        self.captures += 1
        self.capture_seconds += time.perf_counter() - t0


_ENGINE: list[Engine] = []  # at most one: the last model sampled from


def engine_for(model) -> Engine:
    if not (_ENGINE and _ENGINE[0].matches(model)):
        release()
        _ENGINE.append(Engine(model))
    return _ENGINE[0]


def release() -> None:
    """Drop the arena, the adapter buffers and the graphs (train.py calls it before the learner needs the memory)."""
    _ENGINE.clear()


def held_bytes(device) -> int:
    """Bytes of KV arena held for reuse on `device` (rollout's memory budget counts them as free)."""
    if _ENGINE and _ENGINE[0].device == torch.device(device):
        return _ENGINE[0].arena.numel() * _ENGINE[0].arena.element_size()
    return 0


def rows_per_call(budget_tokens: int, longest_prompt: int, samples_per_prompt: int, max_new_tokens: int) -> int:
    """Sequences per call (rollout's micro_batch_size) whose cache fits budget_tokens: a prompt costs its prefix
    once plus `copies` suffixes (CallShape.cache_tokens)."""
    shape = CallShape.of([longest_prompt], samples_per_prompt, max_new_tokens)
    prompts = budget_tokens // shape.cache_tokens()
    if prompts >= 1:
        return prompts * samples_per_prompt
    return max(1, (budget_tokens - shape.n_chunks * shape.chunk) // shape.T)  # one prompt, fewer copies per call


@torch.no_grad()
def sample_micro_batch(model, prompt_ids: list[list[int]], copies: int, max_new_tokens: int, temperature: float,
                       eos_ids: list[int], pad_id: int):
    """`copies` samples of each prompt: (token ids, log-probs, entropies) per row, rows prompt by prompt, not yet
    cut at EOS (rollout.generate cuts them): the contract of rollout._sample_micro_batch."""
    reason = supports(model)
    if reason:
        raise ValueError(reason)
    engine = engine_for(model)
    w = engine.weights(model)
    shape = CallShape.of([len(ids) for ids in prompt_ids], copies, max_new_tokens)
    adapters = tuple(sorted({str(m.active_adapter) for _, m in lora.lora_modules(model)}))
    call = engine.call(w, shape, len(eos_ids), adapters)
    s = call[1]
    s.start(shape, [len(ids) for ids in prompt_ids], temperature, eos_ids, w.kv_heads)
    check_every = 1 if engine.graph_pool is None else STOP_CHECK_EVERY  # a CPU stops when HF generate does
    with attention_backends():  # no cuDNN attention: it crashes on H100s (issue 18)
        logits = prefill(w, call[0], prompt_ids, shape, pad_id).repeat_interleave(copies, dim=0)  # (B, V)
        s.record(s.t.view(1), *sample(logits, s.temperature))  # column 0 (s.t is 0)
        steps = 1  # columns sampled so far
        while steps < max_new_tokens and not (steps % check_every == 0 and bool(s.done_B.all())):
            engine.step(w, call, shape, _round_up(steps, SUFFIX_BUCKET))  # feeds column steps - 1
            steps += 1
    return (s.tokens_BT[:, :steps].tolist(), s.logprobs_BT[:, :steps].tolist(), s.entropies_BT[:, :steps].tolist())


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (cli.library_main: an import cycle)
    print(__doc__)
