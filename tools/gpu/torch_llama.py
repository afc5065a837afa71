"""The Llama decoder tools/gpu/peer_torch.py runs in PyTorch eager (its docstring says
what it computes and why): the FLOP counts bench_prefill.cpp uses, the static KV cache,
the model with random weights, and the static decode step --cuda-graphs captures."""
import math

import torch
import torch.nn.functional as F

RMS_EPS = 1e-5  # llama.attention.layer_norm_rms_epsilon of the random GGUF
FIRST_TOKEN_ID = 100  # random prompts draw ids in [100, vocab), as bench_prefill.cpp does


def gemm_flops_per_token(s):
    """bench_prefill.cpp's gemm_flops_per_token: QKV, O, gate/up, down of every layer."""
    q_dim, kv_dim = s["dim"], s["kv_heads"] * (s["dim"] // s["heads"])
    per_layer = (2.0 * s["dim"] * (q_dim + 2.0 * kv_dim) + 2.0 * q_dim * s["dim"] +
                 2.0 * s["dim"] * 2.0 * s["ff"] + 2.0 * s["ff"] * s["dim"])
    return per_layer * s["layers"]


def attention_flops(s, n):
    """bench_prefill.cpp's attention_flops: QK^T and PV over the causal lower triangle."""
    return 2.0 * 2.0 * (n * (n + 1) / 2.0) * s["dim"] * s["layers"]


class KvCache:
    """Static K/V of `streams` sequences of up to `max_len` tokens, one pair per layer:
    [streams, kv_heads, max_len, head_dim] each."""

    def __init__(self, model, streams, max_len):
        s = model.shape
        size = (streams, s["kv_heads"], max_len, model.head_dim)
        self.k = [torch.zeros(size, dtype=model.dtype, device=model.device) for _ in range(s["layers"])]
        self.v = [torch.zeros(size, dtype=model.dtype, device=model.device) for _ in range(s["layers"])]
        self.max_len = max_len


class Llama:
    def __init__(self, shape, device, dtype, seed=1):
        s = self.shape = shape
        self.device, self.dtype = device, dtype
        self.head_dim = s["dim"] // s["heads"]
        self.q_dim = s["heads"] * self.head_dim
        self.kv_dim = s["kv_heads"] * self.head_dim
        self.group = s["heads"] // s["kv_heads"]
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)

        def matrix(out, inp):  # [out, in], uniform with sd 1/sqrt(in) (random_model.cpp)
            w = torch.empty((out, inp), dtype=dtype, device=device)
            half_width = math.sqrt(3.0 / inp)
            return w.uniform_(-half_width, half_width, generator=gen)

        def ones():
            return torch.ones(s["dim"], dtype=dtype, device=device)

        self.embed = matrix(s["vocab"], s["dim"])  # tied: also the LM head
        self.layers = []
        for _ in range(s["layers"]):
            self.layers.append(dict(
                attn_norm=ones(),
                wqkv=matrix(self.q_dim + 2 * self.kv_dim, s["dim"]),
                wo=matrix(s["dim"], self.q_dim),
                ffn_norm=ones(),
                w_gate_up=matrix(2 * s["ff"], s["dim"]),
                w_down=matrix(s["dim"], s["ff"]),
            ))
        self.output_norm = ones()
        self.inv_freq = 1.0 / (s["rope_theta"] ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim))
        self._rope_len = 0
        self._cos = self._sin = None

    def rope_tables(self, length):
        """cos/sin [length, head_dim] in the model's dtype (computed in fp32), grown as needed."""
        if length > self._rope_len:
            n = max(length, 2 * self._rope_len)
            t = torch.arange(n, dtype=torch.float32, device=self.device)
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
            self._rope_len = n
        return self._cos, self._sin

    def feed_forward(self, L, x):
        """Layer L's SwiGLU feed-forward of x (normed first), as the residual to add."""
        gate, up = F.linear(self.rms_norm(x, L["ffn_norm"]), L["w_gate_up"]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, L["w_down"])

    def rms_norm(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return w * xf.to(x.dtype)

    @staticmethod
    def rotate(x, cos, sin):
        """x [B, n, heads, hd]; cos/sin [n, 1, hd] (rotate-half RoPE)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def attention(self, L, x, cache, layer, rows, start, cos, sin):
        s, hd = self.shape, self.head_dim
        B, n, _ = x.shape
        qkv = F.linear(x, L["wqkv"])
        q, k, v = qkv.split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = self.rotate(q.view(B, n, s["heads"], hd), cos, sin)
        k = self.rotate(k.view(B, n, s["kv_heads"], hd), cos, sin)
        v = v.view(B, n, s["kv_heads"], hd)
        kc, vc = cache.k[layer][rows], cache.v[layer][rows]  # views [B, kv_heads, max_len, hd]
        kc[:, :, start:start + n] = k.transpose(1, 2)
        vc[:, :, start:start + n] = v.transpose(1, 2)
        if start == 0:
            # Prefill: causal over the prompt itself, K/V repeated to the query heads (as
            # HF's repeat_kv) so every SDPA backend (flash included) takes it.
            kk = k.transpose(1, 2).repeat_interleave(self.group, dim=1)
            vv = v.transpose(1, 2).repeat_interleave(self.group, dim=1)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=True)
            return F.linear(out.transpose(1, 2).reshape(B, n, self.q_dim), L["wo"])
        if n != 1:
            raise ValueError("a forward after the prompt takes one token per stream (a decode step)")
        # Decode step: query head h reads KV head h // group; the group's queries become
        # the query axis of their KV head, all of them seeing every cached position.
        qg = q.view(B, s["kv_heads"], self.group, hd)
        out = F.scaled_dot_product_attention(qg, kc[:, :, :start + 1], vc[:, :, :start + 1])
        return F.linear(out.reshape(B, 1, self.q_dim), L["wo"])

    def attention_at(self, L, x, cache, layer, pos, cos, sin, mask):
        """attention's decode step with static shapes (what a CUDA graph captures): x
        [B, 1, dim] of every cache row at the position `pos` (a device tensor [1]); the
        new K/V written at it by index_copy_, attention over the whole cache masked to
        the positions <= it (`mask` [1, 1, 1, max_len], True where attended)."""
        s, hd = self.shape, self.head_dim
        B = x.shape[0]
        qkv = F.linear(x, L["wqkv"])
        q, k, v = qkv.split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = self.rotate(q.view(B, 1, s["heads"], hd), cos, sin)
        k = self.rotate(k.view(B, 1, s["kv_heads"], hd), cos, sin)
        v = v.view(B, 1, s["kv_heads"], hd)
        kc, vc = cache.k[layer], cache.v[layer]  # [B, kv_heads, max_len, hd]
        kc.index_copy_(2, pos, k.transpose(1, 2))
        vc.index_copy_(2, pos, v.transpose(1, 2))
        qg = q.view(B, s["kv_heads"], self.group, hd)  # the GQA fold, as in attention()
        out = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask)
        return F.linear(out.reshape(B, 1, self.q_dim), L["wo"])

    def decode_step(self, ids, pos, cache, key_pos, cos_table, sin_table):
        """A decode step with no Python value of the position: ids [B, 1] (every row of
        `cache`) at the position held by the device tensor `pos` [1]; key_pos =
        arange(cache.max_len) on the device; cos/sin tables of at least max_len rows
        (rope_tables, held by the caller so a graph's pointers stay valid). Logits
        [B, vocab]. Nothing here syncs with the host or allocates by a data-dependent
        size: capturable as a CUDA graph."""
        cos = cos_table.index_select(0, pos)[:, None, :]  # [1, 1, hd]
        sin = sin_table.index_select(0, pos)[:, None, :]
        mask = (key_pos <= pos).view(1, 1, 1, -1)
        x = F.embedding(ids, self.embed)
        for i, L in enumerate(self.layers):
            x = x + self.attention_at(L, self.rms_norm(x, L["attn_norm"]), cache, i, pos, cos, sin, mask)
            x = x + self.feed_forward(L, x)
        return F.linear(self.rms_norm(x[:, -1], self.output_norm), self.embed)

    def forward(self, ids, cache, start=0, rows=None, all_logits=False):
        """ids [B, n] at positions start..start+n-1 of the cache rows `rows` (a slice; default
        the first B). Logits [B, vocab] of the last position (or [B, n, vocab])."""
        B, n = ids.shape
        if rows is None:
            rows = slice(0, B)
        if start + n > cache.max_len:
            raise ValueError(f"positions up to {start + n} past the cache's {cache.max_len}")
        cos, sin = self.rope_tables(start + n)
        cos, sin = cos[start:start + n, None, :], sin[start:start + n, None, :]
        x = F.embedding(ids, self.embed)
        for i, L in enumerate(self.layers):
            x = x + self.attention(L, self.rms_norm(x, L["attn_norm"]), cache, i, rows, start, cos, sin)
            x = x + self.feed_forward(L, x)
        if not all_logits:
            x = x[:, -1]
        return F.linear(self.rms_norm(x, self.output_norm), self.embed)


def random_ids(shape, vocab, seed, device):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_TOKEN_ID, vocab, shape, generator=gen).to(device)


class StaticDecoder:
    """Greedy decode steps of `streams` streams in lockstep on static tensors: the cache
    (prefill the prompts into its rows with Llama.forward), the ids [streams, 1], the
    position [1], the logits and the argmax `out` [streams]. A step (Llama.decode_step)
    writes the argmax into `out` and `ids` and advances `pos`, all on the device. With
    graph=True (a CUDA device) the step is captured once as a CUDA graph and each step()
    replays it; with graph=False it runs eagerly (the same tensors: check's CPU path)."""

    WARMUP_STEPS = 3

    def __init__(self, model, streams, max_len, graph):
        dev = model.device
        self.model = model
        self.cache = KvCache(model, streams, max_len)
        self.cos, self.sin = model.rope_tables(max_len)  # held: the graph reads them
        self.key_pos = torch.arange(max_len, device=dev)
        self.ids = torch.full((streams, 1), FIRST_TOKEN_ID, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(streams, dtype=torch.long, device=dev)
        self.logits = None
        self.graph = None
        self.steps_left = 0  # steps until the position would leave the cache
        if graph:
            # torch.cuda.graphs' recipe: warm up on a side stream, then capture. The
            # warm-up writes K/V at positions 0..2 of every row: the prefill overwrites them.
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(self.WARMUP_STEPS):
                    self._step()
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._step()  # self.logits: the graph's output tensor, rewritten by each replay

    def _step(self):
        self.logits = self.model.decode_step(self.ids, self.pos, self.cache, self.key_pos, self.cos, self.sin)
        torch.argmax(self.logits, dim=-1, out=self.out)
        self.ids.copy_(self.out[:, None])
        self.pos.add_(1)

    def begin(self, tokens, position):
        """The next step reads `tokens` [streams] (device) at `position` of every row."""
        self.ids.copy_(tokens.view(-1, 1))
        self.pos.fill_(position)
        self.steps_left = self.cache.max_len - position

    def step(self):
        """One step of every stream; its tokens are in `out` (and its logits in `logits`)."""
        if self.steps_left <= 0:
            raise ValueError(f"decode step past the cache's {self.cache.max_len} positions")
        self.steps_left -= 1
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()
        return self.out


# ---------------------------------------------------------------------------------------
# gemm-peak
