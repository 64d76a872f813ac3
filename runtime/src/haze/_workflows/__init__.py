"""Durable workflows: ``WorkflowRun`` (the rules), the store engine, and ``Workflow``."""
