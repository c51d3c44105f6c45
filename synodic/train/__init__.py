"""Training: `train(settings, run_dir, arch)` (trainer.py); `python -m synodic.train` runs it alone."""
