#include "gpu_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "reference/compare.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/forward_args.hpp"
#include "reference/gpu_reference.hpp"
#include "reference/poison.hpp"

namespace flashcute {
namespace testing {
namespace {

// Up to this many multiply-adds the CPU fp64 reference is used; host copies are kept up to 4x more
// so the GPU reference can be checked against the CPU one.
constexpr double kCpuReferenceWork = 1 << 24;
constexpr double kHostCopyWork = 1 << 26;

ref::Layout packed(const ref::Problem& p, int64_t seqlen, int64_t heads) {
  return ref::packed_layout(seqlen, heads, p.head_dim);
}

ref::Layout head_major(const ref::Problem& p, bool query, int64_t heads) {
  const int64_t rows = p.varlen() ? tokens(p, query) : (query ? p.seqlen_q : p.seqlen_k);
  return ref::Layout{heads * rows * p.head_dim, p.head_dim, rows * p.head_dim};
}

std::vector<float> tensor_values(size_t n, Data data, bool is_value, fc_dtype dtype) {
  const uint64_t seed = ref::fresh_seed();
  if (is_value || data == Data::kNormal)
    return ref::random_inputs(n, ref::InputMode::kNormal, dtype, seed);
  if (data == Data::kScaledUp) return ref::random_inputs(n, ref::InputMode::kScaledUp, dtype, seed);
  std::vector<float> v = ref::random_inputs(n, ref::InputMode::kNormal, dtype, seed);
  for (float& x : v) x = ref::from_bits(ref::to_bits(0.5f + 0.25f * std::fabs(x), dtype), dtype);
  return v;
}

std::unique_ptr<DeviceBuffer> upload(const void* host, size_t bytes) {
  if (bytes == 0) return nullptr;
  auto buffer = std::make_unique<DeviceBuffer>(bytes);
  cuda_ok(cudaMemcpy(buffer->get(), host, bytes, cudaMemcpyHostToDevice), "upload");
  return buffer;
}

const char* placement_name(Placement p) {
  return p == Placement::kPacked      ? "packed"
         : p == Placement::kHeadMajor ? "head-major"
                                      : "qkv-packed";
}

}  // namespace

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    ADD_FAILURE() << what << ": " << cudaGetErrorString(e);
    throw std::runtime_error(what);
  }
}

int64_t tokens(const ref::Problem& p, bool query) {
  if (p.varlen()) return query ? p.cu_seqlens_q.back() : p.cu_seqlens_k.back();
  return int64_t{p.batch} * (query ? p.seqlen_q : p.seqlen_k);
}

int device_count() {
  static const int count = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  }();
  return count;
}

bool device_is_sm90() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor == 90;
}

bool small_mode() {
  const char* v = std::getenv("FLASHCUTE_TEST_SMALL");
  return v != nullptr && std::strcmp(v, "0") != 0 && *v != '\0';
}

size_t case_limit() {
  const char* v = std::getenv("FLASHCUTE_TEST_MAX_CASES");
  return v == nullptr ? 0 : size_t(std::strtoul(v, nullptr, 10));
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

float very_negative_scale(int head_dim) { return -400.0f / head_dim; }

ref::Problem dense_problem(int batch, int seqlen_q, int seqlen_k, int heads, int heads_k,
                           int head_dim) {
  ref::Problem p;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads = heads;
  p.heads_k = heads_k;
  p.head_dim = head_dim;
  p.softmax_scale = float(1.0 / std::sqrt(double(head_dim)));
  return p;
}

void set_varlen(ref::Problem& p, const std::vector<int>& q_lengths,
                const std::vector<int>& k_lengths) {
  p.batch = int(q_lengths.size());
  p.cu_seqlens_q = {0};
  p.cu_seqlens_k = {0};
  p.seqlen_q = p.seqlen_k = 0;
  for (size_t b = 0; b < q_lengths.size(); ++b) {
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + q_lengths[b]);
    p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + k_lengths[b]);
    p.seqlen_q = std::max(p.seqlen_q, q_lengths[b]);
    p.seqlen_k = std::max(p.seqlen_k, k_lengths[b]);
  }
}

std::vector<float> random_slopes(size_t n) {
  std::mt19937 rng(uint32_t(ref::fresh_seed()));
  std::uniform_real_distribution<float> slope(0.01f, 1.0f);
  std::vector<float> s(n);
  for (float& x : s) x = slope(rng);
  return s;
}

