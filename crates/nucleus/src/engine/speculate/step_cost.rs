//! What a verification row costs when many sequences share a forward pass.
//!
//! A scheduler's step runs the rows of every sequence in one forward, whose time grows about
//! linearly with its rows: t ≈ a + b·rows (a: reading the weights once, b: each row's
//! arithmetic). One more row for a sequence costs b; the sequence's share of a step of `rows`
//! rows among `decoding` sequences is t / decoding; so its row cost, in the unit
//! [`DraftLength`](super::DraftLength) uses (a plain step of that sequence), is
//! b·decoding / t. For one sequence that is b / (a + b): what the single-sequence loop times
//! directly. With many sequences the forward is compute-bound and the cost nears 1: then
//! only drafts that are almost surely right pay, and the draft length falls accordingly.

/// A least-squares fit of step time against rows over recent steps (each older step weighs
/// [`FORGET`] times less).
#[derive(Clone, Debug, Default)]
pub struct StepCost {
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

/// The weight of a step, relative to the next one.
const FORGET: f64 = 0.98;
/// The fit needs steps of different sizes (speculation itself makes them); until then, this.
pub const DEFAULT_ROW_COST: f64 = 0.4;

impl StepCost {
    /// Records a forward of `rows` rows that took `secs`.
    pub fn observe(&mut self, rows: usize, secs: f64) {
        if !(secs.is_finite() && secs > 0.0) || rows == 0 {
            return;
        }
        let (x, y) = (rows as f64, secs);
        self.w = self.w * FORGET + 1.0;
        self.sx = self.sx * FORGET + x;
        self.sy = self.sy * FORGET + y;
        self.sxx = self.sxx * FORGET + x * x;
        self.sxy = self.sxy * FORGET + x * y;
    }

    /// The fitted (a, b) of t ≈ a + b·rows, once steps of different sizes were seen.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.w < 4.0 {
            return None;
        }
        let mx = self.sx / self.w;
        let my = self.sy / self.w;
        let var = self.sxx / self.w - mx * mx;
        if var < 0.25 {
            return None;
        }
        let b = (self.sxy / self.w - mx * my) / var;
        Some((my - b * mx, b))
    }

    /// The expected time of a forward of `rows` rows: the fit's, or while the steps seen all
    /// had about one size, their mean time (`None`: nothing seen yet).
    pub fn predict(&self, rows: usize) -> Option<f64> {
        if let Some((a, b)) = self.fit() {
            let t = a + b * rows as f64;
            if t > 0.0 {
                return Some(t);
            }
        }
        (self.w > 0.0).then(|| self.sy / self.w)
    }

    /// The cost of one more row for each of `decoding` sequences sharing steps of `rows`
    /// rows, in units of a sequence's share of the step (see the module docs).
    pub fn row_cost(&self, rows: usize, decoding: usize) -> f64 {
        let Some((a, b)) = self.fit() else {
            return DEFAULT_ROW_COST;
        };
        let t = a + b * rows as f64;
        if t <= 0.0 {
            return DEFAULT_ROW_COST;
        }
        (b * decoding as f64 / t).clamp(0.02, 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line_and_the_row_cost_follows_from_it() {
        let mut c = StepCost::default();
        assert_eq!(c.row_cost(1, 1), DEFAULT_ROW_COST, "nothing seen yet");
        assert_eq!(c.predict(1), None);
        // Steps all of one size say nothing about the slope: their mean is the prediction.
        for _ in 0..10 {
            c.observe(4, 0.030);
        }
        assert_eq!(c.fit(), None);
        assert!((c.predict(9).unwrap() - 0.030).abs() < 1e-12);
        // t = 20 ms + 2.5 ms per row.
        for rows in (1..=16).cycle().take(200) {
            c.observe(rows, 0.020 + 0.0025 * rows as f64);
        }
        let (a, b) = c.fit().unwrap();
        assert!(
            (a - 0.020).abs() < 1e-9 && (b - 0.0025).abs() < 1e-9,
            "{a} {b}"
        );
        assert!((c.predict(8).unwrap() - 0.040).abs() < 1e-9);
        // One sequence: b / (a + b) = 2.5 / 22.5.
        assert!((c.row_cost(1, 1) - 2.5 / 22.5).abs() < 1e-9);
        // Eight sequences in a step of eight rows: 8 b / (a + 8 b) = 20 / 40.
        assert!((c.row_cost(8, 8) - 0.5).abs() < 1e-9);
        // Bad timings are ignored.
        c.observe(3, f64::NAN);
        c.observe(0, 1.0);
        assert!((c.row_cost(8, 8) - 0.5).abs() < 1e-9);
    }
}
