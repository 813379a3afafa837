#!/bin/sh
# `pip install` as every image build runs it: through the lock (constraints.txt beside this script, which pins
# the packages and, as PIP_CONSTRAINT, what an isolated build environment installs too), with the proxy's CA
# bundle when the build was given one as the secret `pip_ca` (mounted for that step only, never in a layer).
# ALIGNFLOW_NO_LOCK=1: no lock (the ColossalAI variant, whose pins the lock cannot share).
set -e
if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi
if [ -z "${ALIGNFLOW_NO_LOCK:-}" ]; then PIP_CONSTRAINT="$(dirname "$0")/constraints.txt"; export PIP_CONSTRAINT; fi
exec pip install --no-cache-dir "$@"
