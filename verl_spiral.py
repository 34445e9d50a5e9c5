"""SPIRAL's advantages in verl 0.9.1's v1 trainer: the module recipe/spiral/ names (checked against verl 0.9.1).

Algorithm 1, lines 8-15 on a verl batch: each row (one trace) carries the fields of PORTING.md, "The row contract",
which the SPIRAL agent loop writes into each output's `extra_fields` (`spiral_extra_fields`); `compute_spiral_advantage`
turns a DataProto of such rows into batch["advantages"] = batch["returns"] (B, T): A#_marg(x, y_j) on search rows,
r - (the set's mean reward) on aggregation rows, on response tokens, 0 on padding (advantages.flat_spiral_advantages).

Four facts of verl 0.9.1 decide the shape of the recipe (read from its source):
  1. A `register_adv_est` estimator is called with token_level_rewards, response_mask, config and index (the uid)
     only, and v1's PPOTrainer._compute_advantage fetches only those fields from the TransferQueue: the SPIRAL
     metadata never reaches it. So `SpiralPPOTrainer` overrides `_compute_advantage` instead.
  2. When an agent loop returns several outputs, AgentLoopWorkerTQ._agent_loop_postprocess copies the last output's
     reward_score onto all the others. So r(x, y) travels in extra_fields["spiral_reward"], not in rm_scores.
  3. The loop (PPOTrainer.fit) runs while the epoch is below trainer.total_epochs AND the step is at most
     trainer.total_training_steps, and saves at the end only on reaching total_training_steps: a step count beyond
     total_epochs x (rows // data.train_batch_size) ends the run early, without its last save. `run_length_problem`
     says so, and SpiralPPOTrainer refuses such a run once its dataset is built (the recipe's entry point earlier).
  4. PPOTrainer branches on `trainer_mode == "sync"`: any other name (ours is registered as "spiral_sync") gets the
     async replay buffer, one-prompt dataloader fetches and a TransferQueue snapshot in every checkpoint. So
     SpiralPPOTrainer runs as mode "sync", verl's synchronous trainer, once verl has looked it up by its own name.
Only numpy, torch and advantages.py are needed for the estimator (and verl's DataProto for `compute_spiral_advantage`);
`SpiralPPOTrainer` needs verl[verl-core] (transfer_queue) and is built on first use.
"""

from __future__ import annotations

import numpy as np
import torch

from advantages import flat_spiral_advantages

SPIRAL_FIELDS = ("is_search", "trace_index", "set_index", "set_members", "spiral_reward")


class SpiralConfigError(ValueError):
    """A setting with which verl would not run what it says (one line); raised inside Ray, it reaches the driver as an
    instance of this class (Ray's RayTaskError subclasses the cause)."""


def spiral_extra_fields(*, is_search: bool, set_size: int, trace_index: int = -1, set_index: int = -1,
                        set_members=None, reward: float | None = None) -> dict:
    """One output's SPIRAL metadata, for AgentLoopOutput.extra_fields (PORTING.md, "The row contract").

    Search trace y_j: is_search, trace_index j, no reward. Aggregation trace of set G_l: set_index l, set_members
    = the indices j of G_l's search traces (Algorithm 1, line 5), reward r(x, y). Fields that do not apply hold -1
    (NaN for the reward), so that every row has the same keys and set_members the same length n.
    """
    members = [-1] * set_size if set_members is None else [int(j) for j in set_members]
    if len(members) != set_size:
        raise ValueError(f"set_members has {len(members)} entries, set_size is {set_size}")
    return {"is_search": bool(is_search), "trace_index": int(trace_index), "set_index": int(set_index),
            "set_members": members, "spiral_reward": float("nan") if reward is None else float(reward)}


