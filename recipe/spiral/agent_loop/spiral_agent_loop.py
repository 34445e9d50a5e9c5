"""SPIRAL's rollout as a verl 0.9.1 agent loop: Algorithm 1, lines 2-10 for one prompt x, returned as N1 + K N2 rows.

    line 2      N1 search traces y_1..y_N1 ~ pi(. | x)                       (asyncio.gather of N1 server requests)
    line 5      K sets of n search traces, uniformly without replacement      setsample.sample_sets
    line 7      N2 aggregation traces ~ pi(. | x, G_l) for each set           verl_task.aggregation_ids
    line 10     r(x, y) of every aggregation trace                             verl_task.score

The row is read as verl_task.py says (verl's RLHFDataset layout: the prompt's chat messages are the search prompt, x
in the aggregation prompt is extra_info["problem"] or the last user message). r is the trainer config's
reward.custom_reward_function, called as verl's naive reward manager calls it.

Each row carries the row contract (verl_spiral.spiral_extra_fields) for SpiralPPOTrainer._compute_advantage, plus what
verl itself reads from an output's extra_fields: the server's min_global_steps / max_global_steps (the staleness tags
verl's _compute_metrics needs) and reward_extra_info (copied from the last row onto the others). A search prompt is
capped as verl caps prompts (AgentLoopBase._cap_text_prompt_length; SpiralDataset keeps only rows that fit), an
aggregation prompt by shortening its traces, never the problem; responses at rollout.response_length.

Why the rewards travel in extra_fields: with several outputs, verl copies the last output's reward_score onto every
other row, so rm_scores cannot hold per-row rewards. The last row's reward_score is set, so that verl's reward loop is
not called on it (its score would be copied onto every row too).
"""

from __future__ import annotations

import asyncio
from uuid import uuid4

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from recipe.spiral import verl_task
from setsample import sample_sets
from verl_spiral import spiral_extra_fields


@register("spiral_agent")
class SpiralAgentLoop(AgentLoopBase):
    """One session per prompt (rollout.n = 1): N1 search rows, then K N2 aggregation rows, in that order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spiral = self.config.spiral
        self.N1, self.n, self.K, self.N2 = spiral.num_search, spiral.set_size, spiral.num_sets, spiral.num_aggregations
        self.seed = spiral.get("seed", 0)
        self.response_length = self.rollout_config.response_length
        self.reward_fn = verl_task.reward_function(self.config)  # r, loaded once a process

    async def _sample(self, prompt_ids: list[int], sampling_params: dict) -> tuple[list[int], object]:
        """One trace of `prompt_ids`: (the row's own copy of the prompt ids, verl's TokenOutput)."""
        output = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=prompt_ids,
                                                    sampling_params=sampling_params)
        return list(prompt_ids), output

    def _row(self, prompt_ids: list[int], output, spiral_fields: dict) -> AgentLoopOutput:
        ids = list(output.token_ids[: self.response_length])
        logprobs = list(output.log_probs[: len(ids)]) if output.log_probs else None
        metrics = AgentLoopMetrics(num_preempted=output.num_preempted if output.num_preempted is not None else -1)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids, response_mask=[1] * len(ids),
                               response_logprobs=logprobs, num_turns=2, metrics=metrics,
                               extra_fields={**output.extra_fields, **spiral_fields, "reward_extra_info": {}})

    def _text(self, output) -> str:
        return self.tokenizer.decode(output.token_ids[: self.response_length], skip_special_tokens=True)

    async def run(self, sampling_params: dict, **kwargs) -> list[AgentLoopOutput]:
        prompt_key = self.data_config.get("prompt_key", "prompt")
        # kwargs: the row's columns, and its prompt messages as RLHFDataset hands them on (raw_prompt)
        why = verl_task.layout_problem({**kwargs, prompt_key: kwargs.get("raw_prompt")}, prompt_key)
        if why:  # the entry point checked local files before Ray; a remote file's bad row ends its session here
            raise verl_task.TaskError(f"row {kwargs.get('index')}: {why}")
        messages, extra_info = list(kwargs["raw_prompt"]), kwargs.get("extra_info") or {}
        problem, gold = verl_task.problem_text(extra_info, messages), kwargs["reward_model"]["ground_truth"]
        chat_kwargs = self.apply_chat_template_kwargs
        # Line 2: the search traces.
        search_ids = self._cap_text_prompt_length(verl_task.prompt_ids(self.tokenizer, messages, chat_kwargs))
        search = await asyncio.gather(*[self._sample(search_ids, sampling_params) for _ in range(self.N1)])
        rows = [self._row(p, out, spiral_extra_fields(is_search=True, set_size=self.n, trace_index=j))
                for j, (p, out) in enumerate(search)]
        # Line 5: K sets, from a stream fixed by the seed, the dataset row and the step (reproducible draws).
        rng = np.random.default_rng([self.seed, int(kwargs.get("index", 0)), int(kwargs.get("global_steps", 0)),
                                     int(kwargs.get("session_id", 0))])
        sets_K_n = sample_sets(self.N1, self.n, self.K, rng=rng)  # (K, n)
        # Line 7: N2 aggregation traces per set, all K N2 requests at once.
        search_texts = [self._text(out) for _, out in search]  # decoded once; a trace is in K n / N1 sets on average
        set_ids = [verl_task.aggregation_ids(self.tokenizer, messages, problem, [search_texts[j] for j in G_l],
                                             self.rollout_config.prompt_length, chat_kwargs) for G_l in sets_K_n]
        aggregation = await asyncio.gather(*[self._sample(set_ids[l], sampling_params)
                                             for l in range(self.K) for _ in range(self.N2)])
        # Line 10: r(x, y) = reward.custom_reward_function (a blocking one in worker threads).
        rewards = await asyncio.gather(*[verl_task.score(self.reward_fn, data_source=kwargs["data_source"],
                                                         solution_str=self._text(out), ground_truth=gold,
                                                         extra_info=extra_info) for _, out in aggregation])
        for k, ((p, out), r) in enumerate(zip(aggregation, rewards)):
            l = k // self.N2
            rows.append(self._row(p, out, spiral_extra_fields(is_search=False, set_size=self.n, set_index=l,
                                                               set_members=sets_K_n[l], reward=r)))
        rows[-1].reward_score = float(rewards[-1])  # verl's reward loop then skips this session (see above)
        return rows
