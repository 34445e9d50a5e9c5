"""The second tiny CPU task, "parts": a set of traces knows more than one trace.

"What is 352 + 416?" for three-digit numbers whose digit sums never carry, so the answer's three digits are three
independent parts (3+4, 5+1, 2+6). The warm start imitates a noisy solver that gets each digit right with
probability p_digit and otherwise writes a uniformly random other digit, independently per digit and per trace:
one trace is right only if all three parts are (p_digit^3), while 4 traces usually hold every part somewhere and
agree on it more often than on any wrong digit. Its aggregator combines candidates digit by digit (the plurality
digit of each position), so a set is worth more than any of its members before RL starts. EXPERIMENTS.md, "A second
CPU task where a set knows more than a trace", has the measured figures and the SPIRAL against GRPO comparison
(benchmarks/second_task.py).

Same world as tiny.py (tokenizer, 0.9M-parameter Qwen3, the paper's prompts and reward) but every digit is its own
token, so a part is a token. Problems: PROBLEMS_FILE (1,000 training problems, written by `write_problems`) and
HELDOUT_FILE (200 others, never trained on by RL: what evaluate.py --preset tiny_parts evaluates; the warm start's
SFT, which draws random problems afresh, drew 41 of the 200, 18 of the first 100; tiny_parts6's drew none).

A harder variant, TASKS["tiny_parts6"]: six digits, each right with probability 0.5 in the warm start, so one trace
is almost never right (0.5^6 = 0.016) while the per-position plurality of a set of 4 often is; its warm start
continues from this one. Rebuild the shipped files byte-identically with

    python tiny_parts.py --out data/tiny_parts_warmstart   # and data/tiny_parts{,_heldout}.jsonl (14-20 min, 2 cores)
    python tiny_parts.py --task tiny_parts6 --out data/tiny_parts6_warmstart   # and data/tiny_parts6{,_heldout}.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass

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
HELDOUT_FILE = os.path.join(DATA_DIR, "tiny_parts_heldout.jsonl")  # what evaluate.py --preset tiny_parts evaluates
TRAIN_SEED, HELDOUT_SEED = 0, 1  # the generator's seeds of the two splits


@dataclass(frozen=True)
class PartsTask:
    """One variant of the task: its digits, the warm start's per-digit accuracy, and its shipped files."""

    name: str  # the train.py / evaluate.py preset and the warm start's recipe "task"
    digits: int
    p_digit: float  # the warm start's target: each digit right with this probability
    problems_file: str  # training split (1,000 problems)
    warm_start_dir: str
    init: str  # the warm start continues from this one (same vocabulary)
    steps: int  # warm-start steps

    @property
    def heldout_file(self) -> str:
        return heldout_path(self.problems_file)


def heldout_path(problems_file: str) -> str:
    """data/X.jsonl -> data/X_heldout.jsonl: the evaluation split next to a training split."""
    return problems_file.removesuffix(".jsonl") + "_heldout.jsonl"


TASKS = {
    "tiny_parts": PartsTask("tiny_parts", DIGITS, 0.6, PROBLEMS_FILE, WARM_START_DIR, tiny.WARM_START_DIR, 400),
    "tiny_parts6": PartsTask("tiny_parts6", 6, 0.5, os.path.join(DATA_DIR, "tiny_parts6.jsonl"),
                             os.path.join(DATA_DIR, "tiny_parts6_warmstart"), WARM_START_DIR, 400),
}


def _digit_pairs(rng: np.random.Generator, leading: bool) -> tuple[int, int]:
    """(a, b) uniform among digit pairs with a + b <= 9 (no carry); a, b >= 1 for the leading digit."""
    pairs = [(a, b) for a in range(1 if leading else 0, 10) for b in range(1 if leading else 0, 10) if a + b <= 9]
    return pairs[rng.integers(len(pairs))]


