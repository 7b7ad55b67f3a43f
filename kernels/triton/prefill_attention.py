"""Flash attention for prefill: cache_attention with S > 4 (prefill, chunked prefill) and attention.

One kernel, two ways to find K and V:
  cache_attention  q[B, S, H, D] over the paged cache [cache_blocks, BS, Hkv, D] (after this step's
                   kv_write): logical token t of sequence b lives at row t % BS of cache block
                   block_table[b, t // BS]; query (b, s) sees t <= positions[b, s].
  attention        q[B, S, H, D] with plain k, v[B, T, Hkv, D]; causal: query s sees t <= s.
Grid (batch * H, query tiles); a program holds BLOCK_M queries of one head (its kv head is h // (H/Hkv))
and walks the keys BLOCK_N at a time with tl.dot, online softmax in fp32 (exp2, scale folded with
log2 e). The keys every row of the tile sees (t < min over the tile of positions + 1) run without a
mask; the rest, up to the tile's last visible key, with one. Query tiles are issued last-first, so the
long causal tiles start before the short ones.

Every shape is a constexpr (the spec is concrete per traffic bucket) and the tensors are contiguous, so
the only launch-time specialization Triton adds is the 16-byte alignment of the pointers.

Constraints (supports): cuda or rocm; one attention or cache_attention node; q, k and v of one float
dtype (f32, bf16, f16); sinks (where given) [H] of a float dtype; concrete heads and kv heads; head dim a power of two in [16, 256];
cache_attention also: block table and positions i32 or i64, a concrete block size, and S > 4 query
tokens (or a symbolic S, which is prefill's; decode_attention.py takes S <= 4).

Sliding window and soft-capping (the op's `window` and `softcap` attrs; 0: none; a window is causal):
under a window a tile's keys are [first, hi), first the earliest row's first visible key: keys before
it (whole cache blocks included) are never read; the keys every row sees run unmasked, the window's
head and the causal tail masked. Softcap: scores = softcap * tanh(q.k * scale / softcap) after the
scale and before the mask.

Chunked attention (the `chunk` attr; 0: none; Llama 4; causal): the query at p sees p // chunk * chunk <=
t <= p, taken as a window whose first key is the chunk's: a tile reads keys from the earliest row's
chunk start on, never a block before it. Sinks (the optional last input, [H]; gpt-oss): each row's
running max starts at its head's sink (log2 domain) and its sum of exp2 at 1, so the sink joins the
softmax once and carries no value. Both are constexpr features (CHUNK, SINKS): without them the kernel
compiles as before (the sinks pointer is then q, never read).

Config keys: block_m (queries per program), block_n (keys per step), num_warps, num_stages; the
arch's launch options (waves_per_eu) where it takes them.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from polymorph.pipeline.kernel_files import depend

IMPLEMENTS = ("cache_attention", "attention")

MIN_CACHE_SEQ = 5  # cache_attention with S <= 4 is decode_attention.py's

# Hopper: 64 queries x 128 keys on one warpgroup, cp.async double-buffered, was the fastest on an H200
# (Triton 3.6; Llama-3.2-1B heads, bf16) for 128- and 512-token chunks over 4k-8k paged contexts, and
# within 10% of the best (64 x 64, 4 stages) for a 2k causal prompt.
_WARP32_CONFIGS = [
    {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 2},
    {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 4},
    {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3},
    {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3},
]
# Written for 64-wide waves (CDNA MFMA; not measured): the 128 x 64, 4-wave, single-stage tile of the
# ROCm flash-attention kernels. In deviceless compiles of Llama-3.2-1B's 2k bf16 prefill (Triton 3.9),
# the 128 x 32 tile on 8 waves is the one without SGPR spills on gfx942 and gfx950 (90 SGPRs, 122-123
# VGPRs, occupancy 0.5); 128 x 64 on 4 waves spills 4 SGPRs (gfx942) and 8 (gfx950) to VGPR lanes,
# 64 x 64 with two stages 5 and 11. A larger-LDS tile for gfx950 (128 x 128, two stages, 98 KB) spilled
# 30. None of these was timed on an AMD device.
_WAVE64_CONFIGS = [
    {"block_m": 128, "block_n": 32, "num_warps": 8, "num_stages": 1, "waves_per_eu": 1},
    {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2},
    {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2, "waves_per_eu": 2},
]
CONFIGS = _WARP32_CONFIGS

_TRITON_DTYPE = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i32": "i32", "i64": "i64"}
_FLOATS = ("f32", "bf16", "f16")
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}
_LOG2E = 1.4426950408889634
_KV_BYTES = 128 * 1024  # K + V tiles of all pipeline stages at most (chosen on sm_90/sm_100: 227 KB per CTA)
_TYPICAL_ROW = 64 * 2  # bytes of a K/V row that configs are filtered at: 64-wide bf16 heads (Llama-3.2-1B)

# Triton's interpreter multiplies bfloat16 bit patterns in tl.dot (triton-lang/triton#11584, not
# supported upstream): there, and only there, the dots run on operands upcast to fp32 (exact: bf16
# products fit fp32). Read when the module is loaded, as Triton reads it when the kernels are decorated.
# The kernel has no @jit helpers: each @jit call costs the interpreter ~5 ms.
_i = depend("triton/_interpreter.py", "5c1ce4224182c59671a20d9fe3b1ed654b49f428d8c5e8246e3c8c1f2381b280")
_UPCAST_DOT = _i.INTERPRETED
# Configs and launch options per chip, from its traits.
_t = depend("triton/_targets.py", "1c2e8016fbcd9a76d262818e2f95239c5b010b16985364165c7beae0fe0c8278")


def _shared(config: dict[str, Any], row: int = _TYPICAL_ROW) -> int:
    """Shared memory / LDS of the Q tile and the K and V tiles of every stage, for `row`-byte rows."""
    return config["block_m"] * row + 2 * config["block_n"] * row * max(config["num_stages"], 1)


def configs(traits: Any) -> list[dict[str, Any]]:
    return _t.configs_for({32: _WARP32_CONFIGS, 64: _WAVE64_CONFIGS}, traits, shared=_shared)


@triton.jit
def _softcap(qk, CAP_IN: tl.constexpr, CAP_OUT: tl.constexpr):
    """CAP_OUT * tanh(qk * CAP_IN) as CAP_OUT - 2 CAP_OUT / (exp(2 qk CAP_IN) + 1), as in
    decode_attention.py (exp2 on every backend, +-CAP_OUT where it over- or underflows)."""
    return CAP_OUT - (2.0 * CAP_OUT) / (tl.exp2(qk * (2.8853900817779268 * CAP_IN)) + 1.0)


@triton.jit
def _flash_attention_kernel(
    q_ptr,  # [B, S, H, D]
    k_ptr,  # paged: [cache_blocks, BS, HKV, D]; plain: [B, T, HKV, D]
    v_ptr,  # like k_ptr
    table_ptr,  # paged: [B, CTX_BLOCKS] int; plain: unused
    pos_ptr,  # paged: [B, S] int; plain: unused
    out_ptr,  # [B, S, H, D]
    sinks_ptr,  # [H] float when SINKS, else unused
    SCALE: tl.constexpr,  # softmax scale * log2(e)
    S: tl.constexpr,
    H: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    T: tl.constexpr,  # keys per sequence: CTX_BLOCKS * BS when paged
    BS: tl.constexpr,
    CTX_BLOCKS: tl.constexpr,
    PAGED: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,  # f32 inputs: full-precision dots, not tf32
    WINDOW: tl.constexpr = 0,  # > 0: the query at p sees p - WINDOW < t <= p (causal)
    SOFTCAP: tl.constexpr = 0.0,  # > 0: scores = SOFTCAP * tanh(q.k * scale / SOFTCAP)
    CAP_IN: tl.constexpr = 1.0,  # scale / SOFTCAP
    CHUNK: tl.constexpr = 0,  # > 0: the query at p sees p // CHUNK * CHUNK <= t <= p (causal)
    SINKS: tl.constexpr = False,  # sinks_ptr holds one logit per query head
):
    bh = tl.program_id(0)
    mt = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    g = h // (H // HKV)

    s = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query tokens
    s_ok = s < S
    if PAGED:
        pos = tl.load(pos_ptr + b * S + s, mask=s_ok, other=-1).to(tl.int32)
    elif CAUSAL:
        pos = tl.where(s_ok, s, -1)
    else:
        pos = tl.where(s_ok, T - 1, -1)
    p_max = tl.max(pos, axis=0)
    p_min = tl.min(tl.where(s_ok, pos, T), axis=0)
    hi = tl.minimum(p_max + 1, T)  # keys the tile's last row sees
    lo = tl.minimum(p_min + 1, hi)  # keys every row sees (causally)
    lo = tl.maximum(lo, 0) // BLOCK_N * BLOCK_N
    # Under a window the earliest row sees keys from `first` on and every row from `every` on: keys
    # before `first` (whole cache blocks included) are never read; [first, mid) runs masked. Without
    # one both are 0 and the head phase is empty.
    first = p_min * 0
    every = p_min * 0
    if WINDOW > 0:
        first = tl.maximum(p_min - WINDOW + 1, 0)
        every = tl.maximum(p_max - WINDOW + 1, 0)
    if CHUNK > 0:  # the same with each row's chunk start for its window's
        first = p_min // CHUNK * CHUNK
        every = p_max // CHUNK * CHUNK
    mid = tl.minimum((every + BLOCK_N - 1) // BLOCK_N * BLOCK_N, hi)
    tail = tl.maximum(mid, lo)

    d = tl.arange(0, D)
    q_rows = (b * S + s).to(tl.int64) * H + h
    q = tl.load(q_ptr + q_rows[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0)
    if _UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:  # the sink in the running max and sum from the start: exp2(sink - m) is in l_i
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], tl.float32) + sink
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    # phase 0: keys [mid, tail), visible to every row, no mask; phase 1: keys [tail, hi), masked;
    # phase 2 (a window or chunk only): keys [first, mid), masked
    for phase in tl.static_range(2 + (WINDOW > 0 or CHUNK > 0)):
        if phase == 0:
            t_begin = mid
            t_end = tail
        elif phase == 1:
            t_begin = tail
            t_end = hi
        else:
            t_begin = first
            t_end = mid
        for t0 in range(t_begin, t_end, BLOCK_N):
            t = t0 + n  # [BLOCK_N] logical key tokens
            t_ok = t < t_end
            if PAGED:
                if phase == 0:
                    blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS)
                else:
                    blk = tl.load(table_ptr + b * CTX_BLOCKS + t // BS, mask=t_ok, other=0)
                kv = ((blk.to(tl.int64) * BS + t % BS) * HKV + g) * D  # [BLOCK_N] cache row offsets
            else:
                kv = ((b.to(tl.int64) * T + t) * HKV + g) * D
            if phase == 0:
                k = tl.load(k_ptr + kv[:, None] + d[None, :])  # [BLOCK_N, D]
                v = tl.load(v_ptr + kv[:, None] + d[None, :])
            else:
                k = tl.load(k_ptr + kv[:, None] + d[None, :], mask=t_ok[:, None], other=0.0)
                v = tl.load(v_ptr + kv[:, None] + d[None, :], mask=t_ok[:, None], other=0.0)
            if IEEE:
                qk = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_M, BLOCK_N] f32
            elif _UPCAST_DOT:
                qk = tl.dot(q, tl.trans(k).to(tl.float32))
            else:
                qk = tl.dot(q, tl.trans(k))
            if SOFTCAP > 0:
                qk = _softcap(qk, CAP_IN, SOFTCAP * 1.4426950408889634)  # log2 domain, as SCALE is
            else:
                qk = qk * SCALE
            if phase > 0:
                visible = t_ok[None, :] & (t[None, :] <= pos[:, None])
                if WINDOW > 0:
                    visible = visible & (t[None, :] > pos[:, None] - WINDOW)
                if CHUNK > 0:
                    visible = visible & (t[None, :] >= pos[:, None] // CHUNK * CHUNK)
                qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
            p = tl.exp2(qk - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            elif _UPCAST_DOT:
                if v.dtype == tl.bfloat16:  # round p to nearest even, as compiled code does
                    pb = p.to(tl.uint32, bitcast=True).to(tl.int64)  # (the interpreter truncates)
                    p = (
                        (((pb + 0x7FFF + ((pb >> 16) & 1)) >> 16) << 16)
                        .to(tl.uint32)
                        .to(tl.float32, bitcast=True)
                    )
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=s_ok[:, None])


# --- the contract -------------------------------------------------------------------------------------


def _is_pow2(x: Any) -> bool:
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def supports(spec: Any) -> bool:
    if len(spec.nodes) != 1 or not spec.target.is_gpu:
        return False
    node = spec.single
    if node.op not in ("cache_attention", "attention"):
        return False
    q, k, v = (spec.types[x] for x in node.inputs[:3])
    n_in = 5 if node.op == "cache_attention" else 3  # then the optional sinks[H]
    sinks = [spec.types[x] for x in node.inputs[n_in:]]
    _, s, h, d = q.shape
    hkv = k.shape[2]
    attrs = spec.attrs()
    ok = (
        len(sinks) <= 1
        and all(str(x.dtype) in _FLOATS and x.shape == (h,) for x in sinks)
        and set(attrs) <= {"scale", "causal", "window", "softcap", "chunk"}
        and not (attrs.get("window") and attrs.get("chunk"))
        and (not (attrs.get("window") or attrs.get("chunk")) or attrs.get("causal", True))
        and str(q.dtype) in _FLOATS
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and isinstance(h, int)
        and isinstance(hkv, int)
        and _is_pow2(d)
        and 16 <= d <= 256
    )
    if node.op == "attention":
        return ok
    table, pos = (spec.types[x] for x in node.inputs[3:5])
    bs = k.shape[1]
    return (
        ok
        and str(table.dtype) in ("i32", "i64")
        and str(pos.dtype) in ("i32", "i64")
        and isinstance(bs, int)
        and bs >= 1
        and (not isinstance(s, int) or s >= MIN_CACHE_SEQ)  # a symbolic seq is prefill's
    )


def _tiles(config: dict[str, Any], s: int, d: int, dtype: str, traits: Any) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for one shape: the config's, shrunk for short chunks and wide rows.

    Shared memory: the K and V tiles of every pipeline stage within _KV_BYTES and within what the block
    may take beside the Q tile. Registers: where the arch takes an occupancy hint that divides a lane's
    registers (waves_per_eu: 512 / waves_per_eu VGPRs a lane), the tiles live in those, so BLOCK_N (and
    then BLOCK_M) shrink as the row grows (gfx942 AOT: 128 x 64 spills from 256-byte rows on, 64 x 32
    from 512-byte rows); elsewhere the [BLOCK_M, D] fp32 accumulator and the q tile stay in registers,
    so BLOCK_M is at most 64 from 512-byte rows on."""
    row = d * _ITEMSIZE[dtype]  # bytes of one K/V row
    block_m = min(config["block_m"], max(16, triton.next_power_of_2(s)))
    block_n = config["block_n"]
    budget = min(_KV_BYTES, traits.shared_per_block - block_m * row)
    while block_n > 16 and 2 * block_n * row * config["num_stages"] > budget:
        block_n //= 2
    if _t.takes("waves_per_eu", traits):
        if row >= 256:
            block_n = min(block_n, 32)
        if row >= 512:
            block_m, block_n = min(block_m, 64), min(block_n, 16)
    elif row >= 512:
        block_m = min(block_m, 64)
    return block_m, block_n


