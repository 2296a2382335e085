"""The runtime: config, persistence, supervision, watching, disk guard, CLI."""