def random_parts_problem(rng: np.random.Generator, digits: int = DIGITS) -> Problem:
    """One problem "What is A + B?" with `digits`-digit A, B and no carry; gold str(A + B) (graded by `reward`)."""
    pairs = [_digit_pairs(rng, leading=i == 0) for i in range(digits)]
    a = "".join(str(x) for x, _ in pairs)
    b = "".join(str(y) for _, y in pairs)
    return Problem(f"What is {a} + {b}?", str(int(a) + int(b)), f"parts-{a}-{b}")


def parts_problems(count: int = 1000, seed: int = TRAIN_SEED, digits: int = DIGITS,
                   exclude: frozenset = frozenset()) -> list[Problem]:
    """`count` distinct problems drawn with default_rng(seed) from the 36 x 55^(digits-1) possible (108,900 for 3
    digits), none whose id is in `exclude`: PROBLEMS_FILE holds count=1000, seed=0 (training)."""
    rng, seen, problems = np.random.default_rng(seed), set(exclude), []
    while len(problems) < count:
        p = random_parts_problem(rng, digits)
        if p.id not in seen:
            seen.add(p.id)
            problems.append(p)
    return problems


def heldout_problems(digits: int = DIGITS, count: int = 200) -> list[Problem]:
    """The evaluation split: `count` problems drawn with HELDOUT_SEED, none of the 1,000 training problems (ids, and
    so problem texts, are disjoint): RL never trains on them. The warm start's SFT draws random problems afresh and
    drew 41 of these 200 for 3 digits (18 of the first 100, which evaluate.py reads) and none for 6."""
    train_ids = frozenset(p.id for p in parts_problems(digits=digits))
    return parts_problems(count, HELDOUT_SEED, digits, exclude=train_ids)


def problems_jsonl(digits: int = DIGITS, heldout: bool = False) -> str:
    """The training split (or the held-out one) as JSONL text for problemset.load_problems (fixed key order)."""
    problems = heldout_problems(digits) if heldout else parts_problems(digits=digits)
    return "".join(json.dumps({"problem": p.problem, "answer": p.answer, "id": p.id}) + "\n" for p in problems)


