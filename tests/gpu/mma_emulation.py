#!/usr/bin/env python3
"""Emulates the warp-level tensor-core primitives (ldmatrix x4 with and without .trans,
mma.sync m16n8k16 bf16, following the PTX ISA's fragment layouts) in numpy, and runs
ports of the index arithmetic of kernels/cuda/cuda_grouped_gemm.cu (one tile, the
three products) and kernels/cuda/cuda_attention.cu (forward, dK/dV, dQ) against plain
numpy references.

What it is for: checking fragment layouts, ldmatrix addressing, masks and the online
softmax on a machine without a GPU, and localising a parity failure on one that has
one (the ports name the kernels' helpers). It checks the ports, not the .cu files:
change both together. Not run by make check (needs numpy). usage: python3 mma_emulation.py"""
import numpy as np
import sys

rng = np.random.default_rng(1)

def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000).astype(np.uint32)
    return u.view(np.float32)

LANES = np.arange(32)

def ldsm_x4(smem, addr, trans):
    """addr(l) -> (row, col): start of the 8-element row given by lane l."""
    regs = np.zeros((4, 32, 2))
    for i in range(4):
        M = np.zeros((8, 8))
        for r in range(8):
            row, col = addr(8 * i + r)
            M[r] = smem[row, col:col + 8]
        if trans:
            M = M.T
        for l in range(32):
            regs[i, l] = M[l // 4, 2 * (l % 4):2 * (l % 4) + 2]
    return regs

def mma(c, a, b0, b1):
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2*t:2*t+2] = a[0][l]; A[g+8, 2*t:2*t+2] = a[1][l]
        A[g, 2*t+8:2*t+10] = a[2][l]; A[g+8, 2*t+8:2*t+10] = a[3][l]
        B[2*t:2*t+2, g] = b0[l]; B[2*t+8:2*t+10, g] = b1[l]
        C[g, 2*t:2*t+2] = c[l, 0:2]; C[g+8, 2*t:2*t+2] = c[l, 2:4]
    D = A @ B + C
    out = np.zeros((32, 4))
    for l in range(32):
        g, t = l // 4, l % 4
        out[l] = [D[g, 2*t], D[g, 2*t+1], D[g+8, 2*t], D[g+8, 2*t+1]]
    return out

# --- the four fragment loaders of cuda_common.cuh (s is 2D [row][col], stride implicit)
def frag_a_kmajor(s, m0, k0):
    return ldsm_x4(s, lambda l: (m0 + (l & 7) + ((l >> 3) & 1) * 8, k0 + (l >> 4) * 8), False)
def frag_a_mmajor(s, m0, k0):
    return ldsm_x4(s, lambda l: (k0 + (l & 7) + (l >> 4) * 8, m0 + ((l >> 3) & 1) * 8), True)
def frag_b_kmajor(s, n0, k0):
    return ldsm_x4(s, lambda l: (n0 + (l & 7) + (l >> 4) * 8, k0 + ((l >> 3) & 1) * 8), False)
def frag_b_nmajor(s, n0, k0):
    return ldsm_x4(s, lambda l: (k0 + (l & 7) + ((l >> 3) & 1) * 8, n0 + (l >> 4) * 8), True)

def pack(lo, hi):  # one b32 register of two bf16 (per lane arrays)
    return np.stack([bf16(lo), bf16(hi)], axis=-1)

def c_to_a(c0, c1):
    return np.stack([pack(c0[:, 0], c0[:, 1]), pack(c0[:, 2], c0[:, 3]),
                     pack(c1[:, 0], c1[:, 1]), pack(c1[:, 2], c1[:, 3])])

# ------------------------------------------------------------------ grouped GEMM tile
BM = BN = 128; BK = 32; PAD = 8; THREADS = 256

