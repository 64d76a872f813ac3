"""The composition root: App, configuration, discovery, control signals."""
