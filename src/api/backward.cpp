// The backward entry points: validate, size and carve the caller's workspace, pick the kernel
// family's backward for the head_dim bucket, launch on the tensors' device.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "flashcute/attention.hpp"
#include "kernels/backward/workspace.hpp"
#include "kernels/kernel_registry.hpp"

namespace flashcute {
namespace {

BackwardWorkspace workspace_for(const BackwardArgs& a) {
  const int64_t total_q = a.cu_seqlens_q != nullptr ? a.total_q : a.batch * a.seqlen_q;
  return backward_workspace(
      total_q, a.batch, a.heads,
      backward_accum_width(backward_kernel_table(), fc_dtype(a.dtype), int(a.head_dim)));
}

// The backward of the smallest compiled bucket that holds head_dim, for each family the call
// allows: AUTO tries the sm90 family first on a compute capability 9.0 device, then the SM80
// family. An entry is taken only if it supports the problem and its shared memory fits.
Status select_backward(const BackwardArgs& a, const BackwardParams& params,
                       const DeviceLimits& device, const BackwardKernelEntry*& selected) {
  selected = nullptr;
  if (Status s = require_sm80(device); !s.ok()) return s;
  std::vector<fc_kernel_family> families;
  if (Status s = candidate_families(a.family, device, families); !s.ok()) return s;
  std::string why;
  const auto refuse = [&why](const std::string& reason) {
    why += (why.empty() ? "" : "; ") + reason;
  };
  for (fc_kernel_family family : families) {
    const char* const name = family_name(family);
    const BackwardKernelEntry* const match = smallest_backward_entry(
        backward_kernel_table(), family, fc_dtype(a.dtype), int(a.head_dim));
    if (match == nullptr) {
      refuse(std::string(name) + ": no backward kernel compiled for this dtype and head_dim " +
             std::to_string(a.head_dim));
    } else if (match->supports != nullptr && !match->supports(params)) {
      refuse(std::string(name) +
             ": this combination of features is not supported by the family's backward "
             "(softcap, ALiBi, deterministic at head_dim > 128, empty sequences or unaligned "
             "tensors)");
    } else if (match->smem_bytes > device.max_smem_per_block) {
      refuse(std::string(name) + ": the backward kernel for head_dim " +
             std::to_string(match->head_dim) + " needs " + std::to_string(match->smem_bytes) +
             " bytes of shared memory; the device allows " +
             std::to_string(device.max_smem_per_block));
    } else {
      selected = match;
      return {};
    }
  }
  return {FC_ERROR_UNSUPPORTED, why};
}

}  // namespace

BackwardArgs default_backward_args() {
  BackwardArgs args;
  fc_backward_args_init(&args);
  return args;
}

Status backward_workspace_size(const BackwardArgs& args, uint64_t& bytes) {
  BackwardParams params;
  if (Status s = validate_backward_arguments(args, params); !s.ok()) return s;
  const bool empty = args.batch == 0 || args.heads == 0 || args.seqlen_q == 0;
  bytes = empty ? 0 : workspace_for(args).bytes;
  return {};
}

Status backward(const BackwardArgs& args) {
  BackwardParams params;
  if (Status s = validate_backward_arguments(args, params); !s.ok()) return s;
  if (args.batch == 0 || args.heads == 0) return {};  // nothing to write
  if (args.seqlen_q > 0) {
    const BackwardWorkspace layout = workspace_for(args);
    if (args.workspace_bytes < layout.bytes) {
      return {FC_ERROR_INVALID_ARGUMENT, "workspace: " + std::to_string(args.workspace_bytes) +
                                             " bytes given, " + std::to_string(layout.bytes) +
                                             " needed (fc_backward_workspace_size)"};
    }
    if (args.workspace == nullptr) return {FC_ERROR_INVALID_ARGUMENT, "workspace is null"};
    if (reinterpret_cast<uintptr_t>(args.workspace) % 256 != 0) {
      return {FC_ERROR_INVALID_ARGUMENT, "workspace is not 256-byte aligned"};
    }
    char* const base = static_cast<char*>(args.workspace);
    float* const stats = reinterpret_cast<float*>(base + layout.row_stats_offset);
    params.dout_dot_out = stats;
    params.padded_rows = PaddedRows::total(params.total_q, params.batch);
    params.lse_log2_padded = stats;
    params.dout_dot_out_padded = stats + params.heads * params.padded_rows;
    params.dq_accum = reinterpret_cast<float*>(base + layout.dq_accum_offset);
    params.dq_counts = reinterpret_cast<int*>(base + layout.dq_counts_offset);
  }

  int device = -1;
  if (Status s = find_tensor_device(args, device); !s.ok()) return s;
  DeviceLimits limits{};
  if (Status s = device_limits(device, limits); !s.ok()) return s;
  const BackwardKernelEntry* kernel = nullptr;
  if (Status s = select_backward(args, params, limits, kernel); !s.ok()) return s;

  DeviceGuard guard(device);
  const cudaError_t err = kernel->launch(params, static_cast<cudaStream_t>(args.stream));
  if (err != cudaSuccess) return cuda_error("launching the backward kernels", err);
  return {};
}

}  // namespace flashcute
