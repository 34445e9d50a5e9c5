"""Cascade attention (attention.py, fastgen.cascade_attention) against plain full-softmax attention in float64.

attend + merge over disjoint key sets must equal softmax over all keys at once (the log-sum-exp merge is exact): on
random inputs (Hypothesis), fp32 to 1e-5, bf16 within its rounding, with masked keys and wholly masked parts. Then the
decode step's attention itself: fastgen's prefix (each prompt once, in chunks, all copies as rows of one call) plus
each row's suffix up to a bucket, for prompts of unequal lengths, one copy and many, against each row's own full
key list built by hand.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attention
import fastgen


def masked_bias(keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, 0.0, attention.MASKED)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.lists(st.integers(1, 40), min_size=1, max_size=4),
       st.integers(0, 2**31 - 1))
def test_attend_and_merge_equal_full_softmax(N, H, M, part_sizes, seed):
    """Keys split into parts of random sizes, random masks (every query keeps at least one key overall): merged
    parts equal softmax over the concatenated keys (fp32: 1e-5), and l is the log-sum-exp of the biased scores."""
    g = torch.Generator().manual_seed(seed)
    D, scale = 8, 0.35
    q = torch.randn(N, H, M, D, generator=g)
    ks = [torch.randn(N, H, S, D, generator=g) for S in part_sizes]
    vs = [torch.randn(N, H, S, D, generator=g) for S in part_sizes]
    keeps = [torch.rand(N, 1, 1, S, generator=g) < 0.6 for S in part_sizes]
    keeps[0][..., 0] = True  # no query may lose every key
    outs, lses = zip(*(attention.attend(q, k, v, masked_bias(m), scale) for k, v, m in zip(ks, vs, keeps)))
    out, lse = attention.merge(torch.stack(outs, 2), torch.stack(lses, 2), dim=2)
    full_bias = masked_bias(torch.cat(keeps, -1))
    ref = attention.reference(q, torch.cat(ks, 2), torch.cat(vs, 2), full_bias, scale)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    scores = q.double() @ torch.cat(ks, 2).double().transpose(-1, -2) * scale + full_bias.double()
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=1e-4, rtol=1e-5)


def test_a_wholly_masked_part_weighs_nothing():
    """A part with every key masked (a prompt's padding chunk) has l ~ MASKED and weight exactly 0: the merge
    equals the other part alone. With -inf instead of MASKED it would be nan."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    o1, l1 = attention.attend(q, k, v, masked_bias(torch.zeros(1, 1, 1, 5, dtype=torch.bool)), 0.3)
    o2, l2 = attention.attend(q, k, v, torch.zeros(5), 0.3)
    out, lse = attention.merge(torch.stack([o1, o2]), torch.stack([l1, l2]), dim=0)
    assert torch.isfinite(o1).all() and out.equal(o2.float().to(out.dtype)) and torch.allclose(lse, l2)


def test_bf16_within_its_rounding():
    """bf16 inputs: the merged result is as close to the float64 truth as a bf16 rounding of it (relative 2^-8)."""
    torch.manual_seed(1)
    q, k1, v1, k2, v2 = (torch.randn(3, 4, 8, 64).bfloat16() for _ in range(5))
    parts = [attention.attend(q, k, v, torch.zeros(8), 0.125) for k, v in ((k1, v1), (k2, v2))]
    out, _ = attention.merge(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), dim=0)
    assert out.dtype == torch.bfloat16
    ref = attention.reference(q, torch.cat([k1, k2], 2), torch.cat([v1, v2], 2), torch.zeros(16), 0.125)
    assert float((out.double() - ref).norm() / ref.norm()) < 2 ** -8


def test_bf16_parts_are_merged_in_fp32_and_rounded_once():
    """merge upcasts the parts, weighs and sums them in fp32 and rounds the sum once: for bf16 parts it equals the
    fp32 merge of their upcasts rounded to bf16, bit for bit, for the 19 parts of a decode step over an 18-chunk
    prompt (summing in bf16 would round at every part)."""
    torch.manual_seed(2)
    out_P = torch.randn(4, 19, 2, 8, 128).bfloat16()  # (B, parts, K, G, D) as fastgen.cascade_attention stacks them
    lse_P = torch.randn(4, 19, 2, 8) * 3  # (B, parts, K, G)
    out, lse = attention.merge(out_P, lse_P, dim=1)
    out32, lse32 = attention.merge(out_P.float(), lse_P, dim=1)
    assert out.dtype == torch.bfloat16 and out.equal(out32.bfloat16()) and lse.equal(lse32)


