// Device sampling (Backend::sample) against the CPU Sampler on the same logits: every mode
// (greedy, temperature, top-k, top-p, min-p and their combinations, penalties, logit_bias,
// min_tokens, logprobs 0..20), rows with -inf, rows left with nothing to sample after the edits,
// NaN and +inf rows, n > 1 rows sharing one logits row, vocabularies 1 .. 128256, bf16 and f32
// logits (the CPU reads the bf16 values converted to f32), and every layout of blocks per row.
//
// Tokens, ranks, top-N lists and row statuses must be identical. The one allowed difference is
// the one sampler.h names: the device sums masses in another order (trees, not a loop), so where
// the two draw different tokens the test requires the CPU's u to lie within kBoundaryRel of a CDF
// boundary of the CPU's kept set, or the top-p cut to sit within kBoundaryRel of a boundary of
// the token order; otherwise the case fails. Logprobs may differ by the last bits of a double
// log-sum-exp summed in another order (kLogprobTol).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "op_test_util.h"
#include "sample/logits_processors.h"
#include "sample/sample_batch.h"
#include "sample/sample_math.h"
#include "sample/sampler.h"

namespace pagellm::optest {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Masses over <= 128256 float terms summed in double in two orders differ by at most
// n * 2^-53 ~ 1.5e-11 of the total; 1e-9 leaves room and is still far below any real gap.
constexpr double kBoundaryRel = 1e-9;
// logprob = float(x - lse): lse from double sums in another order, then rounded to float; they
// may land one float ulp apart (1.2e-7 relative), never more than a few.
constexpr double kLogprobTol = 1e-6;

const std::vector<int32_t> kEos = {2};

float normal(Rng& rng) {
  const float u1 = std::max(rng.uniform(0.0f, 1.0f), 1e-7f), u2 = rng.uniform(0.0f, 1.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

// A row of logits of one of several shapes.
enum class Shape { kPeaked, kFlat, kTies, kMasked, kWide, kCount };
const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kPeaked:
      return "peaked";
    case Shape::kFlat:
      return "flat";
    case Shape::kTies:
      return "ties";
    case Shape::kMasked:
      return "masked";
    case Shape::kWide:
      return "wide";
    default:
      return "?";
  }
}
void fill_row(Rng& rng, Shape shape, float* x, int32_t v) {
  for (int32_t t = 0; t < v; ++t) {
    switch (shape) {
      case Shape::kPeaked:
        x[t] = 2.0f * normal(rng);
        break;
      case Shape::kFlat:
        x[t] = 0.3f * normal(rng);
        break;
      case Shape::kTies:
        x[t] = std::round(4.0f * normal(rng)) * 0.5f;
        break;  // many equal values
      case Shape::kMasked:
        x[t] = rng.below(10) < 3 ? -kInf : 2.0f * normal(rng);
        break;
      case Shape::kWide:
        x[t] = 40.0f * normal(rng);
        break;  // most weights underflow to 0
      default:
        break;
    }
  }
  if (shape == Shape::kPeaked || shape == Shape::kMasked)  // a realistic few dozen favourites
    for (int j = 0; j < std::min(32, v); ++j) x[rng.below(v)] = 8.0f + 8.0f * rng.uniform(0, 1);
}

// Sampling modes; a row's mode picks its SamplingParams.
constexpr int kModes = 16;
SamplingParams params_for(int mode, Rng& rng, int32_t vocab) {
  SamplingParams p;
  p.temperature = 0.5f + rng.uniform(0.0f, 1.0f);
  switch (mode) {
    case 0:
      p.temperature = 0.0f;
      break;  // greedy
    case 1:
      break;  // temperature only
    case 2:
      p.top_k = 1 + static_cast<int32_t>(rng.below(60));
      break;  // small top-k
    case 3:
      p.top_p = 0.9f;
      break;  // top-p
    case 4:
      p.min_p = 0.05f;
      break;  // min-p
    case 5:
      p.top_k = 50, p.top_p = 0.9f;
      break;  // the usual pair
    case 6:
      p.top_k = 40, p.top_p = 0.8f, p.min_p = 0.1f, p.temperature = 1.3f;
      break;
    case 7:
      p.top_k = 2049 + static_cast<int32_t>(rng.below(3000)), p.top_p = 0.95f;
      break;
    case 8:  // penalties with top-k + top-p
      p.top_k = 50, p.top_p = 0.9f;
      p.repetition_penalty = 1.3f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.4f;
      break;
    case 9:  // logit_bias: favour one token, ban another, nudge some
      for (int j = 0; j < 4; ++j) {
        const int32_t t = static_cast<int32_t>(rng.below(vocab));
        bool dup = false;
        for (const LogitBias& b : p.logit_bias) dup |= b.token == t;
        if (!dup)
          p.logit_bias.push_back({t, j == 0 ? 100.0f : j == 1 ? -100.0f : rng.uniform(-5, 5)});
      }
      break;
    case 10:  // min_tokens: EOS and the stop ids are suppressed
      p.min_tokens = 100, p.stop_token_ids = {0, vocab - 1}, p.top_p = 0.7f;
      break;
    case 11:
      p.temperature = 0.0f, p.repetition_penalty = 0.7f;
      break;  // greedy + penalty
    case 12:
      p.top_p = 0.5f, p.temperature = 3.0f;
      break;  // flat nucleus
    case 13:
      p.top_k = 2500, p.min_p = 0.02f;
      break;  // large k, min-p
    case 14:
      p.temperature = 0.0f, p.logit_bias = {{static_cast<int32_t>(rng.below(vocab)), 30.0f}};
      break;
    default:
      p.top_k = 5, p.temperature = 100.0f;
      break;  // nearly uniform top-5
  }
  if (rng.below(3) == 0 || mode == 5) p.logprobs = static_cast<int32_t>(rng.below(21));
  return p;
}

// The CPU Sampler's processing of a row (sampler.cpp), to explain a token difference.
std::vector<float> cpu_processed(const float* raw, int32_t v, const SampleRow& row) {
  const SamplingParams& p = *row.params;
  std::vector<int32_t> suppress;
  if (static_cast<int64_t>(row.output_tokens.size()) < p.min_tokens) {
    suppress = p.stop_token_ids;
    if (!p.ignore_eos) suppress.insert(suppress.end(), kEos.begin(), kEos.end());
  }
  std::vector<float> x(raw, raw + v);
  (void)apply_logit_bias(x, p.logit_bias);
  (void)suppress_tokens(x, suppress);
  (void)apply_penalties(x, row.prompt_tokens, row.output_tokens, p.repetition_penalty,
                        p.presence_penalty, p.frequency_penalty);
  if (!row.allowed.empty()) (void)apply_token_mask(x, row.allowed);
  return x;
}

// Why a device token may differ from the CPU's: the CPU's u within kBoundaryRel of a CDF boundary
// of its kept set, or a top-p cut within kBoundaryRel of a boundary. Empty when neither holds.
std::string boundary_reason(const float* raw, int32_t v, const SampleRow& row) {
  const SamplingParams& p = *row.params;
  if (p.is_greedy()) return "";
  const std::vector<float> x = cpu_processed(raw, v, row);
  const TruncationParams tp{p.temperature, p.top_k, p.top_p, p.min_p};
  const double u = uniform01(row.seed, row.output_tokens.size());
  double cdf = 0.0;
  for (const TokenProb& e : truncated_distribution(x, tp)) {
    cdf += e.prob;
    if (std::fabs(cdf - u) <= kBoundaryRel)
      return "u " + std::to_string(u) + " is within 1e-9 of the CDF boundary after token " +
             std::to_string(e.token);
  }
  if (p.top_p < 1.0f) {
    std::vector<TokenLogit> order;
    for (int32_t t = 0; t < v; ++t)
      if (x[t] > -kInf) order.push_back({x[t], t});
    std::sort(order.begin(), order.end(), ranks_before);
    const float m = order.empty() ? 0.0f : order[0].logit;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
    double z = 0.0;
    for (const TokenLogit& e : order) z += exp_nonpositive((e.logit - m) / p.temperature);
    double cum = 0.0;
    for (const TokenLogit& e : order) {
      cum += exp_nonpositive((e.logit - m) / p.temperature);
      if (std::fabs(cum - static_cast<double>(p.top_p) * z) <= kBoundaryRel * z)
        return "the top-p cut at token " + std::to_string(e.token) + " is within 1e-9 of top_p";
    }
  }
  return "";
}

bool close(float got, float want) {
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(static_cast<double>(got) - want) <=
         kLogprobTol * std::max(1.0, std::fabs(static_cast<double>(want)));
}

struct CaseStats {
  int64_t rows = 0, tokens_equal = 0, boundary = 0, errors = 0;
};

// One batch: n_rows rows sampled from n_logit_rows logits rows (the rest share rows, as n > 1
// does). `group`: blocks per row, 0 = the backend's choice. `special`: 0 none, 1 a NaN row, 2 a
// +inf row, 3 a row where only EOS and a stop id are finite (min_tokens leaves nothing).
// `greedy_only`: every row plain greedy (no edits, no logprobs), the calls the lean argmax kernel
// takes; special 4 then makes row 0 all -inf. `masked`: most rows get a grammar mask (a few
// tokens allowed, half of them, all but a few, or none: a row error).
void run_case(Backend& cuda, uint64_t seed, int32_t vocab, DType dtype, int32_t n_rows,
              int32_t n_logit_rows, int group, int special, CaseStats& stats,
              bool greedy_only = false, bool masked = false) {
  const std::string what = Label("sample", seed)("vocab", vocab)("dtype", dtype_name(dtype))(
      "rows", n_rows)("logit_rows", n_logit_rows)("group", group)("special", special)(
      "greedy_only", greedy_only)("masked", masked);
  SCOPED_TRACE(what);
  Rng rng(seed);
  std::vector<float> logits(static_cast<size_t>(n_logit_rows) * vocab);
  std::vector<Shape> shapes(n_logit_rows);
  for (int32_t r = 0; r < n_logit_rows; ++r) {
    shapes[r] = static_cast<Shape>((seed + r) % static_cast<uint64_t>(Shape::kCount));
    fill_row(rng, shapes[r], logits.data() + static_cast<size_t>(r) * vocab, vocab);
  }
  if (dtype == DType::kBF16)
    for (float& x : logits) x = round_bf16(x);
  float* row0 = logits.data();
  if (special == 1) row0[rng.below(vocab)] = std::numeric_limits<float>::quiet_NaN();
  if (special == 1 && vocab > 3) row0[vocab - 1] = kInf;  // after the NaN or before: either way
  if (special == 2) row0[rng.below(vocab)] = kInf;
  if (special == 4)
    for (int32_t t = 0; t < vocab; ++t) row0[t] = -kInf;
  if (special == 3) {
    for (int32_t t = 0; t < vocab; ++t) row0[t] = -kInf;
    row0[std::min(2, vocab - 1)] = 1.0f;  // EOS (or the last token)
    row0[vocab - 1] = 0.5f;               // a stop id (mode 10)
  }

  // Rows, params and histories.
  std::vector<SamplingParams> params(n_rows);
  std::vector<std::vector<int32_t>> prompts(n_rows), outputs(n_rows);
  std::vector<SampleRow> rows(n_rows);
  std::vector<int64_t> logits_rows(n_rows);
  for (int32_t i = 0; i < n_rows; ++i) {
    int mode = static_cast<int>((seed * 7 + static_cast<uint64_t>(i)) % kModes);
    logits_rows[i] = i < n_logit_rows ? i : static_cast<int64_t>(rng.below(n_logit_rows));
    if (special == 3 && logits_rows[i] == 0) mode = 10;
    params[i] = params_for(mode, rng, vocab);
    if (greedy_only) {
      params[i] = SamplingParams{};
      params[i].temperature = 0.0f;
    }
    for (int j = 0; j < 24; ++j) prompts[i].push_back(static_cast<int32_t>(rng.below(vocab)));
    const int n_out = static_cast<int>(rng.below(12));
    for (int j = 0; j < n_out; ++j) outputs[i].push_back(static_cast<int32_t>(rng.below(vocab)));
    rows[i] = {&params[i], prompts[i], outputs[i], rng.next()};
  }
  // Grammar masks; the last word's bits past the vocabulary are random too (both samplers must
  // ignore them).
  std::vector<std::vector<uint32_t>> masks(n_rows);
  for (int32_t i = 0; masked && i < n_rows; ++i) {
    std::vector<uint32_t>& m = masks[i];
    m.assign(static_cast<size_t>(token_mask_words(vocab)), 0u);
    switch ((seed + static_cast<uint64_t>(i)) % 5) {
      case 0:  // unconstrained
        m.clear();
        break;
      case 1:  // a few tokens
        for (uint64_t j = 0, n = 1 + rng.below(8); j < n; ++j) {
          const uint64_t t = rng.below(vocab);
          m[t / 32] |= 1u << (t % 32);
        }
        break;
      case 2:  // about half
        for (uint32_t& w : m) w = static_cast<uint32_t>(rng.next());
        break;
      case 3:  // all but about one in eight
        for (uint32_t& w : m) {
          w = 0xffffffffu;
          for (int b = 0; b < 4; ++b) w &= ~(1u << rng.below(32));
        }
        break;
      default:  // nothing: no token can be sampled
        m.back() = vocab % 32 ? ~0u << (vocab % 32) : 0u;
        break;
    }
    rows[i].allowed = m;
  }

  // CPU reference on the rows each sample reads.
  std::vector<float> cpu_logits(static_cast<size_t>(n_rows) * vocab);
  for (int32_t i = 0; i < n_rows; ++i)
    std::copy_n(logits.data() + logits_rows[i] * vocab, vocab,
                cpu_logits.data() + static_cast<size_t>(i) * vocab);
  SamplerConfig sc;
  sc.vocab_size = vocab;
  sc.eos_token_ids = kEos;
  Sampler cpu(sc);
  std::vector<SampleOutput> want(n_rows);
  ASSERT_TRUE(cpu.sample(Tensor(cpu_logits.data(), DType::kF32, {n_rows, vocab}), rows, want).ok());

  // Device.
  const size_t n_vals = logits.size();
  std::unique_ptr<DevBuf> dev;
  std::vector<uint8_t> bytes(dtype_bytes(dtype, static_cast<int64_t>(n_vals)));
  from_f32(dtype, logits.data(), bytes.data(), static_cast<int64_t>(n_vals));
  dev = std::make_unique<DevBuf>(cuda, static_cast<int64_t>(bytes.size()));
  dev->upload(bytes.data(), static_cast<int64_t>(bytes.size()));
  const Tensor dl = dev->view(dtype, {n_logit_rows, vocab});
  SampleBatchPacker packer(sc);
  PackedSampleBatch packed;
  packer.pack(rows, logits_rows, packed);
  std::vector<DeviceSampleResult> res(n_rows);
  if (group == 0) {
    cuda.sample(dl, packed.inputs(), res.data());
  } else {
    auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
    ASSERT_NE(cb, nullptr);
    cb->sample_with_group(dl, packed.inputs(), res.data(), group);
  }
  std::vector<SampleOutput> got(n_rows);
  SampleBatchPacker::unpack(packed, res, got);

  // The logits are read only.
  const auto after = dev->download<uint8_t>();
  EXPECT_EQ(std::memcmp(after.data(), bytes.data(), bytes.size()), 0) << "the logits were written";
  EXPECT_TRUE(guards_ok(what, *dev));

  for (int32_t i = 0; i < n_rows; ++i) {
    ++n_cases_checked();
    ++stats.rows;
    const SampleOutput& g = got[i];
    const SampleOutput& w = want[i];
    const float* raw = cpu_logits.data() + static_cast<size_t>(i) * vocab;
    const std::string where = "row " + std::to_string(i) + " (logits row " +
                              std::to_string(logits_rows[i]) + ", " +
                              shape_name(shapes[logits_rows[i]]) + ")";
    ASSERT_EQ(g.status.code(), w.status.code())
        << where << ": " << g.status.to_string() << " vs " << w.status.to_string();
    EXPECT_EQ(g.status.message(), w.status.message()) << where;
    if (!w.status.ok()) {
      ++stats.errors;
      EXPECT_EQ(g.token, -1) << where;
      continue;
    }
    if (g.token == w.token) {
      ++stats.tokens_equal;
    } else {
      const std::string why = boundary_reason(raw, vocab, rows[i]);
      if (why.empty()) {
        ADD_FAILURE() << where << ": device token " << g.token << ", CPU token " << w.token
                      << ", and the CPU's u is not within " << kBoundaryRel
                      << " of a CDF or top-p boundary";
        continue;
      }
      ++stats.boundary;
      std::printf("  %s %s: tokens %d vs %d allowed: %s\n", what.c_str(), where.c_str(), g.token,
                  w.token, why.c_str());
      continue;  // logprobs describe different tokens
    }
    if (!params[i].logprobs) {
      EXPECT_TRUE(std::isnan(g.logprob)) << where;
      continue;
    }
    EXPECT_EQ(g.rank, w.rank) << where;
    EXPECT_TRUE(close(g.logprob, w.logprob)) << where << ": logprob " << g.logprob << " vs "
                                             << w.logprob << " (tolerance " << kLogprobTol << ")";
    ASSERT_EQ(g.top_logprobs.size(), w.top_logprobs.size()) << where;
    for (size_t j = 0; j < w.top_logprobs.size(); ++j) {
      EXPECT_EQ(g.top_logprobs[j].token, w.top_logprobs[j].token) << where << " top " << j;
      EXPECT_TRUE(close(g.top_logprobs[j].logprob, w.top_logprobs[j].logprob))
          << where << " top " << j << ": " << g.top_logprobs[j].logprob << " vs "
          << w.top_logprobs[j].logprob;
    }
  }
}

// Whether the backend's device has thread-block clusters (sm_90): rows split over 2-8 blocks.
bool has_clusters(Backend& b) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&b);
  EXPECT_NE(cb, nullptr);
  return cb != nullptr && cb->name().find("sm_9") != std::string::npos;
}

