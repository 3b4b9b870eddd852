//! The unified diff Talos shows for a dry-run apply
//! (pkg/machinery/textdiff/textdiff.go over pkg/machinery/config/configdiff):
//! neticdk/go-stdlib's diff/myers (v1.0.1) in its linear-space mode, with
//! the thresholds Talos sets (no plain-Myers path, the LCS fallback only
//! past 75,000 lines) and its unified formatter. Where two edit scripts of
//! the same length exist, which one is shown depends on that library's
//! search, so this module follows it step for step: its divide and
//! conquer on common prefixes, suffixes and middle snakes, its LCS table
//! for small or deep parts, and its hunk grouping (changes more than six
//! lines apart start a new hunk).

use std::fmt::Write as _;

/// textdiff.MaxLines: past this many lines in both texts together, Talos
/// prints one line instead of a diff.
const MAX_LINES: usize = 75_000;

/// The recursion depth after which the LCS table takes over (the
/// library's default).
const MAX_DEPTH: usize = 30;

/// Lines of context around a change.
const CONTEXT: usize = 3;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Equal,
    Delete,
    Insert,
}

type Edit<'a> = (Kind, &'a str);

/// The unified diff of `old` and `new` as Talos prints it: empty when they
/// are equal.
pub(crate) fn unified(old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    let (old_count, new_count) = (old.matches('\n').count(), new.matches('\n').count());
    if old_count + new_count > MAX_LINES {
        return format!("@@ -1,{old_count} +1,{new_count} @@ diff too large to display\n");
    }
    let (a, b) = (split_lines(old), split_lines(new));
    format(&script(&a, &b, 0, a.len(), 0, b.len(), 0))
}

/// The lines of `s`, without the empty one after a final newline.
fn split_lines(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut lines: Vec<&str> = s.split('\n').collect();
    if s.ends_with('\n') {
        lines.pop();
    }
    lines
}

/// The edit script turning `a[a0..a1]` into `b[b0..b1]`.
fn script<'a>(
    a: &[&'a str],
    b: &[&'a str],
    a0: usize,
    a1: usize,
    b0: usize,
    b1: usize,
    depth: usize,
) -> Vec<Edit<'a>> {
    if a1 < a0 || b1 < b0 {
        return Vec::new();
    }
    let (n, m) = (a1 - a0, b1 - b0);
    if n == 0 {
        return b[b0..b1].iter().map(|l| (Kind::Insert, *l)).collect();
    }
    if m == 0 {
        return a[a0..a1].iter().map(|l| (Kind::Delete, *l)).collect();
    }
    if depth >= MAX_DEPTH || (n < 10 && m < 10) {
        return lcs_script(&a[a0..a1], &b[b0..b1]);
    }
    let prefix = (0..n.min(m))
        .take_while(|&i| a[a0 + i] == b[b0 + i])
        .count();
    let suffix = (0..(n - prefix).min(m - prefix))
        .take_while(|&i| a[a1 - 1 - i] == b[b1 - 1 - i])
        .count();
    let mut out = Vec::new();
    if prefix > 0 || suffix > 0 {
        out.extend(a[a0..a0 + prefix].iter().map(|l| (Kind::Equal, *l)));
        out.extend(script(
            a,
            b,
            a0 + prefix,
            a1 - suffix,
            b0 + prefix,
            b1 - suffix,
            depth + 1,
        ));
        out.extend(a[a1 - suffix..a1].iter().map(|l| (Kind::Equal, *l)));
        return out;
    }
    let snake = middle_snake(a, b, a0, a1, b0, b1);
    out.extend(script(a, b, a0, snake.x0, b0, snake.y0, depth + 1));
    out.extend(a[snake.x0..snake.x1].iter().map(|l| (Kind::Equal, *l)));
    out.extend(script(a, b, snake.x1, a1, snake.y1, b1, depth + 1));
    out
}

