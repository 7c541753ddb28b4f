// flashcute_run: the command line of the CuTe DSL FlashAttention-2 example's runner (CUTLASS) over
// the C API. Prints the configuration, checks the output against a reference (CPU fp64 for small
// problems, GPU fp32 otherwise), times the kernel with CUDA events and prints "PASS" last.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "flashcute/flashcute.h"
#include "reference/compare.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/forward_args.hpp"
#include "reference/gpu_reference.hpp"
#include "reference/host_data.hpp"
#include "reference/poison.hpp"
#include "runner_options.hpp"

namespace {

using flashcute::ref::Problem;
using flashcute::runner::Options;

// Below this many multiply-adds (B*H*Sq*Sk*D) the fp64 CPU reference takes at most seconds.
constexpr double kCpuReferenceLimit = 1u << 30;

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "flashcute_run: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

template <typename T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

// Random sequence boundaries: batch - 1 uniform cuts of [0, total], the same fractions for Q and K
// so that equal seqlen_q and seqlen_k give equal per-sequence lengths.
void split_into_sequences(Problem* p, std::mt19937_64& rng) {
  std::vector<double> cuts(p->batch - 1);
  std::uniform_real_distribution<double> fraction(0.0, 1.0);
  for (double& c : cuts) c = fraction(rng);
  std::sort(cuts.begin(), cuts.end());
  cuts.insert(cuts.begin(), 0.0);
  cuts.push_back(1.0);
  const int64_t total_q = int64_t{p->batch} * p->seqlen_q,
                total_k = int64_t{p->batch} * p->seqlen_k;
  for (double c : cuts) {
    p->cu_seqlens_q.push_back(int32_t(std::llround(c * total_q)));
    p->cu_seqlens_k.push_back(int32_t(std::llround(c * total_k)));
  }
  p->seqlen_q = p->seqlen_k = 0;
  for (int b = 0; b < p->batch; ++b) {
    p->seqlen_q = std::max(p->seqlen_q, p->seq_q(b));
    p->seqlen_k = std::max(p->seqlen_k, p->seq_k(b));
  }
}

Problem make_problem(const Options& o, std::mt19937_64& rng) {
  Problem p;
  p.batch = int(o.batch_size);
  p.seqlen_q = int(o.seqlen_q);
  p.seqlen_k = int(o.seqlen_k);
  p.heads = int(o.num_head);
  p.heads_k = int(o.num_head_k > 0 ? o.num_head_k : o.num_head);
  p.head_dim = int(o.head_dim);
  p.softmax_scale = o.softmax_scale;
  p.causal = o.is_causal;
  p.bottom_right = o.causal_alignment == FC_CAUSAL_BOTTOM_RIGHT;
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  p.softcap = o.softcap;
  if (o.alibi) {
    std::uniform_real_distribution<float> slope(0.01f, 1.0f);
    for (int h = 0; h < p.heads; ++h) p.alibi_slopes.push_back(slope(rng));
  }
  if (o.varlen && p.batch > 0) split_into_sequences(&p, rng);
  return p;
}

// 4 * H * sq * sk * D per sequence, halved for causal when sq == sk (as the example's runner).
double attention_flops(const Problem& p) {
  double flops = 0;
  for (int b = 0; b < p.batch; ++b) {
    const double f = 4.0 * p.heads * double(p.seq_q(b)) * p.seq_k(b) * p.head_dim;
    flops += p.causal && p.seq_q(b) == p.seq_k(b) ? f / 2 : f;
  }
  return flops;
}

void print_configuration(const Options& o, const Problem& p, uint64_t seed, int input_sets) {
  std::printf(
      "flashcute_run: dtype %s, batch %d, seqlen_q %d, seqlen_k %d, heads %d, heads_k %d, "
      "head_dim %d, softmax_scale %g\n",
      o.dtype == FC_FLOAT16 ? "Float16" : "BFloat16", p.batch, p.seqlen_q, p.seqlen_k, p.heads,
      p.heads_k, p.head_dim, p.softmax_scale);
  std::printf("  causal %d (%s), window (%" PRId64 ", %" PRId64
              "), softcap %g, alibi %d, "
              "varlen %d, lse %d\n",
              p.causal, p.bottom_right ? "bottom_right" : "top_left", p.window_left, p.window_right,
              p.softcap, o.alibi, o.varlen, o.lse);
  if (o.auto_tile)
    std::printf("  family %d, tile automatic\n", int(o.family));
  else
    std::printf("  family %d, tile m_block %d, n_block %d, threads %d\n", int(o.family),
                o.m_block_size, o.n_block_size, o.num_threads);
  std::printf("  inputs %s (seed %" PRIu64 "), warmup %d, iterations %d, input sets %d%s\n",
              o.inputs == flashcute::runner::InputKind::kInteger ? "integer {-2..1}" : "normal",
              seed, o.warmup_iterations, o.iterations, input_sets,
              o.use_cold_l2 ? " (cold L2)" : "");
}

// Device copies of the inputs and outputs, `sets` times over for cold-L2 timing.
struct Buffers {
  int64_t q_elems, kv_elems, o_elems;
  uint16_t *q, *k, *v, *o;
  float* lse;
  int32_t *cu_q = nullptr, *cu_k = nullptr;
  float* slopes = nullptr;
};

fc_forward_args make_args(const Options& o, const Problem& p, const Buffers& buf, int set) {
  fc_forward_args a = flashcute::ref::forward_args_for(p, o.dtype);
  const int64_t D = p.head_dim;
  auto tensor = [&](uint16_t* base, int64_t elems, int64_t seqlen, int64_t heads) {
    return fc_tensor{base + set * elems, seqlen * heads * D, heads * D, D};
  };
  a.q = tensor(buf.q, buf.q_elems, p.seqlen_q, p.heads);
  a.k = tensor(buf.k, buf.kv_elems, p.seqlen_k, p.heads_k);
  a.v = tensor(buf.v, buf.kv_elems, p.seqlen_k, p.heads_k);
  a.o = tensor(buf.o, buf.o_elems, p.seqlen_q, p.heads);
  a.cu_seqlens_q = buf.cu_q;
  a.cu_seqlens_k = buf.cu_k;
  a.softmax_lse = o.lse ? buf.lse : nullptr;
  a.alibi_slopes = buf.slopes;
  a.tile = o.auto_tile ? fc_tile_config{0, 0, 0}
                       : fc_tile_config{o.m_block_size, o.n_block_size, o.num_threads};
  a.family = o.family;
  return a;
}

// Checks set 0's output (and LSE with --lse) against the reference; true when it passes.
bool verify(const Options& o, const Problem& p, const Buffers& buf, const std::vector<float>& q,
            const std::vector<float>& k, const std::vector<float>& v) {
  using namespace flashcute::ref;
  std::vector<uint16_t> o_bits(p.o_elements());
  check_cuda(cudaMemcpy(o_bits.data(), buf.o, o_bits.size() * 2, cudaMemcpyDeviceToHost), "copy O");
  const std::vector<float> out = from_bits(o_bits, o.dtype);
  std::vector<float> lse(p.lse_elements());
  if (o.lse)
    check_cuda(cudaMemcpy(lse.data(), buf.lse, lse.size() * 4, cudaMemcpyDeviceToHost), "copy LSE");

  const Layout q_layout = packed_layout(p.seqlen_q, p.heads, p.head_dim);
  const Layout kv_layout = packed_layout(p.seqlen_k, p.heads_k, p.head_dim);
  Comparison o_check, lse_check;
  if (p.work() < kCpuReferenceLimit) {
    std::printf("Checking against the CPU fp64 reference\n");
    const CpuOutput ref =
        cpu_reference(p, {q.data(), q_layout}, {k.data(), kv_layout}, {v.data(), kv_layout});
    o_check =
        compare_output(out.data(), ref.o.data(), out.size(), o.dtype, default_tolerance(o.dtype));
    if (o.lse) lse_check = compare_lse(lse.data(), ref.lse.data(), lse.size());
  } else {
    std::printf("Checking against the GPU fp32 reference\n");
    float* ref_o = device_alloc<float>(p.o_elements());
    float* ref_lse = device_alloc<float>(p.lse_elements());
    check_cuda(gpu_reference(p, o.dtype, {buf.q, q_layout}, {buf.k, kv_layout}, {buf.v, kv_layout},
                             ref_o, ref_lse),
               "GPU reference");
    std::vector<float> ref(p.o_elements()), ref_l(p.lse_elements());
    check_cuda(cudaMemcpy(ref.data(), ref_o, ref.size() * 4, cudaMemcpyDeviceToHost), "copy");
    check_cuda(cudaMemcpy(ref_l.data(), ref_lse, ref_l.size() * 4, cudaMemcpyDeviceToHost), "copy");
    cudaFree(ref_o);
    cudaFree(ref_lse);
    o_check =
        compare_output(out.data(), ref.data(), out.size(), o.dtype, default_tolerance(o.dtype));
    if (o.lse) lse_check = compare_lse(lse.data(), ref_l.data(), lse.size());
  }
  std::printf("  O:   %s\n", o_check.summary().c_str());
  if (o.lse) std::printf("  LSE: %s\n", lse_check.summary().c_str());
  return o_check.pass && (!o.lse || lse_check.pass);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashcute::ref;
  Options o;
  std::string error;
  if (!flashcute::runner::parse_options(argc, argv, &o, &error)) {
    std::fprintf(stderr, "flashcute_run: %s\n%s", error.c_str(),
                 flashcute::runner::usage().c_str());
    return 2;
  }
  if (o.help) {
    std::printf("%s", flashcute::runner::usage().c_str());
    return 0;
  }
  int devices = 0;
  const cudaError_t device_status = cudaGetDeviceCount(&devices);
  if (device_status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "flashcute_run: no CUDA GPU is available (%s); this runner needs one.\n",
                 device_status != cudaSuccess ? cudaGetErrorString(device_status) : "0 devices");
    return 1;
  }
  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const Problem p = make_problem(o, rng);
  Buffers buf;
  buf.q_elems = p.o_elements();
  buf.o_elems = p.o_elements();
  buf.kv_elems =
      (p.varlen() ? p.cu_seqlens_k.back() : int64_t{p.batch} * p.seqlen_k) * p.heads_k * p.head_dim;
  // Cold L2: enough distinct input/output sets that together they exceed the L2.
  const double set_bytes = 2.0 * (2 * buf.q_elems + 2 * buf.kv_elems) + 1;
  const int sets = o.use_cold_l2 ? int(prop.l2CacheSize / set_bytes) + 2 : 1;
  print_configuration(o, p, seed, sets);
  std::printf("  device: %s, L2 %d bytes\n", prop.name, prop.l2CacheSize);