def gg_fill(KMAJ, X, ld, r0, r_valid, k0, k_valid, getter):
    """gg_load + gg_store: returns the bf16 smem tile."""
    s = np.zeros((128, BK + PAD)) if KMAJ else np.zeros((BK, 128 + PAD))
    for tid in range(THREADS):
        for i in range(4):
            c = tid + i * THREADS
            r = r0 + (c >> 3) if KMAJ else r0 + (c & 31) * 4
            k = k0 + (c & 7) * 4 if KMAJ else k0 + (c >> 5)
            v = np.zeros(4)
            for e in range(4):
                rr, kk = (r, k + e) if KMAJ else (r + e, k)
                if rr < r_valid and kk < k_valid:
                    v[e] = getter(rr, kk)
            if KMAJ:
                row, col = c >> 3, (c & 7) * 4
            else:
                row, col = c >> 5, (c & 31) * 4
            s[row, col:col + 4] = bf16(v)
    return s

def gg_tile_run(A_K, B_K, Aget, Bget, m_valid, n_valid, k_valid, m0, n0):
    acc = np.zeros((8, 4, 4, 32, 4))  # warp, mi, nj, lane, e
    nk = (k_valid + BK - 1) // BK
    for kt in range(nk):
        sA = gg_fill(A_K, None, 0, m0, m_valid, kt * BK, k_valid, Aget)
        sB = gg_fill(B_K, None, 0, n0, n_valid, kt * BK, k_valid, Bget)
        for warp in range(8):
            wm, wn = (warp >> 2) * 64, (warp & 3) * 32
            for kk in (0, 16):
                af = [frag_a_kmajor(sA, wm + mi * 16, kk) if A_K else frag_a_mmajor(sA, wm + mi * 16, kk) for mi in range(4)]
                bf = [frag_b_kmajor(sB, wn + nj * 16, kk) if B_K else frag_b_nmajor(sB, wn + nj * 16, kk) for nj in range(2)]
                for mi in range(4):
                    for nj in range(2):
                        acc[warp, mi, 2*nj] = mma(acc[warp, mi, 2*nj], af[mi], bf[nj][0], bf[nj][1])
                        acc[warp, mi, 2*nj+1] = mma(acc[warp, mi, 2*nj+1], af[mi], bf[nj][2], bf[nj][3])
    out = {}
    for warp in range(8):
        wm, wn = (warp >> 2) * 64, (warp & 3) * 32
        for l in range(32):
            g, q = l >> 2, l & 3
            for mi in range(4):
                for h in range(2):
                    row = m0 + wm + mi * 16 + g + h * 8
                    if row >= m_valid: continue
                    for nj in range(4):
                        col = n0 + wn + nj * 8 + 2 * q
                        for e in range(2):
                            if col + e < n_valid:
                                out[(row, col + e)] = acc[warp, mi, nj, l, 2 * h + e]
    return out

def check_gg():
    # forward: C (m,N) = A (m,K) W^T, W (N,K); dgrad: W (K,N); wgrad: C (M,N) = A^T B
    for mode in range(3):
        if mode < 2:
            m, N, K = 70, 136, 40
            A = bf16(rng.standard_normal((m, K)))
            W = bf16(rng.standard_normal((N, K) if mode == 0 else (K, N)))
            ref = A @ (W.T if mode == 0 else W)
            Aget = lambda r, k: A[r, k]
            Bget = (lambda n, k: W[n, k]) if mode == 0 else (lambda n, k: W[k, n])
            res = {}
            for mt in range(0, m, BM):
                for nt in range(0, N, BN):
                    res.update(gg_tile_run(True, mode == 0, Aget, Bget, m, N, K, mt, nt))
            M_, N_ = m, N
        else:
            rows, M, N = 45, 132, 20
            A = bf16(rng.standard_normal((rows, M)))
            B = bf16(rng.standard_normal((rows, N)))
            ref = A.T @ B
            res = {}
            for mt in range(0, M, BM):
                for nt in range(0, N, BN):
                    res.update(gg_tile_run(False, False, lambda r, k: A[k, r], lambda n, k: B[k, n], M, N, rows, mt, nt))
            M_, N_ = M, N
        got = np.full(ref.shape, np.nan)
        for (r, c), v in res.items():
            got[r, c] = v
        err = np.nanmax(np.abs(got - ref)) if not np.isnan(got).any() else float('inf')
        print(f"grouped gemm mode {mode}: max |err| {err:.2e}, coverage {len(res)}/{M_*N_}")
        assert err < 1e-3 and len(res) == M_ * N_

