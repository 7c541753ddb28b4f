#include "kernels/sm90/config.hpp"
#include "kernels/sm90/launch.hpp"
FLASHCUTE_SM90_INSTANTIATE(cutlass::half_t, fp16, FC_FLOAT16, 64)
