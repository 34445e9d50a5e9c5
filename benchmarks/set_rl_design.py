"""The design of benchmarks/set_rl.py: its tasks, its seven arms and the settings fixed before any run (the draw
cap, the learning-rate grid, RSA, the samples). set_rl.py runs it and set_rl_report.py reads it; both import it, and
neither imports the other at module level (no cycle)."""

from __future__ import annotations

import dataclasses
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Task:
    """A task of the experiment: its train.py / evaluate.py preset, steps, trace length and GRPO's equal-tokens G."""

    preset: str
    steps: int  # training steps per run: enough for the arms' curves to flatten (the report draws them)
    max_new_tokens: int  # SPIRAL's L (GRPO's equal maximum budget: 2L)
    group_equal_tokens: int  # G of GRPO at equal generated tokens, with L: (N1 + K N2) x (tokens of a trace) / L_trace
    heldout_file: str  # evaluation: its first --limit problems; validation (the learning-rate grid): its second half


TASKS = {
    # Measured on the warm start before any RL (tiny_parts.search_credit, 200 training problems, seed 0): a search
    # and an aggregation trace are both 22.99 tokens, so SPIRAL generates (8 + 16) x 22.99 = 552 per problem and
    # GRPO needs G = 552 / 22.99 = 24 traces of L = 28 to generate as many.
    "tiny_parts6": Task("tiny_parts6", 50, 28, 24, "data/tiny_parts6_heldout.jsonl"),
    # tiny_walk.py, 30 steps fixed before any RL run (~20 min a run on one loaded core; EXPERIMENTS.md, "A task
    # where sets stay imperfect: design and predictions (written before any RL run)"): search and aggregation traces
    # are both 10 tokens (an aggregation trace is a copy), so G = (8 + 16) x 10 / 10 = 24 at L = 16.
    "tiny_walk": Task("tiny_walk", 30, 16, 24, "data/tiny_walk_heldout.jsonl"),
}
CHECK_ARMS = ("own", "spiral")  # --check: the one-seed checks of a new task, before any multi-seed run
ARMS = {  # name: (label, train.py flags after --preset TASK)
    "spiral": ("SPIRAL", ["--algo", "spiral"]),
    "oracle": ("oracle aggregator, K = 4", ["--algo", "spiral", "--aggregator", "oracle"]),
    "passn": ("exact pass@n (oracle, all sets)", ["--algo", "spiral", "--aggregator", "oracle", "--num-sets", "all"]),
    "own": ("own-reward search (ablation)", ["--algo", "spiral", "--search-advantage", "own"]),
    "none": ("search advantage 0 (floor)", ["--algo", "spiral", "--search-advantage", "none"]),
    "grpo": ("GRPO, equal max budget", ["--algo", "grpo"]),
    "grpo_tok": ("GRPO, equal generated tokens", ["--algo", "grpo"]),  # + --group-size G --max-new-tokens L (Task)
}
MAX_DRAWS = 64  # dynamic sampling's safety cap per step: 8 |B|
LR_GRID = (1e-3, 2e-3, 4e-3)
DEFAULT_LR = 2e-3  # the tiny presets' rate (the demo's, measured: 5e-3 and 1e-2 collapse there)
GRID_ARMS = ("spiral", "own", "passn")  # the three scales of search advantage: set (small), own (large), exact pass@n
GRID_SEED = 0
GRID_TOLERANCE = 0.02  # validation score within this of the best counts as a tie
GRID_KS = (1, 2, 4, 8)
CROSS_ARMS = ("base", "spiral", "own", "grpo")  # search traces of one x aggregator of another, per seed
RSA_P, RSA_K, RSA_STEPS = 8, 4, 3  # the paper's RSA: population 8, sets of 4
SAMPLES = 16  # search traces per problem: pass@k and majority@k for k = 1..16


if __name__ == "__main__":  # a library: --help prints what it holds; nothing runs
    import sys

    sys.path.insert(0, REPO)  # cli.py is at the root
    import cli

    cli.library_main(__doc__, "set_rl_design.py", "set_rl.py and set_rl_report.py use")