def write_problems(path: str = PROBLEMS_FILE, digits: int = DIGITS, heldout: bool = False) -> str:
    """problems_jsonl(digits, heldout) written to `path` (atomically)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(problems_jsonl(digits, heldout))
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
                     set_size: int, digits: int = DIGITS) -> tuple[bool, str, str, str]:
    """One warm-start example on a fresh random problem: (is an aggregation example, problem, prompt, target answer).

    Search (probability 1 - aggregation_fraction): the Search Trace Prompt, target noisy_parts_answer. Aggregation:
    the Aggregation Trace Prompt over `set_size` noisy candidates, target their per-digit plurality (plurality_parts):
    the aggregator learns to read its candidates part by part. The completion is parts_trace(problem, target)."""
    p = random_parts_problem(rng, digits)
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


def sft_loop(model, example, pad_token_id: int, *, steps: int, batch_size: int, lr: float, warmup_steps: int,
             label: str | None) -> None:
    """The warm starts' SFT: AdamW, linear warm-up then cosine to 0.1 lr, `batch_size` fresh example() per step,
    gradients clipped at 1 (tiny_parts.py and tiny_walk.py). `label`: the progress bar's, or None for none."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    # closed however the loop ends (Ctrl-C included): its heartbeat thread stops with it
    with Progress(steps, label, "steps") if label else contextlib.nullcontext() as bar:
        for step in range(1, steps + 1):
            scale = min(1.0, step / warmup_steps) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            for group in optimizer.param_groups:
                group["lr"] = lr * scale
            optimizer.zero_grad(set_to_none=True)
            loss = sft_backward(model, [example() for _ in range(batch_size)], pad_token_id)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if bar:
                bar.update(note=f"loss {loss:.3f}")


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
               seed: int = 0, init: str | None = tiny.WARM_START_DIR, progress: bool = True, digits: int = DIGITS,
               task: str = "tiny_parts"):
    """Supervised warm start of the tiny policy on random parts problems (all 108,900, drawn afresh): the base
    model of `--preset tiny_parts` (and with TASKS["tiny_parts6"]'s digits, p_digit, init: of `tiny_parts6`).

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
            aggregation, problem, prompt, target = training_example(rng, p_digit, aggregation_fraction, set_size,
                                                                    digits)
            completion = tokenizer(parts_trace(problem, target), add_special_tokens=False)["input_ids"] + [eos]
            return aggregation, _SFTExample(chat_prompt_ids(tokenizer, prompt), completion)

        sft_loop(model, example, tokenizer.pad_token_id, steps=steps, batch_size=batch_size, lr=lr,
                 warmup_steps=warmup_steps, label="tiny_parts.py: warm start" if progress else None)
    model.eval()
    recipe = dict(task=task, steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, p_digit=p_digit,
                  aggregation_fraction=aggregation_fraction, set_size=set_size, seed=seed, torch=torch.__version__)
    if digits != DIGITS:  # only then: the shipped 3-digit warm_start.json stays byte-identical when rebuilt
        recipe |= {"digits": digits, "init": os.path.relpath(init, DATA_DIR) if init else None}
    tiny.save_warm_start(model, tokenizer, out_dir, recipe)
    return model, tokenizer


def measure(model, tokenizer, problems: list[Problem], *, samples: int = 8, set_size: int = 4, seed: int = 0,
            max_new_tokens: int = 16) -> dict[str, float]:
    """The task's property on a policy, means over `problems` with `samples` search traces each (torch seed `seed`):

        single       P(one trace is right)                                          pass@1
        digit        P(one digit of one trace is right), over the answer's positions
        majority     P(the most frequent answer of all `samples` traces is right)   majority@samples, ties split
        any_right    P(some trace of a set of `set_size` is right)                  pass@set_size
        parts_right  P(every digit is right in some trace of the set)               what a per-part aggregator can reach
        plurality    P(plurality_parts of the set is right), ties split exactly     the warm start's aggregation target
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
    digit = [float(len(a) == len(p.answer) and a[i] == d) for p, pool in zip(problems, pools)
             for a in (extract_answer(c.text) or "" for c in pool) for i, d in enumerate(p.answer)]
    majority = []
    for p, pool in zip(problems, pools):
        counts = Counter(extract_answer(c.text) or "" for c in pool)
        top = [a for a, c in counts.items() if c == max(counts.values())]
        majority.append((p.answer in top) / len(top))  # a tie is broken uniformly at random
    any_right, parts_right, plurality = [], [], []
    for p, s in sets:
        answers = [extract_answer(c.text) or "" for c in s]
        any_right.append(float(any(reward(c.text, p.answer) == 1.0 for c in s)))
        parts_right.append(float(all(any(len(a) == len(p.answer) and a[i] == d for a in answers)
                                     for i, d in enumerate(p.answer))))
        plurality.append(_plurality_right(answers, p.answer))
    aggregation = [reward(row[0].text, p.answer) for (p, _), row in zip(sets, aggregations)]
    return {name: float(np.mean(values)) for name, values in [
        ("single", single), ("digit", digit), ("majority", majority), ("any_right", any_right),
        ("parts_right", parts_right), ("plurality", plurality), ("aggregation", aggregation)]}


