"""Reading finished run folders: `currytrain journal`, `compare` and `diagnose` (what they print and write)."""
