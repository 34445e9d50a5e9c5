"""verl_spiral.py on verl's real DataProto (skipped without verl; CI's engines environment has it): the advantages are
spiral_advantages, per prompt, on response tokens only; verl's own reorder and concat change nothing, bit for bit;
rows without metadata are refused; and the two facts of verl 0.9.1 that shape the recipe, where verl can show them.
tests/test_verl_recipe.py runs recipe/spiral/ (its agent loop, entry point and YAML) with verl's own machinery."""

import math

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl")
from verl import DataProto  # noqa: E402

import verl_spiral  # noqa: E402
from advantages import spiral_advantages  # noqa: E402
from setsample import sample_sets  # noqa: E402

N1, n, K, N2, T = 4, 2, 3, 2, 7


def spiral_rows(seed=0, uids=("prompt-a", "prompt-b", "prompt-c")):
    """What the SPIRAL agent loop emits per prompt: N1 search outputs, then K N2 aggregation outputs, with the
    expected advantage of each (from spiral_advantages on the prompt's own arrays) and a response length."""
    rng = np.random.default_rng(seed)
    rows = []
    for uid in uids:
        sets_K_n = sample_sets(N1, n, K, rng=rng)  # Algorithm 1, line 5
        rewards_K_N2 = rng.integers(0, 2, size=(K, N2)).astype(float)  # r(x, y) of the aggregation traces
        search_N1, aggregation_K_N2 = spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=N1)
        for j in range(N1):
            rows.append((uid, verl_spiral.spiral_extra_fields(is_search=True, set_size=n, trace_index=j),
                         search_N1[j]))
        for l in range(K):
            for i in range(N2):
                extra = verl_spiral.spiral_extra_fields(is_search=False, set_size=n, set_index=l,
                                                        set_members=sets_K_n[l], reward=rewards_K_N2[l, i])
                rows.append((uid, extra, aggregation_K_N2[l, i]))
    lengths = rng.integers(1, T + 1, size=len(rows))
    return rows, lengths


def as_dataproto(rows, lengths):
    response_mask = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).float()  # (B, T)
    return DataProto.from_dict(tensors={"response_mask": response_mask},
                               non_tensors={"uid": np.array([r[0] for r in rows], dtype=object),
                                            "extra_fields": np.array([r[1] for r in rows], dtype=object)})


def test_advantages_are_spiral_advantages_on_response_tokens_only():
    rows, lengths = spiral_rows()
    data = verl_spiral.compute_spiral_advantage(as_dataproto(rows, lengths))
    adv_BT = data.batch["advantages"]
    expected_B = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    assert expected_B.abs().max() > 0
    mask_BT = data.batch["response_mask"].bool()
    assert torch.equal(adv_BT, expected_B[:, None].expand(-1, T) * mask_BT)  # 0 on padding
    assert torch.equal(data.batch["returns"], adv_BT)
    for uid in {r[0] for r in rows}:  # each set's aggregation advantages are centred on the set's mean
        for l in range(K):
            in_set = [i for i, r in enumerate(rows) if r[0] == uid and r[1]["set_index"] == l]
            assert abs(float(adv_BT[in_set, 0].sum())) < 1e-6


def test_verl_reorder_and_concat_change_nothing_bit_for_bit():
    rows, lengths = spiral_rows(seed=1)
    whole = verl_spiral.compute_spiral_advantage(as_dataproto(rows, lengths)).batch["advantages"]
    search = [i for i, r in enumerate(rows) if r[1]["is_search"]]
    aggregation = [i for i, r in enumerate(rows) if not r[1]["is_search"]]
    # The two generation stages as separate DataProtos, joined by verl (equal widths: T here), then shuffled.
    parts = [as_dataproto([rows[i] for i in idx], lengths[idx]) for idx in (aggregation, search)]
    joined = DataProto.concat(parts)
    perm = torch.as_tensor(np.random.default_rng(2).permutation(len(rows)))
    joined.reorder(perm)
    order = (aggregation + search)
    original_index = torch.as_tensor([order[int(p)] for p in perm])
    assert torch.equal(verl_spiral.compute_spiral_advantage(joined).batch["advantages"], whole[original_index])


def test_rows_without_metadata_or_with_broken_sets_are_refused():
    rows, lengths = spiral_rows(seed=3, uids=("p",))
    data = as_dataproto(rows, lengths)
    data.non_tensor_batch["extra_fields"][0] = {"reward_extra_info": {}}  # an output of a non-SPIRAL agent loop
    with pytest.raises(ValueError, match="rows without SPIRAL metadata"):
        verl_spiral.compute_spiral_advantage(data)
    broken = [(uid, dict(extra), a) for uid, extra, a in rows]
    broken[N1][1]["set_members"] = [N1 + 5] * n  # an aggregation row naming search traces the prompt does not have
    with pytest.raises(ValueError, match="prompt p:"):
        verl_spiral.compute_spiral_advantage(as_dataproto(broken, lengths))
    with pytest.raises(ValueError, match="set_size"):
        verl_spiral.spiral_extra_fields(is_search=False, set_size=3, set_index=0, set_members=[0, 1], reward=1.0)


