//! `strftime_now(format)`, the function Hugging Face's chat templates call for today's date
//! (gpt-oss's "Current date: …", Llama 3.1's "Today Date: …"), in UTC: Python's `strftime`
//! codes for the date and time (`%Y %m %d %e %B %b %H %M %S %%`); any other code is an error
//! that names it.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// (year, month 1–12, day 1–31) of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `format` for the time `secs` seconds after the Unix epoch, UTC.
pub fn format_time(format: &str, secs: i64) -> Result<String, String> {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('H') => out.push_str(&format!("{:02}", s / 3600)),
            Some('M') => out.push_str(&format!("{:02}", s / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", s % 60)),
            Some('%') => out.push('%'),
            Some(other) => return Err(format!("strftime_now: %{other} is not supported")),
            None => return Err("strftime_now: the format ends with %".into()),
        }
    }
    Ok(out)
}

/// [`format_time`] for now.
pub fn strftime_now(format: &str) -> Result<String, String> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    format_time(format, secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_known_days() {
        // `date -u -d @SECS +FORMAT` for each.
        assert_eq!(format_time("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(
            format_time("%d %b %Y %H:%M:%S", 951_782_400 + 3661).unwrap(),
            "29 Feb 2000 01:01:01"
        );
        assert_eq!(
            format_time("%B %e, %Y", 1_795_651_200).unwrap(),
            "November 26, 2026"
        );
        assert_eq!(format_time("100%%", 0).unwrap(), "100%");
        assert!(format_time("%A", 0).unwrap_err().contains("%A"));
    }
}
