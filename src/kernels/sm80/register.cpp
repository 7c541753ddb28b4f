// Collects the SM80 family's instantiations (the list is generated from the build's dtype and
// head_dim selection) into the kernel table.
#include "api/kernel_registry.hpp"

namespace flashcute {
namespace sm80 {
#define FLASHCUTE_SM80_INSTANCE(dtype, hd) void register_##dtype##_hd##hd(KernelTable& table);
#include "sm80_instances.inc"
#undef FLASHCUTE_SM80_INSTANCE
}  // namespace sm80

void register_sm80_kernels(KernelTable& table) {
#define FLASHCUTE_SM80_INSTANCE(dtype, hd) sm80::register_##dtype##_hd##hd(table);
#include "sm80_instances.inc"
#undef FLASHCUTE_SM80_INSTANCE
}

}  // namespace flashcute
