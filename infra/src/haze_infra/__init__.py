"""haze infra: Pulumi components (see the infra issue)."""
