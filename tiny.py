"""The offline tiny world: a tokenizer built in code, a ~0.9M-parameter Qwen3, a task it can learn on a CPU, and
the supervised warm start that `--preset tiny` trains from.

Nothing here is SPIRAL: it exists so that every code path of the reference runs offline on a CPU in seconds
(tests) or minutes (`python train.py --preset tiny`). The task is "What is a + b?" for digits a, b, graded by the
real reward; the warm start imitates a noisy solver so that a set of traces holds more than one trace does.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass

import numpy as np
import torch
from transformers import GenerationConfig

import checkpoint
from logprobs import TokenBatch, completion_logprobs
from lora import replace_dir, write_json_atomic
import problemset
import rollout
from rollout import aggregation_prompt, chat_prompt_ids, search_prompt
from problemset import DATA_DIR, Problem

# The tiny preset's base model: the output of warm_start, shipped with the repository (3.7 MB).
WARM_START_DIR = os.path.join(DATA_DIR, "tiny_warmstart")


def tiny_sum_problems(seed: int = 0) -> list[Problem]:
    """The synthetic task of `--preset tiny`: "What is a + b?" for every pair of digits a, b in 0..9 (100 problems),
    gold answer str(a + b), graded by `reward` like any other problem. The order is a fixed shuffle (`seed`), so
    that the first N problems (evaluate.py --limit) are a fair sample rather than all "0 + b".

    Small enough that a ~1M-parameter model learns it on a CPU in minutes, yet the warm-started policy makes
    independent mistakes (warm_start), so a set of search traces holds more than any one of them.
    Training and evaluation use the same 100 problems: the demo shows learning, not generalisation.
    """
    problems = [Problem(f"What is {a} + {b}?", str(a + b), f"sum-{a}-{b}") for a in range(10) for b in range(10)]
    order = np.random.default_rng(seed).permutation(len(problems))
    return [problems[i] for i in order]


TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as in Qwen3's template (without the tool-calling and thinking branches).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tiny_corpus() -> list[str]:
    """Text the tiny byte-level BPE is trained on: the two prompts, the chat markup and math-like strings
    (deterministic)."""
    # The templates are repeated so that their phrases become single tokens: prompts stay short on a CPU.
    lines = [search_prompt("What is 12 + 34?"), aggregation_prompt("What is 12 + 34?", ["a", "b", "c", "d"])] * 20
    lines += ["<|im_start|>user\n", "<|im_start|>assistant\n"] * 20
    lines += [f"The answer is \\boxed{{{i}}}. {i} + {i % 7} = {i + i % 7}, {i} * 3 = {3 * i}." for i in range(200)]
    lines += ["Problem: Solution: Let x = y - z; then x^2 + 2x + 1 = (x+1)^2 and \\frac{1}{2} \\sqrt{3} \\pi."] * 5
    return lines


def build_tiny_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer built in code, with Qwen3's special tokens and ChatML template.

    As in Qwen3, <|im_end|> ends a turn and <|endoftext|> is both the pad token and a second stop token, so
    completions must be cut by position, never by `== pad`. Unlike Qwen3, merges may cross spaces, so the prompts'
    fixed phrases become a few tokens each (short prompts on a CPU); digit runs are split off first.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
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
    from transformers import Qwen3Config, Qwen3ForCausalLM

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


def load_tiny_policy(device: str = "cpu"):
    """(model, tokenizer): the tiny Qwen3 with random (seeded) weights, built in code; rollout.load_policy("tiny")."""
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer).to(device), tokenizer


def tiny_trace(problem: str, answer: str) -> str:
    """A trace of the tiny task, "3 + 5 = \\boxed{8}": restating the digits right before the answer lets a 4-layer
    model learn the sum much faster than from the prompt alone (EXPERIMENTS.md, "The warm start")."""
    a, b = re.findall(r"\d+", problem)
    return f"{a} + {b} = \\boxed{{{answer}}}"


def _noisy_answer(gold: str, rng: np.random.Generator, p_correct: float, max_miss: int) -> str:
    """The gold answer with probability p_correct, else a near miss gold +- d, d uniform in 1..max_miss (reflected
    to stay >= 0): different traces make different mistakes."""
    if rng.random() < p_correct:
        return gold
    d = int(rng.integers(1, max_miss + 1)) * (1 if rng.random() < 0.5 else -1)
    return str(int(gold) + d if int(gold) + d >= 0 else int(gold) - d)


@dataclass
class _SFTExample:
    prompt_ids: list[int]
    completion_ids: list[int]


def warm_start(out_dir: str = WARM_START_DIR, *, steps: int = 700, batch_size: int = 64, lr: float = 3e-3,
               warmup_steps: int = 30, p_correct: float = 0.4, max_miss: int = 5, aggregation_fraction: float = 0.5,
               set_size: int = 4, seed: int = 0, progress: bool = True):
    """Supervised warm start of the tiny policy on tiny_sum_problems: the base model `--preset tiny` trains from.

    RL needs a policy that is right sometimes, whose samples disagree, and that already answers aggregation
    prompts, so the warm start imitates a noisy solver: search examples answer right with probability p_correct,
    else a near miss gold +- 1..max_miss drawn afresh (independent mistakes, so majority@4 beats one sample);
    aggregation examples (aggregation_fraction of them) copy a uniformly chosen candidate's answer (as accurate as
    one trace, but able to read candidates). Full-parameter AdamW, warmup then cosine to lr/10, mean token
    cross-entropy. Deterministic for a seed (on one machine and torch version). Writes a save_pretrained directory
    (~4 MB) to `out_dir` and returns (model, tokenizer). Why each choice, and the shipped result's figures: README.
    """
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, tokenizer = load_tiny_policy("cpu")
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        problems = sorted(tiny_sum_problems(), key=lambda p: p.id)  # canonical order: "sum-0-0", ...
        cache: dict[str, list[int]] = {}

        def ids(text: str, prompt: bool) -> list[int]:
            if text not in cache:
                cache[text] = chat_prompt_ids(tokenizer, text) if prompt else \
                    tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            return cache[text]

        def example() -> _SFTExample:
            p = problems[rng.integers(len(problems))]
            if rng.random() < aggregation_fraction:
                answers = [_noisy_answer(p.answer, rng, p_correct, max_miss) for _ in range(set_size)]
                prompt = aggregation_prompt(p.problem, [tiny_trace(p.problem, a) for a in answers])
                target = answers[rng.integers(set_size)]
            else:
                prompt, target = search_prompt(p.problem), _noisy_answer(p.answer, rng, p_correct, max_miss)
            return _SFTExample(ids(prompt, True), ids(tiny_trace(p.problem, target), False))

        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        bar = tqdm(range(1, steps + 1), desc="warm start", disable=not progress, dynamic_ncols=True)
        for step in bar:
            scale = min(1.0, step / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            for group in optimizer.param_groups:
                group["lr"] = lr * scale
            batch = TokenBatch.from_samples([example() for _ in range(batch_size)], tokenizer.pad_token_id, "cpu")
            logprobs, _ = completion_logprobs(model, batch)  # (N,) over every completion token of the batch
            loss = -logprobs.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    save_warm_start(model, tokenizer, out_dir, dict(
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, p_correct=p_correct, max_miss=max_miss,
        aggregation_fraction=aggregation_fraction, set_size=set_size, seed=seed, torch=torch.__version__))
    return model, tokenizer


def save_warm_start(model, tokenizer, out_dir: str, recipe: dict) -> None:
    """The model directory out_dir (model, tokenizer, warm_start.json with its recipe), replaced only when complete."""
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    tmp = f"{os.path.abspath(out_dir)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(os.path.join(tmp, "warm_start.json"), {"recipe": recipe})
    except BaseException:  # a full disk, Ctrl-C: out_dir stays as it was, and no half-written copy fills the disk
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, out_dir)


# What save_warm_start writes (save_pretrained's names across transformers 5.x, and warm_start.json).
WARM_START_FILES = {"chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                    "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "warm_start.json"}


def warm_start_problem(out_dir: str, task: str) -> str | None:
    """Why a warm start of `task` ("tiny_sums" here, "tiny_parts" for tiny_parts.py) may not be written to out_dir,
    or None. Allowed: an absent or empty directory, or a warm start of the same task holding only what
    save_warm_start writes. Refused: anything else, including the other task's warm start (tiny_parts.py's base is
    the sums one) and a run's base/ (its adapters were trained on those very weights)."""
    if not os.path.lexists(out_dir):  # nothing there yet: it must be creatable (before minutes of SFT)
        return checkpoint.unwritable(out_dir)
    if os.path.isdir(out_dir) and not os.path.islink(out_dir) and not os.listdir(out_dir):
        return None
    if os.path.islink(out_dir):
        return f"{out_dir} is a symbolic link; name the directory itself"
    if not os.path.isdir(out_dir):
        return f"{out_dir} is a file, not a warm-start directory"
    try:
        with open(os.path.join(out_dir, "warm_start.json"), encoding="utf-8") as f:
            recipe = json.load(f)["recipe"]
        found = recipe.get("task", "tiny_sums")  # the sums warm start predates the "task" field
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{out_dir} exists and is not a warm start (no readable warm_start.json); refusing to replace it"
    if found != task:
        return f"{out_dir} holds the {found} warm start, not a {task} one; refusing to replace it"
    parent = os.path.dirname(os.path.abspath(out_dir))
    if os.path.basename(os.path.abspath(out_dir)) == "base" and os.path.isfile(os.path.join(parent, "config.json")):
        return f"{out_dir} is the base model of the run in {parent}; refusing to replace it"
    foreign = sorted(set(os.listdir(out_dir)) - WARM_START_FILES)
    if foreign:
        return f"{out_dir} holds {foreign[0]}, which a warm start does not write; refusing to replace it"
    return None


def rebuild_warm_start(out_dir: str = WARM_START_DIR, seed: int = 0) -> str:
    """warm_start into `out_dir`; FileExistsError (warm_start_problem's reason) if that would replace anything but
    a sums warm start."""
    why = warm_start_problem(out_dir, "tiny_sums")
    if why:
        raise FileExistsError(why)
    warm_start(out_dir, seed=seed)
    return out_dir


# rollout.load_policy("tiny") and problemset.load_problems("tiny_sums") find these here (rollout never imports tiny).
rollout.CODE_BUILT_POLICIES["tiny"] = load_tiny_policy
problemset.CODE_BUILT_PROBLEMS["tiny_sums"] = tiny_sum_problems


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    print("tiny.py: error: a library that train.py --preset tiny uses; nothing to run here (--help: what it holds)",
          file=sys.stderr)
    sys.exit(2)
