"""flashcute inside Hugging Face transformers (attn_implementation="cute_attention") on the GPU.

A small random-weight Llama with GQA is built three times from one state dict: ours in bf16,
PyTorch SDPA in bf16 (the baseline a user would otherwise get) and eager attention in fp32 (the
reference). On a padded batch, our logits must be about as close to the reference as SDPA's;
then a greedy generate() on left-padded prompts runs through ours, KV cache and all. Needs torch,
CUDA and transformers 5.
"""

import pytest

torch = pytest.importorskip("torch", reason="the transformers GPU test needs torch")
if not torch.cuda.is_available():
    pytest.skip("the transformers GPU test needs a CUDA device", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="the transformers GPU test needs "
                                   "transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"needs transformers 5, found {transformers.__version__}", allow_module_level=True)

import flashcute.integrations.transformers as flashcute_hf  # noqa: E402

DEVICE = torch.device("cuda", torch.cuda.current_device())
VOCAB = 1000
LENGTHS = [200, 256, 97, 130]
# Ours may be at most this much further from the fp32 reference than SDPA (relative L2 error).
ERROR_RATIO = 1.1
# And agree with the reference's top-1 token on at most this fraction of positions fewer, among
# the positions whose reference top-1 leads its runner-up by DECISIVE_MARGIN times SDPA's RMS
# logit error or more. A random-weight model has many near-ties, which any bf16 rounding decides
# either way: over all 683 positions two equally accurate implementations differ by several
# tokens.
TOP1_SLACK = 0.01
DECISIVE_MARGIN = 4.0
MIN_DECISIVE = 150
NEW_TOKENS = 16


def config():
    # Weights spread wider than the default init (0.02), so that attention is far from uniform
    # and a masking error moves the logits well beyond bf16 rounding.
    return transformers.LlamaConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024,
        initializer_range=0.05, pad_token_id=0, bos_token_id=None, eos_token_id=None)


@pytest.fixture(scope="module")
def models():
    """{name: model}: one state dict in ours (bf16), sdpa (bf16) and eager (fp32)."""
    flashcute_hf.register()
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(
        config(), attn_implementation="eager", dtype=torch.float32)
    state = reference.state_dict()
    built = {"eager_fp32": reference}
    for name, implementation in (("ours", flashcute_hf.NAME), ("sdpa", "sdpa")):
        # A config each: a model records its attention implementation in its config.
        model = transformers.AutoModelForCausalLM.from_config(
            config(), attn_implementation=implementation, dtype=torch.bfloat16)
        model.load_state_dict(state)
        assert model.config._attn_implementation == implementation
        built[name] = model
    return {name: model.to(DEVICE).eval() for name, model in built.items()}


def padded_batch(side):
    """Random ids for LENGTHS, padded to the longest on `side`, and the attention mask."""
    g = torch.Generator().manual_seed(1)
    total = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), total, dtype=torch.long)
    mask = torch.zeros(len(LENGTHS), total, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        tokens = torch.randint(1, VOCAB, (n,), generator=g)
        cols = slice(total - n, total) if side == "left" else slice(0, n)
        ids[row, cols] = tokens
        mask[row, cols] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


class CallCounter:
    """Records the library calls the integration makes: the longest query of each."""

    def __init__(self, monkeypatch):
        self.query_lengths = []
        dense, varlen = flashcute_hf.flash_attn_func, flashcute_hf.flash_attn_varlen_func

        def counted_dense(q, k, v, **options):
            self.query_lengths.append(q.shape[1])
            return dense(q, k, v, **options)

        def counted_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           **options):
            self.query_lengths.append(max_seqlen_q)
            return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          **options)

        monkeypatch.setattr(flashcute_hf, "flash_attn_func", counted_dense)
        monkeypatch.setattr(flashcute_hf, "flash_attn_varlen_func", counted_varlen)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_logits_as_close_to_fp32_as_sdpa(models, side, monkeypatch):
    ids, mask = padded_batch(side)
    valid = mask.bool()
    counter = CallCounter(monkeypatch)
    logits = {}
    with torch.inference_mode():
        for name, model in models.items():
            logits[name] = model(ids, attention_mask=mask).logits[valid].double()
    assert counter.query_lengths == [max(LENGTHS)] * 8  # one varlen call per layer
    reference = logits.pop("eager_fp32")
    error = {name: ((x - reference).norm() / reference.norm()).item() for name, x in logits.items()}
    top2 = reference.topk(2, dim=-1).values
    noise = (logits["sdpa"] - reference).pow(2).mean().sqrt()
    decisive = top2[:, 0] - top2[:, 1] >= DECISIVE_MARGIN * noise
    assert decisive.sum() >= MIN_DECISIVE, f"only {decisive.sum().item()} decisive positions"
    top1 = reference[decisive].argmax(dim=-1)
    agree = {name: (x[decisive].argmax(dim=-1) == top1).double().mean().item()
             for name, x in logits.items()}
    what = (f"{side} padding: relative L2 error {error}, top-1 agreement on "
            f"{decisive.sum().item()} decisive positions {agree}")
    print(what)  # shown with pytest -s: the figures behind the verdict
    assert error["ours"] <= ERROR_RATIO * error["sdpa"], what
    assert agree["ours"] >= agree["sdpa"] - TOP1_SLACK, what


def test_greedy_generate_with_left_padding(models, monkeypatch):
    ids, mask = padded_batch("left")
    # No end-of-sequence token (the config has none): every row runs NEW_TOKENS steps.
    options = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                   pad_token_id=0)
    expected = models["sdpa"].generate(ids, **options)
    counter = CallCounter(monkeypatch)
    got = models["ours"].generate(ids, **options)
    assert got.shape == expected.shape == (len(LENGTHS), max(LENGTHS) + NEW_TOKENS)
    assert torch.equal(got[:, :max(LENGTHS)], ids)
    # The prompt, then NEW_TOKENS - 1 decoding steps of one query per sequence, in each layer.
    assert counter.query_lengths == [max(LENGTHS)] * 8 + [1] * 8 * (NEW_TOKENS - 1)
    # Each token ours chose must be one the fp32 reference ranks (nearly) first, given the same
    # prefix: as close as SDPA's own choices come.
    regret = {name: _regret(models["eager_fp32"], tokens, mask)
              for name, tokens in (("ours", got), ("sdpa", expected))}
    print(f"greedy generate, mean regret against fp32: {regret}")
    assert regret["ours"] <= 2 * regret["sdpa"] + 0.05, regret


def _regret(reference, tokens, prompt_mask):
    """Mean over generated tokens of (the fp32 model's best logit - its logit for the token)."""
    new = tokens.shape[1] - prompt_mask.shape[1]
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(prompt_mask.shape[0], new)], dim=1)
    with torch.inference_mode():
        logits = reference(tokens, attention_mask=mask).logits[:, -new - 1:-1].double()
    chosen = logits.gather(-1, tokens[:, -new:, None])[..., 0]
    return (logits.max(dim=-1).values - chosen).mean().item()
