"""recipe/spiral/ with verl 0.9.1's own machinery, everything short of GPUs (skipped without verl[verl-core]; CI's
engines environment has it): the agent loop against a stand-in server returning verl's TokenOutput; its rows through a
real TransferQueue (local Ray on CPU), verl's own padding, SpiralPPOTrainer._compute_advantage and verl's
_compute_metrics; the composed trainer YAML through check_spiral_config and verl's validate_config up to the missing
rollout engine; the entry point's TaskRunner up to the GPU resource pool; prepare_data's parquet.

Not run here: the vLLM/SGLang servers, the FSDP workers (they need GPUs) and a multi-node Ray cluster."""

import asyncio
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
tq = pytest.importorskip("transfer_queue")
ray = pytest.importorskip("ray")

from hydra import compose, initialize_config_dir  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import problemset  # noqa: E402
import rollout  # noqa: E402
import verl_spiral  # noqa: E402
from advantages import spiral_advantages  # noqa: E402
from recipe.spiral import main_spiral, prepare_data  # noqa: E402
from recipe.spiral.agent_loop.spiral_agent_loop import SpiralAgentLoop  # noqa: E402
from recipe.spiral.verl_task import TaskError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N1, n, K, N2, L = 4, 2, 3, 2, 8
TINY = ["data.train_batch_size=2", f"actor_rollout_ref.actor.ppo_mini_batch_size={2 * (N1 + K * N2)}",
        f"spiral.num_search={N1}", f"spiral.set_size={n}", f"spiral.num_sets={K}", f"spiral.num_aggregations={N2}",
        "trainer.n_gpus_per_node=1", f"actor_rollout_ref.model.path={ROOT}/data/tiny_warmstart",
        f"data.max_response_length={L}", f"actor_rollout_ref.actor.loss_scale_factor={L}", "data.max_prompt_length=90",
        "spiral.max_prompt_tokens=40", "data.dataloader_num_workers=0"]


def composed(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "recipe/spiral/config"), version_base=None):
        return compose("spiral_trainer", overrides=[*TINY, *overrides])


# ----------------------------------------------------------------------------------------------------------------------
# The agent loop against a stand-in for verl's server manager


class StandInServer:
    """verl's LLM server client, as the agent loop calls it: generate(request_id, prompt_ids, sampling_params) ->
    TokenOutput. A search trace says GOOD (answer 1) or BAD (answer 0) by its position in the request order; an
    aggregation trace answers 1 iff its prompt holds at least one GOOD trace."""

    def __init__(self, tokenizer, good_search):
        self.tokenizer, self.good_search, self.search_calls, self.prompts = tokenizer, good_search, 0, []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        self.prompts.append(list(prompt_ids))
        text = self.tokenizer.decode(prompt_ids)
        if "GOOD" in text or "BAD" in text:  # an aggregation prompt: it holds the set's traces
            answer = "1" if "GOOD" in text else "0"
            reply = f"so \\boxed{{{answer}}}"
        else:
            j = self.search_calls
            self.search_calls += 1
            reply = f"{'GOOD' if j in self.good_search else 'BAD'} \\boxed{{{int(j in self.good_search)}}}"
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id] * 20
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=0,
                           extra_fields={"min_global_steps": 3, "max_global_steps": 4})


@pytest.fixture(scope="module")
def tokenizer():
    return rollout.load_policy(str(ROOT / "data/tiny_warmstart"), device="cpu")[1]


def prepared_row(problem="What is 3 + 4?", answer="1", index=0):
    """A row as prepare_data writes it."""
    return {"data_source": "spiral/x", "prompt": [{"role": "user", "content": rollout.search_prompt(problem)}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": "train", "index": index, "problem": problem}}


def run_agent_loop(tokenizer, good_search, config, index=0, row=None, server=None):
    """The agent loop's run() on one dataset row, with the fields verl's AgentLoopWorker hands it (RLHFDataset's
    raw_prompt, the row's columns, the uid, the step and the session)."""
    server = server or StandInServer(tokenizer, good_search)
    row = row or prepared_row(index=index)
    loop = SpiralAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                           processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data))
    rows = asyncio.run(loop.run({"temperature": 1.0}, **row, raw_prompt=list(row["prompt"]), index=index,
                                global_steps=1, session_id=0, uid=f"prompt-{index}"))
    return rows, server


