"""rollout.py's sampling: `generate` on the tiny policy (lengths, EOS and truncation, grouping, determinism, sampler log-probs and entropies equal to a teacher-forced
pass), and generation micro-batches sized from the KV-cache bytes per token."""

import pytest
import torch
from transformers import GenerationConfig

import rollout
from tiny import build_tiny_model

# ----------------------------------------------------------------------------------------------------------------------
# Sampling on the tiny policy


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads; on a busy 2-core machine they spin (10x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny():
    return rollout.load_policy("tiny", device="cpu")


@pytest.fixture(scope="module")
def eos_ids(tiny):
    model, tokenizer = tiny
    return tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])


def stop_biased_model(tokenizer, bias_by_token: dict[int, float]):
    """A fresh tiny model whose lm_head adds a bias to some tokens' logits (part of the model, so teacher forcing
    sees it too)."""
    model = build_tiny_model(tokenizer)
    bias = torch.zeros(model.lm_head.out_features)
    for token, value in bias_by_token.items():
        bias[token] = value
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model


def teacher_forced(model, completion, temperature):
    """(log-probs, entropies) of each completion token under softmax(logits / T), from one forward pass over the
    unpadded sequence, with the full-vocabulary softmax written out."""
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])  # (1, T)
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature  # (T, V)
    logprobs = torch.log_softmax(logits, dim=-1)  # (T, V)
    entropies = -(logprobs.exp() * logprobs).sum(-1)  # (T,)
    start = len(completion.prompt_ids) - 1  # the logits at position t predict token t + 1
    positions = torch.arange(start, start + len(completion.completion_ids))
    return logprobs[positions, torch.tensor(completion.completion_ids)], entropies[positions]


def teacher_forced_logprobs(model, completion, temperature):
    return teacher_forced(model, completion, temperature)[0]


PROMPTS = [  # different lengths, so batches are left-padded
    rollout.search_prompt("What is 12 + 34?"),
    "Hi",
    rollout.search_prompt("Let x = y - z; compute x^2 + 2x + 1 when y = 3 and z = 1, and explain each step."),
]


def test_cut_at_first_eos_is_by_position_not_by_pad():
    im_end, endoftext = 2, 0  # endoftext is also the pad id, as in Qwen3
    # a real stop on the pad id, followed by pad filler: the stop token must stay
    assert rollout.cut_at_first_eos([5, 7, endoftext, endoftext, endoftext], [im_end, endoftext]) == ([5, 7, 0], False)
    assert rollout.cut_at_first_eos([5, im_end, endoftext, 9], [im_end, endoftext]) == ([5, 2], False)
    assert rollout.cut_at_first_eos([im_end], [im_end]) == ([2], False)
    assert rollout.cut_at_first_eos([5, 6, 7], [im_end, endoftext]) == ([5, 6, 7], True)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_sampler_logprobs_equal_teacher_forcing(tiny, share_prefix):
    model, tokenizer = tiny
    torch.manual_seed(0)
    out = rollout.generate(
        model, tokenizer, PROMPTS, samples_per_prompt=2, max_new_tokens=10, temperature=0.7, micro_batch_size=4,
        share_prefix=share_prefix,
    )
    for prompt, completions in zip(PROMPTS, out):
        assert len(completions) == 2
        for c in completions:
            assert c.prompt_ids == rollout.chat_prompt_ids(tokenizer, prompt)  # no padding left in
            assert len(c.logprobs) == len(c.completion_ids) == 10 and c.truncated
            expected, expected_entropies = teacher_forced(model, c, temperature=0.7)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
            # The recorded entropy is the sampling distribution's, H(softmax(logits / T)), at every step.
            torch.testing.assert_close(torch.tensor(c.entropies), expected_entropies, atol=1e-4, rtol=0)


def test_eos_cut_and_truncation_flags(tiny, eos_ids):
    _, tokenizer = tiny
    im_end, endoftext = eos_ids
    model = stop_biased_model(tokenizer, {im_end: 5.0, endoftext: 5.0})  # each step stops with p ~ 0.22
    torch.manual_seed(1)
    max_new_tokens = 6
    out = rollout.generate(
        model, tokenizer, PROMPTS[:2], samples_per_prompt=16, max_new_tokens=max_new_tokens, micro_batch_size=32
    )
    completions = [c for group in out for c in group]
    for c in completions:
        assert len(c.logprobs) == len(c.entropies) == len(c.completion_ids) >= 1
        body = c.completion_ids if c.truncated else c.completion_ids[:-1]
        assert not set(body) & {im_end, endoftext}  # the first EOS ends the completion
        if c.truncated:
            assert len(c.completion_ids) == max_new_tokens
        else:
            assert c.completion_ids[-1] in (im_end, endoftext)
            assert len(c.completion_ids) <= max_new_tokens
        assert "<|im_end|>" not in c.text and "<|endoftext|>" not in c.text
        expected, expected_entropies = teacher_forced(model, c, 1.0)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(c.entropies), expected_entropies, atol=1e-4, rtol=0)
    last_tokens = [c.completion_ids[-1] for c in completions if not c.truncated]
    assert endoftext in last_tokens, "a stop on the pad id (<|endoftext|>) must be kept as the completion's EOS"
    assert im_end in last_tokens
    assert any(c.truncated for c in completions) and not all(c.truncated for c in completions)
    assert len({len(c.completion_ids) for c in completions}) > 1  # rows of one batch end at different lengths


