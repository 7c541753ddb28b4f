#include "reference/backward_args.hpp"

#include "reference/forward_args.hpp"

namespace flashcute {
namespace ref {

// Taken field by field from the forward's arguments, so that both describe one problem the same
// way.
fc_backward_args backward_args_for(const Problem& p, fc_dtype dtype) {
  const fc_forward_args f = forward_args_for(p, dtype);
  fc_backward_args a;
  fc_backward_args_init(&a);
  a.dtype = f.dtype;
  a.batch = f.batch;
  a.seqlen_q = f.seqlen_q;
  a.seqlen_k = f.seqlen_k;
  a.heads = f.heads;
  a.heads_k = f.heads_k;
  a.head_dim = f.head_dim;
  a.total_q = f.total_q;
  a.softmax_scale = f.softmax_scale;
  a.causal = f.causal;
  a.causal_alignment = f.causal_alignment;
  a.window_left = f.window_left;
  a.window_right = f.window_right;
  a.softcap = f.softcap;
  a.alibi_batch_stride = f.alibi_batch_stride;
  return a;
}

}  // namespace ref
}  // namespace flashcute
