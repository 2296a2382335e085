"""One module per campaign state, all the same shape (see base.py)."""
