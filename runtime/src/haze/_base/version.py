"""The version of haze, in the kernel so every layer (the CLI, OpenTelemetry) can name it."""

__version__ = "0.1.0"
