"""CLI commands of the core (tables, plan); subsystems register theirs in <package>/commands.py."""
