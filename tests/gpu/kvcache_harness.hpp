// The KV-cache part of the GPU suite. A KvCase describes a decode call the way flashcute.h does:
// the cache (dense rows picked by cache_batch_idx or not, or pages through a shuffled block
// table), each sequence's filled length and left padding, the new tokens, rotary, the mask and
// score modifiers. Its inputs are uploaded once; the caches hold random values in every live slot
// and NaN everywhere else (slots before the left padding and past the filled length, spare rows
// and pages), so a kernel that reads or writes outside the contract cannot pass. Before every run
// the caches are restored and O, the LSE and the workspace poisoned; afterwards O and the LSE are
// checked against the CPU fp64 forward reference over the keys each sequence sees, and the caches
// against the expected append, element by element.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashcute/flashcute.h"
#include "gpu_harness.hpp"

namespace flashcute {
namespace testing {

enum class CacheLayout { kDense, kDenseBatchIdx, kPaged };
enum class Leftpad { kNone, kThird, kAll };  // cache_leftpad: none, seqlen / 3, seqlen
enum class Alibi { kNone, kPerHead, kPerBatchHead };

struct KvCase {
  fc_dtype dtype = FC_BFLOAT16;
  int heads = 4, heads_k = 4, head_dim = 128;
  int seqlen_q = 1;                // query tokens per sequence; the maximum when packed
  std::vector<int> q_lengths;      // non-empty: packed queries (cu_seqlens_q) of these lengths
  std::vector<int> cache_seqlens;  // slots filled before the call, one per sequence (the batch)
  bool seqlens_array = true;       // false: the scalar cache_seqlen (all lengths equal)
  Leftpad leftpad = Leftpad::kNone;
  int seqlen_new = 0;  // new tokens appended (k_new, v_new)
  CacheLayout layout = CacheLayout::kDense;
  int page_size = 0;              // paged: slots per page
  bool cache_head_major = false;  // (rows or pages, heads_k, slots, head_dim)
  int capacity = 0;  // slots per sequence; 0: the longest need plus a few, in whole pages
  int rotary_dim = 0;
  bool rotary_interleaved = false;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::kNone;
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  Data data = Data::kNormal;   // of q, k_new and the cached keys (values are always N(0, 1))
  bool lse = true;

  int batch() const { return int(cache_seqlens.size()); }
  bool packed() const { return !q_lengths.empty(); }
  bool paged() const { return layout == CacheLayout::kPaged; }
  std::string describe() const;
};

// Everything a case uploads, its expected caches and its reference.
struct KvInputs {
  KvCase c;
  // Geometry.
  int capacity = 0;     // slots per sequence
  int row_slots = 0;    // slots per cache row (dense) or page (paged)
  int batch_cache = 0;  // cache rows, or pages
  int pages_per_sequence = 0, table_stride = 0;
  int64_t page_stride = 0, slot_stride = 0, head_stride = 0;  // cache strides in elements
  int64_t cache_elements = 0;
  std::vector<int32_t> batch_idx, block_table, cu_q;
  int64_t tokens = 0;  // query tokens
  int64_t o_row_stride = 0, o_span = 0;
  int rotary_seqlen = 0;
  // Per call: the lengths and what follows from them (set_cache_seqlens).
  std::vector<int32_t> seqlens, leftpads;
  std::vector<uint16_t> k_before, v_before;  // the caches as uploaded before each run
  std::vector<uint16_t> k_after, v_after;    // ... and as the call must leave them
  std::vector<char> k_rotated;               // new-key elements rounded after a rotation
  std::vector<double> ref_o;                 // (tokens, heads, head_dim)
  std::vector<double> ref_lse;               // the API's layout
  // Host values (rounded to dtype).
  std::vector<float> q, k_new, v_new, cos, sin, slopes;
  std::vector<uint16_t> k_values, v_values;  // every element of the physical caches
  // Device.
  std::unique_ptr<DeviceBuffer> q_dev, k_new_dev, v_new_dev, k_cache_dev, v_cache_dev;
  std::unique_ptr<DeviceBuffer> seqlens_dev, leftpad_dev, batch_idx_dev, table_dev, cu_q_dev;
  std::unique_ptr<DeviceBuffer> cos_dev, sin_dev, slopes_dev;

  int q_length(int b) const { return c.packed() ? c.q_lengths[b] : c.seqlen_q; }
  int64_t q_token0(int b) const { return c.packed() ? cu_q[b] : int64_t(b) * c.seqlen_q; }
  int64_t lse_index(int b, int i, int h) const;
  // Element offset of (slot, head) of sequence b in the physical caches.
  int64_t cache_offset(int b, int slot, int h) const;
};

std::unique_ptr<KvInputs> make_kv_inputs(const KvCase& c);

// Sets the cache lengths (and left padding) of the next runs: recomputes the caches' contents and
// poison, the expected append and the reference, and uploads the arrays into the same device
// buffers (so a captured graph sees them).
void set_cache_seqlens(KvInputs& in, const std::vector<int>& seqlens);

struct KvRun {
  int num_splits = 0;  // 0: automatic
  bool debug_checks = false;
  int family = FC_FAMILY_AUTO;
  std::string describe() const;
};

// O and the LSE with kGuard poisoned elements on either side, and a workspace.
struct KvOutputs {
  std::unique_ptr<DeviceBuffer> o, lse, workspace;
  uint64_t workspace_bytes = 0;
};

// The arguments for the case's tensors and these outputs (workspace included).
fc_kvcache_args kvcache_args(const KvInputs& in, const KvOutputs& out, const KvRun& run);
// Sizes the workspace for the run's arguments (failing the test if that fails) and allocates
// everything.
KvOutputs make_outputs(const KvInputs& in, const KvRun& run);
// Restores the caches and poisons O, the LSE and the workspace.
void reset(const KvInputs& in, const KvOutputs& out);

struct KvOutcome {
  fc_status status = FC_OK;
  std::string message;
  std::vector<uint16_t> o_raw;  // the whole O allocation
  std::vector<float> lse_raw;   // the whole LSE allocation
  std::vector<uint16_t> k_cache, v_cache;
};
// Waits for the device and reads everything back.
KvOutcome collect(const KvInputs& in, const KvOutputs& out, fc_status status,
                  const std::string& message);

// One call on fresh outputs; `change` may alter the arguments (after the workspace is sized).
KvOutcome run_kvcache(const KvInputs& in, const KvRun& run,
                      const std::function<void(fc_kvcache_args&)>& change = nullptr);

// OK; O and the LSE match the reference with nothing outside their views written; the caches
// hold exactly the expected append (rotated keys within one unit in the last place).
::testing::AssertionResult kv_matches(const KvInputs& in, const KvOutcome& out);
// O and the LSE are all poison and the caches as they were before the call.
::testing::AssertionResult kv_untouched(const KvInputs& in, const KvOutcome& out);

// Runs and checks. A head_dim with no decode kernel compiled in this build may answer
// FC_ERROR_UNSUPPORTED (noted, nothing written).
void check_kvcache(const KvInputs& in, const KvRun& run);

}  // namespace testing
}  // namespace flashcute
