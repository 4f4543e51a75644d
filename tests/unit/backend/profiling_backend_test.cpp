// ProfilingBackend and the op tables of `bench latency --profile`: the bytes/flops cost model on
// known shapes, the decorator's recording on the CPU backend, and the table from known timings.
// (Bit-identical forwarding through whole models is tested in tests/unit/runtime.)
#include "backend/profiling_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/op_profile.h"

namespace pagellm {
namespace {

// Cost-model tests never read tensor data: a distinct fake address per tensor is enough (the
// model compares addresses only to spot a column view of another tensor's rows).
void* fake_address(int64_t i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x100000) * (i + 1)); }
Tensor fake(int64_t id, DType dt, std::initializer_list<int64_t> shape) { return Tensor(fake_address(id), dt, shape); }

TEST(OpCost, MatmulBf16CountsWeightActivationsAndFlops) {
  // The Llama-3-8B gate_up shape at a 512-token prefill.
  const Tensor x = fake(0, DType::kBF16, {512, 4096}), w = fake(1, DType::kBF16, {14336, 4096});
  const Tensor out = fake(2, DType::kBF16, {512, 14336});
  const OpSample s = op_cost::matmul(x, w, Tensor(), out);
  EXPECT_EQ(s.op, "matmul");
  EXPECT_EQ(s.shape, "n=512 k=4096 m=14336 bf16");
  EXPECT_DOUBLE_EQ(s.flops, 2.0 * 512 * 14336 * 4096);
  EXPECT_DOUBLE_EQ(s.bytes, 2.0 * 14336 * 4096 + 2.0 * 512 * 4096 + 2.0 * 512 * 14336);
  EXPECT_EQ(s.ms, 0);
}

TEST(OpCost, MatmulQuantizedWeightCountsItsStorageAndBias) {
  // Q4_0: 18 bytes per 32 values (16 bytes of nibbles + an f16 scale).
  const Tensor x = fake(0, DType::kF32, {1, 128}), w = fake(1, DType::kQ4_0, {64, 128});
  const Tensor bias = fake(2, DType::kF32, {64}), out = fake(3, DType::kF32, {1, 64});
  const OpSample s = op_cost::matmul(x, w, bias, out);
  EXPECT_EQ(s.shape, "n=1 k=128 m=64 q4_0 +bias");
  EXPECT_DOUBLE_EQ(s.bytes, 64.0 * 128 / 32 * 18 + 4.0 * 128 + 4.0 * 64 + 4.0 * 64);
  EXPECT_DOUBLE_EQ(s.flops, 2.0 * 64 * 128);
}

TEST(OpCost, AttentionReadsEachSequencesKvOnce) {
  // Two sequences: one decoding at context 40, one prefilling 2 tokens after 58 cached ones.
  AttentionMeta meta;
  meta.n_seqs = 2;
  meta.total_kv_tokens = 40 + 60;
  meta.total_qk_pairs = 40 + (59 + 60);
  const Tensor q = fake(0, DType::kBF16, {3, 8, 64}), out = fake(1, DType::kBF16, {3, 8, 64});
  const Tensor kc = fake(2, DType::kBF16, {10, 16, 2, 64}), vc = fake(3, DType::kBF16, {10, 16, 2, 64});
  const OpSample s = op_cost::attention(q, kc, vc, meta, out);
  EXPECT_EQ(s.shape, "seqs=2 q=3 kv=100 hq=8 hkv=2 d=64 dv=64");
  EXPECT_DOUBLE_EQ(s.bytes, 2.0 * 3 * 8 * 64 * 2 + 100.0 * 2 * (64 + 64) * 2);
  EXPECT_DOUBLE_EQ(s.flops, 2.0 * 159 * 8 * (64 + 64));
}

TEST(OpCost, AttentionOverALatentCacheCountsTheRowOnce) {
  // MLA: V is the trailing R = 64 columns of the latent row [P + R] = [32 + 64] of the K cache.
  AttentionMeta meta;
  meta.n_seqs = 1;
  meta.total_kv_tokens = 50;
  meta.total_qk_pairs = 50;
  const Tensor kc = fake(0, DType::kF32, {8, 16, 1, 96});
  const Tensor vc = kc.slice_cols(32, 96);
  const Tensor q = fake(1, DType::kF32, {1, 4, 96}), out = fake(2, DType::kF32, {1, 4, 64});
  const OpSample s = op_cost::attention(q, kc, vc, meta, out);
  EXPECT_DOUBLE_EQ(s.bytes, 4.0 * 4 * 96 + 4.0 * 4 * 64 + 50.0 * 1 * 96 * 4);
  EXPECT_DOUBLE_EQ(s.flops, 2.0 * 50 * 4 * (96 + 64));
}

