"""flashcute as an attention implementation for Hugging Face transformers 5.

    import flashcute.integrations.transformers as flashcute_hf

    flashcute_hf.register()  # once per process
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="cute_attention",
                                                 dtype=torch.bfloat16)
    # or, on a loaded model: model.set_attn_implementation("cute_attention")

register() adds one entry to each of transformers' two registries:
- AttentionInterface: attention_forward, which every attention layer calls with query
  (batch, heads, seqlen_q, head_dim) and key/value (batch, heads_k, seqlen_k, head_dim), after
  the KV-cache update, and which returns (batch, seqlen_q, heads, head_dim).
- AttentionMaskInterface: padding_mask, which makes the model hand its layers the 2-D padding
  mask (batch, seqlen_k) when some token is padding and None otherwise, as transformers does for
  flash_attention_2. Causality and sliding windows reach the layers as arguments, not masks.

The semantics are those of transformers' flash_attention_2 path: a padded batch is unpacked into
its sequences and runs through flash_attn_varlen_func (the query tokens of a sequence are the last
seqlen_q columns of its mask row, as with left padding or a KV cache); without padding the batch
runs through flash_attn_func. Causal masks are aligned to the bottom right, so a decoding step's
query sees the whole cache. Batch-1 packed sequences (position_ids restarting) and the
cu_seq_lens_q/k keyword arguments run as varlen too.

Inputs that the library would refuse but FlashAttention accepts are adapted: fp32 activations
run in the half-precision type of the model's weights (bf16 for an fp32 model, whose output is
cast back to fp32); a head_dim that is not a multiple of 8, or a value head_dim that differs from
the query's, is zero-padded and the output cropped; unaligned views are copied.

Gradients flow through flash_attn_func's and flash_attn_varlen_func's autograd. Not supported:
attention weights (output_attentions), attention sinks (s_aux), and 4-D masks. As with
transformers' flash_attention_2, mask patterns beyond padding, causality and sliding windows
(chunked attention, bidirectional overlays for image tokens) are not represented.

The name may not contain "flash" or "/": transformers treats those as FlashAttention packages or
hub kernels and tries to load them.
"""

import math
import warnings

import torch

from .. import flash_attn_func, flash_attn_varlen_func

__all__ = ["NAME", "register", "attention_forward", "padding_mask"]

NAME = "cute_attention"

_HALF = (torch.float16, torch.bfloat16)
# Every tensor start and every stride but the last's must be a multiple of 16 bytes (8 elements).
_ALIGN_BYTES = 16
_ALIGN_ELEMENTS = 8


