// bench/memory_bandwidth.h — the machine's memory bandwidth, measured in the
// same process as a scenario so its figures read as a fraction of a limit
// (`arbiter bench decode`'s roofline, `arbiter bench kv`'s memcpy context).
//
// Both return bytes per second (divide by 1e9 for GbPerSecond's unit) and
// take the best of 5 timed passes after one untimed pass that faults the
// buffers in. `n_threads` threads each take one contiguous part (the caller
// runs part 0).
//
// Thread safety: thread-safe, but it measures the whole machine: run it with
// nothing else computing.
#pragma once

#include <cstddef>

namespace arbiter {

// memcpy of `bytes` (rounded up to 4 KiB) between two buffers: bytes copied
// per second. Each byte is read once and written once, so DRAM traffic is
// ≥ 2× this figure.
double MeasureMemcpyBandwidth(size_t bytes = size_t{256} << 20, int n_threads = 1);

// Sequential read (a sum of floats) of `bytes` (rounded up to 4 KiB): bytes
// read per second — pure read streams, like decode's weight reads.
double MeasureReadBandwidth(size_t bytes = size_t{256} << 20, int n_threads = 1);

}  // namespace arbiter
