#include "kernels/sm90/config.hpp"
#include "kernels/sm90/launch.hpp"
FLASHCUTE_SM90_INSTANTIATE(cutlass::bfloat16_t, bf16, FC_BFLOAT16, 96)
