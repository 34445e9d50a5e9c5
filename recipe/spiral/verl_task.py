"""A SPIRAL task in verl's terms: the rows the recipe reads, the two prompts it builds from a row, which rows fit
them, and r(x, y). The entry point's checks (before Ray), SpiralDataset's length filter and the agent loop all use
this module, so the three agree.

Rows: verl's RLHFDataset layout (its examples/data_preprocess scripts and prepare_data.py write it):

    prompt (data.prompt_key)  chat messages [{"role": ..., "content": str}, ...] whose last user message has text:
                              the search prompt (Algorithm 1, line 2), sent as it is, as verl's single-turn agent
                              loop sends a prompt (prepare_data's rows hold the paper's Search Trace Prompt)
    reward_model.ground_truth handed to r as verl hands it
    data_source               handed to r
    extra_info                optional; extra_info["problem"] (a string) is x in the Aggregation Trace Prompt
                              (prepare_data's rows). Without it, x is the text of the prompt's last user message
                              (verl's gsm8k and math rows: the question with the dataset's instruction)

r(x, y) is verl's `reward.custom_reward_function` (path, name, reward_kwargs), called as verl 0.9.1's naive reward
manager calls it: compute_score(data_source=, solution_str=, ground_truth=, extra_info=) -> a number or a dict with
"score"; with no path set, verl's default_compute_score (graders by data_source), as verl does.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

import reward
import rollout
import task


class TaskError(ValueError):
    """A row, a prompt budget or a reward function the recipe cannot use: one line."""


# ----------------------------------------------------------------------------------------------------------------------
# Rows


def layout_problem(row: dict, prompt_key: str) -> str | None:
    """The first thing `row` lacks for the recipe, named by its key, or None when the row can be read."""
    messages = row.get(prompt_key)
    if messages is None:
        return f"no {prompt_key!r} column (data.prompt_key): chat messages [{{'role': 'user', 'content': ...}}]"
    if isinstance(messages, (str, dict)) or not all(isinstance(m, dict) for m in messages):
        return f"{prompt_key!r} is not chat messages [{{'role': 'user', 'content': ...}}] (verl applies the template)"
    users = [m for m in messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        return f"{prompt_key!r} has no user message with text content (the last one is the problem)"
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        return "no reward_model.ground_truth"
    if "data_source" not in row:
        return "no data_source"
    extra_info = row.get("extra_info")
    problem = extra_info.get("problem") if isinstance(extra_info, dict) else None
    if problem is not None and not isinstance(problem, str):
        return f"extra_info.problem is {type(problem).__name__}, not text"
    return None


def gold_problem(row: dict, default_grader: bool) -> str | None:
    """Why verl's default_compute_score (no reward.custom_reward_function.path) cannot grade `row`, or None: a gold
    answer that is gsm8k's worked solution ("... #### 72"), which it compares whole with the trace's answer, so a
    right answer scores 0. The shipped reward_fn and a function of your own see the row as it is."""
    gold = str((row.get("reward_model") or {}).get("ground_truth"))
    if default_grader and reward.hash_answer(gold) is not None and gold.strip() != reward.hash_answer(gold):
        return (f"reward_model.ground_truth {gold[:40]!r}... is a worked solution, and verl's default_compute_score "
                "(reward.custom_reward_function.path null) compares it whole: write the number after '####' as the "
                "gold answer (verl's gsm8k preprocessing does), or set reward.custom_reward_function "
                "(pkg://recipe.spiral.reward_fn reads it)")
    return None


def problem_text(extra_info, messages) -> str:
    """x as the aggregation prompt shows it: extra_info["problem"], else the last user message's text."""
    problem = extra_info.get("problem") if isinstance(extra_info, dict) else None
    if isinstance(problem, str):
        return problem
    return [m["content"] for m in messages if m.get("role") == "user"][-1]


def aggregation_messages(messages, problem: str, candidates: list[str]) -> list[dict]:
    """The row's messages with its last user message replaced by the Aggregation Trace Prompt of `candidates`
    (Algorithm 1, line 7: y ~ pi(. | x, G)); a system message stays."""
    messages = [dict(m) for m in messages]
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    messages[last_user]["content"] = rollout.aggregation_prompt(problem, candidates)
    return messages[: last_user + 1]


def prompt_ids(tokenizer, messages, chat_kwargs=None) -> list[int]:
    """Token ids of chat `messages` ending with the assistant header, as verl's RLHFDataset measures a prompt (with
    data.apply_chat_template_kwargs)."""
    kwargs = {k: v for k, v in dict(chat_kwargs or {}).items()
              if k not in ("tokenize", "return_dict", "return_tensors")}  # as verl drops them
    encoded = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True,
                                            return_dict=True, **kwargs)
    return list(encoded["input_ids"])


# ----------------------------------------------------------------------------------------------------------------------
# Prompt lengths


@dataclass(frozen=True)
class PromptBudget:
    """What a row's prompts must fit. max_search_tokens: the search prompt (train.py's --max-prompt-tokens, paper
    1024); max_prompt_length: any prompt, an aggregation prompt's n traces of up to L tokens included."""

    set_size: int  # n
    response_tokens: int  # L
    max_search_tokens: int  # spiral.max_prompt_tokens
    max_prompt_length: int  # data.max_prompt_length = rollout.prompt_length

    @classmethod
    def from_config(cls, spiral, data) -> PromptBudget:
        return cls(int(spiral.set_size), int(data.max_response_length), int(spiral.max_prompt_tokens),
                   int(data.max_prompt_length))


