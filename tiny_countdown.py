"""The third tiny CPU task, "countdown": one trace is limited by search, a set by selection.

"Reach 8 from 3 7 2 9 4 mod 10.": put +, - or x between the numbers, in their order, so that the chain's value mod
10 is the target. A trace writes its running values (each mod 10, one digit), "3+7=0-2=8*9=2-4=8 \\boxed{8}", and is
right when the checker (`reward`, the task's r(x, y) through `--reward tiny_countdown:reward`) finds the numbers in
order, every running value right and the last one, the \\boxed{} answer and the target equal. Finding the operators
is search (81 chains, 0.13 of them hit on average); checking a written chain is a local comparison, since its last
value sits next to the \\boxed{} answer and the target is in the prompt, and each step is a one-digit table lookup.

The warm start imitates a solver that writes a chain with uniformly random operators and its running values (right
when the random try hits: no noise is injected), and an aggregator that copies a candidate whose answer is the
target, or any candidate when none is (it selects; it never re-solves). EXPERIMENTS.md, "A task where sets stay
imperfect: design and predictions (written before any RL run)", has the design, its first version and the figures.

Problems: PROBLEMS_FILE (1,000 training problems) and HELDOUT_FILE (200 others, disjoint problem texts), targets
drawn as the value of a uniformly random chain, so every problem has a solution. Rebuild the shipped files with

    python tiny_countdown.py --out data/tiny_countdown_warmstart   # and data/tiny_countdown{,_heldout}.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import sys

import numpy as np
import torch

import tiny
import tiny_parts
from figures import Progress
from problemset import DATA_DIR, Problem
from rollout import aggregation_prompt, chat_prompt_ids, search_prompt
from tiny import _SFTExample, build_tiny_model

NUMBERS, LARGEST, MODULUS = 5, 9, 10  # five numbers, each 1..9, used in order; every value mod 10
OPS = "+-*"
WARM_START_DIR = os.path.join(DATA_DIR, "tiny_countdown_warmstart")
PROBLEMS_FILE = os.path.join(DATA_DIR, "tiny_countdown.jsonl")
HELDOUT_FILE = tiny_parts.heldout_path(PROBLEMS_FILE)
TRAIN_SEED, HELDOUT_SEED = 0, 1
REWARD = "tiny_countdown:reward"
# train.py's preset: the tiny_parts6 settings with this task's reward; a trace is ~21 tokens.
TRAIN_PRESET = {
    "model": WARM_START_DIR, "data": PROBLEMS_FILE, "reward": REWARD, "device": "cpu", "cpu_threads": 1, "steps": 30,
    "save_every": 10, "lr": 2e-3, "micro_batch_tokens": 8192, "gradient_checkpointing": False, "max_draws": 16,
    "max_new_tokens": {"spiral": 28, "grpo": 56},  # 12 x 56 = (8 + 4 x 4) x 28
}
# evaluate.py's preset: held-out problems, never trained on.
EVALUATE_PRESET = dict(
    model=WARM_START_DIR, data=HELDOUT_FILE, reward=REWARD, limit=100, temperature=1.0, majority_subsets=32,
    num_samples=8, max_new_tokens=28, majority_max_new_tokens=28, rsa_populations=[4, 8], rsa_set_size=4,
    rsa_steps=3, max_tokens_list=[28], micro_batch_size=128)


def apply(value: int, op: str, x: int) -> int:
    """One step of a chain: value op x, mod MODULUS."""
    return (value + x if op == "+" else value - x if op == "-" else value * x) % MODULUS


def chain_values(numbers: tuple[int, ...], ops: str) -> list[int]:
    """The running values of a chain: numbers[0], then each op applied to the last value and the next number."""
    values = [numbers[0] % MODULUS]
    for op, x in zip(ops, numbers[1:]):
        values.append(apply(values[-1], op, x))
    return values


def all_ops(numbers: tuple[int, ...]) -> list[str]:
    """Every operator string of a chain over `numbers`, in a fixed order: the solver's search space (3^4 = 81)."""
    return ["".join(ops) for ops in itertools.product(OPS, repeat=len(numbers) - 1)]


