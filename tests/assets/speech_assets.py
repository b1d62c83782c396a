"""Moved to app/speech_assets.py: the starter set (app/starter.py) converts whisper and the Piper voice with it
too. Kept so the names the test suite and the README use still resolve."""
from app.speech_assets import piper_to_sherpa, read_ct2, whisper_to_onnx

__all__ = ["piper_to_sherpa", "read_ct2", "whisper_to_onnx"]
