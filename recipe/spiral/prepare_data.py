"""The project's problem sets as verl's parquet: one row per problem x, in the schema verl's RLHFDataset and the SPIRAL
agent loop read.

    data_source   "spiral/<set>"                      the key verl's reward manager groups scores by
    prompt        [{"role": "user", "content": ...}]  the Search Trace Prompt (rollout.search_prompt): verl measures and
                                                      filters prompts by it (data.max_prompt_length), as train.py's
                                                      --max-prompt-tokens does
    ability       "math"
    reward_model  {"style": "rule", "ground_truth"}   the gold answer, graded by reward_fn.compute_score
    extra_info    {"split", "index", "problem"}       the problem text, from which the agent loop builds both prompts

    python -m recipe.spiral.prepare_data --out runs/verl-data                          # math_train and math500
    python -m recipe.spiral.prepare_data --out runs/verl-data --train my.jsonl --test aime2024
"""

from __future__ import annotations

import argparse
import os
import sys

import problemset
import rollout
import tiny  # noqa: F401 - registers the tiny preset's problem set, tiny_sums


def rows(name: str, split: str) -> list[dict]:
    """verl's rows for the problem set `name` (bundled name, JSONL file or Hub id: problemset.load_problems)."""
    label = os.path.splitext(os.path.basename(name))[0]
    return [{"data_source": f"spiral/{label}",
             "prompt": [{"role": "user", "content": rollout.search_prompt(p.problem)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"split": split, "index": i, "problem": p.problem}}
            for i, p in enumerate(problemset.load_problems(name))]


def write_parquet(records: list[dict], path: str) -> None:
    """Write `records` to `path` through a temporary name (a crash leaves no half-written file)."""
    import pandas as pd

    tmp = f"{path}.tmp-{os.getpid()}"
    pd.DataFrame(records).to_parquet(tmp, index=False)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prepare_data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/verl-data", help="folder for <set>.parquet (default runs/verl-data)")
    parser.add_argument("--train", default="math_train", help="training problems (default math_train)")
    parser.add_argument("--test", default="math500", help="validation problems (default math500)")
    args = parser.parse_args(argv)
    try:
        splits = [(args.train, "train"), (args.test, "test")]
        tables = [(name, rows(name, split)) for name, split in splits]  # every input read before anything is written
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"prepare_data.py: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for name, records in tables:
        path = os.path.join(args.out, f"{os.path.splitext(os.path.basename(name))[0]}.parquet")
        write_parquet(records, path)
        print(f"prepare_data.py: {len(records)} problems -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
