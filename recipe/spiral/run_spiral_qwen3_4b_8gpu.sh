#!/usr/bin/env bash
# SPIRAL on one node of 8 GPUs (the paper's setting: Qwen3-4B-Instruct-2507, |B| = 256, N1 = 8, n = 4, K = 4, N2 = 4,
# L = 4096), for the paper's 2 epochs: 2 x (the math_train problems that fit // 256) steps, 58 at most, with a save
# at the last. Needs verl==0.9.1 (REQUIRED_VERL.txt) with verl[verl-core] and a rollout engine (verl[vllm] or
# sglang), and the data, written once by: python -m recipe.spiral.prepare_data --out runs/verl-data. Run from
# anywhere. Not run here: no GPU. Extra arguments are Hydra overrides (e.g. trainer.total_training_steps=10: at most
# the steps of the epochs); every setting is listed by python -m recipe.spiral.main_spiral --help. main_spiral checks
# them (and the data) before anything starts.
set -euo pipefail
case " $* " in  # --help: the comment above, and nothing else
    *" -h "* | *" --help "*) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print } /^set /{ exit }' "$0"; exit 0;;
esac
cd "$(dirname "$0")/../.."                       # the repository root: recipe.spiral, verl_spiral and the grader
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # Ray's workers import the project from here

python -m recipe.spiral.main_spiral \
    trainer.nnodes=1 trainer.n_gpus_per_node=8 \
    data.train_batch_size=256 actor_rollout_ref.actor.ppo_mini_batch_size=6144 \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    trainer.total_epochs=2 trainer.total_training_steps=null \
    "$@"
