from haze import define_cache_config

config = define_cache_config(default="kv", stores={"kv": {"driver": "kv", "binding": "KV"}})
