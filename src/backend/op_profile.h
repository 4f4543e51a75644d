// Per-op time tables: what ProfilingBackend (backend/profiling_backend.h) records for each op of a
// step, and the table `pagellm bench latency --profile` prints from it: time per op and shape,
// share of the step, achieved GB/s and TFLOP/s, and the fraction of the device's ceilings, so the
// gap between a step's time and what the hardware allows is explained op by op.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace pagellm {

// One op call as recorded: its cost model (bytes, flops) and its time on the backend's timeline.
struct OpSample {
  std::string op;     // the Backend method: "matmul", "attention", ...
  std::string shape;  // the key that groups calls of one shape, e.g. "n=1 k=4096 m=14336 bf16"
  double bytes = 0;   // bytes the op must move to or from memory (its minimum traffic)
  double flops = 0;   // floating-point operations, a multiply-add counting 2; 0 for data movement
  double ms = 0;      // time between the timestamps bracketing the op
};

// The ceilings achieved rates are compared with. 0 means unknown (that column is omitted).
struct OpCeilings {
  double bandwidth_gbs = 0;  // measure_memory_bandwidth_gbs of the backend
  double tflops = 0;         // peak dense compute of the activation dtype (798 for bf16 on an H200)
};

struct OpProfileRow {
  std::string op, shape;
  int64_t calls = 0;
  double ms = 0;     // total over the calls
  double bytes = 0;  // total over the calls
  double flops = 0;  // total over the calls
  double share = 0;  // of the step's summed op time, in [0, 1]
  double gb_per_s() const { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }
  double tflop_per_s() const { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; }
};

struct OpProfileTable {
  std::string step;                // e.g. "prefill, 512 tokens"
  std::vector<OpProfileRow> rows;  // one per (op, shape), the most time first
  int64_t calls = 0;
  double sum_ms = 0;   // summed op time
  double bytes = 0, flops = 0;
  double wall_ms = 0;  // wall time of the same step run without profiling; 0: not measured
  std::string wall_of = "the unprofiled step";  // what wall_ms timed, for the table's last line
  OpCeilings ceilings;
};

// The shape key of a sample without what changes from step to step (token and sequence counts,
// context lengths, copy sizes), so a whole serving run groups into one row per weight matrix and
// op kind: "matmul n=740 k=4096 m=6144 bf16" -> "k=4096 m=6144 bf16". Attention keeps whether
// the call was decode only (one query per sequence) or had prefill chunks in it.
std::string step_independent_shape(const OpSample& s);

// Groups samples by (op, shape), in order of total time (ties: first seen first).
OpProfileTable summarize_ops(std::string step, std::span<const OpSample> samples, double wall_ms,
                             const OpCeilings& ceilings);

// The table as fixed-width text, ending with the line comparing the summed op time with the
// unprofiled step's wall time (their difference is launch and host overhead).
std::string format_op_table(const OpProfileTable& t);

// The table as JSON: {"step", "sum_ms", "wall_ms", "overhead_ms", "ceilings", "rows": [...]}.
nlohmann::json op_table_json(const OpProfileTable& t);

}  // namespace pagellm
