#!/bin/sh
# A venv of pinned PyPI packages on Debian's /usr/bin/python3 (python3-venv), never the system Python:
#   third_party/python-venv.sh [--system-site-packages] NAME REQUIREMENTS VENV
# --system-site-packages lets the venv see Debian's packages too (hf-venv.sh: python3-torch), so the
# requirements list only what Debian lacks.
# Kept while it was made from the same requirements (a copy of them is its stamp), so a second run is
# instant. bench-venv.sh (make bench's Hugging Face baseline), test-venv.sh (the tests' moto, tokenizer oracles and pyarrow)
# and hf-venv.sh (transformers, the Llama oracle) use it.
set -eu
venv_flags=""
if [ "${1:-}" = "--system-site-packages" ]; then venv_flags="$1"; shift; fi
name="$1" requirements="$2" venv="$3"
stamp="$venv/requirements.txt"

if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  echo "$name venv: $venv is up to date"
  exit 0
fi
[ -x /usr/bin/python3 ] || { echo "$name venv: no /usr/bin/python3 (make deps installs python3-venv)" >&2; exit 1; }
# Each stage runs quietly (pip for minutes): a line first says what it installs.
packages=$(sed -e 's/[[:space:]]*#.*//' -e 's/[=<>!~;[[:space:]].*//' "$requirements" | grep -v '^$' || true)
count=$(echo $packages | wc -w)
echo "$name venv: [1/2] python3 -m venv${venv_flags:+ $venv_flags} $venv"
rm -rf "$venv"
# shellcheck disable=SC2086
/usr/bin/python3 -m venv $venv_flags "$venv" || { echo "$name venv: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
# shellcheck disable=SC2086
echo "$name venv: [2/2] pip install: $count pinned package(s) of $requirements:" $packages
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" ||
  { echo "$name venv: pip install failed (is PyPI reachable?)" >&2; rm -rf "$venv"; exit 1; }
cp "$requirements" "$stamp"
echo "$name venv: made $venv"