def test_the_agent_loop_returns_algorithm_1_s_rows(tokenizer):
    config = composed()
    rows, server = run_agent_loop(tokenizer, {0, 2}, config)
    assert len(rows) == N1 + K * N2
    fields = [r.extra_fields for r in rows]
    assert [f["is_search"] for f in fields] == [True] * N1 + [False] * (K * N2)
    assert [f["trace_index"] for f in fields[:N1]] == list(range(N1))
    sets_K_n = [fields[N1 + l * N2]["set_members"] for l in range(K)]
    assert len({tuple(sorted(G)) for G in sets_K_n}) == K  # K distinct sets of n (line 5)
    for l, G in enumerate(sets_K_n):
        for i in range(N2):  # the set's traces are in its aggregation prompt; r = 1 iff one of them is GOOD
            f, row = fields[N1 + l * N2 + i], rows[N1 + l * N2 + i]
            assert f["set_index"] == l and f["set_members"] == G
            assert f["spiral_reward"] == float(bool(set(G) & {0, 2}))
            prompt = tokenizer.decode(row.prompt_ids)
            assert all(("GOOD" if j in (0, 2) else "BAD") in prompt for j in G)
    # What verl itself reads: the server's staleness fields, reward_extra_info, capped responses and log-probs.
    assert all(f["min_global_steps"] == 3 and f["max_global_steps"] == 4 and f["reward_extra_info"] == {}
               for f in fields)
    assert all(len(r.response_ids) == len(r.response_logprobs) == L and r.response_mask == [1] * L for r in rows)
    assert rows[-1].reward_score == fields[-1]["spiral_reward"]
    # The advantages of these rows are spiral_advantages of the prompt's own sets and rewards.
    rewards_K_N2 = np.array([[fields[N1 + l * N2 + i]["spiral_reward"] for i in range(N2)] for l in range(K)])
    search_N1, aggregation_K_N2 = spiral_advantages(np.array(sets_K_n), rewards_K_N2=rewards_K_N2, N1=N1)
    proto_adv = verl_spiral.spiral_advantages_for_verl(
        {"uid": np.array(["p"] * len(rows), dtype=object),
         **verl_spiral.columns_from_extra_fields(fields)}, torch.ones(len(rows), 1))[:, 0]
    assert np.allclose(proto_adv.numpy(), np.concatenate([search_N1, aggregation_K_N2.ravel()]), atol=1e-7)
    assert np.abs(search_N1).max() > 0


def test_the_search_prompt_is_the_row_s_prompt_and_an_aggregation_prompt_never_loses_the_problem(tokenizer):
    """The search prompt is the row's chat messages (capped as verl caps prompts, were one too long); an aggregation
    prompt over the cap loses the ends of its traces, not its front, where the problem is (verl's own cap would)."""
    problem = "What is 3 + 4? Add 3 and 4, then report the sum of the two numbers."
    full = rollout.chat_prompt_ids(tokenizer, rollout.search_prompt(problem))
    rows, server = run_agent_loop(tokenizer, {1}, composed(), row=prepared_row(problem))
    assert server.prompts[0] == full and rows[0].prompt_ids == full
    template_and_problem = len(rollout.chat_prompt_ids(tokenizer, rollout.aggregation_prompt(problem, [""] * n)))
    cap = template_and_problem + 3  # room for 3 of the n x L trace tokens
    rows, server = run_agent_loop(tokenizer, {1}, composed(f"data.max_prompt_length={cap}"), row=prepared_row(problem))
    aggregation = [tokenizer.decode(p) for p in server.prompts[N1:]]
    assert len(aggregation) == K * N2 and all(len(p) <= cap for p in server.prompts[N1:])
    assert all(f"Problem:\n\n{problem}\n\nSolution 1:" in text and text.endswith(
        "within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n") for text in aggregation)
    assert any("GOOD" in text or "BAD" in text for text in aggregation)  # what fits of the traces stays
    server = StandInServer(tokenizer, {1})  # a row SpiralDataset would have dropped: its search prompt is cut as verl
    with pytest.raises(TaskError, match="should have been filtered"):  # cuts it, its aggregation prompt is refused
        run_agent_loop(tokenizer, {1}, composed("data.max_prompt_length=10"), row=prepared_row(problem), server=server)
    assert server.prompts[0] == full[-10:] and len(server.prompts) == N1


