"""Fixtures for the deployment tests (tests/deploy): the pagellm binary, as in tests/server.

The binary is $PAGELLM_BIN (CTest sets it) or build/cpu/tools/pagellm; a missing binary fails the
tests that run it. The tools of scripts/requirements-deploy.txt must be installed in the
interpreter's environment (scripts/check-deploy.sh does it); without them the tests fail too.
"""
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN_LLAMA = os.path.join(ROOT, "tests", "data", "golden", "llama")


@pytest.fixture(scope="session")
def pagellm_bin():
    path = os.environ.get("PAGELLM_BIN") or os.path.join(ROOT, "build", "cpu", "tools", "pagellm")
    if not os.access(path, os.X_OK):
        pytest.fail(f"pagellm binary not found at {path} (build it, or set PAGELLM_BIN)")
    return path
