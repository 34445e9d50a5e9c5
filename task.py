"""A task: the problems x that training draws and the reward r(x, y) that scores a trace y (Algorithm 1, line 8).

The math grader is the default task: r(x, y) = reward.reward(y, x.answer), 1 iff the last \\boxed{} answer of y equals
the gold answer. A user's task is any function

    def my_reward(problem: problemset.Problem, completion: str) -> float

named on the command line as MODULE:FUNCTION (an importable module) or PATH.py:FUNCTION (a file), with the problem
file's columns mapped by --data-columns (problemset.Columns; the row's every column is in `problem.fields`). Every
entry point takes it: train.py and evaluate.py (--reward), spiral.collect_spiral / collect_grpo (reward_fn=),
trl_spiral.py (--reward) and SpiralGRPOTrainer (reward_funcs, in TRL's signature: `trl_reward` adapts one).

A reward must return a finite real number for every completion, the empty one included (a model may stop at once):
`load_reward` imports it and probes it on one problem with the empty completion before any training work, and
`checked` checks every value during training. Either failure is a RewardError of one line, and so is a value the loss
would overflow on (|r| > MAX_REWARD) or a sys.exit inside the reward; a numpy bool counts as 0 or 1, a reward's
os.chdir is undone after its call, and a user's reward.py or task.py (MODULE:FUNCTION) is theirs, not the project's.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import math
import numbers
import os
import sys
from typing import Callable

from problemset import Problem

RewardFn = Callable[[Problem, str], float]  # r(x, y): a problem and a completion's text


class RewardError(Exception):
    """A reward function that cannot be loaded, raises, or returns something other than a finite number (one line)."""


def math_reward(problem: Problem, completion: str) -> float:
    """The default task's r(x, y): reward.reward(y, gold), the math-verify grader on the last \\boxed{} answer."""
    import reward  # here, not at import: a user's task never starts (or imports) the grader

    return reward.reward(completion, problem.answer)


def load_reward(spec: str) -> RewardFn:
    """The function that `spec` names: "MODULE:FUNCTION" (importable from the current directory or sys.path) or
    "PATH.py:FUNCTION"; RewardError naming what is missing. Nothing is called."""
    module_name, colon, function_name = spec.rpartition(":")
    if not colon or not module_name or not function_name:
        raise RewardError(f"--reward {spec}: expected MODULE:FUNCTION or PATH.py:FUNCTION")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.isfile(module_name):
                raise RewardError(f"--reward {spec}: no such file {module_name}")
            module = _load_file(module_name)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:  # `python train.py` puts the script's directory
                sys.path.append(os.getcwd())                        # first; the user's module is where they are
            module = _users_module(spec, module_name) or importlib.import_module(module_name)
    except RewardError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):  # the module itself, not something it imports
            raise RewardError(f"--reward {spec}: no module named {exc.name!r}") from None
        raise RewardError(f"--reward {spec}: importing {module_name} failed ({_first_line(exc)})") from None
    except BaseException as exc:  # noqa: BLE001 - the user's module failed while importing: one line says how
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise RewardError(f"--reward {spec}: importing {module_name} failed ({_first_line(exc)})") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise RewardError(f"--reward {spec}: {module_name} has no {function_name}")
    if not callable(function):
        raise RewardError(f"--reward {spec}: {function_name} is a {type(function).__name__}, not a function")
    return function


def _users_module(spec: str, module_name: str):
    """The user's own MODULE from the current directory when the project has a module of that name (reward.py,
    task.py): `import reward` would find the project's. Loaded under a private name, as a PATH.py reward; a package
    (MODULE.SUB) of such a name is a RewardError. None when there is no clash."""
    top = module_name.partition(".")[0]
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.realpath(os.getcwd()) == os.path.realpath(here) or not os.path.isfile(os.path.join(here, f"{top}.py")):
        return None
    found = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if found is None:
        return None
    if top != module_name or found.submodule_search_locations is not None:
        raise RewardError(f"--reward {spec}: {top} is both your package and one of this project's modules "
                          f"({top}.py); rename yours, or name the file: --reward PATH.py:FUNCTION")
    return _load_file(found.origin)


