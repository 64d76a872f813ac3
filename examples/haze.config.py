"""Build settings of the example app (`haze build --preset …`).

The ``cloudflare.wrangler`` section is merged into ``dist/wrangler.json`` by ``haze
build --preset cloudflare``: the queue the ``cloudflare`` connection's ``QUEUE`` binding
produces to, its consumer's batching, the D1 database the Worker binds, and the Worker's
``vars``. The consumer's ``max_retries`` and dead-letter queue are derived from the jobs
(the most ``tries`` - 1), so they are not repeated here. The top-level ``wrangler.toml``
is the same Worker for ``npx wrangler deploy`` from the repository root.

The vars are the app's ``cloudflare`` environment: the same config files as on a laptop
(``env("QUEUE_CONNECTION", "database")``, ``env("DATABASE_URL", "sqlite:///…")``), read
in the Worker with these values. So the Worker dispatches to Cloudflare Queues (from
``fetch()`` and from inside jobs), consumes them in ``queue()``, and keeps its locks,
batches, failed jobs and the jobs' own ``outcomes`` rows in the D1 database bound as
``DB``. ``haze build`` reads the config with these vars too and warns about anything a
Worker cannot reach.
"""

from haze import define_haze_config

config = define_haze_config(
    cloudflare={
        "wrangler": {
            "name": "haze-example",
            "queues": {
                "producers": [{"binding": "QUEUE", "queue": "haze-example-cloudflare"}],
                "consumers": [
                    {
                        "queue": "haze-example-cloudflare",
                        "max_batch_size": 10,
                        "max_batch_timeout": 5,
                    }
                ],
            },
            # The app's cloudflare environment (see the docstring).
            "vars": {"QUEUE_CONNECTION": "cloudflare", "DATABASE_URL": "d1://DB"},
            # `npx wrangler d1 create haze-example` prints the id to put here.
            "d1_databases": [
                {
                    "binding": "DB",
                    "database_name": "haze-example",
                    "database_id": "00000000-0000-0000-0000-000000000000",
                }
            ],
        }
    }
)
