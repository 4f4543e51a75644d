// Shared helpers of the CUDA op tests: every CUDA op runs against the CPU reference backend
// (make_cpu_backend(false)) on the same random inputs. Inputs are generated in f32, rounded to
// bf16 once, and both backends see exactly those values (the CPU in f32, the GPU in bf16), so the
// only differences are the GPU's bf16 output rounding and fp32 summation order.
//
// Every device output lives between two guard zones of sentinel bytes that are checked after the
// op; every comparison counts as a checked case, and a test binary that checks none fails.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace pagellm::optest {

// Base seed of every case; a failure prints the case's own seed. PAGELLM_OPS_SEED overrides it.
inline uint64_t base_seed() {
  const char* s = std::getenv("PAGELLM_OPS_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 20250601ull;
}

// splitmix64: fast enough to fill the 128256 x 4096 embedding table, and fully reproducible.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t s_;
};

inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

// n values uniform in [-amp, amp), already rounded to bf16.
inline std::vector<float> random_bf16_values(Rng& rng, int64_t n, float amp = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(rng.uniform(-amp, amp));
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
inline std::vector<float> from_bf16_bits(const uint16_t* b, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}

// Total number of comparisons performed in this process.
inline int64_t& n_cases_checked() {
  static int64_t n = 0;
  return n;
}

// The backends under test, created once per process.
Backend* cuda_backend();  // null when unavailable; cuda_status() says why
const std::string& cuda_status();
Backend& cpu_reference();

#define PAGELLM_REQUIRE_CUDA()                                      \
  Backend* cuda_ptr = ::pagellm::optest::cuda_backend();            \
  ASSERT_NE(cuda_ptr, nullptr) << "CUDA backend unavailable: "      \
                               << ::pagellm::optest::cuda_status(); \
  Backend& cuda = *cuda_ptr;                                        \
  Backend& cpu = ::pagellm::optest::cpu_reference()

// A device allocation with kGuard sentinel bytes before and after the payload.
class DevBuf {
 public:
  static constexpr int64_t kGuard = 256;  // keeps the payload 256-byte aligned
  static constexpr uint8_t kSentinel = 0xA5;

  DevBuf(Backend& be, int64_t nbytes) : be_(&be), nbytes_(nbytes) {
    buf_ = be.allocate(nbytes + 2 * kGuard);
    std::vector<uint8_t> init(nbytes + 2 * kGuard, kSentinel);
    be.copy_from_host(buf_->data(), init.data(), static_cast<int64_t>(init.size()));
  }
  void* data() const { return static_cast<char*>(buf_->data()) + kGuard; }
  int64_t nbytes() const { return nbytes_; }
  Tensor view(DType dtype, std::initializer_list<int64_t> shape) const {
    Tensor t(data(), dtype, shape, Device::kCuda);
    EXPECT_LE(dtype_bytes(dtype, t.numel()), nbytes_) << "test bug: view larger than buffer";
    return t;
  }
  void upload(const void* host, int64_t nbytes) {
    EXPECT_LE(nbytes, nbytes_);
    be_->copy_from_host(data(), host, nbytes);
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> v(nbytes_ / sizeof(T));
    be_->copy_to_host(v.data(), data(), static_cast<int64_t>(v.size() * sizeof(T)));
    return v;
  }
  // Empty when both guard zones still hold the sentinel; otherwise what was overwritten.
  std::string guard_damage() const {
    std::vector<uint8_t> all(nbytes_ + 2 * kGuard);
    be_->copy_to_host(all.data(), buf_->data(), static_cast<int64_t>(all.size()));
    std::ostringstream os;
    int bad = 0;
    for (int64_t i = 0; i < kGuard; ++i) {
      const int64_t before = i, after = kGuard + nbytes_ + i;
      if (all[before] != kSentinel && bad++ < 4)
        os << " byte " << (before - kGuard) << " (before the buffer)";
      if (all[after] != kSentinel && bad++ < 4) os << " byte +" << i << " past the end";
    }
    if (bad > 0) os << " [" << bad << " guard bytes overwritten]";
    return os.str();
  }

 private:
  Backend* be_;
  std::unique_ptr<Buffer> buf_;
  int64_t nbytes_;
};

// A device buffer of bf16 values.
inline std::unique_ptr<DevBuf> upload_bf16(Backend& be, const std::vector<float>& v) {
  auto b = std::make_unique<DevBuf>(be, static_cast<int64_t>(v.size()) * 2);
  const auto bits = to_bf16_bits(v);
  b->upload(bits.data(), static_cast<int64_t>(bits.size()) * 2);
  return b;
}
template <typename T>
std::unique_ptr<DevBuf> upload_raw(Backend& be, const std::vector<T>& v) {
  auto b = std::make_unique<DevBuf>(be, static_cast<int64_t>(v.size() * sizeof(T)));
  b->upload(v.data(), static_cast<int64_t>(v.size() * sizeof(T)));
  return b;
}
inline std::vector<float> download_bf16(const DevBuf& b) {
  const auto bits = b.download<uint16_t>();
  return from_bf16_bits(bits.data(), static_cast<int64_t>(bits.size()));
}

// Tolerance: |got - want| <= rtol * max(|want|, floor_frac * rms(want)). The floor keeps values
// that cancel to near zero from demanding a relative accuracy no rounding model gives.
struct Tol {
  double rtol;
  double floor_frac;
  const char* why;
};
// bf16 keeps 8 significant bits: one rounding of the output is <= 2^-9 relative; 1e-2 leaves room
// for a second rounding of an intermediate (the bf16 residual) and fp32 summation order. The floor
// (1% of the rms) covers outputs that cancel to near zero, where fp32 summation over K = 14336
// terms or 20000 attention keys leaves an absolute error of ~1e-5 of the rms on either side.
inline constexpr Tol kBf16Tol{1e-2, 1e-2,
                              "bf16 output rounding (2^-9 relative) plus fp32 summation order"};
inline constexpr Tol kExact{0.0, 0.0, "a copy or exact conversion: bit-identical values expected"};

// Compares got against want; `what` names the op, sizes and seed for the failure message.
// `slack` (optional, per element): an absolute error allowed on top of the relative bound, for
// outputs whose rounding depends on the magnitude of intermediate terms rather than the result.
inline ::testing::AssertionResult compare(const std::string& what, const std::vector<float>& got,
                                          const std::vector<float>& want, const Tol& tol,
                                          const std::vector<float>* slack = nullptr) {
  ++n_cases_checked();
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  double ss = 0.0;
  for (float w : want) ss += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(want.size()));
  const double floor = tol.floor_frac * rms;
  int64_t n_bad = 0;
  double worst = 0.0;
  int64_t worst_i = -1;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double err = std::fabs(g - w);
    const double bound = tol.rtol * std::max(std::fabs(w), floor) + (slack ? (*slack)[i] : 0.0);
    const bool ok =
        std::isfinite(g) == std::isfinite(w) && (err <= bound || (!std::isfinite(w) && g == w));
    if (!ok) {
      if (n_bad < 5)
        first << "\n    [" << i << "] got " << g << " want " << w << " (err " << err << ", bound "
              << bound << ")";
      ++n_bad;
    }
    const double rel = err / std::max({std::fabs(w), floor, 1e-30});
    if (std::isfinite(rel) && rel > worst) worst = rel, worst_i = static_cast<int64_t>(i);
  }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << n_bad << " of " << got.size() << " values out of tolerance (rtol "
         << tol.rtol << ", floor " << tol.floor_frac << " x rms " << rms << "; " << tol.why
         << "); worst relative error " << worst << " at [" << worst_i << "]; first:" << first.str();
}

