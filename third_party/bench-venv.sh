#!/bin/sh
# The bench venv: the PyPI packages of make bench's Hugging Face baseline (third_party/bench-python.txt,
# pinned), build/bench/venv unless a folder is given (third_party/python-venv.sh makes it and keeps it
# while its requirements are unchanged); `make deps-bench` and tests/bench/data.lua run this.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/python-venv.sh" bench "$here/bench-python.txt" "${1:-$(dirname "$here")/build/bench/venv}"
