#include "reference/forward_args.hpp"

namespace flashcute {
namespace ref {

fc_forward_args forward_args_for(const Problem& p, fc_dtype dtype) {
  fc_forward_args a;
  fc_forward_args_init(&a);
  a.dtype = dtype;
  a.batch = p.batch;
  a.seqlen_q = p.seqlen_q;
  a.seqlen_k = p.seqlen_k;
  a.heads = p.heads;
  a.heads_k = p.heads_k;
  a.head_dim = p.head_dim;
  if (p.varlen()) a.total_q = p.out_rows();
  a.softmax_scale = p.softmax_scale;
  a.causal = p.causal;
  a.causal_alignment = p.bottom_right ? FC_CAUSAL_BOTTOM_RIGHT : FC_CAUSAL_TOP_LEFT;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.softcap = p.softcap;
  a.alibi_batch_stride = p.alibi_batch_stride;
  return a;
}

}  // namespace ref
}  // namespace flashcute
