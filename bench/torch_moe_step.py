#!/usr/bin/env python3
"""One training step of bench/qwen3_30b_proxy.nml in PyTorch, for bench/gpu_step.sh.

The PyTorch side of the comparison: the same model, batch and optimizer as
`moetrain --backend=cuda bench/qwen3_30b_proxy.nml`, written the way a PyTorch
user would (eager mode, library kernels), timed the same way and counted with the
same FLOP formula (mt_model_flops_per_token, src/model/model.c), so that the two
MFU figures compare.

Model (Qwen3-MoE, 4 layers at full Qwen3-30B-A3B width): token embedding; per
layer RMSNorm, attention (hidden 2048 -> 32 query heads and 4 KV groups of 128,
QK-norm: RMSNorm over each head, RoPE theta 1e6, causal
scaled_dot_product_attention with enable_gqa), residual, RMSNorm, MoE (fp32 router
over 128 experts, top-8, SwiGLU experts of width 768), residual; final RMSNorm,
untied head over 151936 tokens, cross-entropy; plus Megatron's aux loss (1e-3).

Forced balancing as moetrain's router_force_load_balancing does it
(src/model/model_moe.c force_logits): token n of the micro-batch gets logit 0 for
experts (n*k + j) mod E, j < k, and -1 elsewhere, so every expert receives
N*k/E rows (256 here), the top-k weights are all 1/k (softmax over the selected
logits), and the gradient passes straight through to the real router logits.

Precision: fp32 parameters (the master weights) and fp32 gradients, compute
under torch.autocast(bfloat16) (GEMMs and attention in bf16 on tensor cores, fp32
accumulation; the expert weights are cast to bf16 explicitly, as autocast has no
rule for grouped GEMMs), norms, router and loss in fp32;
torch.optim.AdamW(fused=True) on the fp32 parameters; gradient clipping at 1.0.
That is moetrain's bf16 recipe (fp32 master, bf16 working copy, AdamW in fp32).

Experts: torch.nn.functional.grouped_mm (else torch._grouped_mm) on the rows sorted
by expert, when it runs forward and backward on this device (on CUDA: sm_90 or newer,
PyTorch 2.8+); else a loop over the experts, each taking its rows with index_select.
The line "experts:" says which ran.

Timing: `--warmup` steps, then `--iters` steps between two torch.cuda.synchronize();
the step time is their mean. Prints a human line per figure and one line
`torch_moe_step: result step_ms=... tokens_per_s=... tflops=... mfu=...` for scripts.

Without PyTorch or without a CUDA device it says so and exits 0 (nothing to
measure); `--tiny` runs small shapes on whatever device there is (the CPU too),
a check of this script without a GPU.
"""

import argparse
import math
import sys
import time

PROXY = dict(  # bench/qwen3_30b_proxy.nml
    layers=4, hidden=2048, heads=32, groups=4, head_dim=128, experts=128, topk=8,
    expert_ffn=768, vocab=151936, seq=4096, micro_batch=1, rope_theta=1.0e6, eps=1.0e-6,
    init_std=0.02, lr=3.0e-4, weight_decay=0.1, beta2=0.95, clip_grad=1.0, aux_coeff=1.0e-3)
TINY = dict(PROXY, layers=2, hidden=64, heads=4, groups=2, head_dim=16, experts=8, topk=2,
            expert_ffn=32, vocab=300, seq=64, micro_batch=2)

# Dense bf16 tensor-core peaks (datasheet, TFLOP/s, without sparsity), by the first
# match in the device name (H100 alone: the SXM part, "NVIDIA H100 80GB HBM3").
PEAKS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
         ("GB200", 2500.0), ("B200", 2250.0), ("A100", 312.0))


def say(*args):
    print("torch_moe_step:", *args, flush=True)


