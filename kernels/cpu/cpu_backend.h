// The CPU backend on an explicit kernel variant (tests run every op on every variant
// the machine can execute).
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace bs::kernels {

// Throws std::invalid_argument when this CPU cannot execute `isa`.
std::unique_ptr<Backend> make_cpu_backend_for(cpu::CpuIsa isa,
                                              DecodeActivations decode = DecodeActivations::Exact,
                                              bool batch_invariant = false);  // make_cpu_backend says what

}  // namespace bs::kernels
