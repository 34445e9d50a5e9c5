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
  4. The weights are the HF model's own tensors and LoRA adapters in persistent buffers (fastgen_weights.py), the A
     matmuls of projections that read one input stacked into one (x [A_q; A_k; A_v]^T; gate, up likewise).
  5. What persists (`Engine`, one per model; sampling another model or `reset()` drops it all):
     - until `release()` (train.py's, after each collection: the learner needs the memory): the KV arena, grown (the
       old one freed first) when a call needs more. No stale value reaches a call, whatever the arena holds: the
       prefill writes every prefix slot and the suffix is cleared at the call's start (a NaN behind a mask would
       still poison its row: 0 x NaN = NaN).
     - across releases: the adapter buffers (A stacked, B, in the model's dtype; refreshed from the fp32 masters at
       each call, re-made when a rank changes) and, per call key, the call's state buffers and on CUDA its graphs,
       one per suffix bucket (one launch per step, no host sync but a stop check every STOP_CHECK_EVERY steps). The
       key is the call shape, the EOS count, the arena's address and `Weights.signature` (the address and shape of
       every tensor a graph reads, LoRA ranks and buffers included, and the LoRA scales it bakes in): a graph is
       replayed only where all it reads sits where it sat at capture, e.g. when the arena comes back after the
       learner at the address it had. At most MAX_CALL_SHAPES keys are kept, the least recently used dropped.
     Graphs are captured from the step as written, its elementwise chains compiled with dynamic shapes (`_fused`: one
     compilation serves every call shape); the whole step is not torch.compile'd, which would recompile for each new
     call shape (train.py meets a new one at most steps) and guard on the cache's views. It still traces into one
     graph (tests).
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
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attention import MASKED, attend, merge
from fastgen_weights import AdapterBuffers, Layer, Weights, supports  # noqa: F401 (supports: rollout's, train's)
from logprobs import attention_backends

PREFIX_CHUNK = 1024  # at most this many prefix slots per chunk: chunks are attended in parallel (split-KV), merged
SLOT_MULTIPLE = 64  # a chunk's length is rounded up to this (the kernels' alignment; fewer distinct shapes)
SUFFIX_BUCKET = 256  # a decode step attends to the suffix up to its filled length rounded up to this
PREFILL_TOKENS = 16_384  # padded prompt tokens per prefill forward (activation memory)
STOP_CHECK_EVERY = 32  # CUDA: decode steps between checks that every row has stopped (each check is a host sync)
MAX_CALL_SHAPES = 4  # call keys whose state and CUDA graphs are kept (search and aggregation alternate in train.py)


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def _round_up(n: int, multiple: int) -> int:
    return _ceil_div(n, multiple) * multiple


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
        start = offset
        self.suffix_k = [take(s.B, kv_heads, s.T, head_dim) for _ in range(layers)]
        self.suffix_v = [take(s.B, kv_heads, s.T, head_dim) for _ in range(layers)]
        self.suffix = arena[start: offset]  # every layer's suffix K and V, one flat view (`clear_suffix`)

    def clear_suffix(self) -> None:
        """Zero the suffix slots: a decode step reads a bucket's slots past the fed token too, masked by a bias, and
        a stale NaN there would still poison the row (0 x NaN = NaN; on CUDA NaN + bias is NaN). The prefill writes
        every prefix slot, so after this no slot a call reads holds anything from an earlier call."""
        self.suffix.zero_()

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
    q, k, v = layer.qkv(_rms_norm(layer.input_norm, x, fuse))  # (N, T, H D), (N, T, K D) x 2
    q = _rms_norm(layer.q_norm, q.view(N, T, -1, w.head_dim), fuse).transpose(1, 2)  # (N, H, T, D)
    k = _rms_norm(layer.k_norm, k.view(N, T, -1, w.head_dim), fuse).transpose(1, 2)  # (N, K, T, D)
    v = v.view(N, T, -1, w.head_dim).transpose(1, 2)  # (N, K, T, D)
    cos, sin = cos[:, None], sin[:, None]  # (N, 1, T, D)
    rotate = _rotate if fuse else _rotate.eager
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def _mlp(layer: Layer, x: torch.Tensor, fuse: bool = False) -> torch.Tensor:
    silu_mul = _silu_mul if fuse else _silu_mul.eager  # Qwen3's act is SiLU (`supports` checks)
    return layer.down(silu_mul(*layer.gate_up(x)))


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
# What persists across calls: the adapter buffers, per call key its state and CUDA graphs; the KV arena until release


def _new_arena(elements: int, dtype, device) -> torch.Tensor:
    """The KV arena, uninitialised: every slot a call reads is written first (KVCache.clear_suffix)."""
    return torch.empty(elements, dtype=dtype, device=device)


class Call(NamedTuple):
    cache: KVCache  # views of the current arena (made at each call: none is kept, so a freed arena is freed)
    state: CallState
    graphs: dict  # {suffix_len: CUDAGraph} (on a CPU: None for each bucket a CUDA device would capture)


