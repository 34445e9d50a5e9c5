"""The project's problem sets as verl's parquet: one row per problem x, in the schema verl's RLHFDataset and the SPIRAL
agent loop read.

    data_source   "spiral/<set>"                      handed to r (reward.custom_reward_function's data_source)
    prompt        [{"role": "user", "content": ...}]  the Search Trace Prompt (rollout.search_prompt), sent as it is;
                                                      SpiralDataset drops a problem whose prompt is longer than
                                                      spiral.max_prompt_tokens, as train.py's --max-prompt-tokens does
    ability       "math"
    reward_model  {"style": "rule", "ground_truth"}   the gold answer, handed to r (reward_fn.compute_score grades it)
    extra_info    {"split", "index", "problem"}       the problem text x, which the Aggregation Trace Prompt shows

This is verl's own layout (its examples/data_preprocess scripts write it); recipe/spiral/verl_task.py says which rows
the recipe reads.

    python -m recipe.spiral.prepare_data --out runs/verl-data                          # math_train and math500
    python -m recipe.spiral.prepare_data --out runs/verl-data --train my.jsonl --test aime2024
    python -m recipe.spiral.prepare_data --train a.jsonl --test b.jsonl --data-columns problem=question,answer=solution

Each set is written to <its name>.parquet: two sets of one name (a/sums.jsonl and b/sums.jsonl, or math500 twice) are
refused, as is a set without problems. It replaces only parquet files it wrote itself (MARK in their schema); bad
input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import os
import sys

import checkpoint
import cli
import problemset
import reward
import rollout
import tiny  # noqa: F401 - registers the tiny preset's problem set, tiny_sums

MARK = b"recipe.spiral.prepare_data"  # the schema's written_by: a file this script may replace


def rows(name: str, split: str, columns: problemset.Columns | None = None) -> list[dict]:
    """verl's rows for the problem set `name` (bundled name, JSONL file or Hub id: problemset.load_problems, a file's
    columns named by `columns`), the gold answers as gold_answers reads them."""
    label = os.path.splitext(os.path.basename(name))[0]
    problems = problemset.load_problems(name, None if own_columns(name) else columns)
    golds = gold_answers([p.answer for p in problems], f"--{split} {name}")
    return [{"data_source": f"spiral/{label}",
             "prompt": [{"role": "user", "content": rollout.search_prompt(p.problem)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": gold},
             "extra_info": {"split": split, "index": i, "problem": p.problem}}
            for i, (p, gold) in enumerate(zip(problems, golds))]


def gold_answers(answers: list[str], source: str) -> list[str]:
    """The gold answers to write: gsm8k's worked solution ("... #### 72", its answer column) becomes the number after
    "####", said in one line; an answer that still looks like a worked solution (several lines, a \\boxed{} inside,
    over 200 characters) is kept and said in one line on stderr: the grader compares a trace's answer with all of it."""
    numbers = [reward.hash_answer(a) for a in answers]
    if any(numbers):
        print(f"prepare_data.py: {source}: {sum(map(bool, numbers))} of {len(answers)} gold answers are gsm8k worked "
              "solutions ('... #### 72'); each gold answer is the number after '####'")
    golds = [number or answer for number, answer in zip(numbers, answers)]
    worked = [i for i, a in enumerate(golds) if "\n" in a.strip() or "\\boxed" in a or len(a) > 200]
    if worked:
        print(f"warning: prepare_data.py: {source}: {len(worked)} of {len(golds)} gold answers look like worked "
              f"solutions (row {worked[0]}: {golds[worked[0]][:40]!r}...), and a trace's answer is compared with the "
              "whole text: map --data-columns answer= to a column holding only the final answer", file=sys.stderr)
    return golds


def own_columns(name: str) -> bool:
    """A bundled or code-built set: its columns are the project's, whatever --data-columns maps for a file."""
    return name in problemset.BUNDLED or name in problemset.CODE_BUILT_PROBLEMS


def write_parquet(records: list[dict], path: str) -> None:
    """Write `records` to `path`, marked as ours (MARK), through a temporary name (a crash leaves no half-written
    file)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(pd.DataFrame(records), preserve_index=False)  # as DataFrame.to_parquet(index=False)
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"written_by": MARK}), tmp)
    os.replace(tmp, path)


def written_here(path: str) -> bool:
    """Whether `path` is a parquet file this script wrote (MARK in its schema)."""
    import pyarrow.parquet as pq

    try:
        return (pq.read_schema(path).metadata or {}).get(b"written_by") == MARK
    except Exception:  # noqa: BLE001 - not parquet, unreadable, a directory: not ours
        return False


def output_path(out: str, name: str) -> str:
    return os.path.join(out, f"{os.path.splitext(os.path.basename(name))[0]}.parquet")


def main(argv: list[str] | None = None) -> int:
    parser = cli.OneLineParser(prog="prepare_data.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/verl-data", help="folder for <set>.parquet (default runs/verl-data)")
    parser.add_argument("--train", default="math_train", help="training problems (default math_train)")
    parser.add_argument("--test", default="math500", help="validation problems (default math500)")
    parser.add_argument("--data-columns", default=None, help="columns of a --train/--test JSONL file: "
                        "problem=COL,answer=COL,id=COL, as train.py's --data-columns (default problem, answer, id)")
    try:
        args = parser.parse_args(argv)
        why = checkpoint.out_path_problem(args.out)
        if why:
            raise cli.ConfigError(f"--out {args.out!r}: {why}")
        try:
            columns = problemset.Columns.parse(args.data_columns)
        except ValueError as exc:
            raise cli.ConfigError(f"--data-columns {exc}") from None
        splits = [(args.train, "train"), (args.test, "test")]
        if output_path(args.out, args.train) == output_path(args.out, args.test):  # one file would hold both splits
            raise cli.ConfigError(f"--train {args.train} and --test {args.test} would both be written to "
                                  f"{output_path(args.out, args.train)}: give the files different names")
        import pandas, pyarrow  # noqa: F401, E401 - write_parquet's and written_here's: a missing one is said now
        for name, _ in splits:
            path = output_path(args.out, name)
            if os.path.lexists(path) and not written_here(path):
                raise cli.ConfigError(f"{path} exists and was not written by prepare_data.py; choose another --out")
        tables = [(name, rows(name, split, columns)) for name, split in splits]  # all read before anything is written
        for (name, split), (_, records) in zip(splits, tables):
            if not records:
                raise cli.ConfigError(f"--{split} {name}: no problems in it")
    except (cli.ConfigError, ImportError, OSError, ValueError, RuntimeError) as exc:
        print(f"prepare_data.py: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for name, records in tables:
        path = output_path(args.out, name)
        write_parquet(records, path)
        print(f"prepare_data.py: {len(records)} problems -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
