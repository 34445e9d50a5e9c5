"""Rollouts: from "a list of problems" to sampled completions (Algorithm 1, lines 2 and 7).

The appendix's prompts (prompts.py, re-exported here), `load_policy` (a Hugging Face model or the code-built
"tiny"), and `generate`: y ~ softmax(logits / T) with Hugging Face `generate` (or fastgen.py, engine="fast"),
returning `Completion`s that carry the sampler's log-probabilities (the importance ratio's denominator in train.py)
and entropies.

Choices the paper leaves open:
  1. Plain temperature sampling from the full softmax: no top-k, top-p, min-p or repetition penalty, whatever the
     model's generation_config.json says (Qwen3-4B-Instruct-2507's asks for top_k=20, top_p=0.8, T=0.7). The
     policy gradient is only right if pi_theta is what was sampled.
  2. The samples of one prompt share one prefill of it (`share_prefix`): it saves prefill compute, not memory.
"""

from __future__ import annotations

import inspect
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

import fastgen
from prompts import aggregation_prompt, search_prompt  # noqa: F401 - the paper's prompts, re-exported
from logprobs import attention_backends
from lora import cast_once

DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
ENGINES = ("hf", "fast")  # generate's samplers: Hugging Face generate (the reference), fastgen.py


def resolve_engine(engine: str, model) -> str:
    """The sampler for `engine`: "auto" is "fast" on CUDA when fastgen runs the model (measured faster there and
    checked against teacher forcing on an H100: benchmarks/README.md), else "hf", the reference."""
    if engine != "auto":
        return engine
    return "fast" if model.device.type == "cuda" and not fastgen.supports(model) else "hf"


# ----------------------------------------------------------------------------------------------------------------------
# 2. Policies

# Policies built in code, by name: tiny.py registers "tiny" when imported (this module never imports tiny.py, which
# imports this one: no import cycle). train.py and evaluate.py import tiny.
CODE_BUILT_POLICIES: dict = {}  # name -> fn(device) -> (model, tokenizer)