# ------------------------------------------------------------------ attention
BR = BC = 64
LOG2E = 1.4426950408889634

def mma_abt(acc, KS, NT, sa, a_row0, sb):
    """att_mma_abt: acc (16 x 8NT) += A B^T, A rows a_row0.. of a [row][k] tile, B a [n][k] tile."""
    for kk in range(KS):
        af = frag_a_kmajor(sa, a_row0, kk * 16)
        for nj in range(NT // 2):
            bf = frag_b_kmajor(sb, nj * 16, kk * 16)
            acc[2*nj] = mma(acc[2*nj], af, bf[0], bf[1]); acc[2*nj+1] = mma(acc[2*nj+1], af, bf[2], bf[3])

def mma_pb(acc, NP, NT, p, sb):
    """att_mma_pb: acc (16 x 8NT) += P B, P as C fragments (rounded to bf16), B a [k][n] tile."""
    for kk in range(NP // 2):
        pa = c_to_a(p[2*kk], p[2*kk+1])
        for dj in range(NT // 2):
            bf = frag_b_nmajor(sb, dj * 16, kk * 16)
            acc[2*dj] = mma(acc[2*dj], pa, bf[0], bf[1]); acc[2*dj+1] = mma(acc[2*dj+1], pa, bf[2], bf[3])

def att_tile(X, row0, nrows, T, D, DMAX):
    """att_load: rows row0.. of one head (X is (T, D)) into a bf16 [row][DMAX+8] tile."""
    s = np.zeros((nrows, DMAX + 8))
    for r in range(nrows):
        t = row0 + r
        if t < T:
            s[r, :D] = bf16(X[t, :D])
    return s

def att_fwd(q, k, v, T, D, DMAX):
    """q, k, v: (T, D) of one head; returns out (T, D), lse (T)."""
    out = np.zeros((T, D)); lse = np.zeros(T)
    scale = 1.0 / np.sqrt(D); sl2 = scale * LOG2E
    ntiles = (T + BR - 1) // BR
    for qt in range(ntiles):
        q0 = qt * BR
        sQ = att_tile(q, q0, BR, T, D, DMAX)
        for warp in range(4):
            o = np.zeros((DMAX // 8, 32, 4))
            m0 = np.full(32, -np.inf); m1 = np.full(32, -np.inf); l0 = np.zeros(32); l1 = np.zeros(32)
            gr, qd = LANES >> 2, LANES & 3
            row_a = q0 + warp * 16 + gr; row_b = row_a + 8
            for j in range(qt + 1):
                sK = att_tile(k, j * BC, BC, T, D, DMAX); sV = att_tile(v, j * BC, BC, T, D, DMAX)
                s = np.zeros((8, 32, 4))
                mma_abt(s, DMAX // 16, 8, sQ, warp * 16, sK)
                if j == qt:
                    for nt in range(8):
                        for e in range(4):
                            key = j * BC + nt * 8 + 2 * qd + (e & 1)
                            row = row_a if e < 2 else row_b
                            s[nt][key > row, e] = -np.inf
                # quad max
                mx0 = np.maximum(m0, np.max(np.maximum(s[:, :, 0], s[:, :, 1]), axis=0))
                mx1 = np.maximum(m1, np.max(np.maximum(s[:, :, 2], s[:, :, 3]), axis=0))
                for x in (1, 2):
                    mx0 = np.maximum(mx0, mx0[LANES ^ x]); mx1 = np.maximum(mx1, mx1[LANES ^ x])
                al0 = np.exp2((m0 - mx0) * sl2); al1 = np.exp2((m1 - mx1) * sl2)
                m0, m1 = mx0, mx1
                l0 = l0 * al0; l1 = l1 * al1
                o[:, :, 0] *= al0; o[:, :, 1] *= al0; o[:, :, 2] *= al1; o[:, :, 3] *= al1
                s[:, :, 0:2] = np.exp2(s[:, :, 0:2] * sl2 - (mx0 * sl2)[None, :, None])
                s[:, :, 2:4] = np.exp2(s[:, :, 2:4] * sl2 - (mx1 * sl2)[None, :, None])
                l0 = l0 + s[:, :, 0].sum(0) + s[:, :, 1].sum(0); l1 = l1 + s[:, :, 2].sum(0) + s[:, :, 3].sum(0)
                mma_pb(o, 8, DMAX // 8, s, sV)
            for x in (1, 2):
                l0 = l0 + l0[LANES ^ x]; l1 = l1 + l1[LANES ^ x]
            for l in range(32):
                for h, (row, L, M) in enumerate(((row_a[l], l0[l], m0[l]), (row_b[l], l1[l], m1[l]))):
                    if row >= T: continue
                    for dn in range(DMAX // 8):
                        for e in range(2):
                            d = dn * 8 + 2 * qd[l] + e
                            if d < D: out[row, d] = o[dn, l, 2*h + e] / L
                    if qd[l] == 0: lse[row] = M * scale + np.log(L)
    return out, lse

def att_bwd(q, k, v, dout, out, lse, T, D, DMAX, BQ):
    scale = 1.0 / np.sqrt(D); sl2 = scale * LOG2E
    delta = (dout * out).sum(1)
    dq = np.zeros((T, D)); dk = np.zeros((T, D)); dv = np.zeros((T, D))
    gr, qd = LANES >> 2, LANES & 3
    nt_kv = (T + BC - 1) // BC
    NQ = BQ // 8
    # dK, dV
    for kt in range(nt_kv):
        k0 = kt * BC
        sK = att_tile(k, k0, BC, T, D, DMAX); sV = att_tile(v, k0, BC, T, D, DMAX)
        for warp in range(4):
            dka = np.zeros((DMAX // 8, 32, 4)); dva = np.zeros((DMAX // 8, 32, 4))
            key_a = k0 + warp * 16 + gr; key_b = key_a + 8
            i = k0 // BQ
            while i * BQ < T:
                t0 = i * BQ
                sQ = att_tile(q, t0, BQ, T, D, DMAX); sO = att_tile(dout, t0, BQ, T, D, DMAX)
                sL = np.array([lse[t0 + r] * LOG2E if t0 + r < T else 0.0 for r in range(BQ)])
                sD = np.array([delta[t0 + r] if t0 + r < T else 0.0 for r in range(BQ)])
                st = np.zeros((NQ, 32, 4))
                mma_abt(st, DMAX // 16, NQ, sK, warp * 16, sQ)
                edge = t0 < k0 + BC or t0 + BQ > T
                for n in range(NQ):
                    for e in range(4):
                        col = n * 8 + 2 * qd + (e & 1); t = t0 + col
                        p = np.exp2(st[n][:, e] * sl2 - sL[col])
                        key = key_a if e < 2 else key_b
                        if edge: p = np.where((t < key) | (t >= T), 0.0, p)
                        st[n][:, e] = p
                mma_pb(dva, NQ, DMAX // 8, st, sO)
                dp = np.zeros((NQ, 32, 4))
                mma_abt(dp, DMAX // 16, NQ, sV, warp * 16, sO)
                for n in range(NQ):
                    for e in range(4):
                        dp[n][:, e] = st[n][:, e] * (dp[n][:, e] - sD[n * 8 + 2 * qd + (e & 1)])
                mma_pb(dka, NQ, DMAX // 8, dp, sQ)
                i += 1
            for l in range(32):
                for h, row in enumerate((key_a[l], key_b[l])):
                    if row >= T: continue
                    for dn in range(DMAX // 8):
                        for e in range(2):
                            d = dn * 8 + 2 * qd[l] + e
                            if d < D:
                                dk[row, d] = dka[dn, l, 2*h+e] * scale; dv[row, d] = dva[dn, l, 2*h+e]
    # dQ
    for qt in range((T + BR - 1) // BR):
        q0 = qt * BR
        sQ = att_tile(q, q0, BR, T, D, DMAX); sO = att_tile(dout, q0, BR, T, D, DMAX)
        for warp in range(4):
            row_a = q0 + warp * 16 + gr; row_b = row_a + 8
            la = np.where(row_a < T, lse[np.minimum(row_a, T-1)] * LOG2E, 0); lb = np.where(row_b < T, lse[np.minimum(row_b, T-1)] * LOG2E, 0)
            da = np.where(row_a < T, delta[np.minimum(row_a, T-1)], 0); db = np.where(row_b < T, delta[np.minimum(row_b, T-1)], 0)
            dqa = np.zeros((DMAX // 8, 32, 4))
            for j in range(qt + 1):
                sK = att_tile(k, j * BC, BC, T, D, DMAX); sV = att_tile(v, j * BC, BC, T, D, DMAX)
                s = np.zeros((8, 32, 4)); dp = np.zeros((8, 32, 4))
                mma_abt(s, DMAX // 16, 8, sQ, warp * 16, sK)
                mma_abt(dp, DMAX // 16, 8, sO, warp * 16, sV)
                for nt in range(8):
                    for e in range(4):
                        key = j * BC + nt * 8 + 2 * qd + (e & 1); row = row_a if e < 2 else row_b
                        p = np.exp2(s[nt][:, e] * sl2 - (la if e < 2 else lb))
                        p = np.where(((j == qt) & (key > row)) | (row >= T), 0.0, p)
                        dp[nt][:, e] = p * (dp[nt][:, e] - (da if e < 2 else db))
                mma_pb(dqa, 8, DMAX // 8, dp, sK)
            for l in range(32):
                for h, row in enumerate((row_a[l], row_b[l])):
                    if row >= T: continue
                    for dn in range(DMAX // 8):
                        for e in range(2):
                            d = dn * 8 + 2 * qd[l] + e
                            if d < D: dq[row, d] = dqa[dn, l, 2*h+e] * scale
    return dq, dk, dv

def ref_attention(q, k, v, dout):
    T, D = q.shape
    S = q @ k.T / np.sqrt(D)
    S[np.triu(np.ones((T, T), bool), 1)] = -np.inf
    P = np.exp(S - S.max(1, keepdims=True)); P /= P.sum(1, keepdims=True)
    out = P @ v
    dP = dout @ v.T
    dS = P * (dP - (dP * P).sum(1, keepdims=True))
    dq = dS @ k / np.sqrt(D); dk = dS.T @ q / np.sqrt(D); dv = P.T @ dout
    lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
    return out, lse, dq, dk, dv

def nmse(ref, got):
    return float(((got - ref) ** 2).sum() / (ref ** 2).sum())

def check_att(T, D, DMAX, BQ):
    q = bf16(rng.standard_normal((T, D))); k = bf16(rng.standard_normal((T, D))); v = bf16(rng.standard_normal((T, D)))
    dout = rng.standard_normal((T, D))
    out_r, lse_r, dq_r, dk_r, dv_r = ref_attention(q, k, v, dout)
    out, lse = att_fwd(q, k, v, T, D, DMAX)
    dq, dk, dv = att_bwd(q, k, v, dout, out, lse, T, D, DMAX, BQ)
    r = dict(out=nmse(out_r, out), lse=nmse(lse_r, lse), dq=nmse(dq_r, dq), dk=nmse(dk_r, dk), dv=nmse(dv_r, dv))
    print(f"attention T={T} D={D} DMAX={DMAX} BQ={BQ}: " + " ".join(f"{a} {b:.1e}" for a, b in r.items()))
    assert r['out'] < 1e-5 and r['lse'] < 1e-9 and max(r['dq'], r['dk'], r['dv']) < 3e-5, r

if __name__ == "__main__":
    check_gg()
    check_att(70, 40, 64, 64)
    check_att(130, 18, 32, 64)
    check_att(100, 64, 128, 32)
    print("all emulated checks passed")