def trace_text(numbers: tuple[int, ...], ops: str) -> str:
    """"3+7=0-2=8*9=2-4=8 \\boxed{8}": each running value written right after the step that makes it."""
    values = chain_values(numbers, ops)
    body = str(numbers[0]) + "".join(f"{op}{x}={v}" for op, x, v in zip(ops, numbers[1:], values[1:]))
    return f"{body} \\boxed{{{values[-1]}}}"


def problem_numbers(problem: str) -> tuple[int, tuple[int, ...]]:
    """"Reach 8 from 3 7 2 9 4 mod 10." -> (8, (3, 7, 2, 9, 4))."""
    m = re.fullmatch(r"Reach (\d+) from ([\d ]+) mod 10\.", problem)
    if not m:
        raise ValueError(f"not a countdown problem: {problem!r}")
    return int(m.group(1)), tuple(int(x) for x in m.group(2).split())


def random_problem(rng: np.random.Generator) -> Problem:
    """Five numbers uniform in 1..LARGEST; the target is the last value of a uniformly random chain."""
    numbers = tuple(int(x) for x in rng.integers(1, LARGEST + 1, NUMBERS))
    ops = all_ops(numbers)
    target = chain_values(numbers, ops[rng.integers(len(ops))])[-1]
    text = f"Reach {target} from {' '.join(map(str, numbers))} mod 10."
    return Problem(text, str(target), f"countdown-{''.join(map(str, numbers))}-{target}")


def countdown_problems(count: int = 1000, seed: int = TRAIN_SEED, exclude: frozenset = frozenset()) -> list[Problem]:
    """`count` problems with distinct texts drawn with default_rng(seed), none whose text is in `exclude`."""
    rng, seen, problems = np.random.default_rng(seed), set(exclude), []
    while len(problems) < count:
        p = random_problem(rng)
        if p.problem not in seen:
            seen.add(p.problem)
            problems.append(p)
    return problems


def heldout_problems(count: int = 200) -> list[Problem]:
    """The evaluation split: drawn with HELDOUT_SEED, disjoint from the 1,000 training problems' texts."""
    return countdown_problems(count, HELDOUT_SEED, frozenset(p.problem for p in countdown_problems()))


def problems_jsonl(heldout: bool = False) -> str:
    problems = heldout_problems() if heldout else countdown_problems()
    return "".join(json.dumps({"problem": p.problem, "answer": p.answer, "id": p.id}) + "\n" for p in problems)


def check(problem: str, completion: str) -> bool:
    """The checker: the completion is one chain "a(op x=v)*" over the problem's numbers in order, every running
    value right (mod 10), then \\boxed{} holding the last value, which is the target."""
    target, numbers = problem_numbers(problem)
    m = re.fullmatch(r"\s*(\d)((?:[-+*]\d=\d)*)\s*\\boxed\{(\d+)\}\s*", completion)
    if not m:
        return False
    steps = re.findall(r"([-+*])(\d)=(\d)", m.group(2))
    if (int(m.group(1)), *(int(x) for _, x, _ in steps)) != numbers:
        return False
    value = int(m.group(1))
    for op, x, written in steps:
        value = apply(value, op, int(x))
        if int(written) != value:
            return False
    return value == target == int(m.group(3))


def reward(problem: Problem, completion: str) -> float:
    """r(x, y) for `--reward tiny_countdown:reward`: 1.0 if `check` passes, else 0.0."""
    return float(check(problem.problem, completion))


def solver_trace(problem: str, rng: np.random.Generator) -> str:
    """The warm start's search target: a chain with uniformly random operators (right iff it hits the target)."""
    numbers = problem_numbers(problem)[1]
    return trace_text(numbers, "".join(OPS[i] for i in rng.integers(len(OPS), size=len(numbers) - 1)))


def aggregator_target(problem: str, candidates: list[str], rng: np.random.Generator) -> str:
    """The warm start's aggregation target: a uniformly chosen candidate whose \\boxed{} answer is the target (the
    candidates are the solver's, so their arithmetic is right), else a uniformly chosen candidate: it selects."""
    target = problem_numbers(problem)[0]
    hits = [c for c in candidates if c.endswith(f"\\boxed{{{target}}}")]
    pool = hits or candidates
    return pool[rng.integers(len(pool))]


