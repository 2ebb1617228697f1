//! Writes a copy of a GGUF with its quantized matrices dequantized and stored again as Q8_0 or
//! F16 (1-D tensors and F32 ones as they are): the higher-precision target of the draft-model
//! benchmark (`scripts/bench_speculation.py --method draft`), made from the catalog file.
//! Not a quantizer (issue 13's `nucleus quantize` is): no per-tensor rules.
//!
//!     cargo run --release --example requantize -- IN.gguf OUT.gguf q8_0|f16

use nucleus::gguf::{GgufFile, GgufWriter, MetaValue};
use nucleus::quant::{dequantize_row, quantize_row, GgmlType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output, ty] = args.as_slice() else {
        return Err("usage: requantize IN.gguf OUT.gguf q8_0|f16".into());
    };
    let (want, file_type) = match ty.as_str() {
        "q8_0" => (GgmlType::Q8_0, 7u32),
        "f16" => (GgmlType::F16, 1u32),
        _ => return Err(format!("unknown type {ty:?} (q8_0 or f16)").into()),
    };
    let file = GgufFile::open(input)?;
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata.iter() {
        if key != "general.file_type" {
            w.add_meta(key, value.clone());
        }
    }
    w.add_meta("general.file_type", MetaValue::U32(file_type));
    for t in &file.tensors {
        let data = file.tensor_data(t);
        let cols = t.dims[0] as usize;
        let rows = (t.n_elements() as usize) / cols;
        let ty = match want {
            GgmlType::Q8_0 if !cols.is_multiple_of(32) => GgmlType::F16,
            x => x,
        };
        if t.dims.len() < 2 || t.ty == GgmlType::F32 || t.ty == ty {
            w.add_tensor(&t.name, &t.dims, t.ty, data.to_vec());
            continue;
        }
        let (src_rb, dst_rb) = (
            t.ty.row_bytes(cols).ok_or("bad row")?,
            ty.row_bytes(cols).ok_or("bad row")?,
        );
        let mut out = vec![0u8; rows * dst_rb];
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(t.ty, &data[r * src_rb..(r + 1) * src_rb], &mut row);
            quantize_row(ty, &row, &mut out[r * dst_rb..(r + 1) * dst_rb]);
        }
        w.add_tensor(&t.name, &t.dims, ty, out);
    }
    std::fs::write(output, w.to_bytes())?;
    eprintln!("wrote {output}");
    Ok(())
}