def columns_from_extra_fields(extra_fields_B) -> dict[str, np.ndarray]:
    """non_tensor_batch columns from the rows' extra_fields dicts: (B,) arrays and set_members (B, n)."""
    rows = list(extra_fields_B)
    missing = [key for key in SPIRAL_FIELDS if any(key not in row for row in rows)]
    if missing:
        raise ValueError(f"rows without SPIRAL metadata {missing}: write them with spiral_extra_fields")
    columns = {key: np.array([row[key] for row in rows], dtype=object) for key in SPIRAL_FIELDS if key != "set_members"}
    columns["set_members"] = np.array([row["set_members"] for row in rows], dtype=np.int64)  # (B, n)
    return columns


def spiral_advantages_for_verl(non_tensor_batch: dict, response_mask: torch.Tensor) -> torch.Tensor:
    """Algorithm 1, lines 8-15 for verl's rows: (B, T) float32, each row's advantage on its response tokens.

    `non_tensor_batch` needs "uid" (the prompt, Algorithm 1's x) and SPIRAL_FIELDS; rows may come in any order
    (verl's batch balancing reorders them) and the result does not change, bit for bit.
    """
    nt = non_tensor_batch
    rewards_B = np.array(nt["spiral_reward"].tolist(), dtype=np.float64)  # NaN on search rows (never rewarded)
    adv_B = flat_spiral_advantages(nt["uid"], nt["is_search"], nt["trace_index"], nt["set_index"],
                                   np.asarray(nt["set_members"].tolist()), rewards_B)
    return torch.as_tensor(adv_B, dtype=torch.float32)[:, None] * response_mask.to(torch.float32)  # (B, T)


def compute_spiral_advantage(data):
    """Fill data.batch["advantages"] and ["returns"] (B, T) of a verl DataProto with SPIRAL's advantages.

    The metadata is read from data.non_tensor_batch: its SPIRAL_FIELDS columns, or else an "extra_fields" column
    of dicts (as v1 stores agent-loop outputs). Returns `data`.
    """
    nt = data.non_tensor_batch
    if not all(key in nt for key in SPIRAL_FIELDS):
        nt.update(columns_from_extra_fields(nt["extra_fields"]))
    adv_BT = spiral_advantages_for_verl(nt, data.batch["response_mask"])  # (B, T)
    data.batch["advantages"] = adv_BT
    data.batch["returns"] = adv_BT.clone()  # no critic: returns are not used, but verl expects the key
    return data


def spiral_metrics(non_tensor_batch: dict, adv_BT: torch.Tensor) -> dict[str, float]:
    """spiral/* columns of a step: mean r(x, y) over the aggregation rows (spiral.py's aggregation_accuracy; verl's own
    reward columns are not SPIRAL's: verl copies one row's reward onto a session's rows), and the share of rows whose
    advantage is 0."""
    is_search_B = np.array(non_tensor_batch["is_search"].tolist(), dtype=bool)  # (B,)
    rewards = np.array(non_tensor_batch["spiral_reward"].tolist(), dtype=np.float64)[~is_search_B]
    zero_B = (adv_BT.abs().amax(dim=1) == 0).numpy()  # (B,)
    return {"spiral/aggregation_accuracy": float(rewards.mean()) if rewards.size else float("nan"),
            "spiral/search_rows": int(is_search_B.sum()), "spiral/aggregation_rows": int((~is_search_B).sum()),
            "spiral/zero_advantage_rows": float(zero_B.mean())}


def run_length_problem(rows: int, train_batch_size: int, total_epochs: int, total_training_steps) -> str | None:
    """Why verl 0.9.1's loop would not run the steps it is set to (None when it will), for `rows` training problems.

    verl: steps_per_epoch = rows // train_batch_size; total_training_steps (None: steps_per_epoch x total_epochs)
    steps run only while the epoch (step - 1) // steps_per_epoch is below total_epochs; the last save happens at
    step total_training_steps.
    """
    steps_per_epoch = rows // train_batch_size
    if steps_per_epoch == 0:
        return (f"data.train_batch_size = {train_batch_size} is more than the {rows} training problems that fit: a "
                "step needs that many")
    if total_epochs < 1:
        return f"trainer.total_epochs must be at least 1 (got {total_epochs})"
    if total_training_steps is None:
        return None
    if total_training_steps < 1:
        return f"trainer.total_training_steps must be at least 1 or null (got {total_training_steps})"
    if total_training_steps > steps_per_epoch * total_epochs:
        return (f"trainer.total_training_steps = {total_training_steps} needs trainer.total_epochs >= "
                f"{-(-total_training_steps // steps_per_epoch)}: {rows} problems // data.train_batch_size "
                f"{train_batch_size} = {steps_per_epoch} steps an epoch, and verl stops after epoch {total_epochs} "
                f"(step {steps_per_epoch * total_epochs}), without the final save")
    return None


