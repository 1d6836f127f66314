#!/bin/sh
# The Hugging Face oracle's venv: transformers (third_party/hf-python.txt, pinned) over Debian's
# python3-torch, seen through --system-site-packages; build/test/hf-venv unless a folder is given.
# `make deps` runs this, and so does tests/nn/llama_spec.lua; without python3-torch or PyPI it says
# so, and that spec says it was skipped.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "hf venv: Debian's python3-torch is not installed (make deps installs it)" >&2; exit 1; }
exec "$here/python-venv.sh" --system-site-packages hf "$here/hf-python.txt" "${1:-$(dirname "$here")/build/test/hf-venv}"
