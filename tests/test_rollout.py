"""rollout.py, prompts and sampling: the paper's prompts word for word, and `generate` on the tiny policy
(lengths, EOS and truncation, grouping, determinism, and sampler log-probs equal to a teacher-forced pass)."""

import pytest
import torch
from transformers import GenerationConfig

import rollout
from tiny import build_tiny_model

# ----------------------------------------------------------------------------------------------------------------------
# Prompts: the paper's appendix listings, copied verbatim.

PAPER_SEARCH = """{problem}

Please reason step by step, and put your final answer within \\boxed{}."""

PAPER_AGGREGATION_HEAD = """You are given a problem and several candidate solution traces. Some candidate solutions may be incorrect, incomplete, or truncated.

Problem:

{problem}

"""
PAPER_AGGREGATION_TAIL = """Your task is to audit the candidate traces and then synthesize a correct answer to the original problem.

Follow this process:

1. Briefly audit each candidate trace. Identify promising strategies, equations, intermediate results, or final answers that are explicitly supported by the visible text.
2. Note any apparent errors or unsupported leaps. If a candidate trace is truncated, use only the claims that are explicitly supported by the visible text.
3. Check the useful ideas for correctness against the original problem. Do not assume a candidate is correct just because it is confident or because multiple candidates agree.
4. After the audit, write a line exactly as follows: ### Final Solution:
5. Under that label, synthesize one coherent, self-contained final solution that can be judged without referring back to the candidates. Combine only the valid parts. If the candidates disagree, resolve the disagreement by reasoning from the original problem.

Put the final answer within \\boxed{}."""

PROBLEM = "Find $x$ if $2x + 3 = {7}$."  # braces in the problem must survive formatting


def test_search_prompt_is_the_papers():
    assert rollout.search_prompt(PROBLEM) == PAPER_SEARCH.replace("{problem}", PROBLEM)


def test_aggregation_prompt_with_four_candidates_is_the_papers_listing():
    expected = (
        PAPER_AGGREGATION_HEAD.replace("{problem}", PROBLEM)
        + "Solution 1:\nfirst {a}\n\nSolution 2:\nsecond\n\nSolution 3:\nthird\n\nSolution 4:\nfourth \\boxed{2}\n\n"
        + PAPER_AGGREGATION_TAIL
    )
    assert rollout.aggregation_prompt(PROBLEM, ["first {a}", "second", "third", "fourth \\boxed{2}"]) == expected


@pytest.mark.parametrize(
    "candidates, middle",
    [
        (["only one"], "Solution 1:\nonly one\n\n"),
        (["one", "two"], "Solution 1:\none\n\nSolution 2:\ntwo\n\n"),
    ],
)
def test_aggregation_prompt_with_one_or_two_candidates(candidates, middle):
    expected = PAPER_AGGREGATION_HEAD.replace("{problem}", PROBLEM) + middle + PAPER_AGGREGATION_TAIL
    assert rollout.aggregation_prompt(PROBLEM, candidates) == expected


def test_aggregation_prompt_rejects_no_candidates():
    with pytest.raises(ValueError):
        rollout.aggregation_prompt(PROBLEM, [])


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


def teacher_forced_logprobs(model, completion, temperature):
    """log softmax(logits / T) of each completion token, from one forward pass over the unpadded sequence."""
    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])  # (1, T)
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature  # (T, V)
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(completion.prompt_ids) - 1  # the logits at position t predict token t + 1
    positions = torch.arange(start, start + len(completion.completion_ids))
    return logprobs[positions, torch.tensor(completion.completion_ids)]


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
            expected = teacher_forced_logprobs(model, c, temperature=0.7)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


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
        assert len(c.logprobs) == len(c.completion_ids) >= 1
        body = c.completion_ids if c.truncated else c.completion_ids[:-1]
        assert not set(body) & {im_end, endoftext}  # the first EOS ends the completion
        if c.truncated:
            assert len(c.completion_ids) == max_new_tokens
        else:
            assert c.completion_ids[-1] in (im_end, endoftext)
            assert len(c.completion_ids) <= max_new_tokens
        assert "<|im_end|>" not in c.text and "<|endoftext|>" not in c.text
        torch.testing.assert_close(torch.tensor(c.logprobs), teacher_forced_logprobs(model, c, 1.0), atol=1e-4, rtol=0)
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