void report(const char* name, const CaseStats& s) {
  std::printf("%s: %lld rows, %lld identical tokens, %lld boundary differences, %lld row errors\n",
              name, static_cast<long long>(s.rows), static_cast<long long>(s.tokens_equal),
              static_cast<long long>(s.boundary), static_cast<long long>(s.errors));
}

TEST(Sampling, EveryModeMatchesTheCpuSampler) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  CaseStats stats;
  uint64_t seed = base_seed() + 9000;
  for (int32_t vocab : {1, 7, 19, 111, 32000, 128256}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      for (int32_t n : {1, 2, 17, 64, 256}) {
        if (vocab == 128256 && dtype == DType::kF32 && n == 64) continue;  // 256 covers it
        ++seed;
        run_case(cuda, seed, vocab, dtype, n, n, 0, 0, stats);
        if (HasFatalFailure()) return;
      }
    }
  }
  report("Sampling.EveryModeMatchesTheCpuSampler", stats);
  EXPECT_GT(stats.tokens_equal, stats.rows / 2);
}

TEST(Sampling, EveryBlockLayoutMatchesTheCpuSampler) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  const bool clusters = has_clusters(cuda);
  CaseStats stats;
  uint64_t seed = base_seed() + 9500;
  // The same shapes with the row split over 1, 2, 3, 5 and 8 blocks (uneven last slices).
  for (int32_t vocab : {32000, 128256}) {
    for (int group : {1, 2, 3, 5, 8}) {
      if (group > 1 && !clusters) continue;
      for (int32_t n : {1, 19}) {
        ++seed;
        run_case(cuda, seed, vocab, n % 2 ? DType::kBF16 : DType::kF32, n, n, group, 0, stats);
        if (HasFatalFailure()) return;
      }
    }
  }
  report("Sampling.EveryBlockLayoutMatchesTheCpuSampler", stats);
  EXPECT_GT(stats.rows, 0);
}

