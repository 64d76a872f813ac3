#!/usr/bin/env bash
# Peers whose dependencies clash with the workspace get venvs of their own under
# bench/.venvs (gitignored). Run once before bench/sql.py (and bench/redis.py).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p .venvs
if [ ! -x .venvs/procrastinate/bin/python ]; then
    uv venv -q -p 3.11 .venvs/procrastinate
    uv pip install -q -p .venvs/procrastinate/bin/python "procrastinate>=3" "psycopg[binary]"
fi
echo "peer venvs ready in bench/.venvs"
