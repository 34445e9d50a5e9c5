"""train.py's log-probs and loss: the chunked fast path against the naive full softmax, alignment with the sampler's
own log-probs, micro-batching that does not change the gradient, and a few optimiser steps that move log-probs the
way the advantages say."""

import copy
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rollout
import train
from logprobs import TokenBatch, completion_logprobs, pack_micro_batches, position_ids_from_mask
import lora


@dataclass
class S:
    """A stand-in for spiral.Sample (train.py only reads these fields)."""

    prompt_ids: list
    completion_ids: list
    sampler_logprobs: list = None
    advantage: float = 1.0
    role: str = "search"


@pytest.fixture(scope="module")
def tiny():
    return rollout.load_policy("tiny", device="cpu")


def _lora_model(tiny, seed=0, checkpointing=True):
    model = copy.deepcopy(tiny[0])
    torch.manual_seed(seed)
    lora.add_lora(model, rank=4, alpha=8)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # B != 0 so the adapter matters and every parameter gets a gradient
        for p in lora.lora_parameters(model):
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    if checkpointing:
        train.enable_gradient_checkpointing(model)
    model.train()
    return model


def _random_samples(seed, count, max_prompt=9, max_completion=9):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(count):
        P = int(torch.randint(1, max_prompt + 1, (1,), generator=g))
        L = int(torch.randint(1, max_completion + 1, (1,), generator=g))
        ids = torch.randint(3, 1000, (P + L,), generator=g).tolist()
        samples.append(S(ids[:P], ids[P:], advantage=float(torch.randn(1, generator=g))))
    return samples


def _naive(model, batch, temperature):
    """Full (B, T, V) fp32 logits, log_softmax, gather: the obviously correct slow path."""
    position_ids = position_ids_from_mask(batch.attention_mask)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids,
                   use_cache=False).logits.float()[:, :-1] / temperature  # (B, T-1, V)
    logp_all = torch.log_softmax(logits, -1)  # (B, T-1, V)
    mask = batch.completion_mask[:, 1:]  # (B, T-1)
    logprobs = logp_all.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)[mask]  # (N,)
    entropy = -(logp_all.exp() * logp_all).sum(-1)[mask]  # (N,)
    return logprobs, entropy


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), count=st.integers(1, 4), chunk_size=st.integers(1, 12),
       temperature=st.sampled_from([1.0, 0.6, 1.7]))
def test_chunked_logprobs_equal_naive_values_and_gradients(tiny, seed, count, chunk_size, temperature):
    model = _lora_model(tiny, seed=1)
    batch = TokenBatch.from_samples(_random_samples(seed, count), 0, "cpu")
    weights = torch.randn(int(batch.completion_mask.sum()), generator=torch.Generator().manual_seed(seed))

    def run(fn):
        model.zero_grad()
        logprobs, entropy = fn()
        (logprobs * weights).sum().backward()
        return logprobs.detach(), entropy.detach(), [p.grad.clone() for p in lora.lora_parameters(model)]

    fast = run(lambda: completion_logprobs(model, batch, temperature, chunk_size=chunk_size))
    slow = run(lambda: _naive(model, batch, temperature))
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(fast[1], slow[1], rtol=1e-5, atol=2e-5)
    assert not fast[1].requires_grad
    for a, b in zip(fast[2], slow[2]):  # fp32 sums in a different order: compare at the tensor's own scale
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_logprobs_match_the_samplers_own(tiny):
    """Right-padded training forward == left-padded, KV-cached sampling: positions, shift and temperature agree."""
    model = _lora_model(tiny, seed=2, checkpointing=False)
    tokenizer = tiny[1]
    torch.manual_seed(0)
    prompts = ["What is 1 + 1?", "Compute 12 * 3 and put the answer in a box, please."]
    completions = rollout.generate(model, tokenizer, prompts, samples_per_prompt=2, max_new_tokens=12,
                                   temperature=0.7)
    samples = [S(c.prompt_ids, c.completion_ids, c.logprobs) for row in completions for c in row]
    assert len({len(s.prompt_ids) for s in samples}) == 2  # different prompt lengths: padding is exercised
    batch = TokenBatch.from_samples(samples, tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, batch, temperature=0.7, chunk_size=5)
    sampler = torch.tensor([lp for s in samples for lp in s.sampler_logprobs])
    torch.testing.assert_close(logprobs, sampler, rtol=0, atol=1e-4)
    with torch.no_grad():  # and the temperature matters: at tau = 1 they differ
        assert (completion_logprobs(model, batch, temperature=1.0)[0] - sampler).abs().max() > 1e-2


