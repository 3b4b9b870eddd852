//! Which backups retention keeps: the newest N, plus the newest of each of
//! the latest H hours, D days and W ISO weeks that have one (the scheme of
//! restic's and borg's `--keep-*`). Shared by the local snapshot directory
//! (`ops snapshot --dir`) and the backup catalogue (`backup::Retention`).

use time::OffsetDateTime;

/// Counts of each tier; all zero keeps only the newest N.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub keep_last: usize,
    pub hourly: usize,
    pub daily: usize,
    pub weekly: usize,
}

type Bucket = (i32, u16, u8);

/// A tier: its name, how many buckets it keeps, and a time's bucket.
type Tier = (&'static str, usize, fn(OffsetDateTime) -> Bucket);

/// For `times`, newest first, why each is kept (`last`, `newest`,
/// `hourly`, `daily`, `weekly`); an empty list means it goes. The newest is
/// always kept, whatever the counts.
pub(crate) fn reasons(counts: Counts, times: &[OffsetDateTime]) -> Vec<Vec<&'static str>> {
    let mut reasons: Vec<Vec<&'static str>> = vec![Vec::new(); times.len()];
    for (i, r) in reasons.iter_mut().enumerate().take(counts.keep_last.max(1)) {
        r.push(if i < counts.keep_last {
            "last"
        } else {
            "newest"
        });
    }
    let tiers: [Tier; 3] = [
        ("hourly", counts.hourly, |t| {
            (t.year(), t.ordinal(), t.hour())
        }),
        ("daily", counts.daily, |t| (t.year(), t.ordinal(), 0)),
        ("weekly", counts.weekly, |t| {
            let (year, week, _) = t.to_iso_week_date();
            (year, u16::from(week), 0)
        }),
    ];
    for (name, count, bucket) in tiers {
        let mut last = None;
        let mut kept = 0;
        for (i, time) in times.iter().enumerate() {
            if kept == count {
                break;
            }
            let b = bucket(*time);
            if last != Some(b) {
                last = Some(b);
                kept += 1;
                reasons[i].push(name);
            }
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn newest_of_each_bucket_and_the_newest_always() {
        // Newest first: two in the same hour, one an hour earlier, one a
        // day earlier, one a week earlier.
        let times = [
            datetime!(2026-12-06 10:40 UTC),
            datetime!(2026-12-06 10:10 UTC),
            datetime!(2026-12-06 09:10 UTC),
            datetime!(2026-12-05 09:10 UTC),
            datetime!(2026-11-28 09:10 UTC),
        ];
        let hourly = reasons(
            Counts {
                hourly: 2,
                ..Counts::default()
            },
            &times,
        );
        assert_eq!(
            hourly,
            [
                vec!["newest", "hourly"],
                vec![],
                vec!["hourly"],
                vec![],
                vec![]
            ]
        );
        let daily_weekly = reasons(
            Counts {
                keep_last: 1,
                daily: 3,
                weekly: 2,
                ..Counts::default()
            },
            &times,
        );
        assert_eq!(
            daily_weekly,
            [
                vec!["last", "daily", "weekly"],
                vec![],
                vec![],
                vec!["daily"],
                vec!["daily", "weekly"],
            ]
        );
        // Nothing at all: only the newest stays.
        let none = reasons(Counts::default(), &times);
        assert_eq!(none[0], ["newest"]);
        assert!(none[1..].iter().all(Vec::is_empty));
    }
}
