"""Consumers: the pull-loop worker and the delivery core that runs one delivered batch."""