def test_importance_sampling_loss_formula():
    logprobs = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    sampler = torch.tensor([-1.1, -2.0, -0.4])
    advantages = torch.tensor([0.5, 0.5, -1.0])
    loss, ratio = train.importance_sampling_loss(logprobs, sampler, advantages, normalizer=4.0)
    expected_ratio = torch.exp(logprobs.detach() - sampler)
    torch.testing.assert_close(ratio.detach(), expected_ratio)
    torch.testing.assert_close(loss.detach(), -(expected_ratio * advantages).sum() / 4.0)
    loss.backward()  # d loss / d logprob_t = -ratio_t * A_t / C
    torch.testing.assert_close(logprobs.grad, -expected_ratio * advantages / 4.0)


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), max_size=20), max_tokens=st.integers(1, 120))
def test_pack_micro_batches(lengths, max_tokens):
    batches = pack_micro_batches(lengths, max_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)  # longest first: similar lengths share a micro-batch


def _grads(model, samples, **kwargs):
    model.zero_grad(set_to_none=True)
    metrics = train.accumulate_gradients(model, samples, loss_normalizer=100.0, **kwargs)
    return [p.grad.clone() for p in lora.lora_parameters(model)], metrics


def test_gradient_does_not_depend_on_micro_batching_and_skips_zero_advantages(tiny):
    model = _lora_model(tiny, seed=3)
    samples = _random_samples(7, 5)
    with torch.no_grad():  # on-policy sampler log-probs
        for s in samples:
            s.sampler_logprobs = completion_logprobs(
                model, TokenBatch.from_samples([s], 0, "cpu"))[0].tolist()
    whole, metrics = _grads(model, samples, micro_batch_tokens=10_000)
    split, _ = _grads(model, samples, micro_batch_tokens=1)  # one sample per micro-batch
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert abs(metrics["train/importance_ratio_mean"] - 1) < 1e-5  # on-policy: ratio 1
    zero = S([5, 6, 7], [8, 9], [-1.0, -1.0], advantage=0.0)
    with_zero, metrics_zero = _grads(model, samples + [zero], micro_batch_tokens=10_000)
    for a, b in zip(whole, with_zero):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert metrics_zero["train/samples_trained"] == len(samples)


def test_a_few_steps_raise_positive_and_lower_negative_logprobs(tiny):
    model = _lora_model(tiny, seed=4)
    samples = _random_samples(11, 4, max_completion=6)
    for s, a in zip(samples, [1.0, -1.0, 0.5, -0.5]):
        s.advantage = a

    def sequence_logprobs():
        with torch.no_grad():
            out = []
            for s in samples:
                out.append(completion_logprobs(model, TokenBatch.from_samples([s], 0, "cpu"))[0])
            return out

    for s, lp in zip(samples, sequence_logprobs()):
        s.sampler_logprobs = lp.tolist()
    before = [lp.sum() for lp in sequence_logprobs()]
    optimizer = torch.optim.AdamW(lora.lora_parameters(model), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(5):
        train.train_step(model, optimizer, samples, loss_normalizer=10.0)
    after = [lp.sum() for lp in sequence_logprobs()]
    for s, b, a in zip(samples, before, after):
        assert (a > b) if s.advantage > 0 else (a < b), (s.advantage, float(b), float(a))


def test_roles_train_their_own_adapter(tiny):
    """Two-model variant: aggregation samples move phi ("aggregator") only, search samples theta only."""
    model = copy.deepcopy(tiny[0])
    lora.add_lora(model, rank=4, adapter_name="default")
    lora.add_lora(model, rank=4, adapter_name="aggregator")
    optimizer = torch.optim.AdamW([{"params": lora.lora_parameters(model, n)} for n in ("default", "aggregator")],
                                  lr=1e-2)
    search = _random_samples(1, 2)
    for s in search:
        s.sampler_logprobs = [-2.0] * len(s.completion_ids)
    snapshot = {n: [p.clone() for p in lora.lora_parameters(model, n)] for n in ("default", "aggregator")}
    metrics = train.train_step(model, optimizer, search, loss_normalizer=10.0,
                               adapter_for_role={"aggregation": "aggregator"})
    changed = {n: any(not torch.equal(a, b) for a, b in zip(lora.lora_parameters(model, n), snapshot[n]))
               for n in snapshot}
    assert changed == {"default": True, "aggregator": False}
    assert "train/grad_norm" in metrics and "train/grad_norm_aggregator" not in metrics
    aggregation = _random_samples(2, 2)
    for s in aggregation:
        s.role, s.sampler_logprobs = "aggregation", [-2.0] * len(s.completion_ids)
    snapshot = [p.clone() for p in lora.lora_parameters(model, "default")]
    metrics = train.train_step(model, optimizer, aggregation, loss_normalizer=10.0,
                               adapter_for_role={"aggregation": "aggregator"})
    assert "train/grad_norm_aggregator" in metrics and "train/entropy_aggregation" in metrics
    # theta has Adam momentum from the first step, but no gradient now: AdamW leaves grad-less parameters alone.
    assert all(torch.equal(a, b) for a, b in zip(lora.lora_parameters(model, "default"), snapshot))


# ----------------------------------------------------------------------------------------------------------------------
# Any causal LM: decoder and head through transformers' accessors; models that post-process logits are refused.

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)