std::string Case::describe() const {
  const ref::Problem& p = problem;
  std::ostringstream s;
  s << (dtype == FC_FLOAT16 ? "fp16" : "bf16") << " b" << p.batch << " sq" << p.seqlen_q << " sk"
    << p.seqlen_k << " h" << p.heads << "/" << p.heads_k << " d" << p.head_dim << " scale "
    << p.softmax_scale;
  if (p.causal) s << " causal";
  if (p.causal || p.window_left >= 0 || p.window_right >= 0 || !p.alibi_slopes.empty())
    s << (p.bottom_right ? " bottom-right" : " top-left");
  if (p.window_left >= 0 || p.window_right >= 0)
    s << " window(" << p.window_left << "," << p.window_right << ")";
  if (p.softcap > 0) s << " softcap " << p.softcap;
  if (!p.alibi_slopes.empty()) s << " alibi" << (p.alibi_batch_stride ? " per batch-head" : "");
  if (p.varlen()) s << " varlen";
  s << " " << placement_name(placement)
    << (data == Data::kScaledUp   ? " scaled-up"
        : data == Data::kPositive ? " very-negative"
                                  : "")
    << (lse ? "" : " no-lse");
  return s.str();
}

std::unique_ptr<Inputs> make_inputs(const Case& c) {
  auto in = std::make_unique<Inputs>();
  in->c = c;
  const ref::Problem& p = c.problem;
  const int64_t D = p.head_dim, H = p.heads, Hk = p.heads_k;
  const int64_t nq = tokens(p, true) * H * D, nk = tokens(p, false) * Hk * D;
  int64_t total = nq + 2 * nk;
  switch (c.placement) {
    case Placement::kPacked:
      in->q_layout = in->o_layout = packed(p, p.seqlen_q, H);
      in->k_layout = in->v_layout = packed(p, p.seqlen_k, Hk);
      in->k_offset = nq;
      in->v_offset = nq + nk;
      break;
    case Placement::kHeadMajor:
      in->q_layout = in->o_layout = head_major(p, true, H);
      in->k_layout = in->v_layout = head_major(p, false, Hk);
      in->k_offset = nq;
      in->v_offset = nq + nk;
      break;
    case Placement::kQkvPacked: {
      EXPECT_EQ(p.seqlen_q, p.seqlen_k) << "a packed QKV tensor needs equal lengths";
      EXPECT_EQ(p.cu_seqlens_q, p.cu_seqlens_k);
      const int64_t width = (H + 2 * Hk) * D;
      in->q_layout = in->k_layout = in->v_layout = ref::Layout{p.seqlen_q * width, width, D};
      in->k_offset = H * D;
      in->v_offset = (H + Hk) * D;
      in->o_layout = ref::Layout{p.seqlen_q * H * (D + 8), H * (D + 8), D + 8};
      total = tokens(p, true) * width;
      break;
    }
  }
  for_each_row(p, true, int(H), in->o_layout,
               [&](int64_t, int64_t at) { in->o_span = std::max(in->o_span, at + D); });

  // Canonical (token, head, dim) values, scattered into the buffer through the layouts.
  std::vector<float> host(total, 0.0f);
  auto place = [&](const std::vector<float>& values, bool query, int64_t heads, int64_t offset,
                   const ref::Layout& l) {
    for_each_row(p, query, int(heads), l, [&](int64_t row, int64_t at) {
      std::copy_n(values.begin() + row * D, D, host.begin() + offset + at);
    });
  };
  place(tensor_values(nq, c.data, false, c.dtype), true, H, 0, in->q_layout);
  place(tensor_values(nk, c.data, false, c.dtype), false, Hk, in->k_offset, in->k_layout);
  place(tensor_values(nk, c.data, true, c.dtype), false, Hk, in->v_offset, in->v_layout);
  const std::vector<uint16_t> bits = ref::to_bits(host, c.dtype);
  in->data = std::make_unique<DeviceBuffer>(bits.size() * 2);
  cuda_ok(cudaMemcpy(in->data->get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice),
          "upload");
  if (p.work() < kHostCopyWork) in->host = std::move(host);
  if (p.varlen()) {
    in->cu_q = upload(p.cu_seqlens_q.data(), p.cu_seqlens_q.size() * 4);
    in->cu_k = upload(p.cu_seqlens_k.data(), p.cu_seqlens_k.size() * 4);
  }
  in->slopes = upload(p.alibi_slopes.data(), p.alibi_slopes.size() * 4);
  return in;
}