def register(name=NAME):
    """Registers attention_forward and padding_mask with transformers under `name`; returns it.

    Registering again (the same or another name) is harmless. Imports transformers.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    for part, why in (("flash", "transformers routes names containing 'flash' to FlashAttention "
                                "packages or hub kernels"),
                      ("/", "transformers loads names containing '/' as hub kernels"),
                      ("|", "'|' separates transformers' 'paged|' prefix")):
        if part in name:
            raise ValueError(f"name {name!r} may not contain {part!r}: {why}")
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """The mask transformers passes to attention_forward: None, or a 2-D mask of the real keys.

    attention_mask is the model's (batch, tokens seen + q_length) boolean padding mask, or None.
    Its last kv_length columns are the keys (a sliding-window cache holds only the most recent
    ones). The mask is returned only when some key is padding, or when it is shorter than the keys;
    otherwise None, and the layer runs without unpadding. Causality and sliding windows reach the
    layer as its own arguments, so mask_function is only consulted for the case below.

    A static cache has kv_length slots, more than the tokens it holds. When transformers drops an
    all-ones attention_mask (newer versions do, except for names containing "flash"), the real
    keys are those up to the last query's position, and a causal mask never shows the slots after
    it: an all-ones mask of that many keys tells the layer to drop them.
    """
    if attention_mask is None:
        keys = int(q_offset) + q_length - kv_offset  # key slots up to the last query's position
        if 0 < keys < kv_length and not _sees_later_keys(mask_function, kv_offset + keys - 1):
            return torch.ones((batch_size, keys), dtype=torch.bool, device=kwargs.get("device"))
        return None
    mask = attention_mask[:, -kv_length:] if kv_length > 0 else attention_mask[:, :0]
    if mask.shape[-1] == kv_length and bool(mask.all()):
        return None
    return mask


def _sees_later_keys(mask_function, position):
    """Whether mask_function lets the query at `position` see the key after it (not causal).

    transformers' mask functions take (batch, head, query position, key position) as tensors.
    One that cannot be evaluated on its own (an overlay indexing per-token tensors) counts as
    seeing them, which keeps every key.
    """
    if mask_function is None:
        return True
    index = torch.tensor
    try:
        return bool(mask_function(index(0), index(0), index(position), index(position + 1)))
    except (IndexError, RuntimeError, TypeError):
        return True


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None,
                      position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                      max_length_q=None, max_length_k=None, **kwargs):
    """transformers' attention-function contract; returns (out (batch, seqlen_q, heads, dv), None).

    query: (batch, heads, seqlen_q, head_dim); key, value: (batch, heads_k, seqlen_k, head_dim
    and dv), heads a multiple of heads_k. attention_mask: None or padding_mask's 2-D mask.
    is_causal defaults to module.is_causal; sliding_window w keeps each query's own key and the
    w - 1 before it (transformers' convention); softcap None or 0 is off. Other keyword arguments
    (output_attentions and the like) are ignored.
    """
    if s_aux is not None:
        raise NotImplementedError("s_aux (attention sinks): flashcute has no attention sinks")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError(
            f"attention_mask of shape {tuple(attention_mask.shape)}: the cute_attention "
            "implementation takes the 2-D padding mask only (batch, seqlen_k); arbitrary 4-D masks "
            "need attn_implementation='sdpa' or 'eager'")
    if is_causal is None:
        is_causal = module.is_causal
    batch, heads, seqlen_q, head_dim = query.shape
    seqlen_k = key.shape[2]
    v_head_dim = value.shape[-1]
    options = dict(
        dropout_p=dropout,
        softmax_scale=scaling if scaling is not None else 1.0 / math.sqrt(head_dim),
        causal=bool(is_causal),
        window_size=(-1, -1),
        softcap=softcap or 0.0,
    )
    if sliding_window is not None and seqlen_k > sliding_window:
        options["window_size"] = (sliding_window - 1, sliding_window - 1)

    compute_dtype, out_dtype = _dtypes(query, module)
    # The library's layout: (batch, seqlen, heads, head_dim), as strided views where possible.
    width = _round_up(max(head_dim, v_head_dim), _ALIGN_ELEMENTS)
    q, k, v = (_prepare(t.transpose(1, 2), compute_dtype, width) for t in (query, key, value))

    if attention_mask is not None:
        out = _padded(q, k, v, attention_mask, options)
    elif all(x is not None for x in (cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)):
        out = _flattened(q, k, v, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k,
                         options)
    elif _is_packed(position_ids, batch, seqlen_q):
        cu_seqlens, max_length = _cu_seqlens_from_positions(position_ids)
        out = _flattened(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, options)
    else:
        out = flash_attn_func(q, k, v, **options)
    if width != v_head_dim:
        out = out[..., :v_head_dim]
    return out.to(out_dtype), None


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def _dtypes(query, module):
    """(dtype the kernel runs in, dtype of the output), following transformers' flash path.

    Half-precision activations run as they are. fp32 ones (layer norms kept in fp32, autocast)
    run in the autocast dtype, or the quantised model's dtype, or that of the module's first
    linear layer, and the output stays in that dtype as transformers' flash path leaves it. A
    model that is fp32 throughout runs in bf16 and gets fp32 back.
    """
    if query.dtype in _HALF:
        return query.dtype, query.dtype
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        if dtype in _HALF:
            return dtype, dtype
    config = getattr(module, "config", None)
    if hasattr(config, "_is_quantized") and getattr(config, "dtype", None) in _HALF:
        return config.dtype, config.dtype
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            if layer.weight.dtype in _HALF:
                return layer.weight.dtype, layer.weight.dtype
            break
    warnings.warn(
        f"cute_attention: the model runs in {query.dtype}; attention is computed in bfloat16 "
        "(the library has fp16 and bf16 kernels) and its output cast back", stacklevel=3)
    return torch.bfloat16, query.dtype


def _prepare(t, dtype, width):
    """t (batch, seqlen, heads, d) in dtype, zero-padded to width, in a layout the library takes.

    Zero columns added to q and k leave every score unchanged (the scale is passed explicitly);
    zero columns of v give zero output columns, which the caller crops.
    """
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.shape[-1] != width:
        t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
    if not _library_layout(t):
        t = t.contiguous()
    return t


def _library_layout(t):
    """Whether the library accepts t's strides and start as they are (else a copy is needed)."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return False
    if any(n > 1 and s % _ALIGN_ELEMENTS for n, s in zip(t.shape[:-1], t.stride()[:-1])):
        return False
    return t.data_ptr() % _ALIGN_BYTES == 0


def _padded(q, k, v, mask, options):
    """A padded batch through flash_attn_varlen_func: unpack, attend, scatter back.

    mask (batch, n) marks the tokens of each sequence; the keys are the first n slots of k and v
    (a static cache may hold more), the queries the last seqlen_q columns of the mask.
    """
    batch, seqlen_q = q.shape[0], q.shape[1]
    mask = mask.to(device=q.device, dtype=torch.bool)
    n = mask.shape[1]
    if k.shape[1] > n:
        k, v = k[:, :n], v[:, :n]
    kv_rows, cu_k, max_k = _unpad_index(mask)
    k, v = k[kv_rows], v[kv_rows]  # (total_k, heads_k, d)
    if seqlen_q == n:
        q_rows, cu_q, max_q = kv_rows, cu_k, max_k
    elif seqlen_q == 1:
        # A decoding step: one query per sequence, each the last token of its row.
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
        out = flash_attn_varlen_func(q[:, 0], k, v, cu_q, cu_k, 1, max_k, **options)
        return out.unsqueeze(1)
    else:
        q_rows, cu_q, max_q = _unpad_index(mask[:, -seqlen_q:])
    out = flash_attn_varlen_func(q[q_rows], k, v, cu_q, cu_k, max_q, max_k, **options)
    full = out.new_zeros((batch, seqlen_q) + tuple(out.shape[1:]))
    full[q_rows] = out
    return full


def _unpad_index(mask):
    """((batch indices, position indices) of the kept tokens, int32 cu_seqlens, longest length)."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    rows = torch.nonzero(mask, as_tuple=True)  # row-major: each sequence's tokens in order
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    max_length = int(lengths.max()) if lengths.numel() else 0
    return rows, cu_seqlens, max_length


def _flattened(q, k, v, cu_seqlens_q, cu_seqlens_k, max_length_q, max_length_k, options):
    """Sequences packed along the flattened (batch, seqlen) axis, with their offsets given."""
    batch = q.shape[0]
    out = flash_attn_varlen_func(
        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
        _as_cu_seqlens(cu_seqlens_q, q.device), _as_cu_seqlens(cu_seqlens_k, q.device),
        int(max_length_q), int(max_length_k), **options)
    return out.view((batch, -1) + tuple(out.shape[1:]))


def _as_cu_seqlens(cu, device):
    """transformers' offsets may be int64: the library takes contiguous int32 on q's device."""
    return cu.to(device=device, dtype=torch.int32).contiguous()


def _is_packed(position_ids, batch, seqlen_q):
    """Whether a batch of one holds several sequences, told by position ids that restart.

    The same test as transformers' flash path: the ids are not one run counting up by one.
    """
    if position_ids is None or batch != 1 or position_ids.dim() != 2:
        return False
    if tuple(position_ids.shape) != (1, seqlen_q):
        return False
    ids = position_ids[0]
    run = torch.arange(seqlen_q, device=ids.device, dtype=ids.dtype) + ids.min()
    return bool((ids != run).any())


def _cu_seqlens_from_positions(position_ids):
    """cu_seqlens and the longest length: a sequence starts wherever the position id is minimal.

    The first token always starts one, so that every row of the output is written.
    """
    ids = position_ids.reshape(-1)
    is_start = ids == ids.min()
    is_start[0] = True
    starts = torch.nonzero(is_start, as_tuple=True)[0].to(torch.int32)
    end = torch.full((1,), ids.numel(), dtype=torch.int32, device=ids.device)
    cu_seqlens = torch.cat((starts, end))
    return cu_seqlens, int(cu_seqlens.diff().max())
