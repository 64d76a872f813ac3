"""The engine: dispatch, locks, execution, outcome hooks, admin; the QueueManager composes them."""