def training_example(rng: np.random.Generator, aggregation_fraction: float, set_size: int) -> tuple[bool, str, str]:
    """(is an aggregation example, prompt, completion) on a fresh random problem."""
    p = random_problem(rng)
    if rng.random() < aggregation_fraction:
        candidates = [solver_trace(p.problem, rng) for _ in range(set_size)]
        return True, aggregation_prompt(p.problem, candidates), aggregator_target(p.problem, candidates, rng)
    return False, search_prompt(p.problem), solver_trace(p.problem, rng)


def warm_start(out_dir: str = WARM_START_DIR, *, steps: int = 300, batch_size: int = 64, lr: float = 3e-3,
               warmup_steps: int = 30, aggregation_fraction: float = 0.5, set_size: int = 4, seed: int = 0,
               init: str | None = tiny_parts.WARM_START_DIR, progress: bool = True):
    """Supervised warm start on fresh random problems (the solver's and the aggregator's targets above), from the
    tiny_parts warm start (its tokenizer writes every digit as a token). Loss, optimiser and schedule as
    tiny_parts.warm_start. Writes a save_pretrained directory to `out_dir`; returns (model, tokenizer)."""
    from safetensors.torch import load_file

    rng = np.random.default_rng(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = tiny_parts.build_parts_tokenizer()
        model = build_tiny_model(tokenizer)
        if init is not None:
            model.load_state_dict(load_file(os.path.join(init, "model.safetensors")), strict=False)
            model.tie_weights()
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

        def example() -> tuple[bool, _SFTExample]:
            aggregation, prompt, target = training_example(rng, aggregation_fraction, set_size)
            completion = tokenizer(target, add_special_tokens=False)["input_ids"] + [eos]
            return aggregation, _SFTExample(chat_prompt_ids(tokenizer, prompt), completion)

        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        with Progress(steps, "tiny_countdown.py: warm start", "steps") if progress else contextlib.nullcontext() as bar:
            for step in range(1, steps + 1):
                scale = min(1.0, step / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
                for group in optimizer.param_groups:
                    group["lr"] = lr * scale
                optimizer.zero_grad(set_to_none=True)
                loss = tiny_parts.sft_backward(model, [example() for _ in range(batch_size)], tokenizer.pad_token_id)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if bar:
                    bar.update(note=f"loss {loss:.3f}")
    model.eval()
    recipe = dict(task="tiny_countdown", steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
                  aggregation_fraction=aggregation_fraction, set_size=set_size, seed=seed, torch=torch.__version__,
                  init=os.path.relpath(init, DATA_DIR) if init else None)
    tiny.save_warm_start(model, tokenizer, out_dir, recipe)
    return model, tokenizer


def solver_hit_rate(problem: Problem) -> float:
    """P(the warm start's solver hits): the fraction of valid chains whose last value is the target."""
    target, numbers = problem_numbers(problem.problem)
    return float(np.mean([chain_values(numbers, ops)[-1] == target for ops in all_ops(numbers)]))


def main(argv: list[str] | None = None) -> int:
    """Write the two problem files and the warm start into --out."""
    parser = argparse.ArgumentParser(prog="tiny_countdown.py", description=main.__doc__)
    parser.add_argument("--out", required=True, help=f"warm-start directory (shipped: {os.path.relpath(WARM_START_DIR)})")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    why = tiny.warm_start_problem(args.out, "tiny_countdown")
    if why:
        print(f"tiny_countdown.py: error: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for path, heldout in ((PROBLEMS_FILE, False), (HELDOUT_FILE, True)):
        with open(path, "w", encoding="utf-8") as f:
            f.write(problems_jsonl(heldout))
        print(f"tiny_countdown.py: wrote {path}")
    warm_start(args.out, steps=args.steps, seed=args.seed)
    print(f"tiny_countdown.py: wrote the warm start to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
