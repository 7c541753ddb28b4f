"""The transformers integration's glue on the CPU, the fp64 reference standing in for the kernel.

flashcute.integrations.transformers turns what transformers hands an attention layer (padded
batches, KV-cache decoding steps, packed sequences, sliding windows) into flash_attn_func and
flash_attn_varlen_func calls. Here those two are replaced by the reference (attention_reference,
FlashAttention's semantics) and the compute dtype is left as the model's, so a tiny fp32 model
must give eager attention's logits and greedy tokens exactly, up to fp32 rounding. The stand-ins
also check that every call meets the library's rules (layout, head_dim, int32 offsets).
test_transformers_gpu.py runs the real kernel. Needs torch and transformers; no GPU.
"""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the transformers integration needs torch")
transformers = pytest.importorskip("transformers", reason="needs transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers 5, found {transformers.__version__}", allow_module_level=True)

import flashcute  # noqa: E402
import flashcute.integrations.transformers as flashcute_hf  # noqa: E402
from attention_reference import attention  # noqa: E402

VOCAB = 97


class StandIn:
    """flash_attn_func / flash_attn_varlen_func on the reference, recording each call's path."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def _check_layout(*tensors):
        for t in tensors:
            assert t.shape[-1] % 8 == 0, f"head_dim {t.shape[-1]} reached the library"
            assert t.stride(-1) == 1, f"strides {t.stride()} reached the library"
            assert all(s % 8 == 0 for n, s in zip(t.shape[:-1], t.stride()[:-1]) if n > 1)

    @staticmethod
    def _attend(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                softcap=0.0):
        assert dropout_p == 0.0 and softmax_scale is not None
        out, _ = attention(q, k, v, scale=softmax_scale, causal=causal, window=window_size,
                           softcap=softcap)
        return out.to(q.dtype)

    def dense(self, q, k, v, **options):
        self._check_layout(q, k, v)
        self.calls.append(("dense", tuple(q.shape), tuple(k.shape)))
        return self._attend(q, k, v, **options)

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
        self._check_layout(q, k, v)
        for cu, total in ((cu_seqlens_q, q.shape[0]), (cu_seqlens_k, k.shape[0])):
            assert cu.dtype == torch.int32 and cu.is_contiguous()
            assert cu[0].item() == 0 and cu[-1].item() == total
        lens_q, lens_k = cu_seqlens_q.diff().tolist(), cu_seqlens_k.diff().tolist()
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
        assert max_seqlen_q >= max(lens_q) and max_seqlen_k >= max(lens_k)
        self.calls.append(("varlen", lens_q, lens_k))
        outs = []
        for i in range(len(lens_q)):
            qs, ks = cu_seqlens_q[i].item(), cu_seqlens_k[i].item()
            outs.append(self._attend(q[None, qs:qs + lens_q[i]], k[None, ks:ks + lens_k[i]],
                                     v[None, ks:ks + lens_k[i]], **options)[0])
        return torch.cat(outs)

    def paths(self):
        return {call[0] for call in self.calls}


@pytest.fixture
def stand_in(monkeypatch):
    kernel = StandIn()
    monkeypatch.setattr(flashcute_hf, "flash_attn_func", kernel.dense)
    monkeypatch.setattr(flashcute_hf, "flash_attn_varlen_func", kernel.varlen)
    # Keep the model's fp32, so that the comparison with eager attention is exact.
    monkeypatch.setattr(flashcute_hf, "_dtypes", lambda query, module: (query.dtype, query.dtype))
    flashcute_hf.register()
    return kernel


def build_models(kind="llama", **overrides):
    """(eager, ours) with the same random weights, in fp32, for a tiny GQA decoder."""
    config_class = {"llama": transformers.LlamaConfig,
                    "mistral": transformers.MistralConfig}[kind]
    # A large init spreads the attention weights, so that a masking error shows in the logits.
    options = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                   max_position_embeddings=256, initializer_range=0.2)
    options.update(overrides)
    torch.manual_seed(0)
    # A config each: a model records its attention implementation in its config.
    eager = transformers.AutoModelForCausalLM.from_config(config_class(**options),
                                                          attn_implementation="eager")
    ours = transformers.AutoModelForCausalLM.from_config(config_class(**options),
                                                         attn_implementation=flashcute_hf.NAME)
    ours.load_state_dict(eager.state_dict())
    assert eager.config._attn_implementation == "eager"
    assert ours.config._attn_implementation == flashcute_hf.NAME
    return eager.eval(), ours.eval()


def padded_batch(lengths, side, total=None):
    total = total or max(lengths)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, total - n:] = 1
        else:
            mask[row, :n] = 1
    return ids.masked_fill(mask == 0, 0), mask


def assert_logits_equal(ours, eager, valid=None):
    if valid is not None:
        ours, eager = ours[valid], eager[valid]
    torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Registration.

def test_import_flashcute_does_not_import_transformers():
    code = ("import sys, flashcute, flashcute.integrations; "
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=flashcute.__file__.rsplit("/flashcute/", 1)[0])


@pytest.mark.parametrize("name", ["flash_cute", "my/kernel", "paged|cute", ""])
def test_register_refuses_names_transformers_would_reroute(name):
    with pytest.raises(ValueError, match="name"):
        flashcute_hf.register(name)


def test_register_adds_attention_and_mask_functions():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert flashcute_hf.register() == "cute_attention"
    assert flashcute_hf.register("cute_attention_again") == "cute_attention_again"
    for name in ("cute_attention", "cute_attention_again"):
        assert AttentionInterface()[name] is flashcute_hf.attention_forward
        assert ALL_MASK_ATTENTION_FUNCTIONS[name] is flashcute_hf.padding_mask


def test_padding_mask():
    ones = torch.ones(2, 6, dtype=torch.bool)
    assert flashcute_hf.padding_mask(2, 6, 6, attention_mask=None) is None
    assert flashcute_hf.padding_mask(2, 6, 6, attention_mask=ones) is None
    padded = ones.clone()
    padded[0, :2] = False
    assert torch.equal(flashcute_hf.padding_mask(2, 6, 6, attention_mask=padded), padded)
    # A sliding-window cache keeps the last kv_length keys; a static cache has more slots.
    assert flashcute_hf.padding_mask(2, 1, 4, attention_mask=padded) is None
    assert torch.equal(flashcute_hf.padding_mask(2, 1, 5, attention_mask=padded), padded[:, 1:])
    assert torch.equal(flashcute_hf.padding_mask(2, 6, 16, attention_mask=ones), ones)


def test_padding_mask_bounds_a_static_cache_without_attention_mask():
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    # A 16-slot static cache holding 9 tokens, then 1 more: only causal masks bound the keys.
    for q_offset, q_length in ((0, 9), (torch.tensor(9), 1)):
        mask = flashcute_hf.padding_mask(2, q_length, 16, q_offset=q_offset,
                                         mask_function=causal_mask_function)
        assert mask.dtype == torch.bool and mask.all()
        assert tuple(mask.shape) == (2, int(q_offset) + q_length)
    assert flashcute_hf.padding_mask(2, 9, 16, mask_function=bidirectional_mask_function) is None
    # No spare slots (a dynamic cache): nothing to bound.
    assert flashcute_hf.padding_mask(2, 1, 10, q_offset=9,
                                     mask_function=causal_mask_function) is None


# ---------------------------------------------------------------------------------------------
# Whole models against eager attention.

@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_eager(stand_in, side):
    eager, ours = build_models()
    ids, mask = padded_batch([20, 7, 13, 1], side)
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    assert_logits_equal(got, expected, mask.bool())
    assert stand_in.paths() == {"varlen"}
    assert stand_in.calls[0][1] == [20, 7, 13, 1]


def test_unpadded_batch_runs_dense(stand_in):
    eager, ours = build_models()
    ids, mask = padded_batch([16, 16], "left")
    with torch.no_grad():
        assert_logits_equal(ours(ids, attention_mask=mask).logits,
                            eager(ids, attention_mask=mask).logits)
        assert_logits_equal(ours(ids).logits, eager(ids).logits)
    assert stand_in.paths() == {"dense"}


@pytest.mark.parametrize("padding", [True, False])
def test_greedy_generation_with_cache_matches_eager(stand_in, padding):
    eager, ours = build_models()
    ids, mask = padded_batch([11, 4, 9] if padding else [9, 9, 9], "left")
    options = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = eager.generate(ids, **options)
    got = ours.generate(ids, **options)
    assert torch.equal(got, expected)
    # Decoding steps: one query per sequence against the whole cache.
    steps = [c for c in stand_in.calls if c[0] == "varlen" and c[1] == [1, 1, 1]]
    dense_steps = [c for c in stand_in.calls if c[0] == "dense" and c[1][1] == 1]
    assert len(steps if padding else dense_steps) == 7 * 2  # 7 steps after the prompt, 2 layers


@pytest.mark.parametrize("lengths", [[11, 4, 9], [9, 9, 9]])
def test_static_cache_generation_matches_eager(stand_in, lengths):
    # A static cache has more slots than tokens: the mask, shorter than the keys, bounds them.
    eager, ours = build_models()
    ids, mask = padded_batch(lengths, "left")
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                   cache_implementation="static")
    assert torch.equal(ours.generate(ids, **options), eager.generate(ids, **options))
    # The prompt: only the tokens under the mask, not the empty slots after them.
    assert stand_in.calls[0] == ("varlen", lengths, lengths)


def test_static_cache_without_attention_mask_matches_eager(stand_in):
    # Newer transformers drop an all-ones mask; the static cache's empty slots must stay unseen.
    eager, ours = build_models()
    ids, _ = padded_batch([9, 9], "left")
    more = torch.randint(1, VOCAB, (2, 1), generator=torch.Generator().manual_seed(6))
    logits = []
    for model in (eager, ours):
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            first = model(ids, past_key_values=cache).logits
            logits.append((first, model(more, past_key_values=cache).logits))
    for got, expected in zip(logits[1], logits[0]):
        assert_logits_equal(got, expected)
    assert stand_in.calls == [("varlen", [9, 9], [9, 9])] * 2 + [("varlen", [1, 1], [10, 10])] * 2


def test_several_new_tokens_after_a_cache_match_eager(stand_in):
    # seqlen_q is neither 1 nor the key length: the queries are the last columns of the mask.
    eager, ours = build_models()
    ids, mask = padded_batch([12, 5, 9], "left")
    more = torch.randint(1, VOCAB, (3, 4), generator=torch.Generator().manual_seed(5))
    full_mask = torch.cat([mask, torch.ones_like(more)], dim=1)
    logits = []
    for model in (eager, ours):
        with torch.no_grad():
            cache = model(ids, attention_mask=mask, use_cache=True).past_key_values
            logits.append(model(more, attention_mask=full_mask, past_key_values=cache).logits)
    assert_logits_equal(logits[1], logits[0])
    assert stand_in.calls[-1] == ("varlen", [4, 4, 4], [16, 9, 13])


def test_sliding_window_matches_eager(stand_in):
    eager, ours = build_models("mistral", sliding_window=6)
    ids, mask = padded_batch([20, 9, 14], "left")
    with torch.no_grad():
        assert_logits_equal(ours(ids, attention_mask=mask).logits,
                            eager(ids, attention_mask=mask).logits, mask.bool())
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **options), eager.generate(ids, **options))


def test_packed_position_ids_match_separate_sequences(stand_in):
    eager, ours = build_models()
    lengths = [7, 12, 5]
    g = torch.Generator().manual_seed(2)
    sequences = [torch.randint(1, VOCAB, (1, n), generator=g) for n in lengths]
    packed = torch.cat(sequences, dim=1)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        got = ours(packed, position_ids=positions).logits
        expected = torch.cat([eager(s).logits for s in sequences], dim=1)
    assert_logits_equal(got, expected)
    assert stand_in.calls[0] == ("varlen", lengths, lengths)


def test_cu_seq_lens_kwargs_run_varlen(stand_in):
    eager, ours = build_models()
    lengths = [6, 10]
    g = torch.Generator().manual_seed(3)
    sequences = [torch.randint(1, VOCAB, (1, n), generator=g) for n in lengths]
    cu = torch.tensor([0, 6, 16])  # int64, as transformers' collators make them
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        got = ours(torch.cat(sequences, dim=1), position_ids=positions, cu_seq_lens_q=cu,
                   cu_seq_lens_k=cu, max_length_q=10, max_length_k=10).logits
        expected = torch.cat([eager(s).logits for s in sequences], dim=1)
    assert_logits_equal(got, expected)
    assert stand_in.calls[0] == ("varlen", lengths, lengths)


# ---------------------------------------------------------------------------------------------
# The attention function on its own.

class Layer(torch.nn.Module):
    """What attention_forward reads from a transformers attention module."""

    def __init__(self, dtype=torch.float32, is_causal=True):
        super().__init__()
        self.is_causal = is_causal
        self.q_proj = torch.nn.Linear(8, 8, dtype=dtype)


def test_head_dims_are_padded_and_the_output_cropped(stand_in):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 5, 36, generator=g)  # head_dim 36: not a multiple of 8
    k = torch.randn(2, 3, 9, 36, generator=g)
    v = torch.randn(2, 3, 9, 20, generator=g)  # a smaller value head_dim, as in MLA
    out, weights = flashcute_hf.attention_forward(Layer(), q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (2, 5, 6, 20)
    ref, _ = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.3,
                       causal=True)
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


def test_dtypes_follow_transformers_flash_path():
    q32 = torch.zeros(1, 2, 3, 8)
    assert flashcute_hf._dtypes(q32.bfloat16(), Layer()) == (torch.bfloat16, torch.bfloat16)
    assert flashcute_hf._dtypes(q32.half(), Layer()) == (torch.float16, torch.float16)
    # fp32 activations in a half-precision model (fp32 layer norms): the weights' dtype.
    assert flashcute_hf._dtypes(q32, Layer(torch.float16)) == (torch.float16, torch.float16)
    # An fp32 model: bf16 in the kernel, fp32 back.
    with pytest.warns(UserWarning, match="bfloat16"):
        assert flashcute_hf._dtypes(q32, Layer()) == (torch.bfloat16, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert flashcute_hf._dtypes(q32, Layer()) == (torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("what, kwargs, error, words", [
    ("4-D mask", {"attention_mask": torch.zeros(1, 1, 4, 4)}, NotImplementedError, "2-D padding"),
    ("sinks", {"s_aux": torch.zeros(2)}, NotImplementedError, "s_aux"),
])
def test_refusals(what, kwargs, error, words):
    q = torch.zeros(1, 2, 4, 8)
    options = dict(attention_mask=None)
    options.update(kwargs)
    mask = options.pop("attention_mask")
    with pytest.raises(error, match=words):
        flashcute_hf.attention_forward(Layer(), q, q, q, mask, **options)
