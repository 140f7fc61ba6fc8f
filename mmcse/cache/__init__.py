"""The Stage-1 ↔ Stage-2 cache: feature sets and corpora as directories of shards + manifest.

>>> write_feature_set("cache/coco/clip_image", ids, features, kind="image", dim=512,
...                   dtype="float16", dataset="coco", split="train",
...                   producer={"teacher": "clip-vit-b32", "revision": "..."})
>>> images = FeatureSet.open("cache/coco/clip_image").require_fingerprint(recorded)
>>> batch = images.gather(corpus.image_ids[:128])   # [128, 512] float16, joined by id

Token ids are cached the same way, once per (corpus, tokenizer, max length), and shared by every
run (:mod:`mmcse.cache.tokens`; the tokenizer side — fingerprint, fast batch encoding — is
:mod:`mmcse.cache.tokenizer`):

>>> key = TokenKey(corpus.fingerprint, tokenizer_fingerprint(tokenizer), 32)
>>> table = cached_tokens(entry_path(corpus.path, key), key,
...                       lambda: (corpus.ids, encode_rows(tokenizer, corpus.texts, 32)))
>>> input_ids, lengths = table.take(rows)         # [n, 32], [n] int32, memory-mapped

See :mod:`mmcse.cache.writer` for the atomic-write and multi-rank contract,
:mod:`mmcse.cache.featureset` for how reads stay memory-mapped and vectorised, and
:mod:`mmcse.cache.integrity` for why every open refuses a set that would fail
``mmcse cache verify`` (a full check once, then a few ``stat`` calls).
"""

from mmcse.cache.corpus import Corpus, write_corpus
from mmcse.cache.featureset import FeatureSet
from mmcse.cache.manifest import SCHEMA_VERSION, Manifest, ShardInfo
from mmcse.cache.ops import (
    CacheEntry,
    list_sets,
    merge,
    remove,
    verify,
    verify_report,
    verify_tree,
)
from mmcse.cache.tokenizer import encode_rows, tokenizer_fingerprint
from mmcse.cache.tokens import TokenKey, TokenTable, cached_tokens, entry_path
from mmcse.cache.writer import FeatureSetWriter, write_feature_set

__all__ = [
    "SCHEMA_VERSION",
    "CacheEntry",
    "Corpus",
    "FeatureSet",
    "FeatureSetWriter",
    "Manifest",
    "ShardInfo",
    "TokenKey",
    "TokenTable",
    "cached_tokens",
    "encode_rows",
    "entry_path",
    "list_sets",
    "merge",
    "remove",
    "tokenizer_fingerprint",
    "verify",
    "verify_report",
    "verify_tree",
    "write_corpus",
    "write_feature_set",
]