def aggregation_template_tokens(tokenizer, budget: PromptBudget, chat_kwargs=None) -> int:
    """Tokens of the aggregation prompt with an empty problem and n empty traces (chat template included)."""
    user = [{"role": "user", "content": ""}]
    return len(prompt_ids(tokenizer, aggregation_messages(user, "", [""] * budget.set_size), chat_kwargs))


def check_budget(tokenizer, budget: PromptBudget, chat_kwargs=None) -> None:
    """TaskError unless data.max_prompt_length holds a problem of spiral.max_prompt_tokens, the aggregation template
    and n traces of L tokens: a shorter cap would cut the aggregation prompt, and verl cuts from the front, where the
    problem is."""
    template = aggregation_template_tokens(tokenizer, budget, chat_kwargs)
    need = budget.max_search_tokens + template + budget.set_size * budget.response_tokens
    if budget.max_prompt_length < need:
        raise TaskError(f"data.max_prompt_length must be at least spiral.max_prompt_tokens + the aggregation template "
                        f"+ spiral.set_size x data.max_response_length = {budget.max_search_tokens} + {template} + "
                        f"{budget.set_size} x {budget.response_tokens} = {need} (got {budget.max_prompt_length}): an "
                        "aggregation prompt holds the problem and n traces")


def fits(tokenizer, row: dict, prompt_key: str, budget: PromptBudget, chat_kwargs=None) -> bool:
    """Whether a row is trained on (train.py's --max-prompt-tokens rule, plus the aggregation prompt): its search
    prompt has at most spiral.max_prompt_tokens tokens, and its aggregation prompt with n traces of L tokens fits
    data.max_prompt_length."""
    messages = list(row[prompt_key])
    if len(prompt_ids(tokenizer, messages, chat_kwargs)) > budget.max_search_tokens:
        return False
    empty = aggregation_messages(messages, problem_text(row.get("extra_info"), messages), [""] * budget.set_size)
    return len(prompt_ids(tokenizer, empty, chat_kwargs)) + budget.set_size * budget.response_tokens \
        <= budget.max_prompt_length


def aggregation_ids(tokenizer, messages, problem: str, candidates: list[str], cap: int, chat_kwargs=None) -> list[int]:
    """Token ids of the aggregation prompt of `candidates`, at most `cap` long, the problem always whole.

    A trace of L tokens, decoded and encoded again inside the template, can come out a few tokens longer; verl's own
    cap (AgentLoopBase._cap_text_prompt_length) would then cut the prompt's front, and the problem with it. Here the
    longest trace loses its end instead, until the prompt fits (fits() leaves room for n traces of L tokens).
    """
    texts = list(candidates)
    while True:
        ids = prompt_ids(tokenizer, aggregation_messages(messages, problem, texts), chat_kwargs)
        excess = len(ids) - cap
        if excess <= 0:
            return ids
        j = max(range(len(texts)), key=lambda i: len(texts[i]))
        if not texts[j]:
            raise TaskError(f"the aggregation prompt without traces has {len(ids)} tokens, over data.max_prompt_length "
                            f"{cap}: the row should have been filtered (verl_task.fits)")
        trace_ids = tokenizer.encode(texts[j], add_special_tokens=False)
        shorter = tokenizer.decode(trace_ids[: max(0, len(trace_ids) - excess)])
        texts[j] = shorter if len(shorter) < len(texts[j]) else texts[j][:-1]  # progress, whatever decode returns


# ----------------------------------------------------------------------------------------------------------------------
# r(x, y)

_REWARD_FNS: dict = {}  # (path, name, reward_kwargs) -> the function: an agent loop is built per prompt


def reward_function(config):
    """r as verl 0.9.1 resolves it from `config` (the trainer's): verl's get_custom_reward_fn, or verl's
    default_compute_score when reward.custom_reward_function.path is not set."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.reward_score import default_compute_score

    spec = config.reward.get("custom_reward_function") or {}
    key = (spec.get("path"), spec.get("name"), repr(dict(spec.get("reward_kwargs") or {})))
    if key not in _REWARD_FNS:
        _REWARD_FNS[key] = get_custom_reward_fn(config) or default_compute_score
    return _REWARD_FNS[key]


def score_value(result) -> float:
    """A reward function's result as a float: a number as task.py takes one (task.reward_value: finite, at most
    task.MAX_REWARD in size, a bool or numpy bool as 0 or 1), or a dict's "score" (verl's convention)."""
    value = task.reward_value(result.get("score") if isinstance(result, dict) else result)
    if value is None:
        raise TaskError(f"reward.custom_reward_function returned {result!r}: not a finite number of at most "
                        f"{task.MAX_REWARD:g} in size, or a dict with 'score'")
    return value


async def score(fn, *, data_source, solution_str: str, ground_truth, extra_info) -> float:
    """r(x, y) of one aggregation trace (Algorithm 1, line 10), called as verl's naive reward manager calls it; a
    blocking function runs in a worker thread."""
    kwargs = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
              "extra_info": {**(extra_info or {}), "num_turns": 2, "rollout_reward_scores": {}}}
    if inspect.iscoroutinefunction(fn):
        return score_value(await fn(**kwargs))
    return score_value(await asyncio.to_thread(lambda: fn(**kwargs)))
