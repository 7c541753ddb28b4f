"""FlashAttention-3's Hopper forward as a benchmark peer, through the library that
scripts/build_fa3_peer.sh builds (its path in FLASHCUTE_FA3_LIB).

`load()` returns None when the variable is unset, so bench.py runs without the peer. The peer
covers bf16 at head dims 64, 128 and 256, dense or packed, causal or not (`supports`); each call
allocates its output, log-sum-exp and scheduler metadata as FlashAttention-3's own Python entry
does, on PyTorch's current stream.
"""

import ctypes
import os

import torch

HEAD_DIMS = (64, 128, 256)


class _Args(ctypes.Structure):
    """Mirrors Fa3PeerArgs in bench/peers/fa3_peer.cu (64-bit fields only)."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "metadata")] + [
        (name, ctypes.c_int64) for name in (
            "batch", "seqlen_q", "seqlen_k", "total_q", "total_k", "heads", "heads_k", "head_dim",
            "q_batch_stride", "q_row_stride", "q_head_stride",
            "k_batch_stride", "k_row_stride", "k_head_stride",
            "v_batch_stride", "v_row_stride", "v_head_stride",
            "o_batch_stride", "o_row_stride", "o_head_stride", "causal")] + [
        ("softmax_scale", ctypes.c_double)]


assert ctypes.sizeof(_Args) == 240, "out of step with Fa3PeerArgs"


class Fa3Peer:
    def __init__(self, path):
        self.path = path
        self._lib = ctypes.CDLL(path)
        self._lib.fa3_peer_forward.argtypes = [ctypes.POINTER(_Args), ctypes.c_void_p]
        self._lib.fa3_peer_forward.restype = ctypes.c_int
        self._lib.fa3_peer_metadata_ints.argtypes = [ctypes.c_int64] * 3
        self._lib.fa3_peer_metadata_ints.restype = ctypes.c_int

    @staticmethod
    def supports(dtype, head_dim):
        return dtype == torch.bfloat16 and head_dim in HEAD_DIMS

    def forward(self, q, k, v, causal, cu_seqlens=None, max_seqlen=None):
        """Dense q (b, sq, h, d), k and v (b, sk, hk, d); or packed (total, h, d) with int32
        cu_seqlens shared by queries and keys and max_seqlen their longest. Returns the output."""
        packed = cu_seqlens is not None
        if not self.supports(q.dtype, q.shape[-1]):
            raise ValueError(f"fa3 peer: no kernel for {q.dtype} at head dim {q.shape[-1]}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.stride(-1) != 1 or t.dtype != q.dtype or t.device != q.device:
                raise ValueError(f"fa3 peer: {name} must be {q.dtype} on {q.device} with unit "
                                 "stride in its last dimension")
        out = torch.empty_like(q)
        a = _Args()
        a.heads, a.heads_k, a.head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
        if packed:
            a.batch = cu_seqlens.numel() - 1
            a.seqlen_q = a.seqlen_k = max_seqlen
            a.total_q, a.total_k = q.shape[0], k.shape[0]
            lse = torch.empty((a.heads, a.total_q), dtype=torch.float32, device=q.device)
            a.cu_seqlens_q = a.cu_seqlens_k = cu_seqlens.data_ptr()
        else:
            a.batch, a.seqlen_q, a.seqlen_k = q.shape[0], q.shape[1], k.shape[1]
            a.total_q, a.total_k = a.batch * a.seqlen_q, a.batch * a.seqlen_k
            lse = torch.empty((a.batch, a.heads, a.seqlen_q), dtype=torch.float32,
                              device=q.device)
        for prefix, t in (("q", q), ("k", k), ("v", v), ("o", out)):
            strides = t.stride()
            setattr(a, f"{prefix}_row_stride", strides[-3])
            setattr(a, f"{prefix}_head_stride", strides[-2])
            setattr(a, f"{prefix}_batch_stride", 0 if packed else strides[0])
        metadata = torch.empty(self._lib.fa3_peer_metadata_ints(a.batch, packed, causal),
                               dtype=torch.int32, device=q.device)
        a.q, a.k, a.v, a.out, a.lse = (t.data_ptr() for t in (q, k, v, out, lse))
        a.metadata = metadata.data_ptr()
        a.causal = bool(causal)
        a.softmax_scale = a.head_dim ** -0.5
        err = self._lib.fa3_peer_forward(ctypes.byref(a), torch.cuda.current_stream().cuda_stream)
        if err != 0:
            raise RuntimeError(f"fa3 peer: CUDA error {err}")
        return out


def load():
    """The peer named by FLASHCUTE_FA3_LIB, or None when the variable is unset."""
    path = os.environ.get("FLASHCUTE_FA3_LIB")
    return Fa3Peer(path) if path else None
