#!/usr/bin/env bash
# A GLM-4.7-Flash-shaped model (Glm4MoeLiteForCausalLM: GLM-4.7-Flash's multi-latent attention at its own head sizes,
# 64 sigmoid-routed experts with an expert bias, one shared expert, layer 0 dense; ~0.5 B parameters,
# scripts/gpu/make_random_glm47_flash.py) on one H200, trained by the megatron backend and served by real SGLang
# 0.5.17 (its Glm4MoeLiteForCausalLM, MLA on --attention-backend triton) that slime starts on the same GPU; run from
# the repository root:
#
#   source /tmp/slime-env.sh; bash scripts/gpu/glm_flash_shape.sh [make][,rl][,replay]   (default: all; ~5-8 min)
#
# The runs are scripts/gpu/glm_shape.sh's (same flags, limits and environment) on this model, with every file named
# glm_flash_* instead of glm_*: $OUT/glm_flash_shape.log (everything), $OUT/glm_flash_shape.json (the per-step
# trainer/engine logprob gap under "no_replay" and, where this tree has --use-rollout-routing-replay, "replay"),
# $OUT/glm_flash_<run>_summary.json and _metrics.jsonl. The model is kept in $MODEL (/tmp/slime_gpu/glm47_flash_shape).
set -uo pipefail
export MODEL=${MODEL:-/tmp/slime_gpu/glm47_flash_shape}
export GLM_SHAPE_TAG=glm_flash GLM_SHAPE_MAKER=scripts/gpu/make_random_glm47_flash.py
exec bash "$(dirname "$0")/glm_shape.sh" "$@"