class FixedReplies:
    """verl's server client with fixed replies: `search_ids[j]` to the j-th search request, `aggregation_ids` to every
    aggregation request."""

    def __init__(self, search_ids, aggregation_ids):
        self.search_ids, self.aggregation_ids, self.prompts = search_ids, aggregation_ids, []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        self.prompts.append(list(prompt_ids))
        ids = self.search_ids[len(self.prompts) - 1] if len(self.prompts) <= N1 else self.aggregation_ids
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=0,
                           extra_fields={"min_global_steps": 3, "max_global_steps": 4})


def test_an_aggregation_prompt_holds_each_trace_as_its_row_trains_it(tokenizer):
    """A set's aggregation prompt holds its search traces as their rows hold them: the first L tokens
    (data.max_response_length) of what the server returned, decoded without special tokens. A trace that ran past L
    is shown cut at L, and a short one's EOS (and the filler after it) is not text inside the solution."""
    eos = tokenizer.eos_token_id
    short = tokenizer.encode("GOOD \\boxed{1}", add_special_tokens=False) + [eos] * 20
    long = tokenizer.encode(" ".join(["seven"] * (3 * L)) + " \\boxed{7}", add_special_tokens=False) + [eos]
    assert short.index(eos) < L < len(long) - 1  # an EOS inside the row's tokens; a trace past L
    search_ids = [short if j % 2 == 0 else long for j in range(N1)]
    server = FixedReplies(search_ids, tokenizer.encode("\\boxed{1}", add_special_tokens=False) + [eos])
    problem = "What is 3 + 4?"
    rows, _ = run_agent_loop(tokenizer, set(), composed(), row=prepared_row(problem), server=server)
    assert [r.response_ids for r in rows[:N1]] == [ids[:L] for ids in search_ids]
    texts = [tokenizer.decode(ids[:L], skip_special_tokens=True) for ids in search_ids]
    assert texts[0] == "GOOD \\boxed{1}" and "boxed{7}" not in texts[1]
    for l in range(K):
        G = rows[N1 + l * N2].extra_fields["set_members"]
        expected = rollout.chat_prompt_ids(tokenizer, rollout.aggregation_prompt(problem, [texts[j] for j in G]))
        assert all(server.prompts[N1 + l * N2 + i] == expected for i in range(N2))


def test_set_draws_are_reproducible_per_prompt_and_step(tokenizer):
    config = composed()
    a, _ = run_agent_loop(tokenizer, {0}, config, index=5)
    b, _ = run_agent_loop(tokenizer, {0}, config, index=5)
    c, _ = run_agent_loop(tokenizer, {0}, config, index=6)
    members = [[r.extra_fields["set_members"] for r in rows[N1::N2]] for rows in (a, b, c)]
    assert members[0] == members[1] and members[0] != members[2]


# ----------------------------------------------------------------------------------------------------------------------
# A real TransferQueue on a local Ray


@pytest.fixture(scope="module")
def transfer_queue():
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # Logical CPUs for scheduling: the TransferQueue controller and its 2 storage units take one each.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


