// This machine's memory read bandwidth: the ceiling that decode (a GEMV streaming every weight
// once per token) is measured against.
#pragma once

namespace pagellm {

// Multithreaded streaming reads (the global thread pool) over a buffer several times the last-level
// cache, best of a few passes, in GB/s (1e9 bytes per second). Takes about a second; allocates up
// to 2 GiB (less when the machine has less memory available). Returns 0 if no memory could be had.
double measure_read_bandwidth_gbs();

}  // namespace pagellm