def naive_row_attention(q_B, cache, lengths_P, copies, t, scale):
    """Row by row: query heads h over KV head h // G, keys = the row's prompt (its own length) then its suffix
    slots 0..t; full softmax in float64. Returns (B, 1, H D)."""
    B, H, _, D = q_B.shape
    K = cache.suffix_k[0].shape[1]
    G = H // K
    rows = []
    for b in range(B):
        p = b // copies
        prefix_k = cache.prefix_k[0][p].transpose(0, 1).reshape(K, -1, D)[:, :lengths_P[p]]  # (K, L_p, D)
        prefix_v = cache.prefix_v[0][p].transpose(0, 1).reshape(K, -1, D)[:, :lengths_P[p]]
        keys = torch.cat([prefix_k, cache.suffix_k[0][b, :, :t + 1]], 1).repeat_interleave(G, 0)  # (H, S, D)
        values = torch.cat([prefix_v, cache.suffix_v[0][b, :, :t + 1]], 1).repeat_interleave(G, 0)
        rows.append(attention.reference(q_B[b], keys, values, torch.zeros(()), scale).reshape(1, H * D))
    return torch.stack(rows)


@pytest.mark.parametrize("lengths, copies, t", [([5, 17, 33], 3, 6), ([40], 1, 0), ([9, 9], 4, 21), ([1, 30], 2, 3)])
def test_cascade_attention_equals_each_rows_full_attention(monkeypatch, lengths, copies, t):
    """fastgen's decode attention (prefix in chunks of at most 16 slots, suffix bucket 8, GQA 4 query heads per KV
    head) equals full attention over each row's own keys: its prompt (unequal lengths: padding masked) and its
    suffix up to the fed token, nothing past it."""
    monkeypatch.setattr(fastgen, "PREFIX_CHUNK", 16)
    monkeypatch.setattr(fastgen, "SUFFIX_BUCKET", 8)
    g = torch.Generator().manual_seed(sum(lengths) + copies + t)
    K, G, D = 2, 4, 8
    shape = fastgen.CallShape.of(lengths, copies, max_new_tokens=24)
    assert shape.n_chunks == -(-max(lengths) // 16)
    arena = torch.randn(fastgen.KVCache.elements(1, shape, K, D), generator=g)  # stale slots hold garbage
    cache = fastgen.KVCache(arena, 1, shape, K, D)
    state = fastgen.CallState(shape, K, 2, torch.float32, "cpu")
    state.start(shape, lengths, 1.0, [0, 1], K)
    state.t.fill_(t)
    q = torch.randn(shape.B, K * G, 1, D, generator=g)
    suffix_len = fastgen._round_up(t + 1, 8)
    suffix_bias = state.suffix_bias(suffix_len, torch.float32)
    got = fastgen.cascade_attention(q, cache, 0, state, shape, suffix_len, suffix_bias, 0.3)  # (B, 1, H D)
    want = naive_row_attention(q, cache, lengths, copies, t, 0.3)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_prefix_bias_masks_exactly_each_prompts_padding():
    """The prefix mask of a call: 0 on a prompt's own slots, MASKED on the rest of its chunks, for every KV head;
    no prompt is left without a key (no fully masked row: nan on some backends)."""
    lengths, K = [3, 70, 64], 2
    shape = fastgen.CallShape.of(lengths, copies=2, max_new_tokens=5)
    state = fastgen.CallState(shape, K, 1, torch.float32, "cpu")
    state.start(shape, lengths, 1.0, [0], K)
    bias = state.prefix_bias.view(shape.P, shape.n_chunks, K, shape.chunk)  # (P, chunks, K, chunk)
    for p, L in enumerate(lengths):
        per_slot = bias[p].transpose(0, 1).reshape(K, -1)  # (K, slots) in token order
        assert (per_slot[:, :L] == 0).all() and (per_slot[:, L:] == attention.MASKED).all()
    assert state.len_B.tolist() == [3, 3, 70, 70, 64, 64]


def test_call_shape_pads_little():
    """Prompts are split into equal chunks of at most PREFIX_CHUNK slots rounded to SLOT_MULTIPLE (under 64 pads a
    chunk), the suffix is max_new_tokens rounded to SUFFIX_BUCKET: 1,054 tokens -> 2 x 576, 17,596 -> 18 x 1,024."""
    assert (fastgen.CallShape.of([1054, 1000], 8, 4096).n_chunks, fastgen.CallShape.of([1054], 8, 4096).chunk) == (2, 576)
    s = fastgen.CallShape.of([17_596], 4, 4096)
    assert (s.n_chunks, s.chunk, s.T, s.B) == (18, 1024, 4096, 4)
    assert fastgen.CallShape.of([10], 1, 257).T == 512 and fastgen.CallShape.of([65], 1, 1).chunk == 128
    assert s.cache_tokens() == 18 * 1024 + 4 * 4096


def test_every_prompt_length_fits_its_chunks():
    """n_chunks x chunk >= L (the prompt fits) and wastes fewer than SLOT_MULTIPLE slots per chunk, for every L up
    to 5,000; chunks never exceed PREFIX_CHUNK and are multiples of SLOT_MULTIPLE (the kernels' alignment)."""
    for L in range(1, 5000):
        s = fastgen.CallShape.of([L], 1, 1)
        assert L <= s.n_chunks * s.chunk < L + fastgen.SLOT_MULTIPLE * s.n_chunks, L
        assert s.chunk <= fastgen.PREFIX_CHUNK and s.chunk % fastgen.SLOT_MULTIPLE == 0
