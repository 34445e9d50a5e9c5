"""train.py's hand-written LoRA: exactness of the base path, gradients under checkpointing, named adapters, and the
PEFT on-disk format (checked against the key names and config fields peft 0.21 writes for this model)."""

import copy
import json
import os

import pytest
import torch
from safetensors import safe_open

import rollout
import train
from logprobs import TokenBatch, completion_logprobs
import lora

TINY_LAYERS = 4
# (module path inside a decoder layer, in_features, out_features) for the tiny Qwen3: hidden 128, 4 query heads and
# 2 key/value heads of dim 32, MLP 384.
TINY_SHAPES = {
    "self_attn.q_proj": (128, 128), "self_attn.k_proj": (128, 64), "self_attn.v_proj": (128, 64),
    "self_attn.o_proj": (128, 128), "mlp.gate_proj": (128, 384), "mlp.up_proj": (128, 384),
    "mlp.down_proj": (384, 128),
}
# Every field that peft 0.21.2 writes for LoraConfig (from PeftModel.save_pretrained of this model): the fields we
# write must be a subset, or peft warns and drops them.
PEFT_LORA_FIELDS = {
    "alora_invocation_tokens", "alpha_pattern", "arrow_config", "auto_mapping", "base_model_name_or_path", "bias",
    "corda_config", "ensure_weight_tying", "eva_config", "exclude_modules", "fan_in_fan_out", "inference_mode",
    "init_lora_weights", "kasa_config", "layer_replication", "layers_pattern", "layers_to_transform", "loftq_config",
    "lora_alpha", "lora_bias", "lora_dropout", "lora_ga_config", "megatron_config", "megatron_core",
    "modules_to_save", "monteclora_config", "peft_type", "peft_version", "qalora_group_size", "r", "rank_pattern",
    "revision", "target_modules", "target_parameters", "task_type", "trainable_token_indices", "use_bdlora",
    "use_dora", "use_qalora", "use_rslora", "velora_config",
}


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = rollout.load_policy("tiny", device="cpu")
    return model, tokenizer


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny[0])