def put_rows(uid, rows):
    """As verl's AgentLoopWorkerTQ._agent_loop_postprocess puts one session's outputs: key uid_session_i, the fields
    of AgentLoopOutput.as_dict plus the prompt's, and the tags (with the staleness fields from extra_fields)."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields, tags = [], [], []
    for i, row in enumerate(rows):
        field = row.as_dict()
        field.update(uid=uid, session_id=0, global_steps=1)
        field["loss_mask"] = field["response_mask"]
        field["input_ids"] = torch.cat([field["prompts"], field["responses"]])
        field["attention_mask"] = torch.ones_like(field["input_ids"])
        field["position_ids"] = torch.arange(len(field["input_ids"]))
        field["rm_scores"] = torch.zeros(len(field["responses"]))
        keys.append(f"{uid}_0_{i}")
        fields.append(field)
        tags.append({"status": "success", "prompt_len": len(field["prompts"]), "response_len": len(field["responses"]),
                     "seq_len": len(field["input_ids"]), "global_steps": 1,
                     "min_global_steps": field["extra_fields"].get("min_global_steps"),
                     "max_global_steps": field["extra_fields"].get("max_global_steps")})
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)


def test_a_padded_batch_through_compute_advantage_and_compute_metrics(transfer_queue, tokenizer):
    """Two prompts' sessions, padded by verl's upsample_batch_to_divisible_size (copies of row 0's SPIRAL fields under
    a new uid); the real _compute_advantage and _compute_metrics of the registered trainer on them."""
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1 import get_trainer_cls

    config = composed()
    sessions = [run_agent_loop(tokenizer, good, config, index=i)[0] for i, good in enumerate([{0, 2}, {3}])]
    metas = [put_rows(f"prompt-{i}", rows) for i, rows in enumerate(sessions)]
    batch = KVBatchMeta(keys=[k for m in metas for k in m.keys], tags=[t for m in metas for t in m.tags],
                        partition_id="train")
    padded = upsample_batch_to_divisible_size(batch, 32, tokenizer.eos_token_id)
    assert len(padded) == 32 and sum(t.get("is_padding", False) for t in padded.tags) == 32 - 2 * (N1 + K * N2)
    main_spiral.register_spiral()
    trainer = get_trainer_cls("spiral_sync")(config=config)
    metrics = {}
    trainer._compute_advantage(padded, metrics)
    adv = tq.kv_batch_get(keys=padded.keys, partition_id="train", select_fields=["advantages", "returns"])
    real_adv, real_rewards = [], []  # over the real rows only: what the spiral/* columns are
    for s, rows in enumerate(sessions):  # each real row: its prompt's spiral_advantages on every response token
        fields = [r.extra_fields for r in rows]
        rewards_K_N2 = np.array([[fields[N1 + l * N2 + i]["spiral_reward"] for i in range(N2)] for l in range(K)])
        sets_K_n = np.array([fields[N1 + l * N2]["set_members"] for l in range(K)])
        expected = np.concatenate([a.ravel() for a in spiral_advantages(sets_K_n, rewards_K_N2=rewards_K_N2, N1=N1)])
        real_adv.extend(expected.tolist())
        real_rewards.extend(rewards_K_N2.ravel().tolist())
        for i, value in enumerate(expected):
            row = adv["advantages"][s * len(rows) + i]
            assert torch.equal(row, torch.full((L,), float(np.float32(value))))
    for i in range(2 * (N1 + K * N2), 32):  # padding rows: advantage 0, no gradient
        assert not adv["advantages"][i].any() and not adv["returns"][i].any()
    assert metrics["spiral/padding_rows"] == 32 - 2 * (N1 + K * N2)
    assert metrics["spiral/aggregation_rows"] == 2 * K * N2 and metrics["spiral/search_rows"] == 2 * N1
    zero_share = float(np.mean(np.float32(real_adv) == 0))
    assert 0 < zero_share < 1 and metrics["spiral/zero_advantage_rows"] == pytest.approx(zero_share)  # padding: not
    assert metrics["spiral/aggregation_accuracy"] == pytest.approx(np.mean(real_rewards))  # counted
    # verl's own metrics step, on the same padded batch: the staleness tags came through (no TypeError).
    trainer.resource_pool_manager = type("Pool", (), {"get_n_gpus": lambda self: 1})()
    step_metrics = {"actor/grad_norm": 1.0}
    trainer._compute_metrics(padded, step_metrics, {"step": 1.0, "gen": 0.5}, global_steps=5, epoch=0)
    assert step_metrics["training/off_policy/trajectory_staleness/mean"] == (5 - 1) - 4
    assert step_metrics["training/off_policy/trajectory_spans/max"] == 2


def test_the_spiral_trainer_runs_verl_s_sync_code_paths():
    """verl branches on trainer_mode == "sync" (its replay buffer, the dataloader's fetch size, what a checkpoint
    holds): the trainer registered as "spiral_sync" runs as verl's synchronous trainer."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    trainer = main_spiral.register_spiral()(config=composed())
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.parameter_sync_step == 1


