"""Stage 1: run every frozen teacher once and write feature sets under ``cache/``.

Stage 1 and Stage 2 (``mmcse``) meet only at the cache contract (:mod:`mmcse.cache`).
"""