def _load_file(path: str):
    """The module in the file `path`, loaded once per process under a name of its own (a judge model loads once)."""
    name = "spiral_reward_" + hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # as an import would: pickling and dataclasses look it up there
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module


MAX_REWARD = 1e15  # far above any task's reward, far below float32's 3.4e38 once multiplied by a sequence's log-prob


def reward_value(value) -> float | None:
    """`value` as a reward, or None when it is not one: a finite real number with |r| <= MAX_REWARD; a bool, numpy's
    included (np.bool_, what `np.array(...) == x` gives), counts as 0 or 1."""
    if getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "shape", None) == ():
        value = bool(value)  # numpy's bool (np.True_, a 0-d bool array) is not a numbers.Real
    try:
        number = float(value) if isinstance(value, numbers.Real) else math.nan
    except OverflowError:  # an int past float's range (10**400)
        return None
    return number if abs(number) <= MAX_REWARD else None  # nan and +-inf fail it too


def checked(function: RewardFn, name: str) -> RewardFn:
    """`function` with every value checked (reward_value), returned as a float; anything else, or an exception
    inside it (sys.exit included: a reward cannot end the run with exit 0), is a RewardError naming `name` and the
    problem. The working directory is the run's again after each call (a reward's os.chdir moves nothing)."""

    def reward_fn(problem: Problem, completion: str) -> float:
        cwd = os.getcwd()
        try:
            value = function(problem, completion)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: one line names it and the problem
            raise RewardError(f"the reward {name} raised {_first_line(exc)} on problem {_label(problem)}") from None
        finally:
            if os.getcwd() != cwd:  # a reward that changed directory: the run's relative paths stay the user's
                os.chdir(cwd)
        if reward_value(value) is None:
            raise RewardError(f"the reward {name} returned {value!r} on problem {_label(problem)}; expected a finite "
                              f"number of at most {MAX_REWARD:g} in size (larger ones overflow the loss)")
        return reward_value(value)

    reward_fn.__name__ = getattr(function, "__name__", name)
    return reward_fn


def probe(reward_fn: RewardFn, problems: list[Problem], spec: str) -> None:
    """Call the checked r(x, "") on the first problem: a reward that fails there fails in training (RewardError)."""
    try:
        if problems:
            reward_fn(problems[0], "")
    except RewardError as exc:
        raise RewardError(f"--reward {spec}: {exc} (probed before any work with the empty completion, which a model "
                          "may write)") from None


def resolve(spec: str | None, problems: list[Problem]) -> RewardFn | None:
    """--reward SPEC -> the checked, probed r(x, y); None for the default math task (spiral.py grades then)."""
    if spec is None:
        return None
    reward_fn = checked(load_reward(spec), spec)
    probe(reward_fn, problems, spec)
    return reward_fn


def trl_reward(function: RewardFn) -> Callable:
    """A task's r(x, y) in TRL's reward-function signature, f(prompts, completions, **columns) -> list[float]: x is
    rebuilt from the prompt (a string or one user message) and the row's columns (`answer` is the gold answer)."""

    def reward_fn(prompts, completions, **columns):
        rows = [{key: value[i] for key, value in columns.items() if isinstance(value, list)}
                for i in range(len(prompts))]
        return [function(Problem(text_of(prompt), _str_or_none(row.get("answer")), _str_or_none(row.get("id")),
                                 {"prompt": prompt, **row}), text_of(completion))
                for prompt, completion, row in zip(prompts, completions, rows)]

    reward_fn.__name__ = getattr(function, "__name__", "reward")
    return reward_fn


def text_of(value) -> str:
    """A prompt or completion as text: a string, or the content of a chat-format message list's last message."""
    return value[-1]["content"] if isinstance(value, list) else value


