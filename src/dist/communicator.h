// Collectives between the ranks that hold one model split over several devices (tensor parallel:
// each rank a slice of every projection; expert parallel: each rank a share of the MoE experts).
// One Communicator per rank; every rank calls the same collectives in the same order, each call
// returning when the rank's result is complete. Implementations: CPU threads of one process over
// shared memory (dist/cpu_communicator.h), so that every sharded path runs and is checked against
// the unsharded model in CI; NCCL on GPUs.
//
// Reductions add in rank order (rank 0 + rank 1 + ...) on every rank, so all ranks get bit-for-bit
// the same values: the ranks' copies of a replicated activation never drift apart.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace pagellm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: buf (n values on every rank) becomes the element-wise sum over the ranks.
  virtual void all_reduce(Tensor& buf) = 0;
  // out [size * n] = every rank's in [n], in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // out [n] = rank r's part, [r * n, (r + 1) * n), of the element-wise sum of every rank's
  // in [size * n].
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // Rows of row_bytes bytes, for expert parallelism's dispatch and combine: this rank sends
  // send_counts[j] rows to rank j (send holds them grouped by destination, rank order) and
  // receives recv_counts[j] rows from rank j (written to recv grouped by source, rank order).
  // recv_counts[j] must be rank j's send_counts[this rank].
  virtual void all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                          std::span<const int64_t> recv_counts, int64_t row_bytes) = 0;
  // bytes at buf on `root` copied to buf on every rank.
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
};

}  // namespace pagellm