Reference reference_for(const Inputs& in) {
  const ref::Problem& p = in.c.problem;
  Reference r;
  if (p.work() < kCpuReferenceWork && !in.host.empty()) {
    const float* h = in.host.data();
    const ref::CpuOutput cpu =
        ref::cpu_reference(p, {h + in.q_offset, in.q_layout}, {h + in.k_offset, in.k_layout},
                           {h + in.v_offset, in.v_layout});
    r.o.assign(cpu.o.begin(), cpu.o.end());
    r.lse.assign(cpu.lse.begin(), cpu.lse.end());
    r.from_cpu = true;
    return r;
  }
  DeviceBuffer o(p.o_elements() * 4), lse(p.lse_elements() * 4);
  const char* base = in.data->get();
  cuda_ok(ref::gpu_reference(
              p, in.c.dtype, {base + 2 * in.q_offset, in.q_layout},
              {base + 2 * in.k_offset, in.k_layout}, {base + 2 * in.v_offset, in.v_layout},
              reinterpret_cast<float*>(o.get()), reinterpret_cast<float*>(lse.get())),
          "GPU reference");
  r.o.resize(p.o_elements());
  r.lse.resize(p.lse_elements());
  cuda_ok(cudaMemcpy(r.o.data(), o.get(), r.o.size() * 4, cudaMemcpyDeviceToHost), "download");
  cuda_ok(cudaMemcpy(r.lse.data(), lse.get(), r.lse.size() * 4, cudaMemcpyDeviceToHost),
          "download");
  return r;
}

std::string KernelChoice::describe() const {
  std::ostringstream s;
  s << (family == FC_FAMILY_AUTO ? "auto" : family == FC_FAMILY_SM80 ? "sm80" : "sm90");
  if (tile.m_block != 0)
    s << " tile " << tile.m_block << "x" << tile.n_block << "x" << tile.num_threads;
  return s.str();
}

std::vector<KernelChoice> kernel_choices(fc_dtype dtype, int head_dim) {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  std::vector<KernelChoice> choices{KernelChoice{}};
  for (int family : {FC_FAMILY_SM80, FC_FAMILY_SM90}) {
    if (family == FC_FAMILY_SM90 && major * 10 + minor != 90) continue;  // sm90 needs sm_90
    const int32_t n = fc_compiled_tile_configs(family, dtype, head_dim, nullptr, 0);
    std::vector<fc_tile_config> tiles(n);
    fc_compiled_tile_configs(family, dtype, head_dim, tiles.data(), n);
    for (const fc_tile_config& t : tiles) choices.push_back(KernelChoice{family, t});
  }
  return choices;
}

fc_forward_args forward_args(const Inputs& in, void* o, float* lse, const KernelChoice& k) {
  const ref::Problem& p = in.c.problem;
  fc_forward_args a = ref::forward_args_for(p, in.c.dtype);
  auto tensor = [](void* base, const ref::Layout& l) {
    return fc_tensor{base, l.batch_stride, l.seq_stride, l.head_stride};
  };
  char* base = in.data->get();
  a.q = tensor(base + 2 * in.q_offset, in.q_layout);
  a.k = tensor(base + 2 * in.k_offset, in.k_layout);
  a.v = tensor(base + 2 * in.v_offset, in.v_layout);
  a.o = tensor(o, in.o_layout);
  if (p.varlen()) {
    a.cu_seqlens_q = reinterpret_cast<const int32_t*>(in.cu_q->get());
    a.cu_seqlens_k = reinterpret_cast<const int32_t*>(in.cu_k->get());
  }
  a.softmax_lse = lse;
  a.alibi_slopes = in.slopes ? reinterpret_cast<const float*>(in.slopes->get()) : nullptr;
  a.tile = k.tile;
  a.family = k.family;
  return a;
}

Outcome run_kernel(const Inputs& in, const KernelChoice& k, int call_device) {
  const int64_t lse_n = in.c.problem.lse_elements();
  DeviceBuffer o((2 * kGuard + in.o_span) * 2), lse((2 * kGuard + lse_n) * 4);
  cuda_ok(ref::poison_device(o.get(), (2 * kGuard + in.o_span) * 2), "poison");
  cuda_ok(ref::poison_device(lse.get(), (2 * kGuard + lse_n) * 4), "poison");
  const fc_forward_args a =
      forward_args(in, o.get() + 2 * kGuard,
                   in.c.lse ? reinterpret_cast<float*>(lse.get()) + kGuard : nullptr, k);
  int own_device = 0;
  cudaGetDevice(&own_device);
  if (call_device >= 0) cuda_ok(cudaSetDevice(call_device), "cudaSetDevice");
  Outcome out;
  out.status = fc_forward(&a);
  out.message = fc_last_error();
  cuda_ok(cudaDeviceSynchronize(), "after fc_forward");
  if (call_device >= 0) cuda_ok(cudaSetDevice(own_device), "cudaSetDevice");
  cuda_ok(cudaDeviceSynchronize(), "after fc_forward");
  out.o_raw.resize(2 * kGuard + in.o_span);
  out.lse_raw.resize(2 * kGuard + lse_n);
  cuda_ok(cudaMemcpy(out.o_raw.data(), o.get(), out.o_raw.size() * 2, cudaMemcpyDeviceToHost),
          "download");
  cuda_ok(cudaMemcpy(out.lse_raw.data(), lse.get(), out.lse_raw.size() * 4, cudaMemcpyDeviceToHost),
          "download");
  return out;
}

