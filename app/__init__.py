"""The desktop application and the command-line entry point."""