def test_the_entry_point_s_task_runner_resolves_the_trainer_and_gets_to_the_gpus(transfer_queue, tmp_path,
                                                                                 monkeypatch):
    """The TaskRunner's run(), in this process (its Ray actor's body), from a registry without "spiral_sync": it
    registers the trainer mode itself, builds SpiralPPOTrainer, loads the tokenizer and prepare_data's parquet, and
    stops where verl asks Ray for GPUs."""
    from verl.trainer.ppo.v1 import trainer_base

    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums", "--test", "aime2024"]) == 0
    monkeypatch.delitem(trainer_base.TRAINER_REGISTRY, "spiral_sync", raising=False)
    monkeypatch.setattr(verl_spiral, "_TRAINER", None)
    reached = {}

    def needs_gpus(self):
        reached["trainer"], reached["rows"] = type(self), len(self.train_dataloader.dataset)
        raise RuntimeError("needs GPUs")

    monkeypatch.setattr(trainer_base.PPOTrainer, "_init_resource_pool_mgr", needs_gpus)
    monkeypatch.setattr(tq, "init", lambda *a, **k: None)  # the fixture's TransferQueue; tq.close stays the fixture's
    monkeypatch.setattr(tq, "close", lambda: None)
    config = composed(f"data.train_files={tmp_path}/tiny_sums.parquet", f"data.val_files={tmp_path}/tiny_sums.parquet")
    runner = main_spiral.SpiralTaskRunner.__ray_actor_class__()
    with pytest.raises(RuntimeError, match="needs GPUs"):
        runner.run(config)
    assert reached["trainer"].__name__ == "SpiralPPOTrainer" and reached["rows"] > 0


# ----------------------------------------------------------------------------------------------------------------------
# The trainer YAML


def test_the_composed_yaml_passes_verl_s_validation_up_to_the_missing_rollout_engine():
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = composed()
    main_spiral.check_spiral_config(config)
    assert not need_critic(config) and not need_reference_policy(config)
    with pytest.raises(ValueError, match="vllm version None not supported and SGLang also not Found"):
        validate_config(config=config, use_reference_policy=False, use_critic=False)
    paper = composed(*[f"{k}={v}" for k, v in [("data.train_batch_size", 256), ("spiral.num_search", 8),
                                               ("spiral.set_size", 4), ("spiral.num_sets", 4),
                                               ("spiral.num_aggregations", 4), ("data.max_response_length", 4096),
                                               ("actor_rollout_ref.actor.loss_scale_factor", 4096),
                                               ("data.max_prompt_length", 17408),
                                               ("actor_rollout_ref.actor.ppo_mini_batch_size", 6144)]])
    main_spiral.check_spiral_config(paper)  # the shipped values, as run_spiral_qwen3_4b_8gpu.sh passes them


