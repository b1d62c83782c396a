"""Passive views over the Bridge: each panel renders what the bridge signals and calls its methods."""