def test_a_search_row_carries_no_reward_and_no_set():
    """The row contract's fields that do not apply to a search trace: no reward (NaN, never a 0 that a mean over rows
    would count as a wrong aggregation), no set (-1), set_members n times -1; an aggregation row carries its own."""
    search = verl_spiral.spiral_extra_fields(is_search=True, set_size=3, trace_index=2)
    assert math.isnan(search["spiral_reward"]) and search["set_index"] == -1 and search["set_members"] == [-1] * 3
    assert search["is_search"] is True and search["trace_index"] == 2
    aggregation = verl_spiral.spiral_extra_fields(is_search=False, set_size=3, set_index=1, set_members=[0, 2, 3],
                                                  reward=0.0)
    assert aggregation["spiral_reward"] == 0.0 and aggregation["set_members"] == [0, 2, 3]
    assert aggregation["trace_index"] == -1 and aggregation["set_index"] == 1


def test_a_registered_estimator_sees_no_spiral_metadata():
    """Fact 1 of verl_spiral's docstring, on verl's own compute_advantage (where it imports: verl[verl-core])."""
    try:
        from verl.trainer.ppo.core_algos import register_adv_est
        from verl.trainer.ppo.ray_trainer import compute_advantage
    except ImportError as exc:
        pytest.skip(f"verl.trainer.ppo.ray_trainer needs verl[verl-core] ({exc})")
    seen = {}

    @register_adv_est("spiral_probe")
    def probe(token_level_rewards, response_mask, config=None, index=None, **kwargs):
        seen.update(kwargs, index=index, config=config)
        return torch.zeros_like(response_mask), torch.zeros_like(response_mask)

    rows, lengths = spiral_rows(seed=4)
    data = as_dataproto(rows, lengths)
    data.batch["token_level_rewards"] = torch.zeros(len(rows), T)
    compute_advantage(data, adv_estimator="spiral_probe", config={})
    assert seen["index"] is not None and not set(seen) & {"extra_fields", *verl_spiral.SPIRAL_FIELDS}


