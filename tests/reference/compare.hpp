// Comparing an output against a reference: relative L2 error plus a max-abs-error bound of a few
// units in the last place of the output type at the reference's magnitude. NaN never passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashcute/flashcute.h"

namespace flashcute {
namespace ref {

struct Tolerance {
  double rel_l2;    // ||out - ref|| / ||ref||
  double max_ulps;  // max |out - ref| in ulps of the output type at max |ref|
};

// bf16: rel-L2 1e-2; fp16: 2e-3; both 4 ulps.
Tolerance default_tolerance(fc_dtype dtype);

// The spacing of dtype's values at magnitude m (0 for m == 0).
double ulp_at(double magnitude, fc_dtype dtype);

struct Comparison {
  bool pass = false;
  size_t count = 0;
  size_t nan_count = 0;  // NaN in the output, or a non-finite value where the reference differs
  double rel_l2 = 0;
  double max_abs_err = 0;
  double max_abs_ref = 0;
  double abs_bound = 0;
  size_t worst_index = 0;
  std::string summary() const;  // one line with every figure
};

// out and ref hold n values in the same order. When the reference is exactly zero the output must
// be too.
template <typename Ref>
Comparison compare_output(const float* out, const Ref* ref, size_t n, fc_dtype dtype,
                          Tolerance tolerance);

// Gradients: compare_output's figures, but the L2 error is measured against
// max(||ref||, floor * ||terms||) and the max error in ulps at max(max |ref|, floor * max |terms|),
// where terms holds each element's sum of absolute terms (CpuBackwardOutput::dq_terms, ...). A
// gradient that cancels far below its terms is held to the rounding its terms allow rather than to
// its own, much smaller, size; elsewhere ||ref|| is the larger and this is compare_output.
Comparison compare_gradient(const float* out, const double* ref, const double* terms, size_t n,
                            fc_dtype dtype, Tolerance tolerance, double floor);

// LSE: |out - ref| <= 2e-4 * (1 + |ref|); an infinite reference requires the same infinity.
template <typename Ref>
Comparison compare_lse(const float* out, const Ref* ref, size_t n);

}  // namespace ref
}  // namespace flashcute
