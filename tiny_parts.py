"""The second tiny CPU task, "parts": a set of traces knows more than one trace (issue 21).

"What is 352 + 416?" for three-digit numbers whose digit sums never carry, so the answer's three digits are three
independent parts (3+4, 5+1, 2+6). The warm start imitates a noisy solver that gets each digit right with
probability p_digit and otherwise writes a uniformly random other digit, independently per digit and per trace:
one trace is right only if all three parts are (p_digit^3), while 4 traces usually hold every part somewhere and
agree on it more often than on any wrong digit. Its aggregator combines candidates digit by digit (the plurality
digit of each position), so a set is worth more than any of its members before RL starts. The README's second-task
section has the measured figures and the SPIRAL against GRPO comparison (benchmarks/second_task.py).

Same world as tiny.py (tokenizer, 0.9M-parameter Qwen3, the paper's prompts and reward) but every digit is its own
token, so a part is a token. Problems: PROBLEMS_FILE (1,000 problems, written by `write_problems`). Rebuild both
shipped files byte-identically with

    python tiny_parts.py            # data/tiny_parts.jsonl and data/tiny_parts_warmstart/ (minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter

import numpy as np
import torch

import tiny
from logprobs import TokenBatch, completion_logprobs
from problemset import DATA_DIR, Problem
from rollout import aggregation_prompt, chat_prompt_ids, search_prompt
from tiny import _SFTExample, build_tiny_model, build_tiny_tokenizer

DIGITS = 3  # parts per problem
WARM_START_DIR = os.path.join(DATA_DIR, "tiny_parts_warmstart")
PROBLEMS_FILE = os.path.join(DATA_DIR, "tiny_parts.jsonl")  # what `python train.py --preset tiny_parts` trains on


def _digit_pairs(rng: np.random.Generator, leading: bool) -> tuple[int, int]:
    """(a, b) uniform among digit pairs with a + b <= 9 (no carry); a, b >= 1 for the leading digit."""
    pairs = [(a, b) for a in range(1 if leading else 0, 10) for b in range(1 if leading else 0, 10) if a + b <= 9]
    return pairs[rng.integers(len(pairs))]


def random_parts_problem(rng: np.random.Generator) -> Problem:
    """One problem "What is A + B?" with DIGITS-digit A, B and no carry; gold str(A + B) (graded by `reward`)."""
    pairs = [_digit_pairs(rng, leading=i == 0) for i in range(DIGITS)]
    a = "".join(str(x) for x, _ in pairs)
    b = "".join(str(y) for _, y in pairs)
    return Problem(f"What is {a} + {b}?", str(int(a) + int(b)), f"parts-{a}-{b}")


def parts_problems(count: int = 1000, seed: int = 0) -> list[Problem]:
    """`count` distinct problems drawn with default_rng(seed) from the 36 x 55 x 55 = 108,900 possible: the training
    and evaluation problems of the `tiny_parts` presets (PROBLEMS_FILE holds count=1000, seed=0)."""
    rng, seen, problems = np.random.default_rng(seed), set(), []
    while len(problems) < count:
        p = random_parts_problem(rng)
        if p.id not in seen:
            seen.add(p.id)
            problems.append(p)
    return problems


def write_problems(path: str = PROBLEMS_FILE) -> str:
    """parts_problems() as a JSONL file for problemset.load_problems (one line per problem, fixed key order)."""
    lines = [json.dumps({"problem": p.problem, "answer": p.answer, "id": p.id}) + "\n" for p in parts_problems()]
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(tmp, path)
    return path


def parts_trace(problem: str, answer: str) -> str:
    """A trace of the task, "352 + 416 = \\boxed{768}" (14 tokens with the EOS): the operands restated right before
    the answer, as tiny.tiny_trace, so each answer digit sits at the same short offsets from its two operand digits."""
    a, b = problem.removeprefix("What is ").removesuffix("?").split(" + ")
    return f"{a} + {b} = \\boxed{{{answer}}}"


def noisy_parts_answer(gold: str, rng: np.random.Generator, p_digit: float) -> str:
    """Each digit of `gold` kept with probability p_digit, else replaced by a uniformly random other digit
    (independently per digit): traces make different mistakes on different parts."""
    out = []
    for d in gold:
        if rng.random() < p_digit:
            out.append(d)
        else:
            out.append(str((int(d) + int(rng.integers(1, 10))) % 10))
    return "".join(out)


def plurality_parts(answers: list[str], rng: np.random.Generator) -> str:
    """The warm start's aggregation target: per digit position, the digit most candidates write (ties: uniform
    among the tied digits). Candidates whose length differs from the first one's are ignored."""
    same = [a for a in answers if len(a) == len(answers[0])]
    out = []
    for position in range(len(same[0])):
        counts = Counter(a[position] for a in same)
        top = max(counts.values())
        tied = sorted(d for d, c in counts.items() if c == top)
        out.append(tied[rng.integers(len(tied))])
    return "".join(out)


