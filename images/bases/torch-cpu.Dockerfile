# A CPU PyTorch base for the trainer image where no CUDA base can be pulled: the Python base plus a local torch
# wheel (the build context is the folder holding it). The lock pins `torch==2.13.0`, which a `2.13.0+cpu` build
# satisfies, so the trainer image keeps this torch instead of fetching PyPI's CUDA build.
ARG BASE_IMAGE=localhost/alignflow-base-python:bookworm
FROM ${BASE_IMAGE}
COPY torch-*.whl constraints.txt pip_install.sh /tmp/wheels/
# Through the lock, with the proxy's CA as a build secret when given (images/pip_install.sh).
RUN --mount=type=secret,id=pip_ca /tmp/wheels/pip_install.sh /tmp/wheels/torch-*.whl && rm -rf /tmp/wheels
