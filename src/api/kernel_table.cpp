#include "kernels/decode/decode_registry.hpp"
#include "kernels/kernel_registry.hpp"

namespace flashcute {

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    register_sm80_kernels(t);
#if FLASHCUTE_WITH_SM90
    register_sm90_kernels(t);
#endif
    return t;
  }();
  return table;
}

const BackwardKernelTable& backward_kernel_table() {
  static const BackwardKernelTable table = [] {
    BackwardKernelTable t;
    register_sm80_backward_kernels(t);
#if FLASHCUTE_WITH_SM90
    register_sm90_backward_kernels(t);
#endif
    return t;
  }();
  return table;
}

const DecodeKernelTable& decode_kernel_table() {
  static const DecodeKernelTable table = [] {
    DecodeKernelTable t;
    register_sm80_decode_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace flashcute
