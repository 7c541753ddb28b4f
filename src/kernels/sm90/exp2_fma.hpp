// 2^x without the MUFU (ex2) pipe. Where the SM's ex2 unit, a quarter of the FMA pipe's rate, is
// the bottleneck of the softmax (d 64, traits.hpp), a share of the exponentials is computed here
// on the FMA and integer pipes instead. Host-callable so that the CPU tests can check its error.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cute/config.hpp>

namespace flashcute::sm90 {

CUTE_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

CUTE_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// For x in [-125, 8] (the exponents of an unmasked block, whose reference maximum is at most 8
// below the true one): the nearest integer j of x lands in the low mantissa bits of
// x + 1.5 * 2^23, a cubic gives 2^f for f = x - j in [-0.5, 0.5], and the result is that times
// 2^j, built from j's bits. Relative error under 7.5e-5, below half a unit in the last place of
// bf16 and fp16. Below -125 the result is 2^-125 rather than 0 (nothing beside a row sum of at
// least 1); NaN stays NaN (so a NaN input still shows in the output). Nine instructions, against
// one ex2 that holds its pipe four times as long as an FMA holds its own.
CUTE_HOST_DEVICE float exp2_on_fma_pipe(float x) {
  constexpr float kRoundingShift = 12582912.f;  // 1.5 * 2^23
#if defined(__CUDA_ARCH__)
  asm("max.NaN.f32 %0, %0, 0fC2FA0000;" : "+f"(x));  // max(x, -125), NaN if x is NaN
  // The _rn forms keep the compiler from folding the shift away or into an FMA.
  float const shifted = __fadd_rn(x, kRoundingShift);
  float const f = __fsub_rn(x, __fsub_rn(shifted, kRoundingShift));
#else
  x = x < -125.f ? -125.f : x;
  float const shifted = x + kRoundingShift;
  float const f = x - (shifted - kRoundingShift);
#endif
  // Coefficients fitted for the smallest relative error of 2^f on [-0.5, 0.5].
  float const p = fmaf(fmaf(fmaf(0.05517167f, f, 0.24261114f), f, 0.69326097f), f, 0.99992806f);
  // The shifted value's pattern is 0x4B400000 + j: adding the exponent bias 127 and shifting its
  // low 9 bits into the exponent field gives 2^j (j + 127 is in [2, 135]).
  return p * bits_float((float_bits(shifted) + 127u) << 23);
}

}  // namespace flashcute::sm90
