"""A stand-in for a ``gs://`` bucket on local disk, for tests: no GCS is reachable here and
``gcsfs`` is not installed, so both of the routes by which orbax reaches a URI are redirected to
a local folder ``root``:

- :class:`etils.epath.Path` (orbax's and our metadata, listings, JSON items, the marker, the
  tokenizer): epath's own test hook (``epath.testing.mock_epath``) with every backend call's
  path rewritten from ``gs://X`` to ``root/X``;
- TensorStore (the arrays): orbax's ``build_kvstore_tspec`` is given ``root/X`` for ``gs://X``,
  so TensorStore's ``file`` driver writes where its ``gcs`` driver would have;
- orbax asks Google's client (``google-cloud-storage``, not installed here) whether the bucket
  has a hierarchical namespace before it lists steps: the answer is no (a flat bucket, GCS's
  default).

``gs://X`` itself never names a local file (``os.path`` would read it as ``./gs:/X`` under the
working directory, which the tests keep empty), so code that reached the URI through ``os``
instead of epath finds nothing there and fails.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

PREFIX = "gs://"


@contextlib.contextmanager
def fake_bucket(root: str) -> Iterator[None]:
    """Within the block, ``gs://...`` paths live under the local folder ``root``."""
    from etils.epath import testing
    from orbax.checkpoint._src.path import gcs_utils
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    root = os.path.abspath(root)

    def local(p) -> str:
        p = os.fspath(p)
        return os.path.join(root, p[len(PREFIX) :]) if p.startswith(PREFIX) else p

    def uri(p) -> str:
        p = os.fspath(p)
        return PREFIX + os.path.relpath(p, root) if p.startswith(root + os.sep) else p

    def one(fn, p, *a, **k):
        return fn(local(p), *a, **k)

    def two(fn, p, dst, *a, **k):
        return fn(local(p), local(dst), *a, **k)

    def glob(fn, p):
        return [uri(q) for q in fn(local(p))]

    def walk(fn, top, **k):
        for r, dirs, files in fn(local(top), **k):
            yield uri(r), dirs, files

    build = ts_utils.build_kvstore_tspec

    def build_local(directory, *a, **k):
        return build(local(directory), *a, **k)

    hooks = dict.fromkeys(
        ("open", "exists", "isdir", "listdir", "makedirs", "mkdir", "rmtree", "remove", "stat"),
        one,
    )
    hooks.update(rename=two, replace=two, copy=two, glob=glob, walk=walk)
    hns = gcs_utils.is_hierarchical_namespace_enabled
    ts_utils.build_kvstore_tspec = build_local
    gcs_utils.is_hierarchical_namespace_enabled = lambda path: False
    try:
        with testing.mock_epath(**hooks):
            yield
    finally:
        ts_utils.build_kvstore_tspec = build
        gcs_utils.is_hierarchical_namespace_enabled = hns
