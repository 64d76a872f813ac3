from haze import define_database_config, env

config = define_database_config(
    default="main",
    connections={"main": {"url": env("DATABASE_URL", "sqlite:///storage/app.db")}},
)
