// The backward's part of the GPU suite: for a Case, the forward on the device gives O and the
// LSE, a random dO is drawn, and fc_backward writes dQ, dK and dV into poisoned buffers with guard
// regions; the gradients are checked against the CPU fp64 backward reference.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashcute/flashcute.h"
#include "gpu_harness.hpp"
#include "reference/cpu_backward_reference.hpp"

namespace flashcute {
namespace testing {

// Everything fc_backward reads for one case, and the reference it is checked against. dQ, dK and
// dV are laid out like Q, K and V (each in a buffer of its own); dO like O.
struct BackwardInputs {
  std::unique_ptr<Inputs> in;
  std::unique_ptr<DeviceBuffer> o, lse, dout;  // O and dO in in->o_layout, LSE canonical
  // The forward of this (dtype, head_dim) is compiled in. When it is not (a pruned build), O and
  // the LSE come from the reference, rounded as the forward would write them.
  bool forward_compiled = true;
  int64_t dq_span = 0, dk_span = 0, dv_span = 0;  // elements from the first to past the last
  // The CPU fp64 reference, its rowsum(dO * O) taken with the O above (what fc_backward reads).
  ref::CpuBackwardOutput ref;
};
std::unique_ptr<BackwardInputs> make_backward_inputs(const Case& c);

struct BackwardRun {
  int family = FC_FAMILY_AUTO;
  bool deterministic = false;
  std::string describe() const;
};

// The gradients of one call; each allocation holds kGuard poisoned elements on either side.
struct BackwardOutcome {
  fc_status status = FC_OK;
  std::string message;
  std::vector<uint16_t> dq_raw, dk_raw, dv_raw;
};

// The arguments for the case's tensors and these gradient buffers; no workspace yet.
fc_backward_args backward_args(const BackwardInputs& bin, void* dq, void* dk, void* dv,
                               const BackwardRun& run);

// Allocates and poisons the gradients, sizes and allocates the workspace, lets `change` alter the
// arguments (to make the call invalid, say), then calls fc_backward and reads the gradients back.
BackwardOutcome run_backward(const BackwardInputs& bin, const BackwardRun& run,
                             const std::function<void(fc_backward_args&)>& change = nullptr);

// OK; dQ, dK and dV within the relative L2 bound of the reference and free of NaN; exact zeros
// where a query row sees no key or a key is seen by no query; nothing outside the views written.
::testing::AssertionResult gradients_match(const BackwardInputs& bin, const BackwardOutcome& out);
// Every element of the three allocations, guards included, is still poison.
::testing::AssertionResult gradients_untouched(const BackwardOutcome& out);

// One backward run checked against the reference. A forced family may answer
// FC_ERROR_UNSUPPORTED when allow_unsupported; the automatic choice only when nothing is
// compiled for the case's dtype and head_dim.
void check_backward(const BackwardInputs& bin, const BackwardRun& run,
                    bool allow_unsupported = false);
void check_backward_case(const Case& c, bool deterministic);

}  // namespace testing
}  // namespace flashcute
