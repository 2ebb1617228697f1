//! Products whose inputs differ, in one pass of the thread pool: a decode step's experts'
//! down products, each reading its own expert's gated activation. One pass instead of one a
//! product spares every pass's end, where a thread waits for the other's last work item.

use super::choice::{How, TileAsk, TileUse};
use super::TILE_TOKENS;
use super::{matmul_packed_chain, run_products, Chain, PackedActs, PackedMatrix, Product};
use crate::kernels::matmul::QuantizedActs;
use crate::kernels::pool::ThreadPool;
use crate::quant::GgmlType;

/// One product of [`matmul_packed_each`]: `y = w · x` for every token of `x` (its rows of
/// [`super::packed_act_type`], `acts` prepared from them as for [`matmul_packed_chain`]).
pub struct EachProduct<'a> {
    pub w: &'a PackedMatrix,
    pub x: &'a QuantizedActs,
    pub acts: &'a PackedActs,
    pub y: &'a mut [f32],
}

/// [`matmul_packed_chain`] for each of `products`, whose inputs have the same number of tokens,
/// in one pass of the pool where they are at most one tile of tokens (decode) and so share no
/// prepared activations; else one call each. The same bits either way: every row is computed
/// alone by the same kernel.
pub fn matmul_packed_each(pool: &ThreadPool, products: &mut [EachProduct], chain: Chain) {
    let Some(nt) = products.first().map(|p| p.x.n_tokens()) else {
        return;
    };
    let how = How::new(pool, nt, true, chain, TileAsk::Auto);
    let mut list = Vec::with_capacity(products.len());
    let mut inputs = Vec::with_capacity(products.len());
    let mut n_chunks = 0;
    for (i, p) in products.iter_mut().enumerate() {
        assert_eq!(p.x.n_tokens(), nt, "matmul_packed_each: token counts");
        assert_eq!(
            p.x.cols(),
            p.w.cols(),
            "matmul_packed_each: activation width"
        );
        assert_eq!(
            p.y.len(),
            nt * p.w.rows(),
            "matmul_packed_each: output size"
        );
        let mut product = Product::new(p.w, p.y, how, n_chunks);
        product.input = i;
        n_chunks += product.items();
        list.push(product);
        inputs.push((p.x, p.acts));
    }
    // Many tokens share their activations packed for the tiles or the min pairs of the Q8_K
    // prompt kernels, prepared once a call: those go one call each.
    let one_pass = nt <= TILE_TOKENS && list.iter().all(|p| p.tiles == TileUse::No && !p.wide);
    if !one_pass {
        drop(list);
        for p in products.iter_mut() {
            matmul_packed_chain(pool, p.w, p.x, p.acts, p.y, chain);
        }
        return;
    }
    for (p, &(x, acts)) in list.iter().zip(&inputs) {
        assert_eq!(
            x.ty(),
            super::packed_act_type(p.w.ty()),
            "matmul_packed_each: type"
        );
        if x.ty() == GgmlType::Q8_0 {
            assert_eq!(
                acts.scales.len(),
                nt * x.cols() / super::QK,
                "acts not prepared"
            );
        }
    }
    if nt > 0 && n_chunks > 0 {
        run_products(pool, &list, n_chunks, (&inputs, &[]));
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{matrix, packed};
    use super::super::{matmul_packed_chain, packed_act_type, PackedMatrix};
    use super::*;
    use crate::kernels::test_rng::Rng;

    /// Products with inputs of their own, in one pass (one and three tokens) or one call each
    /// (37 tokens), give the bits of one call each: the K-quants with Q8_K inputs, the 32-value
    /// block types with Q8_0 inputs and their prepared sums, on a two-thread pool.
    #[test]
    fn products_with_inputs_of_their_own_match_one_call_each() {
        let mut rng = Rng(31);
        let pool = ThreadPool::new(2);
        let cols = 512;
        let families: [&[(GgmlType, usize)]; 2] = [
            &[
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 96),
                (GgmlType::Q6_K, 136),
            ],
            &[
                (GgmlType::Q8_0, 256),
                (GgmlType::Q5_0, 64),
                (GgmlType::MXFP4, 128),
                (GgmlType::IQ4_NL, 72),
                (GgmlType::Q4_0, 32),
            ],
        ];
        for shapes in families {
            let ws: Vec<PackedMatrix> = shapes
                .iter()
                .map(|&(ty, rows)| packed(ty, &matrix(&mut rng, ty, rows, cols), rows, cols))
                .collect();
            for nt in [1, 3, 37] {
                let inputs: Vec<(QuantizedActs, PackedActs)> = ws
                    .iter()
                    .map(|w| {
                        let ty = packed_act_type(w.ty());
                        let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32() * 3.0).collect();
                        let (mut q, mut p) = (QuantizedActs::new(), PackedActs::new());
                        q.quantize(&x, nt, cols, ty);
                        if ty == GgmlType::Q8_0 {
                            p.prepare(&q);
                        }
                        (q, p)
                    })
                    .collect();
                let mut together: Vec<Vec<f32>> =
                    ws.iter().map(|w| vec![0f32; nt * w.rows()]).collect();
                let mut list: Vec<EachProduct> = ws
                    .iter()
                    .zip(&inputs)
                    .zip(together.iter_mut())
                    .map(|((w, (x, acts)), y)| EachProduct { w, x, acts, y })
                    .collect();
                matmul_packed_each(&pool, &mut list, Chain::fast());
                for ((w, (x, acts)), got) in ws.iter().zip(&inputs).zip(&together) {
                    let mut alone = vec![0f32; nt * w.rows()];
                    matmul_packed_chain(&pool, w, x, acts, &mut alone, Chain::fast());
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(got), bits(&alone), "{:?}, {nt} tokens", w.ty());
                    assert!(got.iter().any(|&v| v != 0.0), "{:?}: computed", w.ty());
                }
            }
        }
    }
}