TEST(OpCost, AttentionWithoutHostTotalsSaysSo) {
  AttentionMeta meta;
  meta.n_seqs = 1;
  const Tensor kc = fake(0, DType::kF32, {8, 16, 1, 32}), vc = fake(1, DType::kF32, {8, 16, 1, 32});
  const Tensor q = fake(2, DType::kF32, {1, 2, 32}), out = fake(3, DType::kF32, {1, 2, 32});
  const OpSample s = op_cost::attention(q, kc, vc, meta, out);
  EXPECT_NE(s.shape.find("kv=?"), std::string::npos) << s.shape;
  EXPECT_DOUBLE_EQ(s.bytes, 4.0 * 2 * 32 * 2);  // q and out only
  EXPECT_EQ(s.flops, 0);
}

TEST(OpCost, RowOpsCountBytesInAndOut) {
  const Tensor x = fake(0, DType::kBF16, {7, 4096}), w = fake(1, DType::kF32, {4096});
  const Tensor res = fake(2, DType::kBF16, {7, 4096}), out = fake(3, DType::kBF16, {7, 4096});
  const double act = 7.0 * 4096 * 2;
  OpSample s = op_cost::rms_norm(x, w, out);
  EXPECT_EQ(s.shape, "n=7 d=4096");
  EXPECT_DOUBLE_EQ(s.bytes, act + 4.0 * 4096 + act);
  EXPECT_EQ(s.flops, 0);
  s = op_cost::add_rms_norm(x, res, w, out);  // residual read and written back
  EXPECT_DOUBLE_EQ(s.bytes, act + 2 * act + 4.0 * 4096 + act);
  s = op_cost::add(x, res, out);
  EXPECT_DOUBLE_EQ(s.bytes, 3 * act);

  const Tensor gate = fake(4, DType::kBF16, {7, 14336}), up = fake(5, DType::kBF16, {7, 14336});
  const Tensor h = fake(6, DType::kBF16, {7, 14336});
  s = op_cost::silu_mul(gate, up, h);
  EXPECT_EQ(s.shape, "n=7 f=14336");
  EXPECT_DOUBLE_EQ(s.bytes, 3 * 7.0 * 14336 * 2);

  // Embedding and gather read only the rows they fetch.
  const Tensor table = fake(7, DType::kQ8_0, {32000, 4096}), ids = fake(8, DType::kI32, {7});
  s = op_cost::embedding(table, ids, out);
  EXPECT_EQ(s.shape, "n=7 d=4096 q8_0");
  EXPECT_DOUBLE_EQ(s.bytes, 7.0 * 4096 / 32 * 34 + 4.0 * 7 + act);
  const Tensor rows = fake(9, DType::kI32, {2}), picked = fake(10, DType::kBF16, {2, 4096});
  s = op_cost::gather_rows(x, rows, picked);
  EXPECT_DOUBLE_EQ(s.bytes, 2.0 * 4096 * 2 + 4.0 * 2 + 2.0 * 4096 * 2);
  const Tensor logits = fake(11, DType::kF32, {2, 4096});
  s = op_cost::to_f32(picked, logits);
  EXPECT_DOUBLE_EQ(s.bytes, 2.0 * 4096 * 2 + 2.0 * 4096 * 4);
}

TEST(OpCost, RopeAndCacheWrite) {
  // Llama-3-8B at 5 tokens: 32 query heads, 8 KV heads of 128, rotary over the whole head.
  const Tensor q = fake(0, DType::kBF16, {5, 32, 128}), k = fake(1, DType::kBF16, {5, 8, 128});
  const Tensor v = fake(2, DType::kBF16, {5, 8, 128}), cs = fake(3, DType::kF32, {5, 128});
  const Tensor slots = fake(4, DType::kI32, {5});
  const Tensor kc = fake(5, DType::kBF16, {100, 16, 8, 128}), vc = fake(6, DType::kBF16, {100, 16, 8, 128});
  OpSample s = op_cost::rope_store_kv(q, k, v, cs, slots, kc, vc);
  EXPECT_EQ(s.shape, "n=5 hq=32 hkv=8 d=128 dv=128 rot=128");
  const double qb = 5.0 * 32 * 128 * 2, kb = 5.0 * 8 * 128 * 2;
  EXPECT_DOUBLE_EQ(s.bytes, 2 * qb + 2 * kb + kb + 5.0 * 128 * 4 + 4.0 * 5 + 2 * kb);
  s = op_cost::rope(q, cs);
  EXPECT_EQ(s.shape, "n=5 h=32 d=128 rot=128");
  EXPECT_DOUBLE_EQ(s.bytes, 2 * qb + 5.0 * 128 * 4);
}

