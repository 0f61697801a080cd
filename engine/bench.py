"""Benchmark core: test matrix, deterministic tokens, timed pp/tg/pg runs, statistics, bounds.

Conventions follow llama-bench: `ppN` times a prefill of N tokens, `tgN` times N decode steps after a
one-token seed, `ppN+tgM` times both in sequence, `@ dD` first fills D tokens of context (untimed). Warmup
repetitions are run and dropped. Decode is timed on the path users run: `Engine.stream` (greedy unless a
`Sampling` says otherwise), from its first token to its last; engines without `stream` (the transformers
baseline) and `--burst` time `decode_greedy`, a device-side greedy loop with one host read. The engine is
driven through reset / prefill / stream / decode_greedy / info, so the NumPy engine, the CUDA engine, the
synthetic engine and the baseline are measured by the same code.
"""
from __future__ import annotations

import dataclasses
import math
import re
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from engine.errors import NinferError
from engine.bench_spec import SpecMismatch, SpecRun, spec_fields, spec_oracle, speculated

TOKEN_SEED = 0x6E696E66  # "ninf": the prompt tokens are the same on every machine and every run
FIRST_TOKEN = 1000  # stay clear of the low ids some vocabularies reserve for controls


# ---------------------------------------------------------------------------------- test matrix
@dataclass(frozen=True)
class Test:
    """One row of the matrix: prompt tokens, generated tokens, context depth filled first."""

    __test__ = False  # not a pytest class, despite the name
    n_prompt: int
    n_gen: int
    depth: int = 0

    @property
    def kind(self) -> str:
        if self.n_gen == 0:
            return "pp"
        return "tg" if self.n_prompt == 0 else "pg"

    @property
    def name(self) -> str:
        base = {"pp": f"pp{self.n_prompt}", "tg": f"tg{self.n_gen}"}.get(
            self.kind, f"pp{self.n_prompt}+tg{self.n_gen}"
        )
        return f"{base} @ d{self.depth}" if self.depth else base

    @property
    def context_needed(self) -> int:
        """Positions the cache must hold (the tg seed token counts as one)."""
        return self.depth + max(self.n_prompt, 1) + self.n_gen + 1


