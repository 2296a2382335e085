"""The process's surroundings: errors and exit codes, logging, the terminal view, retries, /proc, tool versions, units."""
