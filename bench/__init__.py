"""soakd benchmarks: each module is runnable as ``python -m bench.NAME [--quick] [--out F]``."""
