"""The grouped learner (shared_prompt.py) against the per-sample reference: each prompt once per group gives the same
per-token log-probs, entropies, loss and LoRA gradients (fp32, 1e-5) over random group sizes, prompt and completion
lengths, EOS positions, temperatures, lm_head chunk sizes, both adapters and both checkpointing modes; micro-batches
hold every sample once and split a group only when it would not fit; selective checkpointing removes the attention
recomputations without changing the gradient; a model the grouped path does not fit trains per sample."""

import copy
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import lora
import rollout
import shared_prompt
import spiral
import train
from logprobs import TokenBatch, completion_logprobs

EOS = 2  # the tiny tokenizer's <|im_end|>


@pytest.fixture(scope="module")
def tiny():
    return rollout.load_policy("tiny", device="cpu")


def _lora_model(tiny, seed=0, checkpointing=True, keep_attention_outputs=False, adapters=("default",)):
    model = copy.deepcopy(tiny[0])
    torch.manual_seed(seed)
    for name in adapters:
        lora.add_lora(model, rank=4, alpha=8, adapter_name=name)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # B != 0 so the adapters matter and every parameter gets a gradient
        for name in adapters:
            for p in lora.lora_parameters(model, name):
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    if checkpointing:
        train.enable_gradient_checkpointing(model, keep_attention_outputs)
    model.train()
    return model