def _constexprs(
    op: str,
    s: int,
    h: int,
    hkv: int,
    d: int,
    t: int,
    bs: int,
    ctx_blocks: int,
    scale: float,
    causal: bool,
    dtype: str,
    config: dict[str, Any],
    traits: Any,
    window: int = 0,
    softcap: float = 0.0,
    chunk: int = 0,
    sinks: bool = False,
) -> dict[str, Any]:
    block_m, block_n = _tiles(config, s, d, dtype, traits)
    if window or chunk:  # the window's third (masked head) loop holds more live values: 64-key tiles (sm_90
        block_n = min(block_n, 64)  # spilled 12-24 bytes at 64 x 128 on a 2k prompt, none at 64 x 64)
    paged = op == "cache_attention"
    return {
        "SCALE": float(scale) * _LOG2E,
        "S": s,
        "H": h,
        "HKV": hkv,
        "D": d,
        "T": ctx_blocks * bs if paged else t,
        "BS": bs if paged else 1,
        "CTX_BLOCKS": ctx_blocks if paged else 1,
        "PAGED": paged,
        "CAUSAL": causal,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "IEEE": dtype == "f32",
        "WINDOW": int(window),
        "SOFTCAP": float(softcap),
        "CAP_IN": float(scale) / float(softcap) if softcap else 1.0,
        "CHUNK": int(chunk),  # 0 and False: the code of the kernel without them
        "SINKS": bool(sinks),
    }