@pytest.mark.parametrize("micro_batch_size", [2, 4, None])
def test_grouping_by_prompt_and_micro_batches(tiny, micro_batch_size):
    model, tokenizer = tiny
    out = rollout.generate(
        model, tokenizer, PROMPTS, samples_per_prompt=3, max_new_tokens=3, micro_batch_size=micro_batch_size
    )
    assert [len(group) for group in out] == [3, 3, 3]
    for prompt, group in zip(PROMPTS, out):
        assert all(c.prompt_ids == rollout.chat_prompt_ids(tokenizer, prompt) for c in group)


def test_micro_batch_plan_covers_every_sample_once():
    lengths = [30, 10, 20, 10, 50]
    for samples, size in [(3, 2), (3, 3), (3, 7), (4, 16), (1, 2)]:
        calls = rollout._plan_micro_batches(lengths, samples, size)
        assert all(len(indices) * copies <= size for indices, copies in calls)
        counts = [0] * len(lengths)
        for indices, copies in calls:
            for i in indices:
                counts[i] += copies
        assert counts == [samples] * len(lengths)
        # Shortest prompts first, so that a call's prompts have similar lengths (little left padding).
        order = [i for indices, copies in calls for i in dict.fromkeys(indices)]
        assert [lengths[i] for i in dict.fromkeys(order)] == sorted(lengths)
    assert rollout._plan_micro_batches([30, 10, 20, 10], 1, 2) == [([1, 3], 1), ([2, 0], 1)]


def test_every_eos_id_ends_a_completion():
    """The stop ids are the model's generation_config.eos_token_id (an int or a list) and the tokenizer's EOS; a
    model that defines neither is refused."""
    from types import SimpleNamespace

    def stops(configured, tokenizer_eos):
        model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=configured))
        return rollout.eos_token_ids(model, SimpleNamespace(eos_token_id=tokenizer_eos))

    assert stops([5, 6], 7) == [5, 6, 7] and stops(5, 7) == [5, 7] and stops(None, 7) == [7]
    assert stops([5, 7], 7) == [5, 7] and stops(5, None) == [5]
    with pytest.raises(ValueError, match="defines no EOS token"):
        stops(None, None)


def test_deterministic_under_manual_seed(tiny):
    model, tokenizer = tiny

    def sample(seed):
        torch.manual_seed(seed)
        out = rollout.generate(model, tokenizer, PROMPTS[:2], samples_per_prompt=2, max_new_tokens=6)
        return [(c.completion_ids, c.logprobs) for group in out for c in group]

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def hostile_generation_config(model):
    """Sampling settings a model's generation_config.json may carry (Qwen3-4B-Instruct-2507 asks for top_k=20,
    top_p=0.8, temperature=0.7), exaggerated so that any of them leaking into `generate` is visible."""
    return GenerationConfig(
        do_sample=True, temperature=0.3, top_k=1, top_p=0.05, min_p=0.9, repetition_penalty=5.0,
        eos_token_id=model.generation_config.eos_token_id, pad_token_id=model.generation_config.pad_token_id,
    )


def test_model_generation_config_does_not_leak_in(tiny):
    """A repetition penalty or temperature from the model's generation_config would change the sampler's
    log-probs; top-k, top-p or min-p would make the samples (nearly) identical."""
    _, tokenizer = tiny
    model = build_tiny_model(tokenizer)
    hostile = hostile_generation_config(model)
    model.generation_config = hostile
    torch.manual_seed(0)
    (group,) = rollout.generate(model, tokenizer, [PROMPTS[0]], samples_per_prompt=6, max_new_tokens=6)
    assert model.generation_config is hostile  # restored
    assert len({tuple(c.completion_ids) for c in group}) > 1  # top_k=1 would make every sample the same
    for c in group:  # a repetition penalty or temperature 0.3 would change the sampled distribution
        torch.testing.assert_close(torch.tensor(c.logprobs), teacher_forced_logprobs(model, c, 1.0), atol=1e-4, rtol=0)