  const InputMode mode =
      o.inputs == flashcute::runner::InputKind::kInteger ? InputMode::kInteger : InputMode::kNormal;
  const std::vector<float> q = random_inputs(buf.q_elems, mode, o.dtype, seed + 1);
  const std::vector<float> k = random_inputs(buf.kv_elems, mode, o.dtype, seed + 2);
  const std::vector<float> v = random_inputs(buf.kv_elems, mode, o.dtype, seed + 3);
  buf.q = device_alloc<uint16_t>(sets * buf.q_elems);
  buf.k = device_alloc<uint16_t>(sets * buf.kv_elems);
  buf.v = device_alloc<uint16_t>(sets * buf.kv_elems);
  buf.o = device_alloc<uint16_t>(sets * buf.o_elems);
  buf.lse = device_alloc<float>(p.lse_elements());
  auto upload = [&](uint16_t* dst, const std::vector<float>& src) {
    const std::vector<uint16_t> bits = to_bits(src, o.dtype);
    for (int s = 0; s < sets; ++s)
      check_cuda(
          cudaMemcpy(dst + s * bits.size(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice),
          "upload");
  };
  upload(buf.q, q);
  upload(buf.k, k);
  upload(buf.v, v);
  if (p.varlen()) {
    buf.cu_q = device_alloc<int32_t>(p.batch + 1);
    buf.cu_k = device_alloc<int32_t>(p.batch + 1);
    check_cuda(
        cudaMemcpy(buf.cu_q, p.cu_seqlens_q.data(), (p.batch + 1) * 4, cudaMemcpyHostToDevice),
        "upload");
    check_cuda(
        cudaMemcpy(buf.cu_k, p.cu_seqlens_k.data(), (p.batch + 1) * 4, cudaMemcpyHostToDevice),
        "upload");
  }
  if (!p.alibi_slopes.empty()) {
    buf.slopes = device_alloc<float>(p.alibi_slopes.size());
    check_cuda(cudaMemcpy(buf.slopes, p.alibi_slopes.data(), p.alibi_slopes.size() * 4,
                          cudaMemcpyHostToDevice),
               "upload");
  }

  // Poisoned outputs: anything the kernel fails to write fails the check.
  check_cuda(poison_device(buf.o, buf.o_elems * 2), "poison");
  check_cuda(poison_device(buf.lse, p.lse_elements() * 4), "poison");
  fc_forward_args args = make_args(o, p, buf, 0);
  if (fc_forward(&args) != FC_OK) {
    std::fprintf(stderr, "flashcute_run: fc_forward failed: %s\n", fc_last_error());
    return 1;
  }
  check_cuda(cudaDeviceSynchronize(), "first run");
  if (!o.skip_ref_check) {
    if (!verify(o, p, buf, q, k, v)) {
      std::fprintf(stderr, "flashcute_run: the output does not match the reference\n");
      return 1;
    }
    std::printf("Results verified successfully!\n");
  }

  for (int i = 0; i < o.warmup_iterations; ++i) {
    args = make_args(o, p, buf, i % sets);
    if (fc_forward(&args) != FC_OK) {
      std::fprintf(stderr, "flashcute_run: fc_forward failed: %s\n", fc_last_error());
      return 1;
    }
  }
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<fc_forward_args> timed(o.iterations);
  for (int i = 0; i < o.iterations; ++i) timed[i] = make_args(o, p, buf, i % sets);
  check_cuda(cudaEventRecord(start), "cudaEventRecord");
  for (const fc_forward_args& a : timed) {
    if (fc_forward(&a) != FC_OK) {
      std::fprintf(stderr, "flashcute_run: fc_forward failed: %s\n", fc_last_error());
      return 1;
    }
  }
  check_cuda(cudaEventRecord(stop), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "timing");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  const double us = 1e3 * ms / o.iterations;
  std::printf("Mean time: %.2f us, %.1f TFLOP/s\n", us, attention_flops(p) / (us * 1e-6) / 1e12);
  std::printf("PASS\n");
  return 0;
}
