"""Cache quality evaluation (issue 4): labelled prompt pairs through the live gateway.

    python -m bench.cache_eval            # full run (~2.5 min on 2 cores) -> bench/cache_eval/RESULTS.md
    python -m bench.cache_eval --quick    # smoke run (~1 min)
"""