def test_first_token_frequencies_follow_softmax_at_the_temperature(tiny):
    """Sampled tokens follow softmax(logits / T): the empirical first-token distribution of 2,000 samples
    matches it, even with a model whose generation_config asks for top-k, top-p, min-p and another temperature."""
    _, tokenizer = tiny
    favoured = [10, 11, 12, 13]
    model = stop_biased_model(tokenizer, dict(zip(favoured, [6.0, 5.5, 5.0, 4.5])))
    model.generation_config = hostile_generation_config(model)
    temperature, n = 0.8, 2000
    prompt_ids = rollout.chat_prompt_ids(tokenizer, PROMPTS[0])
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt_ids])).logits[0, -1] / temperature, dim=-1)  # (V,)
    expected = torch.cat([probs[favoured], 1 - probs[favoured].sum(0, keepdim=True)])  # (5,)
    torch.manual_seed(0)
    (group,) = rollout.generate(
        model, tokenizer, [PROMPTS[0]], samples_per_prompt=n, max_new_tokens=1, temperature=temperature
    )
    first = torch.tensor([c.completion_ids[0] for c in group])
    others = ~torch.isin(first, torch.tensor(favoured))
    observed = torch.tensor([(first == t).float().mean() for t in favoured] + [others.float().mean()])  # (5,)
    # Total variation distance; sampling noise is ~0.02. Ignoring the temperature would give 0.31, applying it
    # twice (T^2) 0.18; top-k, top-p or min-p would cut the many unfavoured tokens (21% of the mass).
    assert (observed - expected).abs().sum() / 2 < 0.05
    assert abs(group[0].logprobs[0] - probs[group[0].completion_ids[0]].log().item()) < 1e-4


def test_generate_restores_train_mode(tiny):
    model, tokenizer = tiny
    model.train()
    try:
        rollout.generate(model, tokenizer, ["Hi"], samples_per_prompt=1, max_new_tokens=2)
        assert model.training
    finally:
        model.eval()


def test_sampling_builds_no_autograd_graph(tiny):
    """Every forward inside generate, the shared-prefix prefill included, runs without autograd: in training the
    LoRA weights require grad, and a graph over a 17k-token prompt would keep every layer's activations alive."""
    model, tokenizer = tiny
    assert any(p.requires_grad for p in model.parameters())
    grad_enabled = []
    hook = model.model.layers[0].register_forward_hook(lambda *args: grad_enabled.append(torch.is_grad_enabled()))
    try:
        rollout.generate(model, tokenizer, ["Hi there, a prompt of a few tokens"], samples_per_prompt=3,
                         max_new_tokens=2, share_prefix=True)
    finally:
        hook.remove()
    assert len(grad_enabled) >= 2 and not any(grad_enabled)  # the prefill and at least one decoding step


# ----------------------------------------------------------------------------------------------------------------------
# Generation micro-batches sized from the KV cache's bytes per token

QWEN3_4B = dict(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_size=2560)


def test_kv_bytes_per_token_of_qwen3_4b():
    """Qwen3-4B's published config: 2 (K, V) x 36 layers x 8 KV heads x head_dim 128 x 2 bytes = 147,456 in bf16.
    head_dim is not hidden_size / heads there (2560 / 32 = 80): the config's own head_dim must win."""
    from transformers import Qwen3Config

    config = Qwen3Config(**QWEN3_4B)
    assert rollout.kv_bytes_per_token(config, torch.bfloat16) == 147_456
    assert rollout.kv_bytes_per_token(config, torch.float32) == 2 * 147_456
    # 18 GiB of free memory beyond a 2 GiB headroom holds 131,072 tokens; a headroom above the free memory, none.
    assert rollout.kv_token_budget(config, 20 * 2**30, 2 * 2**30, torch.bfloat16) == 131_072
    assert rollout.kv_token_budget(config, 20 * 2**30 + 147_455, 2 * 2**30, torch.bfloat16) == 131_072
    assert rollout.kv_token_budget(config, 2**30, 2 * 2**30, torch.bfloat16) == 0


def test_kv_bytes_per_token_without_head_dim_or_kv_heads():
    from types import SimpleNamespace

    no_head_dim = SimpleNamespace(num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                                  hidden_size=768, head_dim=None)  # head_dim = 768 / 12 = 64
    assert rollout.kv_bytes_per_token(no_head_dim, torch.bfloat16) == 2 * 12 * 4 * 64 * 2
    no_gqa = SimpleNamespace(num_hidden_layers=12, num_attention_heads=12, hidden_size=768)  # like GPT-2: MHA
    assert rollout.kv_bytes_per_token(no_gqa, torch.float32) == 2 * 12 * 12 * 64 * 4