def _from_config(kind, **overrides):
    """A small random causal LM built offline from its config, in eval mode (no dropout)."""
    import transformers

    torch.manual_seed(0)
    config = {
        "gpt2": lambda: transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                                **overrides),
        "llama": lambda: transformers.LlamaConfig(**SMALL, **overrides),
        "gemma2": lambda: transformers.Gemma2Config(**SMALL, **overrides),
        "granite": lambda: transformers.GraniteConfig(**SMALL, **overrides),
        "cohere": lambda: transformers.CohereConfig(**SMALL, **overrides),
    }[kind]()
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _small_batch(seed=0, count=3, vocab=128):
    samples = _random_samples(seed, count)
    for s in samples:
        s.prompt_ids = [t % vocab for t in s.prompt_ids]
        s.completion_ids = [t % vocab for t in s.completion_ids]
    return TokenBatch.from_samples(samples, 0, "cpu")


@pytest.mark.parametrize("kind, overrides", [("gpt2", {}), ("llama", {}),
                                             ("gemma2", {"final_logit_softcapping": None})])
def test_other_architectures_equal_naive_values_and_gradients(kind, overrides):
    """GPT-2 (no model.model, no q_proj), Llama, and a Gemma-2 without soft-capping: chunked == naive."""
    model = _from_config(kind, **overrides)
    batch = _small_batch(seed=5)
    weights = torch.randn(int(batch.completion_mask[:, 1:].sum()), generator=torch.Generator().manual_seed(1))

    def run(fn):
        model.zero_grad()
        logprobs, entropy = fn()
        (logprobs * weights).sum().backward()
        return logprobs.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    fast = run(lambda: completion_logprobs(model, batch, 0.8, chunk_size=3))
    slow = run(lambda: _naive(model, batch, 0.8))
    torch.testing.assert_close(fast[0], slow[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(fast[1], slow[1], rtol=1e-5, atol=2e-5)
    for a, b in zip(fast[2], slow[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(float(b.abs().max()), 1e-3))


@pytest.mark.parametrize("kind, overrides, setting", [
    ("gemma2", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ("granite", {"logits_scaling": 4.0}, "logits_scaling=4.0"),
    ("cohere", {}, "logit_scale=0.0625"),
])
def test_models_that_post_process_logits_are_refused(kind, overrides, setting):
    model = _from_config(kind, **overrides)
    batch = _small_batch(seed=6)
    with pytest.raises(ValueError, match=rf"logits are not head\(hidden state\): its config sets {setting}"):
        completion_logprobs(model, batch)
    if kind != "gemma2":  # the refusal matters: head(hidden) would be this far off (a cap of 30 barely bites here)
        with torch.no_grad():
            full = model(batch.input_ids).logits.log_softmax(-1)  # (B, T, V)
            head = model.get_output_embeddings()(model.get_decoder()(batch.input_ids).last_hidden_state)
            assert (full - head.log_softmax(-1)).abs().max() > 0.1


def test_a_post_processing_that_no_config_field_names_is_caught_by_the_probe_once(tiny):
    model = copy.deepcopy(tiny[0]).eval()
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, out: calls.append(1), with_kwargs=True)
    batch = _small_batch(seed=7, vocab=1000)
    completion_logprobs(model, batch)
    completion_logprobs(model, batch)
    assert len(calls) == 1  # one probe forward of the whole model, then the cached verdict

    doubled = copy.deepcopy(tiny[0]).eval()

    def double(module, args, kwargs, out):
        out.logits = out.logits * 2
        return out

    doubled.register_forward_hook(double, with_kwargs=True)
    with pytest.raises(ValueError, match=r"logits are not head\(hidden state\): on a probe, they differ by up to"):
        completion_logprobs(doubled, batch)


def test_wrappers_are_unwrapped_and_non_causal_models_refused(tiny):
    class Wrapper(torch.nn.Module):  # what peft's PeftModel offers: get_base_model()
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_base_model(self):
            return self.inner

    model = _lora_model(tiny, seed=8, checkpointing=False)
    batch = _small_batch(seed=8, vocab=1000)
    with torch.no_grad():
        torch.testing.assert_close(completion_logprobs(Wrapper(Wrapper(model)), batch)[0],
                                   completion_logprobs(model, batch)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"cannot find Qwen3Model's decoder and output head"):
        completion_logprobs(model.model, batch)


def test_a_real_peft_model_works(tiny):
    """Runs only where peft is installed (it is not a dependency)."""
    peft = pytest.importorskip("peft")
    base = copy.deepcopy(tiny[0]).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False))
    batch = _small_batch(seed=9, vocab=1000)
    with torch.no_grad():
        torch.testing.assert_close(completion_logprobs(model, batch)[0], _naive(model, batch, 1.0)[0],
                                   rtol=1e-5, atol=2e-5)


def test_as_rows_aligns_with_input_ids_and_keeps_gradients(tiny):
    model = _lora_model(tiny, seed=10, checkpointing=False)
    batch = _small_batch(seed=10, vocab=1000)
    flat, _ = completion_logprobs(model, batch, chunk_size=4)
    rows, entropy_rows = completion_logprobs(model, batch, chunk_size=4, as_rows=True)
    assert rows.shape == entropy_rows.shape == batch.input_ids.shape
    assert torch.equal(rows[batch.completion_mask], flat) and not rows[~batch.completion_mask].any()
    with torch.no_grad():  # rows[b, t] = log softmax(logits[b, t-1])[input_ids[b, t]]
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=position_ids_from_mask(batch.attention_mask)).logits.float()  # (B, T, V)
    b, t = batch.completion_mask.nonzero()[-1].tolist()
    assert float(rows.detach()[b, t]) == pytest.approx(float(logits[b, t - 1].log_softmax(-1)[batch.input_ids[b, t]]),
                                              abs=2e-5)
    rows.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora.lora_parameters(model))


def test_left_padding_gives_the_right_padded_values(tiny):
    """verl's layout: prompts left-padded, responses right-padded. Positions come from the mask, so it agrees."""
    model = tiny[0].eval()
    right = _small_batch(seed=11, vocab=1000)
    shift = [int(n) for n in (right.attention_mask.shape[1] - right.attention_mask.sum(1))]
    left = TokenBatch(*[torch.stack([torch.roll(x[i], shift[i]) for i in range(len(shift))]) for x in
                        (right.input_ids, right.attention_mask, right.completion_mask)])
    assert left.attention_mask[:, 0].eq(0).any()  # some row really is left-padded
    with torch.no_grad():
        torch.testing.assert_close(completion_logprobs(model, left)[0], completion_logprobs(model, right)[0],
                                   rtol=1e-5, atol=2e-5)


def test_a_completion_at_position_0_is_refused(tiny):
    ids = torch.tensor([[5, 6, 7]])
    batch = TokenBatch(ids, torch.ones_like(ids), torch.tensor([[True, True, True]]))
    with pytest.raises(ValueError, match="position 0 has no context"):
        completion_logprobs(tiny[0], batch)
