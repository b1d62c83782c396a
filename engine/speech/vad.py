"""Voice activity detection: speech spans of a clip with Silero VAD, on one worker."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import ModelLoadError
from engine.speech.audio import ASR_RATE
from engine.speech.pool import WorkerPool


class VadService:
    """Speech spans of a clip (Silero VAD), one worker."""

    def __init__(self, model: Path):
        import sherpa_onnx
        self.path = Path(model)
        if not self.path.is_file():
            raise ModelLoadError(f"VAD model not found: {self.path}")

        def config():
            cfg = sherpa_onnx.VadModelConfig()
            cfg.silero_vad.model = str(self.path)
            cfg.silero_vad.threshold = 0.5
            cfg.silero_vad.min_silence_duration = 0.3
            cfg.silero_vad.min_speech_duration = 0.2
            cfg.silero_vad.window_size = 512
            cfg.sample_rate = ASR_RATE
            cfg.num_threads = 1
            if not cfg.validate():
                raise ModelLoadError(f"{self.path} is not a Silero VAD model sherpa-onnx accepts")
            return cfg
        self.pool = WorkerPool("vad", 1, 32, config)

    async def spans(self, samples: np.ndarray) -> list[tuple[float, float]]:
        """[(start, end)] in seconds of the speech in 16 kHz samples."""
        def job(cfg):
            import sherpa_onnx
            vad = sherpa_onnx.VoiceActivityDetector(cfg, buffer_size_in_seconds=max(30, len(samples) / ASR_RATE + 1))
            out: list[tuple[float, float]] = []
            window = cfg.silero_vad.window_size

            def drain():
                while not vad.empty():
                    seg = vad.front
                    out.append((seg.start / ASR_RATE, (seg.start + len(seg.samples)) / ASR_RATE))
                    vad.pop()
            for i in range(0, len(samples), window):
                vad.accept_waveform(samples[i:i + window])
                drain()
            vad.flush()
            drain()
            return out, len(samples) / ASR_RATE
        return await self.pool.run(job)
