#!/usr/bin/env python3
"""Independent autodiff reference for the moetrain model.

Reads dumps (one directory each) written by tests/model/model_dump (meta.txt, params.bin, grads.bin,
tokens.bin, bias.bin), re-implements the Qwen3-MoE forward in jax.numpy from the
specification (Hugging Face Qwen3MoeForCausalLM, with Megatron-Core's router,
balancing losses, capacity and expert bias), takes jax.grad of the total loss
(lm + aux + z), and compares loss and every parameter gradient with the C values.

The experts are computed densely here (every expert on every token, combined with a
(tokens, experts) weight matrix that is zero where a token is not routed or was
dropped), unlike the permute/grouped-GEMM/unpermute path of the C code.

Comparison: fp32 in JAX (jax_enable_x64 off). Per tensor, the norm-based relative
error ||g_c - g_jax||_2 / ||g_jax||_2 must be below 1e-5, and the losses must agree
to 1e-5 relative. Exit status 0 on success, 1 on a mismatch.
"""
import math
import os
import sys

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", False)

TOL = 1e-5


def read_dump(d):
    meta, tensors = {}, []
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "tensor":
                name, off, numel, ndim = parts[1], int(parts[2]), int(parts[3]), int(parts[4])
                tensors.append((name, off, numel, tuple(int(x) for x in parts[5:5 + ndim])))
            elif parts[0] == "layer_freq":
                meta["layer_freq"] = [int(x) for x in parts[1:]]
            else:
                meta[parts[0]] = parts[1]
    params = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    grads = np.fromfile(os.path.join(d, "grads.bin"), dtype=np.float32)
    B, T = int(meta["B"]), int(meta["T"])
    tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype=np.int32).reshape(B, T + 1)
    bias = np.fromfile(os.path.join(d, "bias.bin"), dtype=np.float32)
    P = {n: params[o:o + k].reshape(s) for n, o, k, s in tensors}
    Gc = {n: grads[o:o + k].reshape(s) for n, o, k, s in tensors}
    return meta, P, Gc, tokens, bias


class Cfg:
    def __init__(self, m):
        i = lambda k: int(m[k])  # noqa: E731
        f = lambda k: float(m[k])  # noqa: E731
        self.L, self.H = i("num_layers"), i("hidden_size")
        self.nh, self.ng, self.D = i("num_attention_heads"), i("num_query_groups"), i("kv_channels")
        self.V, self.eps, self.theta = i("vocab_size"), f("norm_epsilon"), f("rotary_base")
        self.qk_norm, self.tied = i("qk_layernorm") == 1, i("tied") == 1
        self.E, self.k = i("num_experts"), i("router_topk")
        self.score = m["router_score_function"]
        self.pre_softmax = i("router_pre_softmax") == 1
        self.sf = f("router_topk_scaling_factor")
        self.freq = m["layer_freq"]
        self.balance = m["router_load_balancing_type"]
        self.aux_coeff, self.z_coeff = f("aux_loss_coeff"), f("z_loss_coeff")
        self.bias_on = i("router_enable_expert_bias") == 1
        self.force = i("router_force_load_balancing") == 1
        self.cap_factor = f("expert_capacity_factor")
        self.drop_policy = m["token_drop_policy"]
        self.shared = i("shared_expert_intermediate_size")

    def is_moe(self, l):
        return self.E > 0 and self.freq[l] != 0


def rmsnorm(x, w, eps):
    var = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(var + eps) * w


