// The extern "C" surface over the C++ API; errors are kept per thread for fc_last_error().
#include <string>

#include "api/dispatch.hpp"
#include "flashcute/attention.hpp"
#include "flashcute/flashcute.h"

namespace {
thread_local std::string last_error;

fc_status record(const flashcute::Status& s) {
  last_error = s.message;
  return s.code;
}

// One entry point's C boundary: a null argument block is an error, and no exception crosses it.
template <class Args, class Run>
fc_status guarded(const Args* args, Run&& run) {
  if (args == nullptr) return record({FC_ERROR_INVALID_ARGUMENT, "args is null"});
  try {
    return record(run(*args));
  } catch (const std::exception& e) {
    return record({FC_ERROR_CUDA, std::string("internal error: ") + e.what()});
  }
}

// A workspace query: *bytes is written only when the call is valid.
template <class Args, class Size>
fc_status workspace_query(const Args* args, uint64_t* bytes, Size&& size) {
  if (args != nullptr && bytes == nullptr) {
    return record({FC_ERROR_INVALID_ARGUMENT, "bytes is null"});
  }
  return guarded(args, [&](const Args& a) {
    uint64_t n = 0;
    const flashcute::Status s = size(a, n);
    if (s.ok()) *bytes = n;
    return s;
  });
}
}  // namespace

extern "C" {

void fc_forward_args_init(fc_forward_args* args) {
  if (args == nullptr) return;
  *args = fc_forward_args{};
  args->abi_version = FC_ABI_VERSION;
  args->dtype = FC_BFLOAT16;
  args->causal_alignment = FC_CAUSAL_BOTTOM_RIGHT;
  args->window_left = -1;
  args->window_right = -1;
  args->family = FC_FAMILY_AUTO;
}

fc_status fc_forward(const fc_forward_args* args) {
  return guarded(args, [](const fc_forward_args& a) { return flashcute::forward(a); });
}

void fc_backward_args_init(fc_backward_args* args) {
  if (args == nullptr) return;
  *args = fc_backward_args{};
  args->abi_version = FC_ABI_VERSION;
  args->dtype = FC_BFLOAT16;
  args->causal_alignment = FC_CAUSAL_BOTTOM_RIGHT;
  args->window_left = -1;
  args->window_right = -1;
  args->family = FC_FAMILY_AUTO;
}

fc_status fc_backward_workspace_size(const fc_backward_args* args, uint64_t* bytes) {
  return workspace_query(args, bytes, [](const fc_backward_args& a, uint64_t& n) {
    return flashcute::backward_workspace_size(a, n);
  });
}

fc_status fc_backward(const fc_backward_args* args) {
  return guarded(args, [](const fc_backward_args& a) { return flashcute::backward(a); });
}

void fc_kvcache_args_init(fc_kvcache_args* args) {
  if (args == nullptr) return;
  *args = fc_kvcache_args{};
  args->abi_version = FC_ABI_VERSION;
  args->dtype = FC_BFLOAT16;
  args->window_left = -1;
  args->window_right = -1;
  args->family = FC_FAMILY_AUTO;
}

fc_status fc_kvcache_workspace_size(const fc_kvcache_args* args, uint64_t* bytes) {
  return workspace_query(args, bytes, [](const fc_kvcache_args& a, uint64_t& n) {
    return flashcute::kvcache_workspace_size(a, n);
  });
}

fc_status fc_kvcache(const fc_kvcache_args* args) {
  return guarded(args, [](const fc_kvcache_args& a) { return flashcute::kvcache(a); });
}

const char* fc_last_error(void) { return last_error.c_str(); }

int32_t fc_compiled_tile_configs(int32_t family, int32_t dtype, int32_t head_dim,
                                 fc_tile_config* out, int32_t capacity) {
  const auto tiles = flashcute::compiled_tile_configs(static_cast<fc_kernel_family>(family),
                                                      static_cast<fc_dtype>(dtype), head_dim);
  for (int32_t i = 0; i < capacity && i < int32_t(tiles.size()) && out != nullptr; ++i) {
    out[i] = tiles[i];
  }
  return int32_t(tiles.size());
}

fc_status fc_default_tile_config(int32_t family, int32_t dtype, int32_t head_dim,
                                 fc_tile_config* out) {
  if (out == nullptr) return record({FC_ERROR_INVALID_ARGUMENT, "out is null"});
  const auto f = family == FC_FAMILY_AUTO ? FC_FAMILY_SM80 : static_cast<fc_kernel_family>(family);
  if (!flashcute::default_tile_for(f, static_cast<fc_dtype>(dtype), head_dim, *out)) {
    return record({FC_ERROR_UNSUPPORTED, "no kernel compiled for this family, dtype and head_dim"});
  }
  return FC_OK;
}

}  // extern "C"
