"""Speculative decoding: the `spec` options (config.py), drafter runtimes the Engine drives (runtime.py,
ngram.py), lossless verification (verify.py) and the draft models (models/)."""