def rope(x, theta):
    """x (B,T,heads,D): HF apply_rotary_pos_emb with rotate_half, positions 0..T-1."""
    T, D = x.shape[1], x.shape[3]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, D, 2, dtype=jnp.float32) / D))
    ang = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([ang, ang], axis=-1)
    cos, sin = jnp.cos(emb)[None, :, None, :], jnp.sin(emb)[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    rot = jnp.concatenate([-x2, x1], axis=-1)
    return x * cos + rot * sin


def attention(P, pre, h, c, B, T):
    q = (h @ P[pre + "self_attn.q_proj.weight"].T).reshape(B, T, c.nh, c.D)
    k = (h @ P[pre + "self_attn.k_proj.weight"].T).reshape(B, T, c.ng, c.D)
    v = (h @ P[pre + "self_attn.v_proj.weight"].T).reshape(B, T, c.ng, c.D)
    if c.qk_norm:
        q = rmsnorm(q, P[pre + "self_attn.q_norm.weight"], c.eps)
        k = rmsnorm(k, P[pre + "self_attn.k_norm.weight"], c.eps)
    q, k = rope(q, c.theta), rope(k, c.theta)
    rep = c.nh // c.ng
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(c.D)
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    s = jnp.where(mask[None, None], s, -jnp.inf)
    a = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhts,bshd->bthd", a, v).reshape(B, T, c.nh * c.D)
    return o @ P[pre + "self_attn.o_proj.weight"].T


def swiglu_mlp(x, wg, wu, wd):
    return (jax.nn.silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def topk_mask(key, k):
    """(N,E) 0/1 of the k largest keys per row (ties: lower index), no gradient."""
    _, idx = jax.lax.top_k(jax.lax.stop_gradient(key), k)
    return jnp.sum(jax.nn.one_hot(idx, key.shape[-1], dtype=jnp.float32), axis=1)


def router_weights(logits, c, bias):
    """Dense (N,E) routing weights (zero where not routed), before capacity."""
    N, E = logits.shape
    if c.score == "softmax":
        if c.pre_softmax:
            p = jax.nn.softmax(logits, axis=-1)
            sel = topk_mask(p + bias, c.k)
            w = p * sel
        else:
            sel = topk_mask(logits + bias, c.k)
            masked = jnp.where(sel > 0, logits, -jnp.inf)
            w = jax.nn.softmax(masked, axis=-1) * sel
    else:
        s = jax.nn.sigmoid(logits)
        sel = topk_mask(s + bias, c.k)
        w = s * sel
        if c.k > 1:
            w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
    if c.sf:
        w = w * c.sf
    return w, sel


def apply_capacity(w, sel, c, N):
    """Megatron drop policy: per expert keep `capacity` routed tokens."""
    if c.cap_factor <= 0:
        return w, sel
    E = sel.shape[1]
    cap = math.ceil((N * c.k) / E * c.cap_factor)
    selv = jax.lax.stop_gradient(sel)
    if c.drop_policy == "position":
        rank = jnp.cumsum(selv, axis=0) - selv  # routed tokens before this one
    else:
        pv = jax.lax.stop_gradient(w)
        # rank among routed tokens by prob (desc), ties to the earlier token
        better = (pv[None, :, :] > pv[:, None, :]) | (
            (pv[None, :, :] == pv[:, None, :]) & (jnp.arange(N)[None, :, None] < jnp.arange(N)[:, None, None]))
        rank = jnp.sum(better * selv[None, :, :], axis=1)
    keep = selv * (rank < cap)
    return w * keep, keep


def moe(P, pre, h, c, B, T, bias):
    N = B * T
    x = h.reshape(N, c.H)
    logits = x @ P[pre + "mlp.gate.weight"].T
    if c.force:
        n = jnp.arange(N)[:, None]
        chosen = jnp.zeros((N, c.E), dtype=bool)
        for j in range(c.k):
            chosen = chosen | (jnp.arange(c.E)[None, :] == (n * c.k + j) % c.E)
        forced = jnp.where(chosen, 0.0, -1.0).astype(jnp.float32)
        logits = logits + jax.lax.stop_gradient(forced - logits)  # straight-through
    aux = jnp.float32(0.0)
    if c.balance != "none" and c.aux_coeff > 0:
        if c.score == "softmax":
            p = jax.nn.softmax(logits, axis=-1)
        else:
            s = jax.nn.sigmoid(logits)
            p = s / (jnp.sum(s, axis=-1, keepdims=True) + 1e-20)
        cnt = topk_mask(p, c.k)
        seqs = B if c.balance == "seq_aux_loss" else 1
        S = N // seqs
        cnt = cnt.reshape(seqs, S, c.E).sum(axis=1)
        pm = p.reshape(seqs, S, c.E).mean(axis=1)
        aux = c.aux_coeff * jnp.mean(jnp.sum(cnt * c.E / (S * c.k) * pm, axis=-1))
    z = jnp.float32(0.0)
    if c.z_coeff > 0:
        z = c.z_coeff * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    w, sel = router_weights(logits, c, bias)
    w, kept = apply_capacity(w, sel, c, N)
    gate = P[pre + "mlp.experts.gate_proj"]  # (E,F,H)
    up = P[pre + "mlp.experts.up_proj"]
    down = P[pre + "mlp.experts.down_proj"]  # (E,H,F)
    act = jax.nn.silu(jnp.einsum("nh,efh->enf", x, gate)) * jnp.einsum("nh,efh->enf", x, up)
    y_all = jnp.einsum("enf,ehf->enh", act, down)
    out = jnp.einsum("ne,enh->nh", w, y_all)
    if c.shared > 0:
        out = out + swiglu_mlp(x, P[pre + "mlp.shared_expert.gate_proj.weight"],
                               P[pre + "mlp.shared_expert.up_proj.weight"],
                               P[pre + "mlp.shared_expert.down_proj.weight"])
    dropped = jnp.sum(sel) - jnp.sum(kept)
    return out.reshape(B, T, c.H), aux, z, dropped


def total_loss(P, tokens, c, biases):
    B, T1 = tokens.shape
    T = T1 - 1
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    x = P["model.embed_tokens.weight"][inp]
    aux_sum, z_sum, dropped = jnp.float32(0.0), jnp.float32(0.0), jnp.float32(0.0)
    mi = 0
    for l in range(c.L):
        pre = "model.layers.%d." % l
        x = x + attention(P, pre, rmsnorm(x, P[pre + "input_layernorm.weight"], c.eps), c, B, T)
        h = rmsnorm(x, P[pre + "post_attention_layernorm.weight"], c.eps)
        if c.is_moe(l):
            bias = biases[mi] if c.bias_on else jnp.zeros((c.E,), jnp.float32)
            y, aux, z, dr = moe(P, pre, h, c, B, T, bias)
            aux_sum, z_sum, dropped = aux_sum + aux, z_sum + z, dropped + dr
            mi += 1
        else:
            y = swiglu_mlp(h, P[pre + "mlp.gate_proj.weight"], P[pre + "mlp.up_proj.weight"],
                           P[pre + "mlp.down_proj.weight"])
        x = x + y
    x = rmsnorm(x, P["model.norm.weight"], c.eps)
    head = P["model.embed_tokens.weight"] if c.tied else P["lm_head.weight"]
    logits = x @ head.T
    logp = jax.nn.log_softmax(logits, axis=-1)
    lm = -jnp.mean(jnp.take_along_axis(logp, tgt[..., None], axis=-1))
    return lm + aux_sum + z_sum, (lm, aux_sum, z_sum, dropped)


def check_dump(d):
    print("== %s" % d)
    meta, P, Gc, tokens, bias = read_dump(d)
    c = Cfg(meta)
    nmoe = sum(1 for l in range(c.L) if c.is_moe(l))
    biases = bias.reshape(nmoe, c.E) if c.bias_on else None
    Pj = {k: jnp.asarray(v) for k, v in P.items()}
    (loss, (lm, aux, z, dropped)), grads = jax.value_and_grad(total_loss, has_aux=True)(
        Pj, jnp.asarray(tokens), c, biases)
    ok = True

    def close(name, a, b):
        nonlocal ok
        rel = abs(a - b) / max(abs(b), 1e-30)
        good = rel < TOL or (abs(a) < 1e-30 and abs(b) < 1e-30)
        ok &= good
        print("%-8s C %.9g JAX %.9g rel %.2e %s" % (name, a, b, rel, "ok" if good else "MISMATCH"))

    close("lm_loss", float(meta["lm_loss"]), float(lm))
    close("aux_loss", float(meta["aux_loss"]), float(aux))
    close("z_loss", float(meta["z_loss"]), float(z))
    if int(meta["dropped_tokens"]) != int(dropped):
        print("dropped_tokens C %s JAX %d MISMATCH" % (meta["dropped_tokens"], int(dropped)))
        ok = False
    worst = 0.0
    for name, gc in Gc.items():
        gj = np.asarray(grads[name], dtype=np.float64)
        den = np.linalg.norm(gj)
        rel = np.linalg.norm(gc.astype(np.float64) - gj) / den if den > 0 else np.linalg.norm(gc)
        worst = max(worst, rel)
        good = rel < TOL
        ok &= good
        print("grad %-52s rel %.2e %s" % (name, rel, "ok" if good else "MISMATCH"))
    print("worst gradient rel error %.2e (bound %.0e): %s" % (worst, TOL, "PASS" if ok else "FAIL"))
    return ok


def main():
    if len(sys.argv) < 2:
        print("usage: jax_ref.py DUMPDIR...", file=sys.stderr)
        return 2
    results = [check_dump(d) for d in sys.argv[1:]]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
