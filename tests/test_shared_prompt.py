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

import checkpoint
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
    assert "train/learner_fallback" not in train.accumulate_gradients(model, samples, loss_normalizer=5.0)
    reference = _grads(model, ["default"])
    model._shared_prompt_probe = "its log-probs differ by up to 0.5"  # the probe's cached verdict
    monkeypatch.setattr(shared_prompt, "grouped_logprobs", lambda *a, **k: pytest.fail("grouped path used"))
    model.zero_grad(set_to_none=True)
    metrics = train.accumulate_gradients(model, samples, loss_normalizer=5.0)
    assert metrics["train/learner_fallback"] == "per-sample: its log-probs differ by up to 0.5"  # names why
    _assert_grads_close(_grads(model, ["default"]), reference)
    assert "train/learner_fallback" not in train.accumulate_gradients(model, samples, loss_normalizer=5.0,
                                                                      learner="per-sample")  # asked for: no fallback


def test_train_py_says_once_that_the_grouped_learner_does_not_apply_and_logs_why_every_step(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.setattr(shared_prompt, "unsupported", lambda model: "its layers are ['sliding_attention']")
    assert train.main(["--preset", "tiny", "--steps", "2", "--no-plot", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert out.count("--learner grouped does not apply to this model (its layers are ['sliding_attention'])") == 1
    rows = checkpoint.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    assert [r["train/learner_fallback"] for r in rows] == ["per-sample: its layers are ['sliding_attention']"] * 2


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


def test_parts_go_into_micro_batches_largest_first_so_fewer_forward_calls_are_made():
    """Parts of 3, 3, 7 and 7 tokens under a 10-token budget: largest first packs 7 + 3 twice (2 micro-batches);
    in their order of arrival 3 + 3, 7, 7 would take 3."""
    groups = [[spiral.Sample([g], [1] * (L - 1), [0.0] * (L - 1), 1.0, "search")] for g, L in enumerate([3, 3, 7, 7])]
    batches = shared_prompt.pack_groups(groups, 10)
    assert sorted(sorted(_cost(part) for part in b) for b in batches) == [[3, 7], [3, 7]]


def test_sharing_prompts_restores_the_attention_setting_when_its_block_raises(tiny):
    model = copy.deepcopy(tiny[0])
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="out of memory"):
        with shared_prompt.sharing_prompts(model):
            assert model.config._attn_implementation == shared_prompt.NAME
            raise RuntimeError("CUDA out of memory")  # what a learner's micro-batch may raise
    assert model.config._attn_implementation == before != shared_prompt.NAME


def _with_empty_completions(seed):
    """_random_groups with some completions emptied, and one group whose every completion is empty."""
    samples = _random_groups(seed, max_groups=3, max_size=3)
    for i, s in enumerate(samples):
        if i % 3 == 1:
            s.completion_ids, s.sampler_logprobs = [], []
    return samples + [spiral.Sample([7, 8, 9], [], [], 0.7, "aggregation"),
                      spiral.Sample([7, 8, 9], [], [], -0.4, "aggregation")]


@pytest.mark.parametrize("budget", [1, 12, 10_000])
def test_empty_completions_train_in_the_grouped_learner_as_in_the_per_sample_learner(tiny, budget):
    """An empty completion has no token to predict: both learners count it as a trained sample with nothing in the
    loss, including a micro-batch that holds only empty completions (budget 1: every sample its own)."""
    model = _lora_model(tiny, seed=6)
    samples = _with_empty_completions(8)
    results = {}
    for learner in ("grouped", "per-sample"):
        model.zero_grad(set_to_none=True)
        metrics = train.accumulate_gradients(model, samples, learner=learner, loss_normalizer=11.0,
                                             micro_batch_tokens=budget, chunk_size=3)
        results[learner] = metrics, _grads(model, ["default"])
    (m_shared, g_shared), (m_alone, g_alone) = results["grouped"], results["per-sample"]
    assert m_shared == pytest.approx(m_alone, rel=1e-5, abs=1e-7)
    assert m_shared["train/samples_trained"] == len(samples)
    _assert_grads_close(g_shared, g_alone)
    assert sum(float(g.abs().sum()) for g in g_shared) > 0


def test_an_empty_prompt_is_refused_by_both_learners_alike(tiny):
    """The per-sample learner refuses a completion with no token before it; the grouped one the same way, never
    predicting its first token from whatever precedes it in the packed row (another group's last token)."""
    model = _lora_model(tiny, seed=7)
    samples = _random_groups(9, max_groups=2) + [spiral.Sample([], [11, 12], [-3.0, -3.0], 1.0, "search")]
    messages = set()
    for learner in ("grouped", "per-sample"):
        with pytest.raises(ValueError, match="no context to be predicted from") as raised:
            train.accumulate_gradients(model, samples, learner=learner, loss_normalizer=3.0, micro_batch_tokens=10_000)
        messages.add(str(raised.value))
    assert len(messages) == 1


def test_groups_split_by_memory_train_as_the_per_sample_learner(tiny, monkeypatch):
    """On a CPU memory is not planned unless a budget is given (here: a stand-in for the GPU's free memory small
    enough that groups must split); the two learners still agree."""
    model = _lora_model(tiny, seed=8)
    samples = _random_groups(21, max_groups=3, max_size=4)
    memory = shared_prompt.LearnerMemory.of(model, 3)
    groups = shared_prompt.group_by_prompt(samples)
    largest = max(groups, key=len)
    free = memory.fixed + memory.part_bytes(largest[:2])  # two completions of the largest group fit, not all of it
    planned = shared_prompt.plan(model, groups, None, free, 3)
    assert len([p for b in planned for p in b if p[0].prompt_ids == largest[0].prompt_ids]) > 1  # split
    assert all(memory.peak_bytes(b) <= free or len(b) == 1 and len(b[0]) == 1 for b in planned)
    monkeypatch.setattr(shared_prompt, "free_learner_memory", lambda device: free)
    results = {}
    for learner in ("grouped", "per-sample"):
        model.zero_grad(set_to_none=True)
        metrics = train.accumulate_gradients(model, samples, learner=learner, loss_normalizer=7.0, chunk_size=3)
        results[learner] = metrics, _grads(model, ["default"])
    assert results["grouped"][0] == pytest.approx(results["per-sample"][0], rel=1e-5, abs=1e-7)
    _assert_grads_close(results["grouped"][1], results["per-sample"][1])


def _learner_cost():
    """benchmarks/learner_cost.py: the meta-device count of the learner's memory the plan follows."""
    import importlib.util
    import pathlib
    import sys

    if "learner_cost" not in sys.modules:
        path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "learner_cost.py"
        spec = importlib.util.spec_from_file_location("learner_cost", path)
        sys.modules["learner_cost"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["learner_cost"])
    return sys.modules["learner_cost"]


def test_at_the_4b_shape_an_8192_token_aggregation_group_stays_whole_on_80_gb_and_splits_on_24_gb():
    """Qwen3-4B built from its config on the meta device (no weights), LoRA r = 32, checkpointing: the aggregation
    group of `--max-new-tokens 8192` (17,596 + 4 x 8,192 tokens) is one micro-batch when the card has 80 GB, several
    on a 24 GB card; every planned micro-batch's peak, counted by learner_cost.py, fits the memory the plan was
    given, and the plan's count is at most the head's chunk above it."""
    lc = _learner_cost()
    model = lc.build(checkpointing=True)
    group = [spiral.Sample([5] * lc.AGGREGATION_PROMPT, [6] * 8192, [-1.0] * 8192, 1.0, "aggregation")
             for _ in range(4)]
    resident = lc.resident_bytes(model)
    memory = shared_prompt.LearnerMemory.of(model)
    plans = {}
    for card_GB in (80, 24):
        free = int(shared_prompt.LEARNER_MEMORY_FRACTION * (card_GB * 1e9 - resident))
        plans[card_GB] = shared_prompt.plan(model, [group], None, free)
        shapes = {tuple((len(p[0].prompt_ids), tuple(len(s.completion_ids) for s in p)) for p in b): b
                  for b in plans[card_GB]}
        for parts in shapes.values():  # micro-batches of one shape peak alike: counted once
            counted = lc.train_parts(model, parts).peak
            assert counted <= memory.peak_bytes(parts) <= free
            assert memory.peak_bytes(parts) <= counted + memory.fixed + 5e6
    assert [[len(part) for part in b] for b in plans[80]] == [[4]]  # the whole group: its prompt once
    assert len(plans[24]) > 1 and all(len(b) == 1 for b in plans[24])


@pytest.mark.parametrize("keep", [False, True])
def test_the_memory_plan_counts_what_the_meta_device_counts_at_the_4b_shape(keep):
    """LearnerMemory against learner_cost.py's count at the 4B shape, several groups packed in one micro-batch,
    checkpointing recomputing or keeping the attention outputs: beyond its fixed part (the head's chunk, where
    small micro-batches peak) within 0.1 % of the count, and with it never below."""
    lc = _learner_cost()
    model = lc.build(checkpointing=True, keep_attention_outputs=keep)
    parts = [[spiral.Sample([5] * 9000, [6] * L, [-1.0] * L, 1.0, "aggregation") for L in (3000, 1200)],
             [spiral.Sample([7] * 1031, [6] * 2500, [-1.0] * 2500, 1.0, "search") for _ in range(3)]]
    memory = shared_prompt.LearnerMemory.of(model)
    counted = lc.train_parts(model, parts).peak
    assert abs(memory.peak_bytes(parts) - memory.fixed - counted) <= 1e-3 * counted
    assert counted <= memory.peak_bytes(parts)


def test_the_memory_plan_reads_the_checkpointing_train_py_set(tiny):
    model = _lora_model(tiny, checkpointing=False)
    assert shared_prompt.checkpointing_mode(model) == (False, False)
    for keep in (False, True):
        model = _lora_model(tiny, keep_attention_outputs=keep)
        assert shared_prompt.checkpointing_mode(model) == (True, keep)
        assert shared_prompt.checkpointing_mode(model.eval()) == (False, False)  # no checkpointing outside training


def test_the_free_memory_is_cuda_s_free_and_cached_memory_less_a_margin_and_none_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 10**9, 80 * 10**9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * 10**9)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 3 * 10**9)
    assert shared_prompt.free_learner_memory("cuda") == int(shared_prompt.LEARNER_MEMORY_FRACTION * 12 * 10**9)
    assert shared_prompt.LEARNER_MEMORY_FRACTION < 1
    assert shared_prompt.free_learner_memory("cpu") is None


def test_running_the_module_as_a_script_leaves_the_registered_attention_alone(monkeypatch, capsys):
    """`python shared_prompt.py --help` in a process that imported it (runpy, as the help tests do) must not register
    the script copy's function, whose Layout is another class: the learner would then reject every Layout mask."""
    import runpy
    import sys

    from transformers import AttentionInterface

    monkeypatch.setattr(sys, "argv", ["shared_prompt.py", "--help"])
    try:
        runpy.run_path(shared_prompt.__file__, run_name="__main__")
    except SystemExit:
        pass
    capsys.readouterr()
    assert AttentionInterface()[shared_prompt.NAME] is shared_prompt.grouped_attention
