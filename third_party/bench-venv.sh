#!/bin/sh
# The bench venv: the PyPI packages of make bench's Hugging Face baseline (third_party/bench-python.txt,
# pinned) in a venv on Debian's /usr/bin/python3 (python3-venv), build/bench/venv unless a folder is
# given. Kept while it was made from the same requirements (a copy of them is its stamp), so a second
# run is instant; `make deps-bench` and tests/bench/data.lua run this.
#   bench-venv.sh [VENV [REQUIREMENTS]]   another requirements file makes another venv the same way
#                                         (the tokenizer oracles: third_party/tokenizer-python.txt)
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-$(dirname "$here")/build/bench/venv}"
requirements="${2:-$here/bench-python.txt}"
stamp="$venv/requirements.txt"

if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  echo "bench venv: $venv is up to date"
  exit 0
fi
[ -x /usr/bin/python3 ] || { echo "bench venv: no /usr/bin/python3 (make deps-bench installs python3-venv)" >&2; exit 1; }
echo "bench venv: creating $venv from $requirements"
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv" || { echo "bench venv: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" ||
  { echo "bench venv: pip install failed (is PyPI reachable?)" >&2; rm -rf "$venv"; exit 1; }
cp "$requirements" "$stamp"
