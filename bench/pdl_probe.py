"""Does programmatic dependent launch shorten a chain of kernels inside a CUDA graph (as the decode step
captures it)? The decode step measured the same with and without it until session 20 found that no launch had
carried the attribute's value (kernels._LaunchAttr); with it, the 35B-A3B's step gained 5% (bench/NOTES-decode.md).

Run on the GPU machine:  python bench/pdl_probe.py
Chains of N launches captured into one graph through engine.gpu.launch.Launch (cuLaunchKernelEx with
programmatic stream serialization when kernels.PDL is on), timed over replays, for
  empty   one block that only waits (the launch-to-launch cost),
  stream  a memory-bound kernel reading its own 24 MiB slice (a mid-size GEMV's bytes) with the wait
          at entry, and with its first loads issued before the wait.
Prints microseconds per launch, plain against PDL.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

from engine.gpu import launch as K  # noqa: E402

SRC = r"""
#define WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
extern "C" __global__ void empty_k(int* p) {
  TRIGGER(); WAIT();
  if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += 1;
}
// every thread sums its uint4s of a slice; early != 0: the first 2 loads before the wait
extern "C" __global__ void stream_k(const uint4* __restrict__ w, long long n4, float* out, int early) {
  TRIGGER();
  const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x, nt = (long long)gridDim.x * blockDim.x;
  unsigned int acc = 0;
  long long i = tid;
  uint4 a = make_uint4(0, 0, 0, 0), b = make_uint4(0, 0, 0, 0);
  if (early) {
    if (i < n4) a = __ldg(w + i);
    if (i + nt < n4) b = __ldg(w + i + nt);
  }
  WAIT();
  if (early) {
    acc += a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    i += 2 * nt;
  }
  for (; i < n4; i += nt) {
    const uint4 v = __ldg(w + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = 1.f;  // keeps the loads
}
// one block: lets the next kernel launch (PDL), spins for `ns` nanoseconds, writes when it ended
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void light_k(unsigned long long* stamps, long long ns) {
  TRIGGER();
  WAIT();
  const unsigned long long t0 = gtime();
  while (gtime() - t0 < (unsigned long long)ns) { }
  if (threadIdx.x == 0) stamps[0] = gtime();
}
// every block writes when it started (before the wait) and when the wait returned
extern "C" __global__ void stamp_k(unsigned long long* stamps) {
  const unsigned long long t0 = gtime();
  TRIGGER();
  WAIT();
  const unsigned long long t1 = gtime();
  if (threadIdx.x == 0) { stamps[1 + 2 * blockIdx.x] = t0; stamps[2 + 2 * blockIdx.x] = t1; }
}
// asks L2 for `bytes` from p, one 128-byte line a thread
extern "C" __global__ void prefetch_k(const unsigned char* p, long long bytes) {
  for (long long o = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 128; o < bytes;
       o += (long long)gridDim.x * blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p + o));
}
"""


def time_branches(body, n_kernels, reps=5):
    """body(main, side) launches a chain, forking work onto `side` with events; us per main kernel."""
    s, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s:
        body(s, side)
        s.synchronize()
        s.begin_capture()
        body(s, side)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        best = 1e9
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(e0, e1))
    return best * 1e3 / n_kernels


def fork(main, side, fn):
    """fn() on `side`, after what `main` has so far; returns the event that marks its end."""
    ev = cp.cuda.Event(disable_timing=True)
    ev.record(main)
    side.wait_event(ev)
    with side:
        fn()
    done = cp.cuda.Event(disable_timing=True)
    done.record(side)
    return done


def time_chain(launches):
    """us a launch of `launches` one after the other in one graph."""
    def body(main, side):
        for lo in launches:
            lo()
    return time_branches(body, len(launches))


def overlap(mod, sms):
    """Does a kernel launched with PDL start (blocks resident, before griddepcontrol.wait) while the kernel
    before it still runs, inside a captured graph and on a plain stream? Prints microseconds from the first
    kernel's end to the second's block entries (negative: started early) and to its wait's return."""
    light, stamp = mod.get_function("light_k"), mod.get_function("stamp_k")
    nb = sms * 2
    st = cp.zeros(1 + 2 * nb, dtype=cp.uint64)
    for pdl in (False, True):
        K.PDL = pdl
        chain = [K.Launch(light, (1,), 32, (np.uint64(st.data.ptr), np.int64(20000))),
                 K.Launch(stamp, (nb,), 256, (np.uint64(st.data.ptr),))]
        for mode in ("stream", "graph"):
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                if mode == "stream":
                    for lo in chain:
                        lo()
                else:
                    s.begin_capture()
                    for lo in chain:
                        lo()
                    g = s.end_capture()
                    g.launch(s)
                s.synchronize()
            a = st.get().astype(np.int64)
            end, entry, waited = a[0], a[1::2], a[2::2]
            print(f"overlap {'PDL  ' if pdl else 'plain'} {mode:6s}: entry - previous end min {(entry.min() - end) / 1e3:7.2f} "
                  f"median {(np.median(entry) - end) / 1e3:7.2f} us; wait returned {(waited.min() - end) / 1e3:6.2f} us",
                  flush=True)
    K.PDL = True


def main():
    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    empty, stream = mod.get_function("empty_k"), mod.get_function("stream_k")
    p = cp.zeros(4, dtype=cp.int32)
    out = cp.zeros(4, dtype=cp.float32)
    n_slices, slice_bytes = 64, 24 << 20
    w = cp.zeros(n_slices * slice_bytes // 16 * 4, dtype=cp.uint32)
    n4 = slice_bytes // 16
    sms = K.sm_count()
    overlap(mod, sms)
    if "--overlap" in sys.argv:
        return
    for pdl in (False, True):
        K.PDL = pdl
        chain = [K.Launch(empty, (1,), 32, (np.uint64(p.data.ptr),)) for _ in range(400)]
        us = time_chain(chain)
        print(f"empty   {'PDL  ' if pdl else 'plain'}: {us:6.2f} us a launch", flush=True)
        for early in (0, 1):
            chain = [K.Launch(stream, (sms * 4,), 256,
                              (np.uint64(w.data.ptr + i * slice_bytes), np.int64(n4), np.uint64(out.data.ptr),
                               np.int32(early))) for i in range(n_slices)]
            us = time_chain(chain)
            print(f"stream  {'PDL  ' if pdl else 'plain'} early={early}: {us:6.2f} us a launch "
                  f"({slice_bytes / (us * 1e-6) / 1e9:7.1f} GB/s)", flush=True)
    K.PDL = False
    prefetch = mod.get_function("prefetch_k")
    slices = [K.Launch(stream, (sms * 4,), 256, (np.uint64(w.data.ptr + i * slice_bytes), np.int64(n4),
                                                  np.uint64(out.data.ptr), np.int32(0))) for i in range(n_slices)]

    def pairs(main, side):  # kernels 2i and 2i+1 at once (independent GEMVs of one layer)
        for i in range(0, n_slices, 2):
            done = fork(main, side, slices[i + 1])
            slices[i]()
            main.wait_event(done)
    print(f"stream  two at once: {time_branches(pairs, n_slices):6.2f} us a kernel", flush=True)
    for mib in (2, 4, 8, 16):
        pf = [K.Launch(prefetch, (sms * 2,), 256, (np.uint64(w.data.ptr + i * slice_bytes), np.int64(mib << 20)))
              for i in range(n_slices)]

        def ahead(main, side, pf=pf):  # while kernel i runs, L2 is asked for the start of kernel i+1's slice
            for i in range(n_slices):
                done = fork(main, side, pf[(i + 1) % n_slices])
                slices[i]()
                main.wait_event(done)
        print(f"stream  + L2 prefetch of the next {mib:2d} MiB: {time_branches(ahead, n_slices):6.2f} us a kernel",
              flush=True)
    K.PDL = True


if __name__ == "__main__":
    main()