def test_generation_token_budget_from_free_gpu_memory(monkeypatch):
    """On CUDA: driver-free memory plus the allocator's unused cache, minus max(4 GiB, 10% of total), over the KV
    bytes per token (faked memory figures: no GPU needed). Elsewhere: the fixed default."""
    from types import SimpleNamespace
    from transformers import Qwen3Config

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (19 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 10 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 3 * gib)
    gpu_model = SimpleNamespace(device=torch.device("cuda", 0), config=Qwen3Config(**QWEN3_4B), dtype=torch.bfloat16)
    # (19 + 10 - 3) GiB usable - max(4 GiB, 8 GiB) headroom = 18 GiB = 131,072 x 147,456 bytes
    assert rollout.generation_token_budget(gpu_model) == 131_072
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (19 * gib, 24 * gib))  # headroom 4 GiB
    assert rollout.generation_token_budget(gpu_model) == (22 * gib) // 147_456
    cpu_model = SimpleNamespace(device=torch.device("cpu"), config=Qwen3Config(**QWEN3_4B), dtype=torch.float32)
    assert rollout.generation_token_budget(cpu_model) == rollout.DEFAULT_TOKENS_PER_MICRO_BATCH


def test_micro_batches_fit_the_token_budget(tiny, monkeypatch):
    """generate's default micro-batch: as many sequences as fit `tokens_per_micro_batch` (prompt + completion)
    tokens, sized by the longest prompt; an explicit micro_batch_size wins."""
    model, tokenizer = tiny
    sizes = []
    real = rollout._sample_micro_batch

    def recording(model, prompt_ids, copies, *args):
        sizes.append(len(prompt_ids) * copies)
        return real(model, prompt_ids, copies, *args)

    monkeypatch.setattr(rollout, "_sample_micro_batch", recording)
    longest = max(len(rollout.chat_prompt_ids(tokenizer, p)) for p in PROMPTS)
    rollout.generate(model, tokenizer, PROMPTS, samples_per_prompt=4, max_new_tokens=2,
                     tokens_per_micro_batch=5 * (longest + 2) + 1)
    assert sizes == [4, 4, 4]  # 5 sequences fit, and one prompt's 4 copies go together
    sizes.clear()
    rollout.generate(model, tokenizer, PROMPTS, samples_per_prompt=4, max_new_tokens=2,
                     tokens_per_micro_batch=3 * (longest + 2))
    assert sizes == [3, 1] * 3
    sizes.clear()
    rollout.generate(model, tokenizer, PROMPTS, samples_per_prompt=4, max_new_tokens=2, micro_batch_size=12,
                     tokens_per_micro_batch=1)
    assert sizes == [12]
    sizes.clear()  # completions as long as the prompt: a sequence needs twice the prompt's tokens
    rollout.generate(model, tokenizer, PROMPTS, samples_per_prompt=4, max_new_tokens=longest,
                     tokens_per_micro_batch=4 * (longest + longest))
    assert sizes == [4, 4, 4]


def test_a_step_generate_undoes_is_not_recorded():
    """SamplerLogprobs keeps one log-prob per returned token, in order: a step run beyond the returned sequences
    (transformers may run one and undo it) is dropped from the end, never shifting the others."""
    recorder = rollout.SamplerLogprobs(temperature=0.5, prompt_length=2)
    scores = [torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([[1.0, 1.0, 0.0]]),
              torch.tensor([[0.0, 0.0, 3.0]])]
    sequence = torch.tensor([[7, 7, 2, 0, 1]])  # prompt 7 7, then the sampled tokens 2, 0 and 1
    for t, step_scores in enumerate(scores):  # the 4th call records the 3rd token
        recorder(sequence[:, :2 + t], step_scores)
    assert len(recorder.logprobs) == 3
    logprobs, entropies = recorder.finish(sequence[:, :4])  # the third step was undone: two tokens returned
    expected = [torch.log_softmax(scores[t][0] / 0.5, -1)[token] for t, token in enumerate([2, 0])]
    assert logprobs.shape == entropies.shape == (1, 2)
    assert torch.allclose(logprobs[0], torch.stack(expected))


def test_generate_passes_the_cache_without_a_deprecation_warning(tiny):
    """The shared-prefix prefill hands its cache to `generate` under the model's own keyword ("cache" in
    transformers 5.2x, "past_key_values" before), so no FutureWarning is printed on every run."""
    import inspect
    import warnings

    model, tokenizer = tiny
    assert rollout.cache_keyword(model) in inspect.signature(model.forward).parameters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rollout.generate(model, tokenizer, ["Hi there, a prompt"], samples_per_prompt=3, max_new_tokens=2)
    assert not [w for w in caught if issubclass(w.category, FutureWarning | DeprecationWarning)], \
        [str(w.message) for w in caught]
