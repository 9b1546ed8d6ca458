"""The HTTP edge: pure ASGI routing, request reading and OpenAI-shaped errors."""
