"""The grouped learner: each prompt goes through the model once for all of its completions (train.py's default).

A group is one prompt x with the completions y_1..y_m sampled from it: SPIRAL's aggregation prompt and its N2
traces, a search prompt and its N1, a GRPO prompt and its G. The per-sample learner (logprobs.completion_logprobs)
trains m rows x ++ y_i, so every prompt token goes through every layer m times: at train.py's defaults each
17.6k-token aggregation prompt of a problem is trained 4 times, 16 prompts' worth per problem. Here a micro-batch is
one packed row, with positions continuing from each prompt as generate gave them,

    tokens     x_1 | y_11 | y_12 | ... | x_2 | y_21 | ...
    positions  0..P_1-1 | P_1..P_1+L_11-1 | P_1..P_1+L_12-1 | ... | 0..P_2-1 | ...

and attention follows the groups: the prompt attends causally to itself; y_i's token t attends to its whole prompt
and causally to y_i (never to a sibling y_j or another group):

    o(y_i,t) = softmax over the keys [x ; y_i,1..t] of q(y_i,t) . k / sqrt(D), times their values

Every token sees exactly the keys, values and position it has in its own row of the per-sample learner, so the
log-probs, the loss (a sum over tokens) and its gradient are the same up to float rounding; the prompt's
activations are computed once and the gradients from all m completions flow back into them together.

Why this design (checked against the installed torch 2.13 and transformers 5.24):
  - FlexAttention expresses the mask in one call, but torch 2.13 raises "FlexAttention does not support backward on
    CPU" (the CPU tests could not train through it), and on a GPU it compiles a kernel per shape.
  - attention.py's cascade (attend to the prompt and to the own suffix separately, merge by log-sum-exp) is exact,
    but a backward through the merge needs the log-sum-exp's gradient, which torch's fused kernels do not return.
  - Chosen: torch's fused attention kernels per segment. The prompt is one square causal
    scaled_dot_product_attention call (flash or cuDNN on a GPU); each completion is one call of its L queries over
    the keys [x ; y_i] with the causal mask aligned to the lower right (query t sees keys 0..P+t), which the flash
    kernel runs without any mask in memory (lower_right_causal_attention). Grouped-query heads go in as they are:
    K/V are never repeated to every query head. A CPU runs the same segments through its own flash kernel with an
    (L, P + L) mask. Autograd differentiates all of it.
  The price: each completion's call concatenates the prompt's keys and values with its own (2 P kv-dims copied per
  completion and layer, transient under checkpointing), and reads the prompt's keys once per completion. The FLOPs
  are exactly the useful ones: L_i (P + (L_i + 1) / 2) query-key pairs per completion, P (P + 1) / 2 for the prompt.

How it reaches the model: a transformers attention function (registered through transformers' AttentionInterface,
the one import besides torch), selected by config._attn_implementation while `sharing_prompts(model)` is held; the
layout reaches it as the decoder's attention mask (transformers 5.x passes a dict {"full_attention": mask} through
unchanged and builds no mask of its own) and the positions as packed position_ids. Where a model does not follow
that contract (sliding-window layers, an architecture that builds its own mask), `unsupported(model)` says why
(a one-time numeric probe against the per-sample path) and train.py trains per sample, saying so once and in the
metric train/learner_fallback. On a GPU the micro-batches are planned by its free memory (`plan`, `LearnerMemory`):
a group stays whole whenever its counted peak fits, and is split only when it must. Prior art: Unsloth's
PrefixGrouper (GRPO), NeMo-RL's shared-prefix training, TRL's open request (huggingface/trl issue 3549).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
from torch.nn.attention import sdpa_kernel
from transformers import AttentionInterface

from logprobs import (ATTENTION_BACKENDS, TokenBatch, attention_kept_contexts, completion_logprobs, decoder_and_head,
                      head_logprobs, pack_micro_batches, unwrap)

NAME = "spiral_shared_prompt"  # the attention implementation's name while sharing_prompts() is held
SDPA = AttentionInterface()["sdpa"]  # transformers' own, for any mask that is not a Layout


# ----------------------------------------------------------------------------------------------------------------------
# Groups and micro-batches


def group_by_prompt(samples) -> list[list]:
    """Samples grouped by identical prompt_ids, in order of first appearance (samples in their given order)."""
    groups: dict[tuple, list] = {}
    for s in samples:
        groups.setdefault(tuple(s.prompt_ids), []).append(s)
    return list(groups.values())


def _cost(part) -> int:
    """Packed tokens of a part (one prompt and some of its completions): the prompt once plus every completion."""
    return len(part[0].prompt_ids) + sum(len(s.completion_ids) for s in part)


def pack_groups(groups: list[list], limit: float, cost=_cost) -> list[list[list]]:
    """Micro-batches whose parts (a prompt and completions of it) cost at most `limit` together: packed tokens
    (`cost` = _cost, the default) or, for the memory plan, peak bytes (LearnerMemory.part_bytes).

    A group that would not fit is split into parts that do, each repeating the prompt (a part holds at least one
    completion, so a single sample over the limit is a micro-batch of its own, as in the per-sample path).
    Parts go into micro-batches first fit, largest first (fewer forward calls than in their order of arrival).
    """
    parts = []
    for group in groups:
        part: list = []
        for s in group:
            if part and cost(part + [s]) > limit:
                parts.append(part)
                part = []
            part.append(s)
        parts.append(part)
    batches: list[list[list]] = []
    loads: list[float] = []
    for part in sorted(parts, key=cost, reverse=True):  # a stable sort: equal costs keep their order
        fits = next((b for b, load in enumerate(loads) if load + cost(part) <= limit), None)
        if fits is None:
            batches.append([part])
            loads.append(cost(part))
        else:
            batches[fits].append(part)
            loads[fits] += cost(part)
    return batches


@dataclass(frozen=True)
class Layout:
    """Where each group of a packed row lies: per group, its prompt's [start, end) and its completions' [start, end).
    Handed to the attention function as the attention mask."""

    groups: tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...]], ...]


@dataclass
class PackedBatch:
    """One micro-batch of the grouped learner: a packed row, its positions and layout, and for every completion
    token (in the order of `samples`) the row index of the hidden state that predicts it."""

    input_ids: torch.Tensor  # (1, T) prompt, its completions, the next prompt, ...
    position_ids: torch.Tensor  # (1, T) each completion continues from its prompt's length
    layout: Layout
    predictor_T: torch.Tensor  # (T,) row index of the hidden state predicting each completion token
    target_T: torch.Tensor  # (T,) the completion tokens, sample after sample
    samples: list  # the samples in packing order, the order of the flat (T,) outputs

    @staticmethod
    def from_parts(parts: list[list], device) -> "PackedBatch":
        """`parts`: lists of samples sharing a prompt (spiral.Sample: prompt_ids, completion_ids)."""
        ids, positions, predictors, groups, samples = [], [], [], [], []  # over the row; over completion tokens
        for part in parts:
            prompt = list(part[0].prompt_ids)
            P, p0 = len(prompt), len(ids)
            if P == 0:  # as the per-sample learner (logprobs.completion_logprobs) refuses it
                raise ValueError("logprobs: a completion token at position 0 has no context to be predicted from")
            ids += prompt
            positions += range(P)
            completions = []
            for s in part:
                c0, L = len(ids), len(s.completion_ids)
                samples.append(s)
                if L == 0:  # no token to predict: in the loss with nothing, as in the per-sample learner
                    continue
                ids += list(s.completion_ids)
                positions += range(P, P + L)
                # y_1 is predicted by the prompt's last token, y_t (t > 1) by y_{t-1} just before it in the row
                predictors += [p0 + P - 1] + list(range(c0, c0 + L - 1))
                completions.append((c0, c0 + L))
            groups.append(((p0, p0 + P), tuple(completions)))
        targets = [t for s in samples for t in s.completion_ids]
        return PackedBatch(torch.tensor([ids], device=device), torch.tensor([positions], device=device),
                           Layout(tuple(groups)), torch.tensor(predictors, device=device, dtype=torch.long),
                           torch.tensor(targets, device=device, dtype=torch.long), samples)


# ----------------------------------------------------------------------------------------------------------------------
# The memory plan: how many tokens a micro-batch may hold


DEFAULT_MICRO_BATCH_TOKENS = 40_960  # where memory is not planned (a CPU; the per-sample learner): tokens a micro-batch
LEARNER_MEMORY_FRACTION = 0.9  # of the GPU's free memory the plan fills (the caching allocator's fragmentation)


@dataclass(frozen=True)
class LearnerMemory:
    """Peak bytes of a grouped micro-batch's forward + backward beyond what is resident (weights, LoRA, optimizer
    state), as benchmarks/learner_cost.py counts them on the meta device for transformers' Qwen3 decoder layer (bf16
    activations, fp32 norms; an fp32 model counts twice). With d the hidden size, I the MLP's, H and Hkv query and
    key-value heads of D dimensions, r the LoRA rank, n the decoder layers:

        per packed token   2 d n (the input each checkpointed layer keeps) + one layer's working set in its backward,
                           W = 18 d + 14 I + 10 H D + 8 H + 8 Hkv D + 4 Hkv + 4 D + 24 r (the recomputed forward:
                           the norms' fp32 copies, q, k, v, rotary, the attention output, SwiGLU's (T, I) tensors,
                           LoRA's (T, r) ones); keeping attention outputs adds 2 H D + 4 H per further layer; without
                           checkpointing every layer keeps its own: n (2 d + W), an overcount
        per completion     4 Hkv D (P + L): its K and V concatenated with the prompt's (n times without
                           checkpointing), and 32 L: its targets, log-probs and ratios
        fixed              the output head's chunk, 3 x chunk x V fp32 (where a micro-batch of a few thousand tokens
                           peaks), and the trainable parameters' gradients not yet allocated

    At Qwen3-4B's shape this is within 3 MB of the count from 30k tokens up (tests/test_shared_prompt.py); a decoder
    layer without q/k norms (Llama's) is slightly overcounted.
    """

    per_token: int
    per_completion_kv: int  # a completion's concatenated K and V, per token of its prompt and itself
    per_completion_token: int
    fixed: int

    @staticmethod
    def of(model, chunk_size: int = 256) -> "LearnerMemory":
        """The counts for `model` as it is set up now: its shape, LoRA rank, checkpointing, dtype and gradients."""
        base = unwrap(model)
        c = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        d, n, H = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
        I = getattr(c, "intermediate_size", None) or 4 * d  # noqa: E741 - the MLP's width, as in the formula
        Hkv = getattr(c, "num_key_value_heads", None) or H
        D = getattr(c, "head_dim", None) or d // H
        r = max((a.weight.shape[0] for m in base.modules() if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)
                 for a in m.lora_A.values()), default=0)
        checkpointing, keep = checkpointing_mode(base)
        layer = 18 * d + 14 * I + 10 * H * D + 8 * H + 8 * Hkv * D + 4 * Hkv + 4 * D + 24 * r
        if checkpointing:
            per_token, kv_layers = 2 * d * n + layer + (n - 1) * (2 * H * D + 4 * H) * keep, 1
        else:
            per_token, kv_layers = n * (2 * d + layer), n
        scale = max(1.0, next(base.parameters()).element_size() / 2)
        grads = sum(p.numel() * p.element_size() for p in base.parameters() if p.requires_grad and p.grad is None)
        return LearnerMemory(int(scale * per_token), int(scale * 4 * Hkv * D * kv_layers), 32,
                             3 * chunk_size * c.vocab_size * 4 + grads)

    def part_bytes(self, part) -> int:
        """Peak bytes a part (a prompt and completions of it) adds to a micro-batch."""
        P = len(part[0].prompt_ids)
        return sum(self.per_token * (len(s.completion_ids) + (P if i == 0 else 0))
                   + self.per_completion_kv * (P + len(s.completion_ids))
                   + self.per_completion_token * len(s.completion_ids) for i, s in enumerate(part))

    def peak_bytes(self, parts: list[list]) -> int:
        """Peak bytes of a micro-batch beyond what is resident: its parts and the fixed part."""
        return self.fixed + sum(self.part_bytes(part) for part in parts)


def checkpointing_mode(model) -> tuple[bool, bool]:
    """(activation checkpointing active, keeping attention outputs), as train.enable_gradient_checkpointing set them
    (checkpointing runs in training mode only)."""
    base = unwrap(model)
    layers = [m for m in base.modules() if getattr(m, "gradient_checkpointing", False) is True]
    if not layers or not base.training:
        return False, False
    function = getattr(layers[0], "_gradient_checkpointing_func", None)
    return True, getattr(function, "keywords", {}).get("context_fn") is attention_kept_contexts


def free_learner_memory(device) -> int | None:
    """Bytes the learner may fill on `device`: LEARNER_MEMORY_FRACTION of CUDA's free memory and of what torch's
    caching allocator holds unused (the sampler's KV arena, once released); None off CUDA (no plan by memory)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(LEARNER_MEMORY_FRACTION * (free + unused))


def plan(model, groups: list[list], max_tokens: int | None, free_bytes: int | None, chunk_size: int = 256
         ) -> list[list[list]]:
    """The grouped learner's micro-batches (pack_groups). `max_tokens` given: at most that many packed tokens. Else,
    with `free_bytes` (free_learner_memory): by memory, a group kept whole whenever its counted peak (LearnerMemory)
    fits and split only when it must. Else (a CPU): DEFAULT_MICRO_BATCH_TOKENS tokens."""
    if max_tokens is None and free_bytes is not None:
        memory = LearnerMemory.of(model, chunk_size)
        return pack_groups(groups, free_bytes - memory.fixed, memory.part_bytes)
    return pack_groups(groups, max_tokens or DEFAULT_MICRO_BATCH_TOKENS)


# ----------------------------------------------------------------------------------------------------------------------
# The attention and the log-probs


def lower_right_causal_attention(q, k, v, scale=None, dropout: float = 0.0):
    """Attention of L queries over S >= L keys where query t sees keys 0..S-L+t: the causal mask aligned to the
    lower right of the (L, S) scores. q (1, H, L, D), k and v (1, Hkv, S, D); returns (1, H, L, D).

    Off a CPU in half precision (CUDA; the meta device, where the benchmarks count the GPU path): torch's flash
    kernel, whose causal flag means exactly this when L < S (FlashAttention 2's convention), with grouped-query
    heads as they are and no mask in memory. This is what torch.nn.attention.bias.causal_lower_right dispatches to;
    that tensor subclass itself cannot be used here: selective checkpointing fails to create it in the backward's
    recomputation, and a wrapper around F.scaled_dot_product_attention (a profiler, a test's spy) breaks its
    dispatch. Elsewhere (a CPU, fp32): scaled_dot_product_attention with the (L, S) boolean mask.
    """
    L, S = q.shape[2], k.shape[2]
    if q.device.type != "cpu" and q.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout, True, False, scale=scale)[0]
    mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L)  # (L, S): query t sees keys <= S-L+t
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale,
                                                            enable_gqa=q.shape[1] != k.shape[1])


def grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0, **kwargs):
    """A transformers attention function: softmax attention of a packed row under its Layout (module docstring).

    query (1, H, T, D), key and value (1, Hkv, T, D), rotary already applied; attention_mask: the Layout. Returns
    ((1, T, H, D), None), as transformers' own sdpa_attention_forward does, which runs any other mask (a forward
    of the same model inside sharing_prompts: logprobs' one-time probe, say).
    """
    if not isinstance(attention_mask, Layout):
        return SDPA(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{NAME}: sliding-window attention is not supported")
    parts = []
    for (p0, p1), completions in attention_mask.groups:
        k_P, v_P = key[:, :, p0:p1], value[:, :, p0:p1]  # (1, Hkv, P, D)
        parts.append(torch.nn.functional.scaled_dot_product_attention(  # (1, H, P, D): flash or cuDNN on a GPU
            query[:, :, p0:p1], k_P, v_P, is_causal=True, dropout_p=dropout, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1]))
        for c0, c1 in completions:
            k = torch.cat([k_P, key[:, :, c0:c1]], dim=2)  # (1, Hkv, P + L, D): the prompt, then this completion
            v = torch.cat([v_P, value[:, :, c0:c1]], dim=2)
            parts.append(lower_right_causal_attention(query[:, :, c0:c1], k, v, scaling, dropout))  # (1, H, L, D)
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None  # (1, T, H, D)


