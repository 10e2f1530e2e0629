"""Graph-level passes: schedules (and later search, cost, partition) and the Relax passes."""
