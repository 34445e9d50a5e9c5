"""log pi_theta(y_t | x, y_<t) of completion tokens, without ever building a (tokens x vocabulary) fp32 tensor.

The learner's side of the importance ratio exp(log pi_theta - log pi_sampler) in train.py's loss. The decoder runs
once over prompt + completion; the output head then runs only on the positions that predict a completion token
(TRL's `logits_to_keep` idea), `chunk_size` positions at a time, each chunk under activation checkpointing, so the
backward pass holds one chunk's logits at a time: O(chunk x V) memory, not O(T x V) (at Qwen3's V = 151,936 a
21k-token aggregation sample would need 12 GB of fp32 logits). Any transformers causal LM whose logits are
head(last hidden state): decoder and head come from its own get_decoder() / get_output_embeddings(); a model that
post-processes its logits (Gemma-2's soft-capping, Granite's scaling, ...) is refused, never silently mis-scored.
This is the per-sample path (one row per sample), the reference; shared_prompt.py runs each prompt once for all its
completions and shares the output head's part (head_logprobs). Only torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

# Sampling's attention (and the log-probs' forward unless a caller passes its own choice) runs under this choice.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backends():
    """A context in which scaled_dot_product_attention may use flash, memory-efficient or math attention, never
    cuDNN attention: on an H100 (torch 2.11, cu130) cuDNN's kernel fails mid-generation ("mha_graph.execute ...
    is_good()"), and torch picks it by default there. Same results on a CPU, where cuDNN never runs."""
    return sdpa_kernel(ATTENTION_BACKENDS)


# The learner's own choice (train.py --learner-attention): on a GPU only the fast fused kernels. The memory-efficient
# kernel is what a padded (B, 1, T, T) mask forces; the grouped learner (shared_prompt.py) passes no mask at all.
LEARNER_BACKENDS = {"cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION],  # cuDNN, else flash
                    "flash": [SDPBackend.FLASH_ATTENTION]}


