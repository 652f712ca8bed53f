//! `strftime_now` on a fixed clock: a render must be reproducible, so the date is an input
//! (recorded with the render) rather than the machine's time.

use minijinja::{Error, ErrorKind};

/// Python's `datetime.strftime` for the specifiers chat templates use (`%d %m %Y %y %B %b %A %a
/// %H %M %S %j %e %-d %%`), at `clock` seconds since the epoch in UTC. Others are an error
/// naming them, rather than text Python would not write.
pub fn strftime(format: &str, clock: i64) -> Result<String, Error> {
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
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = clock.div_euclid(86_400);
    let secs = clock.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let year_day = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = match chars.next() {
            Some('-') => match chars.next() {
                Some('d') => {
                    out.push_str(&day.to_string());
                    continue;
                }
                other => format!("-{}", other.map(String::from).unwrap_or_default()),
            },
            Some(s) => s.to_string(),
            None => String::new(),
        };
        match spec.as_str() {
            "d" => out.push_str(&format!("{day:02}")),
            "e" => out.push_str(&format!("{day:>2}")),
            "m" => out.push_str(&format!("{month:02}")),
            "Y" => out.push_str(&year.to_string()),
            "y" => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            "B" => out.push_str(MONTHS[(month - 1) as usize]),
            "b" => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            "A" => out.push_str(DAYS[weekday]),
            "a" => out.push_str(&DAYS[weekday][..3]),
            "H" => out.push_str(&format!("{:02}", secs / 3600)),
            "M" => out.push_str(&format!("{:02}", secs / 60 % 60)),
            "S" => out.push_str(&format!("{:02}", secs % 60)),
            "j" => out.push_str(&format!("{year_day:03}")),
            "%" => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: `%{other}` is not a specifier cardproof writes"),
                ));
            }
        }
    }
    Ok(out)
}

/// (year, month, day) of a day count from 1970-01-01 (Howard Hinnant's civil calendar).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The day count from 1970-01-01 of a civil date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_now_reads_the_fixed_clock() {
        // 2026-12-03 18:48:20 UTC, a Thursday, the 337th day.
        let clock = 1_796_323_700;
        assert_eq!(
            strftime("%d %B %Y, %a %H:%M:%S %j %-d %b %y", clock).unwrap(),
            "03 December 2026, Thu 18:48:20 337 3 Dec 26"
        );
        assert!(strftime("%Z", clock).is_err());
    }
}