TEST(Sampling, SharedRowsAndRowErrors) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  CaseStats stats;
  uint64_t seed = base_seed() + 9800;
  for (int32_t vocab : {7, 111, 128256}) {
    for (int special : {0, 1, 2, 3}) {
      ++seed;
      // 40 samples from 5 logits rows: n > 1 sharing, and row 0 special.
      run_case(cuda, seed, vocab, DType::kBF16, 40, 5, 0, special, stats);
      if (HasFatalFailure()) return;
      ++seed;
      run_case(cuda, seed, vocab, DType::kF32, 3, 1, 0, special, stats);
      if (HasFatalFailure()) return;
    }
  }
  report("Sampling.SharedRowsAndRowErrors", stats);
  EXPECT_GT(stats.errors, 0);  // the special rows did fail, as on the CPU
}

// Grammar masks (SampleRow::allowed, DeviceSampleRow::mask_word): the CPU Sampler's tokens,
// logprobs and row errors with masks of every density beside unmasked rows, greedy and sampled,
// in every block layout.
TEST(Sampling, GrammarMasksMatchTheCpuSampler) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  const bool clusters = has_clusters(cuda);
  CaseStats stats;
  uint64_t seed = base_seed() + 9700;
  for (int32_t vocab : {1, 7, 111, 32000, 128256}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      for (int32_t n : {1, 5, 64}) {
        ++seed;
        run_case(cuda, seed, vocab, dtype, n, n, 0, 0, stats, false, true);
        if (HasFatalFailure()) return;
      }
    }
  }
  for (int group : {1, 3, 8}) {
    if (group > 1 && !clusters) continue;
    ++seed;
    run_case(cuda, seed, 128256, DType::kBF16, 7, 7, group, 0, stats, false, true);
    if (HasFatalFailure()) return;
  }
  // Greedy rows with a mask leave the lean argmax kernel for the general one.
  ++seed;
  run_case(cuda, seed, 32000, DType::kBF16, 9, 9, 0, 0, stats, true, true);
  report("Sampling.GrammarMasksMatchTheCpuSampler", stats);
  EXPECT_GT(stats.errors, 0);  // the rows that allow nothing failed, as on the CPU
  EXPECT_GT(stats.tokens_equal, stats.rows / 2);
}