/// A run of equal lines: `a[x0..x1]` equals `b[y0..y1]`.
struct Snake {
    x0: usize,
    y0: usize,
    x1: usize,
    y1: usize,
}

/// The library's middle-snake search: forward and reverse furthest-reaching
/// paths (diagonal k = x - y, -1 for a diagonal not reached yet) until they
/// overlap, with its handling of one-line sides and of the grid's edges.
fn middle_snake(a: &[&str], b: &[&str], a0: usize, a1: usize, b0: usize, b1: usize) -> Snake {
    let (n, m) = ((a1 - a0) as i64, (b1 - b0) as i64);
    let none = Snake {
        x0: a0,
        y0: b0,
        x1: a0,
        y1: b0,
    };
    let at = |x: i64, y: i64| (a0 + x as usize, b0 + y as usize);
    if n == 1 || m == 1 {
        for i in 0..n {
            for j in 0..m {
                let (x, y) = at(i, j);
                if a[x] == b[y] {
                    return Snake {
                        x0: x,
                        y0: y,
                        x1: x + 1,
                        y1: y + 1,
                    };
                }
            }
        }
        return none;
    }
    let max_d = (n + m + 1) / 2;
    let delta = n - m;
    let mut size = 2 * max_d + 1;
    let mut offset = max_d;
    if delta > 0 {
        size += delta;
    } else if delta < 0 {
        size -= delta;
        offset -= delta;
    }
    let mut vf = vec![-1i64; size as usize];
    let mut vr = vec![-1i64; size as usize];
    vf[offset as usize] = 0;
    vr[(offset + delta) as usize] = n;
    let same = |x: i64, y: i64| {
        x >= 0 && y >= 0 && x < n && y < m && {
            let (i, j) = at(x, y);
            a[i] == b[j]
        }
    };
    let slot = |v: &[i64], i: i64| -> i64 {
        if i >= 0 && i < size {
            v[i as usize]
        } else {
            -1
        }
    };
    for d in 0..=max_d {
        for k in (-d..=d).step_by(2) {
            let idx = offset + k;
            if idx < 0 || idx >= size {
                continue;
            }
            let right = k > -d && slot(&vf, idx - 1) != -1;
            let down = k < d && slot(&vf, idx + 1) != -1;
            let mut x = match (right, down) {
                (false, true) => vf[(idx + 1) as usize],
                (true, false) => vf[(idx - 1) as usize] + 1,
                (true, true) => (vf[(idx - 1) as usize] + 1).max(vf[(idx + 1) as usize]),
                (false, false) if idx == offset && d == 0 => vf[idx as usize],
                (false, false) => continue,
            };
            x = x.min(n);
            let mut y = x - k;
            if y < 0 || y > m {
                continue;
            }
            let (sx, sy) = (x, y);
            while same(x, y) {
                x += 1;
                y += 1;
            }
            vf[idx as usize] = x;
            if delta % 2 != 0 && k >= delta - (d - 1) && k <= delta + (d - 1) {
                let reverse = vr[idx as usize];
                if reverse >= 0 && x >= reverse {
                    let ((x0, y0), (x1, y1)) = (at(sx, sy), at(x, y));
                    return Snake { x0, y0, x1, y1 };
                }
            }
        }
        for kr in (-d..=d).step_by(2) {
            let k = kr + delta;
            let idx = offset + k;
            if idx < 0 || idx >= size {
                continue;
            }
            let left = k > -d + delta && slot(&vr, idx - 1) != -1;
            let up = k < d + delta && slot(&vr, idx + 1) != -1;
            let mut x = match (left, up) {
                (false, true) => vr[(idx + 1) as usize] - 1,
                (true, false) => vr[(idx - 1) as usize],
                (true, true) => vr[(idx - 1) as usize].min(vr[(idx + 1) as usize] - 1),
                (false, false) => continue,
            };
            x = x.max(0);
            let mut y = x - k;
            if y < 0 || y > m {
                continue;
            }
            let (ex, ey) = (x, y);
            while x > 0 && y > 0 && same(x - 1, y - 1) {
                x -= 1;
                y -= 1;
            }
            vr[idx as usize] = x;
            if delta % 2 == 0 && k >= -d && k <= d {
                let forward = vf[idx as usize];
                if forward >= 0 && forward >= x {
                    let ((x0, y0), (x1, y1)) = (at(x, y), at(ex, ey));
                    return Snake { x0, y0, x1, y1 };
                }
            }
        }
    }
    none
}