def _random_groups(seed, max_groups=3, max_size=4, max_prompt=9, max_completion=9):
    """Samples of 1..max_groups prompts with 1..max_size completions each, interleaved as spiral.py never does;
    a completion ends with EOS about half the time (a stopped trace) and is cut at the budget otherwise."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    samples = []
    for _ in range(draw(1, max_groups)):
        prompt = torch.randint(3, 1000, (draw(1, max_prompt),), generator=g).tolist()
        role = ["search", "aggregation"][draw(0, 1)]
        for _ in range(draw(1, max_size)):
            completion = torch.randint(3, 1000, (draw(1, max_completion),), generator=g).tolist()
            if draw(0, 1):
                completion[-1] = EOS
            sampler = (-3 - torch.rand(len(completion), generator=g)).tolist()
            samples.append(spiral.Sample(prompt, completion, sampler, float(torch.randn(1, generator=g)), role))
    order = torch.randperm(len(samples), generator=g).tolist()
    return [samples[i] for i in order]


def _grads(model, adapters):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for name in adapters for p in lora.lora_parameters(model, name)]


def _assert_grads_close(a, b):
    """Equal to 1e-5 of the gradient's scale (its largest entry over all LoRA tensors): fp32 sums in another order
    differ by ~1e-7 of it, so a tensor whose own entries are 1e-5 of that scale may differ by 1e-4 of itself."""
    assert len(a) == len(b)
    scale = max(float(y.abs().max()) for y in b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5 * scale)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), chunk_size=st.integers(1, 7), temperature=st.sampled_from([1.0, 0.6, 1.3]))
def test_grouped_logprobs_and_entropies_equal_one_row_per_sample(tiny, seed, chunk_size, temperature):
    model = _lora_model(tiny, seed=1)
    samples = _random_groups(seed)
    batch = shared_prompt.PackedBatch.from_parts(shared_prompt.group_by_prompt(samples), "cpu")
    weights = torch.randn(sum(len(s.completion_ids) for s in batch.samples),
                          generator=torch.Generator().manual_seed(seed))

    def run(forward, context):
        model.zero_grad(set_to_none=True)
        with context:  # held over the backward, as train.py does: checkpointing recomputes the forward there
            logprobs, entropy = forward()
            (logprobs * weights).sum().backward()
        return logprobs.detach(), entropy, _grads(model, ["default"])

    shared = run(lambda: shared_prompt.grouped_logprobs(model, batch, temperature, chunk_size),
                 shared_prompt.sharing_prompts(model))
    alone = run(lambda: completion_logprobs(model, TokenBatch.from_samples(batch.samples, 0, "cpu"), temperature,
                                            chunk_size), torch.enable_grad())
    torch.testing.assert_close(shared[0], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[1], alone[1], rtol=1e-5, atol=1e-5)
    _assert_grads_close(shared[2], alone[2])


CASES = [dict(checkpointing=True), dict(checkpointing=False), dict(checkpointing=True, keep_attention_outputs=True)]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), case=st.sampled_from(CASES), separate=st.booleans(),
       budget=st.sampled_from([8, 20, 10_000]))
def test_the_grouped_learner_s_loss_metrics_and_gradients_equal_the_per_sample_learner(tiny, seed, case, separate,
                                                                                        budget):
    """Both adapters (--separate-aggregator sends aggregation samples to phi), any micro-batch budget (8 tokens
    splits most groups into parts), checkpointing on, off and keeping attention outputs."""
    adapters = ("default", "aggregator") if separate else ("default",)
    model = _lora_model(tiny, seed=2, adapters=adapters, **case)
    samples = _random_groups(seed)
    kwargs = dict(loss_normalizer=37.0, temperature=0.8, micro_batch_tokens=budget, chunk_size=3,
                  adapter_for_role={"aggregation": "aggregator"} if separate else None)
    results = {}
    for learner in ("grouped", "per-sample"):
        model.zero_grad(set_to_none=True)
        metrics = train.accumulate_gradients(model, samples, learner=learner, **kwargs)
        results[learner] = metrics, _grads(model, adapters)
    (m_shared, g_shared), (m_alone, g_alone) = results["grouped"], results["per-sample"]
    assert set(m_shared) == set(m_alone)
    assert m_shared == pytest.approx(m_alone, rel=1e-5, abs=1e-7)
    _assert_grads_close(g_shared, g_alone)
    assert sum(float(g.abs().sum()) for g in g_shared) > 0


def test_a_packed_row_continues_each_completion_from_its_prompt():
    a = spiral.Sample([10, 11, 12], [20, 21], [0.0] * 2, 1.0, "search")
    b = spiral.Sample([10, 11, 12], [30], [0.0], 1.0, "search")
    c = spiral.Sample([40], [50, 51], [0.0] * 2, 1.0, "search")
    batch = shared_prompt.PackedBatch.from_parts([[a, b], [c]], "cpu")
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21, 30, 40, 50, 51]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2]]
    assert batch.layout.groups == (((0, 3), ((3, 5), (5, 6))), ((6, 7), ((7, 9),)))
    # y_1 is predicted by the prompt's last token, never by the sibling just before it in the row
    assert batch.predictor_T.tolist() == [2, 3, 2, 6, 7]
    assert batch.target_T.tolist() == [20, 21, 30, 50, 51]


def test_samples_group_by_equal_prompts_in_order_of_first_appearance():
    a1, b1, a2, c1, b2 = (spiral.Sample(p, [9], [0.0], 1.0, "search") for p in ([1, 2], [3], [1, 2], [1], [3]))
    assert shared_prompt.group_by_prompt([a1, b1, a2, c1, b2]) == [[a1, a2], [b1, b2], [c1]]


def test_a_completion_never_sees_its_siblings(tiny):
    """Changing one completion's tokens leaves every other completion's log-probs exactly as they were."""
    model = _lora_model(tiny, seed=3, checkpointing=False).eval()
    prompt = [5, 6, 7, 8]
    first = [spiral.Sample(prompt, [9, 10, 11], [0.0] * 3, 1.0, "search"),
             spiral.Sample(prompt, [12, 13, 14, 15], [0.0] * 4, 1.0, "search")]
    for changed in ([dataclasses.replace(first[0], completion_ids=[300, 301, 302]), first[1]],
                    [first[0], dataclasses.replace(first[1], completion_ids=[300, 301, 302, 303])]):
        with torch.no_grad():
            lp_first = shared_prompt.grouped_logprobs(model, shared_prompt.PackedBatch.from_parts([first], "cpu"))[0]
            lp_changed = shared_prompt.grouped_logprobs(model,
                                                        shared_prompt.PackedBatch.from_parts([changed], "cpu"))[0]
        same = slice(3, None) if changed[1] is first[1] else slice(0, 3)  # the completion left as it was
        other = slice(0, 3) if changed[1] is first[1] else slice(3, None)
        assert torch.equal(lp_first[same], lp_changed[same])
        assert not torch.equal(lp_first[other], lp_changed[other])


def _cost(part):
    return len(part[0].prompt_ids) + sum(len(s.completion_ids) for s in part)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 30), st.lists(st.integers(1, 20), min_size=1, max_size=6)),
                      max_size=8),
       max_tokens=st.integers(1, 80))
def test_pack_groups_holds_every_sample_once_and_splits_only_what_would_not_fit(sizes, max_tokens):
    groups = [[spiral.Sample([g] * P, [1] * L, [0.0] * L, 1.0, "search") for L in lengths]
              for g, (P, lengths) in enumerate(sizes)]
    batches = shared_prompt.pack_groups(groups, max_tokens)
    packed = [id(s) for b in batches for part in b for s in part]
    assert sorted(packed) == sorted(id(s) for g in groups for s in g)
    for b in batches:
        for part in b:
            assert len({tuple(s.prompt_ids) for s in part}) == 1  # one prompt per part
        assert sum(_cost(part) for part in b) <= max_tokens or (len(b) == 1 and len(b[0]) == 1)
    parts_of = {}
    for b in batches:
        for part in b:
            parts_of.setdefault(part[0].prompt_ids[0], []).append(part)
    for g, group in enumerate(groups):
        if _cost(group) <= max_tokens:
            assert len(parts_of[g]) == 1  # a group that fits is never split
        else:  # a split is needed: no two consecutive parts (in the group's order) could have been one
            parts = sorted(parts_of[g], key=lambda part: [id(s) for s in group].index(id(part[0])))
            assert all(_cost(x + y[:1]) > max_tokens for x, y in zip(parts, parts[1:]))


class AttentionKernelCount(TorchDispatchMode):
    """Calls of the fused attention kernels (forward) while active."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("learner", ["grouped", "per-sample"])
