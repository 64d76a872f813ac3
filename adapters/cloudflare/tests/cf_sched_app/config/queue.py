from haze import define_queue_config

config = define_queue_config(
    default="cloudflare",
    connections={"cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "kv"}},
    store="kv",
)
