"""Moved to app/bert_gguf.py: the starter set (app/starter.py) converts MiniLM with it too. Kept so the
names the test suite and the README use still resolve."""
from app.bert_gguf import convert

__all__ = ["convert"]
