"""The per-row reduction of two logit blocks on the device, in float64 (design.md's numerics
rules): forward and reverse KL, first-index top-1, the reference's top-1 probability and the NLLs
of the true next tokens; a fused Triton kernel where Triton runs, the torch path elsewhere."""


_TRITON_KERNEL = None


def triton_kernel():
    """The fused row reduction (one read of both logit rows, everything accumulated in float64),
    compiled on first use; None where Triton is missing (the torch path then runs)."""
    global _TRITON_KERNEL
    if _TRITON_KERNEL is not None:
        return _TRITON_KERNEL or None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _TRITON_KERNEL = False
        return None

    @triton.jit
    def kl_rows(a_ptr, b_ptr, stride, vocab, out_ptr, top_ptr, BLOCK: tl.constexpr):
        # One program per row, BLOCK lanes, each lane with its own online maximum (its sums
        # rescaled when its maximum grows), joined at the end: each row is read once. Per lane:
        # s = sum e^(x - m), t = sum e^(x - m) (a - b), all float64; c = a - b is formed from
        # float64 upcasts (exact).
        row = tl.program_id(0).to(tl.int64)
        a_row = a_ptr + row * stride
        b_row = b_ptr + row * stride
        lanes = tl.arange(0, BLOCK)
        neg = float("-inf")
        m_a = tl.full([BLOCK], neg, tl.float64)
        m_b = tl.full([BLOCK], neg, tl.float64)
        s_a = tl.zeros([BLOCK], tl.float64)
        s_b = tl.zeros([BLOCK], tl.float64)
        t_a = tl.zeros([BLOCK], tl.float64)
        t_b = tl.zeros([BLOCK], tl.float64)
        arg_a = tl.zeros([BLOCK], tl.int32)
        arg_b = tl.zeros([BLOCK], tl.int32)
        nan_seen = tl.zeros([BLOCK], tl.int32)
        for start in range(0, vocab, BLOCK):
            offs = start + lanes
            inside = offs < vocab
            a = tl.load(a_row + offs, mask=inside, other=neg).to(tl.float64)
            b = tl.load(b_row + offs, mask=inside, other=neg).to(tl.float64)
            nan_seen += ((a != a) | (b != b)).to(tl.int32)
            # Strictly greater: a lane keeps the first index of its maximum.
            arg_a = tl.where(a > m_a, offs, arg_a)
            arg_b = tl.where(b > m_b, offs, arg_b)
            new_a = tl.maximum(m_a, a)
            new_b = tl.maximum(m_b, b)
            # exp(-inf - -inf) would be NaN while a lane has seen only -inf: factor 1 then.
            ra = tl.where(new_a == neg, 1.0, tl.exp(m_a - new_a))
            rb = tl.where(new_b == neg, 1.0, tl.exp(m_b - new_b))
            ea = tl.where(a == neg, 0.0, tl.exp(a - new_a))
            eb = tl.where(b == neg, 0.0, tl.exp(b - new_b))
            c = a - b
            # p = 0 contributes nothing; mass against a -inf is infinite.
            ta = tl.where(a == neg, 0.0, tl.where(b == neg, float("inf"), ea * c))
            tb = tl.where(b == neg, 0.0, tl.where(a == neg, neg, eb * c))
            s_a = s_a * ra + ea
            s_b = s_b * rb + eb
            t_a = t_a * ra + ta
            t_b = t_b * rb + tb
            m_a = new_a
            m_b = new_b
        big_a = tl.max(m_a, 0)
        big_b = tl.max(m_b, 0)
        fa = tl.where(m_a == neg, 0.0, tl.exp(m_a - big_a))
        fb = tl.where(m_b == neg, 0.0, tl.exp(m_b - big_b))
        sa = tl.sum(s_a * fa, 0)
        sb = tl.sum(s_b * fb, 0)
        ta_sum = tl.sum(tl.where(fa == 0.0, 0.0, t_a * fa), 0)
        tb_sum = tl.sum(tl.where(fb == 0.0, 0.0, t_b * fb), 0)
        top_a = tl.min(tl.where(m_a == big_a, arg_a, 2147483647), 0)
        top_b = tl.min(tl.where(m_b == big_b, arg_b, 2147483647), 0)
        lse_a = big_a + tl.log(sa)
        lse_b = big_b + tl.log(sb)
        shift = lse_a - lse_b
        o = out_ptr + row * 6
        tl.store(o + 0, ta_sum / sa - shift)
        tl.store(o + 1, shift - tb_sum / sb)
        tl.store(o + 2, lse_a)
        tl.store(o + 3, lse_b)
        tl.store(o + 4, big_a)
        tl.store(o + 5, tl.sum(nan_seen, 0).to(tl.float64))
        tl.store(top_ptr + row * 2 + 0, top_a)
        tl.store(top_ptr + row * 2 + 1, top_b)

    _TRITON_KERNEL = kl_rows
    return kl_rows