def _options(config: dict[str, Any], traits: Any) -> dict[str, Any]:
    return {
        "num_warps": config["num_warps"],
        "num_stages": config["num_stages"],
        **_t.extra_options(config, traits),
    }


def build(spec: Any, config: dict[str, Any], traits: Any) -> Any:
    node = spec.single
    args = spec.args(node)
    attrs = spec.attrs()
    op, scale = node.op, attrs["scale"]
    causal = bool(attrs.get("causal", True))
    window, softcap = int(attrs.get("window", 0) or 0), float(attrs.get("softcap", 0.0) or 0.0)
    chunk = int(attrs.get("chunk", 0) or 0)
    n_in = 5 if op == "cache_attention" else 3
    has_sinks = len(args) > n_in
    q_t, k_t = spec.types[node.inputs[0]], spec.types[node.inputs[1]]
    h, d = q_t.shape[2], q_t.shape[3]
    hkv = k_t.shape[2]
    dtype = str(q_t.dtype)
    options = _options(config, traits)
    cache: dict[tuple[int, int, int], dict[str, Any]] = {}

    def launch(inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        if op == "cache_attention":
            q, k, v, table, pos = (inputs[i].contiguous() for i in args[:5])
            bs, t, ctx_blocks = k.shape[1], 0, table.shape[1]
        else:
            q, k, v = (inputs[i].contiguous() for i in args[:3])
            table = pos = q  # never read: PAGED is off
            bs, t, ctx_blocks = 1, k.shape[1], 1
        sinks = inputs[args[n_in]].contiguous() if has_sinks else q  # q: never read without SINKS
        out = outputs[0]
        batch, s = q.shape[0], q.shape[1]
        if batch == 0 or s == 0:
            return
        key = (s, t, ctx_blocks)
        if key not in cache:
            cache[key] = _constexprs(
                op, s, h, hkv, d, t, bs, ctx_blocks, scale, causal, dtype, config, traits, window, softcap,
                chunk, has_sinks,
            )  # fmt: skip
        consts = cache[key]
        o = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        grid = (batch * h, triton.cdiv(s, consts["BLOCK_M"]))
        _flash_attention_kernel[grid](q, k, v, table, pos, o, sinks, **consts, **options)
        if o is not out:
            out.copy_(o)

    return launch


def compile_units(spec: Any, config: dict[str, Any], traits: Any) -> list[Any]:
    from polymorph.pipeline.kernel_files import CompileUnit

    node = spec.single
    attrs = spec.attrs()
    q_t, k_t = spec.types[node.inputs[0]], spec.types[node.inputs[1]]
    _, s, h, d = q_t.shape
    hkv = k_t.shape[2]
    dtype = str(q_t.dtype)
    data = "*" + _TRITON_DTYPE[dtype]
    n_in = 5 if node.op == "cache_attention" else 3  # then the optional sinks[H]
    if node.op == "cache_attention":
        table_t, pos_t = spec.types[node.inputs[3]], spec.types[node.inputs[4]]
        bs, t, ctx_blocks = k_t.shape[1], 0, table_t.shape[1]
        table, pos = "*" + _TRITON_DTYPE[str(table_t.dtype)], "*" + _TRITON_DTYPE[str(pos_t.dtype)]
    else:
        bs, t, ctx_blocks = 1, k_t.shape[1], 1
        table = pos = data  # launch passes q for the unused pointers
    if not all(isinstance(x, int) for x in (s, t, ctx_blocks)):
        raise ValueError(
            f"prefill_attention compiles for a concrete seq and context; got q {q_t}, k {k_t} "
            "(specialize the graph to a traffic bucket first)"
        )
    consts = _constexprs(
        node.op,
        s,
        h,
        hkv,
        d,
        t,
        bs,
        ctx_blocks,
        attrs["scale"],
        bool(attrs.get("causal", True)),
        dtype,
        config,
        traits,
        int(attrs.get("window", 0) or 0),
        float(attrs.get("softcap", 0.0) or 0.0),
        int(attrs.get("chunk", 0) or 0),
        len(node.inputs) > n_in,
    )
    sinks = "*" + _TRITON_DTYPE[str(spec.types[node.inputs[n_in]].dtype)] if len(node.inputs) > n_in else data
    signature = {
        "q_ptr": data,
        "k_ptr": data,
        "v_ptr": data,
        "table_ptr": table,
        "pos_ptr": pos,
        "out_ptr": data,
        "sinks_ptr": sinks,
        **{name: "constexpr" for name in consts},
    }
    return [
        CompileUnit("prefill_attention", _flash_attention_kernel, signature, consts, _options(config, traits))
    ]
