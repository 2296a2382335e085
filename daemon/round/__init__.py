"""Layer 2, the round: RoundPlan (ids, paths, template values), the machine (the states of a round, the
table between them, decide()), and the save interval. Pure, or reading only the round's own records."""
