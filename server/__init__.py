"""aiohttp application: OpenAI routes, control routes, errors, SSE. Imports no Qt."""