def build_parts_tokenizer():
    """tiny.build_tiny_tokenizer with every digit a pre-token of its own, so a part is one token and the model can
    copy a digit from a candidate by position (the tiny tokenizer merges digit runs: "352" -> "35", "2")."""
    from tokenizers import Regex, pre_tokenizers

    tokenizer = build_tiny_tokenizer()
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return tokenizer


def warm_start(out_dir: str = WARM_START_DIR, *, steps: int = 400, batch_size: int = 64, lr: float = 3e-3,
               warmup_steps: int = 30, p_digit: float = 0.6, aggregation_fraction: float = 0.5, set_size: int = 4,
               seed: int = 0, init: str | None = tiny.WARM_START_DIR, progress: bool = True):
    """Supervised warm start of the tiny policy on random parts problems (all 108,900, drawn afresh): the base
    model of `--preset tiny_parts`.

    Search examples: parts_trace with noisy_parts_answer (each digit right with probability p_digit). Aggregation
    examples (aggregation_fraction): the aggregation prompt with `set_size` such noisy candidates, target the
    per-digit plurality of the candidates (plurality_parts), so the aggregator reads its candidates part by part.
    Optimiser and schedule as tiny.warm_start. Deterministic for a seed on one machine and torch version. Writes a
    save_pretrained directory (~4 MB) to `out_dir` and returns (model, tokenizer).
    """
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = build_parts_tokenizer()
        model = build_tiny_model(tokenizer)
        if init is not None:  # same vocabulary (only the pre-tokenizer differs): start from the sums warm start
            from safetensors.torch import load_file
            missing, unexpected = model.load_state_dict(load_file(os.path.join(init, "model.safetensors")), strict=False)
            if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embedding
                raise ValueError(f"{init} is not a tiny.py warm start ({missing + unexpected} differ)")
            model.tie_weights()
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

        def example() -> tuple[bool, _SFTExample]:
            """(is an aggregation example, the example)"""
            p = random_parts_problem(rng)
            aggregation = rng.random() < aggregation_fraction
            if aggregation:
                answers = [noisy_parts_answer(p.answer, rng, p_digit) for _ in range(set_size)]
                prompt = aggregation_prompt(p.problem, [parts_trace(p.problem, a) for a in answers])
                target = plurality_parts(answers, rng)
            else:
                prompt, target = search_prompt(p.problem), noisy_parts_answer(p.answer, rng, p_digit)
            completion = tokenizer(parts_trace(p.problem, target), add_special_tokens=False)["input_ids"] + [eos]
            return aggregation, _SFTExample(chat_prompt_ids(tokenizer, prompt), completion)

        def loss_of(examples: list[_SFTExample]) -> torch.Tensor:
            batch = TokenBatch.from_samples(examples, tokenizer.pad_token_id, "cpu")
            return -completion_logprobs(model, batch)[0].sum()  # (N,) log-probs of every completion token

        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        bar = tqdm(range(1, steps + 1), desc="warm start", disable=not progress, dynamic_ncols=True)
        for step in bar:
            scale = min(1.0, step / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            for group in optimizer.param_groups:
                group["lr"] = lr * scale
            examples = [example() for _ in range(batch_size)]
            # Short search and long aggregation examples in separate forward passes: padding search examples to the
            # aggregation prompts' length would double the cost. Same mean token cross-entropy over the batch.
            tokens = sum(len(e.completion_ids) for _, e in examples)
            optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for role in (False, True):
                of_role = [e for aggregation, e in examples if aggregation == role]
                if of_role:
                    part = loss_of(of_role) / tokens
                    part.backward()
                    loss += part.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            bar.set_postfix(loss=f"{loss:.3f}")
    model.eval()
    tiny.save_warm_start(model, tokenizer, out_dir, dict(
        task="tiny_parts", steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, p_digit=p_digit,
        aggregation_fraction=aggregation_fraction, set_size=set_size, seed=seed, torch=torch.__version__))
    return model, tokenizer


def measure(model, tokenizer, problems: list[Problem], *, samples: int = 8, set_size: int = 4, seed: int = 0,
            max_new_tokens: int = 16) -> dict[str, float]:
    """The task's property on a policy, means over `problems` with `samples` search traces each (torch seed `seed`):

        single       P(one trace is right)                                          pass@1
        majority     P(the most frequent answer of all `samples` traces is right)   majority@samples, ties split
        any_right    P(some trace of a set of `set_size` is right)                  pass@set_size
        parts_right  P(every digit is right in some trace of the set)               what a per-part aggregator can reach
        aggregation  P(one aggregation trace over the set is right)                 the Aggregation Trace Prompt
    Sets are consecutive, disjoint groups of `set_size` of the samples. Graded by the project's reward.
    """
    from reward import extract_answer, reward
    from rollout import generate

    if samples % set_size:
        raise ValueError(f"samples={samples} is not a multiple of set_size={set_size}")
    torch.manual_seed(seed)
    pools = generate(model, tokenizer, [search_prompt(p.problem) for p in problems], samples_per_prompt=samples,
                     max_new_tokens=max_new_tokens)
    sets = [(p, pool[i:i + set_size]) for p, pool in zip(problems, pools) for i in range(0, samples, set_size)]
    aggregations = generate(model, tokenizer, [aggregation_prompt(p.problem, [c.text for c in s]) for p, s in sets],
                            samples_per_prompt=1, max_new_tokens=max_new_tokens)
    single = [reward(c.text, p.answer) for p, pool in zip(problems, pools) for c in pool]
    majority = []
    for p, pool in zip(problems, pools):
        counts = Counter(extract_answer(c.text) or "" for c in pool)
        top = [a for a, c in counts.items() if c == max(counts.values())]
        majority.append((p.answer in top) / len(top))  # a tie is broken uniformly at random
    any_right, parts_right = [], []
    for p, s in sets:
        answers = [extract_answer(c.text) or "" for c in s]
        any_right.append(float(any(reward(c.text, p.answer) == 1.0 for c in s)))
        parts_right.append(float(all(any(len(a) == len(p.answer) and a[i] == d for a in answers)
                                     for i, d in enumerate(p.answer))))
    aggregation = [reward(row[0].text, p.answer) for (p, _), row in zip(sets, aggregations)]
    return {name: float(np.mean(values)) for name, values in [
        ("single", single), ("majority", majority), ("any_right", any_right), ("parts_right", parts_right),
        ("aggregation", aggregation)]}


def main(argv: list[str] | None = None) -> int:
    """python tiny_parts.py [--out DIR] [--seed S] [--threads T]: rebuild the problems file and the warm start."""
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit code 2, no usage block
            print(f"tiny_parts.py: error: {message}", file=sys.stderr)
            sys.exit(2)

    parser = Parser(prog="tiny_parts.py", description=main.__doc__)
    parser.add_argument("--out", default=WARM_START_DIR, help="warm-start directory (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, as the shipped warm start was built: the bytes depend on it)")
    args = parser.parse_args(argv)
    out = args.out
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)) \
            and not os.path.exists(os.path.join(out, "warm_start.json")):
        print(f"tiny_parts.py: error: {out} exists and is not a warm start (no warm_start.json); refusing to "
              "replace it", file=sys.stderr)
        return 2
    if not 0 <= args.seed < 2**32 or (args.threads is not None and args.threads < 1):
        print("tiny_parts.py: error: --seed must be in [0, 2**32) and --threads positive", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"tiny_parts.py: wrote {write_problems()}")
    warm_start(out, seed=args.seed)
    print(f"tiny_parts.py: wrote the warm start to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
