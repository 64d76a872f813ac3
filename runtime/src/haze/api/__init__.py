"""The public facades: Queue, blocking twins, health, Db."""
