#include "backward_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "reference/backward_args.hpp"
#include "reference/compare.hpp"
#include "reference/cpu_reference.hpp"
#include "reference/host_data.hpp"
#include "reference/poison.hpp"
#include "reference/semantics.hpp"

namespace flashcute {
namespace testing {
namespace {

// The backward rounds P and dS to the input type before its matrix products and sums over both
// sequence lengths, so each gradient gets twice the forward's relative L2 error; the max-error
// bound (in ulps of the input type at the gradient's largest magnitude) catches a few elements far
// off while the rest are right. An emulation of that rounding on the CPU stays within a fifth of
// the L2 bounds and one ulp on this suite's cases.
ref::Tolerance gradient_tolerance(fc_dtype dtype) {
  return dtype == FC_FLOAT16 ? ref::Tolerance{4e-3, 8.0} : ref::Tolerance{2e-2, 8.0};
}

// A gradient that cancels to below 1% of its terms' sizes (a one-hot softmax row, a row that sees
// one key: dS = P * (dP - rowsum(dO * O)) is then fp32 rounding noise) is judged against 1% of the
// terms instead (ref::compare_gradient): a wrong rowsum, say, is still off by 100 times the bound.
constexpr double kCancellationFloor = 1e-2;

// The case's Q, K and V values on the host, laid out as on the device: make_inputs keeps a copy
// for smaller problems; the rest are read back.
std::vector<float> host_values(const Inputs& in) {
  if (!in.host.empty()) return in.host;
  const ref::Problem& p = in.c.problem;
  int64_t n = 0;
  auto extend = [&](bool query, int heads, int64_t offset, const ref::Layout& l) {
    for_each_row(p, query, heads, l,
                 [&](int64_t, int64_t at) { n = std::max(n, offset + at + p.head_dim); });
  };
  extend(true, p.heads, in.q_offset, in.q_layout);
  extend(false, p.heads_k, in.k_offset, in.k_layout);
  extend(false, p.heads_k, in.v_offset, in.v_layout);
  std::vector<uint16_t> bits(n);
  cuda_ok(cudaMemcpy(bits.data(), in.data->get(), n * 2, cudaMemcpyDeviceToHost), "download");
  return ref::from_bits(bits, in.c.dtype);
}

// Elements from a view's first to one past its last element.
int64_t span(const ref::Problem& p, bool query, int heads, const ref::Layout& l) {
  int64_t n = 0;
  for_each_row(p, query, heads, l, [&](int64_t, int64_t at) { n = std::max(n, at + p.head_dim); });
  return n;
}

std::unique_ptr<DeviceBuffer> poisoned(int64_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>(bytes);
  cuda_ok(ref::poison_device(buffer->get(), bytes), "poison");
  return buffer;
}

// Writes canonical (rows, heads, head_dim) query-side values, rounded to dtype, through layout l
// into a device buffer of `span` elements; the elements between rows are poison (NaN), so a
// kernel reading outside its view cannot pass.
template <typename T>
void upload_view(const ref::Problem& p, const std::vector<T>& canonical, const ref::Layout& l,
                 int64_t span, fc_dtype dtype, char* device) {
  std::vector<uint16_t> bits(span, ref::kPoison16);
  const int64_t D = p.head_dim;
  for_each_row(p, true, p.heads, l, [&](int64_t row, int64_t at) {
    for (int64_t d = 0; d < D; ++d)
      bits[at + d] = ref::to_bits(float(canonical[row * D + d]), dtype);
  });
  cuda_ok(cudaMemcpy(device, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "upload");
}

// Per canonical token row: 1 where a query row sees no key, or where a key is seen by no query.
// Their gradients must be exactly zero.
struct Unseen {
  std::vector<char> query_rows, key_rows;
};

Unseen unseen_rows(const ref::Problem& p) {
  Unseen u;
  u.query_rows.assign(tokens(p, true), 0);
  u.key_rows.assign(tokens(p, false), 0);
  int64_t q_row = 0, k_row = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t sq = p.seq_q(b), sk = p.seq_k(b);
    const int64_t diag = ref::diagonal(sq, sk, p.bottom_right);
    std::vector<int64_t> coverage(sk + 1, 0);  // differences: +1 at lo, -1 past hi
    for (int64_t i = 0; i < sq; ++i) {
      const ref::KeyRange keys =
          ref::visible_keys(i, sk, diag, p.causal, p.window_left, p.window_right);
      if (keys.lo > keys.hi) {
        u.query_rows[q_row + i] = 1;
      } else {
        ++coverage[keys.lo];
        --coverage[keys.hi + 1];
      }
    }
    int64_t seen_by = 0;
    for (int64_t j = 0; j < sk; ++j) u.key_rows[k_row + j] = (seen_by += coverage[j]) == 0;
    q_row += sq;
    k_row += sk;
  }
  return u;
}

// Reads a gradient view out of its raw allocation into canonical order; nothing outside the view
// may have been written.
::testing::AssertionResult gather(const char* name, const ref::Problem& p, bool query, int heads,
                                  const ref::Layout& l, const std::vector<uint16_t>& raw,
                                  fc_dtype dtype, std::vector<float>& canonical) {
  const int64_t D = p.head_dim;
  canonical.assign(tokens(p, query) * heads * D, 0.0f);
  std::vector<char> covered(raw.size(), 0);
  for_each_row(p, query, heads, l, [&](int64_t row, int64_t at) {
    for (int64_t d = 0; d < D; ++d) {
      canonical[row * D + d] = ref::from_bits(raw[kGuard + at + d], dtype);
      covered[kGuard + at + d] = 1;
    }
  });
  for (size_t i = 0; i < raw.size(); ++i)
    if (!covered[i] && raw[i] != ref::kPoison16)
      return ::testing::AssertionFailure() << name << " element at offset " << int64_t(i) - kGuard
                                           << " lies outside the view but was written";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult check_gradient(const char* name, const std::vector<float>& out,
                                          const std::vector<double>& ref,
                                          const std::vector<double>& terms,
                                          const std::vector<char>& unseen, int heads, int D,
                                          fc_dtype dtype) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure()
           << name << ": " << out.size() << " values, reference " << ref.size();
  for (size_t row = 0; row < unseen.size(); ++row) {
    if (!unseen[row]) continue;
    for (int64_t e = int64_t(row) * heads * D; e < int64_t(row + 1) * heads * D; ++e)
      if (out[e] != 0.0f)
        return ::testing::AssertionFailure()
               << name << " element " << e << " (token row " << row
               << ", which nothing is seen from or by) is " << out[e] << ", not 0";
  }
  const ref::Comparison c =
      ref::compare_gradient(out.data(), ref.data(), terms.data(), out.size(), dtype,
                            gradient_tolerance(dtype), kCancellationFloor);
  if (!c.pass) return ::testing::AssertionFailure() << name << " " << c.summary();
  return ::testing::AssertionSuccess();
}

fc_tensor tensor(void* base, const ref::Layout& l) {
  return fc_tensor{base, l.batch_stride, l.seq_stride, l.head_stride};
}

}  // namespace

std::string BackwardRun::describe() const {
  std::ostringstream s;
  s << "backward "
    << (family == FC_FAMILY_AUTO   ? "auto"
        : family == FC_FAMILY_SM80 ? "sm80"
                                   : "sm90")
    << (deterministic ? " deterministic" : "");
  return s.str();
}

std::unique_ptr<BackwardInputs> make_backward_inputs(const Case& c) {
  auto bin = std::make_unique<BackwardInputs>();
  bin->in = make_inputs(c);
  const Inputs& in = *bin->in;
  const ref::Problem& p = c.problem;
  const int64_t D = p.head_dim;
  bin->dq_span = span(p, true, p.heads, in.q_layout);
  bin->dk_span = span(p, false, p.heads_k, in.k_layout);
  bin->dv_span = span(p, false, p.heads_k, in.v_layout);
  const std::vector<float> host = host_values(in);
  const float* h = host.data();
  const ref::HostTensor q{h + in.q_offset, in.q_layout}, k{h + in.k_offset, in.k_layout},
      v{h + in.v_offset, in.v_layout};
  const ref::Layout canonical = ref::packed_layout(p.seqlen_q, p.heads, D);

  // The forward's O and LSE, as a caller would have them.
  bin->o = poisoned(in.o_span * 2);
  bin->lse = poisoned(p.lse_elements() * 4);
  float* lse = reinterpret_cast<float*>(bin->lse->get());
  const fc_forward_args f = forward_args(in, bin->o->get(), lse, KernelChoice{});
  const fc_status status = fc_forward(&f);
  const std::string message = fc_last_error();
  cuda_ok(cudaDeviceSynchronize(), "after fc_forward");
  bin->forward_compiled =
      fc_compiled_tile_configs(FC_FAMILY_SM80, c.dtype, p.head_dim, nullptr, 0) > 0;
  if (status == FC_ERROR_UNSUPPORTED && !bin->forward_compiled) {
    const ref::CpuOutput forward = ref::cpu_reference(p, q, k, v);
    upload_view(p, forward.o, in.o_layout, in.o_span, c.dtype, bin->o->get());
    const std::vector<float> lse_values(forward.lse.begin(), forward.lse.end());
    cuda_ok(cudaMemcpy(lse, lse_values.data(), lse_values.size() * 4, cudaMemcpyHostToDevice),
            "upload");
  } else if (status != FC_OK) {
    ADD_FAILURE() << c.describe() << ": the forward failed (" << status << "): " << message;
    throw std::runtime_error("fc_forward");
  }

  // dO: normal values, canonical on the host, through O's layout on the device.
  const std::vector<float> dout =
      ref::random_inputs(p.o_elements(), ref::InputMode::kNormal, c.dtype, ref::fresh_seed());
  bin->dout = std::make_unique<DeviceBuffer>(in.o_span * 2);
  upload_view(p, dout, in.o_layout, in.o_span, c.dtype, bin->dout->get());

  // The reference differentiates from the O the backward reads (rounded to the input type).
  std::vector<uint16_t> o_raw(in.o_span);
  cuda_ok(cudaMemcpy(o_raw.data(), bin->o->get(), o_raw.size() * 2, cudaMemcpyDeviceToHost),
          "download");
  std::vector<float> given_o(p.o_elements());
  for_each_row(p, true, p.heads, in.o_layout, [&](int64_t row, int64_t at) {
    for (int64_t d = 0; d < D; ++d) given_o[row * D + d] = ref::from_bits(o_raw[at + d], c.dtype);
  });
  const ref::HostTensor given{given_o.data(), canonical};
  bin->ref = ref::cpu_backward_reference(p, q, k, v, {dout.data(), canonical}, &given);
  return bin;
}

fc_backward_args backward_args(const BackwardInputs& bin, void* dq, void* dk, void* dv,
                               const BackwardRun& run) {
  const Inputs& in = *bin.in;
  const ref::Problem& p = in.c.problem;
  fc_backward_args a = ref::backward_args_for(p, in.c.dtype);
  char* base = in.data->get();
  a.q = tensor(base + 2 * in.q_offset, in.q_layout);
  a.k = tensor(base + 2 * in.k_offset, in.k_layout);
  a.v = tensor(base + 2 * in.v_offset, in.v_layout);
  a.o = tensor(bin.o->get(), in.o_layout);
  a.dout = tensor(bin.dout->get(), in.o_layout);
  a.dq = tensor(dq, in.q_layout);
  a.dk = tensor(dk, in.k_layout);
  a.dv = tensor(dv, in.v_layout);
  if (p.varlen()) {
    a.cu_seqlens_q = reinterpret_cast<const int32_t*>(in.cu_q->get());
    a.cu_seqlens_k = reinterpret_cast<const int32_t*>(in.cu_k->get());
  }
  a.softmax_lse = reinterpret_cast<const float*>(bin.lse->get());
  a.alibi_slopes = in.slopes ? reinterpret_cast<const float*>(in.slopes->get()) : nullptr;
  a.deterministic = run.deterministic;
  a.family = run.family;
  return a;
}

BackwardOutcome run_backward(const BackwardInputs& bin, const BackwardRun& run,
                             const std::function<void(fc_backward_args&)>& change) {
  const int64_t dq_n = 2 * kGuard + bin.dq_span, dk_n = 2 * kGuard + bin.dk_span,
                dv_n = 2 * kGuard + bin.dv_span;
  const std::unique_ptr<DeviceBuffer> dq = poisoned(dq_n * 2), dk = poisoned(dk_n * 2),
                                      dv = poisoned(dv_n * 2);
  fc_backward_args a = backward_args(bin, dq->get() + 2 * kGuard, dk->get() + 2 * kGuard,
                                     dv->get() + 2 * kGuard, run);
  BackwardOutcome out;
  uint64_t bytes = 0;
  out.status = fc_backward_workspace_size(&a, &bytes);
  std::unique_ptr<DeviceBuffer> workspace;
  if (out.status == FC_OK) {
    // Poisoned too: whatever the backward accumulates there, it must clear first.
    if (bytes > 0) workspace = poisoned(int64_t(bytes));
    a.workspace = workspace ? workspace->get() : nullptr;
    a.workspace_bytes = bytes;
    if (change) change(a);
    out.status = fc_backward(&a);
  }
  out.message = fc_last_error();
  cuda_ok(cudaDeviceSynchronize(), "after fc_backward");
  out.dq_raw.resize(dq_n);
  out.dk_raw.resize(dk_n);
  out.dv_raw.resize(dv_n);
  cuda_ok(cudaMemcpy(out.dq_raw.data(), dq->get(), dq_n * 2, cudaMemcpyDeviceToHost), "download");
  cuda_ok(cudaMemcpy(out.dk_raw.data(), dk->get(), dk_n * 2, cudaMemcpyDeviceToHost), "download");
  cuda_ok(cudaMemcpy(out.dv_raw.data(), dv->get(), dv_n * 2, cudaMemcpyDeviceToHost), "download");
  return out;
}

::testing::AssertionResult gradients_untouched(const BackwardOutcome& out) {
  for (auto [name, raw] :
       {std::pair{"dq", &out.dq_raw}, std::pair{"dk", &out.dk_raw}, std::pair{"dv", &out.dv_raw}})
    for (size_t i = 0; i < raw->size(); ++i)
      if ((*raw)[i] != ref::kPoison16)
        return ::testing::AssertionFailure()
               << name << " element " << int64_t(i) - kGuard << " was written";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult gradients_match(const BackwardInputs& bin, const BackwardOutcome& out) {
  const Inputs& in = *bin.in;
  const ref::Problem& p = in.c.problem;
  if (out.status != FC_OK)
    return ::testing::AssertionFailure() << "status " << out.status << ": " << out.message;
  const Unseen unseen = unseen_rows(p);
  std::vector<float> dq, dk, dv;
  ::testing::AssertionResult r =
      gather("dq", p, true, p.heads, in.q_layout, out.dq_raw, in.c.dtype, dq);
  if (r) r = gather("dk", p, false, p.heads_k, in.k_layout, out.dk_raw, in.c.dtype, dk);
  if (r) r = gather("dv", p, false, p.heads_k, in.v_layout, out.dv_raw, in.c.dtype, dv);
  const ref::CpuBackwardOutput& g = bin.ref;
  if (r)
    r = check_gradient("dq", dq, g.dq, g.dq_terms, unseen.query_rows, p.heads, p.head_dim,
                       in.c.dtype);
  if (r)
    r = check_gradient("dk", dk, g.dk, g.dk_terms, unseen.key_rows, p.heads_k, p.head_dim,
                       in.c.dtype);
  if (r)
    r = check_gradient("dv", dv, g.dv, g.dv_terms, unseen.key_rows, p.heads_k, p.head_dim,
                       in.c.dtype);
  return r;
}

void check_backward(const BackwardInputs& bin, const BackwardRun& run, bool allow_unsupported) {
  const Case& c = bin.in->c;
  SCOPED_TRACE(c.describe() + " | " + run.describe());
  const BackwardOutcome out = run_backward(bin, run);
  const bool may_refuse =
      allow_unsupported || (run.family == FC_FAMILY_AUTO && !bin.forward_compiled);
  if (out.status == FC_ERROR_UNSUPPORTED && may_refuse) {
    std::printf("[ note ] %s | %s: unsupported: %s\n", c.describe().c_str(), run.describe().c_str(),
                out.message.c_str());
    EXPECT_FALSE(out.message.empty());
    EXPECT_TRUE(gradients_untouched(out));
    return;
  }
  EXPECT_TRUE(gradients_match(bin, out));
}

void check_backward_case(const Case& c, bool deterministic) {
  const std::unique_ptr<BackwardInputs> bin = make_backward_inputs(c);
  check_backward(*bin, BackwardRun{FC_FAMILY_AUTO, deterministic});
}

}  // namespace testing
}  // namespace flashcute
