#!/usr/bin/env python3
"""Training steps of Hugging Face's Qwen3-MoE in PyTorch eager on the CPU, for bench/cpu_step.sh.

The PyTorch side of the CPU comparison: the model moetrain trains from a namelist
(bench/cpu_step.sh reads its shape from `moetrain --print-config` and passes it
here), built as transformers' Qwen3MoeForCausalLM in fp32 the way a PyTorch user
would run it: SDPA attention, grouped_mm experts (when this PyTorch and transformers
have them on the CPU; "experts:" says which ran), untied embeddings, the load-balancing
loss (output_router_logits, router_aux_loss_coef), gradient accumulation over the
micro-batches of the global batch, clipping at clip_grad, torch.optim.AdamW(fused=True).
Tokens are uniform random, as moetrain's mock data.

Timing: --warmup steps, then --iters steps, each timed; the figure is the median step
(cpu_ms: the median of the process's CPU time per step, all threads).
FLOPs are counted with moetrain's formula (mt_model_flops_per_token in src/model/model.c)
so that the GFLOP/s figures compare. Prints one line for scripts:
  torch_cpu_step: result tokens_per_s=... gflops=... step_ms=... cpu_ms=...
Exits 0 with a message when torch or transformers cannot be imported.
"""

import argparse
import statistics
import sys
import time


def say(*args):
    print("torch_cpu_step:", *args, flush=True)


def flops_per_token(a):
    """mt_model_flops_per_token: 6 x (MLP + attention + head) per token; causal
    attention counts half of the T x T scores; the router is not counted."""
    H, T, L = a.hidden, a.seq, a.layers
    Q, KV = a.heads * a.head_dim, a.groups * a.head_dim
    moe = sum(a.moe_layers)
    dense = L - moe
    mlp = H * (a.ffn * 3.0 * dense + a.expert_ffn * a.topk * 3.0 * moe)
    attn = H * (Q + 2.0 * KV) + Q * T / 2.0 * 2.0 + Q * H
    return 6.0 * (mlp + attn * L + H * a.vocab)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("layers", "hidden", "heads", "groups", "head-dim", "ffn", "experts",
                 "expert-ffn", "topk", "vocab", "seq", "micro-batch", "global-batch"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--moe-layers", required=True,
                    help="moe%%layer_freq as a comma list of 0/1, one per layer")
    ap.add_argument("--aux-coeff", type=float, default=0.0)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    a.moe_layers = [int(x) for x in a.moe_layers.split(",")]
    if len(a.moe_layers) != a.layers:
        ap.error("--moe-layers needs one 0/1 per layer")
    if a.global_batch % a.micro_batch:
        ap.error("--global-batch must be a multiple of --micro-batch")
    try:
        import torch
        import transformers
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    except ImportError as e:
        say(f"cannot import torch and transformers ({e}); nothing to measure "
            "(python3 -m pip install torch transformers)")
        return 0
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    common = dict(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.groups,
        head_dim=a.head_dim, max_position_embeddings=a.seq, rms_norm_eps=a.eps,
        rope_theta=a.rope_theta, tie_word_embeddings=False, num_experts=a.experts,
        num_experts_per_tok=a.topk, moe_intermediate_size=a.expert_ffn, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[i for i, m in enumerate(a.moe_layers) if not m],
        output_router_logits=a.aux_coeff > 0, router_aux_loss_coef=a.aux_coeff,
        use_cache=False, attn_implementation="sdpa", torch_dtype=torch.float32)
    model, experts, why = None, None, ""
    for impl in ("grouped_mm", "batched_mm", "eager"):
        try:
            cfg = Qwen3MoeConfig(**common, experts_implementation=impl)
            model = Qwen3MoeForCausalLM(cfg).float().train()
            experts = impl
            break
        except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
            why += f"; {impl}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    if model is None:
        say(f"Qwen3MoeForCausalLM cannot be built here{why}; nothing to measure")
        return 0
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay,
                            fused=True)
    gen = torch.Generator().manual_seed(1234)
    n_micro = a.global_batch // a.micro_batch

    def step():
        for _ in range(n_micro):
            ids = torch.randint(0, a.vocab, (a.micro_batch, a.seq), generator=gen)
            out = model(input_ids=ids, labels=ids)
            (out.loss / n_micro).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    nparams = sum(p.numel() for p in model.parameters())
    say(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads; {nparams} parameters; experts: {experts}; "
        f"attention: sdpa; AdamW(fused=True)")
    try:
        for _ in range(a.warmup):
            step()
    except (RuntimeError, NotImplementedError) as e:
        say(f"a step failed ({str(e).splitlines()[0]}); nothing to measure")
        return 0
    times, cpu = [], []
    for _ in range(a.iters):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    sec = statistics.median(times)
    tokens = a.global_batch * a.seq
    gflops = flops_per_token(a) * tokens / sec / 1e9
    say(f"median of {a.iters} steps after {a.warmup} warm-up: {1e3 * sec:.1f} ms, "
        f"{tokens / sec:.0f} tokens/s, {gflops:.2f} GFLOP/s, loss {loss:.4f}")
    say(f"result tokens_per_s={tokens / sec:.1f} gflops={gflops:.3f} step_ms={1e3 * sec:.3f} "
        f"cpu_ms={1e3 * statistics.median(cpu):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
