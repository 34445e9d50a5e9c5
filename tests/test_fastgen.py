"""fastgen.py against the Hugging Face reference path (rollout.generate(engine="hf")) on the tiny Qwen3, with a LoRA
adapter active: the sampler's log-probs and entropies equal teacher forcing through the HF model, the same torch
seed draws the same tokens (same Completions), the sample distribution follows softmax(logits / T), EOS cutting and
truncation, and one decode step traces into a single graph with no graph break (torch.compile fullgraph)."""

import copy
import re
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fastgen
import lora
import rollout
import tiny  # noqa: F401  registers "tiny" with rollout.load_policy
from test_rollout import PROMPTS, hostile_generation_config, stop_biased_model, teacher_forced
from test_rollout import one_torch_thread  # noqa: F401 (autouse: one intra-op thread for the whole module)


@pytest.fixture(scope="module")
def tokenizer():
    return rollout.load_policy("tiny", device="cpu")[1]


def with_adapter(model, seed=0, scale=0.05):
    """The model with a LoRA adapter whose B is not zero, so that the adapter changes every projection."""
    model = copy.deepcopy(model)
    params = lora.add_lora(model, rank=4, alpha=8.0)  # alpha != r: the scale alpha / r must be applied
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


@pytest.fixture(scope="module")
def adapted(tokenizer):
    return with_adapter(rollout.load_policy("tiny", device="cpu")[0])


def run(model, tokenizer, engine, seed, prompts=PROMPTS, **kwargs):
    torch.manual_seed(seed)
    kwargs = {"samples_per_prompt": 3, "max_new_tokens": 12, "temperature": 0.7, **kwargs}
    return rollout.generate(model, tokenizer, prompts, engine=engine, **kwargs)


def test_fast_logprobs_and_entropies_equal_teacher_forcing(adapted, tokenizer):
    """Left-padded prompts of three lengths, LoRA active, T = 0.7: every recorded log-prob and entropy is the HF
    model's own, teacher-forced over the fast path's tokens."""
    out = run(adapted, tokenizer, "fast", seed=0, micro_batch_size=9)
    for prompt, group in zip(PROMPTS, out):
        assert len(group) == 3
        for c in group:
            assert c.prompt_ids == rollout.chat_prompt_ids(tokenizer, prompt)
            assert len(c.logprobs) == len(c.entropies) == len(c.completion_ids) == 12 and c.truncated
            expected, expected_entropies = teacher_forced(adapted, c, temperature=0.7)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
            torch.testing.assert_close(torch.tensor(c.entropies), expected_entropies, atol=1e-4, rtol=0)


@pytest.mark.parametrize("micro_batch_size", [9, 2])
def test_same_seed_same_completions_as_the_reference(adapted, tokenizer, micro_batch_size):
    """Both engines draw each token as argmax p / Exponential(1) from the same torch stream, so for one seed they
    return the same Completions (log-probs up to float rounding): a check of the whole distribution at every step."""
    fast = run(adapted, tokenizer, "fast", seed=3, micro_batch_size=micro_batch_size)
    ref = run(adapted, tokenizer, "hf", seed=3, micro_batch_size=micro_batch_size)
    for f, r in zip([c for g in fast for c in g], [c for g in ref for c in g]):
        assert (f.prompt_ids, f.completion_ids, f.text, f.truncated) == (r.prompt_ids, r.completion_ids, r.text,
                                                                         r.truncated)
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(f.entropies), torch.tensor(r.entropies), atol=1e-5, rtol=0)


def test_first_token_frequencies_follow_softmax_at_the_temperature(tokenizer):
    """2,000 first tokens from the fast path follow softmax(logits / T) (a total-variation bound over five bins),
    whatever sampling settings the model's generation_config asks for."""
    favoured = [10, 11, 12, 13]
    model = stop_biased_model(tokenizer, dict(zip(favoured, [6.0, 5.5, 5.0, 4.5])))
    model.generation_config = hostile_generation_config(model)
    temperature, n = 0.8, 2000
    prompt_ids = rollout.chat_prompt_ids(tokenizer, PROMPTS[0])
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt_ids])).logits[0, -1] / temperature, dim=-1)  # (V,)
    expected = torch.cat([probs[favoured], 1 - probs[favoured].sum(0, keepdim=True)])  # (5,)
    (group,) = run(model, tokenizer, "fast", seed=0, prompts=[PROMPTS[0]], samples_per_prompt=n, max_new_tokens=1,
                   temperature=temperature)
    first = torch.tensor([c.completion_ids[0] for c in group])
    others = ~torch.isin(first, torch.tensor(favoured))
    observed = torch.tensor([(first == t).float().mean() for t in favoured] + [others.float().mean()])  # (5,)
    assert (observed - expected).abs().sum() / 2 < 0.05  # noise ~0.02; no temperature: 0.31, T^2: 0.18
    assert abs(group[0].logprobs[0] - probs[group[0].completion_ids[0]].log().item()) < 1e-4


