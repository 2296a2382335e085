"""Layer 1, the foundations: config, layout, secrets, logs, the store and its files, disk, checkpoints,
the status file and its renderers, errors. They import nothing above them (tests/unit/test_architecture.py)."""