def script_overrides(script: str) -> list[str]:
    """The Hydra overrides a run script hands main_spiral (its shell variables as NNODES=1 would set them)."""
    text = (ROOT / "recipe/spiral" / script).read_text()
    for variable, value in [('"$NNODES"', "1"), ('"$BATCH"', "256"), ("$((BATCH * 24))", "6144")]:
        text = text.replace(variable, value)
    command = text[text.index("\npython -m recipe.spiral.main_spiral"):].replace("\\\n", " ").split()
    return [word for word in command if "=" in word and not word.startswith("+")]


@pytest.mark.parametrize("script", ["run_spiral_qwen3_4b_8gpu.sh", "run_spiral_qwen3_4b_multinode.sh"])
def test_a_run_script_trains_the_paper_s_two_epochs_and_saves_at_the_last_step(script, monkeypatch):
    """verl's own loop (PPOTrainer.fit) on the run script's settings over math_train: every step of 2 epochs, the last
    one saved. SpiralDataset may drop some problems; the steps then follow (total_training_steps is null)."""
    from tests.test_verl_spiral import verl_fit_steps

    with initialize_config_dir(config_dir=str(ROOT / "recipe/spiral/config"), version_base=None):
        config = compose("spiral_trainer", overrides=script_overrides(script))
    main_spiral.check_spiral_config(config)
    trainer, batch = config.trainer, config.data.train_batch_size
    for rows in (len(problemset.load_problems("math_train")), 7000):  # all 7,470 fit, or fewer
        assert verl_spiral.run_length_problem(rows, batch, trainer.total_epochs, trainer.total_training_steps) is None
        ran, saved = verl_fit_steps(monkeypatch, rows, batch, trainer.total_epochs, trainer.total_training_steps,
                                    save_freq=trainer.save_freq)
        steps = 2 * (rows // 256)
        assert ran == list(range(1, steps + 1)) and saved[-1] == steps and len(saved) == -(-steps // 10)


@pytest.mark.parametrize("override, key", [
    ("algorithm.adv_estimator=gae", "critic.enable"),
    ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=10", "actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n"),
    ("actor_rollout_ref.actor.loss_agg_mode=token-mean", "actor_rollout_ref.actor.loss_agg_mode"),
    ("actor_rollout_ref.actor.loss_scale_factor=4096", "actor_rollout_ref.actor.loss_scale_factor"),
    ("trainer.v1.trainer_mode=sync", "trainer.v1.trainer_mode"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent", "default_agent_loop"),
    ("algorithm.rollout_correction.loss_type=ppo_clip", "algorithm.rollout_correction.loss_type"),
    ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_kl_loss"),
    ("actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.top_p"),
    ("data.max_prompt_length=10", "data.max_prompt_length"),
    ("spiral.num_sets=7", "spiral.num_sets"),
])
def test_an_override_that_breaks_the_update_is_refused(override, key):
    if override.startswith("algorithm.adv_estimator"):
        config = composed(override, "critic.enable=null")
    else:
        config = composed(override)
    with pytest.raises(ValueError, match=key):
        main_spiral.check_spiral_config(config)


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs must be 1"),
    ("trainer.n_gpus_per_node=8", "data.train_files: no file runs/verl-data/math_train.parquet"),
])
def test_the_entry_point_refuses_in_one_line_before_ray_starts(override, message, tmp_path):
    """As run_spiral_*.sh starts it: a broken setting or missing data is one line (not Hydra's traceback), exit 2."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "recipe.spiral.main_spiral", override], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if not line.startswith("WARNING:")]  # verl's: no GPU here
    assert len(errors) == 1 and errors[0].startswith("main_spiral.py: error: ") and message in errors[0], errors


def test_prepare_data_replaces_only_its_own_files(tmp_path, capsys):
    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums", "--test", "aime2024"]) == 0
    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums", "--test", "aime2024"]) == 0  # its own
    (tmp_path / "math500.parquet").write_bytes(b"a user's file")
    before = (tmp_path / "tiny_sums.parquet").read_bytes()
    capsys.readouterr()
    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums"]) == 2
    err = capsys.readouterr().err
    assert "math500.parquet exists and was not written by prepare_data.py" in err and err.count("\n") == 1
    assert (tmp_path / "math500.parquet").read_bytes() == b"a user's file"
    assert (tmp_path / "tiny_sums.parquet").read_bytes() == before  # nothing written: the check comes first


def test_prepare_data_writes_verl_s_schema_and_the_reward_function_grades_it(tmp_path):
    import pandas as pd

    from recipe.spiral.reward_fn import compute_score

    assert prepare_data.main(["--out", str(tmp_path), "--train", "tiny_sums", "--test", "aime2024"]) == 0
    frame = pd.read_parquet(tmp_path / "tiny_sums.parquet")
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = frame.iloc[3]
    assert row["prompt"][0]["content"] == rollout.search_prompt(row["extra_info"]["problem"])
    assert row["extra_info"]["index"] == 3 and row["reward_model"]["style"] == "rule"
    gold = row["reward_model"]["ground_truth"]
    assert compute_score(row["data_source"], f"so \\boxed{{{gold}}}", gold) == 1.0
    assert compute_score(row["data_source"], "so \\boxed{-1}", gold) == 0.0
    assert len(pd.read_parquet(tmp_path / "aime2024.parquet")) == 30
    assert prepare_data.main(["--out", str(tmp_path / "x"), "--train", "no-such-set"]) == 2
    assert not (tmp_path / "x").exists()  # nothing written when an input is bad


@pytest.mark.parametrize("train, test, message", [
    ("a/sums.jsonl", "b/sums.jsonl", "would both be written to"),
    ("math500", "math500", "would both be written to"),
    ("EMPTY.jsonl", "aime2024", "--train EMPTY.jsonl: no problems in it"),
    ("aime2024", "EMPTY.jsonl", "--test EMPTY.jsonl: no problems in it"),
])
def test_prepare_data_never_writes_two_splits_to_one_file_or_an_empty_split(tmp_path, monkeypatch, capsys, train,
                                                                            test, message):
    monkeypatch.chdir(tmp_path)
    for folder in "ab":
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "sums.jsonl").write_text('{"problem": "1 + %d", "answer": "%d"}\n' % (len(folder), 2))
    (tmp_path / "EMPTY.jsonl").write_text("\n")
    assert prepare_data.main(["--out", "out", "--train", train, "--test", test]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare_data.py: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_prepare_data_maps_a_file_s_columns_as_train_py_does(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"question": "What is 2 + 2?", "solution": 4}\n')
    assert prepare_data.main(["--out", "out", "--train", "mine.jsonl", "--test", "aime2024",
                              "--data-columns", "problem=question,answer=solution"]) == 0
    row = pd.read_parquet(tmp_path / "out/mine.parquet").iloc[0]
    assert row["extra_info"]["problem"] == "What is 2 + 2?" and row["reward_model"]["ground_truth"] == "4"
    assert prepare_data.main(["--out", "out2", "--train", "mine.jsonl", "--test", "aime2024"]) == 2  # unmapped
    assert not (tmp_path / "out2").exists()


def test_the_recipe_pins_the_verl_it_was_checked_against():
    import importlib.metadata

    required = (ROOT / "recipe/spiral/REQUIRED_VERL.txt").read_text().split()
    assert required == [f"verl=={importlib.metadata.version('verl')}"] == ["verl==0.9.1"]
    assert sys.modules["recipe.spiral.main_spiral"].SpiralTaskRunner is main_spiral.SpiralTaskRunner
