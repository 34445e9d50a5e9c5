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

    python tiny_parts.py --out data/tiny_parts_warmstart   # and data/tiny_parts.jsonl (14-20 min on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
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
from figures import Progress
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


def problems_jsonl() -> str:
    """parts_problems() as JSONL text for problemset.load_problems (one line per problem, fixed key order)."""
    return "".join(json.dumps({"problem": p.problem, "answer": p.answer, "id": p.id}) + "\n" for p in parts_problems())


def write_problems(path: str = PROBLEMS_FILE) -> str:
    """problems_jsonl() written to `path` (atomically)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(problems_jsonl())
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


def training_example(rng: np.random.Generator, p_digit: float, aggregation_fraction: float,
                     set_size: int) -> tuple[bool, str, str, str]:
    """One warm-start example on a fresh random problem: (is an aggregation example, problem, prompt, target answer).

    Search (probability 1 - aggregation_fraction): the Search Trace Prompt, target noisy_parts_answer. Aggregation:
    the Aggregation Trace Prompt over `set_size` noisy candidates, target their per-digit plurality (plurality_parts):
    the aggregator learns to read its candidates part by part. The completion is parts_trace(problem, target)."""
    p = random_parts_problem(rng)
    if rng.random() < aggregation_fraction:
        answers = [noisy_parts_answer(p.answer, rng, p_digit) for _ in range(set_size)]
        return True, p.problem, aggregation_prompt(p.problem, [parts_trace(p.problem, a) for a in answers]), \
            plurality_parts(answers, rng)
    return False, p.problem, search_prompt(p.problem), noisy_parts_answer(p.answer, rng, p_digit)


def sft_backward(model, examples: list[tuple[bool, _SFTExample]], pad_token_id: int) -> float:
    """The warm start's loss, mean token cross-entropy over the whole batch, -sum_tokens log pi / (tokens in the
    batch), backpropagated into model's .grad; returns its value. Search and aggregation examples go through
    separate forward passes (padding a 14-token search prompt to an aggregation prompt's length would double the
    cost), each part divided by the batch's token count, so the sum is the one-pass loss."""
    tokens = sum(len(e.completion_ids) for _, e in examples)
    loss = 0.0
    for role in (False, True):
        of_role = [e for aggregation, e in examples if aggregation == role]
        if of_role:
            batch = TokenBatch.from_samples(of_role, pad_token_id, "cpu")
            part = -completion_logprobs(model, batch)[0].sum() / tokens  # (N,) log-probs of every completion token
            part.backward()
            loss += part.item()
    return loss


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
            aggregation, problem, prompt, target = training_example(rng, p_digit, aggregation_fraction, set_size)
            completion = tokenizer(parts_trace(problem, target), add_special_tokens=False)["input_ids"] + [eos]
            return aggregation, _SFTExample(chat_prompt_ids(tokenizer, prompt), completion)

        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        # closed however the loop ends (Ctrl-C included): its heartbeat thread stops with it
        with Progress(steps, "tiny_parts.py: warm start", "steps") if progress else contextlib.nullcontext() as bar:
            for step in range(1, steps + 1):
                scale = min(1.0, step / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
                for group in optimizer.param_groups:
                    group["lr"] = lr * scale
                optimizer.zero_grad(set_to_none=True)
                loss = sft_backward(model, [example() for _ in range(batch_size)], tokenizer.pad_token_id)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if bar:
                    bar.update(note=f"loss {loss:.3f}")
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


def problems_file_problem(path: str = PROBLEMS_FILE) -> str | None:
    """Why write_problems may not write `path`, or None: it is absent, or already holds exactly the generator's
    output (rewritten byte for byte). A file that differs (edited, or another version's) is a user's: refused. Its
    folder must be writable (a read-only checkout): write_problems writes a temporary file there first."""
    from checkpoint import unwritable

    why = unwritable(os.path.dirname(os.path.abspath(path)))
    if why:
        return f"cannot write {path}: {why}"
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            same = f.read() == problems_jsonl()
    except (OSError, UnicodeDecodeError):
        same = False
    return None if same else f"{path} differs from the generator's problems; move it away to rebuild it"


def main(argv: list[str] | None = None) -> int:
    """Rebuild the task's problems file (data/tiny_parts.jsonl) and a warm start into --out. Every output is checked
    before the 14-20 minute warm start: --out must be new, empty or a tiny_parts warm start (the shipped one is
    replaced only when named), and the problems file absent or the generator's own."""
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit code 2, no usage block
            print(f"tiny_parts.py: error: {message}", file=sys.stderr)
            sys.exit(2)

    parser = Parser(prog="tiny_parts.py", description=main.__doc__.splitlines()[0],
                    epilog=f"rebuild the shipped files: python tiny_parts.py --out {os.path.relpath(WARM_START_DIR)}")
    parser.add_argument("--out", required=True,
                        help=f"warm-start directory (the shipped one: {os.path.relpath(WARM_START_DIR)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, as the shipped warm start was built: the bytes depend on it)")
    args = parser.parse_args(argv)
    from checkpoint import out_path_problem

    why = out_path_problem(args.out)
    why = f"--out {args.out!r}: {why}" if why else tiny.warm_start_problem(args.out, "tiny_parts")
    why = why or problems_file_problem(PROBLEMS_FILE)
    if not why and not 0 <= args.seed < 2**32:
        why = "--seed must be in [0, 2**32)"
    if not why and not 1 <= args.threads <= (os.cpu_count() or 1):
        why = f"--threads must be between 1 and {os.cpu_count() or 1} (the CPUs)"
    if why:
        print(f"tiny_parts.py: error: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    print(f"tiny_parts.py: wrote {write_problems(PROBLEMS_FILE)}")
    try:
        warm_start(args.out, seed=args.seed)
    except KeyboardInterrupt:
        print("tiny_parts.py: interrupted; nothing was written to --out", file=sys.stderr)
        return 130
    except OSError as e:  # a full disk while saving: save_warm_start leaves --out as it was
        print(f"tiny_parts.py: error: could not write the warm start to {args.out}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    print(f"tiny_parts.py: wrote the warm start to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
