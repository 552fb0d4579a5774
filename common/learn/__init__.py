"""Learning: rules and pre-aggregators, attacks, data, models, seeded randomness."""
