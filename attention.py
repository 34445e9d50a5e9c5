"""Cascade attention: attend to a shared prompt once for all its copies, merge partial results by log-sum-exp.

Softmax attention of a query q over keys k_1..k_n with values v_1..v_n is o = sum_j softmax(s)_j v_j, s_j = q.k_j / sqrt(D).
Split the keys into two disjoint sets A and B (a prompt and one copy's own completion, say) and attend to each
separately, keeping each part's log-sum-exp l = log sum_j exp(s_j):

    o_A = sum_{j in A} exp(s_j - l_A) v_j,   o_B likewise;   l = log(exp(l_A) + exp(l_B))
    o   = exp(l_A - l) o_A + exp(l_B - l) o_B                                        (the merge: exact)

This is the online-softmax algebra FlashAttention tiles with, and the idea of FlashInfer's "Cascade Inference" (2024)
and vLLM's cascade attention: when many rows share a prompt, the prompt's keys and values are stored once and read
once per decode step for all the rows that share it (their queries are rows of one attention call), while each row
reads only its own suffix. `merge` takes any number of parts, so a long prompt can also be split into chunks that
are attended in parallel and merged the same way (flash-decoding's split-KV).

`attend` has two implementations of one contract: plain PyTorch in fp32 (CPU, and the obviously correct version),
and on CUDA PyTorch's memory-efficient attention kernel, which returns the log-sum-exp and never writes the scores.
Masked keys get a large finite negative bias (MASKED), not -inf: a part whose keys are all masked then has a finite
l ~ -1e4 and weight exp(l - l_max) = 0 in the merge, where -inf would turn into 0 * nan.
"""

from __future__ import annotations

import torch

MASKED = -1e4  # additive bias of a masked key: exp(MASKED + s) underflows to exactly 0 in fp32 for any |s| < 1e3


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float):
    """(o, l) of softmax(q k^T * scale + bias) v over the keys given: o (N, H, M, D) in q's dtype, l (N, H, M) fp32.

    q (N, H, M, D), k and v (N, H, S, D), bias broadcastable to (N, H, M, S) (0 or MASKED). l is the natural-log
    log-sum-exp of the biased, scaled scores, the weight this part gets in `merge`.
    """
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return _attend_cuda(q, k, v, bias, scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale + bias.float()  # (N, H, M, S)
    lse = torch.logsumexp(scores, dim=-1)  # (N, H, M)
    out = torch.matmul(torch.exp(scores - lse[..., None]), v.float())  # (N, H, M, D)
    return out.to(q.dtype), lse


def _attend_cuda(q, k, v, bias, scale):
    """attend through aten's memory-efficient attention (fp32 softmax inside, scores never written to memory)."""
    N, H, M, _ = q.shape
    bias = bias.to(q.dtype).expand(N, H, M, k.shape[2])  # a broadcast view: the kernel reads it by strides
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=scale)[:2]
    return out, lse[..., :M]  # the kernel pads l's query dimension to a multiple of 32


def merge(out_P: torch.Tensor, lse_P: torch.Tensor, dim: int):
    """Merge partial attentions over disjoint key sets, stacked along `dim` (P parts): the cascade merge.

    o = sum_p exp(l_p - l) o_p with l = logsumexp_p l_p. out_P (..., P, ..., M, D), lse_P the same without D.
    Returns (o, l) with the parts' dimension removed; o in out_P's dtype, computed in fp32.
    """
    lse = torch.logsumexp(lse_P, dim=dim)  # (..., M)
    weight_P = torch.exp(lse_P - lse.unsqueeze(dim))  # (..., P, ..., M), sums to 1 over the parts
    out = (out_P.float() * weight_P[..., None]).sum(dim)  # (..., M, D)
    return out.to(out_P.dtype), lse


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """Full softmax attention in float64 over every key at once: what the tests compare `attend` + `merge` with."""
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale + bias.double()
    return torch.matmul(torch.softmax(scores, dim=-1), v.double())


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (copied alone, it imports torch only)
    print(__doc__)
