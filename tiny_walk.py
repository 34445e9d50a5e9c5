"""The third tiny CPU task, "walk": one trace is limited by search, a set by selection.

"Walk from 2 to 8 in 3 steps: 0>371 1>492 2>586 ...": each node (a digit) lists its three successors after ">"; a
trace writes the nodes it visits, "2>5>1>8 \\boxed{8}", and is right when the checker (`reward`, the task's r(x, y)
through `--reward tiny_walk:reward`) finds it starts at the start, takes 3 steps each along an edge of the prompt, and
ends, with the \\boxed{} answer, at the target. Finding such a walk is search (27 walks; 0.14 of them end at the
target on average); each step of a walk is a copy from the prompt (a successor listed after the current node), and
checking a written walk is a local comparison (its last node sits next to the \\boxed{} answer; the target is in the
prompt): the small maze alternative of issue 39, after a countdown task whose one-digit arithmetic a 0.9M-parameter
warm start did not learn (EXPERIMENTS.md, "A task where sets stay imperfect: design and predictions (written before
any RL run)").

The warm start imitates a solver that walks to uniformly random successors (right when the random walk hits: no
noise is injected), and an aggregator that copies a candidate whose answer is the target, or any candidate when none
is (it selects; it never re-solves).

Problems: PROBLEMS_FILE (1,000 training problems) and HELDOUT_FILE (200 others, disjoint problem texts), targets
drawn as the end of a uniformly random walk, so every problem has a solution. The warm start is not shipped: after
250 steps its walks followed an edge of the prompt no more often than chance (0.315 of steps), so no RL run was made
(EXPERIMENTS.md has the figures and what is left). Build it, and the problem files, with

    python tiny_walk.py --out data/tiny_walk_warmstart [--steps N]   # and data/tiny_walk{,_heldout}.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys

import numpy as np
import torch

import tiny
import tiny_parts
from problemset import DATA_DIR, Problem
from rollout import aggregation_prompt, chat_prompt_ids, search_prompt
from tiny import _SFTExample, build_tiny_model

NODES, DEGREE, STEPS = 10, 3, 3  # nodes 0-9, three successors each (no self-loops), walks of 3 steps
WARM_START_DIR = os.path.join(DATA_DIR, "tiny_walk_warmstart")
PROBLEMS_FILE = os.path.join(DATA_DIR, "tiny_walk.jsonl")
HELDOUT_FILE = tiny_parts.heldout_path(PROBLEMS_FILE)
TRAIN_SEED, HELDOUT_SEED = 0, 1
REWARD = "tiny_walk:reward"
# train.py's preset: the tiny_parts6 settings with this task's reward; a trace is ~12 tokens.
TRAIN_PRESET = {
    "model": WARM_START_DIR, "data": PROBLEMS_FILE, "reward": REWARD, "device": "cpu", "cpu_threads": 1, "steps": 30,
    "save_every": 10, "lr": 2e-3, "micro_batch_tokens": 8192, "gradient_checkpointing": False, "max_draws": 16,
    "max_new_tokens": {"spiral": 16, "grpo": 32},  # 12 x 32 = (8 + 4 x 4) x 16
}
# evaluate.py's preset: held-out problems, never trained on.
EVALUATE_PRESET = dict(
    model=WARM_START_DIR, data=HELDOUT_FILE, reward=REWARD, limit=100, temperature=1.0, majority_subsets=32,
    num_samples=8, max_new_tokens=16, majority_max_new_tokens=16, rsa_populations=[4, 8], rsa_set_size=4,
    rsa_steps=3, max_tokens_list=[16], micro_batch_size=128)

Graph = tuple[tuple[int, ...], ...]  # graph[u]: the successors of node u, in the order the prompt lists them


def walks(graph: Graph, start: int) -> list[tuple[int, ...]]:
    """Every walk of STEPS steps from `start` (the nodes after it), in a fixed order: the solver's search space."""
    out = []
    for choice in itertools.product(range(DEGREE), repeat=STEPS):
        node, path = start, []
        for c in choice:
            node = graph[node][c]
            path.append(node)
        out.append(tuple(path))
    return out


def trace_text(start: int, path: tuple[int, ...]) -> str:
    """"2>5>1>8 \\boxed{8}": the nodes visited, the last one boxed."""
    return ">".join(map(str, (start, *path))) + f" \\boxed{{{path[-1]}}}"