if __name__ != "__main__":  # `python shared_prompt.py --help` (a second copy) must not replace the imported one's
    AttentionInterface.register(NAME, grouped_attention)


@contextlib.contextmanager
def sharing_prompts(model):
    """Route the model's attention through grouped_attention. Hold it over the forward AND the backward: gradient
    checkpointing runs each layer's forward again inside the backward."""
    config = unwrap(model).config
    saved = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = saved


def grouped_logprobs(model, batch: PackedBatch, temperature: float = 1.0, chunk_size: int = 256,
                     backends: list | None = None):
    """(logprobs_T, entropy_T) for every completion token of a packed micro-batch, flat in the order of
    batch.samples: the same values as logprobs.completion_logprobs on one row per sample (the reference)."""
    first = batch.samples[0]
    decoder, head = decoder_and_head(model, TokenBatch.from_samples([first], 0, batch.input_ids.device))
    with sharing_prompts(model), sdpa_kernel(ATTENTION_BACKENDS if backends is None else backends):
        hidden = decoder(input_ids=batch.input_ids, attention_mask={"full_attention": batch.layout},
                         position_ids=batch.position_ids, use_cache=False).last_hidden_state[0]  # (T, H)
    return head_logprobs(head, hidden[batch.predictor_T], batch.target_T, temperature, chunk_size)  # (T,), (T,)