def learner_attention_backends(choice: str, device_type: str, dtype: torch.dtype, masked: bool = False) -> list:
    """The SDPA kernels the learner's forward and backward may use: `choice` ("cudnn" or "flash") on a GPU in
    half precision, plus memory-efficient and math attention when its batches carry padding masks (`masked`: the
    per-sample reference path). fp32 on a GPU has no flash or cuDNN kernel: memory-efficient and math. A CPU: its
    own flash kernel (masks and grouped-query heads included) and math."""
    if choice not in LEARNER_BACKENDS:
        raise ValueError(f"learner attention {choice!r}: choose from {', '.join(LEARNER_BACKENDS)}")
    if device_type != "cuda":
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    if dtype == torch.float32:
        return [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return LEARNER_BACKENDS[choice] + ([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if masked else [])


def _attention_kernels() -> set:
    """The fused attention ops SDPA dispatches to (CUDA flash / cuDNN / memory-efficient, the CPU's flash)."""
    names = ["_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu"]
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def attention_kept_contexts():
    """`context_fn` for torch.utils.checkpoint (non-reentrant): selective checkpointing that saves the attention
    kernels' outputs (the output and its log-sum-exp) in the forward and recomputes everything else of the layer in
    the backward, so the backward runs no attention forward a second time. Costs the attention outputs' memory:
    tokens x heads x head_dim per layer (Qwen3-4B, 21.7k tokens: 6.4 GB bf16 + 0.1 GB fp32 log-sum-exps)."""
    kernels = _attention_kernels()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in kernels else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


@dataclass
class TokenBatch:
    """prompt + completion rows; from_samples right-pads them. Positions come from attention_mask (cumsum - 1), so
    with left or right padding every real token keeps the position generate gave it."""

    input_ids: torch.Tensor  # (B, T) prompt ++ completion ++ padding
    attention_mask: torch.Tensor  # (B, T) 1 on real tokens
    completion_mask: torch.Tensor  # (B, T) bool, True on completion tokens

    @staticmethod
    def from_samples(samples, pad_token_id: int, device) -> "TokenBatch":
        """`samples` need `prompt_ids` and `completion_ids` (spiral.Sample, rollout.Completion)."""
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
        T = max(lengths)
        input_ids = torch.full((len(samples), T), pad_token_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((len(samples), T), dtype=torch.long)  # (B, T)
        completion_mask = torch.zeros((len(samples), T), dtype=torch.bool)  # (B, T)
        for i, s in enumerate(samples):
            P, L = len(s.prompt_ids), len(s.completion_ids)
            input_ids[i, :P + L] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids))
            attention_mask[i, :P + L] = 1
            completion_mask[i, P:P + L] = True
        return TokenBatch(input_ids.to(device), attention_mask.to(device), completion_mask.to(device))


def pack_micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices in micro-batches of at most `max_tokens` padded tokens (rows x longest), longest first: the per-sample
    learner's micro-batches (TokenBatch.from_samples pads each)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return batches + [current] if current else batches


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions exactly as generate builds them: cumsum(mask) - 1, and 1 on padding (never attended to)."""
    position_ids = attention_mask.long().cumsum(-1) - 1  # (B, T)
    return position_ids.masked_fill(attention_mask == 0, 1)  # (B, T)


def _chunk_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float):
    """log softmax(head(h) / tau)[target] for a chunk of positions, and the (detached) entropy there."""
    logits = head(hidden).float()  # (c, V) fp32; a fresh tensor, so dividing in place is safe
    if temperature != 1.0:
        logits.div_(temperature)  # in place: every (c, V) temporary counts
    lse = torch.logsumexp(logits, dim=-1)  # (c,)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # (c,)
    with torch.no_grad():  # entropy is for logging only: H = lse - sum_v p_v logit_v
        probs = torch.softmax(logits, dim=-1)  # (c, V)
        entropy = lse - torch.bmm(probs[:, None, :], logits[:, :, None]).view(-1)  # (c,): a dot, not a (c, V) product
    return logprobs, entropy


# Config fields of transformers models (5.x) that change the logits after the head: the value that means "off".
LOGIT_POST_PROCESSING = {
    "final_logit_softcapping": None,  # Gemma 2/3/3n/4, VaultGemma, NanoChat: cap * tanh(logits / cap)
    "logits_soft_cap": None,  # RecurrentGemma
    "output_logit_soft_cap": None,  # xLSTM
    "logits_scaling": 1.0,  # Granite, GraniteMoE*: logits / s (HyperCLOVAX: logits * s; MiniCPM3: hidden / s)
    "logit_scale": 1.0,  # Cohere, Cohere2: logits * s
    "lm_head_multiplier": 1.0,  # Falcon-H1: logits * m
    "logits_mup_width_multiplier": 1.0,  # Inkling: hidden / m
    "unpadded_vocab_size": None,  # Inkling: logits[..., :unpadded_vocab_size]
}


def unwrap(model):
    """The transformers model inside wrappers: peft's PeftModel and LoraModel expose it as get_base_model()."""
    while callable(getattr(model, "get_base_model", None)) and model.get_base_model() is not model:
        model = model.get_base_model()
    return model


def _post_processing(config) -> str | None:
    """The first config field that makes logits differ from head(hidden), as "name=value", or None."""
    configs = [config] + ([config.get_text_config()] if callable(getattr(config, "get_text_config", None)) else [])
    for c in configs:
        for name, off in LOGIT_POST_PROCESSING.items():
            value = getattr(c, name, off)
            if value is not None and value is not False and value != off and not (
                    name == "unpadded_vocab_size" and value >= getattr(c, "vocab_size", value)):
                return f"{name}={value}"
    return None


def _probe(model, decoder, head, batch: TokenBatch) -> str:
    """Compare model(...).logits with head(decoder(...)) on row 0's first 8 tokens: "" if they agree, else why."""
    ids, mask = batch.input_ids[:1, :8], batch.attention_mask[:1, :8]  # (1, t)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
    was_training = model.training
    model.eval()  # dropout would make the two passes differ
    try:
        with torch.no_grad():
            full = model(**kwargs).logits.float()  # (1, t, V)
            ours = head(decoder(**kwargs).last_hidden_state).float()  # (1, t, V)
    finally:
        model.train(was_training)
    if ours.shape != full.shape:
        return f"head(decoder(...)) has shape {tuple(ours.shape)}, model(...).logits {tuple(full.shape)}"
    gap = float((ours - full).abs().max())
    # 2% of the largest logit: above a few bf16 ulps (2^-7 apart) of kernel noise, far below any real transform.
    return "" if gap <= 2e-2 * max(1.0, float(full.abs().max())) else f"they differ by up to {gap:.3g}"


def decoder_and_head(model, batch: TokenBatch | None = None):
    """(decoder, head) with logits = head(decoder(...).last_hidden_state), found through transformers' accessors.

    ValueError for a model whose logits are not head(hidden): a config field of LOGIT_POST_PROCESSING, or,
    when `batch` is given, a one-time numeric probe (its verdict is cached on the model).
    """
    base = unwrap(model)
    name = type(base).__name__
    decoder = base.get_decoder() if callable(getattr(base, "get_decoder", None)) else None
    head = base.get_output_embeddings() if callable(getattr(base, "get_output_embeddings", None)) else None
    if decoder is None or decoder is base or head is None:
        raise ValueError(f"logprobs: cannot find {name}'s decoder and output head through get_decoder() and "
                         "get_output_embeddings(); it is not a transformers causal LM")
    setting = _post_processing(getattr(base, "config", None))
    if setting is not None:
        raise ValueError(f"logprobs: {name}'s logits are not head(hidden state): its config sets {setting}; "
                         "compute log-probs from model(...).logits, or apply the same transform in _chunk_logprobs")
    if batch is not None and getattr(base, "_logprobs_probe", None) is None:
        base._logprobs_probe = _probe(base, decoder, head, batch)  # a plain attribute: nn.Module keeps it as is
    if getattr(base, "_logprobs_probe", None):
        raise ValueError(f"logprobs: {name}'s logits are not head(hidden state): on a probe, "
                         f"{base._logprobs_probe}; compute log-probs from model(...).logits instead")
    return decoder, head


def to_rows(values_T: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """(B, T), aligned with batch.input_ids: the value of token input_ids[b, t] where completion_mask[b, t], else 0.

    The inverse of the flat, row-major order completion_logprobs returns; gradients flow through it.
    """
    rows = values_T.new_zeros(batch.input_ids.shape)  # (B, T)
    return rows.masked_scatter(batch.completion_mask, values_T)  # (B, T): out of place, autograd sees it


def head_logprobs(head: nn.Module, hidden_T: torch.Tensor, targets_T: torch.Tensor, temperature: float = 1.0,
                  chunk_size: int = 256):
    """(logprobs_T, entropy_T) = log softmax(head(h_t) / tau)[y_t] and the entropy there, for T (hidden state, target)
    pairs: the output head runs `chunk_size` positions at a time, each chunk checkpointed when gradients are on, so
    a backward holds one chunk's (c, V) logits at a time."""
    logprobs, entropies = [], []
    for start in range(0, hidden_T.shape[0], chunk_size):
        h, y = hidden_T[start:start + chunk_size], targets_T[start:start + chunk_size]  # (c, H), (c,)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, head, h, y, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(head, h, y, temperature)
        logprobs.append(lp)
        entropies.append(ent)
    if not logprobs:  # no completion token: empty, but on the graph, so a loss over it still has a backward
        empty = hidden_T[:, 0].float()  # (0,)
        return empty, empty.detach()
    return torch.cat(logprobs), torch.cat(entropies)  # (T,), (T,)


def completion_logprobs(model, batch: TokenBatch, temperature: float = 1.0, chunk_size: int = 256,
                        as_rows: bool = False, backends: list | None = None):
    """(logprobs_T, entropy_T): log softmax(logits / tau)[y_t] and the entropy, for every completion token.

    Flat over the batch's completion tokens, row by row (row-major over batch.completion_mask); as_rows=True gives
    (B, T) tensors aligned with input_ids instead (to_rows). Padding may be left or right: positions come from
    the attention mask. `model`: any causal LM that decoder_and_head accepts, or a peft wrapper around one.
    `backends`: the SDPA kernels of the forward (default ATTENTION_BACKENDS, sampling's; the learner passes its own).
    """
    if bool(batch.completion_mask[:, 0].any()):
        raise ValueError("logprobs: a completion token at position 0 has no context to be predicted from")
    position_ids = position_ids_from_mask(batch.attention_mask)  # (B, T)
    with sdpa_kernel(ATTENTION_BACKENDS if backends is None else backends):  # train.py wraps the backward too
        decoder, head = decoder_and_head(model, batch)  # its one-time probe runs the model too
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=position_ids, use_cache=False).last_hidden_state  # (B, T, H)
    # The hidden state at t predicts token t+1: keep the positions whose NEXT token is a completion token.
    predicts_completion = batch.completion_mask[:, 1:]  # (B, T-1)
    hidden_T = hidden[:, :-1][predicts_completion]  # (T, H)
    targets_T = batch.input_ids[:, 1:][predicts_completion]  # (T,)
    logprobs_T, entropy_T = head_logprobs(head, hidden_T, targets_T, temperature, chunk_size)  # (T,), (T,)
    if as_rows:
        return to_rows(logprobs_T, batch), to_rows(entropy_T, batch)  # (B, T), (B, T)
    return logprobs_T, entropy_T


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (copied alone, it imports torch only)
    print(__doc__)
