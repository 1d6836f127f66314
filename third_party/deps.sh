#!/bin/sh
# Installs the Debian packages of the given groups (build, test, bench) listed in
# third_party/debian-packages.txt, but only those missing, so a second `make deps` is instant; each
# stage (the package lists, the packages) says what it installs before it starts.
# With --missing first, only prints the missing packages of the groups (the Makefile's message).
set -eu
manifest="$(dirname "$0")/debian-packages.txt"
list_only=0
if [ "${1:-}" = "--missing" ]; then list_only=1; shift; fi
groups="${*:-build test}"

missing=""
for group in $groups; do
  for package in $(awk -v g="$group" '$1 == g { print $2 }' "$manifest"); do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      missing="$missing $package"
    fi
  done
done

if [ "$list_only" = 1 ]; then
  echo "${missing# }"
  exit 0
fi

if [ -z "$missing" ]; then
  echo "deps: all packages of [$groups] are installed"
  exit 0
fi

count=$(echo $missing | wc -w)
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install:$missing" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# Each stage runs quietly for minutes: a line first says what it does.
echo "deps: [1/2] apt-get update: the package lists of this machine's sources"
$sudo apt-get update -qq
echo "deps: [2/2] apt-get install: $count package(s):$missing"
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing
echo "deps: installed$missing"
