// What the GPU suite shares: device buffers, test cases and their placement in memory, the
// reference for a case, running one kernel choice on poisoned outputs, and checking the result.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "flashcute/flashcute.h"
#include "reference/host_data.hpp"
#include "reference/problem.hpp"

namespace flashcute {
namespace testing {

int device_count();  // 0 when there is no GPU or no driver
// Whether the current device has compute capability 9.0 (where the sm90 family runs).
bool device_is_sm90();

#define FC_REQUIRE_GPU()                         \
  if (::flashcute::testing::device_count() == 0) \
  GTEST_SKIP() << "no CUDA GPU found (cudaGetDeviceCount); the GPU suite needs one"

// FLASHCUTE_TEST_SMALL=1 shrinks the cases so the suite fits under compute-sanitizer.
bool small_mode();
// FLASHCUTE_TEST_MAX_CASES=n keeps n of the all-pairs cases, evenly spread (0 or unset: all).
size_t case_limit();

// Fails the test and throws when e is an error (the suite's cases end there).
void cuda_ok(cudaError_t e, const char* what);

// Tokens of a Q-like (query) or K-like tensor: batch * seqlen, or the packed total when varlen.
int64_t tokens(const ref::Problem& p, bool query);

// Calls f(canonical_row, element_offset) for each (sequence, token, head) row of a Q-like (query)
// or K-like tensor, in canonical order.
template <typename F>
void for_each_row(const ref::Problem& p, bool query, int heads, const ref::Layout& l, F f) {
  int64_t row = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t n = query ? p.seq_q(b) : p.seq_k(b);
    const int64_t t0 = query ? p.q_token0(b) : p.k_token0(b);
    const int64_t base = p.varlen() ? 0 : b * l.batch_stride;
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < heads; ++h) f(row++, base + (t0 + i) * l.seq_stride + h * l.head_stride);
  }
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* get() const { return ptr_; }

 private:
  char* ptr_ = nullptr;
};

// Where the tensors lie: packed (B, S, H, D); head-major (B, H, S, D) for all four; or Q, K and V
// as slices of one packed (B, S, H + 2 Hk, D) tensor with O's rows and heads padded apart.
enum class Placement { kPacked, kHeadMajor, kQkvPacked };

// The data of Q and K (V is always normal): N(0,1), N(0,6^2), or positive values in [0.5, ~1.7]
// that, with very_negative_scale(), put every scaled score below -100.
enum class Data { kNormal, kScaledUp, kPositive };
float very_negative_scale(int head_dim);

struct Case {
  fc_dtype dtype = FC_BFLOAT16;
  ref::Problem problem;
  Placement placement = Placement::kPacked;
  Data data = Data::kNormal;
  bool lse = true;
  std::string describe() const;
};

// A dense problem with scale 1/sqrt(head_dim) and no mask.
ref::Problem dense_problem(int batch, int seqlen_q, int seqlen_k, int heads, int heads_k,
                           int head_dim);

// Variable-length offsets from per-sequence lengths; batch, seqlen_q and seqlen_k become the
// count and the maxima.
void set_varlen(ref::Problem& p, const std::vector<int>& q_lengths,
                const std::vector<int>& k_lengths);

// n ALiBi slopes drawn uniformly from [0.01, 1].
std::vector<float> random_slopes(size_t n);

// A case's inputs on the current device, with host copies when the CPU reference will need them.
struct Inputs {
  Case c;
  std::unique_ptr<DeviceBuffer> data;  // Q, K and V live in this one buffer
  std::vector<float> host;             // the same values (rounded), or empty
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;
  ref::Layout q_layout, k_layout, v_layout, o_layout;
  int64_t o_span = 0;  // elements from O's first to one past its last element
  std::unique_ptr<DeviceBuffer> cu_q, cu_k, slopes;
};
std::unique_ptr<Inputs> make_inputs(const Case& c);

struct Reference {
  std::vector<float> o, lse;  // canonical layouts (ref::Problem::o_index, lse_index)
  bool from_cpu = false;
};
// CPU fp64 when the problem is small, else the GPU fp32 reference.
Reference reference_for(const Inputs& in);

struct KernelChoice {
  int family = FC_FAMILY_AUTO;
  fc_tile_config tile{0, 0, 0};
  std::string describe() const;
};
// Automatic first, then every compiled tile of every family this device can run.
std::vector<KernelChoice> kernel_choices(fc_dtype dtype, int head_dim);

// Guard elements on each side of every output; 64 keeps the views 16-byte aligned.
constexpr int64_t kGuard = 64;

// Outputs of one call, with guard regions around them: every element the call must not write is
// still poison afterwards.
struct Outcome {
  fc_status status = FC_OK;
  std::string message;
  std::vector<uint16_t> o_raw;  // the whole O allocation
  std::vector<float> lse_raw;   // the whole LSE allocation
};
fc_forward_args forward_args(const Inputs& in, void* o, float* lse, const KernelChoice& k);
// Allocates and poisons outputs on the current device; calls fc_forward with `call_device`
// current (-1: the same device).
Outcome run_kernel(const Inputs& in, const KernelChoice& k, int call_device = -1);

// OK, O and LSE match the reference, and nothing outside the views was written.
::testing::AssertionResult matches(const Inputs& in, const Reference& ref, const Outcome& out);
// Every output element, guards included, is still poison.
::testing::AssertionResult untouched(const Inputs& in, const Outcome& out);

// Runs every kernel choice against one shared reference. Auto must succeed; a forced family may
// answer FC_ERROR_UNSUPPORTED only when allow_unsupported (a feature that family lacks).
void check_everywhere(const Inputs& in, bool allow_unsupported = false);
void check_case(const Case& c, bool allow_unsupported = false);

}  // namespace testing
}  // namespace flashcute
