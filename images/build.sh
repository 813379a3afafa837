#!/usr/bin/env bash
# Build the trainer, launcher and MLflow images (`make images`) with whatever builder this machine has: docker with
# a running daemon, else buildah, else podman. Settings, from the environment or as make variables
# (`make images LAUNCHER_BASE_IMAGE=mirror.corp/python:3.11-slim-bookworm`):
#
#   BUILDER              docker | buildah | podman (default: the first of them that works here)
#   IMAGE_REGISTRY       the tags' prefix (default ghcr.io/alignflow, the chart's default repositories)
#   IMAGE_TAG            the trainer's and launcher's tag (default latest); the MLflow image is tagged with the MLflow
#                        version of the lock, as the chart's mlflow.image.tag expects
#   BASE_IMAGE           the base of all three (default: each Dockerfile's own, python:3.11-slim-bookworm)
#   TRAINER_BASE_IMAGE, LAUNCHER_BASE_IMAGE, MLFLOW_BASE_IMAGE
#                        one image's base (a registry mirror, or a local base: images/bases/build.sh)
#   PIP_CA_BUNDLE        a CA bundle file for pip behind a TLS-intercepting proxy: passed as a build secret, so it
#                        is mounted for the install steps only and is in no layer of the image
#   PUSH=1               push each image after building it
#   DRY_RUN=1            print the build commands instead of running them
#   ONLY                 build only these images (space-separated: trainer launcher mlflow, and trainer-vllm: the
#                        trainer's vLLM variant, tagged <IMAGE_TAG>-vllm, which is not built unless named here)
set -euo pipefail
cd "$(dirname "$0")/.."

. images/builder.sh

mlflow_version=$(sed -n 's/^mlflow==\([0-9.]*\)$/\1/p' constraints.txt)
[ -n "$mlflow_version" ] || { echo "images: constraints.txt pins no mlflow" >&2; exit 2; }
registry=${IMAGE_REGISTRY:-ghcr.io/alignflow}
tag=${IMAGE_TAG:-latest}

build_one() {  # name, image tag, base override, variant
  local name=$1 image=$2 base=$3 variant=${4:-} args=()
  [ -n "$base" ] && args+=(--build-arg "BASE_IMAGE=$base")
  [ -n "$variant" ] && args+=(--build-arg "VARIANT=$variant")
  local command=("${build[@]}" "${args[@]}" "${secret[@]}" -f "images/$name/Dockerfile" -t "$image" .)
  if [ -n "${DRY_RUN:-}" ]; then echo "${command[*]}"; return; fi
  echo "== $name: ${command[*]}" >&2
  "${command[@]}"
  if [ -n "${PUSH:-}" ]; then "${push[@]}" "$image"; fi
}

for name in ${ONLY:-trainer launcher mlflow}; do
  case "$name" in
    trainer) build_one trainer "$registry/trainer:$tag" "${TRAINER_BASE_IMAGE:-${BASE_IMAGE:-}}" ;;
    trainer-vllm) build_one trainer "$registry/trainer:$tag-vllm" "${TRAINER_BASE_IMAGE:-${BASE_IMAGE:-}}" vllm ;;
    launcher) build_one launcher "$registry/launcher:$tag" "${LAUNCHER_BASE_IMAGE:-${BASE_IMAGE:-}}" ;;
    mlflow) build_one mlflow "$registry/mlflow:$mlflow_version" "${MLFLOW_BASE_IMAGE:-${BASE_IMAGE:-}}" ;;
    *) echo "images: ONLY names '$name'; expected trainer, trainer-vllm, launcher or mlflow" >&2; exit 2 ;;
  esac
done
