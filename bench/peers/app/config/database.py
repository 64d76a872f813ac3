from haze import define_database_config, env

config = define_database_config(
    default="main",
    connections={"main": {"url": env("BENCH_DB_URL", "sqlite:////tmp/haze-bench.db")}},
)