def parse_problem(problem: str) -> tuple[int, int, Graph]:
    """"Walk from 2 to 8 in 3 steps: 0>371 1>492 ..." -> (2, 8, ((3, 7, 1), (4, 9, 2), ...))."""
    m = re.fullmatch(r"Walk from (\d) to (\d) in 3 steps: ((?:\d>\d{3} ?)+)", problem)
    if not m:
        raise ValueError(f"not a walk problem: {problem!r}")
    lists = {int(item[0]): tuple(int(d) for d in item[2:]) for item in m.group(3).split()}
    return int(m.group(1)), int(m.group(2)), tuple(lists[u] for u in range(NODES))


def random_problem(rng: np.random.Generator) -> Problem:
    """A random graph (each node: DEGREE distinct successors other than itself, in random order), a random start,
    and as target the end of a uniformly random walk."""
    graph = tuple(tuple(int(v) for v in rng.choice([v for v in range(NODES) if v != u], DEGREE, replace=False))
                  for u in range(NODES))
    start = int(rng.integers(NODES))
    options = walks(graph, start)
    target = options[rng.integers(len(options))][-1]
    edges = " ".join(f"{u}>{''.join(map(str, graph[u]))}" for u in range(NODES))
    text = f"Walk from {start} to {target} in 3 steps: {edges}"
    return Problem(text, str(target), f"walk-{start}-{target}-{edges.replace(' ', '-').replace('>', '')}")


def walk_problems(count: int = 1000, seed: int = TRAIN_SEED, exclude: frozenset = frozenset()) -> list[Problem]:
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
    return walk_problems(count, HELDOUT_SEED, frozenset(p.problem for p in walk_problems()))


def problems_jsonl(heldout: bool = False) -> str:
    problems = heldout_problems() if heldout else walk_problems()
    return "".join(json.dumps({"problem": p.problem, "answer": p.answer, "id": p.id}) + "\n" for p in problems)


def check(problem: str, completion: str) -> bool:
    """The checker: the completion is "s>a>b>c \\boxed{c}" with s the start, every step along an edge the prompt
    lists, and c the target."""
    start, target, graph = parse_problem(problem)
    m = re.fullmatch(r"\s*(\d)((?:>\d){3})\s*\\boxed\{(\d+)\}\s*", completion)
    if not m or int(m.group(1)) != start:
        return False
    node = start
    for v in (int(d) for d in m.group(2)[1::2]):
        if v not in graph[node]:
            return False
        node = v
    return node == target == int(m.group(3))


def reward(problem: Problem, completion: str) -> float:
    """r(x, y) for `--reward tiny_walk:reward`: 1.0 if `check` passes, else 0.0."""
    return float(check(problem.problem, completion))


def solver_trace(problem: str, rng: np.random.Generator) -> str:
    """The warm start's search target: a walk to uniformly random successors (right iff it ends at the target)."""
    start, _, graph = parse_problem(problem)
    node, path = start, []
    for _ in range(STEPS):
        node = graph[node][rng.integers(DEGREE)]
        path.append(node)
    return trace_text(start, tuple(path))


def aggregator_target(problem: str, candidates: list[str], rng: np.random.Generator) -> str:
    """The warm start's aggregation target: a uniformly chosen candidate whose \\boxed{} answer is the target (the
    candidates are the solver's, so their arithmetic is right), else a uniformly chosen candidate: it selects."""
    target = parse_problem(problem)[1]
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


