"""haze lambda adapter (see the serverless issue)."""
