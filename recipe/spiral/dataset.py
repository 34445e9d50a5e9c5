"""verl's RLHFDataset with SPIRAL's length filter (data.custom_cls in config/spiral_trainer.yaml).

verl's own filter keeps a row whose search prompt fits data.max_prompt_length; SPIRAL's prompt cap is sized for an
aggregation prompt (n traces of L tokens, paper 4 x 4096 + the problem), so that filter keeps everything. This one
keeps the rows verl_task.fits keeps: the search prompt within spiral.max_prompt_tokens (train.py's
--max-prompt-tokens) and the aggregation prompt within data.max_prompt_length. The entry point counts the same rows
before Ray starts.
"""

from __future__ import annotations

from verl.utils.dataset.rl_dataset import RLHFDataset

from recipe.spiral import verl_task


class SpiralDataset(RLHFDataset):
    """RLHFDataset whose maybe_filter_out_long_prompts is verl_task.fits (always on: data.filter_overlong_prompts is
    pinned true). Reads n and spiral.max_prompt_tokens from data.spiral (the YAML sets data.spiral: ${spiral})."""

    def maybe_filter_out_long_prompts(self, dataframe=None):
        budget = verl_task.PromptBudget.from_config(self.config.spiral, self.config)
        tokenizer, prompt_key, chat_kwargs = self.tokenizer, self.prompt_key, dict(self.apply_chat_template_kwargs)
        before = len(dataframe)
        dataframe = dataframe.filter(lambda row: verl_task.fits(tokenizer, row, prompt_key, budget, chat_kwargs),
                                     num_proc=self.num_workers, desc="SPIRAL's prompt lengths")
        print(f"SpiralDataset: {len(dataframe)} of {before} problems fit (search prompt <= spiral.max_prompt_tokens "
              f"{budget.max_search_tokens}, aggregation prompt <= data.max_prompt_length {budget.max_prompt_length})")
        return dataframe