def micro_batches(model, samples, grouped: bool, max_tokens: int | None, pad_token_id: int, device,
                  temperature: float, chunk_size: int, backends: list):
    """(samples of a micro-batch, a function computing their log-probs and entropies) for each micro-batch of
    train.accumulate_gradients: packed groups (each prompt once, planned by `plan`: by the GPU's free memory unless
    `max_tokens` is given) or right-padded rows (logprobs.pack_micro_batches: `max_tokens` padded tokens, default
    DEFAULT_MICRO_BATCH_TOKENS)."""
    if grouped:
        free = free_learner_memory(device) if max_tokens is None else None
        for parts in plan(model, group_by_prompt(samples), max_tokens, free, chunk_size):
            batch = PackedBatch.from_parts(parts, device)
            yield batch.samples, functools.partial(grouped_logprobs, model, batch, temperature, chunk_size, backends)
        return
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    for indices in pack_micro_batches(lengths, max_tokens or DEFAULT_MICRO_BATCH_TOKENS):
        micro = [samples[i] for i in indices]
        batch = TokenBatch.from_samples(micro, pad_token_id, device)
        yield micro, functools.partial(completion_logprobs, model, batch, temperature, chunk_size, backends=backends)


# ----------------------------------------------------------------------------------------------------------------------
# Where it applies