::testing::AssertionResult untouched(const Inputs& in, const Outcome& out) {
  for (size_t i = 0; i < out.o_raw.size(); ++i)
    if (out.o_raw[i] != ref::kPoison16)
      return ::testing::AssertionFailure() << "O element " << int64_t(i) - kGuard << " was written";
  for (size_t i = 0; i < out.lse_raw.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &out.lse_raw[i], 4);
    if (bits != ref::kPoison32)
      return ::testing::AssertionFailure()
             << "LSE element " << int64_t(i) - kGuard << " was written";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult matches(const Inputs& in, const Reference& ref, const Outcome& out) {
  const ref::Problem& p = in.c.problem;
  if (out.status != FC_OK)
    return ::testing::AssertionFailure() << "status " << out.status << ": " << out.message;
  // Gather O into the canonical layout, marking what the view covers; the rest must be poison.
  std::vector<float> o(p.o_elements());
  std::vector<char> covered(out.o_raw.size(), 0);
  const int64_t D = p.head_dim;
  for_each_row(p, true, p.heads, in.o_layout, [&](int64_t row, int64_t at) {
    for (int64_t d = 0; d < D; ++d) {
      o[row * D + d] = ref::from_bits(out.o_raw[kGuard + at + d], in.c.dtype);
      covered[kGuard + at + d] = 1;
    }
  });
  for (size_t i = 0; i < out.o_raw.size(); ++i)
    if (!covered[i] && out.o_raw[i] != ref::kPoison16)
      return ::testing::AssertionFailure() << "O element at offset " << int64_t(i) - kGuard
                                           << " lies outside the view but was written";
  const ref::Comparison oc = ref::compare_output(o.data(), ref.o.data(), o.size(), in.c.dtype,
                                                 ref::default_tolerance(in.c.dtype));
  if (!oc.pass) return ::testing::AssertionFailure() << "O " << oc.summary();
  const int64_t n = p.lse_elements();
  for (int64_t i = 0; i < int64_t(out.lse_raw.size()); ++i) {
    const bool inside = in.c.lse && i >= kGuard && i < kGuard + n;
    uint32_t bits;
    std::memcpy(&bits, &out.lse_raw[i], 4);
    if (!inside && bits != ref::kPoison32)
      return ::testing::AssertionFailure() << "LSE element " << i - kGuard << " was written";
  }
  if (in.c.lse) {
    const ref::Comparison lc = ref::compare_lse(out.lse_raw.data() + kGuard, ref.lse.data(), n);
    if (!lc.pass) return ::testing::AssertionFailure() << "LSE " << lc.summary();
  }
  return ::testing::AssertionSuccess();
}

void check_everywhere(const Inputs& in, bool allow_unsupported) {
  const ref::Problem& p = in.c.problem;
  const Reference ref = reference_for(in);
  const std::vector<KernelChoice> choices = kernel_choices(in.c.dtype, p.head_dim);
  const bool empty = p.out_rows() == 0 || p.heads == 0;
  for (const KernelChoice& k : choices) {
    SCOPED_TRACE(in.c.describe() + " | " + k.describe());
    const Outcome out = run_kernel(in, k);
    if (k.family == FC_FAMILY_AUTO && choices.size() == 1 && !empty) {
      // Nothing compiled for this dtype and head_dim in this build: a clear refusal is right.
      EXPECT_EQ(out.status, FC_ERROR_UNSUPPORTED) << out.message;
      EXPECT_TRUE(untouched(in, out));
    } else if (k.family != FC_FAMILY_AUTO && allow_unsupported &&
               out.status == FC_ERROR_UNSUPPORTED) {
      std::printf("[ note ] %s | %s: unsupported: %s\n", in.c.describe().c_str(),
                  k.describe().c_str(), out.message.c_str());
      EXPECT_FALSE(out.message.empty());
      EXPECT_TRUE(untouched(in, out));
    } else {
      EXPECT_TRUE(matches(in, ref, out));
    }
  }
}

void check_case(const Case& c, bool allow_unsupported) {
  const std::unique_ptr<Inputs> in = make_inputs(c);
  check_everywhere(*in, allow_unsupported);
}

}  // namespace testing
}  // namespace flashcute
