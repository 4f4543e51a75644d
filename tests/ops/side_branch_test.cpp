// Backend::begin_side / end_side / join_side on the GPU: a long product in the side branch, a
// short one on the main line, then an op after the join that reads both. The branch runs on its
// own stream with its own cuBLASLt workspace (decode sizes take the GEMV, larger ones cuBLASLt on
// both lines at once), so the checks are: each product right against the CPU, and the op after the
// join seeing the side branch's finished output (without the join it would read the sentinel or
// a stale product: the side product is ~30x the main one's work). The same sequence recorded in a
// graph and replayed into cleared outputs gives the direct run's values.
#include "op_test_util.h"

namespace pagellm::optest {
namespace {

struct Weight {
  std::vector<float> values;
  std::vector<uint16_t> bits;
  std::unique_ptr<Buffer> storage;
  Tensor host, dev;
};

void make_weight(Backend& cuda, Rng& rng, int64_t m, int64_t k, Weight& w) {
  w.values = random_bf16_values(rng, m * k);
  w.bits = to_bf16_bits(w.values);
  w.host = Tensor(w.bits.data(), DType::kBF16, {m, k});
  auto dev = cuda.upload_weight(w.host, DType::kBF16, w.storage);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  w.dev = *dev;
}

TEST(SideBranch, JoinOrdersTheMainLineAfterTheBranch) {
  PAGELLM_REQUIRE_CUDA();
  uint64_t seed = base_seed() + 12000;
  const int64_t k = 4096, m_side = 14336, m_main = 512, d = 512;  // the add reads d columns
  for (int64_t n : {1, 7, 111}) {
    Rng rng(++seed);
    const std::string what = Label("side branch", seed)("n", n);
    Weight w_side, w_main;
    make_weight(cuda, rng, m_side, k, w_side);
    make_weight(cuda, rng, m_main, k, w_main);
    std::vector<float> x = random_bf16_values(rng, n * k);
    auto x_dev = upload_bf16(cuda, x);
    const Tensor x_t = x_dev->view(DType::kBF16, {n, k});
    DevBuf a(cuda, n * m_side * 2), b(cuda, n * m_main * 2), c(cuda, n * d * 2);
    Tensor a_t = a.view(DType::kBF16, {n, m_side}), b_t = b.view(DType::kBF16, {n, m_main});
    Tensor c_t = c.view(DType::kBF16, {n, d});
    const auto step = [&] {
      cuda.begin_side();
      cuda.matmul(x_t, w_side.dev, Tensor(), a_t);
      cuda.end_side();
      cuda.matmul(x_t, w_main.dev, Tensor(), b_t);
      cuda.join_side();
      cuda.add(a_t.slice_cols(0, d), b_t.slice_cols(0, d), c_t);
    };
    step();
    const std::vector<float> got_a = download_bf16(a), got_b = download_bf16(b);
    const std::vector<float> got_c = download_bf16(c);

    // Each product against the CPU, and the add against the CPU's add of the GPU's products.
    std::vector<float> want_a(n * m_side), want_b(n * m_main), want_c(n * d);
    Tensor want_a_t = host_f32(want_a, {n, m_side}), want_b_t = host_f32(want_b, {n, m_main});
    cpu.matmul(host_f32(x, {n, k}), w_side.host, Tensor(), want_a_t);
    cpu.matmul(host_f32(x, {n, k}), w_main.host, Tensor(), want_b_t);
    std::vector<float> a_cols(n * d), b_cols(n * d);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) {
        a_cols[i * d + j] = got_a[i * m_side + j];
        b_cols[i * d + j] = got_b[i * m_main + j];
      }
    Tensor want_c_t = host_f32(want_c, {n, d});
    cpu.add(host_f32(a_cols, {n, d}), host_f32(b_cols, {n, d}), want_c_t);
    EXPECT_TRUE(compare(what + " side product", got_a, want_a, kBf16Tol));
    EXPECT_TRUE(compare(what + " main product", got_b, want_b, kBf16Tol));
    EXPECT_TRUE(compare(what + " add after the join", got_c, want_c, kBf16Tol));
    EXPECT_TRUE(guards_ok(what + " a", a));
    EXPECT_TRUE(guards_ok(what + " c", c));

    // Recorded: both lines and the join in one graph, replayed into cleared outputs.
    std::unique_ptr<OpGraph> graph = cuda.capture(step);
    ASSERT_NE(graph, nullptr) << what << ": the branch could not be recorded";
    const std::vector<uint16_t> zeros(static_cast<size_t>(n * m_side), 0);
    a.upload(zeros.data(), n * m_side * 2);
    b.upload(zeros.data(), n * m_main * 2);
    c.upload(zeros.data(), n * d * 2);
    graph->replay();
    EXPECT_TRUE(compare(what + " replayed side product", download_bf16(a), got_a, kExact));
    EXPECT_TRUE(compare(what + " replayed add", download_bf16(c), got_c, kExact));
  }
}

}  // namespace
}  // namespace pagellm::optest
