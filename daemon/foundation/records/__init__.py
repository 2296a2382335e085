"""What the daemon writes and reads back: the layout, the state dir and its files, status, identity, ledger, rounds, bundles, outputs."""