TEST(OpCost, Copies) {
  EXPECT_DOUBLE_EQ(op_cost::copy_from_host(1000).bytes, 1000);
  EXPECT_DOUBLE_EQ(op_cost::copy_to_host(1000).bytes, 1000);
  EXPECT_DOUBLE_EQ(op_cost::copy(1000).bytes, 2000);  // read + written, as the bandwidth ceiling
  EXPECT_EQ(op_cost::copy(1000).shape, "bytes=1000");
  EXPECT_DOUBLE_EQ(op_cost::fill_random(fake(0, DType::kBF16, {10, 10})).bytes, 200);
}

TEST(OpCost, DeviceSampling) {
  // 3 rows of a bf16 vocabulary of 128256 (Llama 3) with 10 penalty/bias edits and one grammar
  // mask (4008 words).
  const Tensor logits = fake(0, DType::kBF16, {4, 128256});
  const OpSample s = op_cost::sample(logits, {nullptr, 3, nullptr, 10, nullptr, 4008});
  EXPECT_EQ(s.op, "sample");
  EXPECT_EQ(s.shape, "rows=3 vocab=128256 bf16");
  EXPECT_DOUBLE_EQ(s.bytes, 3.0 * 128256 * 2 +
                                3.0 * (sizeof(DeviceSampleRow) + sizeof(DeviceSampleResult)) +
                                10.0 * sizeof(DeviceSampleEdit) + 4008.0 * 4);
  EXPECT_EQ(s.flops, 0);
}

TEST(HostOpTimer, MarksAreOrderedAndMeasureTime) {
  auto backend = make_cpu_backend();
  auto timer = backend->make_op_timer();
  const int a = timer->mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int b = timer->mark();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  // A sleep lasts at least its duration; 1 s bounds a badly loaded machine.
  EXPECT_GE(timer->elapsed_ms(a, b), 20.0);
  EXPECT_LT(timer->elapsed_ms(a, b), 1000.0);
  timer->reset();
  EXPECT_EQ(timer->mark(), 0);
}

TEST(ProfilingBackend, RecordsOpsInOrderOnlyWhileStarted) {
  ProfilingBackend prof(make_cpu_backend());
  auto plain = make_cpu_backend();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t n = 64, k = 512, m = 1024;
  std::vector<float> xv(n * k), wv(m * k), o1(n * m), o2(n * m), o3(n * m);
  for (float& f : xv) f = u(rng);
  for (float& f : wv) f = u(rng);
  Tensor x(xv.data(), DType::kF32, {n, k}), w(wv.data(), DType::kF32, {m, k});
  Tensor out1(o1.data(), DType::kF32, {n, m}), out2(o2.data(), DType::kF32, {n, m});
  Tensor out3(o3.data(), DType::kF32, {n, m});

  prof.matmul(x, w, Tensor(), out1);  // not recording: forwarded only
  EXPECT_FALSE(prof.recording());
  prof.start();
  prof.matmul(x, w, Tensor(), out2);
  prof.add(out2, out2, out2);
  const std::vector<OpSample> got = prof.stop();
  EXPECT_FALSE(prof.recording());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].op, "matmul");
  EXPECT_EQ(got[1].op, "add");
  // A 64x512x1024 matmul (67 MFLOP) takes well over a microsecond on any CPU.
  EXPECT_GT(got[0].ms, 0.0);
  EXPECT_GE(got[1].ms, 0.0);
  EXPECT_DOUBLE_EQ(got[0].flops, 2.0 * n * m * k);

  // The forwarded results are the inner backend's, bit for bit.
  plain->matmul(x, w, Tensor(), out3);
  EXPECT_EQ(std::memcmp(o1.data(), o3.data(), o1.size() * 4), 0);
  plain->add(out3, out3, out3);
  EXPECT_EQ(std::memcmp(o2.data(), o3.data(), o2.size() * 4), 0);

  // A second recording starts empty.
  prof.start();
  EXPECT_TRUE(prof.stop().empty());
  EXPECT_EQ(prof.name(), plain->name());
  EXPECT_EQ(prof.device(), Device::kCpu);
  EXPECT_EQ(prof.supports_sampling(), plain->supports_sampling());
  // No graphs through the decorator: the engine must run (and the profile time) each op.
  bool ran = false;
  EXPECT_EQ(prof.capture([&] { ran = true; }), nullptr);
  EXPECT_FALSE(ran);
}

