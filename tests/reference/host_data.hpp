// Host-side input data: fp16/bf16 conversion and random inputs already rounded to the input type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flashcute/flashcute.h"

namespace flashcute {
namespace ref {

uint16_t to_bits(float x, fc_dtype dtype);  // round to nearest even
float from_bits(uint16_t bits, fc_dtype dtype);
std::vector<uint16_t> to_bits(const std::vector<float>& values, fc_dtype dtype);
std::vector<float> from_bits(const std::vector<uint16_t>& bits, fc_dtype dtype);

enum class InputMode {
  kNormal,    // N(0, 1)
  kScaledUp,  // N(0, 6^2): with scale 1/sqrt(head_dim), scores have std 36 and reach the hundreds
  kInteger,   // uniform over {-2, -1, 0, 1}, the example runner's data
};

// A seed from the system's entropy source, so that every run sees new data.
uint64_t fresh_seed();

// n values of the mode, rounded to dtype. The same (seed, n) gives the same values; the work is
// spread over threads, each value being a function of (seed, index).
std::vector<float> random_inputs(size_t n, InputMode mode, fc_dtype dtype, uint64_t seed);

}  // namespace ref
}  // namespace flashcute