@dataclass(frozen=True)
class Sampling:
    """The sampler a streamed decode test draws with (temperature 0: greedy)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    regex: str | None = None  # every draw under this regex's grammar mask (engine.constraints)

    def config(self, max_tokens: int):
        from engine.generate import GenerationConfig  # noqa: PLC0415

        constraint = None
        if self.regex is not None:
            from engine.constraints import Constraint  # noqa: PLC0415

            constraint = Constraint.regex(self.regex)
        return GenerationConfig(max_tokens=max_tokens, temperature=self.temperature, top_k=self.top_k,
                                top_p=self.top_p, min_p=self.min_p, presence_penalty=self.presence_penalty,
                                frequency_penalty=self.frequency_penalty, seed=TOKEN_SEED, ignore_eos=True,
                                constraint=constraint)

    def as_dict(self) -> dict:
        d = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
             "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty}
        return d | ({"regex": self.regex} if self.regex is not None else {})


@dataclass(frozen=True)
class Instance:
    """Settings that need their own engine (llama-bench rebuilds the context for these)."""

    kv: str | None = None
    lanes: int = 1
    spec: str = "off"


_RANGE = re.compile(r"^(\d+)-(\d+)(?:([+*])(\d+))?$")


def parse_int_list(text: str | list[str] | None, flag: str) -> list[int]:
    """Parse `512,8192` or llama-bench ranges `first-last+step` / `first-last*mult` into ints."""
    if text is None:
        return []
    parts = [p.strip() for t in ([text] if isinstance(text, str) else text) for p in t.split(",")]
    out: list[int] = []
    for part in parts:
        if not part:
            continue
        m = _RANGE.match(part)
        if part.isdigit():
            out.append(int(part))
        elif m:
            lo, hi, op, step = int(m[1]), int(m[2]), m[3] or "+", int(m[4] or 1)
            if hi < lo or (op == "+" and step < 1) or (op == "*" and (step < 2 or lo < 1)):
                raise NinferError(f"{flag}: bad range {part!r}", "write first-last+step, e.g. 128-1024+128")
            v = lo
            while v <= hi:
                out.append(v)
                v = v + step if op == "+" else v * step
        else:
            raise NinferError(f"{flag}: {part!r} is not a non-negative integer", f"e.g. {flag} 512,8192")
    return list(dict.fromkeys(out))


def parse_pairs(text: str | list[str] | None, flag: str = "-pg") -> list[tuple[int, int]]:
    """Parse `-pg P,G` (repeatable, or `P,G;P,G`) into (prompt, gen) pairs."""
    if text is None:
        return []
    pairs = []
    for chunk in [c for t in ([text] if isinstance(text, str) else text) for c in t.split(";")]:
        nums = [s.strip() for s in chunk.split(",")]
        if len(nums) != 2 or not all(n.isdigit() for n in nums):
            raise NinferError(f"{flag}: {chunk!r} is not a PROMPT,GEN pair", f"e.g. {flag} 8192,128")
        p, g = int(nums[0]), int(nums[1])
        if p < 1 or g < 1:
            raise NinferError(f"{flag}: both numbers of {chunk!r} must be at least 1", f"e.g. {flag} 8192,128")
        pairs.append((p, g))
    return pairs


def expand_matrix(
    prompts: list[int], gens: list[int], pairs: list[tuple[int, int]], depths: list[int]
) -> list[Test]:
    """Every combination: for each depth, the pp tests, then tg, then pp+tg (zeros are skipped)."""
    tests: list[Test] = []
    for d in depths or [0]:
        tests += [Test(p, 0, d) for p in prompts if p > 0]
        tests += [Test(0, g, d) for g in gens if g > 0]
        tests += [Test(p, g, d) for p, g in pairs]
    return list(dict.fromkeys(tests))


def expand_instances(kvs: list[str | None], lanes: list[int], specs: list[str]) -> list[Instance]:
    """Every combination of the engine-level settings."""
    return [Instance(k, n, s) for k in kvs or [None] for n in lanes or [1] for s in specs or ["off"]]


# ---------------------------------------------------------------------------------- tokens
def bench_tokens(n: int, domain: int) -> list[int]:
    """A fixed pseudo-random token sequence (PCG64 is stable across NumPy versions)."""
    if domain <= FIRST_TOKEN:
        lo, hi = 0, max(domain, 1)
    else:
        lo, hi = FIRST_TOKEN, domain
    rng = np.random.Generator(np.random.PCG64(TOKEN_SEED))
    return rng.integers(lo, hi, size=n, dtype=np.int64).tolist()


# ---------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Stats:
    """Mean and sample standard deviation (n-1, as llama-bench) of a series, with its samples."""

    mean: float
    std: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples) -> "Stats":
        xs = tuple(float(x) for x in samples)
        if not xs:
            return cls(math.nan, math.nan, ())
        mean = math.fsum(xs) / len(xs)
        var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
        return cls(mean, math.sqrt(var), xs)

    def fmt(self, digits: int = 2) -> str:
        if math.isnan(self.mean):
            return "-"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


# ---------------------------------------------------------------------------------- costs
@dataclass
class Costs:
    """What one token costs in memory traffic and arithmetic; None where unknown."""

    weight_bytes: int | None = None  # resident
    weight_bytes_per_token: int | None = None  # read per decoded token (no embedding table; active experts)
    state_bytes: int = 0  # recurrent + conv state of one sequence, read and written back each step
    kv_bytes_per_token: int = 0  # per token of context, read once per step
    params_per_token: int | None = None  # matmul weights touched per token
    attn_flops_per_ctx: int = 0  # flops per new token per context token (QK^T and PV)

    def decode_bytes(self, context: float) -> float | None:
        """Bytes read (state: read + written) for one decode step over `context` positions."""
        if self.weight_bytes_per_token is None:
            return None
        return self.weight_bytes_per_token + 2 * self.state_bytes + self.kv_bytes_per_token * context

    def prefill_flops(self, n: int, start: int) -> float | None:
        if self.params_per_token is None:
            return None
        ctx_sum = n * start + n * (n + 1) / 2
        return 2.0 * self.params_per_token * n + self.attn_flops_per_ctx * ctx_sum


def costs_from_info(info: dict) -> Costs:
    """Read the byte/flop figures an engine reports in `info()` (`engine.api.Engine.info`'s keys)."""
    wb = info.get("weight_bytes")
    return Costs(
        weight_bytes=wb,
        weight_bytes_per_token=info.get("weight_bytes_per_token", wb),
        state_bytes=int(info.get("state_bytes", 0) or 0),
        kv_bytes_per_token=int(info.get("kv_bytes_per_token", 0) or 0),
        params_per_token=info.get("params_per_token"),
        attn_flops_per_ctx=int(info.get("attn_flops_per_ctx", 0) or 0),
    )


# ---------------------------------------------------------------------------------- memory
class MemoryProbe:
    """Peak memory of a test: device memory in use on the GPU, the process's peak RSS on NumPy.

    On Linux the RSS high-water mark is reset before each test (`/proc/self/clear_refs`), so a test's
    peak is its own and not that of an earlier, bigger one (or of the roofline measurement).
    """

    def __init__(self, device: str):
        self.cp = None
        if device == "gpu":
            from engine.backend import cupy_or_none  # noqa: PLC0415

            self.cp = cupy_or_none()
        self.label = "peak VRAM" if self.cp is not None else "peak RSS"
        self._gpu_peak = 0

    def reset(self) -> None:
        self._gpu_peak = 0
        if self.cp is None:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass

    def sample(self) -> int:
        """Bytes now (GPU) or the high-water mark (CPU); call after each repetition."""
        if self.cp is not None:
            free, total = self.cp.cuda.runtime.memGetInfo()
            self._gpu_peak = max(self._gpu_peak, int(total - free))
            return self._gpu_peak
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux, bytes on macOS
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def memory_probe(device: str) -> MemoryProbe:
    return MemoryProbe(device)


# ---------------------------------------------------------------------------------- runs
@dataclass
class Result:
    """One test of one instance: every timed sample and the derived figures."""

    test: Test
    instance: Instance
    seconds: Stats
    tps: Stats
    ttft_ms: Stats | None = None
    prefill_tps: Stats | None = None
    decode_tps: Stats | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    pct_matmul: float | None = None
    peak_mem_bytes: int | None = None
    extra: dict = field(default_factory=dict)


def _argmax(logits) -> int:
    return int(np.asarray(logits).reshape(-1).argmax())


def _streamed(engine, ids: list[int], n_gen: int, sampling: Sampling) -> tuple[float, float]:
    """(time to the first token, time from it to the last) of `Engine.stream` generating 1 + n_gen tokens: the
    first from the prompt's logits, then n_gen decode steps."""
    clock = time.perf_counter
    t0 = clock()
    t_first, count, last = None, 0, None
    for rec in engine.stream(ids, sampling.config(n_gen + 1)):
        if t_first is None:
            t_first = clock()
        count += 1
        last = rec
    t1 = clock()
    if count != n_gen + 1 or last.finish_reason != "length":
        raise RuntimeError(f"the stream gave {count} tokens ({last.finish_reason}), asked for {n_gen + 1}")
    return t_first - t0, t1 - t_first


def run_once(engine, test: Test, tokens: list[int], lanes: int = 1, sampling: Sampling | None = None,
             burst: bool = False, spec: SpecRun | None = None) -> dict:
    """Run one repetition of `test`; return its timings in seconds (untimed setup excluded). Decode goes through
    `engine.stream` with `sampling` unless `burst` (or the engine has no stream): then `decode_greedy`. With
    `spec`, decode runs speculative rounds (and the result carries their SpecStats as "spec")."""
    clock = time.perf_counter
    d, p, g = test.depth, test.n_prompt, test.n_gen
    ctx, prompt = tokens[:d], tokens[d : d + max(p, 1)]
    streamed = not burst and hasattr(engine, "stream")
    sampling = sampling or Sampling()
    if sampling.regex is not None and getattr(engine, "tokenizer", None) is None:  # (a synthetic engine)
        from engine.synthetic import tokenizer  # noqa: PLC0415

        engine.tokenizer = tokenizer(int(engine.args.vocab_size))
    if lanes > 1:
        raise NinferError(f"--lanes {lanes}: this engine runs one sequence at a time", "use --lanes 1")
    engine.reset()
    seek = 0
    if d and getattr(engine, "synthetic_depth", False):
        # random weights: a computed context means nothing, and its decode cost is that of any KV
        # content, so the depth is skipped to instead of prefilled (see `CudaEngine.seek_synthetic`)
        engine.seek_synthetic(d)
        seek, d, ctx = d, 0, []
    if spec is not None and g and streamed:
        if test.kind == "pg" and d:  # the context through the MTP head's capture too, untimed
            speculated(engine, ctx, 0, sampling, SpecRun(spec.k))
        pre, dt, stats = speculated(engine, [0] * seek + ctx + prompt, g, sampling, spec)
        if test.kind == "tg":
            return {"total": dt, "decode": dt, "spec": stats}
        return {"total": pre + dt, "prefill": pre, "decode": dt, "spec": stats}
    if test.kind == "tg":
        if streamed:  # the context and the one-token seed are prefilled inside the stream, before its first token
            _, dt = _streamed(engine, [0] * seek + ctx + prompt, g, sampling)
            return {"total": dt, "decode": dt}
        first = _argmax(engine.prefill(ctx + prompt))  # context plus the one-token seed, untimed
        t0 = clock()
        out = engine.decode_greedy(first, g)
        t1 = clock()
        if len(out) != g:
            raise RuntimeError(f"decode_greedy returned {len(out)} tokens, asked for {g}")
        return {"total": t1 - t0, "decode": t1 - t0}
    if d:
        engine.prefill(ctx)
    if test.kind == "pg" and streamed:
        pre, dt = _streamed(engine, [0] * seek + ctx + prompt, g, sampling)
        return {"total": pre + dt, "prefill": pre, "decode": dt}
    t0 = clock()
    logits = engine.prefill(prompt)
    t1 = clock()
    if test.kind == "pp":
        return {"total": t1 - t0, "prefill": t1 - t0}
    first = _argmax(logits)
    t2 = clock()
    out = engine.decode_greedy(first, g)
    t3 = clock()
    if len(out) != g:
        raise RuntimeError(f"decode_greedy returned {len(out)} tokens, asked for {g}")
    return {"total": t1 - t0 + t3 - t2, "prefill": t1 - t0, "decode": t3 - t2}


def run_test(
    engine,
    test: Test,
    instance: Instance,
    *,
    repetitions: int,
    warmup: int,
    tokens: list[int],
    costs: Costs,
    roofline: dict | None = None,
    memory=None,
    sampling: Sampling | None = None,
    burst: bool = False,
    spec: SpecRun | None = None,
) -> Result:
    """Time `test` `repetitions` times after `warmup` dropped runs; derive tok/s, TTFT and bounds. With `burst`, a
    decoding test is also timed through `decode_greedy` (`burst_ts` beside the streamed figures). With `spec`, decode
    runs speculative rounds; forced acceptance (`spec.accept`) first decodes the plain greedy oracle, and a
    speculative output that differs from it gives a row whose `extra["error"]` says where."""
    lanes = instance.lanes
    runs = []
    peak = None
    if memory is not None:
        memory.reset()
    streamed = hasattr(engine, "stream")
    if spec is not None and test.n_gen:
        # a one-token speculative run first: what the rounds need is built before any sequence is held (the CUDA
        # engine's speculator drops the held one when it is built, a synthetic depth's seek with it)
        speculated(engine, tokens[:1], 0, Sampling(), SpecRun(spec.k))
        if spec.accept is not None:
            spec = SpecRun(spec.k, spec.accept, spec_oracle(engine, test, tokens, spec.k))
    for i in range(warmup + repetitions):
        try:
            r = run_once(engine, test, tokens, lanes, sampling=sampling,
                         spec=spec and dataclasses.replace(spec, seed=TOKEN_SEED + i))
        except SpecMismatch as e:
            nan = Stats.of([])
            return Result(test, instance, nan, nan, extra={"error": str(e), **spec_fields(spec, [])})
        if i >= warmup:
            runs.append(r)
        if memory is not None:
            peak = memory.sample()
    bursts = []
    if burst and streamed and test.n_gen:
        for i in range(warmup + repetitions):
            r = run_once(engine, test, tokens, lanes, burst=True)
            if i >= warmup:
                bursts.append(lanes * test.n_gen / r["decode"])
    n_tok = lanes * (test.n_prompt + test.n_gen)
    tps = Stats.of(n_tok / r["total"] for r in runs)
    res = Result(test, instance, Stats.of(r["total"] for r in runs), tps, peak_mem_bytes=peak)
    if "prefill" in runs[0]:
        res.ttft_ms = Stats.of(1e3 * r["prefill"] for r in runs)
        res.prefill_tps = Stats.of(lanes * test.n_prompt / r["prefill"] for r in runs)
    if "decode" in runs[0]:
        res.decode_tps = Stats.of(lanes * test.n_gen / r["decode"] for r in runs)
        res.extra["path"] = "stream" if streamed else "burst"
        res.extra["sampling"] = (sampling or Sampling()).as_dict() if streamed else {"temperature": 0.0}
        if bursts:
            b = Stats.of(bursts)
            res.extra |= {"burst_ts": b.mean, "burst_ts_std": b.std}
    if any("spec" in r for r in runs):
        from engine.speculative import draft_head  # noqa: PLC0415

        res.extra |= spec_fields(spec, runs) | {"draft_head": draft_head(engine)}
    _add_bounds(res, costs, roofline or {})
    return res


def _add_bounds(res: Result, costs: Costs, roofline: dict) -> None:
    """Achieved GB/s over the decode part (bytes per step x steps/s), TFLOP/s over the prefill part."""
    t = res.test
    if res.decode_tps is not None:
        # step i of n attends over depth + prompt + i + 2 positions (seed or prompt, then fed tokens)
        mean_ctx = t.depth + max(t.n_prompt, 1) + (t.n_gen + 1) / 2
        per_step = costs.decode_bytes(mean_ctx)
        if per_step is not None and res.extra.get("round_ms"):  # a round reads the weights once for its columns
            res.gbps = per_step / (res.extra["round_ms"] / 1e3) / 1e9
            bw = roofline.get("copy_gbps")
            if bw:
                res.pct_copy = 100.0 * res.gbps / bw
        elif per_step is not None:
            # lanes share one read of the weights per step; each lane reads its own state and KV
            lanes = res.instance.lanes
            shared = costs.weight_bytes_per_token
            step_bytes = shared + lanes * (per_step - shared)
            res.gbps = step_bytes * res.decode_tps.mean / lanes / 1e9
            bw = roofline.get("copy_gbps")
            if bw:
                res.pct_copy = 100.0 * res.gbps / bw
    if res.prefill_tps is not None:
        flops = costs.prefill_flops(t.n_prompt, t.depth)
        if flops is not None:
            secs = res.instance.lanes * t.n_prompt / res.prefill_tps.mean
            res.tflops = res.instance.lanes * flops / secs / 1e12
            peak = roofline.get("matmul_tflops")
            if peak:
                res.pct_matmul = 100.0 * res.tflops / peak
