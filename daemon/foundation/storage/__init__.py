"""The volume and the checkpoints on it: disk guard and budget, start-up checks, ballast, reclaim, retention, checkpoint scans and watcher, HF exports."""
