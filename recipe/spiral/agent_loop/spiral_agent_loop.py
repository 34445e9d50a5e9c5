"""SPIRAL's rollout as a verl 0.9.1 agent loop: Algorithm 1, lines 2-10 for one prompt x, returned as N1 + K N2 rows.

    line 2      N1 search traces y_1..y_N1 ~ pi(. | x)                       (asyncio.gather of N1 server requests)
    line 5      K sets of n search traces, uniformly without replacement      setsample.sample_sets
    line 7      N2 aggregation traces ~ pi(. | x, G_l) for each set           rollout.aggregation_prompt
    line 10     r(x, y) of every aggregation trace                             recipe/spiral/reward_fn.compute_score

Each row carries the row contract (verl_spiral.spiral_extra_fields) for SpiralPPOTrainer._compute_advantage, plus what
verl itself reads from an output's extra_fields: the server's min_global_steps / max_global_steps (the staleness tags
verl's _compute_metrics needs) and reward_extra_info (copied from the last row onto the others). Prompts are capped as
verl caps them (AgentLoopBase._cap_text_prompt_length), responses at rollout.response_length.

Why the rewards travel in extra_fields: with several outputs, verl copies the last output's reward_score onto every
other row, so rm_scores cannot hold per-row rewards. The last row's reward_score is set, so that verl's reward loop is
not called on it (its score would be copied onto every row too).
"""

from __future__ import annotations

import asyncio
from uuid import uuid4

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

import rollout
from recipe.spiral.reward_fn import compute_score
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

    def _prompt_ids(self, text: str) -> list[int]:
        """The prompt of the user message `text`, chat-formatted and capped as verl caps prompts (once per prompt:
        an aggregation prompt holds n traces, and N2 samples read it)."""
        return self._cap_text_prompt_length(rollout.chat_prompt_ids(self.tokenizer, text))

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
        problem, gold = kwargs["extra_info"]["problem"], kwargs["reward_model"]["ground_truth"]
        # Line 2: the search traces.
        search_ids = self._prompt_ids(rollout.search_prompt(problem))
        search = await asyncio.gather(*[self._sample(search_ids, sampling_params) for _ in range(self.N1)])
        rows = [self._row(p, out, spiral_extra_fields(is_search=True, set_size=self.n, trace_index=j))
                for j, (p, out) in enumerate(search)]
        # Line 5: K sets, from a stream fixed by the seed, the dataset row and the step (reproducible draws).
        rng = np.random.default_rng([self.seed, int(kwargs.get("index", 0)), int(kwargs.get("global_steps", 0)),
                                     int(kwargs.get("session_id", 0))])
        sets_K_n = sample_sets(self.N1, self.n, self.K, rng=rng)  # (K, n)
        # Line 7: N2 aggregation traces per set, all K N2 requests at once.
        search_texts = [self._text(out) for _, out in search]  # decoded once; a trace is in K n / N1 sets on average
        set_ids = [self._prompt_ids(rollout.aggregation_prompt(problem, [search_texts[j] for j in G_l]))
                   for G_l in sets_K_n]
        aggregation = await asyncio.gather(*[self._sample(set_ids[l], sampling_params)
                                             for l in range(self.K) for _ in range(self.N2)])
        # Line 10: r(x, y), in worker threads (the grader blocks).
        rewards = await asyncio.gather(*[asyncio.to_thread(compute_score, kwargs.get("data_source", ""),
                                                           self._text(out), gold) for _, out in aggregation])
        for k, ((p, out), r) in enumerate(zip(aggregation, rewards)):
            l = k // self.N2
            rows.append(self._row(p, out, spiral_extra_fields(is_search=False, set_size=self.n, set_index=l,
                                                               set_members=sets_K_n[l], reward=r)))
        rows[-1].reward_score = float(rewards[-1])  # verl's reward loop then skips this session (see above)
        return rows
