"""CANN API layers: each AscendCL call also appears as the runtime call it makes (Level2), so
counting calls means keeping one layer of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import polars as pl

from traceanalyzer.intervals import Frame

ApiLayer = Literal["auto", "acl", "runtime", "all"]


def one_api_layer(
    calls: Frame, layer: ApiLayer = "auto", *, by: Sequence[str] = ("rank",)
) -> Frame:
    """Keep the CANN calls (slices with ``api_layer``) of one layer, so no call counts twice.

    Each AscendCL call (``AscendCL@aclrtMemcpy``) also appears as the runtime call it makes
    (``Runtime@MemCopySync``) when the profile has the runtime layer (Level2). ``auto`` keeps, per
    ``by`` group, the runtime calls when the group has any (they also include calls that bypass
    AscendCL, such as HCCL's direct rtMemcpy), else the other layers; ``acl`` and ``runtime`` keep
    that side everywhere; ``all`` keeps every call.
    """
    is_runtime = pl.col("api_layer") == "Runtime"
    if layer == "all":
        return calls
    if layer == "runtime":
        return calls.filter(is_runtime)
    if layer == "acl":
        return calls.filter(~is_runtime)
    group_has_runtime = is_runtime.any().over(list(by)) if by else is_runtime.any()
    return calls.filter(pl.when(group_has_runtime).then(is_runtime).otherwise(~is_runtime))