inline ::testing::AssertionResult guards_ok(const std::string& what, const DevBuf& b) {
  const std::string dmg = b.guard_damage();
  if (dmg.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": write outside the output buffer:" << dmg;
}

// A graph batch's padding tokens (a query, no context): their outputs, the values of `got` from
// `n_real` on, are 0, not NaN or stale values.
inline ::testing::AssertionResult padding_outputs_zero(const std::string& what,
                                                       const std::vector<float>& got,
                                                       size_t n_real) {
  if (got.size() <= n_real) return ::testing::AssertionSuccess();
  const std::vector<float> pad(got.begin() + static_cast<std::ptrdiff_t>(n_real), got.end());
  return compare(what + " padding tokens", pad, std::vector<float>(pad.size(), 0.0f), kExact);
}

// Records `call` in a CUDA graph (after a direct run of it, which sized its scratch), replays it
// into its cleared bf16 output `out`, and expects the direct run's values `got`, bit for bit.
template <typename F>
void expect_graph_replay_matches(Backend& cuda, const std::string& what, F&& call, DevBuf& out,
                                 const std::vector<float>& got) {
  std::unique_ptr<OpGraph> graph = cuda.capture(call);
  ASSERT_NE(graph, nullptr) << what << ": the call could not be recorded";
  const std::vector<uint16_t> zeros(static_cast<size_t>(out.nbytes() / 2), 0);
  out.upload(zeros.data(), static_cast<int64_t>(zeros.size() * 2));
  graph->replay();
  std::vector<float> replayed = download_bf16(out);
  replayed.resize(got.size());
  EXPECT_TRUE(compare(what + " graph replay", replayed, got, kExact));
}

// "name seed=S n=.. k=.." labels for messages.
class Label {
 public:
  Label(const std::string& op, uint64_t seed) { os_ << op << " [seed=" << seed; }
  template <typename T>
  Label& operator()(const char* k, const T& v) {
    os_ << " " << k << "=" << v;
    return *this;
  }
  std::string str() const { return os_.str() + "]"; }
  operator std::string() const { return str(); }  // NOLINT: convenience

 private:
  std::ostringstream os_;
};

// Host f32 tensor over a vector.
inline Tensor host_f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::kF32, shape, Device::kCpu);
}

}  // namespace pagellm::optest
