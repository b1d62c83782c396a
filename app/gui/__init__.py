"""The Qt desktop application. Imported only when a window is wanted (never with --no-gui)."""
