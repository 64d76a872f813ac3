"""The concurrency-limit test's worker app: one ``database`` and one ``redis`` connection,
each with the same backend's shared store for the slots, pointed by environment variables
at the test's database, tables and Redis prefix (see ``test_concurrency_procs.py``).

Queue ``limited`` has a per-queue limit of 3 (``CLS_QUEUE_LIMIT``), for the run that
proves the config form; the middleware run uses queue ``default``, and so does the
``group`` run, whose jobs are all in one group limited to 3 by ``groups``.
"""

from haze import define_queue_config, env

_limit = {
    "concurrency": int(env("CLS_QUEUE_LIMIT", "3")),
    "release_after": "100ms",
    "expire_after": env("CLS_EXPIRE_AFTER", "6s"),
}

#: Per-group limits (the ``group`` runs put every job in group "tenant-1").
_groups = {
    "concurrency": int(env("CLS_QUEUE_LIMIT", "3")),
    "expire_after": env("CLS_EXPIRE_AFTER", "6s"),
}

config = define_queue_config(
    default=env("CLS_CONNECTION", "db"),
    store=env("CLS_STORE", "db"),
    connections={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("CLS_TABLE", "cls_jobs"),
            "failed_table": env("CLS_FAILED_TABLE", "cls_failed_jobs"),
            "retry_after": env("CLS_RETRY_AFTER", "3s"),
            "sleep": "100ms",
            "max_sleep": "300ms",
            "queues": {"default": {}, "limited": _limit},
            "groups": _groups,
        },
        "r": {
            "driver": "redis",
            "url": env("CLS_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("CLS_PREFIX", "cls"),
            "queues": {"default": {}, "limited": _limit},
            "groups": _groups,
            "retry_after": env("CLS_RETRY_AFTER", "3s"),
        },
    },
)
