#!/bin/sh
# The test venv: the PyPI packages of the tests (third_party/test-python.txt, pinned: moto's server mode,
# the tokenizer oracles, pyarrow), build/test/venv unless a folder is given. `make deps` runs this, and
# so do the specs and benches that use it; without PyPI it says so, and those tests say they were skipped.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/python-venv.sh" test "$here/test-python.txt" "${1:-$(dirname "$here")/build/test/venv}"