_TRAINER = None


def spiral_trainer_class():
    """verl's v1 PPOTrainerSync with SPIRAL's `_compute_advantage`, registered as trainer mode "spiral_sync"
    (trainer.v1.trainer_mode=spiral_sync). Needs verl[verl-core]."""
    global _TRAINER
    if _TRAINER is not None:
        return _TRAINER
    import transfer_queue as tq
    from tensordict import TensorDict

    from verl.protocol import DataProto
    from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
    from verl.workers.utils.padding import response_to_nested

    @register_trainer("spiral_sync")
    class SpiralPPOTrainer(PPOTrainerSync):
        """PPOTrainerSync whose advantages are SPIRAL's (Algorithm 1, lines 8-15), from the rows' extra_fields, and
        that refuses a run its loop would end early (run_length_problem)."""

        def __init__(self, config):
            super().__init__(config)
            # verl's sync code paths (fact 4): PPOTrainer.__init__ read the registered name "spiral_sync" and built
            # the async replay buffer from it. parameter_sync_step stays 1: trainer.v1 has no "spiral_sync" section.
            self.trainer_mode = "sync"
            self.replay_buffer = self._build_replay_buffer()

        def _init_dataloader(self):
            super()._init_dataloader()
            trainer = self.config.trainer
            why = run_length_problem(len(self.train_dataset), self.config.data.train_batch_size,
                                     trainer.total_epochs, trainer.total_training_steps)
            if why:
                raise SpiralConfigError(why)

        def _compute_advantage(self, batch, metrics):
            """Algorithm 1, lines 8-15 on the step's rows; verl's padding rows (tag is_padding: copies of row 0's
            metadata under a new uid, response_mask 0) get advantage 0 and are left out of the grouping."""
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=["uid", "response_mask", "extra_fields"])
            response_mask = data["response_mask"]  # nested: one length per row
            # As PPOTrainer._compute_advantage builds its DataProto: padded to (B, T), uid as an object array.
            proto = DataProto(batch=data.select("uid", "response_mask").to_padded_tensor())
            proto.non_tensor_batch["uid"] = np.array(proto.batch.pop("uid").tolist(), dtype=object)
            proto.non_tensor_batch["extra_fields"] = np.array(list(data["extra_fields"]), dtype=object)
            real_B = np.array([not tag.get("is_padding", False) for tag in batch.tags], dtype=bool)  # (B,)
            adv_BT = torch.zeros(proto.batch["response_mask"].shape, dtype=torch.float32)  # (B, T)
            if real_B.any():
                real = compute_spiral_advantage(proto.select_idxs(real_B))
                adv_BT[torch.as_tensor(real_B)] = real.batch["advantages"]
                metrics.update(spiral_metrics(real.non_tensor_batch, real.batch["advantages"]))
            metrics["spiral/padding_rows"] = int((~real_B).sum())
            output = {"advantages": response_to_nested(adv_BT, response_mask),
                      "returns": response_to_nested(adv_BT.clone(), response_mask)}
            return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                                   fields=TensorDict(output, batch_size=len(batch)))

    _TRAINER = SpiralPPOTrainer
    return _TRAINER


if __name__ == "__main__":  # a library: prints what it holds, runs nothing (needs numpy, torch, advantages.py)
    print(__doc__)