class Engine:
    """The persistent side of fastgen for one model (`engine_for`): see the module docstring, point 5."""

    def __init__(self, model):
        self.model = weakref.ref(model)
        self.device, self.dtype = model.device, model.dtype
        self.cuda = self.device.type == "cuda"
        self.embed_ptr = model.model.embed_tokens.weight.data_ptr()
        self.arena: torch.Tensor | None = None  # allocated by a call, freed by release()
        self.adapters = AdapterBuffers(self.dtype, self.device)
        self.calls: OrderedDict = OrderedDict()  # key (`call`) -> (CallState, {suffix_len: CUDAGraph})
        self.graph_pool = None  # made at the first capture with no graph alive (CUDA frees a pool with its graphs)
        self.captures, self.capture_seconds = 0, 0.0  # CUDA graphs captured so far (a warm-up step plus a capture each)

    def matches(self, model) -> bool:
        return (self.model() is model and model.device == self.device and model.dtype == self.dtype
                and model.model.embed_tokens.weight.data_ptr() == self.embed_ptr)

    def weights(self, model) -> Weights:
        """The model's weights as the step reads them, the active adapters copied into their buffers."""
        return self.adapters.weights(model)

    def call(self, w: Weights, shape: CallShape, eos_count: int) -> Call:
        """The cache, state and graphs of a call of this shape: the state and graphs reused if the key (module
        docstring, point 5) is among the last MAX_CALL_SHAPES seen; the arena allocated or grown if needed."""
        need = KVCache.elements(len(w.layers), shape, w.kv_heads, w.head_dim)
        if self.arena is None or need > self.arena.numel():
            self.arena = None  # free the old arena before allocating the larger one
            self.arena = _new_arena(_round_up(need, 1 << 20), self.dtype, self.device)
        key = (shape, eos_count, self.arena.data_ptr(), w.signature())
        if key not in self.calls:
            self.calls[key] = (CallState(shape, w.kv_heads, eos_count, self.dtype, self.device), {})
            while len(self.calls) > MAX_CALL_SHAPES:
                self.calls.popitem(last=False)  # the least recently used
        self.calls.move_to_end(key)
        return Call(KVCache(self.arena, len(w.layers), shape, w.kv_heads, w.head_dim), *self.calls[key])

    def step(self, w: Weights, call: Call, shape: CallShape, suffix_len: int) -> None:
        """One decode step: eager on a CPU; on CUDA the replay of this suffix bucket's graph, captured on first use
        (the warm-up before the capture is the real step, run on a side stream as CUDA graphs require)."""
        cache, state, graphs = call
        if not self.cuda:  # eager; count the graphs a CUDA device would capture
            self.captures += suffix_len not in graphs
            graphs[suffix_len] = None
            return decode_one_token(w, cache, state, shape, suffix_len)
        if suffix_len in graphs:
            return graphs[suffix_len].replay()
        t0 = time.perf_counter()
        if not any(kept for _, kept in self.calls.values()):  # no graph alive: CUDA freed their pool with them
            self.graph_pool = torch.cuda.graph_pool_handle()
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
        reset()
        _ENGINE.append(Engine(model))
    return _ENGINE[0]


def release() -> None:
    """Free the KV arena (train.py, after each collection: the learner needs the memory). The adapter buffers, the
    call states and the CUDA graphs (their pool: the decode step's intermediates) stay for the next collection."""
    if _ENGINE:
        _ENGINE[0].arena = None


def reset() -> None:
    """Drop the engine: the arena, the adapter buffers, the call states and every CUDA graph."""
    _ENGINE.clear()


def held_bytes(device) -> int:
    """Bytes of KV arena held for reuse on `device` (rollout's memory budget counts them as free)."""
    if _ENGINE and _ENGINE[0].device == torch.device(device) and _ENGINE[0].arena is not None:
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
    call = engine.call(w, shape, len(eos_ids))
    s = call.state
    s.start(shape, [len(ids) for ids in prompt_ids], temperature, eos_ids, w.kv_heads)
    call.cache.clear_suffix()
    check_every = STOP_CHECK_EVERY if engine.cuda else 1  # a CPU stops when HF generate does
    with attention_backends():  # no cuDNN attention: it crashes on H100s
        logits = prefill(w, call.cache, prompt_ids, shape, pad_id).repeat_interleave(copies, dim=0)  # (B, V)
        s.record(s.t.view(1), *sample(logits, s.temperature))  # column 0 (s.t is 0)
        steps = 1  # columns sampled so far
        while steps < max_new_tokens and not (steps % check_every == 0 and bool(s.done_B.all())):
            engine.step(w, call, shape, _round_up(steps, SUFFIX_BUCKET))  # feeds column steps - 1
            steps += 1
    return (s.tokens_BT[:, :steps].tolist(), s.logprobs_BT[:, :steps].tolist(), s.entropies_BT[:, :steps].tolist())


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (cli.library_main: an import cycle)
    print(__doc__)
