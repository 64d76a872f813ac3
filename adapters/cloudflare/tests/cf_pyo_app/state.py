"""What the jobs saw, read back by the scenarios."""

runs: list[list] = []
failed_calls: list[list] = []