def reduce_rows_fused(torch, la, lb, tokens, vocab):
    """`reduce_rows` in one fused Triton kernel per block of rows: the same records, to float64
    rounding (checked against the torch path by runners/gpu/check_reduction.py)."""
    kernel = triton_kernel()
    la = la.contiguous()
    lb = lb.contiguous()
    rows = la.shape[0]
    out = torch.empty((rows, 6), dtype=torch.float64, device=la.device)
    top = torch.empty((rows, 2), dtype=torch.int32, device=la.device)
    # Triton launches on the current device; with device_map="auto" the head may sit elsewhere.
    with torch.cuda.device(la.device):
        kernel[(rows,)](la, lb, la.stride(0), vocab, out, top, BLOCK=1024)
    fwd, rev, lse_a, lse_b, max_a, nan_seen = out.unbind(1)
    inf = float("inf")
    bad = (nan_seen > 0) | (max_a == inf) | (max_a == -inf) | torch.isinf(lse_b) | torch.isnan(lse_b)
    a_t = la[:, :vocab].gather(1, tokens.clamp(min=0)[:, None])[:, 0].double()
    b_t = lb[:, :vocab].gather(1, tokens.clamp(min=0)[:, None])[:, 0].double()
    known = tokens >= 0
    nan = torch.full_like(lse_a, float("nan"))
    return {
        "forward": torch.where(bad, nan, fwd).clamp(min=0.0),
        "reverse": torch.where(bad, nan, rev).clamp(min=0.0),
        "ref_top1": top[:, 0].contiguous(),
        "cand_top1": top[:, 1].contiguous(),
        "ref_top1_prob": (max_a - lse_a).exp(),
        "nll_ref": torch.where(known, lse_a - a_t, nan),
        "nll_cand": torch.where(known, lse_b - b_t, nan),
        "finite": (~bad).to(torch.uint8),
    }


def reduce_rows(torch, la, lb, tokens, vocab):
    """Per-row records of two logit blocks [R, V] (any float dtype, upcast exactly to float64):
    forward and reverse KL (nats), first-index top-1, the reference's top-1 probability, NLLs of
    `tokens` (a LongTensor on the logits' device, -1 where unknown), and whether the row is
    finite (no NaN or +inf, not every entry -inf). Padded entries beyond `vocab` are dropped.

    With c = a - b formed in float64 (exact: both are float64 upcasts) and the normalizers
    Z = sum e^(x - max) in float64:
        KL(P||Q) = sum_i p_i c_i - (lse_a - lse_b),   KL(Q||P) = -sum_i q_i c_i + (lse_a - lse_b)
    The subtraction loses only f64 digits (1e-16 times the spread of c): far below 1e-6 of any
    KL that matters, and it keeps the passes over memory few (a handful per row, each a fused
    kernel). Rows holding -inf (masked tokens) take `reduce_masked`, which treats 0 log 0 as 0."""
    a = la[:, :vocab].double()
    b = lb[:, :vocab].double()
    max_a, top_a = a.max(1)  # first index of the maximum (torch documents it); NaN propagates
    max_b, top_b = b.max(1)
    inf = float("inf")
    bad = torch.isnan(max_a) | torch.isnan(max_b) | (max_a == inf) | (max_b == inf) | (max_a == -inf) | (max_b == -inf)
    if bool(torch.isneginf(a).any()) or bool(torch.isneginf(b).any()):
        return reduce_masked(torch, a, b, max_a, top_a, max_b, top_b, bad, tokens)
    safe_a = torch.where(bad, torch.zeros_like(max_a), max_a)
    safe_b = torch.where(bad, torch.zeros_like(max_b), max_b)
    ea = torch.exp(a - safe_a[:, None])
    eb = torch.exp(b - safe_b[:, None])
    za = ea.sum(1)
    zb = eb.sum(1)
    lse_a = safe_a + za.log()
    lse_b = safe_b + zb.log()
    c = a - b
    # Row-wise dot products in one pass each (batched matrix products in float64).
    pc = torch.bmm(ea[:, None, :], c[:, :, None])[:, 0, 0] / za
    qc = torch.bmm(eb[:, None, :], c[:, :, None])[:, 0, 0] / zb
    shift = lse_a - lse_b
    fwd = pc - shift
    rev = shift - qc
    return finish_records(torch, a, b, fwd, rev, top_a, top_b, max_a, lse_a, lse_b, bad, tokens)


def reduce_masked(torch, a, b, max_a, top_a, max_b, top_b, bad, tokens):
    """`reduce_rows` for rows with -inf entries: log-probabilities, terms with p = 0 dropped, and
    +inf where one side has mass the other has not."""
    lse_a = torch.logsumexp(a, 1)
    lse_b = torch.logsumexp(b, 1)
    lp = a - lse_a[:, None]
    lq = b - lse_b[:, None]
    d = lp - lq
    p = lp.exp()
    q = lq.exp()
    a_masked = torch.isneginf(a)
    b_masked = torch.isneginf(b)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=a.device)
    zero = torch.zeros((), dtype=torch.float64, device=a.device)
    fwd = torch.where(a_masked, zero, torch.where(b_masked, inf, p * d)).sum(1)
    rev = torch.where(b_masked, zero, torch.where(a_masked, inf, q * -d)).sum(1)
    return finish_records(torch, a, b, fwd, rev, top_a, top_b, max_a, lse_a, lse_b, bad, tokens)


def finish_records(torch, a, b, fwd, rev, top_a, top_b, max_a, lse_a, lse_b, bad, tokens):
    known = tokens >= 0
    t = tokens.clamp(min=0)[:, None]
    nan = torch.full_like(lse_a, float("nan"))
    nll_a = torch.where(known, lse_a - a.gather(1, t)[:, 0], nan)
    nll_b = torch.where(known, lse_b - b.gather(1, t)[:, 0], nan)
    return {
        "forward": fwd.clamp(min=0.0),
        "reverse": rev.clamp(min=0.0),
        "ref_top1": top_a.int(),
        "cand_top1": top_b.int(),
        "ref_top1_prob": (max_a - lse_a).exp(),
        "nll_ref": nll_a,
        "nll_cand": nll_b,
        "finite": (~bad).to(torch.uint8),
    }
