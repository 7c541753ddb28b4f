// The KV-cache entry points: validate, pick the decode path of the head_dim bucket, choose the
// key split, carve the caller's workspace, optionally check the device-memory contract, launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "api/device.hpp"
#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "flashcute/attention.hpp"
#include "kernels/decode/contract_check.hpp"
#include "kernels/decode/decode_registry.hpp"
#include "kernels/decode/split_heuristic.hpp"
#include "kernels/decode/workspace.hpp"

namespace flashcute {
namespace {

// Everything a call resolves before it can size its workspace or launch.
struct KvcachePlan {
  DecodeParams params;
  const DecodeKernelEntry* kernel = nullptr;
  decode::DecodeWorkspace workspace{};
  int device = -1;
  bool empty = false;  // nothing to launch
};

Status select_decode(const KvcacheArgs& a, const DeviceLimits& device,
                     const DecodeKernelEntry*& selected) {
  selected = nullptr;
  if (Status s = require_sm80(device); !s.ok()) return s;
  if (a.family == FC_FAMILY_SM90) {
    return {FC_ERROR_UNSUPPORTED,
            "family: the sm90 family has no KV-cache kernel yet; use FC_FAMILY_AUTO or "
            "FC_FAMILY_SM80"};
  }
  for (const DecodeKernelEntry& e : decode_kernel_table()) {
    if (e.family == FC_FAMILY_SM80 && e.dtype == a.dtype && e.head_dim >= a.head_dim &&
        (selected == nullptr || e.head_dim < selected->head_dim)) {
      selected = &e;
    }
  }
  if (selected == nullptr) {
    return {FC_ERROR_UNSUPPORTED, "sm80: no KV-cache kernel compiled for this dtype and head_dim " +
                                      std::to_string(a.head_dim)};
  }
  if (selected->smem_bytes > device.max_smem_per_block) {
    return {FC_ERROR_UNSUPPORTED, "the KV-cache kernel for head_dim " +
                                      std::to_string(selected->head_dim) + " needs " +
                                      std::to_string(selected->smem_bytes) +
                                      " bytes of shared memory; the device allows " +
                                      std::to_string(device.max_smem_per_block)};
  }
  return {};
}

// The split count: the caller's, or the heuristic's over the longest sequence the cache allows.
int resolve_num_splits(const KvcacheArgs& a, const DecodeParams& p, const DecodeKernelEntry& k,
                       const DeviceLimits& device) {
  if (a.num_splits > 0) return a.num_splits;
  const int64_t group = p.pack_gqa ? p.heads_per_kv_head : 1;
  const int64_t head_sets = p.pack_gqa ? p.heads_k : p.heads;
  const int64_t m_blocks = (a.seqlen_q * group + k.rows_per_block - 1) / k.rows_per_block;
  const int64_t keys =
      a.cache_seqlens == nullptr ? a.cache_seqlen + a.seqlen_new : kvcache_capacity(a);
  const int64_t rounds = (keys + k.keys_per_round - 1) / k.keys_per_round;
  const int64_t blocks_per_sm =
      std::max<int64_t>(1, int64_t(device.max_smem_per_block / k.smem_bytes));
  return decode::choose_num_splits(m_blocks * head_sets * a.batch, rounds,
                                   int64_t(device.sm_count) * blocks_per_sm, FC_KVCACHE_MAX_SPLITS);
}

Status plan_kvcache(const KvcacheArgs& a, KvcachePlan& plan) {
  if (Status s = validate_kvcache_arguments(a, plan.params); !s.ok()) return s;
  plan.empty = a.batch == 0 || a.heads == 0 || (a.seqlen_q == 0 && a.seqlen_new == 0);
  if (plan.empty) return {};
  if (Status s = find_tensor_device(a, plan.device); !s.ok()) return s;
  DeviceLimits limits{};
  if (Status s = device_limits(plan.device, limits); !s.ok()) return s;
  if (Status s = select_decode(a, limits, plan.kernel); !s.ok()) return s;
  DecodeParams& p = plan.params;
  p.num_splits = resolve_num_splits(a, p, *plan.kernel, limits);
  p.dependent_launch = limits.compute_capability >= 90;
  plan.workspace = decode::decode_workspace(
      a.debug_checks != 0, p.rotary_dim > 0, uint64_t(a.batch) * a.seqlen_q * a.heads * a.head_dim,
      p.num_splits, uint64_t(p.total_q) * a.heads, int(a.head_dim));
  return {};
}

std::string contract_message(const decode::ContractReport& r, const KvcacheArgs& a) {
  const std::string at = "[" + std::to_string(r.sequence) + "]";
  switch (r.violation) {
    case decode::ContractViolation::kCacheSeqlens:
      return "cache_seqlens" + at + ": negative, or with seqlen_new (" +
             std::to_string(a.seqlen_new) + ") past the cache's " +
             std::to_string(kvcache_capacity(a)) + " slots";
    case decode::ContractViolation::kCacheLeftpad:
      return "cache_leftpad" + at + ": outside [0, cache_seqlens" + at + "]";
    case decode::ContractViolation::kCacheBatchIdx:
      return "cache_batch_idx" + at +
             ": outside [0, batch_cache = " + std::to_string(a.batch_cache) + ")";
    case decode::ContractViolation::kBlockTable:
      return "block_table" + at + ": an entry the sequence uses is outside [0, " +
             std::to_string(a.batch_cache) + ") pages";
    case decode::ContractViolation::kRotaryLength:
      return "rotary_cos" + at + ": a rotary position is past rotary_seqlen (" +
             std::to_string(a.rotary_seqlen) + ")";
    case decode::ContractViolation::kCuSeqlensQ:
      return "cu_seqlens_q" + at + ": not rising from 0 to at most total_q (" +
             std::to_string(a.total_q) + ") in steps of at most seqlen_q (" +
             std::to_string(a.seqlen_q) + ")";
    case decode::ContractViolation::kNone:
      break;
  }
  return {};
}

}  // namespace

KvcacheArgs default_kvcache_args() {
  KvcacheArgs args;
  fc_kvcache_args_init(&args);
  return args;
}

Status kvcache_workspace_size(const KvcacheArgs& args, uint64_t& bytes) {
  KvcachePlan plan;
  if (Status s = plan_kvcache(args, plan); !s.ok()) return s;
  bytes = plan.empty ? 0 : plan.workspace.bytes;
  return {};
}

Status kvcache(const KvcacheArgs& args) {
  KvcachePlan plan;
  if (Status s = plan_kvcache(args, plan); !s.ok()) return s;
  if (plan.empty) return {};
  const decode::DecodeWorkspace& layout = plan.workspace;
  if (layout.bytes > 0) {
    if (args.workspace_bytes < layout.bytes) {
      return {FC_ERROR_INVALID_ARGUMENT, "workspace: " + std::to_string(args.workspace_bytes) +
                                             " bytes given, " + std::to_string(layout.bytes) +
                                             " needed (fc_kvcache_workspace_size)"};
    }
    if (args.workspace == nullptr) return {FC_ERROR_INVALID_ARGUMENT, "workspace is null"};
    if (reinterpret_cast<uintptr_t>(args.workspace) % 256 != 0) {
      return {FC_ERROR_INVALID_ARGUMENT, "workspace is not 256-byte aligned"};
    }
  }
  DecodeParams& p = plan.params;
  char* const base = static_cast<char*>(args.workspace);
  if (args.debug_checks) p.contract_status = reinterpret_cast<int*>(base + layout.contract_offset);
  if (p.rotary_dim > 0) p.q_rotated = base + layout.q_rotated_offset;
  if (p.num_splits > 1) {
    p.o_partial = reinterpret_cast<float*>(base + layout.o_partial_offset);
    p.lse_partial = reinterpret_cast<float*>(base + layout.lse_partial_offset);
  }

  DeviceGuard guard(plan.device);
  const auto stream = static_cast<cudaStream_t>(args.stream);
  if (args.debug_checks) {
    decode::ContractReport report{};
    const cudaError_t err =
        decode::check_decode_contract(p, int(kvcache_capacity(args)), stream, report);
    if (err != cudaSuccess) return cuda_error("checking the KV-cache contract", err);
    if (report.violation != decode::ContractViolation::kNone) {
      return {FC_ERROR_INVALID_ARGUMENT, contract_message(report, args)};
    }
  }
  const cudaError_t err = plan.kernel->launch(p, stream);
  if (err != cudaSuccess) return cuda_error("launching the KV-cache kernels", err);
  return {};
}

}  // namespace flashcute