def check_model(name: str) -> None:
    """Fail fast, with a one-line ValueError, on a model that load_policy cannot load: a directory without
    config.json, or a Hub id that is neither cached nor on a reachable Hub (instead of ~50 s of retries)."""
    local = os.path.expanduser(name)
    if name in CODE_BUILT_POLICIES or os.path.isfile(os.path.join(local, "config.json")):
        return
    if os.path.isdir(local):
        raise ValueError("no config.json, so not a model directory")
    if name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") > 1:
        raise ValueError("no such directory")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        raise ValueError(f"unknown model; expected 'tiny', a local directory or a Hugging Face id like {DEFAULT_MODEL}")
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    cached = isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)
    if huggingface_hub.constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES",
                                                                                                      "TRUE"):
        if not cached:
            raise ValueError("not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
        return
    try:
        huggingface_hub.model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise ValueError("not on the Hugging Face Hub (or private: log in with `hf auth login`)") from None
    except Exception as e:  # no network: DNS, proxy, timeout, ...
        if not cached:
            raise ValueError(f"the Hugging Face Hub is unreachable ({type(e).__name__}) and the model is not in the "
                             "local cache") from None
        huggingface_hub.constants.HF_HUB_OFFLINE = True  # else each file's download retries for tens of seconds
        os.environ["HF_HUB_OFFLINE"] = "1"
        print(f"the Hugging Face Hub is unreachable; loading {name} from the local cache")


@dataclass
class Completion:
    """One sampled completion y ~ pi(. | prompt); the unit that rollout hands to spiral.py."""

    prompt_ids: list[int]  # chat-templated prompt, no padding
    completion_ids: list[int]  # sampled tokens, up to and including the EOS that ended it
    logprobs: list[float]  # log pi_sampler(token) at the sampling temperature, one per completion token
    text: str  # decoded completion, special tokens removed
    truncated: bool  # hit max_new_tokens without an EOS
    entropies: list[float] | None = None  # H(pi_sampler(. | prefix)) in nats per completion token; None: not recorded


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_dtype(dtype, device: str) -> torch.dtype:
    """"auto" (bfloat16 on CUDA, float32 elsewhere), "bfloat16", "float32", or a torch.dtype among those."""
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected auto, {' or '.join(DTYPES)}")
    return DTYPES[dtype]


def load_policy(name_or_path: str = DEFAULT_MODEL, device: str | None = None, dtype="auto"):
    """(model, tokenizer) for pi_theta: a Hugging Face id, a local directory, or "tiny" (built in code, same weights
    every call), on `device` (default cuda if available) in `dtype` (see `resolve_dtype`), sdpa attention."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = resolve_dtype(dtype, device)
    if name_or_path in CODE_BUILT_POLICIES:  # "tiny"
        model, tokenizer = CODE_BUILT_POLICIES[name_or_path](device)
        return model.to(torch_dtype), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, attn_implementation="sdpa")
    return model.to(device).eval(), tokenizer


# ----------------------------------------------------------------------------------------------------------------------
# 3. Sampling: y ~ pi_theta(. | x) (Algorithm 1, lines 2 and 7)

# Generation micro-batches hold as many sequences as fit a budget of (prompt + completion) tokens of KV cache:
# on a GPU, its free memory minus a headroom (`generation_token_budget`); elsewhere this fixed default.
DEFAULT_TOKENS_PER_MICRO_BATCH = 131_072
# Headroom left free on a GPU for what is not KV cache: prefill activations, (B, V) fp32 logits, allocator slack.
HEADROOM_FRACTION, HEADROOM_MIN_BYTES = 0.10, 4 * 2**30


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """KV-cache bytes per token: 2 (K and V) x layers x KV heads x head_dim x bytes per element.

    head_dim defaults to hidden_size / num_attention_heads, KV heads to attention heads (no GQA). Qwen3-4B in bf16:
    2 x 36 x 8 x 128 x 2 = 147,456 bytes.
    """
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def kv_token_budget(config, free_bytes: int, headroom_bytes: int, dtype: torch.dtype) -> int:
    """Tokens of KV cache that fit (free_bytes - headroom_bytes): the generation micro-batch's token budget."""
    return max(0, int(free_bytes - headroom_bytes)) // kv_bytes_per_token(config, dtype)


def generation_token_budget(model) -> int:
    """kv_token_budget on the model's CUDA device: free memory (the driver's, plus what PyTorch's allocator holds
    unused, plus fastgen's KV arena, which the next call reuses) minus max(HEADROOM_MIN_BYTES, HEADROOM_FRACTION x
    total). Not on CUDA: DEFAULT_TOKENS_PER_MICRO_BATCH."""
    device = model.device
    if device.type != "cuda":
        return DEFAULT_TOKENS_PER_MICRO_BATCH
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) + fastgen.held_bytes(device)
    headroom = max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * total))
    return kv_token_budget(model.config, free, headroom, model.dtype)


