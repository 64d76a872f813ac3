"""Build settings of the example app (`haze build --preset …`).

The ``cloudflare.wrangler`` section is merged into ``dist/wrangler.json`` by ``haze
build --preset cloudflare``: the queue the ``cloudflare`` connection's ``QUEUE`` binding
produces to, its consumer's batching, and the D1 database the Worker binds. The
consumer's ``max_retries`` and dead-letter queue are derived from the jobs (the most
``tries`` - 1), so they are not repeated here. The top-level ``wrangler.toml`` is the
same Worker for ``npx wrangler deploy`` from the repository root.
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
