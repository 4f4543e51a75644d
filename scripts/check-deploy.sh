#!/usr/bin/env bash
# Checks the deployment files (docker/, deploy/kubernetes/, deploy/helm/pagellm/): installs the
# pinned tools of scripts/requirements-deploy.txt into .venv (created by scripts/setup.sh; nothing
# is installed when they are already there), then runs tests/deploy/deploy_check.py: the Dockerfile,
# shell and YAML linters, `helm lint` and `helm template` of the chart for every stage, and every
# object against the Kubernetes schemas, deploy/schemas/ and the others. Offline once installed.
#   scripts/check-deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  echo "check-deploy: .venv is missing: run scripts/setup.sh first" >&2
  exit 1
fi
stamp=.venv/.requirements-deploy-installed
if [ ! -f "$stamp" ] || ! cmp -s scripts/requirements-deploy.txt "$stamp"; then
  .venv/bin/pip install -q -r scripts/requirements-deploy.txt
  cp scripts/requirements-deploy.txt "$stamp"
fi
exec .venv/bin/python tests/deploy/deploy_check.py
