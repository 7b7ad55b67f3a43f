"""Graph passes, each a function from a verified graph to a new one (or to node groups):
dce, specialize (to a traffic bucket), fuse (pattern tables a backend opts into), and `prepare`,
which runs them in order."""

from polymorph.passes.dce import dce
from polymorph.passes.fuse import (
    ANY,
    COMMUTATIVE_OPS,
    LINEAR_RESIDUAL,
    LINEAR_SILU_MUL,
    QKV_NORM_ROPE_KV_WRITE,
    QKV_ROPE_KV_WRITE,
    RMSNORM_LINEAR,
    RMSNORM_LINEAR_SILU_MUL,
    RMSNORM_QKV_ROPE_KV_WRITE,
    STANDARD_PATTERNS,
    NodeGroup,
    Pattern,
    PatternError,
    Step,
    fuse,
    select_patterns,
)
from polymorph.passes.pipeline import prepare
from polymorph.passes.specialize import BUCKET_SYMBOLS, bucket_bindings, graph_symbols, specialize

__all__ = [
    "ANY",
    "BUCKET_SYMBOLS",
    "COMMUTATIVE_OPS",
    "LINEAR_RESIDUAL",
    "LINEAR_SILU_MUL",
    "QKV_NORM_ROPE_KV_WRITE",
    "QKV_ROPE_KV_WRITE",
    "RMSNORM_LINEAR",
    "RMSNORM_LINEAR_SILU_MUL",
    "RMSNORM_QKV_ROPE_KV_WRITE",
    "STANDARD_PATTERNS",
    "NodeGroup",
    "Pattern",
    "PatternError",
    "Step",
    "bucket_bindings",
    "dce",
    "fuse",
    "graph_symbols",
    "prepare",
    "select_patterns",
    "specialize",
]