def _probe(model) -> str:
    """One small group trained both ways without gradients: "" if the log-probs agree, else why not."""
    base = unwrap(model)
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    ids = [(7 * i + 3) % config.vocab_size for i in range(25)]

    @dataclass
    class _Sample:
        prompt_ids: list
        completion_ids: list

    samples = [_Sample(ids[:12], ids[12:18]), _Sample(ids[:12], ids[18:25])]
    device, dtype = next(base.parameters()).device, next(base.parameters()).dtype
    was_training = base.training
    base.eval()
    try:
        with torch.no_grad():
            shared, _ = grouped_logprobs(model, PackedBatch.from_parts([samples], device))
            alone, _ = completion_logprobs(model, TokenBatch.from_samples(samples, 0, device))
    except Exception as e:  # noqa: BLE001 - any failure means: not this model
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        base.train(was_training)
    gap = float((shared - alone).abs().max())
    # fp32 agrees to ~1e-6; 16-bit kernels differ by rounding. A wrong position or mask moves log-probs by ~0.1-1.
    return "" if gap <= (1e-3 if dtype == torch.float32 else 5e-2) else f"its log-probs differ by up to {gap:.3g}"


def unsupported(model) -> str:
    """"" if the grouped learner applies to `model`, else why not (the numeric verdict is cached on the model)."""
    base = unwrap(model)
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"its layers are {sorted(kinds)} (sliding-window attention)"
    if next(base.parameters()).device.type == "meta":
        return ""  # shapes only (the benchmarks' counting): nothing to compare
    if getattr(base, "_shared_prompt_probe", None) is None:
        base._shared_prompt_probe = _probe(model)  # a plain attribute: nn.Module keeps it as is
    return base._shared_prompt_probe


if __name__ == "__main__":  # a library (train.py uses it): --help prints what it holds; nothing runs
    print(__doc__)