/// The library's LCS fallback: a full table, walked back from the end
/// (taking a line of `a` out while that keeps a longer common run), then
/// deletions before insertions before each common line.
fn lcs_script<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Edit<'a>> {
    let (n, m) = (a.len(), b.len());
    let mut table = vec![vec![0usize; m + 1]; n + 1];
    for i in 1..=n {
        for j in 1..=m {
            table[i][j] = if a[i - 1] == b[j - 1] {
                table[i - 1][j - 1] + 1
            } else {
                table[i - 1][j].max(table[i][j - 1])
            };
        }
    }
    let mut common = Vec::new();
    let (mut i, mut j) = (n, m);
    while i > 0 && j > 0 {
        if a[i - 1] == b[j - 1] {
            common.push((i - 1, j - 1));
            i -= 1;
            j -= 1;
        } else if table[i - 1][j] > table[i][j - 1] {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    common.reverse();
    let mut out = Vec::new();
    let (mut ai, mut bi) = (0, 0);
    for (ca, cb) in common {
        out.extend(a[ai..ca].iter().map(|l| (Kind::Delete, *l)));
        out.extend(b[bi..cb].iter().map(|l| (Kind::Insert, *l)));
        out.push((Kind::Equal, a[ca]));
        (ai, bi) = (ca + 1, cb + 1);
    }
    out.extend(a[ai..].iter().map(|l| (Kind::Delete, *l)));
    out.extend(b[bi..].iter().map(|l| (Kind::Insert, *l)));
    out
}

/// The unified formatter: changes at most six edits apart share a hunk,
/// each hunk carries three edits of context either side, and its header
/// both counts (an empty side starts one line before the hunk).
fn format(edits: &[Edit<'_>]) -> String {
    let mut out = String::from("--- a\n+++ b\n");
    let changes: Vec<usize> = (0..edits.len())
        .filter(|&i| edits[i].0 != Kind::Equal)
        .collect();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut group_start = 0;
    for (g, pair) in changes.windows(2).enumerate() {
        if pair[1] - pair[0] > 2 * CONTEXT {
            ranges.push(context_range(&changes[group_start..=g], edits.len()));
            group_start = g + 1;
        }
    }
    if let Some(rest) = changes.get(group_start..).filter(|r| !r.is_empty()) {
        ranges.push(context_range(rest, edits.len()));
    }
    // Ranges that overlap merge (those that only touch do not).
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start < last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    for (start, end) in merged {
        let before = &edits[..start];
        let inside = &edits[start..end];
        let count = |edits: &[Edit<'_>], skip: Kind| edits.iter().filter(|e| e.0 != skip).count();
        let (a_start, b_start) = (
            count(before, Kind::Insert) + 1,
            count(before, Kind::Delete) + 1,
        );
        let (a_len, b_len) = (count(inside, Kind::Insert), count(inside, Kind::Delete));
        let shown = |start: usize, len: usize| if len == 0 { start - 1 } else { start };
        let _ = writeln!(
            out,
            "@@ -{},{a_len} +{},{b_len} @@",
            shown(a_start, a_len),
            shown(b_start, b_len)
        );
        for (kind, line) in inside {
            let sign = match kind {
                Kind::Equal => ' ',
                Kind::Delete => '-',
                Kind::Insert => '+',
            };
            let _ = writeln!(out, "{sign}{line}");
        }
    }
    out
}

/// The edits a group of changes shows: three either side, within bounds.
fn context_range(group: &[usize], len: usize) -> (usize, usize) {
    let first = group[0];
    let last = group[group.len() - 1];
    (first.saturating_sub(CONTEXT), (last + CONTEXT + 1).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> String {
        (0..n).map(|i| format!("l{i}\n")).collect()
    }

    #[test]
    fn changes_six_lines_apart_get_two_hunks() {
        // Seven edits apart (six equal lines between): the library's
        // grouping keeps them apart, where GNU diff would join them.
        let old = lines(20);
        let new = old.replace("l3\n", "L3\n").replace("l10\n", "L10\n");
        assert_eq!(
            unified(&old, &new),
            "--- a\n+++ b\n@@ -1,7 +1,7 @@\n l0\n l1\n l2\n-l3\n+L3\n l4\n l5\n l6\n@@ -8,7 +8,7 @@\n l7\n l8\n l9\n-l10\n+L10\n l11\n l12\n l13\n"
        );
        // Five equal lines between: one hunk.
        let new = old.replace("l3\n", "L3\n").replace("l9\n", "L9\n");
        assert!(unified(&old, &new).matches("@@ -").count() == 1);
    }

    #[test]
    fn small_sides_use_the_lcs_table() {
        // Below ten lines on both sides the LCS walk decides: deletions
        // come before insertions, and an ambiguous line pairs late.
        assert_eq!(
            unified("a\nb\na\n", "b\na\nb\n"),
            "--- a\n+++ b\n@@ -1,3 +1,3 @@\n-a\n b\n a\n+b\n"
        );
        assert_eq!(unified("", ""), "");
        assert_eq!(unified("x\n", "x\n"), "");
    }

    #[test]
    fn scripts_match_the_go_library() {
        // Expected outputs printed by neticdk/go-stdlib v1.0.1 with Talos's
        // options; a GNU-style diff pairs these lines differently.
        assert_eq!(
            unified(
                "b\nc\na\na\n  key: 2\na\na\nc\na\nb\nc\na\n",
                "  key: 1\nc\n"
            ),
            "--- a\n+++ b\n@@ -1,12 +1,2 @@\n-b\n-c\n-a\n-a\n-  key: 2\n+  key: 1\n-a\n-a\n-c\n-a\n-b\n c\n-a\n"
        );
        assert_eq!(
            unified(
                "a\nb\n  key: 1\n- y\nb\na\nc\n  key: 2\nb\nc\n",
                "- y\n\nc\nz\nb\nz\n"
            ),
            "--- a\n+++ b\n@@ -1,10 +1,6 @@\n-a\n-b\n-  key: 1\n - y\n-b\n+\n-a\n c\n-  key: 2\n+z\n b\n-c\n+z\n"
        );
    }

    #[test]
    fn larger_inputs_split_on_middle_snakes_as_the_go_library_does() {
        // Twenty lines a side: prefix, suffix and middle-snake steps before
        // the LCS table (expected output printed by the Go library).
        assert_eq!(
            unified(
                "b\n- x\n  key: 1\na\nb\n- x\na\n  key: 1\nb\nb\n  key: 2\na\na\nb\nc\nc\n  key: 1\nc\n  key: 1\nb\n",
                "c\n- y\n- x\n  key: 1\nz\n- y\n- x\n  key: 1\n  key: 2\n"
            ),
            "--- a\n+++ b\n@@ -1,20 +1,9 @@\n-b\n+c\n+- y\n - x\n   key: 1\n+z\n+- y\n-a\n-b\n - x\n-a\n   key: 1\n-b\n-b\n   key: 2\n-a\n-a\n-b\n-c\n-c\n-  key: 1\n-c\n-  key: 1\n-b\n"
        );
    }
}
