"""The ops a pipeline file can name, by their ``op:`` key."""

from etl.ops.base import InvalidRows, Op
from etl.ops.categorical import Categorify, Decode, Hash, HashedCross
from etl.ops.dates import DateParts
from etl.ops.dense import Bucketize, Clamp, FillMissing, Log1p, Normalize
from etl.ops.expr import Expr
from etl.ops.history import History
from etl.ops.lists import FirstX
from etl.ops.target import TargetEncode

REGISTRY: dict[str, type[Op]] = {
    cls.name: cls
    for cls in (FillMissing, Clamp, Log1p, Normalize, Bucketize, Decode, Hash, Categorify, HashedCross, FirstX, DateParts, History, TargetEncode,
                Expr)
}

__all__ = ["REGISTRY", "InvalidRows", "Op"] + list(REGISTRY)