def chat_prompt_ids(tokenizer, user_message: str) -> list[int]:
    """Token ids of the chat-templated prompt x for one user message, ending with the assistant header."""
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: model.generation_config.eos_token_id (an int or a list) plus the tokenizer's.

    Qwen3 stops on both <|im_end|> and <|endoftext|>; the latter is also its pad token.
    """
    configured = model.generation_config.eos_token_id
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model defines no EOS token (generation_config.eos_token_id and tokenizer.eos_token_id)")
    return ids


def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    tokens_per_micro_batch: int | None = None,
    progress: bool = False,
    share_prefix: bool = True,
    engine: str | None = None,
) -> list[list[Completion]]:
    """`samples_per_prompt` completions y ~ softmax(logits / temperature) per user message x (Algorithm 1, lines 2
    and 7), one list per prompt, in order; the chat template is applied here.

    Plain sampling from the full softmax (see the module docstring). Each Completion carries, per token, the
    sampler's log-prob of the sampled token and the entropy of the distribution it came from. A completion is cut
    after its first EOS (by position); `truncated`: no EOS within max_new_tokens. Micro-batches: left-padded, at
    most `micro_batch_size` sequences, by default as many as fit `tokens_per_micro_batch` (prompt + completion)
    tokens of KV cache (default `generation_token_budget(model)`; engine="fast" stores a prompt once for all its
    copies, `fastgen.rows_per_call`). share_prefix: the copies of a prompt share one
    prefill (`_prefill_shared_prefix`; falls back to a prefill per copy if the cache cannot be repeated).
    engine: "hf" (Hugging Face `generate`, the readable reference) or "fast" (fastgen.py: Qwen3 only, each prompt's
    KV stored once for its copies, cascade attention, CUDA graphs on CUDA); None: model.generation_engine if set,
    else "hf". Both return the same kind of Completions, with the sampler's own log-probs.
    """
    if samples_per_prompt < 1 or max_new_tokens < 1 or not temperature > 0:
        raise ValueError("need samples_per_prompt >= 1, max_new_tokens >= 1 and temperature > 0")
    engine = engine or getattr(model, "generation_engine", None) or "hf"
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: expected {' or '.join(ENGINES)}")
    if engine == "fast" and fastgen.supports(model):
        raise ValueError(fastgen.supports(model))
    prompt_ids_P = [chat_prompt_ids(tokenizer, prompt) for prompt in prompts]
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]  # only fills the left
    if micro_batch_size is None:
        longest = max((len(ids) for ids in prompt_ids_P), default=0)
        budget = tokens_per_micro_batch or generation_token_budget(model)
        micro_batch_size = (fastgen.rows_per_call(budget, longest, samples_per_prompt, max_new_tokens)
                            if engine == "fast" else max(1, budget // (longest + max_new_tokens)))
    calls = _plan_micro_batches([len(ids) for ids in prompt_ids_P], samples_per_prompt, micro_batch_size)
    if progress:
        from tqdm.auto import tqdm

        calls = tqdm(calls, desc="generate", unit="batch")

    completions_P: list[list[Completion]] = [[] for _ in prompts]
    was_training = model.training
    model.eval()  # no dropout while sampling; and gradient checkpointing in train mode would turn the KV cache off
    try:
        for prompt_indices, copies in calls:
            args = (model, [prompt_ids_P[i] for i in prompt_indices], copies, max_new_tokens, temperature, eos_ids,
                    pad_id)
            completion_ids_B, logprobs_B, entropies_B = (
                fastgen.sample_micro_batch(*args) if engine == "fast" else _sample_micro_batch(*args, share_prefix))
            rows_of_prompt = [i for i in prompt_indices for _ in range(copies)]  # same order as repeat_interleave
            for i, token_ids, token_logprobs, token_entropies in zip(rows_of_prompt, completion_ids_B, logprobs_B,
                                                                      entropies_B):
                completion_ids, truncated = cut_at_first_eos(token_ids, eos_ids)
                completions_P[i].append(
                    Completion(
                        prompt_ids=list(prompt_ids_P[i]),
                        completion_ids=completion_ids,
                        logprobs=token_logprobs[: len(completion_ids)],
                        text=tokenizer.decode(completion_ids, skip_special_tokens=True),
                        truncated=truncated,
                        entropies=token_entropies[: len(completion_ids)],
                    )
                )
    finally:
        model.train(was_training)
    return completions_P


def cut_at_first_eos(token_ids: list[int], eos_ids) -> tuple[list[int], bool]:
    """(tokens up to and including the first EOS, truncated): by position, never by comparing with the pad id.

    After a sequence ends, `generate` fills its row with the pad id, which for Qwen3 is itself an EOS id; cutting at
    the first EOS keeps the real stop token (which the loss must train) and drops the filler.
    """
    eos_ids = set(eos_ids)
    for position, token in enumerate(token_ids):
        if token in eos_ids:
            return list(token_ids[: position + 1]), False
    return list(token_ids), True


def _plan_micro_batches(prompt_lengths: list[int], samples_per_prompt: int, micro_batch_size: int):
    """Split the (prompt, sample) pairs into generate calls of at most `micro_batch_size` sequences.

    Returns a list of (prompt indices, copies): each prompt of a call is sampled `copies` times in it, so that one
    prefill per prompt can be shared. Prompts are taken shortest first, so a call holds prompts of similar length.
    """
    order = sorted(range(len(prompt_lengths)), key=lambda i: prompt_lengths[i])
    if samples_per_prompt <= micro_batch_size:
        per_call = micro_batch_size // samples_per_prompt
        return [(order[start : start + per_call], samples_per_prompt) for start in range(0, len(order), per_call)]
    return [
        ([i], min(micro_batch_size, samples_per_prompt - start))
        for i in order
        for start in range(0, samples_per_prompt, micro_batch_size)
    ]


class SamplerLogprobs(LogitsProcessor):
    """Divides the logits by the temperature; records log pi(y_t) of each sampled token and the entropy H(pi) of
    its step, in fp32.

    Custom logits processors run after the built-in ones and before the sampling warpers (all neutral here, see
    `_plain_sampling_config`), so the returned scores are exactly what `generate` samples from. The sampled token is
    only known at the next call (input_ids' last column) or from the returned sequences (`finish`), so one (B, V)
    row of log-probs is pending at a time; only (B,) values are kept per step (output_scores=True would keep
    (B, V) per step: 159 GB of fp32 for 64 sequences x 4,096 steps at Qwen3's vocabulary).
    """

    def __init__(self, temperature: float, prompt_length: int):
        self.temperature = temperature
        self.prompt_length = prompt_length
        self.logprobs: list[torch.Tensor] = []  # one (B,) tensor per generated position
        self.entropies: list[torch.Tensor] = []  # one (B,) tensor per generated position
        self._pending: torch.Tensor | None = None  # (B, V) log-probs of the token being sampled now
        self._pending_entropy: torch.Tensor | None = None  # (B,) entropy of that distribution
        self._pending_position = -1  # its position in the sequence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        self._record(input_ids)
        scores = scores.float() / self.temperature  # (B, V)
        self._pending = torch.log_softmax(scores, dim=-1)  # (B, V)
        # H = -sum_v p_v log p_v; entr(0) = 0, where p * log p would give 0 * -inf = nan for a -inf logit.
        self._pending_entropy = torch.special.entr(self._pending.exp()).sum(-1)  # (B,)
        self._pending_position = input_ids.shape[1]
        return scores

    def _record(self, sequences: torch.LongTensor) -> None:
        """Keep log pi(token) and H for the pending position if `sequences` (B, T) already holds the sampled token."""
        if self._pending is not None and sequences.shape[1] > self._pending_position:
            assert self._pending_position == self.prompt_length + len(self.logprobs), "a generate step was skipped"
            token_B = sequences[:, self._pending_position]  # (B,)
            self.logprobs.append(self._pending.gather(1, token_B[:, None]).squeeze(1))
            self.entropies.append(self._pending_entropy)
        self._pending = self._pending_entropy = None

    def finish(self, sequences: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, entropies), both (B, T_new), of the generated tokens of `sequences` (B, prompt + T_new)."""
        self._record(sequences)
        num_new = sequences.shape[1] - self.prompt_length
        if num_new == 0:
            empty = sequences.new_zeros((sequences.shape[0], 0), dtype=torch.float32)
            return empty, empty
        # A step beyond the returned sequences (transformers may run one and undo it) is dropped here.
        return torch.stack(self.logprobs[:num_new], dim=1), torch.stack(self.entropies[:num_new], dim=1)


def _plain_sampling_config(max_new_tokens: int, eos_ids: list[int], pad_id: int) -> GenerationConfig:
    """Multinomial sampling from the scores our processor returns: every warper and penalty neutral.

    temperature=1.0 because SamplerLogprobs applies the real temperature; top_k=0 (not None: None would be filled
    in from the model's generation_config and then from transformers' default top_k=50).
    """
    return GenerationConfig(
        do_sample=True,
        num_beams=1,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        typical_p=1.0,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        use_cache=True,
    )


@contextmanager
def _bare_generation_defaults(model, eos_ids: list[int], pad_id: int):
    """Hide the model's own generation_config from `generate` for the duration of one call.

    `generate` fills every field our config leaves at None (min_p, top_h, suppress_tokens, sequence_bias,
    cache_implementation, ...) from model.generation_config, which for a Hub model is generation_config.json.
    A bare config with only the special tokens leaves those fields neutral.
    """
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=saved.bos_token_id, eos_token_id=eos_ids, pad_token_id=pad_id
    )
    try:
        yield
    finally:
        model.generation_config = saved


def _left_pad(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (P, L): each row right-aligned, pads on the left with mask 0."""
    length = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)  # (P, L)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)  # (P, L)
    for row, s in enumerate(sequences):
        input_ids[row, length - len(s) :] = torch.tensor(s, dtype=torch.long)
        attention_mask[row, length - len(s) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def cache_keyword(model) -> str:
    """The name under which `model` takes and returns its KV cache: "cache" from transformers 5.2x on (where
    "past_key_values" still works but warns that it is deprecated), "past_key_values" before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()  # generate() is no_grad, this prefill must be too: LoRA weights require grad in training
def _prefill_shared_prefix(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int):
    """KV cache of every prompt but its last token, computed once and repeated `copies` times along the batch.

    `generate` then sees a cache of length L - 1 with inputs of length L and runs only the last prompt token
    (it needs that step's logits for the first sampled token). Returns None if the cache cannot be repeated.
    """
    prefix_mask = attention_mask[:, :-1]  # (P, L-1)
    position_ids = (prefix_mask.cumsum(-1) - 1).clamp(min=0)  # (P, L-1), as generate builds them from the mask
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    outputs = model(  # logits_to_keep=1: no lm_head over the whole prompt
        input_ids=input_ids[:, :-1], attention_mask=prefix_mask, position_ids=position_ids, use_cache=True, **extra
    )
    cache = getattr(outputs, cache_keyword(model))
    try:
        cache.batch_repeat_interleave(copies)  # (P, ...) -> (P * copies, ...), rows p0, p0, ..., p1, p1, ...
    except (AttributeError, NotImplementedError):
        return None
    return cache


def _sample_micro_batch(model, prompt_ids, copies, max_new_tokens, temperature, eos_ids, pad_id, share_prefix):
    """One `generate` call: `copies` samples of each prompt. Returns (token ids, log-probs, entropies) per row,
    unpadded on the left and not yet cut at EOS; rows are ordered prompt by prompt."""
    input_ids, attention_mask = _left_pad(prompt_ids, pad_id, model.device)  # (P, L)
    prompt_length = input_ids.shape[1]
    extra = {}
    if share_prefix and copies > 1 and prompt_length > 1:
        with attention_backends():  # no cuDNN attention: it crashes on H100s
            cache = _prefill_shared_prefix(model, input_ids, attention_mask, copies)
        if cache is not None:
            extra[cache_keyword(model)] = cache
    input_ids = input_ids.repeat_interleave(copies, dim=0)  # (B, L), B = P * copies
    attention_mask = attention_mask.repeat_interleave(copies, dim=0)  # (B, L)
    recorder = SamplerLogprobs(temperature, prompt_length)
    with _bare_generation_defaults(model, eos_ids, pad_id), attention_backends(), cast_once(model):  # no cuDNN (#18)
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=_plain_sampling_config(max_new_tokens, eos_ids, pad_id),
            logits_processor=LogitsProcessorList([recorder]),
            **extra,
        )  # (B, L + T)
    logprobs, entropies = recorder.finish(sequences)  # (B, T), (B, T)
    return sequences[:, prompt_length:].tolist(), logprobs.tolist(), entropies.tolist()


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (cli.library_main: an import cycle)
    print(__doc__)