def _str_or_none(value) -> str | None:
    return None if value is None else str(value)


def _label(problem: Problem) -> str:
    return problem.id if problem.id is not None else repr(problem.problem[:60])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def trl_rewards(functions: list, weights: list[float], prompts: list, completions: list[str],
                completion_ids: list[list[int]], rows: list[dict], run_async: Callable | None = None,
                **extra) -> tuple[list[float], list[list[float]], list[int]]:
    """TRL's rewards for a batch of completions, as GRPOTrainer._calculate_rewards computes them: each function is
    called once, f(prompts, completions, completion_ids, **columns, **extra), with one entry per completion (a column
    is the list of its rows' values) and returns one value per completion; None means "not this function's" (NaN);
    a completion's reward is the weighted sum of the others (TRL's nansum). Returns (rewards, each completion's
    per-function values, the completions every function returned None for: TRL warns and scores them 0 here).

    A chat-format prompt gets its completion as [{"role": "assistant", "content": ...}], as TRL passes it; `extra`
    (TRL's trainer_state, log_metric, log_extra) goes to every function; `run_async` awaits an async function's
    result. An exception, a wrong count, or anything but a finite number (a bool, numpy's too, is 0 or 1) or None is
    a RewardError of one line."""
    completions = [[{"role": "assistant", "content": c}] if isinstance(p, list) else c
                   for p, c in zip(prompts, completions)]
    keys = list(dict.fromkeys(k for row in rows for k in row if k not in ("prompt", "completion", "completion_ids")))
    columns = {key: [row.get(key) for row in rows] for key in keys}  # TRL: each column, one value per completion
    values_F_B = []
    for function in functions:
        name = getattr(function, "__name__", type(function).__name__)
        cwd = os.getcwd()
        try:
            out = function(prompts=list(prompts), completions=completions, completion_ids=list(completion_ids),
                           **columns, **extra)
            out = run_async(out) if hasattr(out, "__await__") else out
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code (sys.exit too): one line names it
            raise RewardError(f"the reward function {name} raised {_first_line(exc)}") from None
        finally:
            if os.getcwd() != cwd:
                os.chdir(cwd)  # a reward that changed directory moves nothing the run writes
        if not isinstance(out, (list, tuple)) or len(out) != len(prompts):
            raise RewardError(f"the reward function {name} returned {str(out)[:80]} for {len(prompts)} completions; "
                              f"expected a list of {len(prompts)} rewards")
        values_F_B.append([_reward_value(value, name) for value in out])
    values_B_F = [list(v) for v in zip(*values_F_B)]  # (B, F)
    unscorable = [i for i, v in enumerate(values_B_F) if all(math.isnan(x) for x in v)]
    rewards = [sum(w * x for w, x in zip(weights, v) if not math.isnan(x)) for v in values_B_F]  # 0 if unscorable
    return rewards, values_B_F, unscorable


def _reward_value(value, name: str) -> float:
    """One value a TRL reward function returned: NaN for None, else reward_value's float (a bool, numpy's too, is 0
    or 1; |r| <= MAX_REWARD)."""
    if value is None:
        return math.nan
    number = reward_value(value)
    if number is None:
        raise RewardError(f"the reward function {name} returned {value!r}; expected a finite number of at most "
                          f"{MAX_REWARD:g} in size, or None")
    return number


def warn_if_not_binary(rewards, who: str) -> None:
    """One line on stderr when a task's rewards were not all 0 or 1 (evaluation counts a trace as solved at r = 1)."""
    other = sorted(set(rewards) - {0.0, 1.0})
    if other:
        print(f"warning: {who}: the reward gave values other than 0 and 1 (e.g. {other[0]:g}); pass@k and pass@1 "
              "count a trace as solved only at 1", file=sys.stderr)


if __name__ == "__main__":  # a library (cli imports it, so no cli.library_main): print what it holds
    print(__doc__)
