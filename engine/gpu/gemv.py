"""GEMV launches planned once at build time: `DevMatrix` (a packed [N, K] weight in device memory, and
views of its rows or columns) and `GemvPlan` (the kernel, grid and arguments of y (+)= W x over the
row-split planes, chosen from the format, the shapes and the tuning table's entry). The kernels are
cuda/gemv*.cu, compiled by `engine.gpu.launch`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.artifact import formats
from engine.gpu import launch as kernels
from engine.gpu import kernel_names as KN
from engine.gpu.launch import EPI, FMT_IDS, GEMV_CONV_ROWS, GEMV_PRE_MAIN, WARPS, Launch, _allow_smem, kernel, sm_count


@dataclass
class DevMatrix:
    """A packed [N, K] weight in device memory: rows [row0, row0+n) of a row-split object, or bf16/fp32."""

    fmt: str
    n: int
    k: int
    buf: object  # cupy uint8 array holding the whole object
    row0: int = 0
    gpr: int = 0
    base: int = 0  # byte offsets of the planes for row0
    high: int = 0
    scales: int = 0

    @classmethod
    def from_object(cls, fmt: str, shape, buf, row0: int = 0, row1: int | None = None) -> "DevMatrix":
        n_all, k = int(shape[0]), int(math.prod(shape[1:]))
        row1 = n_all if row1 is None else row1
        if fmt in FMT_IDS:
            geo = formats.rowsplit_geometry(fmt, (n_all, k))
            hb = geo.high_bytes_per_group
            return cls(fmt, row1 - row0, k, buf, row0, geo.groups_per_row,
                       geo.base_off + row0 * geo.groups_per_row * 32,
                       geo.high_off + row0 * geo.groups_per_row * hb,
                       geo.scale_off + row0 * geo.groups_per_row * 2)
        if fmt in ("bf16", "fp32"):
            esize = 2 if fmt == "bf16" else 4
            return cls(fmt, row1 - row0, k, buf, row0, base=row0 * k * esize)
        raise ValueError(f"no GPU kernel for weight format {fmt}")

    @property
    def nbytes(self) -> int:
        if self.fmt in FMT_IDS:
            return self.n * self.gpr * (32 + self._hb() + 2)
        return self.n * self.k * (2 if self.fmt == "bf16" else 4)

    def ptr(self, off: int) -> int:
        return self.buf.data.ptr + off

    def _hb(self) -> int:
        return formats.rowsplit_geometry(self.fmt, (1, self.k)).high_bytes_per_group

    def row_slice(self, r0: int, r1: int) -> "DevMatrix":
        """Rows [r0, r1) of this (row-split) matrix."""
        g = self.gpr
        return DevMatrix(self.fmt, r1 - r0, self.k, self.buf, self.row0 + r0, g, self.base + r0 * g * 32,
                         self.high + r0 * g * self._hb(), self.scales + r0 * g * 2)


def _p(a) -> int:
    return a.data.ptr if hasattr(a, "data") else int(a)



class GemvPlan:
    """A GEMV launch fixed at build time: y (+)= W x for M token rows. Call `launch()`."""

    def __init__(self, w: DevMatrix, x, ldx: int, y, ldy: int, m: int = 1, epi: str = "store",
                 splits: int = 1, rows: int | None = None, unroll: int = 2, y_offset: int = 0, xpre=None,
                 experts=None, pre2: bool = False, conv=None, amax_out=None, xs=None, tc=None):
        """xpre: the pre-staged x (int16 pairs, inverse scales[, their packed twin or None: gemv_tc takes it for up to
        4 columns of q4-q6, `self.packed`]); pre2: gemv_rs_pre (x through the read-only path, row
        pointers advanced by constants: the tuning table's choice; w8 on pre-staged pairs always takes it). conv (epi
        "conv", one K slice): (weights [4, C], history [M, 3, C], C, the channel of row 0, rows that take the conv).
        amax_out (SwiGLU, gemv_rs_pre for one token or gemv_tc, no split or routing): 2 zeroed uint32 words a row that
        the row's largest |output| is folded into (`tracks_amax`, for stage_x_amax). xs: the chunk scales of the pre-staged x
        (fp32, a value a 32-value chunk), where gemv_rs_pre's chunk-scaled form is compiled (`self.xs` says whether
        the plan takes it: the caller stages accordingly). tc (2..8 columns): gemv_tc's (groups a run, ring stages) in
        place of the tuning table's (kernel_names.gemv_tc_form), with the warps a tile as a third item (None or left out:
        tc_warps' rule) and, for the split-K planes (epi "partial") of a pre-staged x, the slices as a fourth (None or
        left out: `splits`)."""
        self.w, self.m, self.epi = w, m, EPI[epi]
        self.pre2, self.tracks_amax, self.xs, self.packed = False, False, False, False
        ps = w.n // 2
        if epi == "conv" and w.fmt not in FMT_IDS:
            raise ValueError(f"the conv epilogue is compiled into the row-split GEMVs only, not {w.fmt}")
        if w.fmt == "bf16":
            self.fn = kernel(f"gemv_bf16<{m}>")
            kw = WARPS if -(-w.n // WARPS) < sm_count() else 1  # few rows: a block's 8 warps split K
            self.grid = (-(-w.n * kw // WARPS),)
            self.args = (np.uint64(w.ptr(w.base)), np.int32(w.n), np.int32(w.k), np.uint64(_p(x)),
                         np.int32(ldx), np.uint64(_p(y) + 4 * y_offset), np.int32(ldy), np.int32(self.epi),
                         np.int32(kw))
            self.smem, self.splits = 0, 1
            self._go = Launch(self.fn, self.grid, WARPS * 32, self.args, name=f"gemv_bf16<{m}>")
            return
        f = FMT_IDS[w.fmt]
        if 1 < m <= 8 and experts is None and epi in ("store", "partial", "add", "swiglu"):
            self._tensor_cores(f, x, ldx, y, ldy, splits, y_offset, xpre, tc or KN.gemv_tc_form(w.fmt, w.n, w.k),
                               amax_out)
            return
        if rows is None or epi == "swiglu":
            rows = 2
        if epi == "conv":  # (compiled for one token, GEMV_CONV_ROWS)
            if m != 1:
                raise ValueError("the conv epilogue takes one token row")
            rows = rows if rows in GEMV_CONV_ROWS else 2
        u4_per_row = w.gpr * 2
        # w8 reads the pre-staged int16 pairs (gemv_rs_pre's dot_w8_i16, a chunk of 16 codes is half a staged block)
        w8pre = w.fmt == "q8_g32_fp16" and xpre is not None
        pre = xpre is not None
        u4ps = -(-u4_per_row // splits)
        if pre:  # slices start on a block (32 chunks; w8: 64) of the slot-major pre-staged pairs
            u4ps, splits = prestaged_slices(u4_per_row, splits, 64 if w8pre else 32)
        vpu = 16 if w.fmt == "q8_g32_fp16" else 32
        staged = u4ps if vpu == 16 else -(-u4ps // 32) * 32  # q4-q6 stage whole 32-chunk blocks
        self.smem = 0 if pre else m * staged * vpu * 2 + 32 * 4
        ngroups = w.n - ps if epi == "swiglu" else -(-w.n // rows)
        per_sm = 8 if pre else max(1, min(8, (200 * 1024) // max(self.smem, 1)))
        bx = max(1, min(-(-ngroups // WARPS), sm_count() * per_sm // splits))
        # experts = (eidx, rows per expert, x stride in bytes, y stride in floats, y weights or None, slots)
        ex = experts or (None, 0, 0, 0, None, 1)
        if experts is not None:
            bx = max(1, min(-(-ngroups // WARPS), sm_count() * per_sm // max(ex[5], 1)))
        self.grid = (bx, splits, ex[5])
        self.pre2 = bool(pre2 and pre and vpu == 32) or w8pre
        if w8pre and (rows, unroll) not in GEMV_PRE_MAIN:  # (the w8 forms compiled: GEMV_PRE_MAIN)
            rows, unroll = (rows if (rows, 2) in GEMV_PRE_MAIN else 2), 2
        conv_t = ",true" if epi == "conv" else ""
        if conv_t and self.pre2 and (rows, unroll) not in GEMV_PRE_MAIN:
            self.pre2 = False
        kname = f"{'gemv_rs_pre' if self.pre2 else 'gemv_rs'}<{f},{rows},{m},{unroll}{conv_t}>"
        self.xs = bool(xs is not None and self.pre2 and not conv_t and f"{kname[:-1]},false,true>" in
                       kernels.GEMV_PRE_XS_NAMES)
        if self.xs:
            kname = f"{kname[:-1]},false,true>"
        self.f, self.rows, self.unroll, self.kname = f, rows, unroll, kname  # (pair_launch reads them)
        self.fn = kernel(kname)
        _allow_smem(self.fn, kname, self.smem)
        self.args = (np.uint64(w.ptr(w.base)), np.uint64(w.ptr(w.high)), np.uint64(w.ptr(w.scales)),
                     np.int32(w.n), np.int32(w.gpr), np.int32(ps if epi == "swiglu" else 0),
                     np.uint64(_p(xpre[0]) if pre else _p(x)), np.int32(ldx), np.int32(w.k), np.int32(u4ps),
                     np.uint64(_p(y) + 4 * y_offset), np.int32(ldy), np.int32(self.epi),
                     np.uint64(_p(xpre[1]) if pre else 0),
                     np.uint64(_p(ex[0]) if ex[0] is not None else 0), np.int32(ex[1]), np.int64(ex[2]),
                     np.int32(ex[3]), np.uint64(_p(ex[4]) if ex[4] is not None else 0),
                     np.int32(0))  # (the kernels' L2 prefetch distance: off)
        if epi == "conv" and (conv is None or splits != 1 or experts is not None):
            raise ValueError("the conv epilogue takes its (weights, history, C, base, rows) and one K slice")
        cv = conv if epi == "conv" else (None, None, 0, 0, 0)
        self.args += (np.uint64(_p(cv[0]) if cv[0] is not None else 0), np.uint64(_p(cv[1]) if cv[1] is not None else 0),
                      np.int32(cv[2]), np.int32(cv[3]), np.int32(cv[4]))
        fusable = self.pre2 and epi == "swiglu" and m == 1 and splits == 1 and experts is None
        self.tracks_amax = bool(amax_out is not None and fusable)
        if self.pre2:  # (gemv_rs_pre's staging tail: its own output's pairs (unused), the amax slot, chunk scales)
            self.args += (np.uint64(0), np.uint64(0), np.int32(0),
                          np.uint64(_p(amax_out) if self.tracks_amax else 0), np.uint64(_p(xs) if self.xs else 0))
        self.splits = splits
        self._go = Launch(self.fn, self.grid, WARPS * 32, self.args, self.smem, name=kname)

    def _tensor_cores(self, f, x, ldx, y, ldy, splits, y_offset, xpre, form, amax_out=None):
        """gemv_tc (cuda/gemv_tc.cu): 2..8 columns, each weight read once for all of them on the int8 MMAs; the
        arguments are gemv_rs's; form: (groups a run, ring stages[, warps a 16-row tile, None: `tc_warps`[, split-K
        slices of the planes, None: `splits`]]); amax_out (SwiGLU): each column's largest |output| folded into its
        slot."""
        w, m = self.w, self.m
        u4_per_row = w.gpr * 2
        w8 = w.fmt == "q8_g32_fp16"
        if w.n * w.gpr * 32 >= 1 << 32:
            raise ValueError(f"gemv_tc addresses planes under 4 GiB, not a {w.n} x {w.k} matrix")
        red = WARPS * 128 * 4
        gu, stages = form[:2]
        ring = WARPS * stages * KN.gemv_tc_stage_bytes(f, gu)
        stage = None
        if xpre is None:  # x staged in the block: whole pairs of groups (four chunks) a slice (the ring's two-group
            # copies start at even groups); split-K planes take as many slices as x's slice needs to fit beside
            # the ring, other epilogues stage x first (stage_x_mb) where it does not
            splits = max(splits, 1)
            while True:
                per = -(-u4_per_row // splits)  # (chunks a slice, rounded up to whole pairs of groups)
                u4ps = -(-per // 4) * 4
                xchunks = u4ps // 2 if w8 else u4ps  # 32-value x chunks a slice
                self.smem = red + ring + m * (-(-xchunks // 32) * 32) * 64
                if self.smem <= TC_SMEM_MAX or self.epi != EPI["partial"] or u4ps <= 64:
                    break
                splits += 1
            if self.smem > TC_SMEM_MAX:
                import cupy as cp  # noqa: PLC0415

                from engine.gpu.norm import stage_rows  # noqa: PLC0415
                kpad = -(-w.k // kernels.XPAD) * kernels.XPAD
                xpre = (cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32))
                stage = stage_rows(x=x, ld=ldx, k=w.k, kpad=kpad, xh=xpre[0], ldh=kpad // 2, xinv=xpre[1], rows=m,
                                   blocks=4)
                splits = 1
            else:
                splits = -(-u4_per_row // u4ps)
        if xpre is not None:
            if self.epi == EPI["partial"] and len(form) > 3 and form[3]:
                splits = form[3]
            # (slices of whole runs: a run's x chunks then lie in one block of the slot-major pairs)
            u4ps, splits = prestaged_slices(u4_per_row, splits, 2 * gu)
            self.smem = red + ring
        pre = xpre is not None
        # (x from the producer's packed twin, xpre's third item, where this format and column count take one)
        self.packed = pre and len(xpre) > 2 and xpre[2] is not None and KN.gemv_tc_packs(f, m)
        ps = w.n // 2 if self.epi == EPI["swiglu"] else 0
        tiles = -(-(w.n - ps) // (8 if ps else 16))
        wt = form[2] if len(form) > 2 and form[2] else tc_warps(tiles * splits)
        per_sm = max(1, min(3 if gu > 2 else 4, (220 * 1024) // self.smem))  # (its launch bounds)
        turns = -(-tiles // (WARPS // wt))
        most = max(1, sm_count() * per_sm // splits)
        # as many turns for every block: the blocks of one wave end together (the last wave's blocks would
        # otherwise run alone)
        self.grid = (-(-turns // -(-turns // most)), splits, 1)
        self.kname = KN.gemv_tc_name(f, m, gu, stages, self.packed)
        self.f, self.rows, self.unroll, self.splits, self.warps = f, 16, 1, splits, wt
        self.fn = kernel(self.kname)
        _allow_smem(self.fn, self.kname, self.smem)
        self.args = (np.uint64(w.ptr(w.base)), np.uint64(w.ptr(w.high)), np.uint64(w.ptr(w.scales)),
                     np.int32(w.n), np.int32(w.gpr), np.int32(ps),
                     np.uint64(_p(xpre[2 if self.packed else 0]) if pre else _p(x)), np.int32(ldx), np.int32(w.k),
                     np.int32(u4ps), np.uint64(_p(y) + 4 * y_offset), np.int32(ldy), np.int32(self.epi),
                     np.uint64(_p(xpre[1]) if pre else 0), np.uint64(0), np.int32(0), np.int64(0), np.int32(0),
                     np.uint64(0), np.int32(0), np.uint64(0), np.uint64(0), np.int32(0), np.int32(0), np.int32(0),
                     np.int32(wt))
        self.tracks_amax = amax_out is not None and self.epi == EPI["swiglu"]
        self.args += (np.uint64(_p(amax_out) if self.tracks_amax else 0),)
        go = Launch(self.fn, self.grid, WARPS * 32, self.args, self.smem, name=self.kname)
        self._go = go if stage is None else (lambda: (stage(), go()))
        self._staged = None if stage is None else xpre  # (its own staged x, kept alive)

    def launch(self):
        self._go()


TC_SMEM_MAX = 200 * 1024  # gemv_tc's shared memory a block at most (its ring and, staging x itself, x's slice)


def tc_warps(tiles: int) -> int:
    """Warps a 16-row tile of gemv_tc (the block's 8 warps take 8 / that tiles a turn). All 8 split K where the tiles
    are not many (each warp's share of a row is short; measured on the H200 at 4 columns: the 27B's projections of up
    to 2,176 tiles fastest so), 2 for the head's 15,520 (512 against 540 us with all eight)."""
    return 2 if tiles >= 64 * sm_count() else WARPS


def embed_rows(table: DevMatrix, *, tokens, out, ld: int, rows: int) -> Launch:
    """embed_rs<format> (row-split tables) or embed_bf16: row tokens[r] of `table` decoded into out[r, :table.k] (row
    stride ld) for each of `rows` token rows, a block a row."""
    if table.fmt in FMT_IDS:
        return kernels.prepared(f"embed_rs<{FMT_IDS[table.fmt]}>", (rows,),
                                (np.uint64(table.ptr(table.base)), np.uint64(table.ptr(table.high)),
                                 np.uint64(table.ptr(table.scales)), table.gpr, table.k, tokens, out, ld))
    return kernels.prepared("embed_bf16", (rows,), (np.uint64(table.ptr(table.base)), table.k, tokens, out, ld))


def prestaged_slices(span: int, splits: int, blk: int = 32) -> tuple[int, int]:
    """(16-byte chunks a split-K slice, slices) of a pre-staged GEMV over `span` chunks a row asked for `splits`
    slices, each slice whole blocks of `blk` chunks: the slot-major blocks of the staged pairs (32 chunks, w8: 64), or
    gemv_tc's runs of groups (a run's x then lies in one such block)."""
    per = -(-span // max(int(splits), 1))  # chunks a slice, rounded up to whole blocks
    u4ps = -(-per // blk) * blk
    return u4ps, -(-span // u4ps)


def mlp_fused_help_words(grid: int, gu: DevMatrix) -> int:
    """uint32 words of mlp_fused's help buffer: a count a row pair of the leftover chunks (grid x 32 at most), then
    a (gate, up) float pair a row pair and 32-lane slice of the row."""
    return grid * 32 * (1 + 2 * -(-gu.gpr * 2 // 32))


def mlp_fused_launch(gu: DevMatrix, dn: DevMatrix, norm: tuple, act, kpad_act: int, xh_act, xinv_act, slot, y,
                     splits: int, bar, tstamp=None, local_stage: bool = False, chunk_scales=None, help=None,
                     oproj=None, xw_early: bool = False, light_bar: int = 0):
    """The post-attention norm and the dense MLP of one token as one mlp_fused launch (cuda/mlp_fused.cu), or None
    where it is not compiled for these formats and sizes. norm = (x_in, x_out, planes in, planes, plane stride,
    norm weight, H, eps, kpad_h); gu: [2I, H] (gate rows, then up rows), dn: [H, I]; act: the fp32 SwiGLU row
    (I values), staged into xh_act / xinv_act with the scale of the largest |value| folded into slot[0] (slot: 2
    zeroed uint32 words, zeroed again by the launch); y: the down-projection's split-K planes (`splits` asked,
    whole 32-chunk slices; H floats apart); bar: a zeroed uint64, the grid barrier's counter (one a grid size).
    local_stage: every block stages the whole SwiGLU row into its own shared memory (no second barrier; xh_act is then
    not written). tstamp: 8 uint64 a block of phase timestamps (bench/mlp_fused_probe.py). chunk_scales (fp32, a
    value a 32-value chunk of act): each block owns whole chunks of the SwiGLU row and stages them into xh_act with a
    power-of-two scale each (their inverses here) before the barrier, the down reads them so: no global maximum, no
    staging after the barrier (not the four kernels' bits; slot and xinv_act untouched). help (chunk-scaled form;
    uint32, mlp_fused_help_words(grid, gu) zeroed words, used with this `bar` only): the chunks left over after an
    equal share a block are computed by every warp of the launch in 32-lane slices, summed by their owner blocks.
    oproj (chunk-scaled form): (o, xh_o, xsc_o, splits, chunked, ou): the layer's o-projection [H, K] in the down's
    format first, from gated_rmsnorm_chunks' pairs and chunk scales (chunked=False: one scale for the row, xsc_o[0];
    ou: its loads a lane in flight, 2 or 3 with xw_early), into `splits` planes of the norm's `part` (the norm then sums
    them, not `norm`'s planes), a grid barrier before the norm; `bar` and `help` then serve such launches only.
    xw_early (with oproj): the norm's x_in and weight loaded before that barrier's wait, its first two planes together
    after it. light_bar: the grid barriers' light form (cuda/persistent.cu), 2 their red form (arrivals by a release
    reduction, targets from the counter read at entry). Returns (launch, planes written)."""
    x_in, x_out, part, nplanes, pstride, nw_, H, eps, kpad_h = norm
    inter = dn.k
    vpt = min((v for v in kernels.MLP_FUSED_VPT if v * 1024 >= H), default=0)
    if gu.fmt not in FMT_IDS or dn.fmt not in FMT_IDS or gu.n != 2 * inter or gu.k != H or dn.n != H:
        return None
    ou4ps = osplits = 0
    if oproj is not None:
        o, xh_o, xsc_o, o_splits, o_chunked, ou = oproj
        if chunk_scales is None or o.fmt != dn.fmt or o.n != H:
            return None
        ou4ps, osplits = prestaged_slices(o.gpr * 2, o_splits)
        nplanes = osplits  # (the norm sums the o-projection's planes of this launch)
    form = (",true" if chunk_scales is not None else "") + (",true" if oproj is not None else "")
    form += ",true" if oproj is not None and xw_early else ""
    form += f",{ou}" if oproj is not None and xw_early and ou != 2 else ""
    name = f"mlp_fused<{FMT_IDS[gu.fmt]},{FMT_IDS[dn.fmt]},1,{vpt}{form}>"
    if name not in kernels.MLP_FUSED_NAMES:
        return None
    u4ps, dsplits = prestaged_slices(dn.gpr * 2, splits)
    smem = max(kpad_h * 6, kpad_act * 2 if local_stage else 0)  # the normed row's pairs and fp32 values; the down's pairs
    if chunk_scales is not None:
        smem = kpad_h * 6
    grid = sm_count() * kernels.resident_blocks(name, 1024, smem)
    if chunk_scales is not None and -(-dn.gpr * 2 // grid) > kernels.MLP_FUSED_CHUNKS:
        return None  # (more chunks a block than its shared row holds)
    if help is not None and chunk_scales is not None and help.size < mlp_fused_help_words(grid, gu):
        raise ValueError(f"mlp_fused's help buffer holds {help.size} words, the grid of {grid} needs "
                         f"{mlp_fused_help_words(grid, gu)}")
    P, I = (lambda a: np.uint64(_p(a))), np.int32
    bits = int(bool(local_stage)) | (2 if light_bar else 0) | (4 if light_bar == 2 else 0)
    args = (P(x_in), P(x_out), P(part), I(nplanes), I(pstride), P(nw_), I(H), np.float32(eps), I(kpad_h),
            P(gu.ptr(gu.base)), P(gu.ptr(gu.high)), P(gu.ptr(gu.scales)), I(gu.gpr),
            P(act), I(inter), I(kpad_act), P(xh_act), P(xinv_act), P(slot),
            P(dn.ptr(dn.base)), P(dn.ptr(dn.high)), P(dn.ptr(dn.scales)), I(dn.gpr), I(u4ps), I(dsplits),
            P(y), I(H), P(bar), np.uint64(0) if tstamp is None else P(tstamp), I(bits),
            np.uint64(0) if chunk_scales is None else P(chunk_scales),
            np.uint64(0) if help is None or chunk_scales is None else P(help))
    if oproj is None:
        args += (np.uint64(0),) * 3 + (I(0),) * 3 + (np.uint64(0),) * 2 + (I(0),)
    else:
        args += (P(o.ptr(o.base)), P(o.ptr(o.high)), P(o.ptr(o.scales)), I(o.gpr), I(ou4ps), I(osplits), P(xh_o),
                 P(xsc_o), I(bool(o_chunked)))
    return kernels.prepared(name, (grid,), args, block=1024, smem=smem, cooperative=True), dsplits


def pair_launch(a: GemvPlan, b: GemvPlan):
    """gemv_rs_pre_pair (cuda/gemv_variants.cu): plans a and b, each one token on gemv_rs_pre with unroll 2, one K
    slice, no staging tail, both with the conv epilogue or neither, as one grid of one wave: blocks [0, blocks_a) run
    a's rows, the rest b's, split by their weight bytes (each row as its own launch computes it). The Launch, or None
    where the two do not qualify or no pair form of their (format, rows) is compiled (kernels.GEMV_PAIR_NAMES)."""
    conv = a.epi == EPI["conv"]
    simple = all(p.pre2 and p.m == 1 and p.splits == 1 and p.unroll == 2 and not p.xs
                 and not p.tracks_amax and p.kname.startswith("gemv_rs_pre<") for p in (a, b))
    if not simple or (b.epi == EPI["conv"]) != conv:
        return None
    for minb in (4, 5):
        name = f"gemv_rs_pre_pair<{a.f},{a.rows},{b.f},{b.rows},{str(conv).lower()},{minb}>"
        if name in kernels.GEMV_PAIR_NAMES:
            break
    else:
        return None
    total = sm_count() * minb
    blocks_a = min(max(1, round(total * a.w.nbytes / (a.w.nbytes + b.w.nbytes))), total - 1)
    args = a.args[:25] + b.args[:25] + (np.int32(blocks_a),)
    return Launch(kernel(name), (total,), WARPS * 32, args, name=name)
