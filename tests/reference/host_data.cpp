#include "reference/host_data.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

namespace flashcute {
namespace ref {
namespace {

// SplitMix64 finalizer: a counter-based generator, so any chunk can be filled independently.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1), never 0 so that log() below is finite.
double uniform(uint64_t bits) { return (double(bits >> 11) + 0.5) * 0x1.0p-53; }

float draw(InputMode mode, uint64_t seed, size_t index) {
  const uint64_t r1 = mix(seed ^ mix(2 * index)), r2 = mix(seed ^ mix(2 * index + 1));
  if (mode == InputMode::kInteger) return float(int(r1 % 4) - 2);
  // Box-Muller transform of two uniforms.
  const double normal =
      std::sqrt(-2.0 * std::log(uniform(r1))) * std::cos(6.283185307179586 * uniform(r2));
  return float(mode == InputMode::kScaledUp ? 6.0 * normal : normal);
}

}  // namespace

uint16_t to_bits(float x, fc_dtype dtype) {
  uint16_t bits;
  if (dtype == FC_FLOAT16) {
    const __half h = __float2half_rn(x);
    std::memcpy(&bits, &h, sizeof(bits));
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    std::memcpy(&bits, &h, sizeof(bits));
  }
  return bits;
}

float from_bits(uint16_t bits, fc_dtype dtype) {
  if (dtype == FC_FLOAT16) {
    __half h;
    std::memcpy(&h, &bits, sizeof(bits));
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &bits, sizeof(bits));
  return __bfloat162float(h);
}

std::vector<uint16_t> to_bits(const std::vector<float>& values, fc_dtype dtype) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = to_bits(values[i], dtype);
  return bits;
}

std::vector<float> from_bits(const std::vector<uint16_t>& bits, fc_dtype dtype) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = from_bits(bits[i], dtype);
  return values;
}

uint64_t fresh_seed() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

std::vector<float> random_inputs(size_t n, InputMode mode, fc_dtype dtype, uint64_t seed) {
  std::vector<float> values(n);
  const size_t workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const size_t chunk = (n + workers - 1) / workers;
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = w * chunk; i < std::min(n, (w + 1) * chunk); ++i)
        values[i] = from_bits(to_bits(draw(mode, seed, i), dtype), dtype);
    });
  }
  for (std::thread& t : threads) t.join();
  return values;
}

}  // namespace ref
}  // namespace flashcute
