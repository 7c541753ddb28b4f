#include "reference/compare.hpp"

#include <cmath>
#include <cstdio>

namespace flashcute {
namespace ref {

Tolerance default_tolerance(fc_dtype dtype) {
  return dtype == FC_FLOAT16 ? Tolerance{2e-3, 4.0} : Tolerance{1e-2, 4.0};
}

double ulp_at(double magnitude, fc_dtype dtype) {
  if (magnitude == 0) return 0;
  const int mantissa_bits = dtype == FC_FLOAT16 ? 10 : 7;
  return std::ldexp(1.0, std::ilogb(magnitude) - mantissa_bits);
}

std::string Comparison::summary() const {
  char line[320];
  std::snprintf(line, sizeof(line),
                "%s: %zu values, rel_l2 %.3e, max_abs_err %.3e (bound %.3e) at index %zu, "
                "max_abs_ref %.3e, non-finite mismatches %zu",
                pass ? "pass" : "FAIL", count, rel_l2, max_abs_err, abs_bound, worst_index,
                max_abs_ref, nan_count);
  return line;
}

template <typename Ref>
Comparison compare_output(const float* out, const Ref* ref, size_t n, fc_dtype dtype,
                          Tolerance tolerance) {
  Comparison c;
  c.count = n;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = ref[i], e = std::fabs(double(out[i]) - r);
    if (!std::isfinite(double(out[i])) || !std::isfinite(r)) {
      if (c.nan_count++ == 0) c.worst_index = i;  // the first non-finite value is the worst
      continue;
    }
    err2 += e * e;
    ref2 += r * r;
    c.max_abs_ref = std::fmax(c.max_abs_ref, std::fabs(r));
    if (e > c.max_abs_err) {
      c.max_abs_err = e;
      if (c.nan_count == 0) c.worst_index = i;
    }
  }
  c.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0.0);
  c.abs_bound = tolerance.max_ulps * ulp_at(c.max_abs_ref, dtype);
  c.pass = c.nan_count == 0 && c.rel_l2 <= tolerance.rel_l2 && c.max_abs_err <= c.abs_bound;
  return c;
}

Comparison compare_gradient(const float* out, const double* ref, const double* terms, size_t n,
                            fc_dtype dtype, Tolerance tolerance, double floor) {
  Comparison c;
  c.count = n;
  double err2 = 0, ref2 = 0, terms2 = 0, max_terms = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = ref[i], e = std::fabs(double(out[i]) - r);
    if (!std::isfinite(double(out[i])) || !std::isfinite(r)) {
      if (c.nan_count++ == 0) c.worst_index = i;
      continue;
    }
    err2 += e * e;
    ref2 += r * r;
    terms2 += terms[i] * terms[i];
    c.max_abs_ref = std::fmax(c.max_abs_ref, std::fabs(r));
    max_terms = std::fmax(max_terms, terms[i]);
    if (e > c.max_abs_err) {
      c.max_abs_err = e;
      if (c.nan_count == 0) c.worst_index = i;
    }
  }
  const double norm = std::fmax(std::sqrt(ref2), floor * std::sqrt(terms2));
  c.rel_l2 = norm > 0 ? std::sqrt(err2) / norm : (err2 > 0 ? INFINITY : 0.0);
  c.abs_bound = tolerance.max_ulps * ulp_at(std::fmax(c.max_abs_ref, floor * max_terms), dtype);
  c.pass = c.nan_count == 0 && c.rel_l2 <= tolerance.rel_l2 && c.max_abs_err <= c.abs_bound;
  return c;
}

template <typename Ref>
Comparison compare_lse(const float* out, const Ref* ref, size_t n) {
  Comparison c;
  c.count = n;
  c.pass = true;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double o = out[i], r = ref[i];
    if (std::isinf(r)) {
      if (o != r) {
        ++c.nan_count;
        c.worst_index = i;
        c.pass = false;
      }
      continue;
    }
    const double e = std::fabs(o - r);
    if (!(e <= 2e-4 * (1 + std::fabs(r)))) {  // written so that NaN fails
      c.pass = false;
      if (!std::isfinite(o)) ++c.nan_count;
    }
    if (std::isfinite(o)) {
      err2 += e * e;
      if (e > c.max_abs_err) {
        c.max_abs_err = e;
        c.worst_index = i;
      }
    }
    ref2 += r * r;
    c.max_abs_ref = std::fmax(c.max_abs_ref, std::fabs(r));
  }
  c.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  c.abs_bound = 2e-4 * (1 + c.max_abs_ref);
  return c;
}

template Comparison compare_output<float>(const float*, const float*, size_t, fc_dtype, Tolerance);
template Comparison compare_output<double>(const float*, const double*, size_t, fc_dtype,
                                           Tolerance);
template Comparison compare_lse<float>(const float*, const float*, size_t);
template Comparison compare_lse<double>(const float*, const double*, size_t);

}  // namespace ref
}  // namespace flashcute
