"""The written contracts: the Driver and Store protocols and their optional capabilities."""
