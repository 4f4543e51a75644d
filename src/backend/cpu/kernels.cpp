#include "backend/cpu/kernels.h"

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/tuning.h"

namespace pagellm::cpu {

namespace {

bool has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}
bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

const Kernels* choose() {
  // PAGELLM_CPU_ISA caps the choice (to test the AVX2 path on an AVX-512 machine, or to run the
  // reference loops everywhere); it can never select an ISA the CPU lacks.
  const std::string cap = tuning::words("PAGELLM_CPU_ISA");
  const bool allow_avx512 = cap == "avx512";
  const bool allow_avx2 = allow_avx512 || cap == "avx2";
  __builtin_cpu_init();
  if (allow_avx512 && has_avx512()) return avx512_kernels();
  if (allow_avx2 && has_avx2()) return avx2_kernels();
  return nullptr;
}

}  // namespace

std::vector<const Kernels*> supported_kernels() {
  __builtin_cpu_init();
  std::vector<const Kernels*> out;
  if (has_avx512()) out.push_back(avx512_kernels());
  if (has_avx2()) out.push_back(avx2_kernels());
  return out;
}

int64_t gemv_prefetch_bytes() {
  static const int64_t bytes = tuning::integer("PAGELLM_GEMV_PREFETCH");
  return bytes;
}

const Kernels* cpu_kernels() {
  static const Kernels* const kernels = choose();
  return kernels;
}

}  // namespace pagellm::cpu
