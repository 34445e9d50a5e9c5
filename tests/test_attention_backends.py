"""Sampling's attention runs with cuDNN attention switched off (on an H100 torch picks cuDNN's SDPA kernel
by default, and it fails mid-generation); the learner runs under its own choice (--learner-attention: cuDNN or flash
on a GPU, never the memory-efficient kernel a padded mask forces). A CPU never runs cuDNN, so these tests read
torch's backend switches from inside the model's attention, during sampling (both engines, with and without the
shared-prefix prefill), the log-prob forward, and the training step's forward and backward (gradient checkpointing
recomputes the forward), and check the learner's GPU choice as a function."""

import copy

import pytest
import torch

import fastgen
import lora
import rollout
import shared_prompt
import spiral
import tiny  # noqa: F401  registers "tiny" with rollout.load_policy
import train
from logprobs import TokenBatch, completion_logprobs, learner_attention_backends
from torch.nn.attention import SDPBackend


@pytest.fixture(scope="module")
def policy():
    return rollout.load_policy("tiny", device="cpu")


def backend_switches():
    cuda = torch.backends.cuda
    return cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()


@pytest.fixture
def spy(policy):
    """The (cudnn, flash, efficient, math) switches seen by every attention call of decoder layer 0."""
    model, _ = policy
    seen = []
    attention = model.model.layers[0].self_attn
    handle = attention.register_forward_pre_hook(lambda *args: seen.append(backend_switches()))
    real_attend, real_sdpa = fastgen.attend, torch.nn.functional.scaled_dot_product_attention

    def spying(real):  # fastgen calls the layers' weights, not their forward: its decode attention and prefill SDPA
        def call(*args, **kwargs):
            seen.append(backend_switches())
            return real(*args, **kwargs)
        return call

    fastgen.attend, torch.nn.functional.scaled_dot_product_attention = spying(real_attend), spying(real_sdpa)
    yield seen
    handle.remove()
    fastgen.attend, torch.nn.functional.scaled_dot_product_attention = real_attend, real_sdpa


ALLOWED = (False, True, True, True)  # cuDNN off; flash, memory-efficient and math on


def test_the_default_would_allow_cudnn():
    """Outside the project's contexts torch allows cuDNN attention: the spy below can tell the difference."""
    assert backend_switches()[0] is True


@pytest.mark.parametrize("engine, share_prefix", [("hf", True), ("hf", False), ("fast", True)])
def test_sampling_runs_without_cudnn_attention(policy, spy, one_thread, engine, share_prefix):
    model, tokenizer = policy
    rollout.generate(model, tokenizer, ["Hi there", "What is 1 + 2?"], samples_per_prompt=2, max_new_tokens=3,
                     share_prefix=share_prefix, engine=engine)
    assert len(spy) >= 3 and set(spy) == {ALLOWED}


@pytest.mark.parametrize("learner", ["grouped", "per-sample"])
def test_the_learner_runs_forward_and_backward_under_its_own_choice(policy, one_thread, learner):
    """The log-prob forward alone keeps sampling's switches; the training forward and its recomputation in the
    backward run under the learner's kernels (on a CPU: its flash kernel and math, never memory-efficient). Read
    from a hook on the attention module, not by replacing F.scaled_dot_product_attention: torch's lower-right
    causal mask (the grouped learner's) dispatches only from the real function."""
    model, tokenizer = policy
    model = copy.deepcopy(model)
    seen = []
    handle = model.model.layers[0].self_attn.register_forward_pre_hook(lambda *args: seen.append(backend_switches()))
    lora.add_lora(model, rank=4, alpha=8.0)
    train.enable_gradient_checkpointing(model)
    model.train()
    samples = [spiral.Sample([5, 6, 7, 8], [9, 10, 11], [-1.0, -1.0, -1.0], 1.0, "search"),
               spiral.Sample([5, 6, 7, 8], [12, 13], [-1.0, -1.0], -1.0, "search")]
    try:
        with torch.no_grad():
            completion_logprobs(model, TokenBatch.from_samples(samples[:1], 0, "cpu"))
        assert shared_prompt.unsupported(model) == ""  # its one-time probe (log-probs without gradients) runs here
        forward_only = list(seen)
        seen.clear()
        train.accumulate_gradients(model, samples, loss_normalizer=3.0, pad_token_id=0, learner=learner)
    finally:
        handle.remove()
    assert len(forward_only) >= 1 and set(forward_only) == {ALLOWED}
    assert len(seen) == 2  # the training forward and its recomputation in the backward (one micro-batch)
    assert set(seen) == {(False, True, False, True)}  # cuDNN off, flash on, memory-efficient off, math on


def test_the_learner_s_kernels_on_a_gpu():
    """Half precision: cuDNN then flash, or flash alone; the memory-efficient kernel only where padding masks need
    it (the per-sample path); fp32, which neither cuDNN nor flash runs: memory-efficient and math."""
    C, F, E, M = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                  SDPBackend.MATH)
    assert learner_attention_backends("cudnn", "cuda", torch.bfloat16) == [C, F]
    assert learner_attention_backends("flash", "cuda", torch.bfloat16) == [F]
    assert learner_attention_backends("flash", "cuda", torch.float16, masked=True) == [F, E, M]
    assert learner_attention_backends("cudnn", "cuda", torch.float32) == [E, M]
    assert learner_attention_backends("cudnn", "cpu", torch.float32) == [F, M]
    with pytest.raises(ValueError, match="choose from cudnn, flash"):
        learner_attention_backends("efficient", "cuda", torch.bfloat16)
