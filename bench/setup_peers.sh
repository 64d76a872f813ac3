#!/usr/bin/env bash
# Peers whose dependencies clash with the workspace get venvs of their own under
# bench/.venvs (gitignored). Run once before bench/sql.py and bench/redis.py; it is
# idempotent (a venv that is already there is left alone; delete it to refresh).
#
# Every Redis peer gets its own venv, so each resolves its newest release: arq pins
# redis<6 while bullmq 3 and celery 5.7 need redis-py>=6, and a shared venv would pull
# in old releases of the others. hiredis goes into each, as in the reference peer
# harness (shared/tools/peerbench): redis-py uses it when present.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p .venvs

venv() {  # venv NAME PACKAGE...
    local name=$1
    shift
    if [ ! -x ".venvs/$name/bin/python" ]; then
        uv venv -q -p 3.11 ".venvs/$name"
        if ! uv pip install -q -p ".venvs/$name/bin/python" "$@"; then
            rm -rf ".venvs/$name"  # no half-made venv: the next run tries again
            echo "could not install $* into bench/.venvs/$name" >&2
            return 1
        fi
    fi
}

venv procrastinate "procrastinate>=3" "psycopg[binary]"
venv pgqueuer "pgqueuer>=0.20" asyncpg
# Redis peers (bench/redis.py). haze itself: an editable install of this tree's runtime
# with the redis extra plus hiredis (which the peers get too), and the uvloop extra for
# the haze-uvloop rows; bench/redis.py falls back to the workspace venv when this one is
# missing.
venv haze -e ../runtime"[redis,cli,uvloop]" hiredis
# A haze venv made before the uvloop extra: add it (the venv is otherwise left alone).
if ! .venvs/haze/bin/python -c "import uvloop" 2>/dev/null; then
    uv pip install -q -p .venvs/haze/bin/python -e ../runtime"[redis,cli,uvloop]"
fi
venv bullmq "bullmq>=3,<4" hiredis
venv huey "huey>=2" redis hiredis
venv dramatiq "dramatiq[redis]" hiredis
venv saq "saq[redis]" hiredis typing_extensions
venv celery "celery[redis]" hiredis
venv rq "rq" hiredis
venv arq "arq" hiredis
venv rawredis redis hiredis
# The durable-workflow peer (bench/workflows.py): DBOS runs its steps on PostgreSQL.
venv dbos "dbos>=1" "psycopg[binary]"
echo "peer venvs ready in bench/.venvs"