def test_spiral_trainer_compute_advantage_reads_extra_fields_and_writes_nested_advantages(monkeypatch):
    """SpiralPPOTrainer._compute_advantage with the TransferQueue replaced by a dict (needs verl[verl-core]); the
    rest of the trainer (Ray workers, rollout servers) is not built. test_verl_recipe.py runs it on a real
    TransferQueue, with verl's padding rows."""
    tq = pytest.importorskip("transfer_queue")
    from tensordict import NonTensorStack, TensorDict

    rows, lengths = spiral_rows(seed=5)
    store = TensorDict({
        "response_mask": torch.nested.as_nested_tensor([torch.ones(int(L), dtype=torch.int64) for L in lengths],
                                                       layout=torch.jagged),
        "uid": NonTensorStack(*[r[0] for r in rows]),
        "extra_fields": NonTensorStack(*[r[1] for r in rows]),
    }, batch_size=len(rows))
    written = {}

    class Batch:  # verl's KVBatchMeta: keys, per-row tags (none of them padding here), partition
        keys, partition_id = [f"{r[0]}_0_{i}" for i, r in enumerate(rows)], "train"
        tags = [{"status": "success"} for _ in rows]

        def __len__(self):
            return len(rows)

    def kv_batch_get(keys, partition_id, select_fields):
        assert keys == Batch.keys and set(select_fields) == {"uid", "response_mask", "extra_fields"}
        return store.select(*select_fields)

    monkeypatch.setattr(tq, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(tq, "kv_batch_put", lambda keys, partition_id, fields: written.update(fields=fields) or "ok")
    trainer_cls = verl_spiral.spiral_trainer_class()
    from verl.trainer.ppo.v1 import get_trainer_cls

    assert get_trainer_cls("spiral_sync") is trainer_cls
    metrics = {}
    assert object.__new__(trainer_cls)._compute_advantage(Batch(), metrics) == "ok"
    for key in ("advantages", "returns"):
        nested = written["fields"][key]
        for i, r in enumerate(rows):  # row i: its own advantage on each of its lengths[i] response tokens
            assert torch.equal(nested[i], torch.full((int(lengths[i]),), float(np.float32(r[2]))))
    assert 0 < metrics["spiral/zero_advantage_rows"] < 1


def verl_fit_steps(monkeypatch, rows, train_batch_size, total_epochs, total_training_steps, save_freq=3):
    """verl 0.9.1's own PPOTrainer.fit, on a stand-in trainer whose step() only counts: (steps run, steps saved).
    steps_per_epoch and total_training_steps are set as PPOTrainer._init_dataloader sets them."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import trainer_base

    class Quiet:  # Tracking, the table loggers, SkipManager, tqdm, the TransferQueue: nothing to do here
        def __init__(self, *args, **kwargs):
            pass

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    for name in ("Tracking", "ValidationGenerationsLogger", "DapoFilteredRewardTableLogger", "tqdm"):
        monkeypatch.setattr(trainer_base, name, Quiet)
    monkeypatch.setattr(trainer_base, "SkipManager", Quiet())
    monkeypatch.setattr(trainer_base, "tq", Quiet())
    config = OmegaConf.create({"trainer": {"project_name": "p", "experiment_name": "e", "logger": [],
                                           "val_before_train": False, "total_epochs": total_epochs,
                                           "save_freq": save_freq, "test_freq": -1},
                               "global_profiler": {"steps": None}})
    ran, saved = [], []

    class Trainer(Quiet):
        pass

    trainer = Trainer()
    trainer.config, trainer.global_steps = config, 0
    trainer.steps_per_epoch = rows // train_batch_size
    trainer.total_training_steps = total_training_steps or trainer.steps_per_epoch * total_epochs
    trainer.step = lambda metrics, timing: ran.append(trainer.global_steps) or type("B", (), {"keys": [],
                                                                                              "partition_id": "t"})()
    trainer._save_checkpoint = lambda: saved.append(trainer.global_steps)
    trainer._consume_sync_metrics = lambda: {}
    trainer_base.PPOTrainer.fit(trainer, agent_loop_manager=None)
    return ran, saved


@pytest.mark.parametrize("rows, batch, epochs, steps", [
    (7470, 256, 1, 100),  # the shipped run_spiral_qwen3_4b_8gpu.sh before: 29 steps, last save at 27
    (7470, 256, 4, 100), (7470, 256, 3, 100), (7470, 256, 2, None), (100, 2, 1, 50), (100, 2, 1, 51), (10, 3, 2, 6),
    (10, 3, 2, 7), (10, 3, 1, None), (5, 2, 3, None), (5, 2, 3, 1), (4, 2, 1, 2),
])
def test_run_length_problem_says_whether_verl_s_own_loop_runs_and_saves_the_steps_it_is_set_to(
        monkeypatch, rows, batch, epochs, steps):
    """run_length_problem is None exactly where verl's fit() runs total_training_steps steps (verl's default,
    epochs x rows // batch, when null) and saves at the last of them."""
    ran, saved = verl_fit_steps(monkeypatch, rows, batch, epochs, steps)
    wanted = steps or (rows // batch) * epochs
    runs_what_it_says = ran == list(range(1, wanted + 1)) and saved[-1:] == [wanted]
    assert (verl_spiral.run_length_problem(rows, batch, epochs, steps) is None) == runs_what_it_says, (ran, saved)
    if (rows, batch, epochs, steps) == (7470, 256, 1, 100):
        assert len(ran) == 29 and saved[-1] == 27  # save_freq 3 here; the shipped 10 saved last at 20


def test_run_length_problem_names_what_to_change():
    assert verl_spiral.run_length_problem(7470, 256, 1, 100) == (
        "trainer.total_training_steps = 100 needs trainer.total_epochs >= 4: 7470 problems // data.train_batch_size "
        "256 = 29 steps an epoch, and verl stops after epoch 1 (step 29), without the final save")
    assert "more than the 100 training problems" in verl_spiral.run_length_problem(100, 256, 2, None)
    assert "at least 1" in verl_spiral.run_length_problem(100, 2, 1, 0)
    assert "at least 1" in verl_spiral.run_length_problem(100, 2, 0, None)


@pytest.mark.parametrize("rows, steps, refused", [(10, 7, True), (10, 6, False)])
def test_the_trainer_refuses_a_run_its_loop_would_end_early_once_its_dataset_is_built(monkeypatch, rows, steps,
                                                                                        refused):
    """SpiralPPOTrainer._init_dataloader: after verl's own (which builds the dataset SpiralDataset may shrink), the
    run-length check on the rows that are left; a run verl's loop would end early stops there, in one message."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import PPOTrainerSync

    trainer_cls = verl_spiral.spiral_trainer_class()
    monkeypatch.setattr(PPOTrainerSync, "_init_dataloader", lambda self: setattr(self, "train_dataset", [0] * rows))
    trainer = object.__new__(trainer_cls)
    trainer.config = OmegaConf.create({"data": {"train_batch_size": 3},
                                       "trainer": {"total_epochs": 2, "total_training_steps": steps}})
    if refused:  # 10 // 3 = 3 steps an epoch: 2 epochs end at step 6
        with pytest.raises(verl_spiral.SpiralConfigError, match="total_training_steps = 7 needs"):
            trainer._init_dataloader()
    else:
        trainer._init_dataloader()
        assert len(trainer.train_dataset) == rows
