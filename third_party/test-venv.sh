#!/bin/sh
# The test venv: the PyPI packages of the S3 tests (third_party/test-python.txt, pinned: moto's server
# mode), build/test/venv unless a folder is given. `make deps` runs this; without PyPI it says so, and
# the S3 tests say they were skipped.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/python-venv.sh" test "$here/test-python.txt" "${1:-$(dirname "$here")/build/test/venv}"
