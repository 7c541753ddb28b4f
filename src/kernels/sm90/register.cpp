// Collects the Hopper family's instantiations (the list is generated from the build's dtype and
// head_dim selection) into the kernel table.
#include "api/kernel_registry.hpp"

namespace flashcute {
namespace sm90 {
#define FLASHCUTE_SM90_INSTANCE(dtype, hd) void register_##dtype##_hd##hd(KernelTable& table);
#include "sm90_instances.inc"
#undef FLASHCUTE_SM90_INSTANCE
}  // namespace sm90

void register_sm90_kernels(KernelTable& table) {
#define FLASHCUTE_SM90_INSTANCE(dtype, hd) sm90::register_##dtype##_hd##hd(table);
#include "sm90_instances.inc"
#undef FLASHCUTE_SM90_INSTANCE
}

}  // namespace flashcute
