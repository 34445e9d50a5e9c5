#!/usr/bin/env bash
# SPIRAL on NNODES nodes of 8 GPUs each, through a Ray cluster that is already up: on the head node
#     ray start --head --port 6379
# on every other node
#     ray start --address HEAD_IP:6379
# then, on the head node, NNODES=4 bash recipe/spiral/run_spiral_qwen3_4b_multinode.sh. Every node needs this
# repository at the same path (or a shared file system), the same environment (REQUIRED_VERL.txt) and the data
# (python -m recipe.spiral.prepare_data --out runs/verl-data). |B| grows with the nodes here (256 prompts per 8 GPUs);
# the mini-batch follows it (one optimizer step per batch), and the paper's 2 epochs are 2 x (the problems that fit //
# |B|) steps. Extra arguments are Hydra overrides. Not run here.
set -euo pipefail
case " $* " in  # --help: the comment above, and nothing else
    *" -h "* | *" --help "*) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print } /^set /{ exit }' "$0"; exit 0;;
esac
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# at most 4 digits: bash arithmetic wraps around at 2**63, and 256 x NNODES x 24 must stay a plain number
[[ "${NNODES:-}" =~ ^[1-9][0-9]{0,3}$ ]] || {
    echo "$(basename "$0"): error: set NNODES to the number of nodes (1 to 9999), got '${NNODES:-}'" >&2
    exit 2
}
BATCH=$((256 * NNODES))

python -m recipe.spiral.main_spiral \
    trainer.nnodes="$NNODES" trainer.n_gpus_per_node=8 \
    +ray_kwargs.ray_init.address=auto \
    data.train_batch_size="$BATCH" actor_rollout_ref.actor.ppo_mini_batch_size=$((BATCH * 24)) \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    trainer.total_epochs=2 trainer.total_training_steps=null \
    "$@"
