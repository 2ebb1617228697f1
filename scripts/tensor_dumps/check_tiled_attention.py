#!/usr/bin/env python3
"""An independent model of llama.cpp's tiled flash attention (ggml-cpu ops.cpp,
`ggml_compute_forward_flash_attn_ext_tiled`, used for batches of 64+ queries), in numpy.

Usage: check_tiled_attention.py avx2|avx512 LAYER N_TOKENS N_HEAD N_HEAD_KV HEAD_DIM NUCLEUS_DIR

It reads llama.cpp's Qcur/Kcur/Vcur dumps of one layer (/tmp/lcpp_*-LAYER.bin) and recomputes
kqv_out: keys in tiles of 64 from position 0, scores as FMA chains over the head dimension,
the tile maximum, a rescale when it grows, ggml's SIMD expf and the softmax sum of its AVX2
(groups of 8) or AVX-512 (groups of 16) build, values folded in by FMA chains. With `avx2` it
compares with llama.cpp's own kqv_out (a build for this AVX2 machine); with `avx512` with
nucleus's (NUCLEUS_DIR/kqv_out-LAYER.bin), which follows the AVX-512 build. Both matching bit
for bit shows nucleus computes what llama.cpp's AVX-512 build computes. Queries must not be
pre-scaled (qwen/llama: scale 1/sqrt(head_dim) inside attention).
"""
import math
import sys

import numpy as np

variant = sys.argv[1]
L, ntok, nh, nkv, D = (int(a) for a in sys.argv[2:7])
ours_dir = sys.argv[7]
f32=np.float32
def ld(p,shape): return np.fromfile(p,dtype=np.float32).reshape(shape)
Q=ld(f'/tmp/lcpp_Qcur-{L}.bin',(ntok,nh,D)); K=ld(f'/tmp/lcpp_Kcur-{L}.bin',(ntok,nkv,D)); V=ld(f'/tmp/lcpp_Vcur-{L}.bin',(ntok,nkv,D))
ref=ld(f'/tmp/lcpp_kqv_out-{L}.bin',(ntok,nh,D)); ours=ld(f'{ours_dir}/kqv_out-{L}.bin',(ntok,nh,D))
K16=K.astype(np.float16).astype(f32); V16=V.astype(np.float16).astype(f32)
def fma(a,b,c): return (np.asarray(a,np.float64)*np.asarray(b,np.float64)+np.asarray(c,np.float64)).astype(f32)
def bits(x): return np.asarray(x,f32).view(np.uint32)
def fbits(u): return np.asarray(u,np.uint32).view(f32)
C=[f32(float.fromhex(h)) for h in ['0x1.ffffecp-1','0x1.fffdb6p-2','0x1.555e66p-3','0x1.573e2ep-5','0x1.0e4020p-7']]
R=f32(float.fromhex('0x1.8p23')); LOG2E=f32(float.fromhex('0x1.715476p+0')); LN2HI=f32(float.fromhex('0x1.62e4p-1')); LN2LO=f32(float.fromhex('0x1.7f7d1cp-20'))
def scalef(j,n):
    out=np.empty_like(j)
    for i,(jj,nn) in enumerate(zip(j,n)):
        out[i]=f32(np.ldexp(np.float64(jj),int(nn))) if np.isfinite(nn) else f32(0)
    return out
def expf(x):
    x=np.asarray(x,f32)
    with np.errstate(all='ignore'):
        z=fma(x,LOG2E,R); n=(z-R).astype(f32)
        b=fma(-n,LN2LO,fma(-n,LN2HI,x)); u=(b*b).astype(f32)
        if variant=='avx2':
            j=fma(fma(fma(C[4],b,C[3]),u,fma(C[2],b,C[1])),u,(C[0]*b).astype(f32))
            k=fbits((bits(z)<<np.uint32(23)) + bits(f32(1.0)))
            res=fma(j,k,k)
        else:
            j=fma(fma(fma(C[4],b,C[3]),u,fma(C[2],b,C[1])),u,fma(C[0],b,f32(1.0)))
            res=scalef(j,n)
        big=np.abs(n)>126
        res=np.where(np.abs(n)>192, np.where(n<=0,f32(0),f32(np.inf)), res)
        assert not np.any(big & (np.abs(n)<=192)), "mid range"
    return res.astype(f32)
def groupsum(v):
    s=0.0
    if variant=='avx2':
        for g in range(0,64,8):
            a=v[g:g+8]; t=(a[4:]+a[:4]).astype(f32); t2=f32(t[0]+t[2]); t3=f32(t[1]+t[3]); s+=float(f32(t2+t3))
    else:
        for g in range(0,64,16):
            a=v[g:g+16]; t8=(a[8:]+a[:8]).astype(f32); t4=(t8[4:]+t8[:4]).astype(f32); s+=float(f32(f32(t4[0]+t4[2])+f32(t4[1]+t4[3])))
    return s
scale=f32(1/math.sqrt(D))
out=np.zeros((ntok,nh,D),f32)
for h in range(nh):
    kh=h//(nh//nkv)
    for p in range(ntok):
        q=Q[p,h]; M=f32(-np.inf); S=f32(0); acc=np.zeros(D,f32)
        for t0 in range(0,p+1,64):
            keys=np.arange(t0,min(t0+64,p+1))
            s=np.zeros(len(keys),f32)
            for d in range(D): s=fma(K16[keys,kh,d],q[d],s)
            row=np.full(64,-np.inf,f32); row[keys-t0]=(s*scale).astype(f32)
            tmax=row.max()
            Mnew=max(M,tmax)
            if Mnew>M:
                ms=f32(math.exp(float(f32(M-Mnew)))) if M!=-np.inf else f32(0)
                acc=(acc*ms).astype(f32); S=f32(S*ms)
            M=Mnew
            pr=expf((row-Mnew).astype(f32))
            S=f32(float(S)+groupsum(pr))
            for i,kk in enumerate(keys): acc=fma(V16[kk,kh],pr[kk-t0],acc)
        out[p,h]=(acc*(f32(1)/S if S!=0 else f32(0))).astype(f32)
tgt=ref if variant=='avx2' else ours
print(variant,'n_diff',int((out!=tgt).sum()),'of',out.size, 'max abs', float(np.abs(out-tgt).max()))
