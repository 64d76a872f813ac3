"""Job definitions, pending dispatches, the job context and job status records."""