def search_credit(model, tokenizer, problems: list[Problem], *, seed: int = 0, max_new_tokens: int = 16,
                  num_search: int = 8, set_size: int = 4, num_sets: int = 4, num_aggregations: int = 4) -> dict:
    """What each arm's line 13 tells the search traces on the same rollouts (Algorithm 1, lines 2-15, one step of
    collect_spiral without dynamic sampling or training): "set" A#_marg(x, y_j) against "own" r(x, y_j) - mean_k r.

    Per arm: by_right_digits[k] = the mean advantage of the search traces with k right digits (k = 0..D); signal =
    the mean over problems of sum_j A_j (k_j - kbar) / D, the per-digit gradient along "more right digits" (the
    score of a position's right digit is 1{right} - P(right), with P(right) estimated by kbar / D over every trace),
    its sample sd over problems and snr8 = mean / sd x sqrt(8) (a batch of |B| = 8 problems); nonzero = the fraction
    of problems whose search traces get any non-zero advantage. Also the mean completion tokens of a search and of an
    aggregation trace. torch seed `seed`, sets from default_rng(seed)."""
    from advantages import group_advantages, spiral_advantages
    from reward import extract_answer, reward
    from rollout import generate
    from setsample import sample_sets

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    search_P_N1 = generate(model, tokenizer, [search_prompt(p.problem) for p in problems],
                           samples_per_prompt=num_search, max_new_tokens=max_new_tokens)
    sets_P_K_n = [sample_sets(num_search, set_size, num_sets, rng=rng) for _ in problems]
    prompts = [aggregation_prompt(p.problem, [search[j].text for j in G]) for p, search, sets in
               zip(problems, search_P_N1, sets_P_K_n) for G in sets]
    aggregation = generate(model, tokenizer, prompts, samples_per_prompt=num_aggregations,
                           max_new_tokens=max_new_tokens)
    right_P_N1, adv = [], {"set": [], "own": []}
    for i, (p, search) in enumerate(zip(problems, search_P_N1)):
        answers = [extract_answer(c.text) or "" for c in search]
        right_P_N1.append([sum(len(a) == len(p.answer) and a[d] == g for d, g in enumerate(p.answer)) for a in answers])
        rewards_K_N2 = np.array([[reward(c.text, p.answer) for c in row]
                                 for row in aggregation[i * num_sets:(i + 1) * num_sets]])
        adv["set"].append(spiral_advantages(sets_P_K_n[i], rewards_K_N2=rewards_K_N2, N1=num_search)[0])
        adv["own"].append(group_advantages([reward(c.text, p.answer) for c in search]))
    out = _credit(np.array(right_P_N1), adv, len(problems[0].answer))
    out["search_length"] = float(np.mean([len(c.completion_ids) for row in search_P_N1 for c in row]))
    out["aggregation_length"] = float(np.mean([len(c.completion_ids) for row in aggregation for c in row]))
    return out


def _credit(right_P_N1: np.ndarray, adv: dict[str, list], digits: int) -> dict:
    """search_credit's figures from the right digits of each search trace (P, N1) and each arm's advantages."""
    out = {}
    for arm, adv_P_N1 in adv.items():
        adv_P_N1 = np.array(adv_P_N1)  # (P, N1)
        signal_P = (adv_P_N1 * (right_P_N1 - right_P_N1.mean())).sum(1) / digits
        sd = float(signal_P.std(ddof=1)) if len(signal_P) > 1 else float("nan")
        out[arm] = {"by_right_digits": [float(adv_P_N1[right_P_N1 == k].mean()) if np.any(right_P_N1 == k) else None
                                        for k in range(digits + 1)],
                    "signal": float(signal_P.mean()), "signal_sd": sd,
                    "snr8": float(signal_P.mean() / sd * np.sqrt(8)) if sd > 0 else float("nan"),
                    "nonzero": float(np.mean(np.any(adv_P_N1 != 0, axis=1)))}
    out["traces_by_right_digits"] = np.bincount(right_P_N1.ravel(), minlength=digits + 1).tolist()
    return out


def noisy_solver_credit(digits: int, p_digit: float, problems: int = 2000, seed: int = 0, num_search: int = 8,
                        set_size: int = 4, num_sets: int = 4, num_aggregations: int = 4) -> dict:
    """search_credit for the policy the warm start imitates, worked out without a model: search traces are
    noisy_parts_answer (each digit right with probability p_digit), and an aggregation trace over a set is right with
    the probability that plurality_parts of the set is (the warm start's aggregation target, _plurality_right). The
    first-principles prediction of what each arm's line 13 gives the search traces, before any RL."""
    from advantages import group_advantages, spiral_advantages
    from setsample import sample_sets

    rng = np.random.default_rng(seed)
    gold = "1" * digits  # the digits' values do not matter: errors are uniform over the 9 others
    right_P_N1, adv = [], {"set": [], "own": []}
    for _ in range(problems):
        answers = [noisy_parts_answer(gold, rng, p_digit) for _ in range(num_search)]
        right_P_N1.append([sum(a == g for a, g in zip(answer, gold)) for answer in answers])
        sets_K_n = sample_sets(num_search, set_size, num_sets, rng=rng)
        chance_K = np.array([_plurality_right([answers[j] for j in G], gold) for G in sets_K_n])
        rewards_K_N2 = (rng.random((num_sets, num_aggregations)) < chance_K[:, None]).astype(float)
        adv["set"].append(spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=num_search)[0])
        adv["own"].append(group_advantages([float(a == gold) for a in answers]))
    return _credit(np.array(right_P_N1), adv, digits)


