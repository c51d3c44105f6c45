"""Results contract: results.json (+ summary tables) in the run dir."""
