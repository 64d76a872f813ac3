from haze import define_database_config, env

config = define_database_config(
    default="main",
    connections={"main": {"url": env("JSTAT_DB_URL", "sqlite:///storage/jstat.db")}},
)
