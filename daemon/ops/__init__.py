"""Layer 6, operations: the CLI and its one-shot commands (check, clean, record, move, demo, rehearse,
report) and the systemd unit."""
