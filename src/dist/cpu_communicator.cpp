#include "dist/cpu_communicator.h"

#include <barrier>
#include <cstring>
#include <string>

#include "core/check.h"

namespace pagellm {
namespace {

// What the ranks of one group share: a barrier, and per rank the buffer (and counts) it offers
// to the current collective and the scratch it reduces into.
struct Group {
  explicit Group(int n) : size(n), sync(n), data(n), count(n, 0), counts(n), scratch(n) {}
  int size;
  std::barrier<> sync;
  std::vector<const void*> data;
  std::vector<int64_t> count;
  std::vector<std::span<const int64_t>> counts;
  std::vector<std::vector<float>> scratch;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Group> group, int rank) : g_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  void all_reduce(Tensor& buf) override {
    const int64_t n = values(buf, "all_reduce");
    publish(buf.data, n);
    // Rank r sums part r over the ranks, in rank order, into its scratch; then every rank
    // copies every part. Three barriers: offered, summed, copied (the scratch is free again).
    const auto [lo, hi] = part(n, rank_);
    std::vector<float>& mine = g_->scratch[rank_];
    mine.assign(static_cast<size_t>(hi - lo), 0.0f);
    for (int q = 0; q < g_->size; ++q) {
      PAGELLM_CHECK_MSG(g_->count[q] == n, "all_reduce: the ranks' sizes differ");
      const float* src = static_cast<const float*>(g_->data[q]);
      for (int64_t i = lo; i < hi; ++i) mine[i - lo] = q == 0 ? src[i] : mine[i - lo] + src[i];
    }
    g_->sync.arrive_and_wait();
    float* dst = static_cast<float*>(buf.data);
    for (int q = 0; q < g_->size; ++q) {
      const auto [qlo, qhi] = part(n, q);
      if (qhi > qlo) std::memcpy(dst + qlo, g_->scratch[q].data(), (qhi - qlo) * sizeof(float));
    }
    g_->sync.arrive_and_wait();
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    const int64_t n = values(in, "all_gather");
    PAGELLM_CHECK_MSG(values(out, "all_gather") == n * g_->size,
                      "all_gather: out must hold size x in's values");
    publish(in.data, n);
    for (int q = 0; q < g_->size; ++q) {
      PAGELLM_CHECK_MSG(g_->count[q] == n, "all_gather: the ranks' sizes differ");
      std::memcpy(static_cast<float*>(out.data) + q * n, g_->data[q], n * sizeof(float));
    }
    g_->sync.arrive_and_wait();
  }

  void reduce_scatter(const Tensor& in, Tensor& out) override {
    const int64_t n = values(out, "reduce_scatter");
    PAGELLM_CHECK_MSG(values(in, "reduce_scatter") == n * g_->size,
                      "reduce_scatter: in must hold size x out's values");
    publish(in.data, n * g_->size);
    float* dst = static_cast<float*>(out.data);
    for (int q = 0; q < g_->size; ++q) {
      PAGELLM_CHECK_MSG(g_->count[q] == n * g_->size, "reduce_scatter: the ranks' sizes differ");
      const float* src = static_cast<const float*>(g_->data[q]) + rank_ * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = q == 0 ? src[i] : dst[i] + src[i];
    }
    g_->sync.arrive_and_wait();
  }

  void all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                  std::span<const int64_t> recv_counts, int64_t row_bytes) override {
    const int n = g_->size;
    PAGELLM_CHECK_MSG(
        static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
        "all_to_all: one count per rank");
    g_->counts[rank_] = send_counts;
    publish(send, 0);
    int64_t at = 0;  // rows received so far
    for (int q = 0; q < n; ++q) {
      std::span<const int64_t> theirs = g_->counts[q];
      int64_t before = 0;  // rows rank q sends to the ranks before this one
      for (int j = 0; j < rank_; ++j) before += theirs[j];
      PAGELLM_CHECK_MSG(theirs[rank_] == recv_counts[q],
                        ("all_to_all: rank " + std::to_string(q) + " sends " +
                         std::to_string(theirs[rank_]) + " rows to rank " + std::to_string(rank_) +
                         ", which expects " + std::to_string(recv_counts[q]))
                            .c_str());
      if (recv_counts[q] > 0)
        std::memcpy(static_cast<char*>(recv) + at * row_bytes,
                    static_cast<const char*>(g_->data[q]) + before * row_bytes,
                    recv_counts[q] * row_bytes);
      at += recv_counts[q];
    }
    g_->sync.arrive_and_wait();
  }

  void broadcast(void* buf, int64_t bytes, int root) override {
    PAGELLM_CHECK(root >= 0 && root < g_->size);
    publish(buf, bytes);
    PAGELLM_CHECK_MSG(g_->count[root] == bytes, "broadcast: the ranks' sizes differ");
    if (rank_ != root && bytes > 0) std::memcpy(buf, g_->data[root], bytes);
    g_->sync.arrive_and_wait();
  }

  void barrier() override { g_->sync.arrive_and_wait(); }

 private:
  // The values of a contiguous f32 host tensor.
  static int64_t values(const Tensor& t, const char* op) {
    PAGELLM_CHECK_MSG(
        t.dtype == DType::kF32 && t.is_contiguous(),
        (std::string(op) + ": the CPU communicator takes contiguous f32 tensors").c_str());
    return t.numel();
  }
  // Offers data (n values or bytes) to the collective, and waits until every rank has.
  void publish(const void* data, int64_t n) {
    g_->data[rank_] = data;
    g_->count[rank_] = n;
    g_->sync.arrive_and_wait();
  }
  // Rank q's part of n values: [q * n / size, (q + 1) * n / size).
  std::pair<int64_t, int64_t> part(int64_t n, int q) const {
    return {q * n / g_->size, (q + 1) * n / g_->size};
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int n) {
  PAGELLM_CHECK(n >= 1);
  auto group = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<CpuCommunicator>(group, r));
  return out;
}

}  // namespace pagellm