def warm_start(out_dir: str = WARM_START_DIR, *, steps: int = 250, batch_size: int = 64, lr: float = 3e-3,
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

        tiny_parts.sft_loop(model, example, tokenizer.pad_token_id, steps=steps, batch_size=batch_size, lr=lr,
                            warmup_steps=warmup_steps, label="tiny_walk.py: warm start" if progress else None)
    model.eval()
    recipe = dict(task="tiny_walk", steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
                  aggregation_fraction=aggregation_fraction, set_size=set_size, seed=seed, torch=torch.__version__,
                  init=os.path.relpath(init, DATA_DIR) if init else None)
    tiny.save_warm_start(model, tokenizer, out_dir, recipe)
    return model, tokenizer


def solver_hit_rate(problem: Problem) -> float:
    """P(the warm start's solver hits): the fraction of walks that end at the target."""
    start, target, graph = parse_problem(problem.problem)
    return float(np.mean([path[-1] == target for path in walks(graph, start)]))


def measure(model, tokenizer, problems: list[Problem], *, samples: int = 8, seed: int = 0) -> dict[str, float]:
    """A warm start's search traces on `problems` (torch seed `seed`, T = 1): pass@1, the fraction of valid walks
    (any end) and of written steps that follow an edge of the prompt (chance: DEGREE / (NODES - 1) = 0.333)."""
    from rollout import generate

    torch.manual_seed(seed)
    pools = generate(model, tokenizer, [search_prompt(p.problem) for p in problems], samples_per_prompt=samples,
                     max_new_tokens=16)
    right, valid, along = [], [], []
    for p, pool in zip(problems, pools):
        start, _, graph = parse_problem(p.problem)
        for c in pool:
            right.append(reward(p, c.text))
            m = re.fullmatch(r"\s*(\d)((?:>\d){3})\s*\\boxed\{(\d+)\}\s*", c.text)
            ok = bool(m) and int(m.group(1)) == start
            if m:
                node = int(m.group(1))
                for v in (int(d) for d in m.group(2)[1::2]):
                    along.append(v in graph[node])
                    ok, node = ok and v in graph[node], v
                ok = ok and node == int(m.group(3))
            valid.append(ok)
    return {"pass@1": float(np.mean(right)), "valid walks": float(np.mean(valid)),
            "steps along an edge": float(np.mean(along))}


def probe_on_solver_sets(model, tokenizer, problems: list[Problem], *, samples: int = 2,
                         seed: int = 0) -> dict[str, tuple[float, float]]:
    """The aggregator probe (instruments.py's kinds) on sets of 4 built from the *solver's* walks, so it does not
    depend on the model's search: {kind: (accuracy, fraction of traces that copy a candidate verbatim)}. Problems
    every walk solves are skipped (no wrong walk). default_rng(seed) draws the sets; torch seed 0."""
    from rollout import generate

    torch.manual_seed(0)
    rng = np.random.default_rng(seed)
    kinds = {"all right": [], "one right": [], "none right": [], "wrong copies": []}
    for p in (p for p in problems if solver_hit_rate(p) < 1):
        start, _, graph = parse_problem(p.problem)
        texts = [trace_text(start, w) for w in walks(graph, start)]
        right, wrong = [w for w in texts if reward(p, w)], [w for w in texts if not reward(p, w)]

        def pick(pool, k):
            return [pool[i] for i in rng.choice(len(pool), k, replace=len(pool) < k)]
        sets = {"all right": pick(right, 4), "one right": pick(right, 1) + pick(wrong, 3),
                "none right": pick(wrong, 4), "wrong copies": pick(wrong, 1) * 4}
        sets["one right"] = [sets["one right"][i] for i in rng.permutation(4)]
        for kind, candidates in sets.items():
            kinds[kind].append((p, candidates))
    out = {}
    for kind, rows in kinds.items():
        traces = generate(model, tokenizer, [aggregation_prompt(p.problem, c) for p, c in rows],
                          samples_per_prompt=samples, max_new_tokens=16)
        pairs = [(reward(p, t.text), t.text.strip() in [x.strip() for x in c]) for (p, c), ts in zip(rows, traces)
                 for t in ts]
        out[kind] = (float(np.mean([a for a, _ in pairs])), float(np.mean([b for _, b in pairs])))
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the two problem files and the warm start into --out."""
    parser = argparse.ArgumentParser(prog="tiny_walk.py", description=main.__doc__)
    parser.add_argument("--out", required=True, help=f"warm-start directory (the presets read {os.path.relpath(WARM_START_DIR)})")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", default=tiny_parts.WARM_START_DIR,
                        help="continue from this warm start (default: tiny_parts'; same tokenizer)")
    parser.add_argument("--aggregation-fraction", type=float, default=0.5)
    args = parser.parse_args(argv)
    why = tiny.warm_start_problem(args.out, "tiny_walk")
    if why:
        print(f"tiny_walk.py: error: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for path, heldout in ((PROBLEMS_FILE, False), (HELDOUT_FILE, True)):
        with open(path, "w", encoding="utf-8") as f:
            f.write(problems_jsonl(heldout))
        print(f"tiny_walk.py: wrote {path}")
    warm_start(args.out, steps=args.steps, seed=args.seed, init=args.init,
               aggregation_fraction=args.aggregation_fraction)
    print(f"tiny_walk.py: wrote the warm start to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