def _ids(seed=0, shape=(3, 17)):
    return torch.randint(3, 1000, shape, generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _perturb(model, adapter="default", seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora.lora_parameters(model, adapter):
            p.add_(torch.randn(p.shape, generator=g) * scale)


def test_zero_B_gives_the_base_model_bit_for_bit(model):
    ids = _ids()
    base = _logits(model, ids)
    lora.add_lora(model, rank=8, alpha=16)
    assert torch.equal(_logits(model, ids), base)
    # ...and A really is random (Kaiming-uniform), so the test above is about B = 0, not about A = 0.
    A = lora.lora_parameters(model)[0]
    assert A.abs().max() > 0 and A.dtype == torch.float32


def test_adapters_disabled_is_the_base_model_exactly_after_training(model):
    ids = _ids(1)
    base = _logits(model, ids)
    lora.add_lora(model)
    opt = torch.optim.AdamW(lora.lora_parameters(model), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(ids).logits.float().pow(2).mean().backward()
        opt.step()
    trained = _logits(model, ids)
    assert not torch.allclose(trained, base)  # training did change the adapted model
    with lora.use_adapter(model, None):
        assert torch.equal(_logits(model, ids), base)
    assert torch.equal(_logits(model, ids), trained)  # and the adapter is back on afterwards


def test_every_lora_parameter_gets_a_gradient_under_checkpointing_and_the_base_none(model):
    lora.add_lora(model)
    train.enable_gradient_checkpointing(model)
    _perturb(model)  # B != 0, so A gets a gradient too
    model.train()
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    ids = _ids(2)
    model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
    adapter_ids = {id(p) for p in lora.lora_parameters(model)}
    assert len(adapter_ids) == 2 * 7 * TINY_LAYERS
    for name, p in model.named_parameters():
        if id(p) in adapter_ids:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name


def test_checkpointed_gradients_equal_plain_ones(model):
    lora.add_lora(model)
    _perturb(model)
    ids = _ids(3)

    def grads(m):
        m.zero_grad()
        m.train()
        m(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        return [p.grad.clone() for p in lora.lora_parameters(m)]

    plain = grads(model)
    train.enable_gradient_checkpointing(model)
    for a, b in zip(grads(model), plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_named_adapters_switch_and_train_separately(model):
    ids = _ids(4)
    lora.add_lora(model, adapter_name="default")
    lora.add_lora(model, adapter_name="aggregator")
    assert lora.adapter_names(model) == ["default", "aggregator"]
    _perturb(model, "default", seed=1)
    _perturb(model, "aggregator", seed=2)
    theta = _logits(model, ids)  # "default" is active by default
    with lora.use_adapter(model, "aggregator"):
        phi = _logits(model, ids)
        with lora.use_adapter(model, None):
            base = _logits(model, ids)
        assert torch.equal(_logits(model, ids), phi)  # nesting restores the outer adapter
    assert not torch.allclose(theta, phi) and not torch.allclose(theta, base)
    # A loss computed under "aggregator" gives gradients to phi only.
    with lora.use_adapter(model, "aggregator"):
        model(ids).logits.float().pow(2).mean().backward()
    assert all(p.grad is None for p in lora.lora_parameters(model, "default"))
    assert all(p.grad is not None for p in lora.lora_parameters(model, "aggregator"))
    with pytest.raises(KeyError):
        with lora.use_adapter(model, "nope"):
            pass


def test_peft_key_names_shapes_and_config(model, tmp_path):
    lora.add_lora(model, rank=32, alpha=32)
    lora.save_adapter(model, str(tmp_path / "adapter"), "/some/base")
    expected = {}
    for layer in range(TINY_LAYERS):
        for module, (fan_in, fan_out) in TINY_SHAPES.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            expected[f"{prefix}.lora_A.weight"] = (32, fan_in)
            expected[f"{prefix}.lora_B.weight"] = (fan_out, 32)
    with safe_open(str(tmp_path / "adapter" / "adapter_model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == expected
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert set(config) <= PEFT_LORA_FIELDS
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["r"] == 32 and config["lora_alpha"] == 32 and config["lora_dropout"] == 0.0
    assert config["bias"] == "none" and config["fan_in_fan_out"] is False and config["use_rslora"] is False
    assert config["target_modules"] == sorted(lora.TARGET_MODULES)
    assert config["base_model_name_or_path"] == "/some/base"
    assert sorted(os.listdir(tmp_path / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]


def test_save_load_round_trip_into_a_fresh_model(tiny, tmp_path):
    source = copy.deepcopy(tiny[0])
    lora.add_lora(source, rank=4, alpha=8)
    lora.add_lora(source, rank=4, alpha=8, adapter_name="aggregator")
    _perturb(source, "default", seed=5)
    _perturb(source, "aggregator", seed=6)
    lora.export_adapters(source, str(tmp_path / "adapter"), "base")
    assert (tmp_path / "adapter" / "aggregator" / "adapter_config.json").exists()  # peft's sub-directory layout
    lora.export_adapters(source, str(tmp_path / "adapter"), "base")  # replacing an existing export works
    # save_adapter keeps what else is in the directory: the sub-adapter survives re-saving the default one.
    lora.save_adapter(source, str(tmp_path / "one"), "base", "aggregator")
    lora.save_adapter(source, str(tmp_path / "one" / "aggregator"), "base", "aggregator")
    lora.save_adapter(source, str(tmp_path / "one"), "base")
    assert sorted(os.listdir(tmp_path / "one")) == ["adapter_config.json", "adapter_model.safetensors", "aggregator"]

    target = copy.deepcopy(tiny[0])
    lora.load_adapter(target, str(tmp_path / "adapter"))  # adds the LoRA modules from adapter_config.json
    lora.load_adapter(target, str(tmp_path / "adapter" / "aggregator"), "aggregator")
    ids = _ids(6)
    assert torch.equal(_logits(target, ids), _logits(source, ids))
    with lora.use_adapter(target, "aggregator"), lora.use_adapter(source, "aggregator"):
        assert torch.equal(_logits(target, ids), _logits(source, ids))
    # A rank mismatch is an error, not a silent partial load.
    wrong = copy.deepcopy(tiny[0])
    lora.add_lora(wrong, rank=2)
    with pytest.raises(ValueError, match="shape"):
        lora.load_adapter(wrong, str(tmp_path / "adapter"))


def test_real_peft_loads_our_adapter_and_we_load_its(tiny, tmp_path):
    """Runs only where peft is installed (it is not a dependency): the format is peft's own."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    model = copy.deepcopy(tiny[0])
    model.save_pretrained(tmp_path / "base")
    lora.add_lora(model)
    _perturb(model)
    lora.save_adapter(model, str(tmp_path / "ours"), str(tmp_path / "base"))
    peft_model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                                str(tmp_path / "ours"))
    ids = _ids(7)
    assert torch.equal(_logits(peft_model, ids), _logits(model, ids))
    peft_model.save_pretrained(tmp_path / "theirs")
    reloaded = copy.deepcopy(tiny[0])
    lora.load_adapter(reloaded, str(tmp_path / "theirs"))
    assert torch.equal(_logits(reloaded, ids), _logits(model, ids))


def test_bf16_base_keeps_fp32_adapter_weights_and_gradients(model):
    """As on the GPU: a bf16 base, fp32 LoRA master weights, the side path in bf16, gradients back in fp32."""
    model.to(torch.bfloat16)
    ids = _ids(8)
    base = _logits(model, ids)
    lora.add_lora(model)
    assert torch.equal(_logits(model, ids), base)
    _perturb(model)
    batch = TokenBatch(ids, torch.ones_like(ids), torch.arange(17).expand(3, 17) >= 10)
    logprobs, entropy = completion_logprobs(model, batch, chunk_size=4)
    assert logprobs.dtype == torch.float32 and logprobs.shape == (3 * 7,)
    logprobs.sum().backward()
    for p in lora.lora_parameters(model):
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32 and p.grad.abs().sum() > 0
