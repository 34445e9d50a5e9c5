"""log pi_theta(y_t | x, y_<t) of completion tokens, without ever building a (tokens x vocabulary) fp32 tensor.

The learner's side of the importance ratio exp(log pi_theta - log pi_sampler) in train.py's loss. The decoder runs
once over prompt + completion; lm_head then runs only on the positions that predict a completion token
(TRL's `logits_to_keep` idea), `chunk_size` positions at a time, each chunk under activation checkpointing, so the
backward pass holds one chunk's logits at a time: O(chunk x V) memory, not O(T x V) (at Qwen3's V = 151,936 a
21k-token aggregation sample would need 12 GB of fp32 logits). Only torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


@dataclass
class TokenBatch:
    """prompt + completion rows, RIGHT-padded: every real token keeps the position generate gave it."""

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


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions exactly as generate builds them: cumsum(mask) - 1, and 1 on padding (never attended to)."""
    position_ids = attention_mask.long().cumsum(-1) - 1  # (B, T)
    return position_ids.masked_fill(attention_mask == 0, 1)  # (B, T)


def _chunk_logprobs(lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float):
    """log softmax(lm_head(h) / tau)[target] for a chunk of positions, and the (detached) entropy there."""
    logits = lm_head(hidden).float()  # (c, V) fp32; a fresh tensor, so dividing in place is safe
    if temperature != 1.0:
        logits.div_(temperature)  # in place: every (c, V) temporary counts
    lse = torch.logsumexp(logits, dim=-1)  # (c,)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # (c,)
    with torch.no_grad():  # entropy is for logging only: H = lse - sum_v p_v logit_v
        probs = torch.softmax(logits, dim=-1)  # (c, V)
        entropy = lse - torch.bmm(probs[:, None, :], logits[:, :, None]).view(-1)  # (c,): a dot, not a (c, V) product
    return logprobs, entropy


def completion_logprobs(model, batch: TokenBatch, temperature: float = 1.0, chunk_size: int = 256):
    """(logprobs_N, entropy_N): log softmax(logits / tau)[y_t] and the entropy, for every completion token.

    Flat over the batch's completion tokens, row by row (row-major over batch.completion_mask). Assumes
    logits = lm_head(hidden), true for Qwen3.
    """
    position_ids = position_ids_from_mask(batch.attention_mask)  # (B, T)
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=position_ids, use_cache=False).last_hidden_state  # (B, T, H)
    # The hidden state at t predicts token t+1: keep the positions whose NEXT token is a completion token.
    predicts_completion = batch.completion_mask[:, 1:]  # (B, T-1)
    hidden_N = hidden[:, :-1][predicts_completion]  # (N, H)
    targets_N = batch.input_ids[:, 1:][predicts_completion]  # (N,)
    logprobs, entropies = [], []
    for start in range(0, hidden_N.shape[0], chunk_size):
        h, y = hidden_N[start:start + chunk_size], targets_N[start:start + chunk_size]  # (c, H), (c,)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, model.lm_head, h, y, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(model.lm_head, h, y, temperature)
        logprobs.append(lp)
        entropies.append(ent)
    if not logprobs:
        empty = hidden_N.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logprobs), torch.cat(entropies)  # (N,), (N,)
