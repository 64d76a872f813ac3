"""haze cloudflare adapter (see the serverless issue)."""
