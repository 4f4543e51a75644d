// Process-wide pieces of the op tests: the backends under test, and main(), which fails a run that
// checked no case (a filter matching nothing, or tests that all returned early must not pass).
#include <gtest/gtest.h>

#include "op_test_util.h"

namespace pagellm::optest {
namespace {

struct CudaHolder {
  std::unique_ptr<Backend> backend;
  std::string status;
  CudaHolder() {
    auto r = make_cuda_backend(0);
    if (r.ok()) {
      backend = std::move(r).value();
      status = backend->name();
    } else {
      status = r.status().to_string();
    }
  }
};

CudaHolder& holder() {
  static CudaHolder h;
  return h;
}

}  // namespace

Backend* cuda_backend() {
  return holder().backend.get();
}
const std::string& cuda_status() {
  return holder().status;
}
Backend& cpu_reference() {
  static std::unique_ptr<Backend> cpu = make_cpu_backend(false);
  return *cpu;
}

}  // namespace pagellm::optest

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (GTEST_FLAG_GET(list_tests)) return rc;
  const long long n = static_cast<long long>(pagellm::optest::n_cases_checked());
  if (n == 0) {
    std::fprintf(stderr,
                 "test_ops: no op case was checked in this run: a run that checks nothing fails\n");
    return 1;
  }
  std::printf("test_ops: %lld op comparisons checked\n", n);
  return rc;
}
