#!/usr/bin/env bash
# Registry-free base images (`make local-bases`), for building the project's images where no registry can be
# pulled from:
#
#   localhost/alignflow-base-python:bookworm   Debian bookworm's Python 3.11 from a debootstrap root filesystem
#                                              (python.Dockerfile), standing in for python:3.11-slim-bookworm
#   localhost/alignflow-base-torch-cpu:2.13.0  the same with torch 2.13.0 installed from a local wheel
#                                              (torch-cpu.Dockerfile): the trainer image's base for a CPU build
#
# Then: `make images BASE_IMAGE=localhost/alignflow-base-python:bookworm
#                   TRAINER_BASE_IMAGE=localhost/alignflow-base-torch-cpu:2.13.0`.
# Needs root (debootstrap), Debian's package mirror, and docker, buildah or podman. Settings:
#   TORCH_WHEEL      the torch wheel to install (default: what `pip download torch==2.13.0` finds, a local file first)
#   DEBIAN_MIRROR    debootstrap's mirror (default: debootstrap's own, deb.debian.org)
#   PIP_CA_BUNDLE    a proxy's CA bundle for pip (a build secret, as in images/build.sh)
#   BASES_DIR        where the root filesystem and build contexts go (default build/bases; the rootfs is reused)
set -euo pipefail
cd "$(dirname "$0")/../.."
. images/builder.sh

dir=${BASES_DIR:-build/bases}
python_base=localhost/alignflow-base-python:bookworm
torch_base=localhost/alignflow-base-torch-cpu:2.13.0
mkdir -p "$dir/python" "$dir/torch"

if [ ! -f "$dir/python/rootfs.tar" ]; then
  [ "$(id -u)" = 0 ] || { echo "images/bases: debootstrap needs root" >&2; exit 2; }
  command -v debootstrap >/dev/null || { echo "images/bases: no debootstrap (apt-get install debootstrap)" >&2; exit 2; }
  rm -rf "$dir/rootfs"
  echo "== debootstrap bookworm (about a minute)" >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$dir/rootfs" \
    ${DEBIAN_MIRROR:-} >"$dir/debootstrap.log" 2>&1 || { tail -5 "$dir/debootstrap.log" >&2; exit 1; }
  rm -rf "$dir"/rootfs/var/cache/apt/archives/*.deb "$dir"/rootfs/var/lib/apt/lists/*
  tar -C "$dir/rootfs" -cf "$dir/python/rootfs.tar.partial" . && mv "$dir/python/rootfs.tar.partial" "$dir/python/rootfs.tar"
  rm -rf "$dir/rootfs"
fi
cp images/bases/python.Dockerfile "$dir/python/Dockerfile"
"${build[@]}" -f "$dir/python/Dockerfile" -t "$python_base" "$dir/python"

wheel=${TORCH_WHEEL:-}
if [ -z "$wheel" ]; then
  rm -f "$dir"/torch/torch-*.whl
  python3 -m pip download --quiet --no-deps --dest "$dir/torch" torch==2.13.0
  wheel=$(ls "$dir"/torch/torch-*.whl)
elif [ "$wheel" != "$dir/torch/$(basename "$wheel")" ]; then
  rm -f "$dir"/torch/torch-*.whl && cp "$wheel" "$dir/torch/"
fi
cp images/bases/torch-cpu.Dockerfile "$dir/torch/Dockerfile"
cp constraints.txt images/pip_install.sh "$dir/torch/"
"${build[@]}" "${secret[@]}" --build-arg "BASE_IMAGE=$python_base" -f "$dir/torch/Dockerfile" -t "$torch_base" \
  "$dir/torch"
echo "$python_base $torch_base"
