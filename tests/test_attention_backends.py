"""Every attention of the project runs with cuDNN attention switched off (issue 18: on an H100 torch picks cuDNN's
SDPA kernel by default, and it fails mid-generation). A CPU never runs cuDNN, so these tests read torch's backend
switches from inside the model's attention, during sampling (both engines, with and without the shared-prefix
prefill), the log-prob forward, and the training step's backward (gradient checkpointing recomputes the forward)."""

import copy

import pytest
import torch

import fastgen
import lora
import rollout
import spiral
import tiny  # noqa: F401  registers "tiny" with rollout.load_policy
import train
from logprobs import TokenBatch, completion_logprobs


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


def test_logprobs_and_training_backward_run_without_cudnn_attention(policy, spy, one_thread):
    model, tokenizer = policy
    model = copy.deepcopy(model)
    spy_layer = model.model.layers[0].self_attn
    handle = spy_layer.register_forward_pre_hook(lambda *args: spy.append(backend_switches()))
    lora.add_lora(model, rank=4, alpha=8.0)
    train.enable_gradient_checkpointing(model)
    model.train()
    sample = spiral.Sample([5, 6, 7, 8], [9, 10, 11], [-1.0, -1.0, -1.0], 1.0, "search")
    try:
        with torch.no_grad():
            completion_logprobs(model, TokenBatch.from_samples([sample], 0, "cpu"))
        forward_only = len(spy)
        train.accumulate_gradients(model, [sample], loss_normalizer=3.0, pad_token_id=0)
    finally:
        handle.remove()
    assert forward_only >= 1
    assert len(spy) >= forward_only + 2  # the training forward and its recomputation in the backward
    assert set(spy) == {ALLOWED}