// A recording longer than kFlushOps: every op comes back, in order, timed, across the flushes
// (a whole serving run under bench throughput --profile).
TEST(ProfilingBackend, LongRecordingsKeepEveryOpInOrder) {
  ProfilingBackend prof(make_cpu_backend());
  std::vector<float> av(8, 1.0f), bv(8, 2.0f), ov(8), wv(4 * 8, 0.5f), mv(4);
  Tensor a(av.data(), DType::kF32, {1, 8}), b(bv.data(), DType::kF32, {1, 8});
  Tensor o(ov.data(), DType::kF32, {1, 8}), w(wv.data(), DType::kF32, {4, 8});
  Tensor mo(mv.data(), DType::kF32, {1, 4});
  const size_t n = 2 * ProfilingBackend::kFlushOps + 5;
  prof.start();
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0)
      prof.matmul(a, w, Tensor(), mo);
    else
      prof.add(a, b, o);
  }
  const std::vector<OpSample> got = prof.stop();
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i].op, i % 3 == 0 ? "matmul" : "add") << i;
    ASSERT_GE(got[i].ms, 0.0) << i;
  }
  EXPECT_FLOAT_EQ(ov[0], 3.0f);
  EXPECT_FLOAT_EQ(mv[0], 4.0f);
  prof.start();  // and the next recording starts empty
  EXPECT_TRUE(prof.stop().empty());
}

TEST(OpProfileTable, StepIndependentShapes) {
  auto at = [](const char* op, const char* shape) {
    OpSample s;
    s.op = op;
    s.shape = shape;
    return step_independent_shape(s);
  };
  EXPECT_EQ(at("matmul", "n=740 k=4096 m=6144 bf16"), "k=4096 m=6144 bf16");
  EXPECT_EQ(at("matmul", "n=1 k=4096 m=6144 bf16 +bias"), "k=4096 m=6144 bf16 +bias");
  EXPECT_EQ(at("attention", "seqs=256 q=256 kv=160000 hq=32 hkv=8 d=128 dv=128"),
            "decode hq=32 hkv=8 d=128 dv=128");
  EXPECT_EQ(at("attention", "seqs=9 q=1000 kv=? hq=32 hkv=8 d=128 dv=128"),
            "prefill hq=32 hkv=8 d=128 dv=128");
  EXPECT_EQ(at("gather_rows", "m=256 d=4096"), "d=4096");
  EXPECT_EQ(at("copy_to_host", "bytes=409600"), "");
  EXPECT_EQ(at("sample", "rows=256 vocab=128256 bf16"), "vocab=128256 bf16");
  EXPECT_EQ(at("moe_experts", "n=512 e=64 k=6 d=2048 f=1408 bf16 +shared"),
            "e=64 k=6 d=2048 f=1408 bf16 +shared");
  // Grouped by the new keys, calls of different step sizes share a row.
  std::vector<OpSample> ops(3);
  const char* shapes[] = {"n=1 k=8 m=4 f32", "n=300 k=8 m=4 f32", "n=2 k=16 m=4 f32"};
  for (int i = 0; i < 3; ++i) {
    ops[i].op = "matmul";
    ops[i].shape = shapes[i];
    ops[i].ms = 1.0;
    ops[i].shape = step_independent_shape(ops[i]);
  }
  const OpProfileTable t = summarize_ops("run", ops, 0, {});
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0].shape, "k=8 m=4 f32");
  EXPECT_EQ(t.rows[0].calls, 2);
}

// Runs of spaces as one: table columns are padded to the widest cell.
std::string squash(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ' ' || out.empty() || out.back() != ' ') out += c;
  return out;
}

// A step's samples with hand-set timings; the table is checked against figures worked by hand.
std::vector<OpSample> known_samples() {
  auto s = [](const char* op, const char* shape, double bytes, double flops, double ms) {
    OpSample o;
    o.op = op;
    o.shape = shape;
    o.bytes = bytes;
    o.flops = flops;
    o.ms = ms;
    return o;
  };
  return {s("rms_norm", "n=1 d=4096", 16e6, 0, 0.01),  // 1.6 TB/s
          s("matmul", "n=1 k=4096 m=6144 bf16", 50e6, 50e6, 0.02),
          s("matmul", "n=1 k=4096 m=6144 bf16", 50e6, 50e6, 0.02),  // 2 calls: 100 MB in 0.04 ms
          s("attention", "seqs=1 q=1 kv=512", 2e6, 0, 0.05),
          s("matmul", "n=1 k=14336 m=4096 bf16", 120e6, 120e6, 0.04)};
}

