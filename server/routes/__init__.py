"""Route modules follow the OpenAI paths and stay thin: parse, call the facade, map."""
