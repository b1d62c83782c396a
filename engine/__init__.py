"""Inference and model management. Imports neither Qt nor aiohttp.web."""
