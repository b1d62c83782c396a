"""The model catalog: curated entries (entries.py), verified resumable downloads (downloads.py), and
serving or importing what is on disk (service.py)."""
