"""Studies built on runs: profile (stage times and the holdable rate), sweep (one variable,
the knee), compare (two runs, stated tests)."""
