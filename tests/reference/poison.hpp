// Poisoning outputs before a run: every byte 0xFF is a NaN in fp16, bf16 and fp32, so an element a
// kernel fails to write can never pass a comparison.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace flashcute {
namespace ref {

constexpr uint16_t kPoison16 = 0xFFFF;
constexpr uint32_t kPoison32 = 0xFFFFFFFFu;

cudaError_t poison_device(void* data, size_t bytes);

}  // namespace ref
}  // namespace flashcute