// Calls whose rows are all plain greedy take the lean argmax kernel (sampling_greedy.cu): the CPU
// Sampler's tokens and row errors (NaN, +inf, all -inf) at every vocabulary and row count (the
// one-block, many-block and device-rows layouts), and the general kernel's results field for field
// (sample_with_group forces the general kernel).
TEST(Sampling, GreedyRowsTakeTheLeanKernel) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  CaseStats stats;
  uint64_t seed = base_seed() + 9600;
  for (int32_t vocab : {1, 7, 19, 111, 8200, 32000, 102400, 128256}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      for (int32_t n : {1, 2, 17, 65, 300}) {
        for (int special : {0, 1, 2, 4}) {
          if (special != 0 && n > 17) continue;
          ++seed;
          run_case(cuda, seed, vocab, dtype, n, std::max(1, n / 2), 0, special, stats, true);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  report("Sampling.GreedyRowsTakeTheLeanKernel", stats);
  EXPECT_GT(stats.errors, 0);
  EXPECT_GT(stats.tokens_equal, stats.rows / 2);

  // Against the general kernel, with ties across block boundaries and -0 against +0.
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&cuda);
  ASSERT_NE(cb, nullptr);
  for (int32_t vocab : {111, 128256}) {
    constexpr int32_t kRows = 6;
    Rng rng(++seed);
    std::vector<float> logits(static_cast<size_t>(kRows) * vocab);
    for (float& x : logits) x = round_bf16(std::round(4.0f * normal(rng)) * 0.5f);
    float* r1 = logits.data() + vocab;  // row 1: the top value at the first and last token
    r1[0] = r1[vocab - 1] = 100.0f;
    float* r2 = logits.data() + 2 * int64_t{vocab};  // row 2: -0 before +0, nothing larger
    for (int32_t t = 0; t < vocab; ++t) r2[t] = -1.0f;
    r2[vocab / 2] = -0.0f;
    r2[vocab / 2 + 1] = 0.0f;
    logits[3 * int64_t{vocab} + vocab / 3] = kInf;  // row 3: +inf
    logits[4 * int64_t{vocab} + vocab - 1] = std::numeric_limits<float>::quiet_NaN();  // row 4
    std::vector<uint16_t> bits(logits.size());
    from_f32(DType::kBF16, logits.data(), bits.data(), static_cast<int64_t>(logits.size()));
    DevBuf dev(cuda, static_cast<int64_t>(bits.size() * 2));
    dev.upload(bits.data(), static_cast<int64_t>(bits.size() * 2));
    const Tensor dl = dev.view(DType::kBF16, {kRows, vocab});
    std::vector<DeviceSampleRow> rows(kRows);
    for (int32_t i = 0; i < kRows; ++i) {
      rows[i].logits_row = i;
      rows[i].flags = kSampleGreedy;
    }
    std::vector<DeviceSampleResult> lean(kRows), general(kRows);
    cuda.sample(dl, {rows.data(), kRows}, lean.data());
    cb->sample_with_group(dl, {rows.data(), kRows}, general.data(), 1);
    for (int32_t i = 0; i < kRows; ++i) {
      const std::string where = "vocab " + std::to_string(vocab) + " row " + std::to_string(i);
      EXPECT_EQ(lean[i].token, general[i].token) << where;
      EXPECT_EQ(lean[i].status, general[i].status) << where;
      EXPECT_EQ(lean[i].detail, general[i].detail) << where;
      EXPECT_EQ(lean[i].rank, general[i].rank) << where;
      EXPECT_EQ(lean[i].n_top, general[i].n_top) << where;
      ++n_cases_checked();
    }
    EXPECT_EQ(lean[1].token, 0);
    EXPECT_EQ(lean[2].token, vocab / 2);
    EXPECT_EQ(lean[3].status, DeviceSampleStatus::kPosInf);
    EXPECT_EQ(lean[4].status, DeviceSampleStatus::kNan);
  }
}

// Pipelined sampling (Backend::sample_async): two calls queued before either is read give the
// tokens sample() gives, and take_sampled_tokens() puts a call's tokens into a step's token ids on
// the device (0 for a failed or missing row; non-negative ids untouched; nothing outside the
// ids written).
TEST(Sampling, PipelinedCallsAndTheTokensTheyHandOver) {
  PAGELLM_REQUIRE_CUDA();
  (void)cpu;
  constexpr int32_t kVocab = 32000, kRows = 5;
  Rng rng(base_seed() + 9900);
  std::vector<float> logits = random_bf16_values(rng, int64_t{kRows} * kVocab, 4.0f);
  logits[3 * kVocab + 11] = std::numeric_limits<float>::quiet_NaN();  // row 3 fails
  std::vector<uint16_t> bits(logits.size());
  from_f32(DType::kBF16, logits.data(), bits.data(), static_cast<int64_t>(logits.size()));
  DevBuf dev(cuda, static_cast<int64_t>(bits.size() * 2));
  dev.upload(bits.data(), static_cast<int64_t>(bits.size() * 2));
  const Tensor dl = dev.view(DType::kBF16, {kRows, kVocab});
  std::vector<DeviceSampleRow> rows(kRows), reversed(kRows);
  for (int32_t i = 0; i < kRows; ++i) {
    rows[i].logits_row = i;
    rows[i].flags = kSampleGreedy;
    reversed[i] = rows[i];
    reversed[i].logits_row = kRows - 1 - i;
  }
  std::vector<DeviceSampleResult> want(kRows), want_reversed(kRows);
  cuda.sample(dl, {rows.data(), kRows}, want.data());
  cuda.sample(dl, {reversed.data(), kRows}, want_reversed.data());
  for (int32_t i = 0; i < kRows; ++i) {
    const float* r = logits.data() + int64_t{i} * kVocab;
    if (i == 3) {
      EXPECT_EQ(want[i].status, DeviceSampleStatus::kNan);
      continue;
    }
    ASSERT_EQ(want[i].status, DeviceSampleStatus::kOk) << "row " << i;
    EXPECT_EQ(want[i].token, static_cast<int32_t>(std::max_element(r, r + kVocab) - r));
  }

  const uint64_t a = cuda.sample_async(dl, {rows.data(), kRows});
  const uint64_t b = cuda.sample_async(dl, {reversed.data(), kRows});
  const std::vector<int32_t> ids = {-1, 7, -3, -4, -5, -6, 42, -2};
  DevBuf tok(cuda, static_cast<int64_t>(ids.size() * 4));
  tok.upload(ids.data(), static_cast<int64_t>(ids.size() * 4));
  Tensor t = tok.view(DType::kI32, {static_cast<int64_t>(ids.size())});
  cuda.take_sampled_tokens(t, a);
  const auto got = tok.download<int32_t>();
  const std::vector<int32_t> expect = {
      want[0].token,    7,  want[2].token, 0 /* row 3 failed */, want[4].token,
      0 /* no row 5 */, 42, want[1].token};
  EXPECT_EQ(got, expect);
  EXPECT_TRUE(guards_ok("take_sampled_tokens", tok));

  // The last call's tokens stay where the sampler left them: the ids keep their placeholders,
  // and the step's embedding reads the call's tokens (0 for the failed and the missing row).
  DevBuf tok_b(cuda, static_cast<int64_t>(ids.size() * 4));
  tok_b.upload(ids.data(), static_cast<int64_t>(ids.size() * 4));
  Tensor tb = tok_b.view(DType::kI32, {static_cast<int64_t>(ids.size())});
  cuda.take_sampled_tokens(tb, b);
  constexpr int64_t kDim = 64;
  std::vector<float> table(kVocab * kDim);
  for (int64_t i = 0; i < kVocab * kDim; ++i) table[i] = round_bf16(static_cast<float>(i % 251));
  std::vector<uint16_t> table_bits(table.size());
  from_f32(DType::kBF16, table.data(), table_bits.data(), static_cast<int64_t>(table.size()));
  DevBuf dev_table(cuda, static_cast<int64_t>(table_bits.size() * 2));
  dev_table.upload(table_bits.data(), static_cast<int64_t>(table_bits.size() * 2));
  DevBuf emb(cuda, static_cast<int64_t>(ids.size()) * kDim * 2);
  Tensor emb_t = emb.view(DType::kBF16, {static_cast<int64_t>(ids.size()), kDim});
  cuda.embedding(dev_table.view(DType::kBF16, {kVocab, kDim}), tb, emb_t);
  const std::vector<int32_t> expect_b = {want_reversed[0].token,
                                         7,
                                         want_reversed[2].token,
                                         want_reversed[3].token,
                                         want_reversed[4].token,
                                         0 /* no row 5 */,
                                         42,
                                         0 /* row 1 reads row 3, which failed */};
  EXPECT_EQ(want_reversed[1].status, DeviceSampleStatus::kNan);
  EXPECT_EQ(tok_b.download<int32_t>(), ids) << "the ids were taken by a kernel of their own";
  std::vector<float> want_rows;
  for (int32_t t : expect_b)
    want_rows.insert(want_rows.end(), table.begin() + int64_t{t} * kDim,
                     table.begin() + (int64_t{t} + 1) * kDim);
  EXPECT_TRUE(compare("embedding of handed-over tokens", download_bf16(emb), want_rows, kExact));
  EXPECT_TRUE(guards_ok("embedding of handed-over tokens", emb));
  std::vector<DeviceSampleResult> ra(kRows), rb(kRows);
  cuda.sample_results(b, rb.data());  // read out of order: each call has its own slot
  cuda.sample_results(a, ra.data());
  for (int32_t i = 0; i < kRows; ++i) {
    EXPECT_EQ(ra[i].status, want[i].status) << "row " << i;
    EXPECT_EQ(ra[i].token, want[i].token) << "row " << i;
    EXPECT_EQ(rb[i].status, want_reversed[i].status) << "row " << i;
    EXPECT_EQ(rb[i].token, want_reversed[i].token) << "row " << i;
  }
  n_cases_checked() += 2 * kRows + static_cast<int64_t>(ids.size());
}

}  // namespace
}  // namespace pagellm::optest
