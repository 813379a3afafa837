# Sourced by images/build.sh and images/bases/build.sh: the image builder to use, as an array `build` (and `push`),
# and `secret`: the build secret carrying PIP_CA_BUNDLE (a proxy's CA bundle for pip), when that is set.
# BUILDER picks one (docker | buildah | podman); by default the first that works here: docker with a running daemon,
# else buildah, else podman.

pick_builder() {
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker
  elif command -v buildah >/dev/null 2>&1; then echo buildah
  elif command -v podman >/dev/null 2>&1; then echo podman
  else echo "images: no docker daemon, buildah or podman here (BUILDER picks one)" >&2; return 1; fi
}

builder=${BUILDER:-$( [ -n "${DRY_RUN:-}" ] && echo docker || pick_builder )}
case "$builder" in
  docker) build=(docker build) push=(docker push); export DOCKER_BUILDKIT=1 ;;  # RUN --mount needs BuildKit
  # chroot isolation: buildah needs no daemon, and runs as root without user namespaces.
  buildah) build=(buildah bud --isolation chroot --layers) push=(buildah push) ;;
  podman) build=(podman build) push=(podman push) ;;
  *) echo "images: BUILDER is '$builder'; expected docker, buildah or podman" >&2; exit 2 ;;
esac

secret=()
if [ -n "${PIP_CA_BUNDLE:-}" ]; then
  [ -f "$PIP_CA_BUNDLE" ] || { echo "images: PIP_CA_BUNDLE=$PIP_CA_BUNDLE is not a file" >&2; exit 2; }
  secret=(--secret "id=pip_ca,src=$PIP_CA_BUNDLE")
fi
