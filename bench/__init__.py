"""Checkout-only tools, not installed with the package: the bandwidth model
of the CUDA paths (``python -m bench.predict_cli``), the GPU tuner that
measures a dispatch table (``python -m bench.tune``), the GPU check
(``bench/gpu_check.sh``) and the renderer of bench/README.md's tables
(``python bench/readme_tables.py``). Run them from the repository root."""
