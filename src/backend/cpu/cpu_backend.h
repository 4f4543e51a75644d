// Internal entry points of the CPU backend, for tests and benchmarks that pin an ISA.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

namespace pagellm::cpu {

// A CPU backend running `kernels` (which the caller has checked this CPU supports), or the
// reference loops when null. make_cpu_backend(true) is make_cpu_backend_for(cpu_kernels()).
std::unique_ptr<Backend> make_cpu_backend_for(const Kernels* kernels);

// The kernel tables this CPU can run, best first (empty on a CPU without AVX2+FMA+F16C).
std::vector<const Kernels*> supported_kernels();

}  // namespace pagellm::cpu