TEST(OpProfileTable, GroupsSortsAndRates) {
  const auto samples = known_samples();
  const OpProfileTable t = summarize_ops("decode, context 512", samples, 0.2, {4000.0, 800.0});
  EXPECT_EQ(t.calls, 5);
  EXPECT_NEAR(t.sum_ms, 0.14, 1e-12);
  EXPECT_DOUBLE_EQ(t.bytes, 238e6);
  ASSERT_EQ(t.rows.size(), 4u);
  // Most time first; equal times keep their first-seen order.
  EXPECT_EQ(t.rows[0].op, "attention");
  EXPECT_EQ(t.rows[1].shape, "n=1 k=4096 m=6144 bf16");
  EXPECT_EQ(t.rows[1].calls, 2);
  EXPECT_EQ(t.rows[2].shape, "n=1 k=14336 m=4096 bf16");
  EXPECT_EQ(t.rows[3].op, "rms_norm");
  EXPECT_NEAR(t.rows[1].ms, 0.04, 1e-12);
  EXPECT_NEAR(t.rows[1].share, 0.04 / 0.14, 1e-12);
  EXPECT_NEAR(t.rows[1].gb_per_s(), 2500.0, 1e-6);     // 100 MB / 40 us
  EXPECT_NEAR(t.rows[1].tflop_per_s(), 2.5, 1e-9);     // 100 MFLOP / 40 us
  EXPECT_NEAR(t.rows[3].gb_per_s(), 1600.0, 1e-6);
  double shares = 0;
  for (const auto& r : t.rows) shares += r.share;
  EXPECT_NEAR(shares, 1.0, 1e-12);

  const std::string text = format_op_table(t), flat = squash(text);
  EXPECT_NE(text.find("decode, context 512: 5 op calls"), std::string::npos) << text;
  // 2 calls, 0.04 ms, 28.6% of 0.14 ms, 2500 GB/s = 62% of 4000, 2.50 TFLOP/s = 0.3% of 800
  EXPECT_NE(flat.find("matmul n=1 k=4096 m=6144 bf16 2 0.0400 28.6% 2500.0 62% 2.50 0.3%"), std::string::npos)
      << text;
  // No flops: no TFLOP/s and no compute fraction.
  EXPECT_NE(flat.find("rms_norm n=1 d=4096 1 0.0100 7.1% 1600.0 40% - -"), std::string::npos) << text;
  // The total: 238 MB and 220 MFLOP in 0.14 ms.
  EXPECT_NE(flat.find("total 5 0.1400 100.0% 1700.0 42% 1.57 0.2%"), std::string::npos) << text;
  EXPECT_NE(text.find("ops sum 0.1400 ms vs 0.2000 ms wall for the unprofiled step: 0.0600 ms (30.0%)"),
            std::string::npos)
      << text;

  const nlohmann::json j = op_table_json(t);
  EXPECT_EQ(j["rows"].size(), 4u);
  EXPECT_NEAR(j["overhead_ms"].get<double>(), 0.06, 1e-12);
  EXPECT_NEAR(j["rows"][1]["bandwidth_fraction"].get<double>(), 0.625, 1e-9);
  EXPECT_TRUE(j["rows"][3]["compute_fraction"].is_null());
  EXPECT_EQ(j["ceilings"]["tflop_per_s"].get<double>(), 800.0);
}

TEST(OpProfileTable, UnknownCeilingsAndWallAreOmitted) {
  const auto samples = known_samples();
  const OpProfileTable t = summarize_ops("prefill", samples, 0, {100.0, 0});
  const std::string text = format_op_table(t);
  EXPECT_NE(text.find("compute peak unknown"), std::string::npos) << text;
  EXPECT_NE(text.find("no unprofiled wall time measured"), std::string::npos) << text;
  const nlohmann::json j = op_table_json(t);
  EXPECT_TRUE(j["wall_ms"].is_null());
  EXPECT_TRUE(j["ceilings"]["tflop_per_s"].is_null());
  EXPECT_TRUE(j["rows"][1]["compute_fraction"].is_null());
  EXPECT_FALSE(j["rows"][1]["bandwidth_fraction"].is_null());
}

}  // namespace
}  // namespace pagellm
