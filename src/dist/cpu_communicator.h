// The CPU communicator: the ranks are threads of one process, the collectives read each other's
// buffers through shared memory between barriers. Tensors are f32 host memory, contiguous (the
// CPU backend's activations). For CI: tensor- and expert-parallel paths run here, one thread per
// rank, against the unsharded model.
#pragma once

#include <memory>
#include <vector>

#include "dist/communicator.h"

namespace pagellm {

// n communicators of one group, rank i at index i; each is used by one thread.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int n);

}  // namespace pagellm
