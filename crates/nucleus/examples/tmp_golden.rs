use nucleus::engine::{argmax, Session};
use nucleus::model::Model;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::load(&args[1], 2).unwrap();
    let t0 = std::time::Instant::now();
    for line in std::fs::read_to_string(&args[2]).unwrap().lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut all: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        all.extend(
            case["greedy_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32),
        );
        let mut steps: Vec<serde_json::Value> = case["prompt_logits"].as_array().unwrap().clone();
        steps.extend(case["greedy_steps"].as_array().unwrap().iter().cloned());
        let mut s = Session::new(&model, all.len() + 8);
        let v = model.hp.n_vocab;
        let logits = s.feed(&all, 64, true).unwrap();
        let mut worst = 0f32;
        let mut mism = 0;
        let mut per = Vec::new();
        for (i, st) in steps.iter().enumerate() {
            let row = &logits[i * v..(i + 1) * v];
            let top = st["top"].as_array().unwrap();
            let mut w = 0f32;
            for p in top {
                let d =
                    (row[p[0].as_u64().unwrap() as usize] - p[1].as_f64().unwrap() as f32).abs();
                worst = worst.max(d);
                w = w.max(d);
            }
            per.push(format!("{w:.3}"));
            let m = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
            if m >= 0.1 && argmax(row) != top[0][0].as_u64().unwrap() as u32 {
                mism += 1;
            }
        }
        println!("{}", per.join(" "));
        println!(
            "{:?}: worst {worst:.4}, top1 mismatches {mism}",
            &case["prompt"].as_str().unwrap()[..10.min(case["prompt"].as_str().unwrap().len())]
        );
    }
    println!("{:?}", t0.elapsed());
}