def test_exponential_race_draws_each_token_with_its_probability():
    """fastgen.sample on fixed logits, 20,000 rows: chi-square against p (4 degrees of freedom; 0.1% level 18.5)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    p = torch.softmax(logits / 0.9, dim=-1)
    torch.manual_seed(0)
    token, logprob, entropy = fastgen.sample(logits.expand(20_000, 5), temperature=0.9)
    counts = torch.bincount(token, minlength=5).float()
    chi2 = float(((counts - 20_000 * p) ** 2 / (20_000 * p)).sum())
    assert chi2 < 18.5
    torch.testing.assert_close(logprob, p.log()[token])
    torch.testing.assert_close(entropy, torch.full((20_000,), float(-(p * p.log()).sum())))


def test_eos_cut_and_truncation_match_the_reference(tokenizer):
    """Models that stop with p ~ 0.22 (then ~ 0.04) per step: rows end at different lengths, on either EOS id (one
    of them the pad id); the fast path cuts them exactly as the reference does (same seed, same Completions), also
    for rows that run past the first every-32-steps stop check."""
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    for bias, max_new_tokens in ((5.0, 6), (3.0, 48)):
        model = stop_biased_model(tokenizer, {im_end: bias, endoftext: bias})
        fast, ref = (run(model, tokenizer, engine, seed=1, prompts=PROMPTS[:2], samples_per_prompt=16,
                         max_new_tokens=max_new_tokens, temperature=1.0, micro_batch_size=32)
                     for engine in ("fast", "hf"))
        fast, ref = [c for g in fast for c in g], [c for g in ref for c in g]
        assert [c.completion_ids for c in fast] == [c.completion_ids for c in ref]
        assert [c.truncated for c in fast] == [c.truncated for c in ref]
        for c in fast:
            assert len(c.logprobs) == len(c.entropies) == len(c.completion_ids)
            assert c.truncated == (c.completion_ids[-1] not in (im_end, endoftext))
            assert not c.truncated or len(c.completion_ids) == max_new_tokens
        assert {im_end, endoftext} <= {c.completion_ids[-1] for c in fast if not c.truncated}
        assert any(c.truncated for c in fast) and not all(c.truncated for c in fast)
    assert any(32 < len(c.completion_ids) < max_new_tokens for c in fast)  # stopped after a stop check


def test_linear_equals_loralinear_with_the_adapter_in_persistent_buffers(adapted):
    """fastgen's Linear is LoRALinear's forward, W x + (alpha / r) B A x (fp32: to 1e-6; bf16: at least as close to
    the float64 truth as LoRALinear's own three roundings), its A and B copied into buffers that keep their address
    when the adapter changes (a captured CUDA graph reads them), and the base alone when no adapter is active."""
    module = adapted.model.layers[1].self_attn.k_proj
    buffers = fastgen.Engine(adapted).adapters
    x = torch.randn(5, 128)
    torch.testing.assert_close(buffers.linear(module)(x), module(x), atol=1e-6, rtol=0)
    bf16 = copy.deepcopy(adapted).to(torch.bfloat16)
    for _, m in lora.lora_modules(bf16):  # the adapter keeps its fp32 masters, as in a bf16 training run
        m.lora_A.float()
        m.lora_B.float()
    module16 = bf16.model.layers[1].self_attn.k_proj
    linear = fastgen.Engine(bf16).adapters.linear(module16)
    assert linear.A.dtype == linear.B.dtype == torch.bfloat16
    xb = x.bfloat16()
    A, B = module16.lora_A["default"].weight.double(), module16.lora_B["default"].weight.double()
    truth = xb.double() @ module16.base_layer.weight.double().T + (xb.double() @ A.T @ B.T) * module16.scaling["default"]
    assert (linear(xb).double() - truth).abs().max() <= (module16(xb).double() - truth).abs().max() + 1e-3
    a_address = buffers.linear(module).A.data_ptr()
    with torch.no_grad():
        module.lora_A["default"].weight.add_(1.0)  # an optimizer step
    again = buffers.linear(module)
    assert again.A.data_ptr() == a_address and again.A.equal(module.lora_A["default"].weight)  # same buffer, new values
    with torch.no_grad():
        module.lora_A["default"].weight.sub_(1.0)
    with lora.use_adapter(adapted, None):
        assert buffers.linear(module).A is None  # no adapter active: the base alone


def test_decode_step_is_one_graph_with_the_adapter_active(adapted):
    """decode_one_token traces into one graph with no break (so it could be torch.compile'd with fullgraph=True),
    and reads and writes only its fixed buffers (what a CUDA graph capture needs): dynamo's trace, which is what
    torch.compile runs, without the minutes inductor takes on a CPU."""
    engine = fastgen.Engine(adapted)
    w = engine.weights(adapted)
    shape = fastgen.CallShape.of([7, 10], copies=2, max_new_tokens=20)
    cache, state, _ = engine.call(w, shape, eos_count=2)
    state.start(shape, [7, 10], 0.7, [1, 2], w.kv_heads)
    explanation = torch._dynamo.explain(fastgen.decode_one_token)(w, cache, state, shape, 256)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


def test_fast_engine_refuses_other_architectures(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="Qwen3"):
        rollout.generate(llama, tokenizer, ["Hi"], samples_per_prompt=1, max_new_tokens=2, engine="fast")
    with pytest.raises(ValueError, match="engine"):
        rollout.generate(llama, tokenizer, ["Hi"], samples_per_prompt=1, max_new_tokens=2, engine="vllm")


def test_model_generation_engine_is_the_default(adapted, tokenizer, monkeypatch):
    """model.generation_engine = "fast" (how train.py --generation fast reaches spiral's generate calls) selects
    fastgen; an explicit engine= wins."""
    calls = []
    real = fastgen.sample_micro_batch
    monkeypatch.setattr(fastgen, "sample_micro_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = copy.deepcopy(adapted)
    model.generation_engine = "fast"
    rollout.generate(model, tokenizer, ["Hi"], samples_per_prompt=2, max_new_tokens=2)
    assert calls == [1]
    rollout.generate(model, tokenizer, ["Hi"], samples_per_prompt=2, max_new_tokens=2, engine="hf")
    assert calls == [1]


def test_train_cli_samples_with_the_fast_engine(tmp_path, monkeypatch, capsys):
    """train.py --generation fast: every rollout of the step goes through fastgen, and the learner's log-probs
    reproduce the sampler's (importance ratios 1 up to fp32 rounding): the right importance-weight denominators."""
    import json

    import train

    calls = []
    real = fastgen.sample_micro_batch
    monkeypatch.setattr(fastgen, "sample_micro_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--generation", "fast", "--steps", "1", "--batch-problems", "2",
                       "--out", str(out), "--no-plot"]) == 0
    assert len(calls) >= 2  # the search and the aggregation stage
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 1 - 1e-4 < row["train/importance_ratio_min"] <= row["train/importance_ratio_max"] < 1 + 1e-4
    assert json.loads((out / "config.json").read_text())["generation"] == "fast"
    assert train.main(["--preset", "tiny", "--generation", "vllm", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_reference_sampling_casts_the_adapter_once_per_call(adapted, tokenizer):
    """lora.cast_once (which rollout's generate runs under): the same outputs bit for bit, one cast of A and B per
    adapter and dtype reused at every step, dropped on exit so that an updated adapter is seen."""
    model = copy.deepcopy(adapted).to(torch.bfloat16)
    for _, m in lora.lora_modules(model):  # fp32 masters, as train.py keeps them
        m.lora_A.float()
        m.lora_B.float()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        plain = model(ids).logits
        with lora.cast_once(model):
            once = model(ids).logits
            module = lora.lora_modules(model)[0][1]
            (cast,) = module.sampling_casts.values()
            assert cast[0].dtype == torch.bfloat16 and model(ids).logits.equal(once)
            assert next(iter(module.sampling_casts.values()))[0] is cast[0]  # reused, not cast again
        assert plain.equal(once) and module.sampling_casts is None
        module.lora_B["default"].weight.add_(1.0)  # an optimizer step
        with lora.cast_once(model):
            assert not model(ids).logits.equal(once)
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(m.sampling_casts is not None))
    try:
        rollout.generate(model, tokenizer, ["Hi"], samples_per_prompt=2, max_new_tokens=3, share_prefix=False)
    finally:
        handle.remove()
    assert len(seen) == 3 and all(seen)


# ----------------------------------------------------------------------------------------------------------------------
# The cascade cache, buckets, persistence; the bugs a careful engineer could make here


def same_completions(fast, ref, atol=1e-5):
    fast, ref = [c for g in fast for c in g], [c for g in ref for c in g]
    assert [c.completion_ids for c in fast] == [c.completion_ids for c in ref]
    assert [c.truncated for c in fast] == [c.truncated for c in ref]
    for f, r in zip(fast, ref):
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(r.logprobs), atol=atol, rtol=0)


@pytest.mark.parametrize("max_new_tokens", [16, 17, 18])
def test_many_chunks_and_buckets_at_bucket_edges_equal_the_reference(adapted, tokenizer, monkeypatch,
                                                                     max_new_tokens):
    """Prompts of 20-60 tokens in chunks of at most 16 slots, prefilled a group of one or two at a time, suffix
    buckets of 8, max_new_tokens at a bucket's end
    and just past it (the last fed token sits in the last slot: a cache one slot short fails here): the same
    Completions as the Hugging Face reference."""
    monkeypatch.setattr(fastgen, "PREFIX_CHUNK", 16)
    monkeypatch.setattr(fastgen, "SUFFIX_BUCKET", 8)
    monkeypatch.setattr(fastgen, "PREFILL_TOKENS", 80)  # prefill in groups of one or two prompts
    fast = run(adapted, tokenizer, "fast", seed=5, max_new_tokens=max_new_tokens, micro_batch_size=9)
    ref = run(adapted, tokenizer, "hf", seed=5, max_new_tokens=max_new_tokens, micro_batch_size=9)
    same_completions(fast, ref)
    shape = fastgen.CallShape.of([len(g[0].prompt_ids) for g in fast], 3, max_new_tokens)
    assert shape.n_chunks >= 2 and shape.T >= max_new_tokens


def test_early_stop_fires_when_the_last_row_stops_and_stops_stay_sticky(tokenizer, monkeypatch):
    """On a CPU every step checks whether all rows have stopped (as HF generate does): the number of decode steps
    is the longest completion's length - 1, although rows stop at different steps and keep sampling (non-EOS
    tokens) after their EOS. A stop flag that is not sticky never sees all rows stopped at once."""
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model = stop_biased_model(tokenizer, {im_end: 3.5, endoftext: 3.5})
    steps = []
    real = fastgen.decode_one_token
    monkeypatch.setattr(fastgen, "decode_one_token", lambda *a: steps.append(1) or real(*a))
    (group,) = run(model, tokenizer, "fast", seed=2, prompts=PROMPTS[:1], samples_per_prompt=6, max_new_tokens=60,
                   temperature=1.0)
    lengths = [len(c.completion_ids) for c in group]
    assert not any(c.truncated for c in group) and len(set(lengths)) > 1
    assert len(steps) == max(lengths) - 1


def test_same_stream_across_micro_batches_that_stop_early(tokenizer):
    """Several micro-batches whose rows all stop early: the fast path consumes the torch random stream exactly as
    HF generate (one (B, V) draw per step, none after the last row stops), so the later micro-batches match too.
    (Checking only every 32 steps would draw past the stop and shift every later call's tokens.)"""
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model = stop_biased_model(tokenizer, {im_end: 4.0, endoftext: 4.0})
    kwargs = dict(prompts=PROMPTS, samples_per_prompt=4, max_new_tokens=40, temperature=1.0, micro_batch_size=4)
    fast, ref = (run(model, tokenizer, engine, seed=4, **kwargs) for engine in ("fast", "hf"))
    assert all(not c.truncated for g in ref for c in g)  # every call stopped early
    same_completions(fast, ref)


def test_cache_and_adapter_persist_across_calls_and_see_each_optimizer_step(tokenizer):
    """Two calls of one shape reuse the arena and the adapter buffers (same addresses: what a captured CUDA graph
    reads), and the second call samples from the adapter as updated in between, as the reference does. release()
    frees the arena only; reset() drops the engine."""
    model = with_adapter(rollout.load_policy("tiny", device="cpu")[0], seed=3)
    run(model, tokenizer, "fast", seed=0, max_new_tokens=6, micro_batch_size=9)
    engine = fastgen._ENGINE[0]

    def addresses():
        return {k: (v[1].data_ptr(), *(b.data_ptr() for b in v[2])) for k, v in engine.adapters.buffers.items()}

    arena_ptr, buffers = engine.arena.data_ptr(), addresses()
    with torch.no_grad():
        for p in lora.lora_parameters(model):
            p.mul_(1.5)  # an optimizer step
    fast = run(model, tokenizer, "fast", seed=9, max_new_tokens=6, micro_batch_size=9)
    assert fastgen._ENGINE[0] is engine and engine.arena.data_ptr() == arena_ptr and addresses() == buffers
    same_completions(fast, run(model, tokenizer, "hf", seed=9, max_new_tokens=6, micro_batch_size=9))
    fastgen.release()
    assert fastgen._ENGINE == [engine] and engine.arena is None and fastgen.held_bytes("cpu") == 0
    assert addresses() == buffers and len(engine.calls) == 1  # kept for the next collection
    fastgen.reset()
    assert not fastgen._ENGINE


def test_train_like_calls_bound_graphs_and_compilations(adapted, tokenizer, monkeypatch):
    """Three train.py-like steps (a search call, then an aggregation call with longer prompts; two temperatures):
    CUDA graphs are keyed by (call shape, suffix bucket), so the count is the distinct pairs seen and a repeated
    shape or a new temperature adds none; the compiled elementwise chains (run here through dynamo with a
    counting backend, as on CUDA through inductor) compile a bounded number of variants, never fall back to eager."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    monkeypatch.setattr(fastgen, "FUSE_DEVICES", ("cpu",))
    monkeypatch.setattr(fastgen, "FUSE_BACKEND", counter)
    monkeypatch.setattr(fastgen, "SUFFIX_BUCKET", 4)
    fused = (fastgen._rms_norm_fn, fastgen._rotate, fastgen._silu_mul, fastgen._merge)
    for f in fused:
        monkeypatch.setitem(f.state, "compiled", None)
    torch._dynamo.reset()
    model = copy.deepcopy(adapted)
    search = [rollout.search_prompt(f"What is {i} + {i + 1}?") for i in range(4)]
    aggregation = [rollout.aggregation_prompt(p, ["12", "13 because 6 + 7"]) for p in search[:2]]
    fastgen.release()
    captures = []
    for step, temperature in enumerate([0.7, 1.0, 0.7]):
        torch.manual_seed(step)
        rollout.generate(model, tokenizer, search, samples_per_prompt=4, max_new_tokens=10, temperature=temperature,
                         engine="fast")
        rollout.generate(model, tokenizer, aggregation, samples_per_prompt=2, max_new_tokens=10,
                         temperature=temperature, engine="fast")
        captures.append(fastgen._ENGINE[0].captures)
    assert captures[0] == 2 * 3 and captures[1] == captures[2] == captures[0]  # 2 shapes x 3 buckets, then none
    assert all(f.state["ok"] for f in fused)
    # the decode step's shapes only: RMSNorm at 3 ranks (hidden (B, 1, d), heads (B, 1, H, D), last (B, d)), the
    # others once, and one recompile where duck sizing guessed two sizes equal: under dynamo's limit of 8 per function
    assert 0 < counter.frame_count <= 3 + 2 + 1 + 1
    frames = counter.frame_count
    torch.manual_seed(9)
    rollout.generate(model, tokenizer, search, samples_per_prompt=4, max_new_tokens=10, temperature=0.3,
                     engine="fast")
    assert counter.frame_count == frames  # a new temperature compiles nothing
    for f in fused:
        f.state["compiled"] = None
    torch._dynamo.reset()


def test_rows_per_call_fits_the_budget():
    """rollout's micro-batch for engine="fast": as many prompts (all their copies) as fit the token budget, each
    prompt's prefix counted once; when one prompt's copies do not fit, as many copies as do."""
    one = fastgen.CallShape.of([1054], 8, 4096).cache_tokens()
    assert fastgen.rows_per_call(3 * one, 1054, 8, 4096) == 24 and fastgen.rows_per_call(3 * one - 1, 1054, 8, 4096) == 16
    assert fastgen.rows_per_call(18 * 1024 + 2 * 4096, 17_596, 4, 4096) == 2
    assert fastgen.rows_per_call(10, 17_596, 4, 4096) == 1


def test_train_with_the_fast_engine_follows_the_reference_trajectory(tmp_path):
    """train.py --generation fast on a CPU: the same tokens as --generation hf step after step (the random stream
    consumed identically), so the same metrics up to float rounding (a bug here once gave 0.25 against 0.30
    at step 1)."""
    import json

    import train

    rows = {}
    for engine in ("hf", "fast"):
        out = tmp_path / engine
        assert train.main(["--preset", "tiny", "--generation", engine, "--steps", "2", "--batch-problems", "2",
                           "--out", str(out), "--no-plot"]) == 0
        rows[engine] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for hf, fast in zip(rows["hf"], rows["fast"]):
        for key in ("search_accuracy", "aggregation_accuracy", "search_length", "tokens_generated"):
            assert hf[key] == fast[key], key
        assert abs(hf["train/loss"] - fast["train/loss"]) < 1e-4


def test_auto_engine_is_fast_on_cuda_for_qwen3_only(adapted):
    """--generation auto (train.py's default): fastgen on a CUDA device for a Qwen3 model, the reference otherwise
    (on a CPU, and for other architectures on CUDA)."""
    from types import SimpleNamespace

    cuda_qwen3 = SimpleNamespace(device=torch.device("cuda"), config=adapted.config, model=adapted.model,
                                 lm_head=adapted.lm_head)
    llama_config = SimpleNamespace(model_type="llama")
    assert rollout.resolve_engine("auto", cuda_qwen3) == "fast"
    assert rollout.resolve_engine("auto", adapted) == "hf"
    assert rollout.resolve_engine("auto", SimpleNamespace(device=torch.device("cuda"), config=llama_config)) == "hf"
    assert rollout.resolve_engine("hf", cuda_qwen3) == "hf"


# ----------------------------------------------------------------------------------------------------------------------
# The LoRA side path stacked; what persists across calls and releases, and what a captured graph is keyed by


class MatmulCounter(TorchDispatchMode):
    """Counts the matrix products dispatched under it (F.linear and addmm reach aten as mm/addmm/bmm)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm,
                                               torch.ops.aten.baddbmm)
        return func(*args, **(kwargs or {}))


def one_step_matmuls(model) -> int:
    engine = fastgen.Engine(model)
    w = engine.weights(model)
    shape = fastgen.CallShape.of([7, 10], copies=2, max_new_tokens=20)
    cache, state, _ = engine.call(w, shape, eos_count=2)
    state.start(shape, [7, 10], 0.7, [1, 2], w.kv_heads)
    with torch.no_grad(), MatmulCounter() as counter:
        fastgen.decode_one_token(w, cache, state, shape, 256)
    return counter.count


def test_stacked_lora_equals_each_projection_alone(adapted):
    """q, k, v (and gate, up) with their A stacked: one x A^T matmul, then each output's own columns times its B,
    equal to each Linear with its own A matmul (and to LoRALinear) in fp32 and bf16, also with a projection of the
    group that has no adapter active (its columns absent); and a decode step makes 4 A and 7 B matmuls a layer."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        model = copy.deepcopy(adapted).to(dtype)
        for _, m in lora.lora_modules(model):  # fp32 masters
            m.lora_A.float()
            m.lora_B.float()
        attn, mlp = model.model.layers[2].self_attn, model.model.layers[2].mlp
        attn.k_proj.active_adapter = None  # k alone without its adapter: the stacked A holds q's and v's rows only
        buffers = fastgen.Engine(model).adapters
        for modules in ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)):
            stacked = buffers.stacked(modules)
            assert stacked.A.shape[0] == 4 * sum(m.active_adapter is not None for m in modules)
            x = torch.randn(6, 1, 128).to(dtype)
            for got, linear, module in zip(stacked(x), stacked.linears, modules):
                torch.testing.assert_close(got, linear(x), atol=1e-6, rtol=0)  # one A matmul per projection
                if dtype == torch.float32:
                    torch.testing.assert_close(got, module(x), atol=1e-5, rtol=0)
    layers = len(adapted.model.layers)
    with lora.use_adapter(adapted, None):
        base = one_step_matmuls(adapted)
    assert one_step_matmuls(adapted) - base == layers * (4 + 7)  # A: qkv, o, gate-up, down; B: one per projection


def test_decode_benchmark_counts_the_kernels_of_a_step(adapted):
    """benchmarks/decode.py --kernels' counter on the tiny model: the matmuls counted here, two attention calls and
    five compiled chains a layer counted as one kernel each (as a CUDA graph launches them), views not counted."""
    from test_decode_bench import load

    decode = load("decode")
    shape = fastgen.CallShape.of([7, 10], copies=2, max_new_tokens=20)
    counted = decode.step_kernels(adapted, [7, 10], shape)
    layers, ops = len(adapted.model.layers), counted["by_op"]
    assert ops["attention"] == 2 * layers  # the CPU attention's two matmuls counted as its one kernel
    assert counted["matmuls"] + 2 * ops["attention"] == one_step_matmuls(adapted)
    assert ops["fused_rms_norm_fn"] == 4 * layers + 1 and ops["fused_rotate"] == 2 * layers
    assert "view" not in ops and "t" not in ops and counted["kernels"] == sum(ops.values())


def test_adapter_named_as_evaluate_names_it_with_its_own_scale(adapted, tokenizer):
    """An adapter named `policy:<label>` (evaluate.py's names) with alpha / r unlike the "default" adapter's, active:
    the same Completions as the reference (the scale read from the active adapter, not from "default")."""
    model = copy.deepcopy(adapted)
    params = lora.add_lora(model, rank=4, alpha=24.0, adapter_name="policy:a")  # scale 6, "default"'s is 2
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.05)
    with lora.use_adapter(model, "policy:a"):
        same_completions(run(model, tokenizer, "fast", seed=1, micro_batch_size=9),
                         run(model, tokenizer, "hf", seed=1, micro_batch_size=9))


def test_each_adapter_and_each_rank_has_its_own_graphs(adapted, tokenizer, monkeypatch):
    """Graphs are keyed by what they read: the aggregator adapter does not replay the search adapter's graphs (a
    second set is counted), a repeat of either captures none, an adapter re-made with another rank under the same
    name gets new buffers and new graphs, and so does a new LoRA scale; every call samples as the reference does."""
    monkeypatch.setattr(fastgen, "SUFFIX_BUCKET", 4)
    model = copy.deepcopy(adapted)
    params = lora.add_lora(model, rank=4, alpha=8.0, adapter_name="aggregator")
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(8)) * 0.05)
    fastgen.reset()
    counts = []
    for name in ("default", "aggregator", "default", "aggregator"):
        with lora.use_adapter(model, name):
            same_completions(run(model, tokenizer, "fast", seed=2, micro_batch_size=9),
                             run(model, tokenizer, "hf", seed=2, micro_batch_size=9))
        counts.append(fastgen._ENGINE[0].captures)
    assert counts[0] == 3 and counts[1] == 6 and counts[3] == counts[2] == 6  # 12 tokens: buckets of 4, 8, 12
    for _, m in lora.lora_modules(model):  # "aggregator" again, rank 8
        del m.lora_A["aggregator"], m.lora_B["aggregator"], m.scaling["aggregator"]
    params = lora.add_lora(model, rank=8, alpha=8.0, adapter_name="aggregator")
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) * 0.05)
    with lora.use_adapter(model, "aggregator"):
        same_completions(run(model, tokenizer, "fast", seed=3, micro_batch_size=9),
                         run(model, tokenizer, "hf", seed=3, micro_batch_size=9))
    assert fastgen._ENGINE[0].captures == 9
    for _, m in lora.lora_modules(model):  # the same buffers with another alpha / r: a graph bakes the scale in
        m.scaling["aggregator"] = 3.0
    with lora.use_adapter(model, "aggregator"):
        same_completions(run(model, tokenizer, "fast", seed=3, micro_batch_size=9),
                         run(model, tokenizer, "hf", seed=3, micro_batch_size=9))
    assert fastgen._ENGINE[0].captures == 12


def test_call_keys_keep_the_most_recent(adapted, tokenizer):
    """Six calls of five shapes: at most MAX_CALL_SHAPES keys are kept, the least recently used dropped (the newest
    always kept), and a shape seen again among them reuses its state and graphs (none counted again)."""
    fastgen.reset()
    model = copy.deepcopy(adapted)
    keys, captures = [], []
    for n in (1, 2, 3, 1, 4, 5):  # prompts per call: each n a call shape
        torch.manual_seed(0)
        rollout.generate(model, tokenizer, (PROMPTS * 2)[:n], samples_per_prompt=2, max_new_tokens=3, engine="fast")
        engine = fastgen._ENGINE[0]
        keys.append([key[0].P for key in engine.calls])
        captures.append(engine.captures)
    assert keys == [[1], [1, 2], [1, 2, 3], [2, 3, 1], [2, 3, 1, 4], [3, 1, 4, 5]]
    assert captures == [1, 2, 3, 3, 4, 5]  # one suffix bucket per call


def test_the_arena_grows_with_the_old_one_freed_first(adapted, tokenizer, monkeypatch):
    """A call that needs more KV slots than the arena holds gets a new arena, allocated after the old one is freed
    (peak memory: the larger one, not both); held_bytes counts the arena in bytes."""
    fastgen.reset()
    alive_at_allocation, previous = [], []
    real = fastgen._new_arena

    def allocating(elements, dtype, device):
        alive_at_allocation.append([ref() is not None for ref in previous])
        arena = real(elements, dtype, device)
        previous.append(weakref.ref(arena))
        return arena

    monkeypatch.setattr(fastgen, "_new_arena", allocating)
    model = copy.deepcopy(adapted)
    for n, copies in ((1, 2), (3, 8)):  # the second call needs more slots than the 2**20 the first one allocated
        rollout.generate(model, tokenizer, PROMPTS[:n], samples_per_prompt=copies, max_new_tokens=3, engine="fast")
    engine = fastgen._ENGINE[0]
    assert alive_at_allocation == [[], [False]]
    shape = fastgen.CallShape.of([len(rollout.chat_prompt_ids(tokenizer, p)) for p in PROMPTS], 8, 3)
    need = fastgen.KVCache.elements(len(model.model.layers), shape, 2, 32)
    assert engine.arena.numel() >= need and fastgen.held_bytes("cpu") == engine.arena.numel() * 4  # fp32: 4 bytes
    assert fastgen.held_bytes("meta") == 0


def test_another_model_gets_its_own_engine(adapted, tokenizer):
    """Sampling from a second model replaces the engine (the first model's buffers and graphs go with it)."""
    first, second = copy.deepcopy(adapted), with_adapter(rollout.load_policy("tiny", device="cpu")[0], seed=5)
    run(first, tokenizer, "fast", seed=0, max_new_tokens=3)
    engine = fastgen._ENGINE[0]
    same_completions(run(second, tokenizer, "fast", seed=0, max_new_tokens=3),
                     run(second, tokenizer, "hf", seed=0, max_new_tokens=3))
    assert len(fastgen._ENGINE) == 1 and fastgen._ENGINE[0] is not engine and fastgen._ENGINE[0].model() is second


def test_nothing_stale_in_the_arena_reaches_a_later_call(adapted, tokenizer, monkeypatch):
    """Whatever the arena holds (NaN everywhere, after one call; or a new arena's uninitialised memory), the next
    call samples exactly what a fresh engine samples: every slot a call reads is written first, masked slots
    included (a NaN behind a mask would still poison its row: 0 x NaN = NaN)."""
    kwargs = dict(prompts=PROMPTS[:2], max_new_tokens=9, micro_batch_size=6)
    fastgen.reset()
    fresh = run(adapted, tokenizer, "fast", seed=4, **kwargs)
    run(adapted, tokenizer, "fast", seed=0, prompts=PROMPTS, max_new_tokens=12, micro_batch_size=9)
    fastgen._ENGINE[0].arena.fill_(float("nan"))
    assert [c.logprobs for g in run(adapted, tokenizer, "fast", seed=4, **kwargs) for c in g] == \
        [c.logprobs for g in fresh for c in g]
    fastgen.reset()
    monkeypatch.setattr(fastgen, "_new_arena", lambda n, dtype, device: torch.full((n,), float("inf"), dtype=dtype))
    same_completions(run(adapted, tokenizer, "fast", seed=4, **kwargs), fresh, atol=0)


def test_graphs_outlive_release_when_the_arena_comes_back_where_it_was(adapted, tokenizer, monkeypatch):
    """Three train.py-like steps (a search call, an aggregation call, then release() for the learner): if each new
    arena sits where the last one did (as the CUDA caching allocator can return the block the learner gave back),
    the first step's graphs serve the later steps (on a CPU, counted); if it moves, every step captures its own.
    Either way each call samples as the reference does."""
    monkeypatch.setattr(fastgen, "SUFFIX_BUCKET", 4)
    search = [rollout.search_prompt(f"What is {i} + {i + 1}?") for i in range(3)]
    aggregation = [rollout.aggregation_prompt(p, ["12", "13 because 6 + 7"]) for p in search[:2]]
    model = copy.deepcopy(adapted)
    for moving in (False, True):
        block, steps = torch.empty(1 << 22), []

        def allocate(elements, dtype, device):
            start = (1 << 20) * len(steps) if moving else 0  # moving: another part of the block each step
            return block[start: start + elements]

        monkeypatch.setattr(fastgen, "_new_arena", allocate)
        fastgen.reset()
        for step in range(3):
            for prompts, copies in ((search, 4), (aggregation, 2)):
                kwargs = dict(samples_per_prompt=copies, max_new_tokens=10, temperature=0.7, micro_batch_size=64)
                torch.manual_seed(step)
                fast = rollout.generate(model, tokenizer, prompts, engine="fast", **kwargs)
                torch.manual_seed(step)
                same_completions(fast, rollout.generate(model, tokenizer, prompts, engine="hf", **kwargs))
            steps.append(fastgen._ENGINE[0].captures)
            fastgen.release()
        assert steps == ([6, 12, 18] if moving else [6, 6, 6])  # 2 calls x 3 buckets of 4 slots


def fake_cuda(model):
    """What rollout.resolve_engine and fastgen.supports read of a model, on a device said to be CUDA."""
    from types import SimpleNamespace

    return SimpleNamespace(device=torch.device("cuda"), config=model.config, model=model.model, lm_head=model.lm_head)


class ForeignLoRA(torch.nn.Module):
    """Another library's LoRA layer (as peft's LoraLayer): the base inside, `weight` its base's, its own side path."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base_layer = base
        self.side = torch.nn.Linear(base.in_features, base.out_features, bias=False)

    @property
    def weight(self):
        return self.base_layer.weight

    def forward(self, x):
        return self.base_layer(x) + self.side(x)


def test_fast_engine_refuses_linears_it_would_misread(tokenizer):
    """A projection that is not an nn.Linear or a lora.LoRALinear around one (another library's LoRA layer, a
    subclass) would be read as its base weight and its adapter ignored: supports() names it, rollout refuses
    engine="fast", and "auto" picks the reference even on CUDA."""
    model = rollout.load_policy("tiny", device="cpu")[0]
    assert fastgen.supports(model) == "" and rollout.resolve_engine("auto", fake_cuda(model)) == "fast"
    for wrap in (ForeignLoRA, lambda base: lora.LoRALinear(ForeignLoRA(base))):
        wrapped = copy.deepcopy(model)
        wrapped.model.layers[3].mlp.up_proj = wrap(wrapped.model.layers[3].mlp.up_proj)
        reason = fastgen.supports(wrapped)
        assert "model.layers.3.mlp.up_proj" in reason, reason
        assert rollout.resolve_engine("auto", fake_cuda(wrapped)) == "hf"
        with pytest.raises(ValueError, match="up_proj"):
            rollout.generate(wrapped, tokenizer, ["Hi"], samples_per_prompt=1, max_new_tokens=2, engine="fast")


class ScaledLinear(torch.nn.Linear):
    """An nn.Linear subclass with a forward of its own (as a quantized linear's dequantizing scale): read as a plain
    nn.Linear, its scale would be dropped."""

    def forward(self, x):
        return super().forward(x) * 0.5


def _subclassed(base: torch.nn.Linear) -> ScaledLinear:
    linear = ScaledLinear(base.in_features, base.out_features, bias=base.bias is not None)
    linear.load_state_dict(base.state_dict())
    return linear


def _gelu(model):
    from transformers.activations import ACT2FN

    model.config.hidden_act = "gelu"
    for layer in model.model.layers:
        layer.mlp.act_fn = ACT2FN["gelu"]
    return model


def test_fast_engine_refuses_a_linear_subclass_a_foreign_lm_head_and_a_non_silu_mlp(tokenizer):
    """More layers the engine would misread, each named by supports() and refused by engine="fast" ("auto" picks the
    reference on CUDA): an nn.Linear subclass (a quantized linear) at a projection, bare or inside a
    lora.LoRALinear; another library's LoRA on lm_head (read as its base weight); an MLP whose activation is not
    SiLU (the engine applies SiLU). A lora.LoRALinear on lm_head, which the engine reads, is accepted."""
    model = rollout.load_policy("tiny", device="cpu")[0]
    changes = [
        (lambda m: setattr(m.model.layers[1].self_attn, "o_proj", _subclassed(m.model.layers[1].self_attn.o_proj)),
         "model.layers.1.self_attn.o_proj is a ", "ScaledLinear"),
        (lambda m: setattr(m.model.layers[2].mlp, "gate_proj", lora.LoRALinear(_subclassed(m.model.layers[2].mlp
                                                                                           .gate_proj))),
         "model.layers.2.mlp.gate_proj is a lora.LoRALinear", ""),
        (lambda m: setattr(m, "lm_head", ForeignLoRA(m.lm_head)), "lm_head is a ", "ForeignLoRA"),
        (_gelu, "supports SiLU MLPs; this one uses gelu", "")]
    for change, where, what in changes:
        changed = copy.deepcopy(model)
        change(changed)
        reason = fastgen.supports(changed)
        assert where in reason and what in reason, reason
        assert rollout.resolve_engine("auto", fake_cuda(changed)) == "hf"
        with pytest.raises(ValueError, match=re.escape(where)):
            rollout.generate(changed, tokenizer, ["Hi"], samples_per_prompt=1, max_new_tokens=2, engine="fast")
    ours = copy.deepcopy(model)
    ours.lm_head = lora.LoRALinear(ours.lm_head)
    assert fastgen.supports(ours) == "" and rollout.resolve_engine("auto", fake_cuda(ours)) == "fast"


def test_fast_engine_refuses_a_real_peft_model(tokenizer):
    """Runs only where peft is installed: peft's LoRA layers, in the model peft wrapped in place or through the
    PeftModel, are refused (the fast engine would have sampled the model without its adapter)."""
    peft = pytest.importorskip("peft")
    base = copy.deepcopy(rollout.load_policy("tiny", device="cpu")[0])
    peft_model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
    assert "model.layers.0.self_attn.q_proj is a peft." in fastgen.supports(base)  # wrapped in place
    assert "PeftModel" in fastgen.supports(peft_model)  # its decoder layers sit deeper than a Qwen3ForCausalLM's
    for model in (base, peft_model):
        assert rollout.resolve_engine("auto", fake_cuda(model)) == "hf"
        with pytest.raises(ValueError):
            rollout.generate(model, tokenizer, ["Hi"], samples_per_prompt=1, max_new_tokens=2, engine="fast")