def test_keeping_attention_outputs_removes_the_backward_s_attention_recomputation(tiny, one_thread, learner):
    samples = _random_groups(17, max_groups=2)
    layers = tiny[0].config.num_hidden_layers
    calls, grads = {}, {}
    for keep in (False, True):
        model = _lora_model(tiny, seed=4, keep_attention_outputs=keep)
        kwargs = dict(loss_normalizer=9.0, micro_batch_tokens=10_000, learner=learner)
        train.accumulate_gradients(model, samples, **kwargs)  # the one-time probes run here, uncounted
        model.zero_grad(set_to_none=True)
        counter = AttentionKernelCount()
        with counter:
            train.accumulate_gradients(model, samples, **kwargs)
        calls[keep], grads[keep] = counter.calls, _grads(model, ["default"])
    per_forward = layers * (sum(1 + len(g) for g in shared_prompt.group_by_prompt(samples))
                            if learner == "grouped" else 1)  # grouped: a prompt call + one per completion
    assert calls == {False: 2 * per_forward, True: per_forward}  # the recomputation's attention calls are gone
    _assert_grads_close(grads[True], grads[False])


def test_a_model_the_grouped_path_does_not_fit_trains_per_sample(tiny, monkeypatch):
    model = _lora_model(tiny, seed=5, checkpointing=False)
    assert shared_prompt.unsupported(model) == ""
    samples = _random_groups(3)
    model.zero_grad(set_to_none=True)
    train.accumulate_gradients(model, samples, loss_normalizer=5.0)
    reference = _grads(model, ["default"])
    model._shared_prompt_probe = "its log-probs differ by up to 0.5"  # the probe's cached verdict
    monkeypatch.setattr(shared_prompt, "grouped_logprobs", lambda *a, **k: pytest.fail("grouped path used"))
    model.zero_grad(set_to_none=True)
    train.accumulate_gradients(model, samples, loss_normalizer=5.0)
    _assert_grads_close(_grads(model, ["default"]), reference)


def test_the_probe_refuses_sliding_windows_and_a_wrong_layout(tiny, monkeypatch):
    model = copy.deepcopy(tiny[0])
    model.config.layer_types = ["sliding_attention"] + model.config.layer_types[1:]
    assert "(sliding-window attention)" in shared_prompt.unsupported(model)
    model = copy.deepcopy(tiny[0])
    real = shared_prompt.PackedBatch.from_parts

    def restarting_positions(parts, device):  # a plausible bug: every segment's positions restart at 0
        batch = real(parts, device)
        batch.position_ids = torch.cat([torch.arange(b - a) for (a, b), cs in batch.layout.groups
                                        for a, b in [(a, b)] + list(cs)])[None]
        return batch

    monkeypatch.setattr(shared_prompt.PackedBatch, "from_parts", staticmethod(restarting_positions))
    assert "differ" in shared_prompt.unsupported(model)


def test_the_demo_trains_grouped(tiny):
    assert train.resolve_config({"preset": "tiny"}).learner == "grouped"
    assert shared_prompt.unsupported(copy.deepcopy(tiny[0])) == ""