def flops_per_token(c):
    """mt_model_flops_per_token (src/model/model.c): 3 (forward, wgrad, dgrad) x 2 (FMA)
    x the per-token GEMM sizes; SwiGLU stacks 3 matrices; causal attention counts half
    of the T x T scores; every layer MoE, no shared expert; the router is not counted."""
    H, T, L = c["hidden"], c["seq"], c["layers"]
    Q, KV = c["heads"] * c["head_dim"], c["groups"] * c["head_dim"]
    mlp = H * (c["expert_ffn"] * c["topk"] * 3.0) * L
    attn = H * (Q + 2.0 * KV) + Q * T / 2.0 * 2.0 + Q * H
    return 6.0 * (mlp + attn * L + H * c["vocab"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small shapes, any device (a check)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--iters", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="dense bf16 peak for MFU (default: from the device name)")
    ap.add_argument("--experts", choices=("auto", "grouped_mm", "loop"), default="auto",
                    help="expert GEMMs: grouped_mm, a loop over experts, or the first that works")
    ap.add_argument("--datasheet-peak", metavar="NAME",
                    help="print the dense bf16 peak of the device NAME (0: unknown) and exit")
    args = ap.parse_args()
    if args.datasheet_peak is not None:
        print(datasheet_peak(args.datasheet_peak))
        return 0
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    if not args.tiny and not nvidia_gpu_listed():
        say("no CUDA device; nothing to measure (--tiny runs small shapes on the CPU)")
        return 0
    try:
        import torch
    except ImportError:
        say("PyTorch is not installed; nothing to measure")
        return 0
    if torch.cuda.is_available():
        dev = torch.device("cuda")
    elif args.tiny:
        dev = torch.device("cpu")
    else:
        say("no CUDA device; nothing to measure (--tiny runs small shapes on the CPU)")
        return 0
    c = TINY if args.tiny else PROXY
    torch.manual_seed(1234)
    model = Model(torch, c, dev)
    model.choose_experts(args.experts)
    model.choose_attention()
    opt = torch.optim.AdamW(model.params, lr=c["lr"], betas=(0.9, c["beta2"]), eps=1e-8,
                            weight_decay=c["weight_decay"], fused=dev.type == "cuda")
    nparams = sum(p.numel() for p in model.params)
    fpt = flops_per_token(c)
    tokens = c["micro_batch"] * c["seq"]
    say(f"torch {torch.__version__}, device {device_name(torch, dev)}")
    say(f"model: {nparams} parameters, {fpt / 1e9:.4g} GFLOP per token (forward+backward), "
        f"{tokens} tokens per step")
    say(f"experts: {model.experts_impl}; attention: {model.attention_impl}; precision: fp32 "
        f"master weights and grads, autocast bf16, AdamW(fused={dev.type == 'cuda'})")

    gen = torch.Generator(device="cpu").manual_seed(1234)

    def step():
        seq = torch.randint(0, c["vocab"], (c["micro_batch"], c["seq"] + 1), generator=gen)
        seq = seq.to(dev, non_blocking=True)
        loss, lm = model.loss(seq[:, :-1], seq[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.params, c["clip_grad"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return lm

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for i in range(args.warmup):
        lm = step()
        if i == 0:
            say(f"first step: lm loss {lm.item():.4f} (ln V = {math.log(c['vocab']):.4f})")
    sync()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        lm = step()
    sync()
    seconds = (time.perf_counter() - t0) / max(args.iters, 1)
    lm = lm.item()
    if not math.isfinite(lm):
        say(f"the loss is {lm}: the step is broken")
        return 1

    tok_s = tokens / seconds
    tflops = fpt * tok_s / 1e12
    peak = args.peak_tflops or datasheet_peak(device_name(torch, dev))
    mfu = 100.0 * tflops / peak if peak > 0 else float("nan")
    mfu_text = f"{mfu:.1f}% of {peak:.0f} TFLOP/s" if peak > 0 else "n/a (peak unknown)"
    mem = (f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev.type == "cuda"
           else "n/a")
    say(f"{args.iters} steps after {args.warmup} warm-up: step {1e3 * seconds:.1f} ms | "
        f"tokens/s {tok_s:.0f} | TFLOP/s {tflops:.1f} | MFU {mfu_text} | "
        f"lm loss {lm:.4f} | peak memory {mem}")
    say(f"result step_ms={1e3 * seconds:.3f} tokens_per_s={tok_s:.1f} tflops={tflops:.3f} "
        f"mfu={mfu:.2f} gflop_per_token={fpt / 1e9:.6f} "
        f"experts={model.experts_impl.split(' ')[0]}")
    return 0


def nvidia_gpu_listed():
    """Whether the machine shows an NVIDIA GPU, asked before importing PyTorch (which
    may be missing): nvidia-smi -L where there is one, else the driver's device nodes."""
    import glob
    import shutil
    import subprocess
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
            return "GPU" in out
        except (OSError, subprocess.SubprocessError):
            pass
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"))


def device_name(torch, dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def datasheet_peak(name):
    for key, peak in PEAKS:
        if key in name:
            return peak
    return 0.0


def backward(y):
    """Backward from a dense gradient (y.sum() would pass an expanded one, with zero
    strides, which some kernels refuse and a real step never gives them)."""
    y.backward(y.detach().clone().normal_())


class Model:
    """Parameters as plain fp32 tensors (the optimizer's), the step as functions."""

    def __init__(self, torch, c, dev):
        self.t, self.c, self.dev = torch, c, dev
        F = torch.nn.functional
        self.F = F
        H, V, E, Fe = c["hidden"], c["vocab"], c["experts"], c["expert_ffn"]
        Q, KV, D = c["heads"] * c["head_dim"], c["groups"] * c["head_dim"], c["head_dim"]

        def normal(*shape):
            return (torch.randn(*shape, device=dev) * c["init_std"]).requires_grad_()

        def ones(n):
            return torch.ones(n, device=dev, requires_grad=True)

        self.embed = normal(V, H)
        self.head = normal(V, H)
        self.final_norm = ones(H)
        self.layers = []
        for _ in range(c["layers"]):
            self.layers.append(dict(
                ln1=ones(H), wq=normal(Q, H), wk=normal(KV, H), wv=normal(KV, H),
                q_norm=ones(D), k_norm=ones(D), wo=normal(H, Q), ln2=ones(H),
                router=normal(E, H),
                w_gate_up=normal(E, 2 * Fe, H),  # per expert: gate rows, then up rows
                w_down=normal(E, H, Fe)))
        self.params = [self.embed, self.head, self.final_norm] + [
            p for layer in self.layers for p in layer.values()]

        N, T, k = c["micro_batch"] * c["seq"], c["seq"], c["topk"]
        # force_logits of model_moe.c: 0 for experts (n*k + j) mod E, j < k; -1 elsewhere
        n = torch.arange(N, device=dev).unsqueeze(1)
        forced = torch.full((N, E), -1.0, device=dev)
        forced.scatter_(1, (n * k + torch.arange(k, device=dev)) % E, 0.0)
        self.forced_logits = forced
        # RoPE (HF / moetrain: inv_freq = theta^(-2i/D), rotate-half layout)
        inv = 1.0 / c["rope_theta"] ** (torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D)
        ang = torch.arange(T, device=dev, dtype=torch.float32).unsqueeze(1) * inv.float()
        self.cos = torch.cat((ang, ang), 1).cos()[None, None]  # (1, 1, T, D)
        self.sin = torch.cat((ang, ang), 1).sin()[None, None]
        self.autocast = dict(device_type=dev.type, dtype=torch.bfloat16)

    # -- choices made once, by trying ------------------------------------------------------

    def choose_experts(self, want):
        torch = self.t
        self.experts_impl = "loop over experts (index_select)"
        if want == "loop":
            return
        why = "this PyTorch has none"
        for name, gmm in (("torch.nn.functional.grouped_mm",
                           getattr(torch.nn.functional, "grouped_mm", None)),
                          ("torch._grouped_mm", getattr(torch, "_grouped_mm", None))):
            if gmm is None:
                continue
            try:  # forward and backward on a small case: the op may exist and not run here
                E, K, N = 4, 64, 32
                x = torch.randn(64, K, device=self.dev, dtype=torch.bfloat16, requires_grad=True)
                w = torch.randn(E, N, K, device=self.dev, dtype=torch.bfloat16, requires_grad=True)
                offs = torch.arange(1, E + 1, device=self.dev, dtype=torch.int32) * 16
                backward(gmm(x, w.transpose(-2, -1), offs=offs))
                if self.dev.type == "cuda":
                    torch.cuda.synchronize()
                self.grouped_mm, self.experts_impl = gmm, f"grouped_mm ({name})"
                return
            except (RuntimeError, TypeError, NotImplementedError) as e:
                why = f"{name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        if want == "grouped_mm":
            raise SystemExit(f"torch_moe_step: no grouped_mm runs here ({why})")
        self.experts_impl += f"; no grouped_mm: {why}"

    def choose_attention(self):
        """The first of: enable_gqa in a fused kernel (flash, cuDNN, memory-efficient);
        K and V repeated to every query head, fused; the same with any kernel (the math
        one materialises T x T scores: slow, and said so)."""
        torch, F, c = self.t, self.F, self.c
        import contextlib
        fused = contextlib.nullcontext
        if self.dev.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            names = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
            kernels = [getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)]
            fused = lambda: sdpa_kernel(kernels)  # noqa: E731
        dt = torch.bfloat16 if self.dev.type == "cuda" else torch.float32
        q = torch.randn(1, c["heads"], 128, c["head_dim"], device=self.dev, dtype=dt,
                        requires_grad=True)
        kv = torch.randn(1, c["groups"], 128, c["head_dim"], device=self.dev, dtype=dt,
                         requires_grad=True)
        rep = c["heads"] // c["groups"]
        tries = ((True, fused, "enable_gqa=True"),
                 (False, fused, f"K/V repeated to {c['heads']} heads"),
                 (False, contextlib.nullcontext, f"K/V repeated to {c['heads']} heads"))
        for gqa, ctx, what in tries:
            try:
                k = kv if gqa else kv.repeat_interleave(rep, 1)
                with ctx():
                    backward(F.scaled_dot_product_attention(
                        q, k, k, is_causal=True, **({"enable_gqa": True} if gqa else {})))
            except (RuntimeError, TypeError):
                continue
            self.gqa, self.sdpa_context = gqa, ctx
            kind = ("any kernel: maybe the math one (T x T scores)"
                    if ctx is contextlib.nullcontext and self.dev.type == "cuda" else
                    "fused kernels only" if self.dev.type == "cuda" else "CPU")
            self.attention_impl = f"scaled_dot_product_attention, {what}, {kind}"
            return
        raise SystemExit("torch_moe_step: scaled_dot_product_attention does not run here")

    # -- the step ----------------------------------------------------------------------

    def rmsnorm(self, x, w):
        xf = x.float()
        y = xf * self.t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c["eps"]) * w
        return y.to(x.dtype)

    def rope(self, x):  # (B, heads, T, D)
        x1, x2 = x.chunk(2, -1)
        return (x.float() * self.cos + self.t.cat((-x2, x1), -1).float() * self.sin).to(x.dtype)

    def attention(self, x, p):
        c, F = self.c, self.F
        B, T, _ = x.shape
        D = c["head_dim"]
        q = F.linear(x, p["wq"]).view(B, T, c["heads"], D)
        k = F.linear(x, p["wk"]).view(B, T, c["groups"], D)
        v = F.linear(x, p["wv"]).view(B, T, c["groups"], D)
        q = self.rope(self.rmsnorm(q, p["q_norm"]).transpose(1, 2))
        k = self.rope(self.rmsnorm(k, p["k_norm"]).transpose(1, 2))
        v = v.transpose(1, 2)
        if not self.gqa:
            rep = c["heads"] // c["groups"]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        with self.sdpa_context():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               **({"enable_gqa": True} if self.gqa else {}))
        return F.linear(y.transpose(1, 2).reshape(B, T, c["heads"] * D), p["wo"])

    def moe(self, x, p):
        torch, F, c = self.t, self.F, self.c
        B, T, H = x.shape
        N, E, k = B * T, c["experts"], c["topk"]
        x = x.reshape(N, H)
        with torch.autocast(**dict(self.autocast, enabled=False)):  # fp32 router
            real = F.linear(x.float(), p["router"])
            logits = real + (self.forced_logits - real).detach()  # straight through
            top, idx = logits.topk(k, dim=1)
            weights = top.softmax(dim=1)  # renormalised over the selected experts
            # Megatron's switch load-balancing loss on the softmax over all experts
            counts = torch.bincount(idx.flatten(), minlength=E)
            aux = (logits.softmax(1).sum(0) * counts).sum() * (E * c["aux_coeff"] / (k * N * N))
        order = idx.flatten().argsort(stable=True)  # rows sorted by expert
        rows = x.index_select(0, order // k).to(torch.bfloat16)
        y = self.experts(rows, counts, p)
        y = y.index_select(0, order.argsort())  # back to (token, slot) order
        y = (y.view(N, k, H) * weights.to(y.dtype).unsqueeze(2)).sum(1)
        return y.view(B, T, H), aux

    def experts(self, rows, counts, p):
        torch, F = self.t, self.F
        wgu, wd = p["w_gate_up"].to(torch.bfloat16), p["w_down"].to(torch.bfloat16)
        if self.experts_impl.startswith("grouped_mm"):
            offs = counts.cumsum(0).to(torch.int32)
            gu = self.grouped_mm(rows, wgu.transpose(-2, -1), offs=offs)
            gate, up = gu.chunk(2, dim=-1)
            return self.grouped_mm(F.silu(gate) * up, wd.transpose(-2, -1), offs=offs)
        out, start = [], 0
        for e, n in enumerate(counts.tolist()):
            r = rows.index_select(0, torch.arange(start, start + n, device=rows.device))
            gate, up = F.linear(r, wgu[e]).chunk(2, dim=-1)
            out.append(F.linear(F.silu(gate) * up, wd[e]))
            start += n
        return torch.cat(out)

    def loss(self, tokens, targets):
        torch, F, c = self.t, self.F, self.c
        with torch.autocast(**self.autocast):
            x = F.embedding(tokens, self.embed).to(torch.bfloat16)
            aux_total = 0.0
            for p in self.layers:
                x = x + self.attention(self.rmsnorm(x, p["ln1"]), p)
                y, aux = self.moe(self.rmsnorm(x, p["ln2"]), p)
                x = x + y
                aux_total = aux_total + aux
            logits = F.linear(self.rmsnorm(x, self.final_norm), self.head)
        lm = F.cross_entropy(logits.float().view(-1, c["vocab"]), targets.reshape(-1))
        return lm + aux_total, lm.detach()


if __name__ == "__main__":
    sys.exit(main())