def _plurality_right(answers: list[str], gold: str) -> float:
    """P(plurality_parts(answers) == gold) over its random tie-breaks: the product over positions of 1/(digits tied)
    if the gold digit is among the tied, else 0; candidates of another length than gold's are ignored."""
    same = [a for a in answers if len(a) == len(gold)]
    if not same:
        return 0.0
    chance = 1.0
    for position, d in enumerate(gold):
        counts = Counter(a[position] for a in same)
        tied = [x for x, c in counts.items() if c == max(counts.values())]
        chance *= (d in tied) / len(tied)
    return chance


def problems_file_problem(path: str = PROBLEMS_FILE, digits: int = DIGITS, heldout: bool = False) -> str | None:
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
            same = f.read() == problems_jsonl(digits, heldout)
    except (OSError, UnicodeDecodeError):
        same = False
    return None if same else f"{path} differs from the generator's problems; move it away to rebuild it"


def main(argv: list[str] | None = None) -> int:
    """Rebuild a task's problem files (training and held-out splits) and a warm start into --out. Every output is
    checked before the 15-30 minute warm start: --out must be new, empty or a warm start of the same task (the shipped
    one is replaced only when named), and each problem file absent or the generator's own."""
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit code 2, no usage block
            print(f"tiny_parts.py: error: {message}", file=sys.stderr)
            sys.exit(2)

    parser = Parser(prog="tiny_parts.py", description=main.__doc__.splitlines()[0],
                    epilog=f"rebuild the shipped files: python tiny_parts.py --out {os.path.relpath(WARM_START_DIR)}")
    parser.add_argument("--out", required=True,
                        help=f"warm-start directory (the shipped one: {os.path.relpath(WARM_START_DIR)})")
    parser.add_argument("--task", choices=list(TASKS), default="tiny_parts",
                        help="tiny_parts (3 digits, the default) or tiny_parts6 (6 digits, from the tiny_parts one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, as the shipped warm start was built: the bytes depend on it)")
    args = parser.parse_args(argv)
    from checkpoint import out_path_problem

    task = TASKS[args.task]
    problems_path = PROBLEMS_FILE if args.task == "tiny_parts" else task.problems_file  # PROBLEMS_FILE: read now
    files = [(problems_path, False), (heldout_path(problems_path), True)]
    why = out_path_problem(args.out)
    why = f"--out {args.out!r}: {why}" if why else tiny.warm_start_problem(args.out, task.name)
    for path, heldout in files:
        why = why or problems_file_problem(path, task.digits, heldout)
    if not why and not 0 <= args.seed < 2**32:
        why = "--seed must be in [0, 2**32)"
    if not why and not 1 <= args.threads <= (os.cpu_count() or 1):
        why = f"--threads must be between 1 and {os.cpu_count() or 1} (the CPUs)"
    init_missing = not os.path.isfile(os.path.join(task.init, "model.safetensors"))
    if not why and task.init != tiny.WARM_START_DIR and init_missing:
        why = f"{task.name} continues from {task.init}, which is missing; rebuild it first"
    if why:
        print(f"tiny_parts.py: error: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    for path, heldout in files:
        print(f"tiny_parts.py: wrote {write_problems(path, task.digits, heldout)}")
    # the default task's call is warm_start(out, seed=...): its defaults are the shipped tiny_parts recipe
    variant = {} if args.task == "tiny_parts" else dict(digits=task.digits, p_digit=task.p_digit, init=task.init,
                                                        steps=task.steps, task=task.name)
    try:
        warm_start(args.out, seed=args.seed, **variant)
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
