"""Rollouts: everything between "a list of problems" and "graded completions".

SPIRAL spends all of its compute here. This file holds
  1. the paper's two prompts (appendix, "Search Trace Prompt" and "Aggregation Trace Prompt"),
  2. `load_policy`: a Hugging Face causal LM, or "tiny", a Qwen3-architecture model with a tokenizer
     built entirely in code, so that every code path runs offline on a CPU in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"


# ----------------------------------------------------------------------------------------------------------------------
# 1. Prompts (paper appendix, word for word)

SEARCH_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."

AGGREGATION_HEADER = (
    "You are given a problem and several candidate solution traces. "
    "Some candidate solutions may be incorrect, incomplete, or truncated.\n\nProblem:\n\n{problem}\n\n"
)
AGGREGATION_CANDIDATE = "Solution {index}:\n{candidate}\n\n"
AGGREGATION_FOOTER = (
    "Your task is to audit the candidate traces and then synthesize a correct answer to the original problem.\n\n"
    "Follow this process:\n\n"
    "1. Briefly audit each candidate trace. Identify promising strategies, equations, intermediate results, "
    "or final answers that are explicitly supported by the visible text.\n"
    "2. Note any apparent errors or unsupported leaps. If a candidate trace is truncated, use only the claims "
    "that are explicitly supported by the visible text.\n"
    "3. Check the useful ideas for correctness against the original problem. Do not assume a candidate is correct "
    "just because it is confident or because multiple candidates agree.\n"
    "4. After the audit, write a line exactly as follows: ### Final Solution:\n"
    "5. Under that label, synthesize one coherent, self-contained final solution that can be judged without "
    "referring back to the candidates. Combine only the valid parts. If the candidates disagree, resolve the "
    "disagreement by reasoning from the original problem.\n\n"
    "Put the final answer within \\boxed{{}}."
)


def search_prompt(problem: str) -> str:
    """Search Trace Prompt (appendix): the user message from which y_1..y_N1 ~ pi_theta(. | x) are sampled."""
    return SEARCH_TEMPLATE.format(problem=problem)


def aggregation_prompt(problem: str, candidates: list[str]) -> str:
    """Aggregation Trace Prompt (appendix): the user message for y^G_j ~ pi_theta(. | x, G), G = (y_1..y_n)."""
    body = "".join(AGGREGATION_CANDIDATE.format(index=i + 1, candidate=c) for i, c in enumerate(candidates))
    return AGGREGATION_HEADER.format(problem=problem) + body + AGGREGATION_FOOTER.format()


# ----------------------------------------------------------------------------------------------------------------------
# 2. Policies


@dataclass
class Completion:
    """One sampled completion y ~ pi(. | prompt); the unit that rollout hands to spiral.py."""

    prompt_ids: list[int]  # chat-templated prompt, no padding
    completion_ids: list[int]  # sampled tokens, up to and including the EOS that ended it
    logprobs: list[float]  # log pi_sampler(token) at the sampling temperature, one per completion token
    text: str  # decoded completion, special tokens removed
    truncated: bool  # hit max_new_tokens without an EOS


TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as in Qwen3's template (without the tool-calling and thinking branches).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tiny_corpus() -> list[str]:
    """Text the tiny byte-level BPE is trained on: the two prompts plus math-like strings (deterministic)."""
    # The templates are repeated so that their words become single tokens: prompts stay short on a CPU.
    lines = [search_prompt("What is 12 + 34?"), aggregation_prompt("What is 12 + 34?", ["a", "b", "c", "d"])] * 20
    lines += [f"The answer is \\boxed{{{i}}}. {i} + {i % 7} = {i + i % 7}, {i} * 3 = {3 * i}." for i in range(200)]
    lines += ["Problem: Solution: Let x = y - z; then x^2 + 2x + 1 = (x+1)^2 and \\frac{1}{2} \\sqrt{3} \\pi."] * 5
    return lines


def build_tiny_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer built in code (no download) with Qwen3's special tokens and ChatML template.

    Like Qwen3: `<|im_end|>` is the EOS the chat template uses, `<|endoftext|>` is the pad token and a second
    stop token (so pad is one of the EOS ids: completions must be cut by position, never by `== pad`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(tokenizer, seed: int = 0):
    """A tiny Qwen3-architecture causal LM (about 0.9M parameters), identical weights for a given seed."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # CPU init only; do not disturb the caller's global RNG stream
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True, temperature=1.0
    )
    return model.float().eval()


def load_policy(name_or_path: str = DEFAULT_MODEL, device: str | None = None):
    """Return (model, tokenizer) for a Hugging Face model id, a local directory, or "tiny".

    On a GPU the model is loaded in bf16 with sdpa attention; on CPU in float32. "tiny" is built in code and is
    deterministic (same weights every call), which is what the tests and `--preset tiny` use.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name_or_path == "tiny":
        tokenizer = build_tiny_tokenizer()
        return build_tiny_model(tokenizer).to(device), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), tokenizer
